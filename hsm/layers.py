"""Output layers with one interface: the tree (hierarchical) softmax and the flat softmax.

Both mirror :class:`torch.nn.AdaptiveLogSoftmaxWithLoss`, so one can stand in for another:

* ``forward(input, target)`` -> ``HSMOutput(output, loss)``: ``output[b] = log p(target[b] | input[b])``
  and ``loss`` the mean negative log-likelihood;
* ``log_prob(input)`` -> ``[B, K]`` log-probabilities of every label (rows sum to one in probability);
* ``predict(input)`` -> ``[B]`` the most likely label (exact);
* ``topk(input, k)`` -> ``TopK(values, indices, nodes_visited)``.

The hierarchical softmax (eq. 5, and eq. 11 for the log-bilinear model) factors
``p(y | h) = prod_d softmax(W_n h + b_n)[c_d]`` over the nodes ``n`` on the path of ``y``, each
node a softmax over its M children (a sigmoid when M = 2 is the same thing). All node parameters
sit in one tensor, gathered per batch, so a training step touches ``B * L * M * d`` numbers
instead of the flat softmax's ``K * d``.
"""
from __future__ import annotations

import math
import sys
import threading
import warnings
import zlib
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import kernels
from .tree import Tree, check_integer

__all__ = ["FlatSoftmax", "HierarchicalSoftmax", "HSMOutput", "NonFiniteInputError", "RowSparseAdagrad", "RowSparseSGD",
           "TopK"]


class HSMOutput(NamedTuple):
    """Like torch's ``_ASMoutput``: log-likelihood of each target and the mean NLL."""

    output: Tensor
    loss: Tensor


class TopK(NamedTuple):
    values: Tensor  #: [B, k] log-probabilities, best first
    indices: Tensor  #: [B, k] labels
    nodes_visited: Tensor  #: [B] internal nodes evaluated per example (K for the flat softmax)


class NonFiniteInputError(ValueError):
    """The input of an output layer holds NaN or infinite values (a ValueError; :func:`hsm.training.train_epoch`
    reports it as the divergence it usually is, a FloatingPointError naming the step)."""


def _check_input(input: Tensor, in_features: int, parameter: Tensor | None = None) -> None:
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
    already do, to plan the batch on the host)."""
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
    if input.numel() and not math.isfinite(float(input.detach().sum())):
        bad = torch.nonzero(~torch.isfinite(input.detach()).all(dim=1)).flatten()
        if bad.numel():
            rows = bad[:5].tolist()
            raise NonFiniteInputError(f"input has NaN or infinite values in {bad.numel()} of {input.shape[0]} "
                                      f"rows (rows {rows}{', ...' if bad.numel() > 5 else ''})")


def _check_k(k: int, num_labels: int, method: str, beam: int | None) -> None:
    """topk's arguments: k in 1..K and beam None or >= 1 (integers, not bools), method known."""
    if check_integer(k, "k") < 1 or k > num_labels:
        raise ValueError(f"k must be in 1..{num_labels}, got {k}")
    if method not in ("exact", "beam"):
        raise ValueError(f"method must be 'exact' or 'beam', got {method!r}")
    if beam is not None and check_integer(beam, "beam") < 1:
        raise ValueError(f"beam must be >= 1 (the beam search's width) or None, got {beam}")


def _check_target_shape(target: Tensor, batch: int) -> None:
    if not isinstance(target, Tensor) or target.dtype not in (torch.int64, torch.int32):
        got = target.dtype if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"target must be an integer tensor of label ids (torch.int64 or torch.int32), got {got}")
    if target.shape != (batch,):
        raise ValueError(f"target must have shape [{batch}] to match input, got {list(target.shape)}")


def _check_target(target: Tensor, batch: int, num_labels: int) -> None:
    _check_target_shape(target, batch)
    if batch and (int(target.min()) < 0 or int(target.max()) >= num_labels):
        bad = target[(target < 0) | (target >= num_labels)][0].item()
        raise ValueError(f"unknown label {bad}: labels are 0..{num_labels - 1}")


def _merge_topk(best_v: Tensor, best_i: Tensor, ex: Tensor, labels: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Merge candidate (example, label, value) triples into per-example top-k lists (no duplicates)."""
    batch, k = best_v.shape
    if ex.numel() == 0:
        return best_v, best_i
    all_e = torch.cat([torch.arange(batch, device=ex.device).repeat_interleave(k), ex])
    all_v = torch.cat([best_v.reshape(-1), values])
    all_i = torch.cat([best_i.reshape(-1), labels])
    real = all_i >= 0
    all_e, all_v, all_i = all_e[real], all_v[real], all_i[real]
    # drop a label found twice for the same example (keep its best value)
    order = torch.argsort(all_v, descending=True, stable=True)
    all_e, all_v, all_i = all_e[order], all_v[order], all_i[order]
    key = all_e * (int(all_i.max()) + 1) + all_i
    key_sorted, key_order = torch.sort(key, stable=True)
    first = torch.ones_like(key_sorted, dtype=torch.bool)
    first[1:] = key_sorted[1:] != key_sorted[:-1]
    keep = key_order[first].sort().values
    all_e, all_v, all_i = all_e[keep], all_v[keep], all_i[keep]
    # group by example (stable: values stay in decreasing order), rank within the example
    order = torch.argsort(all_e, stable=True)
    all_e, all_v, all_i = all_e[order], all_v[order], all_i[order]
    counts = torch.bincount(all_e, minlength=batch)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(all_e.numel(), device=ex.device) - starts[all_e]
    sel = rank < k
    new_v = torch.full_like(best_v, -math.inf)
    new_i = torch.full_like(best_i, -1)
    new_v[all_e[sel], rank[sel]] = all_v[sel]
    new_i[all_e[sel], rank[sel]] = all_i[sel]
    return new_v, new_i


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
_PAIR_CHUNK = 1 << 15  #: (example, node) pairs evaluated at once by the exact search


class _Bucket(NamedTuple):
    nodes: Tensor  #: [U] unique node ids of the groups in this bucket
    cap: int  #: padded group size (1: every group has one pair, no padding)
    entries: Tensor  #: [n] pair ids (rows of the [P, M] logits) in this bucket
    examples: Tensor  #: [n] example (input row) of each pair
    slots: Tensor | None  #: [n] position ``group * cap + rank`` in the padded layout (None when cap == 1)


def _plan_groups(example: np.ndarray, node: np.ndarray, device: torch.device) -> list[_Bucket]:
    """Group pairs (example[p], node[p]) by node and bucket the groups by size (numpy: these are
    a few hundred integers, and numpy's per-call cost is a fraction of torch's)."""
    count = node.size
    order = np.argsort(node, kind="stable")
    sorted_nodes = node[order]
    first = np.ones(count, dtype=bool)
    first[1:] = sorted_nodes[1:] != sorted_nodes[:-1]
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, count))
    group_of_pair = np.cumsum(first) - 1  # group of each sorted pair
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


def _grouped_logits(input: Tensor, weight: Tensor, buckets: list[_Bucket], num_pairs: int, arity: int,
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


class _PathPlan(NamedTuple):
    """Which (example, node, child) pairs a batch needs: the kept steps of every target's path."""

    example: Tensor  #: [P]
    node: Tensor  #: [P]
    child: Tensor  #: [P]
    buckets: list[_Bucket]
    full: bool  #: P == B * L in (example, depth) order: sums are a reshape


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
        logits = _grouped_logits(input, weight, plan.buckets, num_pairs, arity, saved)
        if bias is not None:
            logits += bias.index_select(0, plan.node)
        if slot_penalty is not None:  # -inf on empty slots (trees with M**D > K); skipped for full trees
            logits += slot_penalty.index_select(0, plan.node)
        log_probs = torch.log_softmax(logits, dim=1)
        picked = log_probs.gather(1, plan.child.unsqueeze(1)).squeeze(1)
        if plan.full:
            output = picked.view(batch, -1).sum(1)
        else:
            output = input.new_zeros(batch).index_add_(0, plan.example, picked)
        ctx.plan, ctx.saved_blocks, ctx.batch, ctx.sparse = plan, saved, batch, sparse
        ctx.has_bias = bias is not None
        ctx.weight_shape = weight.shape
        ctx.save_for_backward(input, log_probs)
        ctx.mark_non_differentiable(log_probs)
        return output, log_probs

    @staticmethod
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
            adagrad = ctx.fused._fused_settings(weight, ctx.bias)
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
            return (torch.from_numpy(grad_h) if need_input else None), None, None, None, None, None, None, None
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


class _EmptyBatch(torch.autograd.Function):
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
#: in_features, checksum (two 16-bit halves: every header entry stays exact in float32)
_TREE_MAGIC, _TREE_VERSION, _TREE_HEADER = 1447, 1, 9  # a magic below 2048 survives even a float16 cast


def _caller_outside_torch() -> int:
    """The ``stacklevel`` for a warning raised in a module hook that points at the user's
    ``load_state_dict`` call, however deep the module sits (torch recurses through its children)."""
    # frame k above this one is stacklevel k of a warning raised by its caller (the hook)
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == nn.modules.module.__file__:
        frame, level = frame.f_back, level + 1
    return level


def _tree_checksum(header: np.ndarray, body: np.ndarray) -> int:
    """CRC-32 of the header (checksum slots excluded) and the body, as int64 bytes."""
    return zlib.crc32(body.tobytes(), zlib.crc32(np.ascontiguousarray(header[:7], dtype=np.int64).tobytes()))


class HierarchicalSoftmax(nn.Module):
    """Tree softmax over ``tree.num_labels`` labels (eq. 5 / 11).

    Parameters
    ----------
    in_features: d, the size of the representation ``h = f(x)``.
    tree: the label tree (:class:`hsm.Tree`).
    bias: learn a bias per child slot.
    sparse: node parameters get sparse gradients (``torch.optim.SGD``, ``Adagrad`` and
        ``SparseAdam`` accept them): a step then costs O(B L M d), not O(N M d).

    Shape: ``input`` [B, d], ``target`` [B] -> ``output`` [B], ``loss`` [].

    Speed (issue 8, ``python -m hsm bench``): :meth:`forward` groups the batch's (example, path
    node) pairs by node, reads each node's ``[M, d]`` block once and writes one gradient row per
    node (a custom autograd backward); under ``no_grad`` it computes ``logit - logsumexp`` only;
    :meth:`predict` is a greedy descent followed by branch and bound. For float32 tensors on the
    CPU all of this runs in compiled kernels (:mod:`hsm.kernels`, one pass each, split over
    ``torch.get_num_threads()`` threads); set ``layer.use_kernels = False`` for the PyTorch
    implementation (what runs on a GPU). Use
    :class:`RowSparseAdagrad` or :class:`RowSparseSGD` with ``sparse=True``. On Linux CPUs, setting
    the environment variable ``THP_MEM_ALLOC_ENABLE=1`` before starting Python (torch then backs
    tensors of 2 MB or more with huge pages) removes most of the page-fault cost of the per-batch
    temporaries: several-fold for large arities. :meth:`forward_reference` is the plain
    implementation everything is tested against.

    Node parameters when the tree changes (:meth:`set_tree`): every node keeps its parameters
    (node ids are positions: Algorithm 3 never moves them, and Algorithm 2 reuses ids in place);
    nodes named in ``reset_nodes`` (new positions) are re-initialised, as the thesis does for a
    new node (its Fig. 3.6 h).

    The tree is part of :meth:`state_dict` (key ``_extra_state``), so a layer trained with a
    :class:`~hsm.TreeLearner` round-trips: ``load_state_dict`` into a layer built on *any* tree
    of the same K, M, N and ``in_features`` installs the saved tree (and refuses, before copying
    anything, a state dict of another shape, naming both). Label names are not saved: the loaded
    tree keeps the layer's. A state dict without a tree (written by an older version) still loads,
    with a warning, and the layer keeps its tree. The learner's statistics and step count are in
    ``TreeLearner.state_dict()``.

    Input checks (every entry point): TypeError when ``input``'s dtype is not the parameters'
    (as ``nn.Linear``: convert one of them), ValueError for a wrong shape or device and for rows
    holding NaN or inf (named). An empty batch gives empty results (and a NaN mean loss).
    """

    def __init__(self, in_features: int, tree: Tree, bias: bool = True, sparse: bool = False) -> None:
        super().__init__()
        in_features = check_integer(in_features, "in_features")
        if in_features < 1:
            raise ValueError(f"in_features must be >= 1, got {in_features}")
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be an hsm.Tree, got {type(tree).__name__}")
        self.in_features = in_features
        self.arity = tree.arity
        self.num_nodes = tree.num_nodes
        self.sparse = sparse
        self.weight = nn.Parameter(torch.empty(tree.num_nodes, tree.arity * in_features))
        self.bias = nn.Parameter(torch.zeros(tree.num_nodes, tree.arity)) if bias else None
        self.statistics = None  # a NodeStatistics, attached by TreeLearner (Algorithm 1)
        #: a RowSparseAdagrad whose update of this layer's parameters runs inside the compiled
        #: backward (RowSparseAdagrad.fuse), or None
        self.fused_optimizer = None
        self.reset_parameters()
        self.tree: Tree
        self.set_tree(tree)

    @property
    def num_labels(self) -> int:
        return self.tree.num_labels

    def reset_parameters(self, nodes: Tensor | np.ndarray | None = None) -> None:
        """Uniform(-1/sqrt(d), 1/sqrt(d)) weights and zero biases, like ``nn.Linear``; all nodes
        or only ``nodes``."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            if nodes is None:
                self.weight.uniform_(-bound, bound)
                if self.bias is not None:
                    self.bias.zero_()
            else:
                rows = torch.as_tensor(np.asarray(nodes), dtype=torch.long, device=self.weight.device)
                self.weight[rows] = torch.empty_like(self.weight[rows]).uniform_(-bound, bound)
                if self.bias is not None:
                    self.bias[rows] = 0.0

    def set_tree(self, tree: Tree, reset_nodes: Tensor | np.ndarray | None = None) -> None:
        """Switch to another tree over the same labels and nodes (after a re-assignment).
        Raises TypeError for a non-Tree, ValueError for a tree of another M, N or K."""
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be an hsm.Tree, got {type(tree).__name__}")
        if tree.arity != self.arity or tree.num_nodes != self.num_nodes:
            raise ValueError(
                f"the new tree has M={tree.arity}, N={tree.num_nodes}; the layer was built for "
                f"M={self.arity}, N={self.num_nodes}"
            )
        if hasattr(self, "tree") and tree.num_labels != self.tree.num_labels:
            raise ValueError(f"the new tree has {tree.num_labels} labels, the layer {self.tree.num_labels}")
        device = self.weight.device
        self.tree = tree
        as_t = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=device)  # noqa: E731
        # buffers are not persistent: they derive from the tree, which the state dict carries
        # (get_extra_state)
        self.register_buffer("path_nodes", as_t(tree.path_nodes), persistent=False)
        self.register_buffer("path_children", as_t(tree.path_children), persistent=False)
        self.register_buffer("path_mask", as_t(tree.path_mask), persistent=False)
        self.register_buffer("slot_mask", as_t(tree.slot_mask), persistent=False)
        self.register_buffer("child_node", as_t(tree.child_node), persistent=False)
        self.register_buffer("child_label", as_t(tree.child_label), persistent=False)
        # Empty slots (M**D > K, ragged taxonomies) get -inf added to their logit; a tree without
        # any (a full M-ary tree) skips that work entirely.
        penalty = None
        if not tree.slot_mask.all():
            penalty = torch.as_tensor(np.where(tree.slot_mask, 0.0, -np.inf), dtype=self.weight.dtype, device=device)
        self.register_buffer("slot_penalty", penalty, persistent=False)
        # host copies for planning (numpy indexing of a few hundred ids beats a device round trip of
        # many small kernels); every real label's path has the full length L in fixed-depth trees
        self._host_paths = tuple(np.ascontiguousarray(a) for a in (tree.path_nodes, tree.path_children, tree.path_mask))
        self._full_paths = bool(tree.path_mask[: tree.num_labels].all())
        # the compiled kernels' child tables: -1 wherever a slot holds no usable node / real label
        # (dummy leaves of well-formed trees, ids >= K, are never predicted)
        usable = tree.slot_mask
        self._kernel_child_node = np.ascontiguousarray(np.where(usable, tree.child_node, -1), dtype=np.int64)
        real = usable & (tree.child_label >= 0) & (tree.child_label < tree.num_labels)
        self._kernel_child_label = np.ascontiguousarray(np.where(real, tree.child_label, -1), dtype=np.int64)
        if reset_nodes is not None and len(reset_nodes):
            self.reset_parameters(reset_nodes)

    # ------------------------------------------------------------------ node computations
    def _node_logits(self, input: Tensor, nodes: Tensor) -> Tensor:
        """Reference per-pair evaluation: logits of ``nodes`` [B, ...] for the rows of ``input``:
        [B, ..., M] (masked slots at -inf). One weight block is copied per (row, node) pair; the
        fast paths group pairs by node instead (:func:`_grouped_logits`)."""
        shape = nodes.shape
        flat = nodes.reshape(shape[0], math.prod(shape[1:]))  # [B, L] (no -1: B may be 0)
        weight = F.embedding(flat, self.weight, sparse=self.sparse)  # [B, L, M*d]
        weight = weight.view(flat.shape[0], flat.shape[1], self.arity, self.in_features)
        logits = torch.einsum("bd,blmd->blm", input, weight)
        if self.bias is not None:
            logits = logits + F.embedding(flat, self.bias, sparse=self.sparse)
        logits = logits.masked_fill(~self.slot_mask[flat], -math.inf)
        return logits.view(*shape, self.arity)

    def __getstate__(self) -> dict:
        """For pickling (``copy.deepcopy(layer)``, ``torch.save(layer)``): the per-thread inference
        buffers (a ``threading.local``, which cannot be pickled) are left behind; a copy makes its own."""
        state = self.__dict__.copy()
        state.pop("_thread_local", None)
        state.pop("_pending_tree", None)
        state["fused_optimizer"] = None  # a copy is not updated by the original's optimiser
        return state

    def _workspace(self) -> list:
        """Per-thread buffers for the inference paths (so concurrent callers never share one)."""
        local = self.__dict__.get("_thread_local")
        if local is None:
            local = self.__dict__["_thread_local"] = threading.local()
        if not hasattr(local, "buffers"):
            local.buffers = []
        return local.buffers

    def _path_pairs(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(example, depth, node, child) of every kept step of the labels' paths, in (example,
        depth) order, as contiguous int64 arrays (:func:`hsm.kernels.path_pairs`)."""
        nodes, children, mask = self._host_paths
        return kernels.path_pairs(np.ascontiguousarray(labels, dtype=np.int64), nodes, children, mask,
                                  self._full_paths)

    def _plan(self, target: Tensor) -> _PathPlan:
        """The (example, node, child) pairs of the targets' paths, grouped by node."""
        example, _, node, child = self._path_pairs(target.detach().cpu().numpy())
        device = self.weight.device
        return _PathPlan(torch.from_numpy(example).to(device), torch.from_numpy(np.ascontiguousarray(node)).to(device),
                         torch.from_numpy(np.ascontiguousarray(child)).to(device),
                         _plan_groups(example, node, device), self._full_paths)

    #: use the compiled kernels of :mod:`hsm.kernels` where they apply (float32 CPU tensors);
    #: False forces the PyTorch implementation (the benchmark compares the two)
    use_kernels: bool = True

    def _kernels_apply(self, input: Tensor) -> bool:
        return (self.use_kernels and input.device.type == "cpu" and input.dtype == torch.float32
                and self.weight.dtype == torch.float32 and self.weight.device.type == "cpu"
                and (self.bias is None or self.bias.dtype == torch.float32))

    def _kernel_plan(self, labels: np.ndarray) -> _KernelPlan | None:
        """The batch's pairs grouped by node, or None when a label is not one of the tree's."""
        nodes, children, mask = self._host_paths
        valid, example, depth, node, child, order, starts = kernels.batch_plan(
            np.ascontiguousarray(labels, dtype=np.int64), self.num_labels, nodes, children, mask, self._full_paths)
        return _KernelPlan(example, node, child, depth, order, starts, self._full_paths) if valid else None

    def _kernel_operand(self, tensor: Tensor | None) -> np.ndarray:
        """Bias or slot penalty for the kernels: its numpy view, or a [0, M] array for none."""
        return _np(tensor) if tensor is not None else np.empty((0, self.arity), dtype=np.float32)

    def _forward_kernels(self, input: Tensor, target: Tensor) -> HSMOutput:
        labels = target.detach().cpu().numpy()
        plan = self._kernel_plan(labels)  # also checks the labels' range (one compiled pass)
        if plan is None:
            _check_target(target, input.shape[0], self.num_labels)  # names the bad label
        penalty = self._kernel_operand(self.slot_penalty)
        collect = self.statistics is not None and self.training
        if not (torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad)) and not collect:
            output = kernels.run_path_forward(_np(input), _np(self.weight), self._kernel_operand(self.bias), penalty,
                                              plan.example, plan.node, plan.child, plan.order, plan.starts,
                                              self.arity, np.empty((0, self.arity), dtype=np.float32))
            # the mean in numpy: two torch calls would cost a tenth of this whole pass
            return HSMOutput(torch.from_numpy(output), _mean_loss(output))
        output, pair_probs, loss = _TreePathLogProbKernel.apply(input, self.weight, self.bias, penalty,
                                                                plan, self.sparse, self.arity,
                                                                getattr(self, "fused_optimizer", None))
        if collect and not self.statistics.accumulate_pairs(labels, plan.example, plan.depth, pair_probs.numpy()):
            self._collect_statistics(target, pair_probs, plan.full)
        return HSMOutput(output, loss)

    def _collect_statistics(self, target: Tensor, pair_probs: Tensor, full: bool) -> None:
        """Algorithm 1's statistics (hsm.statistics) from the batch's node distributions [P, M]."""
        batch = target.shape[0]
        length = self.path_nodes.shape[1]
        mask = self.path_mask[target]
        if full:
            probs = pair_probs.view(batch, length, self.arity)
        else:
            probs = pair_probs.new_zeros(batch * length, self.arity)
            probs[mask.view(-1)] = pair_probs
            probs = probs.view(batch, length, self.arity)
        self.statistics.accumulate(target, probs, mask)

    def forward(self, input: Tensor, target: Tensor) -> HSMOutput:
        """Eq. 5: sum over the path of ``log softmax(W_n h + b_n)[c_d]``.

        Pairs (example, path node) are grouped by node, so each node's parameters are read once per
        batch and its gradient is written once (compiled kernels, :mod:`hsm.kernels`, for float32
        CPU tensors; :class:`_TreePathLogProb` otherwise); the result equals
        :meth:`forward_reference` (tests check values and gradients).

        Raises TypeError when ``input``'s dtype is not the layer's or ``target`` is not an integer
        tensor, ValueError for a wrong shape or device, a label outside 0..K-1, or NaN / infinite
        values in ``input`` (naming the rows). An empty batch gives an empty ``output`` and a NaN
        ``loss`` (the mean of nothing, as ``F.cross_entropy`` and
        ``nn.AdaptiveLogSoftmaxWithLoss`` give); ``loss.backward()`` then leaves zero gradients."""
        _check_input(input, self.in_features, self.weight)
        if input.shape[0] == 0:
            _check_target_shape(target, 0)
            output = _EmptyBatch.apply(input, self.weight, self.bias, self.sparse)
            return HSMOutput(output, -output.mean())
        if self._kernels_apply(input):
            _check_target_shape(target, input.shape[0])  # the kernels' plan checks the label range
            return self._forward_kernels(input, target)
        _check_target(target, input.shape[0], self.num_labels)
        batch = input.shape[0]
        plan = self._plan(target)
        if not (torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad)) and (
                self.statistics is None or not self.training):
            # inference: log p(y) = logit[y] - logsumexp(logits) per node, nothing kept for backward
            logits = _grouped_logits(input, self.weight, plan.buckets, plan.node.numel(), self.arity,
                                     workspace=self._workspace())
            if self.bias is not None:
                logits += self.bias.index_select(0, plan.node)
            if self.slot_penalty is not None:
                logits += self.slot_penalty.index_select(0, plan.node)
            picked = logits.gather(1, plan.child.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=1)
            output = picked.view(batch, -1).sum(1) if plan.full else input.new_zeros(batch).index_add_(
                0, plan.example, picked)
            return HSMOutput(output, -output.mean())
        output, pair_log_probs = _TreePathLogProb.apply(input, self.weight, self.bias, self.slot_penalty, plan,
                                                        batch, self.sparse, self.arity)
        if self.statistics is not None and self.training:
            self._collect_statistics(target, pair_log_probs.detach().exp(), plan.full)
        return HSMOutput(output, -output.mean())

    def forward_reference(self, input: Tensor, target: Tensor) -> HSMOutput:
        """The plain implementation of eq. 5 (per-pair weight copies, autograd for the gradient):
        what :meth:`forward` is checked against, and the "naive" line of the benchmark."""
        _check_input(input, self.in_features, self.weight)
        _check_target(target, input.shape[0], self.num_labels)
        nodes = self.path_nodes[target]  # [B, L]
        children = self.path_children[target]
        mask = self.path_mask[target]
        log_probs = torch.log_softmax(self._node_logits(input, nodes), dim=-1)  # [B, L, M]
        picked = log_probs.gather(-1, children.unsqueeze(-1)).squeeze(-1)
        output = torch.where(mask, picked, torch.zeros_like(picked)).sum(dim=1)
        return HSMOutput(output, -output.mean())

    def _pair_log_softmax(self, input: Tensor, example: np.ndarray, node: np.ndarray) -> Tensor:
        """Node log-softmax [P, M] for arbitrary (example, node) pairs, grouped by node, in chunks
        (an untrained model's exact search can visit every node for every example)."""
        chunk = _PAIR_CHUNK
        device = input.device
        out = []
        for start in range(0, max(len(node), 1), chunk):
            ex, nd = example[start:start + chunk], node[start:start + chunk]
            node_t = torch.from_numpy(np.ascontiguousarray(nd)).to(device)
            logits = _grouped_logits(input, self.weight, _plan_groups(ex, nd, device), len(nd), self.arity,
                                     workspace=self._workspace())
            if self.bias is not None:
                logits += self.bias.index_select(0, node_t)
            if self.slot_penalty is not None:
                logits += self.slot_penalty.index_select(0, node_t)
            out.append(torch.log_softmax(logits, dim=1))
        return torch.cat(out) if len(out) > 1 else out[0]

    def log_prob(self, input: Tensor, batch_chunk: int = 256) -> Tensor:
        """Log-probabilities of all K labels, [B, K] (every node evaluated: O(N M d) per row).

        Raises as :meth:`forward` does for a bad ``input`` (dtype, shape, device, NaN / inf rows);
        an empty batch gives a [0, K] tensor. ``batch_chunk`` (rows evaluated at once, >= 1) bounds
        the temporary memory."""
        _check_input(input, self.in_features, self.weight)
        if check_integer(batch_chunk, "batch_chunk") < 1:
            raise ValueError(f"batch_chunk must be >= 1, got {batch_chunk}")
        num_labels = self.num_labels
        index = (self.path_nodes[:num_labels] * self.arity + self.path_children[:num_labels])  # [K, L]
        mask = self.path_mask[:num_labels]
        weight = self.weight.view(self.num_nodes * self.arity, self.in_features)
        rows = []
        for chunk in input.split(batch_chunk):
            logits = (chunk @ weight.t()).view(-1, self.num_nodes, self.arity)
            if self.bias is not None:
                logits = logits + self.bias
            logits = logits.masked_fill(~self.slot_mask, -math.inf)
            node_lp = torch.log_softmax(logits, dim=-1).reshape(chunk.shape[0], self.num_nodes * self.arity)
            per_step = node_lp[:, index]  # [b, K, L]
            rows.append(torch.where(mask, per_step, torch.zeros_like(per_step)).sum(-1))
        return torch.cat(rows)

    @torch.no_grad()
    def predict(self, input: Tensor) -> Tensor:
        """The most likely label of each row, exact (branch and bound).

        First a greedy descent (follow the most likely child) gives each row a label and so a lower
        bound on the best log-probability; then the tree is explored level by level from the root,
        keeping a node only while its path log-probability is above the row's best label so far.
        A node's path probability bounds every label below it, so the result is the arg max of
        :meth:`log_prob` (tests check it). A confident model prunes almost everything; an
        untrained one (near-uniform nodes) visits every node.

        Raises as :meth:`forward` does for a bad ``input``: in particular ValueError naming the rows
        with NaN or infinite values, on every path (there is no meaningful most likely label for
        them). An empty batch gives an empty [0] tensor."""
        _check_input(input, self.in_features, self.weight)
        return self._predict_top1(input)[0]

    @torch.no_grad()
    def _predict_top1(self, input: Tensor) -> tuple[Tensor, Tensor]:
        """(labels, nodes visited per row) of the exact top-1 search described in :meth:`predict`."""
        if input.shape[0] == 0:
            empty = torch.zeros(0, dtype=torch.long, device=input.device)
            return empty, empty.clone()
        if self._kernels_apply(input):
            labels, _, visited = kernels.run_top1_search(_np(input), _np(self.weight), self._kernel_operand(self.bias),
                                                         self._kernel_operand(self.slot_penalty),
                                                         self._kernel_child_node, self._kernel_child_label,
                                                         self.path_nodes.shape[1])
            return torch.from_numpy(labels), torch.from_numpy(visited)
        batch, device = input.shape[0], input.device
        child_node, child_label, slot_mask = self.tree.child_node, self.tree.child_label, self.tree.slot_mask
        num_labels = self.num_labels
        best_value = torch.full((batch,), -math.inf, dtype=input.dtype, device=device)
        best_label = torch.full((batch,), -1, dtype=torch.long, device=device)
        visited = np.zeros(batch, dtype=np.int64)
        is_label = (child_label >= 0) & (child_label < num_labels) & slot_mask
        is_node = (child_node >= 0) & slot_mask

        def update_best(example: np.ndarray, node: np.ndarray, cand: Tensor) -> None:
            leaf_np = is_label[node]
            if not leaf_np.any():  # inner levels of a fixed-depth tree hold no labels
                return
            leaf = torch.from_numpy(leaf_np).to(device)
            values = cand.masked_fill(~leaf, -math.inf)
            row_best, slot = values.max(dim=1)
            ex_t = torch.from_numpy(example).to(device)
            new_best = best_value.clone().scatter_reduce_(0, ex_t, row_best, reduce="amax")
            improved = (row_best > best_value[ex_t]) & (row_best == new_best[ex_t])
            if bool(improved.any()):
                labels = torch.from_numpy(child_label[node]).to(device).gather(1, slot.unsqueeze(1)).squeeze(1)
                best_label[ex_t[improved]] = labels[improved]
            best_value.copy_(new_best)

        # greedy descent: a label per row, hence a bound; the node distributions it computes are
        # kept (per depth) so the exact search below does not evaluate those nodes again
        greedy_node: list[np.ndarray] = []
        greedy_cand: list[Tensor] = []
        example, node = np.arange(batch), np.zeros(batch, dtype=np.int64)
        score = input.new_zeros(batch)
        while example.size:
            visited += np.bincount(example, minlength=batch)
            cand = score.unsqueeze(1) + self._pair_log_softmax(input, example, node)
            update_best(example, node, cand)
            seen = np.full(batch, -1, dtype=np.int64)
            seen[example] = node
            rows = cand.new_empty(batch, cand.shape[1])
            rows[torch.from_numpy(example).to(device)] = cand
            greedy_node.append(seen)
            greedy_cand.append(rows)
            inner = torch.from_numpy(is_node[node]).to(device)
            step_value, slot = cand.masked_fill(~inner, -math.inf).max(dim=1)
            go_on = torch.isfinite(step_value).cpu().numpy()
            slot_np = slot.cpu().numpy()
            example, node = example[go_on], child_node[node[go_on], slot_np[go_on]]
            score = step_value[torch.from_numpy(go_on).to(device)]
        # branch and bound from the root
        example, node = np.arange(batch), np.zeros(batch, dtype=np.int64)
        score = input.new_zeros(batch)
        depth = 0
        while example.size:
            cached = greedy_node[depth][example] == node if depth < len(greedy_node) else np.zeros(example.size, bool)
            cand = input.new_empty(example.size, self.arity)
            if cached.any():
                rows_from_greedy = torch.from_numpy(example[cached]).to(device)
                cand[torch.from_numpy(cached).to(device)] = greedy_cand[depth][rows_from_greedy]
            if not cached.all():
                fresh = ~cached
                visited += np.bincount(example[fresh], minlength=batch)
                fresh_t = torch.from_numpy(fresh).to(device)
                cand[fresh_t] = score[fresh_t].unsqueeze(1) + self._pair_log_softmax(input, example[fresh], node[fresh])
                update_best(example[fresh], node[fresh], cand[fresh_t])
            ex_t = torch.from_numpy(example).to(device)
            keep = torch.from_numpy(is_node[node]).to(device) & (cand > best_value[ex_t].unsqueeze(1))
            pair, slot = (t.cpu().numpy() for t in torch.nonzero(keep, as_tuple=True))
            score = cand[keep]
            example, node = example[pair], child_node[node[pair], slot]
            depth += 1
        return best_label, torch.from_numpy(visited).to(device)

    @torch.no_grad()
    def topk(self, input: Tensor, k: int = 1, method: str = "exact", beam: int | None = None) -> TopK:
        """The k most likely labels.

        ``method="exact"``: branch and bound (ICML §11.1, fastText's search): a beam search of
        width k gives k labels and a bound; then the tree is explored level by level, keeping a
        node only while its path log-probability is above the current k-th best label, which is
        exact because a node's path probability bounds every label below it.
        ``method="beam"``: beam search of width ``beam`` (default k; a width below k is widened to
        k), approximate.

        Raises TypeError for a non-integer ``k`` or ``beam``, ValueError for ``k`` outside 1..K,
        ``beam < 1``, an unknown ``method``, or a bad ``input`` (as :meth:`forward`). An empty
        batch gives [0, k] values and indices.
        """
        _check_input(input, self.in_features, self.weight)
        _check_k(k, self.num_labels, method, beam)
        k = int(k)
        values, indices, visited = self._beam_search(input, k, max(beam or k, k))
        if method == "beam":
            return TopK(values, indices, visited)
        batch = input.shape[0]
        ex = torch.arange(batch, device=input.device)
        node = torch.zeros(batch, dtype=torch.long, device=input.device)
        score = torch.zeros(batch, dtype=input.dtype, device=input.device)
        while ex.numel():
            visited += torch.bincount(ex, minlength=batch)
            cand, kids, labs, leaf, inner = self._expand(input, ex, node, score)
            ex_rep = ex[:, None].expand_as(cand)
            take = leaf & (cand > values[ex, -1][:, None])
            values, indices = _merge_topk(values, indices, ex_rep[take], labs[take], cand[take])
            keep = inner & (cand > values[ex, -1][:, None])
            ex, node, score = ex_rep[keep], kids[keep], cand[keep]
        return TopK(values, indices, visited)

    def _expand(self, input: Tensor, ex: Tensor, node: Tensor, score: Tensor):
        cand = score[:, None] + self._pair_log_softmax(input, ex.cpu().numpy(), node.cpu().numpy())
        kids, labs, usable = self.child_node[node], self.child_label[node], self.slot_mask[node]
        leaf = (labs >= 0) & usable
        inner = (kids >= 0) & usable
        return cand, kids, labs, leaf, inner

    def _beam_search(self, input: Tensor, k: int, beam: int) -> tuple[Tensor, Tensor, Tensor]:
        batch = input.shape[0]
        device = input.device
        values = torch.full((batch, k), -math.inf, dtype=input.dtype, device=device)
        indices = torch.full((batch, k), -1, dtype=torch.long, device=device)
        visited = torch.zeros(batch, dtype=torch.long, device=device)
        ex = torch.arange(batch, device=device)
        node = torch.zeros(batch, dtype=torch.long, device=device)
        score = torch.zeros(batch, dtype=input.dtype, device=device)
        while ex.numel():
            visited += torch.bincount(ex, minlength=batch)
            cand, kids, labs, leaf, inner = self._expand(input, ex, node, score)
            ex_rep = ex[:, None].expand_as(cand)
            values, indices = _merge_topk(values, indices, ex_rep[leaf], labs[leaf], cand[leaf])
            e, n, s = ex_rep[inner], kids[inner], cand[inner]
            if e.numel() == 0:
                break
            order = torch.argsort(s, descending=True, stable=True)
            e, n, s = e[order], n[order], s[order]
            order = torch.argsort(e, stable=True)
            e, n, s = e[order], n[order], s[order]
            counts = torch.bincount(e, minlength=batch)
            rank = torch.arange(e.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[e]
            sel = rank < beam
            ex, node, score = e[sel], n[sel], s[sel]
        return values, indices, visited

    # ------------------------------------------------------------------ the tree in the state dict
    #
    # A learned tree is as much part of the model as the node parameters (the parameters of node n
    # mean nothing under another tree), so ``state_dict()`` carries it, as torch's "extra state"
    # (key ``<prefix>_extra_state``): one 1-D int64 tensor, ``[header, child_node, child_label]``,
    # 2 N M + 9 integers (4.5 MB at K = 250k, M = 65, beside the weights' 223 MB at d = 200). A
    # tensor rather than a dict: ``torch.load(weights_only=True)`` takes it, and so does code that
    # maps every entry of a state dict through ``.double()`` / ``.to(...)`` (the header's small
    # numbers survive a cast to float64, or to float32 below 2**24; a checksum says whether they did).

    def get_extra_state(self) -> Tensor:
        """The tree, for ``state_dict()`` (see :meth:`set_extra_state`)."""
        tree = self.tree
        body = np.concatenate([tree.child_node.ravel(), tree.child_label.ravel()]).astype(np.int64)
        header = np.array([_TREE_MAGIC, _TREE_VERSION, tree.num_labels, tree.num_nodes, tree.arity,
                           -1 if tree.depth_limit is None else tree.depth_limit, self.in_features, 0, 0],
                          dtype=np.int64)
        crc = _tree_checksum(header, body)
        header[-2:] = crc >> 16, crc & 0xFFFF
        return torch.from_numpy(np.concatenate([header, body]))

    def _tree_from_state(self, state: Any) -> Tree:
        """Decode :meth:`get_extra_state`'s tensor; ValueError when it is not one, is damaged, or
        describes a layer of another shape (both shapes named)."""
        if not isinstance(state, Tensor) or state.dim() != 1 or state.numel() < _TREE_HEADER:
            raise ValueError("not the tree of an hsm.HierarchicalSoftmax (expected the 1-D tensor that "
                             f"HierarchicalSoftmax.state_dict() writes, got {type(state).__name__})")
        values = state.detach().cpu()
        if values.is_floating_point():  # a state dict cast entry by entry: the checksum says if it survived
            values = values.double().round()
        values = values.to(torch.int64).numpy()
        header, body = values[:_TREE_HEADER], values[_TREE_HEADER:]
        if header[0] != _TREE_MAGIC or header[1] != _TREE_VERSION:
            raise ValueError(f"not the tree of an hsm.HierarchicalSoftmax (format {header[:2].tolist()}, expected "
                             f"{[_TREE_MAGIC, _TREE_VERSION]})")
        num_labels, num_nodes, arity, depth, in_features = (int(v) for v in header[2:7])
        crc = (int(header[7]) << 16) | int(header[8])
        if num_nodes < 1 or arity < 2 or body.size != 2 * num_nodes * arity or _tree_checksum(header, body) != crc:
            raise ValueError("the tree in the state dict is damaged (its checksum does not match): was the state "
                             "dict cast to a low-precision dtype, or edited?")
        saved = f"K={num_labels}, M={arity}, N={num_nodes}, in_features={in_features}"
        mine = f"K={self.num_labels}, M={self.arity}, N={self.num_nodes}, in_features={self.in_features}"
        if saved != mine:
            raise ValueError(f"the state dict holds a layer with {saved}; this layer has {mine}: build the layer "
                             "on a tree of the saved shape (any such tree: the saved one replaces it)")
        size = num_nodes * arity
        # label names name label ids, which no tree change renumbers: they are not saved, and the
        # loaded tree keeps this layer's
        names = self.tree.label_names
        return Tree(body[:size].reshape(num_nodes, arity), body[size:].reshape(num_nodes, arity), num_labels,
                    depth_limit=None if depth < 0 else depth, label_names=names)

    def set_extra_state(self, state: Any) -> None:
        """Install the tree :meth:`get_extra_state` saved, through :meth:`set_tree` (so every
        derived table follows). When a :class:`~hsm.TreeLearner` is attached, its statistics follow
        the tree too (as after a re-assignment, without decay); load the learner's own
        ``state_dict`` to restore them."""
        pending = self.__dict__.pop("_pending_tree", None)
        tree = pending[1] if pending is not None and pending[0] is state else self._tree_from_state(state)
        if tree == self.tree:
            return
        self.set_tree(tree)
        if self.statistics is not None:
            self.statistics.on_reassign(tree, apply_decay=False)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        """torch's hook, extended: the saved tree is decoded and checked *before* any parameter is
        copied (a tree of another shape loads nothing and is reported as torch reports a size
        mismatch: ``load_state_dict`` raises RuntimeError with our message); a state dict without
        a tree (saved before the tree was part of it) loads with a warning, keeping this layer's."""
        key = prefix + "_extra_state"
        if key in state_dict:
            try:
                self.__dict__["_pending_tree"] = (state_dict[key], self._tree_from_state(state_dict[key]))
            except ValueError as error:
                error_msgs.append(f"{key}: {error}")
                return
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                          unexpected_keys, error_msgs)
        finally:
            self.__dict__.pop("_pending_tree", None)
        if key not in state_dict:
            if key in missing_keys:
                missing_keys.remove(key)
            if prefix + "weight" in state_dict:
                warnings.warn(f"the state dict has no tree ({key!r}: saved by an older hsm?): the layer keeps its "
                              f"tree, {self.tree!r}; if the parameters were trained with another (learned) tree, "
                              "call layer.set_tree(that tree) or the parameters are read under the wrong tree",
                              stacklevel=_caller_outside_torch())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, {self.tree!r}, sparse={self.sparse}"


class FlatSoftmax(nn.Module):
    """The flat softmax ``softmax(W h + b)`` over K labels, with the same interface (the baseline
    the tree is measured against: O(K d) per example).

    Bad input is refused as :class:`HierarchicalSoftmax` refuses it (TypeError for another dtype,
    ValueError for another shape or device and for NaN / infinite rows); an empty batch gives
    empty outputs and a NaN loss, as torch's losses do."""

    def __init__(self, in_features: int, num_labels: int, bias: bool = True) -> None:
        super().__init__()
        in_features, num_labels = check_integer(in_features, "in_features"), check_integer(num_labels, "num_labels")
        if in_features < 1:
            raise ValueError(f"in_features must be >= 1, got {in_features}")
        if num_labels < 2:
            raise ValueError(f"num_labels K must be >= 2, got {num_labels}")
        self.in_features = in_features
        self._num_labels = num_labels
        self.linear = nn.Linear(in_features, num_labels, bias=bias)

    @property
    def num_labels(self) -> int:
        return self._num_labels

    def forward(self, input: Tensor, target: Tensor) -> HSMOutput:
        _check_input(input, self.in_features, self.linear.weight)
        _check_target(target, input.shape[0], self.num_labels)
        log_probs = torch.log_softmax(self.linear(input), dim=-1)
        output = log_probs.gather(1, target[:, None]).squeeze(1)
        return HSMOutput(output, -output.mean())

    def log_prob(self, input: Tensor) -> Tensor:
        _check_input(input, self.in_features, self.linear.weight)
        return torch.log_softmax(self.linear(input), dim=-1)

    @torch.no_grad()
    def predict(self, input: Tensor) -> Tensor:
        _check_input(input, self.in_features, self.linear.weight)
        return self.linear(input).argmax(dim=-1)

    @torch.no_grad()
    def topk(self, input: Tensor, k: int = 1, method: str = "exact", beam: int | None = None) -> TopK:
        """The k most likely labels (exact; ``method`` and ``beam`` are checked as
        :meth:`HierarchicalSoftmax.topk` checks them, and otherwise ignored)."""
        _check_input(input, self.in_features, self.linear.weight)
        _check_k(k, self.num_labels, method, beam)
        values, indices = self.log_prob(input).topk(int(k), dim=-1)
        visited = torch.full((input.shape[0],), self.num_labels, dtype=torch.long, device=input.device)
        return TopK(values, indices, visited)


# ---------------------------------------------------------------------------- optimiser
def _strictly_increasing(indices: Tensor) -> bool:
    """Distinct rows, cheaply: the layer's gradients list each node once, in increasing order
    (autograd's accumulation drops the coalesced flag, and ``torch.unique`` costs a sort)."""
    if indices.numel() < 2:
        return True
    if indices.device.type == "cpu":
        rows = indices.numpy()
        return bool((rows[1:] > rows[:-1]).all())
    return bool((indices[1:] > indices[:-1]).all()) or torch.unique(indices).numel() == indices.numel()


def _check_hyperparameter(optimizer: str, name: str, value: Any, positive: bool = False) -> float:
    """A finite real number >= 0 (> 0 with ``positive``) as a float. TypeError for a non-number
    (bool included), ValueError naming the setting otherwise: torch's optimisers accept NaN (SGD)
    or infinity and then train on NaN parameters without a word."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"invalid {optimizer} settings: {name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"invalid {optimizer} settings: {name}={value} (must be finite and {bound})")
    return value


def _check_no_weight_decay(optimizer: str, weight_decay: Any) -> None:
    """Weight decay would touch every row at every step, which is what these optimisers avoid:
    accepted only as 0 (so code written for torch's optimisers that passes 0 runs unchanged)."""
    if _check_hyperparameter(optimizer, "weight_decay", weight_decay) != 0:
        raise ValueError(f"invalid {optimizer} settings: weight_decay={weight_decay} is not supported (it would "
                         f"update every row at every step); use torch.optim.{optimizer} for weight decay")


class _RowSparseOptimizer(torch.optim.Optimizer):
    """The loop both row-sparse optimisers share: every parameter with a gradient gets
    :meth:`_update` (``torch.optim``'s ``step`` protocol, closure included)."""

    _name = ""  #: the torch optimiser's name, for messages
    _settings: tuple[tuple[str, bool], ...] = ()  #: (setting, must be > 0 rather than >= 0)

    def add_param_group(self, param_group: dict) -> None:
        """torch's, plus the settings check on the group's own values (a group may override the
        defaults: ``[{"params": ..., "lr": ...}]``)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for name, positive in self._settings:
            group[name] = _check_hyperparameter(self._name, name, group[name], positive=positive)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, param.grad, group)
        return loss

    def _update(self, param: Tensor, grad: Tensor, group: dict) -> None:
        raise NotImplementedError


class RowSparseAdagrad(_RowSparseOptimizer):
    """``torch.optim.Adagrad`` (the papers' optimiser) with a fast path for row-sparse gradients.

    Same update and defaults as ``torch.optim.Adagrad`` (weight decay excepted): per element,
    ``state += g**2`` and ``param -= lr_t g / (sqrt(state) + eps)`` with
    ``lr_t = lr / (1 + (t - 1) lr_decay)``. For a sparse COO gradient (what
    ``HierarchicalSoftmax(sparse=True)`` produces) only the touched rows are read and written, in
    one fused pass (a numba kernel on CPU; torch ``index_select`` / ``index_copy_`` /
    ``index_add_`` elsewhere), where ``torch.optim.Adagrad``'s sparse path builds several sparse
    temporaries and takes several times as long. Dense gradients get the same update, in one
    compiled pass for contiguous float32 / float64 CPU tensors (torch's in-place ops elsewhere).
    tests/test_layers.py checks it against ``torch.optim.Adagrad`` step by step.

    Raises ValueError (naming the setting) unless ``lr`` is finite and > 0 and ``lr_decay``,
    ``initial_accumulator_value`` and ``eps`` are finite and >= 0, in the defaults and in every
    parameter group; TypeError for a non-number. ``weight_decay`` is accepted only as 0.
    """

    _name = "Adagrad"
    _settings = (("lr", True), ("lr_decay", False), ("initial_accumulator_value", False), ("eps", False))

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10) -> None:
        lr = _check_hyperparameter("Adagrad", "lr", lr, positive=True)
        lr_decay = _check_hyperparameter("Adagrad", "lr_decay", lr_decay)
        initial_accumulator_value = _check_hyperparameter("Adagrad", "initial_accumulator_value",
                                                          initial_accumulator_value)
        eps = _check_hyperparameter("Adagrad", "eps", eps)
        _check_no_weight_decay("Adagrad", weight_decay)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      initial_accumulator_value=initial_accumulator_value))
        for group in self.param_groups:
            for param in group["params"]:
                self.state[param]["step"] = 0
                # the constructor's value, not the group's: torch.optim.Adagrad does the same
                self.state[param]["sum"] = torch.full_like(param, initial_accumulator_value,
                                                           memory_format=torch.preserve_format)

    def fuse(self, layer: "HierarchicalSoftmax") -> None:
        """Apply this optimiser's update of ``layer``'s weight and bias inside the layer's
        compiled backward (float32 CPU), node by node, while each node's gradient row is in
        cache: the same update bit for bit, without writing the batch's gradient rows and
        reading them back (two of the seven passes over the touched node blocks that a step with
        a separate ``step()`` makes; tests/test_layers.py compares parameters and state with the
        unfused optimiser and with ``torch.optim.Adagrad``).

        The layer's parameters then get no ``.grad`` from such a backward, and ``step()`` (which
        skips parameters without a gradient) does not touch them again; their step count advances
        in the backward. Fuse only where nothing reads or changes the gradients between
        ``backward()`` and ``step()`` (an L2 term added to them, clipping, averaging across
        processes), call ``zero_grad(set_to_none=True)`` (torch's default), and do not run two
        backward passes per step. Other paths (the layer's PyTorch path, float64, other
        devices) produce gradients as usual. ``layer.fused_optimizer = None`` undoes it.

        Raises TypeError unless ``layer`` is an :class:`HierarchicalSoftmax`; ValueError unless
        its weight (and bias) are parameters of this optimiser, in one parameter group."""
        if not isinstance(layer, HierarchicalSoftmax):
            raise TypeError(f"layer must be an hsm.HierarchicalSoftmax, got {type(layer).__name__}")
        groups = [self._group_of(p) for p in (layer.weight, layer.bias) if p is not None]
        if any(g is None for g in groups):
            raise ValueError("the layer's weight and bias must be parameters of this optimiser to fuse its update")
        if any(g is not groups[0] for g in groups):
            raise ValueError("the layer's weight and bias must be in one parameter group to fuse their update")
        layer.fused_optimizer = self

    def _group_of(self, param: Tensor) -> dict | None:
        return next((g for g in self.param_groups if any(p is param for p in g["params"])), None)

    def _fused_settings(self, weight: Tensor, bias: Tensor | None):
        """For :meth:`fuse`'s backward: count the step of ``weight`` (and ``bias``) and return the
        kernel's ``(bias, state_weight, state_bias, clr, eps)`` as numpy views, or None (nothing
        counted) where the compiled update does not apply (then the gradients are returned)."""
        params = [p for p in (weight, bias) if p is not None]
        group = self._group_of(weight)
        if (group is None or any(self._group_of(p) is not group for p in params)
                or any(p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous() for p in params)
                or any(not self.state[p]["sum"].is_contiguous() for p in params)
                or len({self.state[p]["step"] for p in params}) != 1):
            return None
        for p in params:
            self.state[p]["step"] += 1
        step = self.state[weight]["step"]
        clr = np.float32(group["lr"] / (1 + (step - 1) * group["lr_decay"]))  # as _update computes it
        no_bias = np.empty((0, 1), dtype=np.float32)
        return (bias.detach().numpy() if bias is not None else no_bias, self.state[weight]["sum"].numpy(),
                self.state[bias]["sum"].numpy() if bias is not None else no_bias, clr, np.float32(group["eps"]))

    def _update(self, param: Tensor, grad: Tensor, group: dict) -> None:
        state = self.state[param]
        state["step"] += 1
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        total = state["sum"]
        if grad.is_sparse:
            self._sparse_step(param, total, grad, clr, group["eps"])
        elif (param.device.type == "cpu" and param.dtype in (torch.float32, torch.float64) and grad.dtype == param.dtype
              and param.is_contiguous() and total.is_contiguous() and grad.is_contiguous()):
            # one compiled pass (torch's update reads and writes parameter-sized tensors four times:
            # 0.19 ms for the LM's 160k-element R against about 0.04 ms, development measurement)
            dtype = np.float32 if param.dtype == torch.float32 else np.float64
            kernels.run_adagrad_dense(param.view(-1).numpy(), total.view(-1).numpy(), grad.view(-1).numpy(),
                                      dtype(clr), dtype(group["eps"]))
        else:
            total.addcmul_(grad, grad, value=1)
            param.addcdiv_(grad, total.sqrt().add_(group["eps"]), value=-clr)

    @staticmethod
    def _sparse_step(param: Tensor, total: Tensor, grad: Tensor, clr: float, eps: float) -> None:
        indices = grad._indices()[0]
        values = grad._values()
        if not grad.is_coalesced() and not _strictly_increasing(indices):
            grad = grad.coalesce()  # duplicate rows must be summed before squaring
            indices, values = grad._indices()[0], grad._values()
        flat_param = param.view(param.shape[0], -1)
        flat_total = total.view(total.shape[0], -1)
        values = values.reshape(values.shape[0], flat_param.shape[1])  # (not -1: there may be no rows)
        if (param.device.type == "cpu" and param.dtype in (torch.float32, torch.float64)
                and param.is_contiguous() and total.is_contiguous()):
            dtype = np.float32 if param.dtype == torch.float32 else np.float64
            kernels.run_adagrad_rows(flat_param.numpy(), flat_total.numpy(), indices.contiguous().numpy(),
                                     values.contiguous().numpy(), dtype(clr), dtype(eps))
            return
        rows = flat_total.index_select(0, indices).addcmul_(values, values)
        flat_total.index_copy_(0, indices, rows)
        flat_param.index_add_(0, indices, values / rows.sqrt_().add_(eps), alpha=-clr)


class RowSparseSGD(_RowSparseOptimizer):
    """Plain SGD, ``param -= lr * grad`` (the fastText-style models' optimiser), with a fast path
    for row-sparse gradients.

    ``torch.optim.SGD`` applies a sparse gradient with ``param.add_(grad)``, which first coalesces
    it (a sort of its rows: autograd's accumulation drops the coalesced flag the layer sets) and
    takes 2.7 ms per step at V = 250k, M = 63 here, longer than the forward and backward together.
    The update is linear in the gradient, so rows listed twice may simply both be added: one
    ``index_add_`` of the touched rows (0.7 ms). No momentum or weight decay: with sparse
    gradients they would have to touch every row. tests/test_layers.py checks it against
    ``torch.optim.SGD``. Raises ValueError unless ``lr`` is finite and > 0 (``torch.optim.SGD``
    accepts NaN), in the defaults and in every parameter group; TypeError for a non-number.
    ``weight_decay`` is accepted only as 0.
    """

    _name = "SGD"
    _settings = (("lr", True),)

    def __init__(self, params, lr: float = 1e-2, weight_decay: float = 0.0) -> None:
        lr = _check_hyperparameter("SGD", "lr", lr, positive=True)
        _check_no_weight_decay("SGD", weight_decay)
        super().__init__(params, dict(lr=lr))

    def _update(self, param: Tensor, grad: Tensor, group: dict) -> None:
        if grad.is_sparse:
            values = grad._values()
            flat = param.view(param.shape[0], -1)
            flat.index_add_(0, grad._indices()[0], values.reshape(values.shape[0], flat.shape[1]), alpha=-group["lr"])
        else:
            param.add_(grad, alpha=-group["lr"])
