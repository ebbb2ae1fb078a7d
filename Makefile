# hsm: build the book, run the tests.
#
#   make test    set up .venv, run the package tests and every notebook in notebooks/ (nbval)
#   make book    set up .venv, fetch the vendored JavaScript once, build the book (-W, clean _build)
#   make jupyterlab  set up .venv with JupyterLab, open the chapters as notebooks
#   make clean   remove build outputs (keeps .venv and the vendored JavaScript)
#
# Works from a fresh clone with no network beyond PyPI and npm; after the first run the book
# builds offline. HSM_SCALE=full switches every notebook to the paper's scale.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when the package metadata or the pins change.
VENV_STAMP := $(VENV)/.hsm-installed

# Data are read from a local mirror when one sits beside the clone (CI, this machine).
ifneq ($(wildcard ../shared/data),)
HSM_DATA_MIRROR ?= $(abspath ../shared/data)
endif
ifdef HSM_DATA_MIRROR
export HSM_DATA_MIRROR
endif
HSM_SCALE ?= quick
export HSM_SCALE

# JavaScript the built pages need, served from the book itself instead of a CDN so that
# math and widgets render with no network. Not named _static: Jupyter Book injects every
# .js/.css found under a folder of that name into every page.
VENDOR := book/vendor
VENDOR_STAMP := $(VENDOR)/.complete
NPM_PACKAGES := @jupyter-widgets/html-manager@1.0.6 requirejs@2.3.7 mathjax@3.2.2

BUILD := _build

.PHONY: help venv test book jupyterlab vendor check-offline clean distclean

help:
	@echo "make test   - library tests, lab tests + nbval over notebooks/ (HSM_SCALE=$(HSM_SCALE))"
	@echo "make book   - build the Jupyter Book into $(BUILD)/html (warnings are errors)"
	@echo "make jupyterlab - JupyterLab on the chapters (double-click opens one as a notebook)"
	@echo "make clean  - remove build outputs;  make distclean - also .venv and $(VENDOR)"

$(VENV_STAMP): pyproject.toml lab/pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test,plot,clustering]" -e "./lab[test,book]"
	touch $@

venv: $(VENV_STAMP)

# One pytest run: the library's tests (tests/), the lab's (lab/tests/), then every MyST notebook in notebooks/ executed cell by
# cell (notebooks/conftest.py teaches nbval to read jupytext .md files). --nbval-lax: a cell
# fails the run when it raises; the notebooks assert what they claim. Exit status 5 (nothing
# collected, e.g. a filtered run) is not a failure.
PYTEST_ARGS ?=
test: $(VENV_STAMP)
	$(BIN)/python -m pytest tests lab/tests notebooks --nbval-lax --nbval-current-env $(PYTEST_ARGS) || [ $$? -eq 5 ]

# JupyterLab on the chapters. The lab's `jupyterlab` extra adds JupyterLab to .venv (jupytext, in the `test`
# and `book` extras, brings its Lab extension); the settings go into .venv, not into ~/.jupyter:
# - jupyter/overrides.json: double-clicking a .md file opens it as a notebook (jupytext's viewer);
# - jupyter/jupyter_server_config.py: the cells the book hides (exercise solutions, plotting code,
#   checks) open collapsed, a save writes the chapter as its source is written, and plain Markdown
#   (README.md, which opens as a notebook too) is saved without a jupytext header, unchanged if unedited.
# jupytext.toml (repository root) keeps jupytext_version and Lab's cell state out of saved files.
# HSM_DATA_MIRROR reaches the kernels (exported above when a mirror sits beside the clone).
JUPYTERLAB_STAMP := $(VENV)/.hsm-jupyterlab-installed
JUPYTERLAB_ARGS ?=
$(JUPYTERLAB_STAMP): $(VENV_STAMP) jupyter/jupyter_server_config.py jupyter/overrides.json
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test,plot,clustering]" -e "./lab[test,book,jupyterlab]"
	mkdir -p $(VENV)/etc/jupyter $(VENV)/share/jupyter/lab/settings
	cp jupyter/jupyter_server_config.py $(VENV)/etc/jupyter/jupyter_server_config.py
	cp jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $@

jupyterlab: $(JUPYTERLAB_STAMP)
	$(BIN)/python -m jupyterlab $(JUPYTERLAB_ARGS)

# npm pack downloads each tarball once; later builds find the unpacked copy and stay offline.
$(VENDOR_STAMP):
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/tarballs $(VENDOR)/widgets $(VENDOR)/mathjax
	cd $(VENDOR)/tarballs && npm pack --silent $(NPM_PACKAGES) >/dev/null
	tar -xzf $(VENDOR)/tarballs/jupyter-widgets-html-manager-1.0.6.tgz -C $(VENDOR)/widgets --strip-components=2 package/dist
	tar -xzf $(VENDOR)/tarballs/requirejs-2.3.7.tgz -C $(VENDOR)/widgets --strip-components=1 package/require.js
	tar -xzf $(VENDOR)/tarballs/mathjax-3.2.2.tgz -C $(VENDOR)/mathjax --strip-components=2 package/es5
	rm -rf $(VENDOR)/tarballs
	find $(VENDOR) -name '*.map' -delete
	touch $@

vendor: $(VENDOR_STAMP)

book: $(VENV_STAMP) $(VENDOR_STAMP)
	rm -rf $(BUILD)
	$(BIN)/jupyter-book build . -W -n --keep-going
	$(MAKE) --no-print-directory check-offline

# No page may load a script, style sheet, image or font from the network, and no CDN may be
# named anywhere in the HTML. One exception: sphinx-thebe (always loaded by Jupyter Book) writes
# the constant THEBE_JS_URL on every page; it is fetched only when a reader presses a "launch"
# button, and this book has none (launch_buttons.thebe: false), so that one line is allowed.
CDN_HOSTS := https?://([a-z0-9.-]*\.)?(cdn\.|unpkg\.com|jsdelivr\.net|cdnjs\.|googleapis\.com)
INERT_THEBE := const THEBE_JS_URL = "https://unpkg.com/thebe@[0-9.]+/lib/index.js"; const thebe_selector
check-offline:
	@cdn=$$(grep -rnE '$(CDN_HOSTS)' $(BUILD)/html --include='*.html' | grep -vE '$(INERT_THEBE)' || true); \
	loads=$$(grep -rnoE '<(script|link|img|iframe|source|embed)[^>]*(src|href)="(https?:)?//[^"]*"' $(BUILD)/html --include='*.html' || true); \
	if [ -n "$$cdn$$loads" ]; then \
	  printf '%s\n' "$$cdn" "$$loads" | cut -c1-300 >&2; \
	  echo "error: pages above load or name a remote asset; vendor it under $(VENDOR)" >&2; exit 1; \
	fi; echo "offline check: no page loads a remote asset or names a CDN"

clean:
	rm -rf $(BUILD) .pytest_cache notebooks/.pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(VENDOR)
