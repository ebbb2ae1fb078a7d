"""The fast path of :class:`hsm.HierarchicalSoftmax`: one interface, two implementations.

The layer (:mod:`hsm.layers`) says *what* is computed, eq. 5 of the ICML paper,

    log p(y | h) = sum over the nodes n_1 .. n_L on the path of y of log softmax(W_n h + b_n)[c_d],

and hands the batch to a backend that says *how*. Both backends evaluate the batch's ``P``
(example, path node) pairs grouped by node, so that a node shared by many examples (the root: all
``B``) has its ``[M, d]`` block read once and its gradient written once (one row per unique node:
the sparse gradient has no duplicates):

* :data:`TORCH` (:class:`TorchBackend`, any device and dtype): batched matmuls over node groups
  bucketed by size (:func:`plan_groups`, :func:`grouped_logits`) and a custom autograd function
  (:class:`_TreePathLogProb`) that writes the gradient directly instead of through autograd's
  per-pair copies; the exact top-1 search in PyTorch (:func:`hsm.search.top1_search`);
* :data:`KERNELS` (:class:`KernelBackend`, float32 contiguous CPU tensors): the compiled kernels of
  :mod:`hsm.kernels`, one pass each for the forward, the backward (optionally with the Adagrad update
  fused in, :meth:`hsm.optim.RowSparseAdagrad.fuse`); the searches are in :mod:`hsm.search`.

Every backend method takes the layer and returns what the layer returns; the layer picks the
backend per call (:meth:`hsm.HierarchicalSoftmax._backend`). Both are checked against the plain
per-pair implementation, :meth:`hsm.HierarchicalSoftmax.forward_reference` (tests/test_layers.py,
tests/test_kernels.py: values, gradients dense and sparse, statistics, predictions).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from . import kernels
from ._checks import check_logits_finite, check_target, check_target_shape
from .tree import Tree

__all__ = ["KERNELS", "TORCH", "FusedGradient", "KernelBackend", "NodeDistributions", "OutputBackend", "TorchBackend",
           "TreeLayer", "TreeTables", "grouped_logits", "needs_graph", "pair_log_softmax", "plan_groups", "select_backend"]


# ------------------------------------------------------------------ grouped node evaluation
#
# A training step evaluates B * L (example, node) pairs. Evaluating them one by one means copying
# each pair's [M, d] weight block (F.embedding) even when many examples share a node (the root is
# shared by all B, a depth-1 node of a 63-ary tree by about B / 63), and the backward pass then
# writes one [M, d] gradient block per pair and sums the duplicates. Instead the pairs are grouped
# by node: every node's block is read once (``weight.index_select`` over the *unique* nodes), its
# examples are stacked into a zero-padded [U, cap, d] tensor, and one batched matmul gives all
# logits; the backward pass writes exactly one gradient block per unique node (a bmm of the
# padded output gradients with the padded inputs), so the sparse gradient is already duplicate
# free. Groups are bucketed by size (powers of ``_BUCKET_BASE``) so padding wastes at most that
# factor in FLOPs, never in weight bytes: the bytes, not the FLOPs, bound this layer.

_BUCKET_BASE = 4
PAIR_CHUNK = 1 << 15  #: (example, node) pairs evaluated at once by the exact search


class _Bucket(NamedTuple):
    """The node groups of one size class: their nodes, and where each pair sits in the padded layout."""

    nodes: Tensor  #: [U] unique node ids of the groups in this bucket
    cap: int  #: padded group size (1: every group has one pair, no padding)
    entries: Tensor  #: [n] pair ids (rows of the [P, M] logits) in this bucket
    examples: Tensor  #: [n] example (input row) of each pair
    slots: Tensor | None  #: [n] position ``group * cap + rank`` in the padded layout (None when cap == 1)


def plan_groups(example: np.ndarray, node: np.ndarray, device: torch.device) -> list[_Bucket]:
    """Group pairs (example[p], node[p]) by node and bucket the groups by size (numpy: these are
    a few hundred integers, and numpy's per-call cost is a fraction of torch's)."""
    count = node.size
    order = np.argsort(node, kind="stable")
    sorted_nodes = node[order]
    first = np.ones(count, dtype=bool)
    first[1:] = sorted_nodes[1:] != sorted_nodes[:-1]
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, count))
    group_of_pair = np.cumsum(first, dtype=np.int64) - 1  # group of each sorted pair (an integer sum: traceable)
    rank = np.arange(count) - starts[group_of_pair]
    # bucket 0: singletons; bucket k >= 1: groups of size in (base**(k-1), base**k]
    exponent = np.ceil(np.log(np.maximum(sizes, 2)) / math.log(_BUCKET_BASE) - 1e-9).astype(np.int64)
    bucket_of_group = np.where(sizes == 1, 0, np.maximum(exponent, 1))
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    bucket_of_pair = bucket_of_group[group_of_pair]
    buckets = []
    for bucket in np.unique(bucket_of_group):
        groups = np.flatnonzero(bucket_of_group == bucket)
        in_bucket = bucket_of_pair == bucket
        pairs = order[in_bucket]
        if bucket == 0:
            buckets.append(_Bucket(as_t(sorted_nodes[starts[groups]]), 1, as_t(pairs), as_t(example[pairs]), None))
            continue
        cap = int(sizes[groups].max())
        local = np.empty(len(sizes), dtype=np.int64)
        local[groups] = np.arange(len(groups))
        slots = local[group_of_pair[in_bucket]] * cap + rank[in_bucket]
        buckets.append(_Bucket(as_t(sorted_nodes[starts[groups]]), cap, as_t(pairs), as_t(example[pairs]), as_t(slots)))
    return buckets


def grouped_logits(input: Tensor, weight: Tensor, buckets: list[_Bucket], num_pairs: int, arity: int,
                    saved: list | None = None, workspace: list | None = None) -> Tensor:
    """``W_node h_example`` for every planned pair: [P, M] (no bias). ``saved`` collects each
    bucket's (weight blocks, padded inputs) for the backward pass. ``workspace`` (inference only:
    nothing may hold on to the blocks) is a list of buffers reused from call to call for the
    gathered blocks: a fresh multi-MB tensor per call costs thousands of page faults."""
    dim = input.shape[1]
    logits = input.new_empty(num_pairs, arity)
    if workspace is not None and torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad):
        workspace = None  # the blocks would be part of an autograd graph: no shared buffers
    for position, bucket in enumerate(buckets):
        if workspace is not None:
            rows = bucket.nodes.numel()
            while len(workspace) <= position:
                workspace.append(weight.new_empty(0, weight.shape[1]))
            buffer = workspace[position]
            if buffer.shape[0] < rows or buffer.dtype != weight.dtype or buffer.device != weight.device:
                buffer = workspace[position] = weight.new_empty(max(rows, 2 * buffer.shape[0]), weight.shape[1])
            blocks = torch.index_select(weight, 0, bucket.nodes, out=buffer[:rows]).view(-1, arity, dim)
        else:
            blocks = weight.index_select(0, bucket.nodes).view(-1, arity, dim)  # [U, M, d], read once per node
        if bucket.cap == 1:
            stacked = input.index_select(0, bucket.examples)  # [U, d]
            # [U,1,d] @ [U,d,M]: the batched vector-matrix form (the [U,M,d] @ [U,d,1] matrix-vector
            # form is about 10x slower on CPU)
            out = torch.bmm(stacked.unsqueeze(1), blocks.transpose(1, 2)).squeeze(1)  # [U, M]
        else:
            stacked = input.new_zeros(blocks.shape[0] * bucket.cap, dim)
            stacked[bucket.slots] = input.index_select(0, bucket.examples)
            out = torch.bmm(stacked.view(-1, bucket.cap, dim), blocks.transpose(1, 2))  # [U, cap, M]
            out = out.reshape(-1, arity).index_select(0, bucket.slots)
        logits[bucket.entries] = out
        if saved is not None:
            saved.append((blocks, stacked))
    return logits


def autocast_on(device: str) -> bool:
    """Whether ``torch.autocast`` is active for ``device`` (a device type: "cpu", "cuda")."""
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def in_compute_dtype(dtype_of: Callable[[Any], torch.dtype]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for an entry point ``method(owner, input, ...)`` of an output layer (a layer's
    ``forward``, ``log_prob``, ``predict``; :mod:`hsm.search`'s decoders): under ``torch.autocast``
    an ``input`` in the autocast dtype (bf16 from the encoder's matmuls) is converted to
    ``dtype_of(owner)`` (the layer's parameters' dtype) and the call runs with autocast off, as
    autocast treats losses; the node softmaxes would otherwise mix bf16 products into float32 sums.
    Outside autocast the call goes straight to ``method`` (about a microsecond more)."""

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(owner: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(input, Tensor):
                return method(owner, input, *args, **kwargs)  # the method's own checks name the problem
            device = input.device.type
            if not autocast_on(device):
                return method(owner, input, *args, **kwargs)
            dtype = dtype_of(owner)
            if input.dtype == torch.get_autocast_dtype(device) and dtype.is_floating_point and input.dtype != dtype:
                input = input.to(dtype)
            with torch.autocast(device, enabled=False):
                return method(owner, input, *args, **kwargs)

        return wrapper

    return decorate


def without_autocast(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run an autograd Function's ``forward`` or ``backward`` with autocast off on the device of
    its first tensor argument.

    The layers compute in their parameters' dtype under ``torch.autocast`` (``hsm.layers``' entry
    point); a ``backward`` called inside the autocast region (``loss.backward()`` under
    ``torch.autocast``) would otherwise run its matrix products in bf16 and add them into float32
    gradients, and a ``forward`` would mix bf16 products with float32 in-place sums."""

    @functools.wraps(method)
    def wrapped(ctx, *args, **kwargs):
        device = next((a.device.type for a in args if isinstance(a, Tensor)), "cpu")
        if autocast_on(device):
            with torch.autocast(device, enabled=False):
                return method(ctx, *args, **kwargs)
        return method(ctx, *args, **kwargs)

    return wrapped


class _PathPlan(NamedTuple):
    """Which (example, node, child) pairs a batch needs: the kept steps of every target's path."""

    example: Tensor  #: [P]
    node: Tensor  #: [P]
    child: Tensor  #: [P]
    buckets: list[_Bucket]
    full: bool  #: P == B * L in (example, depth) order: sums are a reshape


def _add_offsets(logits: Tensor, bias: Tensor | None, slot_penalty: Tensor | None, node: Tensor) -> Tensor:
    """``logits [P, M] += b_n`` and the -inf of the node's empty slots (trees with M**D > K, ragged
    taxonomies; a full M-ary tree has none and skips the work), in place, for the pairs' nodes [P]."""
    if bias is not None:
        logits += bias.index_select(0, node)
    if slot_penalty is not None:
        logits += slot_penalty.index_select(0, node)
    return logits


def _sum_over_paths(picked: Tensor, plan: _PathPlan, batch: int) -> Tensor:
    """Eq. 5's sum over the path: ``output[b]`` [B] = the sum of example b's picked node
    log-probabilities ``picked`` [P] (a reshape when every path has the full length L)."""
    if plan.full:
        return picked.view(batch, -1).sum(1)
    return picked.new_zeros(batch).index_add_(0, plan.example, picked)


class _TreePathLogProb(torch.autograd.Function):
    """Forward: ``log p(y_b | h_b)`` (eq. 5) and the per-pair node log-softmax; backward: the
    gradient of the first w.r.t. input, weight (one [M*d] row per unique node: sparse COO when
    ``sparse``, dense otherwise) and bias, written directly instead of through autograd's per-pair
    copies (checked against the autograd reference in tests/test_layers.py)."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None, slot_penalty: Tensor | None,
                plan: _PathPlan, batch: int, sparse: bool, arity: int):  # type: ignore[override]
        saved: list = []
        num_pairs = plan.node.numel()
        logits = _add_offsets(grouped_logits(input, weight, plan.buckets, num_pairs, arity, saved), bias,
                              slot_penalty, plan.node)
        log_probs = torch.log_softmax(logits, dim=1)
        output = _sum_over_paths(log_probs.gather(1, plan.child.unsqueeze(1)).squeeze(1), plan, batch)
        ctx.plan, ctx.saved_blocks, ctx.batch, ctx.sparse = plan, saved, batch, sparse
        ctx.has_bias = bias is not None
        ctx.weight_shape = weight.shape
        ctx.save_for_backward(input, log_probs)
        ctx.mark_non_differentiable(log_probs)
        return output, log_probs

    @staticmethod
    @without_autocast
    def backward(ctx, grad_output: Tensor, _grad_log_probs: Tensor | None):  # type: ignore[override]
        input, log_probs = ctx.saved_tensors
        plan: _PathPlan = ctx.plan
        # d output_b / d logits_(b,n) = onehot(child) - softmax
        scale = grad_output.index_select(0, plan.example) if not plan.full else grad_output.repeat_interleave(
            plan.node.numel() // ctx.batch)
        grad_logits = log_probs.exp().mul_(-scale.unsqueeze(1))
        grad_logits.scatter_add_(1, plan.child.unsqueeze(1), scale.unsqueeze(1))
        arity = grad_logits.shape[1]
        dim = input.shape[1]
        grad_input = grad_weight = grad_bias = None
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        if need_input:
            grad_input = torch.zeros_like(input)
        rows = sum(bucket.nodes.numel() for bucket in plan.buckets)
        values = input.new_empty(rows, arity * dim) if need_weight else None
        offset = 0
        for bucket, (blocks, stacked) in zip(plan.buckets, ctx.saved_blocks):
            count = bucket.nodes.numel()
            pair_grad = grad_logits.index_select(0, bucket.entries)  # [n, M]
            if bucket.cap == 1:
                if need_weight:
                    torch.mul(pair_grad.unsqueeze(2), stacked.unsqueeze(1),
                              out=values[offset:offset + count].view(count, arity, dim))
                if need_input:
                    grad_input.index_add_(0, bucket.examples, torch.bmm(pair_grad.unsqueeze(1), blocks).squeeze(1))
            else:
                padded = grad_logits.new_zeros(count * bucket.cap, arity)
                padded[bucket.slots] = pair_grad
                padded = padded.view(count, bucket.cap, arity)
                if need_weight:
                    torch.bmm(padded.transpose(1, 2), stacked.view(count, bucket.cap, dim),
                              out=values[offset:offset + count].view(count, arity, dim))
                if need_input:
                    per_slot = torch.bmm(padded, blocks).view(-1, dim).index_select(0, bucket.slots)
                    grad_input.index_add_(0, bucket.examples, per_slot)
            offset += count
        if need_weight:
            indices = torch.cat([bucket.nodes for bucket in plan.buckets]).unsqueeze(0)
            if ctx.sparse:
                # every node appears once: no duplicates for the optimiser to sum
                grad_weight = torch.sparse_coo_tensor(indices, values, ctx.weight_shape, check_invariants=False)
            else:
                grad_weight = values.new_zeros(ctx.weight_shape).index_copy_(0, indices[0], values)
        if need_bias and ctx.has_bias:
            shape = (ctx.weight_shape[0], arity)
            if ctx.sparse:
                grad_bias = torch.sparse_coo_tensor(plan.node.unsqueeze(0), grad_logits, shape, check_invariants=False)
            else:
                grad_bias = grad_logits.new_zeros(shape).index_add_(0, plan.node, grad_logits)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def _np(tensor: Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy when it is contiguous)."""
    return tensor.detach().contiguous().numpy()


def _mean_loss(output: np.ndarray) -> Tensor:
    """``-output.mean()`` as a 0-d tensor (NaN for an empty batch, as torch's mean gives)."""
    return torch.from_numpy(np.array(-output.mean() if output.size else np.nan, dtype=output.dtype))


class _KernelPlan(NamedTuple):
    """The batch's (example, node, child) pairs and their grouping by node, for the numba kernels."""

    example: np.ndarray  #: [P]
    node: np.ndarray  #: [P]
    child: np.ndarray  #: [P]
    depth: np.ndarray  #: [P] position of the pair's node on its example's path
    order: np.ndarray  #: [P] pairs sorted by node
    starts: np.ndarray  #: [G + 1] pair range of each unique node in ``order``
    full: bool  #: P == B * L in (example, depth) order


class _TreePathLogProbKernel(torch.autograd.Function):
    """:class:`_TreePathLogProb` computed by the compiled kernels of :mod:`hsm.kernels` (float32
    CPU tensors): one pass for the forward, one for the backward, one gradient row per unique
    node (checked against :meth:`HierarchicalSoftmax.forward_reference` in tests/test_layers.py)."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None, penalty: np.ndarray,
                plan: _KernelPlan, sparse: bool, arity: int, fused=None):  # type: ignore[override]
        ctx.fused, ctx.bias = fused, bias  # fused: a RowSparseAdagrad (RowSparseAdagrad.fuse)
        h = _np(input)
        node_prob = np.empty((plan.node.shape[0], arity), dtype=np.float32)
        bias_np = _np(bias) if bias is not None else np.empty((0, arity), dtype=np.float32)
        output = kernels.run_path_forward(h, _np(weight), bias_np, penalty, plan.example, plan.node, plan.child,
                                          plan.order, plan.starts, arity, node_prob)
        ctx.plan, ctx.sparse, ctx.has_bias = plan, sparse, bias is not None
        ctx.weight_shape = weight.shape
        probs = torch.from_numpy(node_prob)
        ctx.save_for_backward(input, weight, probs)
        ctx.mark_non_differentiable(probs)
        # the loss (mean negative log-likelihood) is a third output of this function rather than
        # two more autograd nodes: per batch, their bookkeeping cost a tenth of the whole step
        return torch.from_numpy(output), probs, _mean_loss(output)

    @staticmethod
    def backward(ctx, grad_output: Tensor, _grad_probs: Tensor | None, grad_loss: Tensor):  # type: ignore[override]
        input, weight, probs = ctx.saved_tensors
        # d loss / d output_b = -1 / B
        grad_output = grad_output - grad_loss / grad_output.shape[0]
        plan: _KernelPlan = ctx.plan
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        arity = probs.shape[1]
        groups = plan.starts.shape[0] - 1
        adagrad = None
        if ctx.fused is not None and need_weight and (need_bias or not ctx.has_bias):
            adagrad = ctx.fused.fused_update_settings(weight, ctx.bias)
        if adagrad is not None:  # the update is applied in the kernel: no gradient rows
            values = np.empty((0, weight.shape[1]), dtype=np.float32)
            bias_values = np.empty((0, arity), dtype=np.float32)
        else:
            values = np.empty((groups if need_weight else 0, weight.shape[1]), dtype=np.float32)
            bias_values = np.empty((groups, arity), dtype=np.float32)
        grad_h = kernels.run_path_backward(_np(input), weight.detach().numpy(), plan.example, plan.node, plan.child,
                                           plan.order, plan.starts, _np(probs), _np(grad_output.float()), values,
                                           bias_values, need_input, need_weight, adagrad)
        if adagrad is not None:
            # a placeholder .grad that refuses to be clipped or edited (the update is already applied)
            for param in (weight, ctx.bias):
                if param is not None and param.grad is None:
                    param.grad = FusedGradient(param)
            return (torch.from_numpy(grad_h) if need_input else None), None, None, None, None, None, None, None
        if ctx.fused is not None:  # the update waits for step(): a stale placeholder must not take the gradient
            for param in (weight, ctx.bias):
                if param is not None and isinstance(param.grad, FusedGradient):
                    param.grad = None
        # unique nodes in increasing order (a stable sort by node): the sparse gradients are coalesced
        rows = torch.from_numpy(plan.node[plan.order[plan.starts[:-1]]]).unsqueeze(0)
        grad_input = torch.from_numpy(grad_h) if need_input else None
        grad_weight = grad_bias = None
        if need_weight:
            grad_weight = _row_gradient(rows, torch.from_numpy(values), ctx.weight_shape, ctx.sparse)
        if need_bias and ctx.has_bias:
            grad_bias = _row_gradient(rows, torch.from_numpy(bias_values), (ctx.weight_shape[0], arity), ctx.sparse)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def _row_gradient(rows: Tensor, values: Tensor, shape, sparse: bool) -> Tensor:
    """The gradient of a parameter whose rows ``rows`` (distinct, increasing) received ``values``."""
    if sparse:
        return torch.sparse_coo_tensor(rows, values, shape, check_invariants=False, is_coalesced=True)
    return values.new_zeros(shape).index_copy_(0, rows[0], values)


class EmptyBatch(torch.autograd.Function):
    """The forward pass of an empty batch: an empty ``output`` [0] that is part of the autograd
    graph, so ``loss.backward()`` works as for any batch and leaves zero gradients (an empty sparse
    gradient with ``sparse=True``, what a batch touching no node would give)."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None,  # type: ignore[override]
                sparse: bool) -> Tensor:
        ctx.shapes = (input.shape, weight.shape, None if bias is None else bias.shape)
        ctx.sparse = sparse
        return input.new_zeros(0)

    @staticmethod
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        input_shape, weight_shape, bias_shape = ctx.shapes

        def zero(shape) -> Tensor:
            if ctx.sparse:
                return torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long, device=grad_output.device),
                                               grad_output.new_zeros(0, *shape[1:]), shape, check_invariants=False,
                                               is_coalesced=True)
            return grad_output.new_zeros(shape)

        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        return (grad_output.new_zeros(input_shape) if need_input else None, zero(weight_shape) if need_weight else None,
                zero(bias_shape) if need_bias and bias_shape is not None else None, None)


#: the header of the tree in a state dict: magic, version, K, N, M, depth limit (-1: none),


# ------------------------------------------------------------------ host-side tables of the tree
class TreeTables(NamedTuple):
    """What the backends read of the tree on the host, derived once per tree (:meth:`from_tree`)."""

    paths: tuple[np.ndarray, np.ndarray, np.ndarray]  #: (path_nodes, path_children, path_mask), contiguous
    full_paths: bool  #: every real label's path has the full length L (fixed-depth trees)
    child_node: np.ndarray  #: [N, M] child node of each slot, -1 where the slot holds no usable node
    child_label: np.ndarray  #: [N, M] label of each slot, -1 where it holds no real label (dummy leaves too)
    #: [N] the smallest real label id below each node (:func:`hsm.kernels.lowest_labels`): the exact
    #: top-1 searches explore a subtree tied with the best label only where it may hold a lower id
    lowest_label: np.ndarray

    @classmethod
    def from_tree(cls, tree: Tree) -> "TreeTables":
        # numpy indexing of a few hundred ids beats a device round trip of many small kernels
        paths = tuple(np.ascontiguousarray(a) for a in (tree.path_nodes, tree.path_children, tree.path_mask))
        usable = tree.slot_mask
        # dummy leaves of well-formed trees (ids >= K) are never predicted
        real = usable & (tree.child_label >= 0) & (tree.child_label < tree.num_labels)
        child_node = np.ascontiguousarray(np.where(usable, tree.child_node, -1), dtype=np.int64)
        child_label = np.ascontiguousarray(np.where(real, tree.child_label, -1), dtype=np.int64)
        return cls(paths, bool(tree.path_mask[: tree.num_labels].all()), child_node, child_label,
                   kernels.lowest_labels(child_node, child_label))


class NodeDistributions(NamedTuple):
    """The node softmax of every (example, path node) pair of a training batch: the input of
    Algorithm 1's statistics (:meth:`hsm.HierarchicalSoftmax._collect_statistics`)."""

    probs: Tensor  #: [P, M] softmax(W_n h + b_n) of each pair
    full: bool  #: P == B * L in (example, depth) order
    labels: np.ndarray | None = None  #: [B] the targets (compiled path: with ``example`` and ``depth``)
    example: np.ndarray | None = None  #: [P] example of each pair
    depth: np.ndarray | None = None  #: [P] position of the pair's node on its example's path


class TreeLayer(Protocol):
    """What the engines here and the searches of :mod:`hsm.search` read of a tree output layer
    (:class:`hsm.HierarchicalSoftmax` is the one implementation): its parameters, its tree and
    the host-side tables derived from it. They never see the layer itself."""

    weight: Tensor  #: [N, M * d] node weights
    bias: Tensor | None  #: [N, M] node biases
    slot_penalty: Tensor | None  #: [N, M]: -inf on slots without a real label below, or None
    arity: int
    num_labels: int
    sparse: bool
    use_kernels: bool
    tree: Tree
    tables: "TreeTables"  #: the tree's host-side tables
    fused_optimizer: Any  #: a RowSparseAdagrad fused into the compiled backward, or None

    def workspace(self) -> list:
        """Per-thread scratch buffers for the inference paths."""
        ...  # pragma: no cover - protocol


def select_backend(layer: TreeLayer, input: Tensor) -> "OutputBackend":
    """The compiled kernels where they apply (float32 CPU tensors, ``layer.use_kernels``), PyTorch
    otherwise."""
    weight, bias = layer.weight, layer.bias
    if (layer.use_kernels and input.device.type == "cpu" and input.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.device.type == "cpu"
            and (bias is None or bias.dtype == torch.float32)):
        return KERNELS
    return TORCH


class FusedGradient(Tensor):
    """What ``.grad`` holds for the weight and bias of a layer fused with
    :meth:`hsm.optim.RowSparseAdagrad.fuse` after a backward pass that already applied their update: a
    placeholder with the parameter's shape, dtype and device and no storage. Anything that reads
    or changes it (``clip_grad_norm_``, ``clip_grad_value_``, an L2 term, a gradient norm for a
    log, AMP's unscaling) raises a RuntimeError saying that the update was applied in backward,
    instead of silently leaving the layer out as a gradient of None would; zeroing it
    (``zero_grad(set_to_none=False)``) is allowed, and :meth:`hsm.optim.RowSparseAdagrad.step` skips it."""

    _ALLOWED = frozenset({"zero_", "detach_", "requires_grad_"})

    @staticmethod
    def __new__(cls, param: Tensor) -> "FusedGradient":
        return Tensor._make_wrapper_subclass(cls, param.shape, dtype=param.dtype, device=param.device)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name == "__get__":  # attribute reads (shape, dtype, is_sparse, ...)
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        if name in cls._ALLOWED:
            return args[0]
        raise RuntimeError(_FUSED_MESSAGE.format(name=name))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(_FUSED_MESSAGE.format(name=getattr(func, "__name__", str(func))))

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105 - a repr must not compute
        return f"FusedGradient(shape={list(self.shape)}, dtype={self.dtype}: update applied in backward)"


_FUSED_MESSAGE = ("a fused layer's gradient was used between backward() and step() ({name}), but "
                  "RowSparseAdagrad.fuse(layer) already applied the layer's update inside backward(), so "
                  "clipping, an L2 term or averaging cannot reach it: set layer.fused_optimizer = None to edit "
                  "gradients (the update then waits for step())")


class OutputBackend(Protocol):
    """How a :class:`hsm.HierarchicalSoftmax` computes eq. 5 on a batch (forward and backward)."""

    def path_log_prob(self, layer: TreeLayer, input: Tensor, target: Tensor,
                      collect: bool) -> tuple[Tensor, Tensor, NodeDistributions | None]:
        """``(output [B], loss [], node distributions or None)``: ``output[b] = log p(target[b] |
        input[b])`` (eq. 5), ``loss`` the mean negative log-likelihood, differentiable with respect
        to the input and the layer's parameters; the distributions when ``collect`` (training with
        a :class:`~hsm.TreeLearner`). Checks ``target`` (ValueError naming an unknown label)."""
        ...  # pragma: no cover - protocol


def needs_graph(layer: TreeLayer, input: Tensor) -> bool:
    """Whether a forward pass must support ``backward`` (else only ``logit - logsumexp`` is computed)."""
    return torch.is_grad_enabled() and (input.requires_grad or layer.weight.requires_grad)


def pair_log_softmax(layer: TreeLayer, input: Tensor, example: np.ndarray, node: np.ndarray) -> Tensor:
    """Node log-softmax [P, M] for arbitrary (example, node) pairs, grouped by node, in chunks of
    ``PAIR_CHUNK`` pairs (an untrained model's exact search can visit every node for every example)."""
    chunk = PAIR_CHUNK
    device = input.device
    out = []
    for start in range(0, max(len(node), 1), chunk):
        ex, nd = example[start:start + chunk], node[start:start + chunk]
        node_t = torch.from_numpy(np.ascontiguousarray(nd)).to(device)
        logits = grouped_logits(input, layer.weight, plan_groups(ex, nd, device), len(nd), layer.arity,
                                workspace=layer.workspace())
        log_probs = torch.log_softmax(_add_offsets(logits, layer.bias, layer.slot_penalty, node_t), dim=1)
        # a node whose logits overflow has no finite entry (NaN, or -inf everywhere): every search
        # (top-1, exact top-k, beam) goes through here, so each refuses such a row by name
        overflow = ~torch.isfinite(log_probs.amax(dim=1))
        if bool(overflow.any()):
            check_logits_finite(ex[overflow.cpu().numpy()], input.shape[0], input.dtype)
        out.append(log_probs)
    return torch.cat(out) if len(out) > 1 else out[0]


class TorchBackend:
    """Eq. 5 in PyTorch ops (any device, any dtype): node groups bucketed by size, one batched
    matmul per bucket, and :class:`_TreePathLogProb`'s direct backward."""

    @staticmethod
    def plan(layer: TreeLayer, target: Tensor) -> _PathPlan:
        """The (example, node, child) pairs of the targets' paths, grouped by node."""
        nodes, children, mask = layer.tables.paths
        example, _, node, child = kernels.path_pairs(np.ascontiguousarray(target.detach().cpu().numpy(),
                                                                          dtype=np.int64),
                                                     nodes, children, mask, layer.tables.full_paths)
        device = layer.weight.device
        return _PathPlan(torch.from_numpy(example).to(device), torch.from_numpy(np.ascontiguousarray(node)).to(device),
                         torch.from_numpy(np.ascontiguousarray(child)).to(device),
                         plan_groups(example, node, device), layer.tables.full_paths)

    def path_log_prob(self, layer: TreeLayer, input: Tensor, target: Tensor,
                      collect: bool) -> tuple[Tensor, Tensor, NodeDistributions | None]:
        check_target(target, input.shape[0], layer.num_labels)
        batch = input.shape[0]
        plan = self.plan(layer, target)
        if not needs_graph(layer, input) and not collect:
            # inference: log p(y) = logit[y] - logsumexp(logits) per node, nothing kept for backward
            logits = grouped_logits(input, layer.weight, plan.buckets, plan.node.numel(), layer.arity,
                                    workspace=layer.workspace())
            logits = _add_offsets(logits, layer.bias, layer.slot_penalty, plan.node)
            picked = logits.gather(1, plan.child.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=1)
            output = _sum_over_paths(picked, plan, batch)
            return output, -output.mean(), None
        output, pair_log_probs = _TreePathLogProb.apply(input, layer.weight, layer.bias, layer.slot_penalty, plan,
                                                        batch, layer.sparse, layer.arity)
        distributions = NodeDistributions(pair_log_probs.detach().exp(), plan.full) if collect else None
        return output, -output.mean(), distributions


class KernelBackend:
    """Eq. 5 in the compiled kernels of :mod:`hsm.kernels` (float32 contiguous CPU tensors): one
    pass for the forward, one for the backward."""

    @staticmethod
    def operand(layer: TreeLayer, tensor: Tensor | None) -> np.ndarray:
        """Bias or slot penalty for the kernels: its numpy view, or a [0, M] array for none."""
        return _np(tensor) if tensor is not None else np.empty((0, layer.arity), dtype=np.float32)

    @staticmethod
    def plan(layer: TreeLayer, labels: np.ndarray) -> _KernelPlan | None:
        """The batch's pairs grouped by node, or None when a label is not one of the tree's."""
        nodes, children, mask = layer.tables.paths
        full = layer.tables.full_paths
        valid, example, depth, node, child, order, starts = kernels.batch_plan(
            np.ascontiguousarray(labels, dtype=np.int64), layer.num_labels, nodes, children, mask, full)
        return _KernelPlan(example, node, child, depth, order, starts, full) if valid else None

    def path_log_prob(self, layer: TreeLayer, input: Tensor, target: Tensor,
                      collect: bool) -> tuple[Tensor, Tensor, NodeDistributions | None]:
        check_target_shape(target, input.shape[0])
        labels = target.detach().cpu().numpy()
        plan = self.plan(layer, labels)  # also checks the labels' range (one compiled pass)
        if plan is None:
            check_target(target, input.shape[0], layer.num_labels)  # names the bad label
        penalty = self.operand(layer, layer.slot_penalty)
        if not needs_graph(layer, input) and not collect:
            output = kernels.run_path_forward(_np(input), _np(layer.weight), self.operand(layer, layer.bias), penalty,
                                              plan.example, plan.node, plan.child, plan.order, plan.starts,
                                              layer.arity, np.empty((0, layer.arity), dtype=np.float32))
            # the mean in numpy: two torch calls would cost a tenth of this whole pass
            return torch.from_numpy(output), _mean_loss(output), None
        output, pair_probs, loss = _TreePathLogProbKernel.apply(input, layer.weight, layer.bias, penalty, plan,
                                                                layer.sparse, layer.arity,
                                                                getattr(layer, "fused_optimizer", None))
        distributions = NodeDistributions(pair_probs, plan.full, labels, plan.example, plan.depth) if collect else None
        return output, loss, distributions


TORCH = TorchBackend()
KERNELS = KernelBackend()
