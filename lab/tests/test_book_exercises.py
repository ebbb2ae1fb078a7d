"""No exercise names a variable that only folded code defines.

An exercise may name, in backticks, a variable of its page (``From `rows65`, compute ...``). The
reader has to be able to see what it holds, so some code cell the page shows (no tag of
``HIDDEN_INPUT``: folded or removed cells do not count) must define it, before the exercise or in
the exercise's own section (a short cell at its start). Exercises are the Markdown of the sections
whose heading says "Exercise" (the ``## Exercises`` section and its ``### Exercise N`` parts); the
solution cells are code, not part of that text. A name counts as a variable of the page when a
code cell of the page binds it at the top level (an assignment, a loop variable, a ``def``, a
``class`` or an import); backticked words the code never binds (a data set's name, a record's
key, a role's target such as {doc}`page`) are not variables and are left alone.
"""
from __future__ import annotations

import ast
import re

import pytest
import yaml
from test_book_length import HIDDEN_INPUT, ROOT, _page_file

jupytext = pytest.importorskip("jupytext")

#: a name in inline code, not the target of a MyST role ({doc}`name`)
_NAMED = re.compile(r"(?<![}`])`([A-Za-z_][A-Za-z0-9_]*)`(?!`)")
_HEADING = re.compile(r"^#{1,6}\s")
_FENCE = re.compile(r"^\s*(```+|~~~+)(.*)$")
_MAGIC = re.compile(r"^\s*[%!]")


def book_pages() -> list[str]:
    """Every page ``_toc.yml`` names, the landing page first (without suffix)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries: list) -> None:
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    walk(toc.get("parts"))
    walk(toc.get("chapters"))
    return pages


def top_level_names(source: str) -> set[str]:
    """The names a code cell binds in the notebook's namespace: not a function's locals, nor a
    comprehension's or a lambda's variables. IPython magics and shell lines are skipped."""
    source = "\n".join("" if _MAGIC.match(line) else line for line in source.splitlines())
    names: set[str] = set()

    class Binder(ast.NodeVisitor):
        def visit_Name(self, node: ast.Name) -> None:
            if isinstance(node.ctx, ast.Store):
                names.add(node.id)

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            names.add(node.name)  # its body has its own scope

        visit_AsyncFunctionDef = visit_FunctionDef
        visit_ClassDef = visit_FunctionDef

        def visit_Import(self, node: ast.Import) -> None:
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)

        visit_ImportFrom = visit_Import

        def _own_scope(self, node: ast.AST) -> None:
            pass

        visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _own_scope

    Binder().visit(ast.parse(source))
    return names


def _cell_tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def unseen_names(notebook) -> list[tuple[str, str]]:
    """``(heading, name)`` for every variable an exercise names that no shown cell defines
    before it or in its section, while a folded or removed cell does."""
    folded: set[str] = set()
    for cell in notebook.cells:
        if cell.cell_type == "code" and _cell_tags(cell) & HIDDEN_INPUT:
            folded |= top_level_names(cell.source)
    shown: set[str] = set()  # bound by a shown cell so far
    section = 0  # which section (counted by headings) each name or cell is in
    heading, in_exercise = "", False
    named: list[tuple[int, str, str]] = []  # (section, heading, name)
    shown_in: dict[int, set[str]] = {}  # names bound by shown cells, per section
    for cell in notebook.cells:
        if cell.cell_type == "code":
            if not _cell_tags(cell) & HIDDEN_INPUT:
                bound = top_level_names(cell.source)
                shown |= bound
                shown_in.setdefault(section, set()).update(bound)
            continue
        if cell.cell_type != "markdown":
            continue
        fence = None  # the fence of a code block being read, None outside one
        for line in cell.source.splitlines():
            opened = _FENCE.match(line)
            if fence is not None:
                if opened and opened.group(1).startswith(fence) and not opened.group(2).strip():
                    fence = None
                continue
            if opened and not opened.group(2).strip().startswith("{"):
                fence = opened.group(1)  # a code block; a directive's body ({note}) is prose
                continue
            if _HEADING.match(line):
                section += 1
                heading, in_exercise = line.lstrip("#").strip(), "exercise" in line.lower()
            elif in_exercise:
                named += [(section, heading, name) for name in _NAMED.findall(line)
                          if name in folded and name not in shown]
    return sorted({(heading, name) for where, heading, name in named
                   if name not in shown_in.get(where, set())})


def _notebook(text: str):
    return jupytext.reads(text, fmt="md:myst")


_PAGE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A chapter

```{code-cell} ipython3
shown = 1
```

```{code-cell} ipython3
:tags: [hide-input]
folded, late = 2, 3
table = [row for row in range(3)]


def helper(local):
    inner = local
    return inner
```

## Exercises

### Exercise 1: one

From `shown`, `folded`, `cooking`, {doc}`helper` and `row`, ...

```bash
# not a heading: `folded` in a code block
```

### Exercise 2: two

From `late`, ...

```{code-cell} ipython3
late = 3
```

```{code-cell} ipython3
:tags: [hide-cell]
# Solution to Exercise 2
answer = late + folded
```

### Exercise 3: three

Use `answer` and `inner`.

## Further reading

`folded` again, outside the exercises.
"""


def test_unseen_names_finds_only_variables_of_folded_code():
    # `shown`: a shown cell defines it; `cooking`: no code binds it; {doc}`helper`: a role's target;
    # `row` and `inner`: a comprehension's and a function's own variables; the code block and the
    # section after the exercises are not exercise text; `late` is defined by a shown cell of its
    # own exercise; `answer` only by a folded solution
    found = unseen_names(_notebook(_PAGE))
    assert found == [("Exercise 1: one", "folded"), ("Exercise 3: three", "answer")]


def test_pages_with_exercises_are_read():
    pages = {name: _page_file(name) for name in book_pages()}
    with_exercises = [name for name, path in pages.items()
                      if re.search(r"^#+ .*Exercise", path.read_text(), re.M | re.I)]
    assert "notebooks/lm_gutenberg" in with_exercises and len(with_exercises) >= 10


@pytest.mark.parametrize("page", book_pages())
def test_exercises_name_only_variables_a_reader_sees(page):
    path = _page_file(page)
    notebook = jupytext.read(path, fmt="md:myst" if path.suffix == ".md" else None)
    unseen = unseen_names(notebook)
    assert not unseen, (f"{page}: exercises name variables that only folded or removed cells "
                        f"define (show a cell that builds them, or name a result file): {unseen}")
