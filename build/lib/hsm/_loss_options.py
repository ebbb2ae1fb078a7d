"""What makes the output layers a drop-in for ``F.cross_entropy`` in a sequence model:
``ignore_index``, ``reduction`` and inputs with leading dimensions (``[B, T, d]`` with targets
``[B, T]``).

:class:`hsm.HierarchicalSoftmax` and :class:`hsm.FlatSoftmax` compute eq. 5 (or the flat softmax)
on a batch of rows, ``input [B, d]``, ``target [B]``. A language model pads its sequences and
marks the padding with a target ``ignore_index`` (-100 by default, as ``nn.CrossEntropyLoss``);
:func:`forward_rows` removes those rows *before* the layer sees them, so they cost nothing, get
``output`` 0 and a zero gradient, are left out of the mean, and never reach Algorithm 1's
statistics (the layer only hands the rows it evaluated to its :class:`~hsm.TreeLearner`). The
same rows go through the compiled and the PyTorch path and through a fused optimiser
(:meth:`hsm.RowSparseAdagrad.fuse`), whose one backward pass sees only the kept rows.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .tree import check_integer

__all__ = ["REDUCTIONS", "check_loss_options", "forward_rows", "over_leading_dims"]

#: the values of ``reduction``: what ``loss`` is (``output`` is always per row)
REDUCTIONS = ("mean", "sum")


def check_loss_options(ignore_index: Any, reduction: Any) -> tuple[int, str]:
    """``(ignore_index, reduction)`` checked: TypeError for a non-integer ``ignore_index``,
    ValueError for a ``reduction`` other than ``"mean"`` or ``"sum"``."""
    ignore_index = check_integer(ignore_index, "ignore_index")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r} (the per-row values are the "
                         "forward's `output`: use it for reduction='none')")
    return ignore_index, reduction


def _leading_shape(input: Tensor, in_features: int) -> tuple[int, ...] | None:
    """The leading dimensions ``[...]`` of an ``input [..., d]`` that is not ``[B, d]`` (None for
    ``[B, d]`` and for anything the layer's own checks should report)."""
    if not isinstance(input, Tensor) or input.dim() == 2:
        return None
    if input.dim() == 0 or input.shape[-1] != in_features:
        raise ValueError(f"input must have shape [B, {in_features}] or [..., {in_features}], got {list(input.shape)}")
    return tuple(input.shape[:-1])


def _ignored_rows(target: Tensor, ignore_index: int) -> Tensor | None:
    """Indices of the rows to keep when some of ``target`` [B] equal ``ignore_index``, else None."""
    if not isinstance(target, Tensor) or target.dim() != 1 or target.dtype not in (torch.int64, torch.int32) \
            or target.numel() == 0:
        return None  # the layer's own checks name what is wrong
    if target.device.type == "cpu":  # numpy: a tenth of the cost of three small torch calls
        ignored = target.detach().numpy() == ignore_index
        if not ignored.any():
            return None
        return torch.from_numpy(np.flatnonzero(~ignored))
    ignored = target == ignore_index
    if not bool(ignored.any()):
        return None
    return torch.nonzero(~ignored).squeeze(1)


def forward_rows(layer: Any, input: Tensor, target: Tensor,
                 rows: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """``(output [...], loss [])`` of ``layer`` on ``input [..., d]`` / ``target [...]``, where
    ``rows(input [B, d], target [B])`` is the layer's forward over rows (returning the mean loss).

    Rows whose target is ``layer.ignore_index`` are not evaluated: ``output`` 0 there, no
    gradient, not in the mean (the mean over no rows is NaN, as ``F.cross_entropy`` gives) and
    not in the statistics of a :class:`~hsm.TreeLearner`. ``layer.reduction == "sum"``: ``loss``
    is ``-output.sum()`` (0 over no rows)."""
    lead = _leading_shape(input, layer.in_features)
    if lead is not None:
        if not isinstance(target, Tensor) or tuple(target.shape) != lead:
            got = list(target.shape) if isinstance(target, Tensor) else type(target).__name__
            raise ValueError(f"target must have shape {list(lead)} to match input {list(input.shape)} "
                             f"(input [..., d], target [...]), got {got}")
        count = math.prod(lead)
        input, target = input.reshape(count, layer.in_features), target.reshape(count)
    keep = _ignored_rows(target, layer.ignore_index)
    if keep is None:
        output, loss = rows(input, target)
    else:
        keep = keep.to(input.device)
        kept, loss = rows(input.index_select(0, keep), target.index_select(0, keep))
        # index_copy is differentiable in its source: the ignored rows get no gradient
        output = kept.new_zeros(target.shape[0]).index_copy(0, keep, kept)
    if layer.reduction == "sum":
        loss = -output.sum()
    if lead is not None:
        output = output.reshape(lead)
    return output, loss


def over_leading_dims(method: Callable) -> Callable:
    """Let a row-wise method of an output layer (``log_prob``, ``predict``, ``topk``) take
    ``input [..., d]``: the rows are flattened to ``[B, d]`` and every tensor of the result gets the
    leading dimensions back (``[B, K]`` -> ``[..., K]``, ``[B]`` -> ``[...]``)."""

    @functools.wraps(method)
    def wrapper(self, input: Tensor, *args: Any, **kwargs: Any) -> Any:
        lead = _leading_shape(input, self.in_features)
        if lead is None:
            return method(self, input, *args, **kwargs)
        result = method(self, input.reshape(math.prod(lead), self.in_features), *args, **kwargs)

        def restore(tensor: Tensor) -> Tensor:
            return tensor.reshape(*lead, *tensor.shape[1:])

        if isinstance(result, Tensor):
            return restore(result)
        return type(result)(*(restore(part) for part in result))  # a NamedTuple of tensors (TopK)

    return wrapper
