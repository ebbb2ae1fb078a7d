"""Let nbval run the book's notebooks, which are jupytext MyST Markdown (``.md``) files.

nbval collects only ``.ipynb`` files and reads them with ``nbformat``. Here a ``.md`` file whose
front matter declares a jupytext MyST notebook is read with ``jupytext.read`` instead and handed
to nbval's own collector, so every code cell becomes a test item run in one kernel, and no
``.ipynb`` lands on disk. Run with ``pytest --nbval-lax --nbval-current-env notebooks/``
(``make test`` does): a cell that raises fails its test.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import jupytext
import nbval.plugin
import pytest


def _is_myst_notebook(path: Path) -> bool:
    """True for a Markdown file whose YAML front matter is a jupytext MyST notebook header."""
    with path.open(encoding="utf-8") as handle:
        head = handle.read(2000)
    return head.startswith("---") and "jupytext" in head and "format_name: myst" in head


class MystNotebookFile(nbval.plugin.IPyNbFile):
    """nbval's notebook collector, reading the notebook through jupytext."""

    def collect(self):
        notebook = jupytext.read(self.path)
        # nbval's collect() calls nbformat.read(path) on the module it imported; hand it the
        # notebook jupytext built instead, for the duration of this call only.
        real_nbformat = nbval.plugin.nbformat
        nbval.plugin.nbformat = SimpleNamespace(read=lambda *args, **kwargs: notebook)
        try:
            return list(super().collect())
        finally:
            nbval.plugin.nbformat = real_nbformat


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    option = parent.config.option
    if (option.nbval or option.nbval_lax) and file_path.suffix == ".md" and _is_myst_notebook(file_path):
        return MystNotebookFile.from_parent(parent, path=file_path)
    return None
