"""The static engine of :class:`hsm.HierarchicalSoftmax`: eq. 5 in a fixed handful of torch ops,
the same on every device, with no host-device synchronisation and no shape that depends on the data.

The layer's log-likelihood (ICML eq. 2-3 and 5) of label ``y`` given the representation ``h``,

    log p(y | h) = sum over d = 1 .. L(y) of log softmax(W_{n_d} h + b_{n_d})[c_d],

where ``n_1 .. n_L(y)`` are the nodes on the path of ``y`` and ``c_d`` the child taken at ``n_d``, is
computed here from per-label path tables kept on the layer's device (:func:`path_tables`):

* ``engine_nodes`` [K + 1, L] (int64): ``n_d``, padded past a shorter path with its last node;
* ``engine_slots`` [K + 1, L] (int64): ``d * M + c_d``, the position of the taken child among the
  ``L * M`` logits of the path;
* ``engine_steps`` [K + 1, L + 1] (float): 1 on the real steps of the path and 0 on the padding, and
  in the last column -1 (the row's share of the negative count of rows that the mean divides by);
* ``engine_penalty`` [N, M] (float): 0 on a slot with a real label below it, -inf on an empty slot;

row K is the path of an ignored row (``ignore_index``): all steps padding, so its log-likelihood is 0
and it counts for nothing. A step (:func:`forward`) is then, whatever the tree and the batch:
one lookup per table, the path's node blocks gathered (``F.embedding``, so ``sparse=True`` gives
a row-sparse gradient), one batched matrix product for the ``B * L * M`` logits, one log-softmax,
one gather; the backward (:class:`PathLogLikelihood`) is written by hand: ``onehot(c_d) - softmax``
scaled by the path mask, one batched product for the input gradient and one outer product for the
node blocks'. :meth:`hsm.RowSparseAdagrad` applies the gradient without ``unique`` or ``coalesce``
(:func:`adagrad_rows_`), and Algorithm 1's statistics are added with fixed-shape ops.

Nothing is read back to the host, so the op sequence and its shapes are the same for every batch
of a given size: a training step can be compiled (``torch.compile(fullgraph=True)``, no recompile
for new targets) and captured in a CUDA graph. The tables are rebuilt *in place* when the tree
changes (:meth:`hsm.HierarchicalSoftmax.set_tree`), so a captured step reads the new tree; only a
tree of another depth L reallocates them (then compile or capture again).

What the checks cannot do without reading the device is left to where the loop reads a value
anyway: a NaN or infinite input gives a NaN loss, as ``F.cross_entropy`` does (the training loop's
``float(loss)`` reports it, :func:`hsm.train_epoch`); a label outside 0..K-1 fails the table lookup
(on the CPU a ValueError naming the label; on a GPU a device-side assert, as for
``F.cross_entropy``). Shapes, dtypes and devices are checked on the host, which costs nothing.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_input, check_target, check_target_shape
from .backend import without_autocast
from .tree import Tree

__all__ = ["ENGINES", "PathLogLikelihood", "TABLES", "adagrad_rows_", "forward", "path_tables", "uses_static_engine"]

#: the values of ``HierarchicalSoftmax(engine=...)`` and ``RowSparseAdagrad(engine=...)``: "auto" is
#: this engine on every device but the CPU and the compiled kernels of :mod:`hsm.kernels` on the
#: CPU; "torch" is this engine everywhere (what a GPU runs, on the CPU: tests run it there)
ENGINES = ("auto", "torch")

#: the layer's buffers this engine reads (:func:`path_tables`)
TABLES = ("engine_nodes", "engine_slots", "engine_steps", "engine_penalty")


def uses_static_engine(engine: str, device: torch.device) -> bool:
    """Whether ``engine`` ("auto" or "torch") means this engine for tensors on ``device``."""
    return engine == "torch" or device.type != "cpu"


def path_tables(tree: Tree, dtype: torch.dtype, device: torch.device | str) -> dict[str, Tensor]:
    """The engine's tables of ``tree`` (module docstring), as tensors on ``device``; the float ones
    in ``dtype``. Built on the host once per tree."""
    num_labels, arity = tree.num_labels, tree.arity
    nodes, children, mask = (np.asarray(a[:num_labels]) for a in (tree.path_nodes, tree.path_children,
                                                                   tree.path_mask))
    length = nodes.shape[1]
    # a padded step repeats the path's last real step: a real slot, so its log-probability is
    # finite and 0 * it is 0 (an empty slot would give 0 * -inf = NaN)
    last = mask.sum(axis=1) - 1
    rows = np.arange(num_labels)
    pad_node, pad_child = nodes[rows, last], children[rows, last]
    nodes = np.where(mask, nodes, pad_node[:, None])
    children = np.where(mask, children, pad_child[:, None])
    root_slot = int(np.flatnonzero(tree.slot_mask[0])[0])
    null_nodes = np.zeros((1, length), dtype=np.int64)
    null_children = np.full((1, length), root_slot, dtype=np.int64)
    nodes = np.concatenate([nodes, null_nodes]).astype(np.int64)
    slots = np.concatenate([children, null_children]).astype(np.int64) + np.arange(length) * arity
    steps = np.zeros((num_labels + 1, length + 1))
    steps[:num_labels, :length] = mask
    steps[:num_labels, length] = -1.0
    penalty = np.where(tree.slot_mask, 0.0, -np.inf)
    as_t = lambda a, t=None: torch.as_tensor(np.ascontiguousarray(a), dtype=t, device=device)  # noqa: E731
    return {"engine_nodes": as_t(nodes), "engine_slots": as_t(slots), "engine_steps": as_t(steps, dtype),
            "engine_penalty": as_t(penalty, dtype)}


class PathLogLikelihood(torch.autograd.Function):
    """Eq. 5 over gathered path blocks, with a hand-written backward.

    Forward arguments: ``input`` [B, d] (h), ``blocks`` [B, L * M, d] (the rows of ``W_{n_d}`` on
    each path), ``offsets`` [B, L * M] (``b_{n_d}`` plus the empty slots' -inf), ``slots`` [B, L]
    (``d * M + c_d``), ``steps`` [B, L] (1 on real steps, 0 on padding), ``arity`` M. Returns
    ``output`` [B] (``log p(y_b | h_b)``) and ``log_probs`` [B, L, M] (every path node's
    log-softmax; not differentiable: Algorithm 1's statistics read it).

    Backward: with ``g_b`` the gradient of ``output[b]`` and ``s_bd = g_b * steps[b, d]``, the
    logits' gradient is ``s_bd (onehot(c_d) - softmax_bd)`` [B, L, M]; the input's is one batched
    product with the blocks, the blocks' one outer product with the input, the offsets' the
    logits' own."""

    @staticmethod
    def forward(ctx, input: Tensor, blocks: Tensor, offsets: Tensor, slots: Tensor, steps: Tensor,  # type: ignore[override]
                arity: int) -> tuple[Tensor, Tensor]:
        batch, length = slots.shape
        logits = torch.baddbmm(offsets.unsqueeze(2), blocks, input.unsqueeze(2))  # [B, L*M, 1]
        log_probs = torch.log_softmax(logits.view(batch, length, arity), dim=2)
        picked = log_probs.view(batch, length * arity).gather(1, slots)  # [B, L]: log softmax(...)[c_d]
        output = torch.bmm(picked.unsqueeze(1), steps.unsqueeze(2)).view(batch)  # the sum over the path
        ctx.save_for_backward(input, blocks, log_probs, slots, steps)
        ctx.mark_non_differentiable(log_probs)
        return output, log_probs

    @staticmethod
    @without_autocast
    def backward(ctx, grad_output: Tensor, _grad_log_probs: Tensor | None):  # type: ignore[override]
        input, blocks, log_probs, slots, steps = ctx.saved_tensors
        batch, length, arity = log_probs.shape
        scale = grad_output.unsqueeze(1) * steps  # [B, L]
        grad_logits = log_probs.exp().mul_(scale.neg().unsqueeze(2)).view(batch, length * arity)
        grad_logits.scatter_add_(1, slots, scale)  # + s_bd at the taken child
        need_input, need_blocks, need_offsets = ctx.needs_input_grad[:3]
        grad_input = torch.bmm(grad_logits.unsqueeze(1), blocks).view_as(input) if need_input else None
        grad_blocks = grad_logits.unsqueeze(2) * input.unsqueeze(1) if need_blocks else None  # [B, L*M, d]
        return grad_input, grad_blocks, grad_logits if need_offsets else None, None, None, None


def _rows(layer: Any, input: Tensor, target: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...] | None]:
    """``input`` [..., d] and ``target`` [...] as rows [B, d] and [B] (views where possible), with the
    leading shape to restore (None for rows); the host-side checks of shape, dtype and device."""
    lead = None
    if isinstance(input, Tensor) and input.dim() != 2 and input.dim() >= 1 and input.shape[-1] == layer.in_features:
        lead = tuple(input.shape[:-1])
        if not isinstance(target, Tensor) or tuple(target.shape) != lead:
            got = list(target.shape) if isinstance(target, Tensor) else type(target).__name__
            raise ValueError(f"target must have shape {list(lead)} to match input {list(input.shape)} "
                             f"(input [..., d], target [...]), got {got}")
        input, target = input.reshape(-1, layer.in_features), target.reshape(-1)
    check_input(input, layer.in_features, layer.weight, finite=False)
    check_target_shape(target, input.shape[0])
    if target.device != input.device:
        raise ValueError(f"target is on {target.device} but input is on {input.device}: move it (target.to(input.device))")
    return input, target, lead


def forward(layer: Any, input: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``(output, loss)`` of :meth:`hsm.HierarchicalSoftmax.forward` in this engine: ``input``
    [..., d], ``target`` [...] -> ``output`` [...] (``log p(target | input)``, 0 where ``target`` is
    the layer's ``ignore_index``) and ``loss`` [] (the mean of ``-output`` over the rows not
    ignored, or with ``reduction="sum"`` their sum). In training mode with a
    :class:`~hsm.TreeLearner` attached, the batch's node distributions go to its statistics."""
    input, target, lead = _rows(layer, input, target)
    num_labels, length = layer.engine_nodes.shape[0] - 1, layer.engine_nodes.shape[1]
    arity = layer.arity
    # ignored rows read the table's last row (K), an empty path
    index = target.masked_fill(target == layer.ignore_index, num_labels)
    try:
        nodes = layer.engine_nodes.index_select(0, index)  # [B, L]
    except IndexError:  # the CPU's bounds check (a GPU asserts on the device): name the label
        check_target(target, target.shape[0], num_labels)
        raise
    slots = layer.engine_slots.index_select(0, index)  # [B, L]
    steps = layer.engine_steps.index_select(0, index)  # [B, L + 1]
    batch = nodes.shape[0]
    blocks = F.embedding(nodes, layer.weight, sparse=layer.sparse).view(batch, length * arity, layer.in_features)
    offsets = F.embedding(nodes, layer.engine_penalty)
    if layer.bias is not None:
        offsets = offsets + F.embedding(nodes, layer.bias, sparse=layer.sparse)
    output, log_probs = PathLogLikelihood.apply(input, blocks, offsets.view(batch, length * arity), slots,
                                                steps[:, :length], arity)
    if layer.reduction == "sum":
        loss = output.sum().neg()
    else:  # the mean over the rows not ignored: the last column holds -1 per such row
        loss = output.sum().div(steps[:, length].sum())
    if layer.statistics is not None and layer.training:
        kept = index < num_labels
        layer.statistics.accumulate(torch.where(kept, index, 0), log_probs.detach().exp(), steps[:, :length],
                                    kept.to(steps.dtype))
    if lead is not None:
        output = output.view(lead)
    return output, loss


@torch.no_grad()
def adagrad_rows_(param: Tensor, state: Tensor, indices: Tensor, values: Tensor, lr: float, eps: float) -> None:
    """Adagrad on the rows ``indices`` [P] of ``param`` [N, ...] with gradient rows ``values`` [P, ...],
    a row possibly listed several times (a row-sparse gradient as autograd gives it, uncoalesced),
    in place, in fixed-shape ops: per distinct row r, ``g_r`` = the sum of its listed rows,
    ``state_r += g_r**2``, ``param_r -= lr g_r / (sqrt(state_r) + eps)``.

    Without ``unique`` or ``coalesce`` (whose output sizes the host must read): the indices are
    sorted; every listed row adds its values at the sorted position of its row's first occurrence
    (``searchsorted``), so position j holds ``g_r`` where j is the first occurrence of r, and 0
    elsewhere; both updates are then ``index_add_`` over the sorted rows, to which the zero
    positions add nothing."""
    flat_param = param.view(param.shape[0], -1)
    flat_state = state.view(state.shape[0], -1)
    values = values.reshape(indices.shape[0], flat_param.shape[1])
    rows = torch.sort(indices).values
    first = torch.searchsorted(rows, indices)
    sums = torch.zeros_like(values).index_add_(0, first, values)
    flat_state.index_add_(0, rows, sums * sums)
    denominator = flat_state.index_select(0, rows).sqrt_().add_(eps)
    flat_param.index_add_(0, rows, sums.div_(denominator), alpha=-lr)
