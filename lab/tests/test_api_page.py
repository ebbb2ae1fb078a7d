"""The two API pages document every public module once, as the folders split them: book/api.md the
library ``hsm`` (with every name of hsm.__all__), book/api_lab.md the lab ``hsm_lab`` (the book's
experiments, data and results)."""
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import hsm
import hsm_lab

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = "book/api.md"
LAB = "book/api_lab.md"
PAGES = {page: (ROOT / page).read_text() for page in (LIBRARY, LAB)}
#: the lab's package: its modules belong on the lab page, the library's on the library page
LAB_PACKAGES = ("hsm_lab",)


def _public_modules() -> list[str]:
    found = []

    def walk(package):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            found.append(info.name)
            if info.ispkg:
                walk(importlib.import_module(info.name))

    walk(hsm)
    walk(hsm_lab)
    return found


def _blocks(page: str) -> list[tuple[str, str]]:
    """(automodule name, the options written under it), in the page's order."""
    return re.findall(r"^\.\. automodule:: (\S+)\n((?:   :.*\n)*)", PAGES[page], flags=re.M)


def _page_of(module: str) -> list[str]:
    """The pages with an automodule block for ``module``, once per block."""
    return [page for page in PAGES for name, _ in _blocks(page) if name == module]


def test_every_public_module_has_an_automodule_block_on_exactly_one_page():
    modules = ["hsm", "hsm_lab", *_public_modules()]
    missing = [name for name in modules if not _page_of(name)]
    assert not missing, f"add an automodule block to {LIBRARY} (the library) or {LAB} (the lab) for: {missing}"
    repeated = {name: _page_of(name) for name in modules if len(_page_of(name)) > 1}
    assert not repeated, f"document each module once, on one page: {repeated}"
    stale = [name for page in PAGES for name, _ in _blocks(page) if name not in modules]
    assert not stale, f"remove the automodule blocks of modules that no longer exist: {stale}"
    assert all(":members:" in options for page in PAGES for _, options in _blocks(page))


def test_the_lab_packages_are_on_the_lab_page_and_the_package_on_the_library_page():
    assert _page_of("hsm") == [LIBRARY]
    for page in PAGES:
        for name, _ in _blocks(page):
            in_lab_package = any(name == p or name.startswith(p + ".") for p in LAB_PACKAGES)
            assert not (in_lab_package and page == LIBRARY), f"move {name} from {LIBRARY} to {LAB}"
            assert in_lab_package or page == LIBRARY, f"move {name} from {LAB} to {LIBRARY}"


@pytest.mark.parametrize(("page", "other"), [(LIBRARY, "api_lab"), (LAB, "api")])
def test_each_page_opens_by_linking_the_other(page, other):
    title, opening = re.match(r"# (.+)\n\n((?:.+\n)+)", PAGES[page]).groups()
    assert title
    assert re.search(rf"\{{doc\}}`[^`]*<{other}>`", opening), f"{page}'s first paragraph should link {{doc}}`{other}`"


def test_every_name_of_hsm_all_is_in_the_summary():
    summary = re.search(r"\.\. autosummary::\n(?:   :\S+:\n)*\n((?:   \S+\n)+)", PAGES[LIBRARY])
    assert summary, f"{LIBRARY} lost the autosummary of hsm.__all__"
    listed = summary.group(1).split()
    assert listed == [f"hsm.{name}" for name in hsm.__all__], "the summary must list hsm.__all__, in order"


def test_names_defined_in_private_modules_are_documented_under_hsm():
    """A name of hsm.__all__ whose module is private (not on either page) gets its own entry."""
    for name in hsm.__all__:
        module = getattr(hsm, name).__module__
        if any(part.startswith("_") for part in module.split(".")):
            assert re.search(rf"^\.\. auto(class|exception|function):: hsm\.{name}$", PAGES[LIBRARY], flags=re.M), (
                f"hsm.{name} is defined in the private {module}: document it in {LIBRARY}'s package section")


def test_each_object_is_documented_once_in_its_module():
    """A module documents what it defines; what its __all__ re-exports from elsewhere is excluded
    (documented in the defining module, and references to the re-exported name resolve there)."""
    for page in PAGES:
        for name, options in _blocks(page):
            module = importlib.import_module(name)
            elsewhere = sorted(n for n in getattr(module, "__all__", [])
                               if getattr(getattr(module, n), "__module__", name) != name)
            match = re.search(r":exclude-members: (.*)", options)
            excluded = sorted(match.group(1).replace(" ", "").split(",")) if match else []
            assert excluded == elsewhere, f"{name}: :exclude-members: should be {', '.join(elsewhere) or '(none)'}"


def test_the_book_loads_autodoc():
    config = (ROOT / "_config.yml").read_text()
    for extension in ("sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.autosummary"):
        assert f"- {extension}" in config
    toc = (ROOT / "_toc.yml").read_text()
    assert re.search(r"^( *)- file: book/api\n\1- file: book/api_lab\n", toc, flags=re.M), (
        "_toc.yml should list book/api_lab right after book/api")
