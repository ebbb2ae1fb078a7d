"""Checks every lab command makes before any work: the scale (``quick`` or ``full``) and the device
(one torch can use here), each a one-line ValueError naming what was given."""
from __future__ import annotations

from typing import Any

__all__ = ["SCALES", "check_device", "check_scale"]

#: the two scales every experiment knows (``hsm_lab.config.scale``); "full" is the larger
SCALES = ("quick", "full")


def check_scale(scale: Any) -> str:
    """``scale`` if it is ``"quick"`` or ``"full"``; else ValueError naming it.

    Every experiment function calls this first: they branch on ``scale == "quick"``, so any other
    string (``"Quick"``, ``"huge"``) would otherwise run the full configuration and be labelled
    with the string it was given. (``HSM_SCALE`` is read, case-insensitively, by
    :func:`hsm_lab.config.scale`; a function argument must be exact.)"""
    if not isinstance(scale, str) or scale not in SCALES:
        raise ValueError(f"scale must be 'quick' or 'full', got {scale!r}")
    return scale


def check_device(device: Any) -> str:
    """``device`` (a string or :class:`torch.device`) as a string, after checking that torch can use
    it here; raises ValueError naming it when it does not parse as a torch device, when it is not
    a CPU, CUDA or MPS device, or when that device is not available (no CUDA build or no GPU, a
    GPU index past the last one). Failing here, before any work, is what keeps a run from
    silently computing on the CPU while its result says ``cuda``, and from dying later in a
    traceback deep inside torch."""
    import torch

    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device must be a string such as 'cpu' or 'cuda', got {type(device).__name__} {device!r}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(f"device {str(device)!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1'): {exc}") from None
    if parsed.type == "cpu":
        return str(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise ValueError(f"device {str(device)!r} was requested but CUDA is not available ({why}, torch "
                             f"{torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"device {str(device)!r} was requested but only {count} CUDA device(s) exist "
                             f"(cuda:0..cuda:{count - 1})")
        return str(device)
    if parsed.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"device {str(device)!r} was requested but MPS is not available here; use --device cpu")
        return str(device)
    raise ValueError(f"device {str(device)!r}: only cpu, cuda and mps devices are supported")
