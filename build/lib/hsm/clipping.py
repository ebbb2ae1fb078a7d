"""Gradient-norm clipping that also takes the sparse gradients of ``HierarchicalSoftmax(sparse=True)``.

``torch.nn.utils.clip_grad_norm_`` computes each gradient's norm with ``torch.linalg.vector_norm``,
which has no kernel for sparse COO tensors, so a model whose output layer has sparse gradients
cannot be clipped with it. The norm of a sparse gradient is the norm of its values once duplicate
rows are summed (``coalesce``): the rows it does not list are zero. :func:`clip_grad_norm_` does
that and otherwise defers to torch, so on dense gradients it gives torch's result exactly.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for dense and sparse gradients: scale the gradients of
    ``parameters`` in place so that their total ``norm_type``-norm is at most ``max_norm``, and
    return the total norm before clipping.

    Dense gradients only: torch's function is called (same result, same errors). With sparse
    gradients, each is coalesced (``param.grad`` is replaced by its coalesced form when it had
    duplicate rows, as two backward passes accumulate them) and counts with the norm of its values;
    the scale factor is torch's, ``min(1, max_norm / (total + 1e-6))``, applied to the values of
    the sparse gradients and through ``torch.nn.utils.clip_grads_with_norm_`` to the dense ones.
    ``error_if_nonfinite`` raises torch's RuntimeError when the total norm is NaN or infinite."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    with_grad = [param for param in params if param.grad is not None]
    if not any(param.grad.is_sparse for param in with_grad):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite)
    with torch.no_grad():
        for param in with_grad:
            if param.grad.is_sparse and not param.grad.is_coalesced():
                param.grad = param.grad.coalesce()
        sparse_values = [param.grad._values() for param in with_grad if param.grad.is_sparse]
        dense = [param for param in with_grad if not param.grad.is_sparse]
        total = torch.nn.utils.get_total_norm(sparse_values + [param.grad for param in dense], norm_type,
                                              error_if_nonfinite)
        torch.nn.utils.clip_grads_with_norm_(dense, max_norm, total)
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for values in sparse_values:
            values.mul_(scale.to(values.device, values.dtype))
    return total
