"""Code a page shows fits the page's width.

At a 1,400-pixel window the book's text column shows about 90 characters of code; a longer line
is cut at the right and the reader has to scroll the block to read it. Every line of a code cell
the page shows (no tag of ``HIDDEN_INPUT``) and of a plain code block (a command list, an install
line) must fit in :data:`CODE_WIDTH` characters. The one exception is a line that is a single
file path (an ``--out`` argument), which cannot be broken.
"""
from __future__ import annotations

import re

import pytest
from test_book_exercises import book_pages
from test_book_length import HIDDEN_INPUT, _page_file

#: characters of code a page shows on one line at a 1,400-pixel window
CODE_WIDTH = 90
_FENCE = re.compile(r"^(```+)(.*)$")
_UNBREAKABLE = re.compile(r"^\s*(--out\s+)?\S+(\s+\\)?$")


def too_wide(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every shown code line longer than :data:`CODE_WIDTH`."""
    out, fence, shown = [], None, False
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence, info = match.group(1), match.group(2).strip()
            # a code cell's tags follow its fence; a plain block (```bash, ```text, ```) is shown
            shown = not info.startswith("{") or info.startswith("{code-cell}")
            continue
        if fence is not None and line.startswith(fence) and not line.strip("`"):
            fence = None
            continue
        if fence is None:
            continue
        if line.startswith(":tags:") and set(re.findall(r"[\w-]+", line)) & HIDDEN_INPUT:
            shown = False
        if shown and len(line) > CODE_WIDTH and not _UNBREAKABLE.match(line):
            out.append((number, line))
    return out


def test_a_long_line_in_a_shown_cell_is_found_and_a_folded_one_is_not() -> None:
    long = "x = " + "1 + " * 30 + "1"
    page = (f"```{{code-cell}} ipython3\n{long}\n```\n\n```{{code-cell}} ipython3\n:tags: [hide-input]\n{long}\n```\n"
            f"```bash\npython -m hsm run x {'-o a=b ' * 20}\n    --out results/{'a' * 95}.json\n```\n")
    assert [number for number, _ in too_wide(page)] == [2, 10]  # the shown cell, the command; not the path


@pytest.mark.parametrize("page", book_pages())
def test_every_shown_code_line_fits_the_page(page: str) -> None:
    wide = too_wide(_page_file(page).read_text(encoding="utf-8"))
    assert not wide, "\n".join(f"{page}:{n}: {len(line)} characters" for n, line in wide)
