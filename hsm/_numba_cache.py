"""Where numba keeps the kernels it compiles (``cache=True``), on any installation.

numba picks its cache folder when a kernel is defined, that is when :mod:`hsm` is imported:
``NUMBA_CACHE_DIR`` when set, else the ``__pycache__`` folder beside the module, else the user's
cache folder (``~/.cache``, from ``HOME``). A read-only installation run by a user whose home
cannot be written (a container running as a non-root user) has none of them, and numba then
refuses to define the kernel ("no locator available"): ``import hsm`` would fail.

:func:`ensure_cache_location` is run by ``import hsm`` before any kernel is defined. Where numba
finds a folder itself, nothing changes: the cache stays where ``python -m hsm warmup`` put it
(beside the installed package, shared by every user of that installation). Where it finds none,
the cache goes to a per-user folder under the system's temporary folder (as if
``NUMBA_CACHE_DIR`` named it): the kernels are compiled once per machine boot instead of once per
installation. Only where even that folder cannot be written are the kernels compiled without a
cache, in every process (slow first steps, the same results), with one warning saying how to give
numba a folder.

Why probe numba rather than test the folders here: numba's own rules for its folders (which
locators, in which order, how it tests that a folder is writable) change between its versions;
defining one small cached function is numba's own test and stays right whatever the version.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

__all__ = ["ensure_cache_location"]

#: where the cache went: None before :func:`ensure_cache_location` ran, "numba" where numba found a
#: folder itself, a folder's path for the temporary folder, "none" when nothing could be written
location: str | None = None


def _probe() -> int:  # pragma: no cover - compiled
    return 0


def _numba_can_cache() -> bool:
    """Whether numba finds a folder for the cache of a function of this package."""
    import numba

    try:
        numba.njit(cache=True)(_probe)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available for file ..."
        return False
    return True


def _user_tag() -> str:
    try:
        return str(os.getuid())
    except AttributeError:  # Windows
        return os.environ.get("USERNAME", "user")


def ensure_cache_location() -> str:
    """Make sure numba can define the package's cached kernels (see the module's text); returns
    where the cache goes. Runs its probe once per process."""
    global location
    if location is not None:
        return location
    import numba

    if _numba_can_cache():
        location = "numba"
        return location
    previous = numba.config.CACHE_DIR
    try:
        folder = Path(tempfile.gettempdir()) / f"hsm-numba-cache-{_user_tag()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        numba.config.CACHE_DIR = str(folder)
        if _numba_can_cache():
            location = str(folder)
            return location
    except OSError:  # no temporary folder at all (tempfile.gettempdir found none writable)
        pass
    numba.config.CACHE_DIR = previous
    # nothing can be written: numba's dispatchers start with a cache that keeps nothing, and
    # enable_caching is what replaces it; left as it is, the kernels compile in every process
    from numba.core.dispatcher import Dispatcher

    Dispatcher.enable_caching = lambda self: None
    warnings.warn("numba finds no folder it can write its compiled kernels to (the installation, HOME and the "
                  "temporary folder are read-only): every process compiles them again; set NUMBA_CACHE_DIR to a "
                  "writable folder", RuntimeWarning, stacklevel=2)
    location = "none"
    return location
