"""`make jupyterlab`: a chapter opened in JupyterLab and saved unedited is written back byte for byte,
and so is plain Markdown (README.md), which a double-click opens as a notebook too.

JupyterLab hands the saved notebook to jupytext, configured by jupytext.toml, then to the pre-save
hook of jupyter/jupyter_server_config.py; on opening, that configuration collapses the cells the book
hides. Most tests run the same steps without a server: read with jupytext, collapse, write, hook;
one goes through the configured contents manager itself where jupyter_server is installed.
"""
import asyncio
import runpy
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
from jupytext.config import load_jupytext_configuration_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAB = runpy.run_path(str(ROOT / "jupyter" / "jupyter_server_config.py"))
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


def test_make_jupyterlab_installs_jupyterlab_and_the_settings():
    makefile = (ROOT / "Makefile").read_text()
    assert "\njupyterlab: $(JUPYTERLAB_STAMP)" in makefile and '"./lab[test,book,jupyterlab]"' in makefile
    assert "jupyter/overrides.json" in makefile and "jupyter/jupyter_server_config.py" in makefile
    assert '"jupyterlab>=4"' in (ROOT / "lab" / "pyproject.toml").read_text()
    assert "Jupytext Notebook" in (ROOT / "jupyter" / "overrides.json").read_text()


#: plain Markdown that jupytext does not read and write back unchanged, beside the README
PLAIN = {
    "no-final-newline.md": "# Notes\n\nA line with no newline at its end",
    "front-matter.md": "---\ntitle: Notes\n---\n\n# Notes\n\n```python\nx = 1\n```\n",
    "blank-lines-first.md": "\n\n# Notes\n",
}


def _opened_as_notebook(text: str) -> dict:
    """What JupyterLab holds after opening ``text`` with jupytext's notebook viewer."""
    notebook = jupytext.reads(text, fmt=".md", config=CONFIG)
    LAB["collapse_hidden_cells"](notebook)
    return notebook


@pytest.mark.parametrize("name", ["README.md", *PLAIN])
def test_plain_markdown_saved_as_a_notebook_is_unchanged(name: str):
    text = (ROOT / name).read_text(encoding="utf-8") if name == "README.md" else PLAIN[name]
    assert not LAB["has_jupytext_header"](text)
    assert LAB["plain_markdown_text"](_opened_as_notebook(text), text, CONFIG) == text


def test_plain_markdown_edited_as_a_notebook_gets_no_header():
    text = PLAIN["front-matter.md"]
    notebook = _opened_as_notebook(text)
    notebook.cells.append(jupytext.reads("A new paragraph.\n", fmt="md").cells[0])
    saved = LAB["plain_markdown_text"](notebook, text, CONFIG)
    assert saved.startswith(text) and saved.endswith("A new paragraph.\n") and "jupytext" not in saved


def test_chapters_are_told_apart_from_plain_markdown():
    assert CHAPTERS and all(LAB["has_jupytext_header"](p.read_text(encoding="utf-8")) for p in CHAPTERS)
    markdown_notebook = "---\njupyter:\n  jupytext:\n    text_representation:\n      extension: .md\n---\n\n# T\n"
    assert LAB["has_jupytext_header"](markdown_notebook)
    assert not LAB["has_jupytext_header"](PLAIN["front-matter.md"])


def test_the_lab_contents_manager_keeps_plain_markdown_and_chapters(tmp_path: Path):
    """Through the contents manager `make jupyterlab` installs: open every file as a notebook (what a
    double-click does), save it unedited, and compare the bytes on disk."""
    pytest.importorskip("jupyter_server")
    from traitlets.config import Config

    config = Config()
    server = runpy.run_path(str(ROOT / "jupyter" / "jupyter_server_config.py"), init_globals={"get_config": lambda: config})
    manager = server["c"].ServerApp.contents_manager_class(root_dir=str(tmp_path))
    (tmp_path / "jupytext.toml").write_text((ROOT / "jupytext.toml").read_text())
    chapter = ROOT / "notebooks" / "using_hsm.md"
    (tmp_path / "notebooks").mkdir()
    files = {"README.md": (ROOT / "README.md").read_bytes(), **{k: v.encode() for k, v in PLAIN.items()},
             "notebooks/using_hsm.md": chapter.read_bytes()}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)

    async def open_and_save(name: str) -> dict:
        model = await manager.get(name, type="notebook")
        await manager.save({"type": "notebook", "content": model["content"]}, name)
        return model["content"]

    async def run() -> None:
        for name, data in files.items():
            await open_and_save(name)
            assert (tmp_path / name).read_bytes() == data, f"saving {name} from JupyterLab rewrote it"
        notebook = await manager.get("README.md", type="notebook")
        notebook["content"]["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "One more line."})
        await manager.save({"type": "notebook", "content": notebook["content"]}, "README.md")
        saved = (tmp_path / "README.md").read_text(encoding="utf-8")
        assert saved.startswith(files["README.md"].decode()) and saved.endswith("One more line.\n")
        # a new notebook saved as Markdown is a chapter: it keeps jupytext's header
        await manager.save({"type": "notebook", "content": notebook["content"]}, "new.md")
        assert LAB["has_jupytext_header"]((tmp_path / "new.md").read_text(encoding="utf-8"))

    asyncio.run(run())
