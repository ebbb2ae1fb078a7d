"""Experiment packages that stay patchable like the single modules they were split from.

``hsm.experiments.lm``, ``.classification`` and ``.sampling`` were each one module; their
``__init__`` re-exports every name of their submodules, so ``from hsm.experiments import lm;
lm.train_lm`` still works. Reading a name is then enough, but setting one is not: the code that
calls ``atomic_write`` now lives in ``lm.training`` and looks it up there, so
``monkeypatch.setattr(lm, "atomic_write", fake)`` would change only the package's copy.
:func:`patches_reach_submodules` makes a package forward such assignments to its submodules.
"""
from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["patches_reach_submodules"]


class _PatchablePackage(types.ModuleType):
    """A package module whose ``package.NAME = value`` also sets ``NAME`` in every loaded submodule
    (``package.sub``, ``package.sub.deeper``) that holds the package's old object under that name.
    A submodule that binds the name to something else keeps it; submodules themselves (the
    package's attributes ``training``, ``report``, ...) are set on the package only."""

    def __setattr__(self, name: str, value: Any) -> None:
        old = self.__dict__.get(name)
        if old is not None and not isinstance(old, types.ModuleType):
            prefix = self.__name__ + "."
            for module_name, module in list(sys.modules.items()):
                if module_name.startswith(prefix) and vars(module).get(name) is old:
                    setattr(module, name, value)
        super().__setattr__(name, value)


def patches_reach_submodules(package: str | types.ModuleType) -> types.ModuleType:
    """Make setting a name on ``package`` (a module or its name in :data:`sys.modules`) also set it
    in each of its submodules that holds the same object, so that code split out of one module
    still calls what a test sets on the module's old name: ``monkeypatch.setattr(C, "run_fasttext",
    fake)`` reaches ``C.table._run_peer``, and ``monkeypatch.undo()`` restores every copy (undoing
    is one more assignment). Call it at the end of the package's ``__init__``, after the
    re-exports; returns the package. ValueError for a name that is not an imported module,
    TypeError when ``package`` is neither a name nor a module."""
    if isinstance(package, str):
        if package not in sys.modules:
            raise ValueError(f"package {package!r} is not imported (not in sys.modules)")
        package = sys.modules[package]
    module = package
    if not isinstance(module, types.ModuleType):
        raise TypeError(f"package must be a module or a module name, got {type(package).__name__}")
    if not isinstance(module, _PatchablePackage):
        module.__class__ = _PatchablePackage
    return module
