"""How long the book's main path takes to read.

A page's reading time is its words at 200 a minute plus half a minute per figure. Words are the
prose and the code a reader sees: the input of a code cell counts unless a tag removes or folds
it (``remove-cell``, ``remove-input``, ``hide-input``, ``hide-cell``); what a reader has to open
is not on the path. Figures are those the page's cells create (``plt.subplots``,
``plt.figure``, or a ``fig, ...`` assignment from another plotting call) and the images of its
prose (``{figure}``, ``![...]``). The main path is the landing page and the ``_toc.yml`` parts
before the first appendix part: what a reader who wants the results and the reasons reads.
Run ``pytest -s tests/test_book_length.py`` for the table of minutes per page.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

WORDS_PER_MINUTE = 200
MINUTES_PER_FIGURE = 0.5
#: the reading time the main path must stay within
BUDGET_MINUTES = 180
#: the reading time each main-path page must stay within (an experiment chapter's main path)
PAGE_BUDGET_MINUTES = 20

#: tags whose cell input a reader does not see without opening it
HIDDEN_INPUT = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
#: tags whose cell output (a figure included) does not appear on the page
HIDDEN_OUTPUT = {"remove-cell", "remove-output"}

_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.S)
_WORD = re.compile(r"\S*[A-Za-z0-9]\S*")
_FIGURE_CALL = re.compile(r"\bplt\.(subplots|figure)\(")
_FIG_ASSIGNMENT = re.compile(r"^\s*fig\s*,", re.M)
_IMAGE = re.compile(r"\{figure\}|!\[")


@dataclass(frozen=True)
class Page:
    """One page's reading load."""

    name: str
    prose_words: int
    code_words: int
    figures: int

    @property
    def minutes(self) -> float:
        return (self.prose_words + self.code_words) / WORDS_PER_MINUTE + MINUTES_PER_FIGURE * self.figures


def _tags(cell: str) -> tuple[set[str], str]:
    """A code cell's tags and its source without the option lines (``:tags: [...]`` or a
    ``---``-fenced YAML header)."""
    tags: set[str] = set()
    body = cell
    if body.startswith("---\n"):
        header, _, body = body[4:].partition("\n---\n")
        options = yaml.safe_load(header) or {}
        tags |= set(options.get("tags") or [])
    lines = body.splitlines()
    while lines and lines[0].startswith(":"):
        key, _, value = lines.pop(0)[1:].partition(":")
        if key.strip() == "tags":
            tags |= {t.strip().strip("'\"") for t in value.strip().strip("[]").split(",") if t.strip()}
    return tags, "\n".join(lines)


def measure(text: str, name: str = "") -> Page:
    """The reading load of one MyST page (a jupytext notebook or plain Markdown)."""
    text = _FRONT_MATTER.sub("", text, count=1)
    prose, code_words, figures = [], 0, 0
    last = 0
    for match in _CELL.finditer(text):
        prose.append(text[last:match.start()])
        last = match.end()
        tags, source = _tags(match.group(1))
        if not tags & HIDDEN_INPUT:
            code_words += len(_WORD.findall(source))
        if not tags & HIDDEN_OUTPUT:
            calls = len(_FIGURE_CALL.findall(source))
            figures += calls if calls else len(_FIG_ASSIGNMENT.findall(source))
    prose.append(text[last:])
    prose_text = re.sub(r"<!--.*?-->", "", "".join(prose), flags=re.S)
    return Page(name, len(_WORD.findall(prose_text)), code_words,
                figures + len(_IMAGE.findall(prose_text)))


def main_path() -> list[str]:
    """The main path's pages, in reading order, as ``_toc.yml`` names them (without suffix)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc["parts"]:
        if part.get("caption", "").startswith("Appendix"):
            break
        pages += [chapter["file"] for chapter in part.get("chapters", [])]
    return pages


def _page_file(name: str) -> Path:
    for suffix in (".md", ".ipynb"):
        if (ROOT / f"{name}{suffix}").is_file():
            return ROOT / f"{name}{suffix}"
    raise FileNotFoundError(f"_toc.yml names {name}, which is not a page of the book")


def measure_main_path() -> list[Page]:
    return [measure(_page_file(name).read_text(), name) for name in main_path()]


def _table(pages: list[Page]) -> str:
    lines = [f"{'page':<32} {'prose':>6} {'code':>6} {'figs':>5} {'min':>6}"]
    lines += [f"{p.name:<32} {p.prose_words:>6} {p.code_words:>6} {p.figures:>5} {p.minutes:>6.1f}"
              for p in pages]
    lines.append(f"{'total':<32} {sum(p.prose_words for p in pages):>6} "
                 f"{sum(p.code_words for p in pages):>6} {sum(p.figures for p in pages):>5} "
                 f"{sum(p.minutes for p in pages):>6.1f}")
    return "\n".join(lines)


def test_measure_counts_prose_visible_code_and_figures():
    page = measure(
        "---\njupytext: {}\n---\n\n# Title words\n\nSome prose here, $x$.\n\n![a plot](x.png)\n\n"
        "```{code-cell} ipython3\nvisible = 1\n```\n\n"
        "```{code-cell} ipython3\n:tags: [hide-input]\nfig, ax = plt.subplots()\nhidden = 2\n```\n\n"
        "```{code-cell} ipython3\n---\ntags: [remove-cell]\n---\nfig = plt.figure()\n```\n\n"
        "```{code-cell} ipython3\n:tags: [hide-output]\nshown = 3\n```\n")
    assert page.prose_words == 8  # Title, words, Some, prose, here, $x$ and the image's two
    assert page.code_words == 4  # visible, 1, shown, 3: the hidden and removed inputs do not count
    assert page.figures == 2  # the image and the hidden-input cell's plot; the removed cell's does not show


def test_every_main_path_page_exists_and_has_words():
    pages = measure_main_path()
    assert pages and all(p.prose_words > 0 for p in pages)
    assert all(not p.name.startswith("notebooks/appendix") for p in pages)


def test_main_path_reads_within_budget():
    pages = measure_main_path()
    print("\n" + _table(pages))
    total = sum(p.minutes for p in pages)
    assert total <= BUDGET_MINUTES, f"the main path reads in {total:.0f} minutes, over {BUDGET_MINUTES}"
    long = [f"{p.name} ({p.minutes:.1f} min)" for p in pages if p.minutes > PAGE_BUDGET_MINUTES]
    assert not long, f"main-path pages over {PAGE_BUDGET_MINUTES} minutes: {', '.join(long)}"
