"""The static engine of :class:`hsm.HierarchicalSoftmax`: eq. 5 in a fixed handful of torch ops,
the same on every device, with no host-device synchronisation and no shape that depends on the data.

The layer's log-likelihood (ICML eq. 2-3 and 5) of label ``y`` given the representation ``h``,

    log p(y | h) = sum over d = 1 .. L(y) of log softmax(W_{n_d} h + b_{n_d})[c_d],

where ``n_1 .. n_L(y)`` are the nodes on the path of ``y`` and ``c_d`` the child taken at ``n_d``, is
computed here from two tables kept on the layer's device (:func:`path_tables`):

* ``engine_paths`` [K + 1, 3 L + 1] (int64), per label: the nodes ``n_d`` (L columns), the nodes
  whose slot penalty applies (L columns: ``n_d`` again), the positions ``d * M + c_d`` of the taken
  children among the path's ``L * M`` logits (L columns), and -1 (the row's share of the negative
  count of rows that the mean divides by);
* ``engine_penalty`` [N + 1, M] (float): 0 on a slot with a real label below it, -inf on an empty
  slot; row N is a virtual node with one usable slot, whose log-softmax is exactly ``[0, -inf, ...]``.

A path shorter than L is padded with steps at the virtual node (its weights read from node 0):
their log-probability is exactly 0 and so is their gradient (``onehot - softmax`` = 0), so the sum
over L steps is the sum over the path with no mask. Row K is the path of an ignored row
(``ignore_index``): all padding, count 0, so its log-likelihood is 0 and it counts for nothing.
A step (:func:`forward`) is then, whatever the tree and the batch (16 launching ops for a test
step, 55 for a training step with :class:`hsm.RowSparseAdagrad`; tests/test_engine.py counts them):
one lookup of the targets' rows, the path's node blocks gathered (``F.embedding``, so
``sparse=True`` gives a row-sparse gradient), one batched matrix product for the ``B * L * M``
logits, one log-softmax, one gather, one sum; the backward (:class:`PathLogLikelihood`) is
written by hand: ``g_b (onehot(c_d) - softmax)``, one batched product for the input gradient and
one outer product for the node blocks'. :class:`hsm.RowSparseAdagrad` applies the gradient
without ``unique`` or ``coalesce`` (:func:`adagrad_rows_`), and Algorithm 1's statistics are added
with fixed-shape ops. With a :class:`hsm.RowSparseAdagrad` fused into the layer
(:meth:`hsm.RowSparseAdagrad.fuse`) on a GPU with Triton, the same step runs in the kernels of
:mod:`hsm.fused`. :func:`topk` (the layer's ``predict`` and exact ``topk`` on this engine) reads
the device once per call.

Nothing is read back to the host, so the op sequence and its shapes are the same for every batch
of a given size: a training step can be compiled (``torch.compile(fullgraph=True)``, no recompile
for new targets) and captured in a CUDA graph. The tables are rebuilt *in place* when the tree
changes (:meth:`hsm.HierarchicalSoftmax.set_tree`), so a captured step reads the new tree; a
shallower tree is padded to the tables' L, and only a deeper one reallocates them (then compile or
capture again).

What the checks cannot do without reading the device is left to where the loop reads a value
anyway: a NaN or infinite input gives a NaN loss, as ``F.cross_entropy`` does (the training loop's
``float(loss)`` reports it, :func:`hsm.train_epoch`); a label outside 0..K-1 fails the table lookup
(on the CPU a ValueError naming the label; on a GPU a device-side assert, as for
``F.cross_entropy``). Shapes, dtypes and devices are checked on the host, which costs nothing.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_input, check_target, check_target_shape
from .backend import without_autocast
from .tree import Tree

__all__ = ["ENGINES", "PathLogLikelihood", "TABLES", "adagrad_rows_", "capture_step", "forward", "path_tables",
           "topk", "uses_static_engine"]

#: the values of ``HierarchicalSoftmax(engine=...)`` and ``RowSparseAdagrad(engine=...)``: "auto" is
#: this engine on every device but the CPU and the compiled kernels of :mod:`hsm.kernels` on the
#: CPU; "torch" is this engine everywhere (what a GPU runs, on the CPU: tests run it there)
ENGINES = ("auto", "torch")

#: the layer's buffers this engine reads (:func:`path_tables`)
TABLES = ("engine_paths", "engine_penalty")


def uses_static_engine(engine: str, device: torch.device) -> bool:
    """Whether ``engine`` ("auto" or "torch") means this engine for tensors on ``device``."""
    return engine == "torch" or device.type != "cpu"


def path_tables(tree: Tree, dtype: torch.dtype, device: torch.device | str,
                min_length: int = 0) -> dict[str, Tensor]:
    """The engine's tables of ``tree`` (module docstring), as tensors on ``device``; the penalty in
    ``dtype``. Paths are padded to ``max(tree depth, min_length)`` steps (the layer passes its
    current L, so that a shallower tree keeps the tables' shapes and addresses). Built on the
    host once per tree."""
    num_labels, arity, num_nodes = tree.num_labels, tree.arity, tree.num_nodes
    nodes, children, mask = (np.asarray(a[:num_labels]) for a in (tree.path_nodes, tree.path_children,
                                                                   tree.path_mask))
    if nodes.shape[1] < min_length:
        pad = ((0, 0), (0, min_length - nodes.shape[1]))
        nodes, children, mask = np.pad(nodes, pad), np.pad(children, pad), np.pad(mask, pad)
    length = nodes.shape[1]
    paths = np.zeros((num_labels + 1, 3 * length + 1), dtype=np.int64)
    paths[:num_labels, :length] = np.where(mask, nodes, 0)  # padding reads node 0's weights ...
    paths[:num_labels, length:2 * length] = np.where(mask, nodes, num_nodes)  # ... at the virtual node
    paths[num_labels, length:2 * length] = num_nodes  # the ignored rows' path: all padding
    paths[:num_labels, 2 * length:3 * length] = np.where(mask, children, 0)
    paths[:, 2 * length:3 * length] += np.arange(length) * arity
    paths[:num_labels, -1] = -1
    penalty = np.zeros((num_nodes + 1, arity))
    penalty[:num_nodes][~tree.slot_mask] = -np.inf
    penalty[num_nodes, 1:] = -np.inf
    return {"engine_paths": torch.as_tensor(paths, device=device),
            "engine_penalty": torch.as_tensor(penalty, dtype=dtype, device=device)}


class PathLogLikelihood(torch.autograd.Function):
    """Eq. 5 over gathered path blocks, with a hand-written backward.

    Forward arguments: ``input`` [B, d] (h), ``blocks`` [B, L * M, d] (the rows of ``W_{n_d}`` on
    each path), ``offsets`` [B, L * M] (``b_{n_d}`` plus the empty slots' -inf), ``slots`` [B, L]
    (``d * M + c_d``), ``arity`` M. Returns ``output`` [B] (``log p(y_b | h_b)``) and ``log_probs``
    [B, L, M] (every path node's log-softmax; not differentiable: Algorithm 1's statistics read it).

    Backward: with ``g_b`` the gradient of ``output[b]``, the logits' gradient is
    ``g_b (onehot(c_d) - softmax_bd)`` [B, L, M]; the input's is one batched product with the
    blocks, the blocks' one outer product with the input, the offsets' the logits' own."""

    @staticmethod
    def forward(ctx, input: Tensor, blocks: Tensor, offsets: Tensor, slots: Tensor,  # type: ignore[override]
                arity: int) -> tuple[Tensor, Tensor]:
        """``(output [B], log_probs [B, L, M])``: eq. 5's sum over the path of the taken child's
        log-softmax, and every node's log-softmax on the path (kept for the backward)."""
        batch, length = slots.shape
        logits = torch.baddbmm(offsets.unsqueeze(2), blocks, input.unsqueeze(2))  # [B, L*M, 1]
        log_probs = torch.log_softmax(logits.view(batch, length, arity), dim=2)
        picked = log_probs.view(batch, length * arity).gather(1, slots)  # [B, L]: log softmax(...)[c_d]
        output = picked.sum(1)  # the sum over the path (padding steps are exactly 0)
        ctx.save_for_backward(input, blocks, log_probs, slots)
        ctx.mark_non_differentiable(log_probs)
        return output, log_probs

    @staticmethod
    @without_autocast
    def backward(ctx, grad_output: Tensor, _grad_log_probs: Tensor | None):  # type: ignore[override]
        """The gradients of ``input`` [B, d], ``blocks`` [B, L * M, d] and ``offsets`` from
        ``d output_b`` [B]: ``(onehot(c) - softmax) * d output_b`` at every step of the path."""
        input, blocks, log_probs, slots = ctx.saved_tensors
        batch, length, arity = log_probs.shape
        scale = grad_output.unsqueeze(1)  # [B, 1]
        grad_logits = log_probs.exp().mul_(scale.neg().unsqueeze(2)).view(batch, length * arity)
        grad_logits.scatter_add_(1, slots, scale.expand(batch, length))  # + g_b at the taken child
        need_input, need_blocks, need_offsets = ctx.needs_input_grad[:3]
        grad_input = torch.bmm(grad_logits.unsqueeze(1), blocks).view_as(input) if need_input else None
        grad_blocks = grad_logits.unsqueeze(2) * input.unsqueeze(1) if need_blocks else None  # [B, L*M, d]
        return grad_input, grad_blocks, grad_logits if need_offsets else None, None, None


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
        raise ValueError(f"target is on {target.device} but input is on {input.device}: move it "
                         "(target.to(input.device))")
    return input, target, lead


def _fused() -> Any:
    """:mod:`hsm.fused`, imported on first use, as the classifiers are (``import hsm`` does not
    load the Triton kernels)."""
    return importlib.import_module("hsm.fused")


def _gather(param: Tensor, nodes: Tensor, sparse: bool) -> Tensor:
    """The rows ``nodes`` [B, L] of ``param``: [B, L, ...]. Sparse: ``F.embedding``, whose backward is
    a row-sparse gradient (one row per pair, uncoalesced) that Dynamo traces; dense:
    ``index_select``, whose backward is an ``index_add_`` into zeros (no synchronisation on a GPU)."""
    if sparse:
        return F.embedding(nodes, param, sparse=True)
    return param.index_select(0, nodes.reshape(-1)).view(*nodes.shape, param.shape[1])


def forward(layer: Any, input: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``(output, loss)`` of :meth:`hsm.HierarchicalSoftmax.forward` in this engine: ``input``
    [..., d], ``target`` [...] -> ``output`` [...] (``log p(target | input)``, 0 where ``target`` is
    the layer's ``ignore_index``) and ``loss`` [] (the mean of ``-output`` over the rows not
    ignored, or with ``reduction="sum"`` their sum). In training mode with a
    :class:`~hsm.TreeLearner` attached, the batch's node distributions go to its statistics."""
    input, target, lead = _rows(layer, input, target)
    paths = layer.engine_paths
    num_labels, length = paths.shape[0] - 1, (paths.shape[1] - 1) // 3
    arity, num_nodes = layer.arity, layer.engine_penalty.shape[0] - 1
    # label K is the ignored rows' path: as a label it is out of range (-1), as any other
    index = target.masked_fill(target == num_labels, -1).masked_fill_(target == layer.ignore_index, num_labels)
    try:
        rows = paths.index_select(0, index)  # [B, 3L + 1]
    except IndexError:  # the CPU's bounds check (a GPU asserts on the device): name the label
        check_target(target, target.shape[0], num_labels)
        raise
    nodes, penalised, slots = rows[:, :length], rows[:, length:2 * length], rows[:, 2 * length:3 * length]
    batch = rows.shape[0]
    fused_optimizer = getattr(layer, "fused_optimizer", None)
    # the Triton kernels, with the optimiser's update in backward (eager or captured: under
    # torch.compile the torch ops below, which Dynamo traces, and the optimiser's own step)
    if (fused_optimizer is not None and not torch.compiler.is_compiling() and torch.is_grad_enabled()
            and layer.weight.requires_grad and _fused().applies(input)):
        output, log_probs = _fused().FusedPathLogLikelihood.apply(input, layer.weight, layer.bias, layer.engine_penalty,
                                                               rows, length, arity, fused_optimizer)
    else:
        blocks = _gather(layer.weight, nodes, layer.sparse).view(batch, length * arity, layer.in_features)
        offsets = F.embedding(penalised, layer.engine_penalty)
        if layer.bias is not None:
            offsets = offsets + _gather(layer.bias, nodes, layer.sparse).view_as(offsets)
        output, log_probs = PathLogLikelihood.apply(input, blocks, offsets.view(batch, length * arity), slots, arity)
    if layer.reduction == "sum":
        loss = output.sum().neg()
    else:  # the mean over the rows not ignored: the last column holds -1 per such row
        loss = output.sum().div(rows[:, -1].sum())
    if layer.statistics is not None and layer.training:
        kept = index < num_labels
        depth = min(length, layer.statistics.max_depth)  # the tables may be padded past the tree's depth
        layer.statistics.accumulate(torch.where(kept, index, 0), log_probs[:, :depth].detach().exp(),
                                    penalised[:, :depth] < num_nodes, kept.to(input.dtype))
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


def capture_step(step: Callable[..., Any], *inputs: Tensor, warmup: int = 3) -> Callable[..., Any]:
    """Capture a whole training step in a CUDA graph: ``replay = capture_step(step, *inputs)``, then
    ``replay(*new_inputs)`` per batch.

    ``step(*inputs)`` is the user's step, model included: ``optimizer.zero_grad(set_to_none=True)``,
    forward, ``backward()``, ``optimizer.step()``, returning what it wants back (the loss, say). The
    tensors ``inputs`` (a batch: the model's input and the targets, on the GPU) fix the shapes;
    ``replay`` copies each new batch into them, replays the graph (one launch for the whole step,
    none of the per-op overhead) and returns ``step``'s result, rewritten in place by every replay.
    The ``warmup`` steps before the capture (on a side stream, as CUDA graphs need) are real
    training steps on ``inputs``.

    It holds when nothing in the step reads the device back or depends on the values of the data:
    :class:`hsm.HierarchicalSoftmax` on this engine, :class:`hsm.RowSparseAdagrad` (``lr_decay``
    stays at the captured step's rate), ``torch.optim`` optimisers built with ``capturable=True``.
    A :class:`~hsm.TreeLearner`'s statistics are collected inside the graph; call
    ``learner.step()`` between replays: a new tree is written into the layer's tables in place, so
    the next replay uses it (a tree of another depth reallocates the tables: capture again)."""
    if not torch.cuda.is_available() or any(not x.is_cuda for x in inputs):
        raise ValueError("capture_step captures a CUDA graph: move the model, the layer and the inputs to a GPU "
                         "(on the CPU, call the step itself)")
    static = [x.clone() for x in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step(*static)

    def replay(*batch: Tensor) -> Any:
        if len(batch) != len(static):
            raise ValueError(f"the step was captured with {len(static)} inputs, got {len(batch)}")
        for held, new in zip(static, batch):
            held.copy_(new)
        graph.replay()
        return result

    return replay


@torch.no_grad()
def topk(layer: Any, input: Tensor, k: int, width: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The exact k most likely labels of each row of ``input`` [B, d]: ``(values [B, k], labels
    [B, k], nodes_visited [B])``, best first, with one read from the device per call instead of one
    per level.

    First a beam search of fixed width ``width`` (default ``max(2 k, 4)``), in fixed-shape ops: at
    each level the beam's ``[B, W]`` nodes are evaluated (one gather and one batched product), the
    labels met join the row's top k, the W best inner children form the next beam, and the best
    inner child left out is remembered (``pruned``, the highest path log-probability of a subtree
    not explored). A node's path log-probability bounds every label below it (eq. 5 sums
    non-positive terms), so a row whose k-th label is above ``pruned`` is proven exact. Only the
    rows not proven go to a second pass, the level-by-level branch and bound of
    :func:`hsm.search.exact_topk`. Equal values are ordered by label id, the lowest first, as every
    search of the layers orders them (a row whose k-th value equals ``pruned`` goes to the second
    pass, which finds a lower id in a tied subtree)."""
    from . import search

    batch, dim = input.shape
    device, dtype = input.device, input.dtype
    arity, num_labels = layer.arity, layer.num_labels
    width = max(k, width if width is not None else max(2 * k, 4))
    child_node, child_label, usable = layer.child_node, layer.child_label, layer.slot_mask
    is_inner = (child_node >= 0) & usable
    is_label = (child_label >= 0) & (child_label < num_labels) & usable
    nodes = torch.zeros(batch, width, dtype=torch.long, device=device)  # the root, then padding
    scores = torch.full((batch, width), -math.inf, dtype=dtype, device=device)
    scores[:, 0].fill_(0.0)
    values = torch.full((batch, k), -math.inf, dtype=dtype, device=device)
    labels = torch.full((batch, k), -1, dtype=torch.long, device=device)
    pruned = torch.full((batch,), -math.inf, dtype=dtype, device=device)
    visited = torch.zeros(batch, dtype=torch.long, device=device)
    for _ in range(layer.tree.max_depth):
        flat = nodes.reshape(-1)
        blocks = layer.weight.index_select(0, flat).view(batch, width * arity, dim)
        logits = torch.bmm(blocks, input.unsqueeze(2)).view(batch, width, arity)
        logits = logits + layer.engine_penalty.index_select(0, flat).view(batch, width, arity)
        if layer.bias is not None:
            logits = logits + layer.bias.index_select(0, flat).view(batch, width, arity)
        paths = torch.log_softmax(logits, dim=2) + scores.unsqueeze(2)  # [B, W, M], -inf off the beam
        visited += torch.isfinite(scores).sum(1)
        found = torch.where(is_label[nodes], paths, -math.inf).view(batch, width * arity)
        met = child_label[nodes].view(batch, width * arity)
        # the row's k best so far, equal values ordered by label id, as every search orders them
        candidates, ids = torch.cat([values, found], dim=1), torch.cat([labels, met], dim=1)
        best_k = search.best_first(candidates, ids, 1)[:, :k]
        values, labels = candidates.gather(1, best_k), ids.gather(1, best_k)
        inner = torch.where(is_inner[nodes], paths, -math.inf).view(batch, width * arity)
        best = inner.topk(width + 1, dim=1)
        pruned = torch.maximum(pruned, best.values[:, width])
        nodes = child_node[nodes].view(batch, width * arity).gather(1, best.indices[:, :width]).clamp_(min=0)
        scores = best.values[:, :width]
    # a subtree left out as likely as the k-th label may hold a lower label id: not proven either
    unproven = torch.nonzero(values[:, k - 1] <= pruned).flatten()  # the one read from the device
    if unproven.numel():
        exact = search.exact_topk(layer, input.index_select(0, unproven), k, width)
        values[unproven], labels[unproven] = exact[0], exact[1]
        visited[unproven] += exact[2]
    return values, labels, visited
