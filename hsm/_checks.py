"""The input checks every entry point of the output layers makes (forward, log_prob, predict, topk).

Bad input gets a ValueError or TypeError naming the problem before any kernel runs, never a deep
torch traceback or a silent wrong result (a NaN log-probability, an arbitrary "most likely" label).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .tree import check_integer

__all__ = ["NonFiniteInputError", "check_choice", "check_count", "check_fraction", "check_positive", "check_input", "check_logits_finite", "check_k", "check_target", "check_target_shape"]


class NonFiniteInputError(ValueError):
    """The input of an output layer holds NaN or infinite values (a ValueError; :func:`hsm.training.train_epoch`
    reports it as the divergence it usually is, a FloatingPointError naming the step)."""


def check_positive(value: Any, name: str) -> float:
    """``value`` as a float; TypeError unless a real number, ValueError unless finite and > 0."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return float(value)


def check_count(value: Any, name: str, minimum: int, shown: str | None = None) -> int:
    """``value`` as an int ``>= minimum``: TypeError for a non-integer (:func:`hsm.tree.check_integer`),
    ValueError naming ``shown`` (default ``name``) for a smaller one."""
    count = check_integer(value, name)
    if count < minimum:
        raise ValueError(f"{shown or name} must be >= {minimum}, got {value}")
    return count


def check_choice(value: Any, name: str, choices: tuple[str, ...], described: str | None = None) -> Any:
    """``value`` when it is one of ``choices``; else ValueError listing them (or ``described``)."""
    if value not in choices:
        listed = described or ", ".join(map(repr, choices[:-1])) + f" or {choices[-1]!r}"
        raise ValueError(f"{name} must be {listed}, got {value!r}")
    return value


def check_fraction(value: Any, name: str) -> float:
    """``value`` as a float; TypeError unless a real number, ValueError outside [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return float(value)


def check_input(input: Tensor, in_features: int, parameter: Tensor | None = None, finite: bool = True) -> None:
    """The checks every entry point (forward, log_prob, predict, topk) makes on ``input``:

    * TypeError unless it is a tensor of the layer's dtype (``parameter``'s: a float64 input into a
      float32 layer is an error, as for ``nn.Linear``, raised here rather than deep in a kernel);
    * ValueError unless its shape is [B, in_features] and it is on the layer's device;
    * :class:`NonFiniteInputError` (a ValueError) naming the rows when it holds NaN or infinite
      values: the layer would otherwise return NaN log-probabilities and an arbitrary "most likely"
      label (which differed between the compiled and the PyTorch path).

    The finiteness test is one sum over the B * d inputs (a NaN or inf makes the sum non-finite);
    only when the sum is not finite (or overflows) is every element checked to find the rows.
    At B = 128, d = 200 the sum costs about 4 us, 0.2 % of a training step of the layer (V = 250k).
    On a GPU, reading the sum waits for the device once per call (forward, predict and topk
    already do, to plan the batch on the host). ``finite=False`` leaves that test out (the static
    engine, :mod:`hsm.engine`, which never waits for the device: a NaN input gives a NaN loss)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() != 2 or input.shape[1] != in_features:
        raise ValueError(f"input must have shape [B, {in_features}], got {list(input.shape)}")
    if parameter is not None:
        if input.dtype != parameter.dtype:
            raise TypeError(f"input has dtype {input.dtype} but the layer's parameters are {parameter.dtype}: "
                            f"convert the input (input.to({parameter.dtype})) or the layer (layer.to({input.dtype}))")
        if input.device != parameter.device:
            raise ValueError(f"input is on {input.device} but the layer's parameters are on {parameter.device}")
    if finite and input.numel() and not math.isfinite(float(input.detach().sum())):
        bad = torch.nonzero(~torch.isfinite(input.detach()).all(dim=1)).flatten()
        if bad.numel():
            rows = bad[:5].tolist()
            raise NonFiniteInputError(f"input has NaN or infinite values in {bad.numel()} of {input.shape[0]} "
                                      f"rows (rows {rows}{', ...' if bad.numel() > 5 else ''})")


def check_logits_finite(bad_rows: Tensor | Sequence[int], batch: int, dtype: torch.dtype) -> None:
    """Raise :class:`NonFiniteInputError` naming ``bad_rows`` (row indices, possibly repeated) when
    there are any: rows whose input is finite but whose node logits ``W h + b`` overflow ``dtype``
    (a log-softmax of ``inf`` is NaN). Called by every entry point after it computed the logits it
    needed, so that a huge input raises the same named error as a NaN input instead of giving NaN
    log-probabilities and a "most likely" label that differs between ``predict`` and ``topk``."""
    rows = sorted({int(r) for r in (bad_rows.tolist() if isinstance(bad_rows, Tensor) else bad_rows)})
    if rows:
        name = str(dtype).replace("torch.", "")
        raise NonFiniteInputError(
            f"the layer's logits overflow {name} in {len(rows)} of {batch} rows (rows {rows[:5]}"
            f"{', ...' if len(rows) > 5 else ''}): the input is finite but too large; scale it down "
            f"(e.g. normalise it) or compute in float64")


def check_k(k: int, num_labels: int, method: str, beam: int | None) -> None:
    """topk's arguments: k in 1..K and beam None or >= 1 (integers, not bools), method known."""
    if check_integer(k, "k") < 1 or k > num_labels:
        raise ValueError(f"k must be in 1..{num_labels}, got {k}")
    if method not in ("exact", "beam"):
        raise ValueError(f"method must be 'exact' or 'beam', got {method!r}")
    if beam is not None and check_integer(beam, "beam") < 1:
        raise ValueError(f"beam must be >= 1 (the beam search's width) or None, got {beam}")


def check_target_shape(target: Tensor, batch: int) -> None:
    if not isinstance(target, Tensor) or target.dtype not in (torch.int64, torch.int32):
        got = target.dtype if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"target must be an integer tensor of label ids (torch.int64 or torch.int32), got {got}")
    if target.shape != (batch,):
        raise ValueError(f"target must have shape [{batch}] to match input, got {list(target.shape)}")


def check_target(target: Tensor, batch: int, num_labels: int) -> None:
    check_target_shape(target, batch)
    if batch and (int(target.min()) < 0 or int(target.max()) >= num_labels):
        bad = target[(target < 0) | (target >= num_labels)][0].item()
        raise ValueError(f"unknown label {bad}: labels are 0..{num_labels - 1}")
