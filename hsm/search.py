"""Search in the label tree: the most likely labels of :class:`hsm.HierarchicalSoftmax`.

A node's path probability ``prod over the path of softmax(W_n h + b_n)[c]`` (eq. 5 stopped at the
node) bounds the probability of every label below it, so a search that drops a node whose path
log-probability is below the best label found so far is exact (branch and bound, ICML supplement
§11.1, fastText's ``HierarchicalSoftmaxLoss::dfs``):

* :func:`top1_search`: the exact most likely label; a greedy descent (follow the most likely
  child) gives a first label and so the bound, then the tree is explored level by level;
* :func:`exact_topk`: the exact k most likely labels; a beam search of width k gives the bound;
* :func:`beam_search`: beam search of a given width (approximate).

These are the PyTorch implementations (any device, any dtype); the float32 CPU top-1 runs in the
compiled :func:`hsm.kernels.top1_search` (the same greedy bound, then depth first, one example at a
time), and the float32 CPU top-k for k >= 2 in the compiled best-first search
:func:`hsm.kernels.topk_search` (a priority queue of open nodes and labels keyed by their path
log-probability: labels come out best first, and only the nodes above the k-th label are
evaluated). The PyTorch functions take the layer and evaluate nodes through its grouped node
softmax (:func:`hsm.backend.pair_log_softmax`).

:func:`all_log_probs` is the search that prunes nothing: every label's log-probability, in the
compiled :func:`hsm.kernels.all_log_probs` (each node's log-softmax once per example, accumulated
down the tree), for :meth:`hsm.HierarchicalSoftmax.log_prob` where the kernels apply.

Why three searches and not one: the top-1 search reuses its greedy descent's node distributions
(a node is evaluated, and counted in ``nodes visited``, once), while :func:`exact_topk` counts the
beam search's evaluations and its own (the committed classification results report that count);
folding either into the other would change the counts the benchmark and the results report. The
compiled top-1 cannot call PyTorch code from its nogil loop. For the same reason a top-1 asked of
:func:`exact_topk` keeps the PyTorch search (the classification results report its count); from
k = 2 the compiled search's count is the nodes it evaluated, each once.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from . import kernels
from ._checks import check_logits_finite
from .backend import KERNELS, TreeLayer, in_compute_dtype, needs_graph, pair_log_softmax, select_backend

__all__ = ["all_log_probs", "beam_search", "best_first", "exact_topk", "merge_topk", "top1", "top1_search",
           "topk_lowest_id"]


def best_first(values: Tensor, ids: Tensor, dim: int = -1) -> Tensor:
    """The permutation along ``dim`` that puts ``values`` best first and equal values in order of
    ``ids`` (the lowest first), the rule every search of the layers follows: a stable sort by id,
    then a stable sort by value. ``values`` and ``ids`` have one shape; fixed-shape ops only."""
    by_id = torch.argsort(ids, dim=dim, stable=True)
    by_value = torch.argsort(values.gather(dim, by_id), dim=dim, descending=True, stable=True)
    return by_id.gather(dim, by_value)


def topk_lowest_id(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``(values [B, k], indices [B, k])``: the k largest ``scores`` [B, K] of each row, best first,
    equal values ordered by index (the lowest first), the rule every search of the layers follows.
    ``torch.topk`` leaves the order of equal values unspecified; this costs one ``torch.topk`` and a
    comparison of the row with its k-th value, plus a sort of the few entries tied with it."""
    values, indices = scores.topk(k, dim=-1)
    if scores.shape[0] == 0:
        return values, indices
    # every entry at least the k-th value (k of them, more with ties), in (row, index) order
    example, index = torch.nonzero(scores >= values[:, -1:], as_tuple=True)
    kept = scores[example, index]
    order = torch.argsort(kept, descending=True, stable=True)  # equal values keep index order
    example, index, kept = example[order], index[order], kept[order]
    order = torch.argsort(example, stable=True)
    example, index, kept = example[order], index[order], kept[order]
    counts = torch.bincount(example, minlength=scores.shape[0])
    rank = torch.arange(example.numel(), device=scores.device) - (torch.cumsum(counts, 0) - counts)[example]
    first = rank < k
    out_v, out_i = values.clone(), indices.clone()  # a row holding NaN keeps torch.topk's answer
    out_v[example[first], rank[first]] = kept[first]
    out_i[example[first], rank[first]] = index[first]
    return out_v, out_i


def merge_topk(best_v: Tensor, best_i: Tensor, ex: Tensor, labels: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Merge candidate (example, label, value) triples into per-example top-k lists (no duplicates)."""
    batch, k = best_v.shape
    if ex.numel() == 0:
        return best_v, best_i
    all_e = torch.cat([torch.arange(batch, device=ex.device).repeat_interleave(k), ex])
    all_v = torch.cat([best_v.reshape(-1), values])
    all_i = torch.cat([best_i.reshape(-1), labels])
    real = all_i >= 0
    all_e, all_v, all_i = all_e[real], all_v[real], all_i[real]
    # drop a label found again for the same example, keeping the value it was first found with
    # (the list's): evaluated again in another batch of nodes, it may differ in the last bits
    key = all_e * (int(all_i.max()) + 1) + all_i
    key_sorted, key_order = torch.sort(key, stable=True)
    first = torch.ones_like(key_sorted, dtype=torch.bool)
    first[1:] = key_sorted[1:] != key_sorted[:-1]
    keep = key_order[first].sort().values
    all_e, all_v, all_i = all_e[keep], all_v[keep], all_i[keep]
    # best first, equal values ordered by label id (the lowest first), the one rule of every
    # search and engine
    order = best_first(all_v, all_i, 0)
    all_e, all_v, all_i = all_e[order], all_v[order], all_i[order]
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



#: the decoders' entry points under ``torch.autocast``: a bf16 input is decoded in the layer's dtype,
#: as the layer's own ``predict`` and ``topk`` do
_decoder_entry = in_compute_dtype(lambda layer: layer.weight.dtype)

@_decoder_entry
@torch.no_grad()
def top1(layer: TreeLayer, input: Tensor) -> tuple[Tensor, Tensor]:
    """``(labels [B], nodes visited [B])``: the exact most likely label of each row of ``input``
    [B, d], in the engine the layer uses for it (:func:`hsm.backend.select_backend`): the compiled
    :func:`hsm.kernels.top1_search` on float32 CPU tensors, :func:`top1_search` otherwise. Both run
    the same greedy bound, then branch and bound. Raises :class:`hsm.NonFiniteInputError` naming
    the rows whose node logits overflow."""
    if input.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.long, device=input.device)
        return empty, empty.clone()
    operands = _kernel_operands(layer, input)
    if operands is None:
        return top1_search(layer, input)
    tables = layer.tables
    labels, values, visited = kernels.run_top1_search(*operands, tables.child_node, tables.child_label,
                                                      tables.lowest_label, tables.paths[0].shape[1])
    # a NaN value: a node the search evaluated had overflowing logits (kernels.top1_search)
    check_logits_finite(np.flatnonzero(~np.isfinite(values)), input.shape[0], input.dtype)
    return torch.from_numpy(labels), torch.from_numpy(visited)


@_decoder_entry
@torch.no_grad()
def top1_search(layer: TreeLayer, input: Tensor) -> tuple[Tensor, Tensor]:
    """(labels [B], nodes visited per row [B]) of the exact most likely label of each row of
    ``input`` [B, d] (B >= 1): a greedy descent gives each row a label and so a lower bound on the
    best log-probability; then the tree is explored level by level from the root, keeping a node
    only while its path log-probability is not below the row's best label so far. Equal
    log-probabilities go to the lowest label id, as in the compiled search. The node
    distributions of the greedy descent are reused, not evaluated (or counted) twice."""
    batch, device = input.shape[0], input.device
    child_node, child_label, slot_mask = layer.tree.child_node, layer.tree.child_label, layer.tree.slot_mask
    num_labels = layer.num_labels
    lowest = layer.tables.lowest_label
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
        row_best = values.amax(dim=1)
        ex_t = torch.from_numpy(example).to(device)
        # equal log-probabilities go to the lowest label id: the smallest label of the row's best
        # value, then the smallest over the pairs of an example that reach the example's best
        ids = torch.from_numpy(child_label[node]).to(device)
        big = torch.iinfo(torch.long).max
        row_label = torch.where((values == row_best[:, None]) & leaf, ids, big).amin(dim=1)
        new_best = best_value.clone().scatter_reduce_(0, ex_t, row_best, reduce="amax")
        reaches = torch.isfinite(row_best) & (row_best == new_best[ex_t])
        if bool(reaches.any()):
            candidate = torch.where(best_value == new_best, best_label, big)  # the old best still ties
            candidate = candidate.scatter_reduce_(0, ex_t[reaches], row_label[reaches], reduce="amin")
            changed = candidate != big
            best_label[changed] = candidate[changed]
        best_value.copy_(new_best)

    # greedy descent: a label per row, hence a bound; the node distributions it computes are
    # kept (per depth) so the exact search below does not evaluate those nodes again
    greedy_node: list[np.ndarray] = []
    greedy_cand: list[Tensor] = []
    example, node = np.arange(batch), np.zeros(batch, dtype=np.int64)
    score = input.new_zeros(batch)
    while example.size:
        visited += np.bincount(example, minlength=batch)
        cand = score.unsqueeze(1) + pair_log_softmax(layer, input, example, node)
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
        cand = input.new_empty(example.size, layer.arity)
        if cached.any():
            rows_from_greedy = torch.from_numpy(example[cached]).to(device)
            cand[torch.from_numpy(cached).to(device)] = greedy_cand[depth][rows_from_greedy]
        if not cached.all():
            fresh = ~cached
            visited += np.bincount(example[fresh], minlength=batch)
            fresh_t = torch.from_numpy(fresh).to(device)
            cand[fresh_t] = score[fresh_t].unsqueeze(1) + pair_log_softmax(layer, input, example[fresh], node[fresh])
            update_best(example[fresh], node[fresh], cand[fresh_t])
        ex_t = torch.from_numpy(example).to(device)
        # a subtree whose path log-probability equals the best may hold a tied label of lower id
        # (every step below of log-probability 0, as float32 rounds an all but certain child)
        bound = best_value[ex_t].unsqueeze(1)
        lower = torch.from_numpy(lowest[np.maximum(child_node[node], 0)]).to(device) < best_label[ex_t].unsqueeze(1)
        keep = torch.from_numpy(is_node[node]).to(device) & ((cand > bound) | ((cand == bound) & lower))
        pair, slot = (t.cpu().numpy() for t in torch.nonzero(keep, as_tuple=True))
        score = cand[keep]
        example, node = example[pair], child_node[node[pair], slot]
        depth += 1
    return best_label, torch.from_numpy(visited).to(device)


@_decoder_entry
@torch.no_grad()
def exact_topk(layer: TreeLayer, input: Tensor, k: int, beam: int) -> tuple[Tensor, Tensor, Tensor]:
    """(values [B, k], labels [B, k], nodes visited [B]): the exact k most likely labels. A beam
    search of width ``beam`` (>= k) gives k labels and a bound; then the tree is explored level by
    level, keeping a node only while its path log-probability is above the current k-th best label.
    ``nodes_visited`` counts the beam search's evaluations and the exploration's (a node evaluated
    by both counts twice).

    From k = 2 on float32 CPU tensors (where the layer uses the compiled kernels) the search is
    :func:`hsm.kernels.topk_search` instead (best first, ``beam`` unused): the same labels and
    values (to float32 rounding; equal values ordered by label id), ``nodes_visited`` the nodes it
    evaluated. A row whose node logits overflow raises :class:`hsm.NonFiniteInputError` on both."""
    if k >= 2 and input.shape[0] > 0:
        operands = _kernel_operands(layer, input)
        if operands is not None:
            tables = layer.tables
            values, labels, visited = kernels.run_topk_search(*operands, tables.child_node, tables.child_label, k,
                                                              tables.paths[0].shape[1])
            check_logits_finite(np.flatnonzero(np.isnan(values).any(axis=1)), input.shape[0], input.dtype)
            return torch.from_numpy(values), torch.from_numpy(labels), torch.from_numpy(visited)
    values, indices, visited = beam_search(layer, input, k, beam)
    lowest = torch.from_numpy(layer.tables.lowest_label).to(input.device)
    batch = input.shape[0]
    example = torch.arange(batch, device=input.device)
    node = torch.zeros(batch, dtype=torch.long, device=input.device)
    score = torch.zeros(batch, dtype=input.dtype, device=input.device)
    while example.numel():
        visited += torch.bincount(example, minlength=batch)
        candidate, child_nodes, child_labels, leaf, inner = _expand(layer, input, example, node, score)
        example_of = example[:, None].expand_as(candidate)
        # a label tied with the k-th one goes in when its id is lower; so does a subtree tied with
        # it whose lowest label id is (each step below of log-probability 0 in float32)
        kth, kth_label = values[example, -1][:, None], indices[example, -1][:, None]
        take = leaf & ((candidate > kth) | ((candidate == kth) & (child_labels < kth_label)))
        values, indices = merge_topk(values, indices, example_of[take], child_labels[take], candidate[take])
        kth, kth_label = values[example, -1][:, None], indices[example, -1][:, None]
        lower = lowest[child_nodes.clamp(min=0)] < kth_label
        keep = inner & ((candidate > kth) | ((candidate == kth) & lower))
        example, node, score = example_of[keep], child_nodes[keep], candidate[keep]
    return values, indices, visited


def all_log_probs(layer: TreeLayer, input: Tensor) -> Tensor | None:
    """``log p(y | input[b])`` of every label [B, K] in the compiled kernels
    (:func:`hsm.kernels.all_log_probs`: each node's log-softmax once per row, summed down the tree,
    O(N M d) per row), or None where they do not apply: not float32 CPU tensors, or an autograd
    graph is needed (grad mode on and the input or the weights require grad; the kernels give no
    gradient), and the caller computes it in PyTorch. ``input`` [B, d], already checked. Raises
    :class:`hsm.NonFiniteInputError` naming the rows whose node logits overflow."""
    operands = _kernel_operands(layer, input)
    if operands is None or needs_graph(layer, input):
        return None
    if input.shape[0] == 0:
        return input.new_empty((0, layer.num_labels))
    tables = layer.tables
    out = kernels.run_all_log_probs(*operands, tables.child_node, tables.child_label, layer.num_labels)
    check_logits_finite(np.flatnonzero(np.isnan(out[:, 0])), input.shape[0], input.dtype)
    return torch.from_numpy(out)


def _kernel_operands(layer: TreeLayer, input: Tensor) -> tuple[np.ndarray, ...] | None:
    """``(h, weight, bias, penalty)`` as the compiled kernels take them, or None where the layer
    does not use the kernels for ``input`` (:func:`hsm.backend.select_backend`)."""
    if select_backend(layer, input) is not KERNELS:
        return None
    as_np = lambda tensor: tensor.detach().contiguous().numpy()  # noqa: E731
    return (as_np(input), as_np(layer.weight), KERNELS.operand(layer, layer.bias),
            KERNELS.operand(layer, layer.slot_penalty))


def _expand(layer: TreeLayer, input: Tensor, example: Tensor, node: Tensor,
            score: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One level of a search: for the (example, node) pairs with path log-probabilities ``score``
    [P], the children's path log-probabilities ``candidate`` [P, M] (score plus the node's
    log-softmax), the child node and child label of each slot, and which slots hold a label
    (``leaf``) and which an inner node (``inner``)."""
    candidate = score[:, None] + pair_log_softmax(layer, input, example.cpu().numpy(), node.cpu().numpy())
    child_nodes, child_labels, usable = layer.child_node[node], layer.child_label[node], layer.slot_mask[node]
    leaf = (child_labels >= 0) & usable
    inner = (child_nodes >= 0) & usable
    return candidate, child_nodes, child_labels, leaf, inner


@_decoder_entry
@torch.no_grad()
def beam_search(layer: TreeLayer, input: Tensor, k: int, beam: int) -> tuple[Tensor, Tensor, Tensor]:
    """(values [B, k], labels [B, k], nodes visited [B]) of a beam search of width ``beam``: level
    by level, every label met is merged into the row's top k, and the ``beam`` most likely inner
    nodes of the row go on (approximate; width 1 is the greedy descent)."""
    batch = input.shape[0]
    device = input.device
    values = torch.full((batch, k), -math.inf, dtype=input.dtype, device=device)
    indices = torch.full((batch, k), -1, dtype=torch.long, device=device)
    visited = torch.zeros(batch, dtype=torch.long, device=device)
    example = torch.arange(batch, device=device)
    node = torch.zeros(batch, dtype=torch.long, device=device)
    score = torch.zeros(batch, dtype=input.dtype, device=device)
    while example.numel():
        visited += torch.bincount(example, minlength=batch)
        candidate, child_nodes, child_labels, leaf, inner = _expand(layer, input, example, node, score)
        example_of = example[:, None].expand_as(candidate)
        values, indices = merge_topk(values, indices, example_of[leaf], child_labels[leaf], candidate[leaf])
        # the inner children, best first within each row, go on while their rank in the row < beam
        example, node, score = example_of[inner], child_nodes[inner], candidate[inner]
        if example.numel() == 0:
            break
        order = torch.argsort(score, descending=True, stable=True)
        example, node, score = example[order], node[order], score[order]
        order = torch.argsort(example, stable=True)
        example, node, score = example[order], node[order], score[order]
        counts = torch.bincount(example, minlength=batch)
        rank = torch.arange(example.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[example]
        kept = rank < beam
        example, node, score = example[kept], node[kept], score[kept]
    return values, indices, visited
