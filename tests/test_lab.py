"""`make lab`: a chapter opened in JupyterLab and saved unedited is written back byte for byte.

JupyterLab hands the saved notebook to jupytext, configured by jupytext.toml, then to the pre-save
hook of lab/jupyter_server_config.py; on opening, that configuration collapses the cells the book
hides. This runs the same steps without a server: read with jupytext, collapse, write, hook.
"""
import runpy
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
from jupytext.config import load_jupytext_configuration_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAB = runpy.run_path(str(ROOT / "lab" / "jupyter_server_config.py"))
CONFIG = load_jupytext_configuration_file(str(ROOT / "jupytext.toml"))
CHAPTERS = sorted(p for p in [*ROOT.glob("notebooks/*.md"), *ROOT.glob("book/*.md")]
                  if p.read_text(encoding="utf-8").startswith("---\njupytext:"))


class _FileContents:
    """What the pre-save hook asks of the contents manager: where a path lives on disk."""

    def _get_os_path(self, path: str) -> str:
        return str(ROOT / path)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_unedited_save_leaves_the_chapter_unchanged(chapter: Path):
    source = chapter.read_text(encoding="utf-8")
    notebook = jupytext.read(chapter, config=CONFIG)
    LAB["collapse_hidden_cells"](notebook)
    model = {"type": "file", "format": "text", "content": jupytext.writes(notebook, fmt="md:myst", config=CONFIG)}
    LAB["write_like_the_sources"](model, str(chapter.relative_to(ROOT)), _FileContents())
    assert model["content"] == source, (
        f"saving {chapter.name} from JupyterLab would rewrite it: write its header like the other chapters' "
        "(format_version, kernelspec) and its cells as jupytext writes them")


def test_solutions_open_collapsed():
    notebook = jupytext.read(ROOT / "notebooks" / "using_hsm.md", config=CONFIG)
    LAB["collapse_hidden_cells"](notebook)
    solutions = [cell for cell in notebook.cells if "hide-cell" in cell.metadata.get("tags", [])]
    assert solutions and all(cell.metadata["jupyter"]["source_hidden"] for cell in solutions)


def test_make_lab_installs_jupyterlab_and_the_settings():
    makefile = (ROOT / "Makefile").read_text()
    assert "\nlab: $(LAB_STAMP)" in makefile and ".[test,book,lab]" in makefile
    assert "lab/overrides.json" in makefile and "lab/jupyter_server_config.py" in makefile
    assert '"jupyterlab>=4"' in (ROOT / "pyproject.toml").read_text()
    assert "Jupytext Notebook" in (ROOT / "lab" / "overrides.json").read_text()
