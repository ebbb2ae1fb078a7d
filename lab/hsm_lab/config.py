"""Run-wide settings read from the environment: scale switch, data mirror, cache, seeding.

One switch selects how big every notebook and experiment runs:

``HSM_SCALE=quick`` (the default, what CI uses) runs on small slices in minutes;
``HSM_SCALE=full`` runs at the paper's scale where the hardware allows.
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Literal

import numpy as np

Scale = Literal["quick", "full"]

#: Environment variable naming a local data mirror: one folder per source, laid out as in
#: :mod:`hsm_lab.data.registry` (``ptb/ptb.train.txt``, ...).
MIRROR_ENV = "HSM_DATA_MIRROR"
#: Environment variable naming the cache directory (downloaded archives, processed token ids).
CACHE_ENV = "HSM_CACHE"
#: Environment variable selecting quick or full scale.
SCALE_ENV = "HSM_SCALE"
#: Environment variable naming the folder of finished and checkpointed training runs (default:
#: ``lm-runs`` in the cache), which an interrupted or repeated experiment resumes from.
RUNS_ENV = "HSM_RUNS"


def scale() -> Scale:
    """The scale selected by ``HSM_SCALE`` (``quick`` unless set to ``full``)."""
    value = os.environ.get(SCALE_ENV, "quick").strip().lower()
    if value not in ("quick", "full"):
        raise ValueError(f"{SCALE_ENV} must be 'quick' or 'full', got {value!r}")
    return value  # type: ignore[return-value]


def data_mirror() -> Path | None:
    """The mirror directory named by ``HSM_DATA_MIRROR``, or None when unset."""
    value = os.environ.get(MIRROR_ENV)
    return Path(value).expanduser().resolve() if value else None


def cache_dir() -> Path:
    """Cache directory: ``HSM_CACHE``, else ``$XDG_CACHE_HOME/hsm``, else ``~/.cache/hsm``; created if missing.

    Raises ValueError naming ``HSM_CACHE`` and the path when the path exists but is not a directory, or when it
    cannot be created (no permission, a parent that is a file, a read-only file system). An existing directory
    that is *not writable* is accepted on purpose: a pre-filled read-only cache can still be read, files from
    the data mirror are then read in place, and a write that is really needed fails with an error naming the
    path (see :mod:`hsm_lab.data.fetch`).
    """
    value = os.environ.get(CACHE_ENV)
    if value:
        path = Path(value).expanduser()
        origin = f"{CACHE_ENV}={value!r}"
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "hsm"
        origin = f"the default cache directory ({CACHE_ENV} is unset)"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # mkdir(exist_ok=True) raises FileExistsError for an existing file: name the real problem.
        what = ("exists and is not a directory" if path.exists() and not path.is_dir()
                else f"cannot be created ({type(exc).__name__}: {exc.strerror or exc})")
        raise ValueError(f"{origin}: the cache directory {path} {what}. "
                         f"Fix: set {CACHE_ENV} to a writable directory.") from exc
    return path


def runs_dir(experiment: str) -> Path:
    """The folder of an experiment's finished and checkpointed runs: ``HSM_RUNS/<experiment>``, else
    ``cache_dir()/lm-runs/<experiment>``; created if missing. A run found there is read, not
    trained again, so ``python -m hsm reproduce`` points ``HSM_RUNS`` at a fresh folder."""
    value = os.environ.get(RUNS_ENV)
    root = Path(value).expanduser() if value else cache_dir() / "lm-runs"
    path = root / experiment
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"the runs folder {path} cannot be created ({exc.strerror or exc}). Fix: set {RUNS_ENV} "
                         "to a writable directory.") from exc
    return path


def seed_everything(seed: int) -> np.random.Generator:
    """Seed Python, NumPy and torch; return a fresh NumPy generator for explicit use."""
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


#: Environment variable: torch intra-op threads for the experiments (see :func:`configure_threads`).
THREADS_ENV = "HSM_THREADS"


def configure_threads(default: int | None = None) -> int:
    """Set torch's intra-op threads from ``HSM_THREADS`` (else ``default``, else leave torch's
    choice) and return the number in force. Small per-step kernels on a machine whose other
    cores are busy run many times slower with several threads (spin-waiting); experiments on a
    shared CPU pass ``default=1``."""
    import torch

    threads = env_threads()
    threads = default if threads is None else threads
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def env_threads() -> int | None:
    """``HSM_THREADS`` as a positive int, or None when unset or empty; ValueError naming the
    variable otherwise (``HSM_THREADS=abc``, ``0``). The CLI checks it before any work."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return None
    try:
        threads = int(value)
    except ValueError:
        raise ValueError(f"{THREADS_ENV}={value!r} is not a number of threads: set a positive integer "
                         f"(e.g. {THREADS_ENV}=1) or unset it") from None
    if threads < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer, got {threads}")
    return threads
