"""JupyterLab for this book's chapters (installed into .venv by `make jupyterlab`).

The chapters (notebooks/*.md) are jupytext MyST notebooks. This configuration

* collapses, when a chapter is opened, the cells the book hides: exercise solutions
  (``hide-cell``), plotting code (``hide-input``) and the checks that guard the prose
  (``remove-cell``); the collapsed state lives in cell metadata that jupytext.toml keeps out
  of the file, so it never reaches a saved chapter;
* writes a saved chapter the way its source is written: jupytext puts a blank line after a
  cell's ``:tags:`` line, which most cells of the sources do not have; the pre-save hook drops
  it wherever the file on disk has the same cell without it (and in new cells), so a save of an
  unedited chapter changes nothing;
* leaves plain Markdown plain. JupyterLab picks a viewer by file extension, so any ``.md`` file
  (README.md, the book's plain pages) opens as a notebook on double-click, not only the chapters;
  jupytext would write it back with its YAML header. A Markdown file whose text on disk has no
  jupytext header is saved without one, and saved byte for byte as it was when its cells are
  unchanged (jupytext's reading and writing do not round-trip every Markdown file: a missing final
  newline, blank lines before the first heading, front matter). Open With > Editor edits such a
  file as text.
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


# the first YAML block of a file, and a top-level key jupytext writes there (``jupytext:`` in a
# MyST notebook, ``jupyter:`` in a Markdown one)
_YAML_HEADER = re.compile(r"\A---\n(.*?\n)---\n", re.DOTALL)
_JUPYTEXT_KEY = re.compile(r"^(?:jupytext|jupyter):", re.MULTILINE)


def has_jupytext_header(text: str) -> bool:
    """Whether ``text`` starts with a YAML header holding jupytext's metadata (a chapter)."""
    match = _YAML_HEADER.match(text)
    return bool(match) and _JUPYTEXT_KEY.search(match.group(1)) is not None


def plain_markdown_text(notebook: dict, on_disk: str, config=None) -> str:
    """The text to save for ``notebook``, opened from the plain Markdown ``on_disk`` (no jupytext
    header): ``on_disk`` itself when the cells are those jupytext reads from it, so an unedited
    save changes no byte; else jupytext's text of the cells with no header (``-all``, its own
    setting for a file read without one), whatever ``config`` (jupytext.toml) sets for chapters."""
    import jupytext
    import nbformat

    notebook = nbformat.from_dict(notebook)
    shown = notebook.metadata.get("jupytext", {}).get("text_representation", {})
    fmt = {"extension": shown.get("extension", ".md"), "notebook_metadata_filter": "-all"}
    if shown.get("format_name"):
        fmt["format_name"] = shown["format_name"]
    text = jupytext.writes(notebook, fmt=fmt, config=config)
    read_fmt = {k: v for k, v in fmt.items() if k != "notebook_metadata_filter"}
    unchanged = jupytext.writes(jupytext.reads(on_disk, fmt=read_fmt, config=config), fmt=fmt, config=config)
    return on_disk if text == unchanged else text


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

        async def save(self, model, path=""):
            path = path.strip("/")
            if model.get("type") == "notebook" and path.endswith(".md") and await self.file_exists(path):
                model_on_disk = await super().get(path, content=True, type="file", format="text")
                on_disk = model_on_disk.get("content") or ""
                if not has_jupytext_header(on_disk):  # plain Markdown: it stays so
                    config = await self.get_config(path)
                    text = plain_markdown_text(model["content"], on_disk, config)
                    return await super().save({"type": "file", "format": "text", "content": text}, path)
            return await super().save(model, path)

        async def get(self, path, content=True, type=None, format=None, **kwargs):
            model = await super().get(path, content=content, type=type, format=format, **kwargs)
            if content and model.get("type") == "notebook" and model.get("content"):
                collapse_hidden_cells(model["content"])
            return model

    c = get_config()  # noqa: F821 (defined by Jupyter when it reads this file)
    c.ServerApp.contents_manager_class = ChapterContentsManager
