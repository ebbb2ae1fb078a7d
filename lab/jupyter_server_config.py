"""JupyterLab for this book's chapters (installed into .venv by `make lab`).

The chapters (notebooks/*.md) are jupytext MyST notebooks. This configuration

* collapses, when a chapter is opened, the cells the book hides: exercise solutions
  (``hide-cell``), plotting code (``hide-input``) and the checks that guard the prose
  (``remove-cell``); the collapsed state lives in cell metadata that jupytext.toml keeps out
  of the file, so it never reaches a saved chapter;
* writes a saved chapter the way its source is written: jupytext puts a blank line after a
  cell's ``:tags:`` line, which most cells of the sources do not have; the pre-save hook drops
  it wherever the file on disk has the same cell without it (and in new cells), so a save of an
  unedited chapter changes nothing.
"""
import re

#: cell tag -> what JupyterLab collapses for it
COLLAPSED = {
    "hide-cell": {"source_hidden": True, "outputs_hidden": True},
    "hide-input": {"source_hidden": True},
    "remove-cell": {"source_hidden": True},
}

# a code-cell directive and its ":key: value" option lines, the blank line jupytext adds, and
# the cell's first line
_OPTIONS_THEN_BLANK = re.compile(r"^(`{3,}\{code-cell\}[^\n]*\n(?::[^\n]*\n)+)\n([^\n]*\n)", re.MULTILINE)


def collapse_hidden_cells(notebook: dict) -> None:
    """Collapse the cells whose tags hide them in the book (JupyterLab's ``jupyter`` metadata)."""
    for cell in notebook.get("cells", []):
        for tag in cell.get("metadata", {}).get("tags", []):
            if tag in COLLAPSED:
                cell["metadata"].setdefault("jupyter", {}).update(COLLAPSED[tag])


def write_like_the_sources(model: dict, path: str, contents_manager, **kwargs) -> None:
    """Pre-save hook: a code cell's options followed by a blank line only where the file on
    disk has that cell so."""
    if model.get("type") != "file" or model.get("format") != "text" or not path.endswith(".md"):
        return
    text = model.get("content") or ""
    if not text.startswith("---\njupytext:"):
        return
    try:
        with open(contents_manager._get_os_path(path), encoding="utf-8") as file:
            before = file.read()
    except (OSError, AttributeError):
        before = ""

    def unless_on_disk(match: re.Match) -> str:
        if match.group(0) in before:  # the source has this cell with the blank line: keep it
            return match.group(0)
        return match.group(1) + match.group(2)

    model["content"] = _OPTIONS_THEN_BLANK.sub(unless_on_disk, text)


if "get_config" in globals():  # read by Jupyter (tests import the functions above alone)
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
    from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

    class ChapterContentsManager(build_async_jupytext_contents_manager_class(AsyncLargeFileManager)):
        """jupytext's contents manager, with the book's hidden cells collapsed on opening and saves
        written as the sources are."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_pre_save_hook(write_like_the_sources)

        async def get(self, path, content=True, type=None, format=None, **kwargs):
            model = await super().get(path, content=content, type=type, format=format, **kwargs)
            if content and model.get("type") == "notebook" and model.get("content"):
                collapse_hidden_cells(model["content"])
            return model

    c = get_config()  # noqa: F821 (defined by Jupyter when it reads this file)
    c.ServerApp.contents_manager_class = ChapterContentsManager
