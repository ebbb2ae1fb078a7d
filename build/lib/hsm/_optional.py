"""The few third-party packages the library uses only in some functions, installed with an extra:
a missing one is a one-line ImportError naming the function, the package and the install line."""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["DISTRIBUTION", "EXTRAS", "install_hint", "require"]

DISTRIBUTION = "hsm-learned-trees"

#: import name -> (the extra that installs it, the pip distribution)
EXTRAS = {
    "matplotlib": ("plot", "matplotlib"),
    "sklearn": ("clustering", "scikit-learn"),
    "tqdm": ("experiments", "tqdm"),
}


def install_hint(package: str) -> str:
    """``pip install '<distribution>[<extra>]'`` for a package of :data:`EXTRAS`."""
    extra, _ = EXTRAS[package.split(".")[0]]
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def require(module: str, purpose: str) -> ModuleType:
    """``importlib.import_module(module)``; where its package is missing, ImportError saying that
    ``purpose`` needs it and how to install it (the library itself needs only torch, numpy, numba
    and scipy)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        package = module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != package or package not in EXTRAS:
            raise
        _, distribution = EXTRAS[package]
        raise ImportError(f"{purpose} needs {distribution}, which hsm installs only with an extra: "
                          f"{install_hint(package)}") from None
