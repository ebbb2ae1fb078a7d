"""The API reference page (book/api.md) documents every public module and every name of hsm.__all__."""
import importlib
import pkgutil
import re
from pathlib import Path

import hsm

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "book" / "api.md").read_text()


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
    return found


def _blocks() -> dict[str, str]:
    """automodule name -> the options written under it."""
    return dict(re.findall(r"^\.\. automodule:: (\S+)\n((?:   :.*\n)*)", PAGE, flags=re.M))


def test_every_public_module_has_an_automodule_block():
    blocks = _blocks()
    missing = [name for name in ["hsm", *_public_modules()] if name not in blocks]
    assert not missing, f"add an automodule block to book/api.md for: {missing}"
    assert all(":members:" in options for options in blocks.values())


def test_every_name_of_hsm_all_is_in_the_summary():
    summary = re.search(r"\.\. autosummary::\n(?:   :\S+:\n)*\n((?:   \S+\n)+)", PAGE)
    assert summary, "book/api.md lost the autosummary of hsm.__all__"
    listed = summary.group(1).split()
    assert listed == [f"hsm.{name}" for name in hsm.__all__], "the summary must list hsm.__all__, in order"


def test_names_defined_in_private_modules_are_documented_under_hsm():
    """A name of hsm.__all__ whose module is private (not on the page) gets its own entry."""
    for name in hsm.__all__:
        module = getattr(hsm, name).__module__
        if any(part.startswith("_") for part in module.split(".")):
            assert re.search(rf"^\.\. auto(class|exception|function):: hsm\.{name}$", PAGE, flags=re.M), (
                f"hsm.{name} is defined in the private {module}: document it in book/api.md's package section")


def test_each_object_is_documented_once_in_its_module():
    """A module documents what it defines; what its __all__ re-exports from elsewhere is excluded
    (documented in the defining module, and references to the re-exported name resolve there)."""
    for name, options in _blocks().items():
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
    assert "book/api" in (ROOT / "_toc.yml").read_text()
