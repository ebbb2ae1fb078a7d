"""Compiled CPU kernels for the hierarchical softmax: eq. 5 / eq. 11, its gradients, search, Adagrad.

The book's performance chapter measures what they buy.

A tree-softmax training step evaluates ``P = B * L`` (example, path node) pairs. In PyTorch that
is a dozen small kernels per batch (gathers, a batched matmul per bucket of node groups, log-softmax,
scatters), and their fixed costs, not the arithmetic, dominate at the sizes that matter
(``P`` a few hundred, ``M * d`` a few thousand). These numba kernels do the same work in one pass
each, the way fastText's ``src/loss.cc`` does it (``HierarchicalSoftmaxLoss::forward`` walks the
path, ``computeOutput`` / ``update`` per node), but grouped by node so that a node shared by many
examples (the root: all B) has its ``[M, d]`` block read once and its gradient written once:

* :func:`group_pairs`: sort the pairs by node (stable), giving each unique node's pair range;
* :func:`path_forward`: logits ``W_n h_b + b_n`` of every pair, the node log-softmax, and
  ``log p(y_b | h_b) = sum over the path`` (eq. 5 / eq. 11);
* :func:`path_backward`: the gradients w.r.t. ``h``, the node weights (one ``[M*d]`` row per
  unique node, so the sparse gradient has no duplicates) and the biases, from the saved node
  softmax: ``d log p / d logit_m = onehot(child)_m - softmax_m`` per pair;
* :func:`top1_search`: the exact most likely label per example (greedy descent for a bound, then a
  depth-first branch and bound, ICML §11.1), one example at a time;
* :func:`topk_search`: the exact k most likely labels per example, best first (a queue of open
  nodes and labels keyed by path log-probability; each node evaluated at most once);
* :func:`all_log_probs`: the log-probabilities of all K labels, each node's log-softmax computed
  once per example and accumulated down the tree (O(N M d) per example, not O(K L M d));
* :func:`adagrad_rows`: the row-sparse Adagrad update (one pass over the touched rows);
  :func:`adagrad_dense` the same update for a dense gradient (one pass instead of torch's four);
* :func:`lbl_forward`, :func:`lbl_backward`, :func:`sum_rows_by_id`: the log-bilinear language
  model's representation and gradients (:class:`hsm.models.LogBilinearLM`), so that a whole LM
  training step runs on these threads and BLAS at one thread each, never waking torch's OpenMP
  workers (whose spinning after a parallel region slows the kernels that follow: see below).

Every kernel is checked against the plain PyTorch reference in ``tests/test_kernels.py`` and
``tests/test_layers.py`` (values, gradients, the arg max of ``log_prob``).

Threads: the kernels release the GIL (``nogil``) and the ``run_*`` functions run them on
``torch.get_num_threads()`` threads at once (this one and a small pool of Python threads woken
by a lock each, :class:`_Worker`). The forward, backward and search kernels take their groups
(rows) one at a time from a shared atomic cursor (:func:`_claim`), so a thread that starts late
or draws cheap groups takes more, and write per-pair results that are summed per example in a
fixed order afterwards (:func:`sum_by_example`): the results are the same bit for bit whatever
the thread count (tests/test_kernels.py). Not numba's ``parallel=True``: its OpenMP workers keep
spinning after a parallel region and slow torch's own kernels that follow by tens of milliseconds
on a machine with few cores (a 0.8 ms step became 60 ms on this project's 2-core machine); pool threads
sleep when idle.

Only ``float32`` contiguous CPU tensors take these paths (what training uses); other dtypes and
devices use the PyTorch implementation in :mod:`hsm.layers`.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numba
import numpy as np
import torch
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["batch_plan", "path_pairs", "group_pairs", "path_forward", "path_backward", "top1_search", "topk_search",
           "parents_first", "all_log_probs", "run_topk_search", "run_all_log_probs", "adagrad_rows",
           "adagrad_dense", "accumulate_statistics",
           "lbl_forward", "lbl_backward", "sum_rows_by_id", "run_lbl_forward", "run_lbl_backward",
           "run_path_forward", "run_path_backward", "run_top1_search", "lowest_labels", "run_adagrad_rows",
           "run_adagrad_dense"]

#: multiply-adds below which a batch runs on one thread (a hand-off to the pool costs ~20 us)
MIN_WORK_PER_THREAD = 250_000

# Re-association and contraction let LLVM vectorise the dot products and axpys (sums in another
# order: results differ from torch's in the last bits, well inside the tests' tolerances). Not
# "fast": that would also assume no infinities, and empty slots carry a -inf logit.
FASTMATH = {"reassoc", "contract", "arcp"}
# error_model="numpy" (division by zero gives inf, not a Python ZeroDivisionError): numba's check
# before every division otherwise keeps LLVM from vectorising the loop (7x on the Adagrad update)


@intrinsic
def _claim(typingctx, cursor):  # pragma: no cover - compiled
    """``old = cursor[0]; cursor[0] += 1`` as one atomic step (LLVM ``atomicrmw add``): the next
    unclaimed item for the thread that calls it, so threads share a batch's groups dynamically
    (a thread that starts late, or draws cheap groups, simply takes more of them)."""

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        data = context.make_array(array_type)(context, builder, args[0])
        address = cgutils.get_item_pointer(context, builder, array_type, data, [context.get_constant(types.intp, 0)],
                                           wraparound=False)
        return builder.atomic_rmw("add", address, context.get_constant(array_type.dtype, 1), "monotonic")

    return cursor.dtype(cursor), codegen


@numba.njit(cache=True, nogil=True)
def sum_by_example(values, example, out):  # pragma: no cover - compiled
    """``out[example[p]] += values[p]`` for p in order: per-pair results (a log-probability, an
    input-gradient row) summed per example in a fixed order, whichever thread computed them, so
    results do not depend on how the work was shared."""
    for p in range(values.shape[0]):
        out[example[p]] += values[p]


@numba.njit(cache=True, nogil=True)
def sum_rows_by_example(values, example, out):  # pragma: no cover - compiled
    """:func:`sum_by_example` for rows: ``out[example[p], :] += values[p, :]``, p in order."""
    for p in range(values.shape[0]):
        b = example[p]
        for k in range(values.shape[1]):
            out[b, k] += values[p, k]


@numba.njit(cache=True)
def path_pairs(labels, path_nodes, path_children, path_mask, full):  # pragma: no cover - compiled
    """(example, depth, node, child) of every step of the labels' paths that exists (``path_mask``;
    every step when ``full``), in (example, depth) order: the pairs eq. 5 sums over."""
    length = path_nodes.shape[1]
    count = labels.shape[0] * length
    if not full:
        count = 0
        for b in range(labels.shape[0]):
            for d in range(length):
                count += path_mask[labels[b], d]
    example = np.empty(count, dtype=np.int64)
    depth = np.empty(count, dtype=np.int64)
    node = np.empty(count, dtype=np.int64)
    child = np.empty(count, dtype=np.int64)
    q = 0
    for b in range(labels.shape[0]):
        y = labels[b]
        for d in range(length):
            if full or path_mask[y, d]:
                example[q] = b
                depth[q] = d
                node[q] = path_nodes[y, d]
                child[q] = path_children[y, d]
                q += 1
    return example, depth, node, child


@numba.njit(cache=True)
def batch_plan(labels, num_labels, path_nodes, path_children, path_mask, full):  # pragma: no cover - compiled
    """Everything the forward kernel needs to know about a batch's targets, in one call:
    ``(valid, example, depth, node, child, order, starts)`` from :func:`path_pairs` and
    :func:`group_pairs`. ``valid`` is False (and the arrays empty) when a label is outside
    ``0..num_labels-1``: the caller then names the bad label."""
    for b in range(labels.shape[0]):
        if labels[b] < 0 or labels[b] >= num_labels:
            none = np.empty(0, dtype=np.int64)
            return False, none, none, none, none, none, np.zeros(1, dtype=np.int64)
    example, depth, node, child = path_pairs(labels, path_nodes, path_children, path_mask, full)
    order, starts = group_pairs(node)
    return True, example, depth, node, child, order, starts


@numba.njit(cache=True)
def group_pairs(node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """(order, starts): ``order`` sorts the pairs by node (stable), and the pairs of the g-th
    unique node are ``order[starts[g]:starts[g + 1]]``."""
    order = np.argsort(node, kind="mergesort")
    count = node.shape[0]
    starts = np.empty(count + 1, dtype=np.int64)
    groups = 0
    for q in range(count):
        if q == 0 or node[order[q]] != node[order[q - 1]]:
            starts[groups] = q
            groups += 1
    starts[groups] = count
    return order, starts[: groups + 1].copy()


#: pairs from which a node's products go through BLAS (``np.dot``: OpenBLAS, via scipy) on a
#: gathered copy of the examples' rows, rather than the register-blocked loops: a node shared by
#: many examples (the root: all of them) is a small matrix product, which BLAS does 3x faster
#: (root of a batch of 128 at M = 63, d = 200: 40 us against 110 us on one core of a 2-core AMD EPYC)
BLAS_MIN_PAIRS = 16


@numba.njit(cache=True, nogil=True)
def _largest_group(starts):  # pragma: no cover - compiled
    """(pairs of the largest group, rows the BLAS path's scratch needs: that size, or 0 when no
    group reaches :data:`BLAS_MIN_PAIRS`)."""
    largest = 0
    for g in range(starts.shape[0] - 1):
        largest = max(largest, starts[g + 1] - starts[g])
    return largest, (largest if largest >= BLAS_MIN_PAIRS else 0)


@numba.njit(cache=True, nogil=True)
def _gather_rows(h, example, order, first, last, rows):  # pragma: no cover - compiled
    """``rows[q - first] = h[example[order[q]]]``: the node's examples, contiguous for BLAS."""
    for q in range(first, last):
        rows[q - first, :] = h[example[order[q]]]
    return rows[: last - first]


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _logits_of_group(h, weight, example, order, first, last, n, arity, logits, rows):  # pragma: no cover - compiled
    """``logits[q - first, m] = W_n[m] . h[example[order[q]]]`` for the pairs of one node.

    From :data:`BLAS_MIN_PAIRS` pairs on, one matrix product ``H_n W_n^T`` (``rows``: scratch
    for ``H_n``, at least as many rows as pairs). Otherwise register blocking: two examples against four rows of ``W_n`` at a time, eight independent
    sums sharing each load of ``W`` and ``h``, so a node shared by many examples (the root) runs
    at the FMA units' rate rather than at the cache's (1.4x over one example at a time)."""
    dim = h.shape[1]
    if last - first >= BLAS_MIN_PAIRS:
        block = weight[n].reshape(arity, dim)
        np.dot(_gather_rows(h, example, order, first, last, rows), block.T, logits[: last - first])
        return
    q = first
    while q < last:
        pair = q + 1 < last
        ba = example[order[q]]
        bb = example[order[q + 1]] if pair else ba
        r = q - first
        m = 0
        while m + 4 <= arity:
            b0, b1, b2, b3 = m * dim, (m + 1) * dim, (m + 2) * dim, (m + 3) * dim
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            c0 = np.float32(0.0)
            c1 = np.float32(0.0)
            c2 = np.float32(0.0)
            c3 = np.float32(0.0)
            if pair:
                for k in range(dim):
                    x = h[ba, k]
                    y = h[bb, k]
                    w0 = weight[n, b0 + k]
                    w1 = weight[n, b1 + k]
                    w2 = weight[n, b2 + k]
                    w3 = weight[n, b3 + k]
                    a0 += w0 * x
                    a1 += w1 * x
                    a2 += w2 * x
                    a3 += w3 * x
                    c0 += w0 * y
                    c1 += w1 * y
                    c2 += w2 * y
                    c3 += w3 * y
                logits[r + 1, m] = c0
                logits[r + 1, m + 1] = c1
                logits[r + 1, m + 2] = c2
                logits[r + 1, m + 3] = c3
            else:
                for k in range(dim):
                    x = h[ba, k]
                    a0 += weight[n, b0 + k] * x
                    a1 += weight[n, b1 + k] * x
                    a2 += weight[n, b2 + k] * x
                    a3 += weight[n, b3 + k] * x
            logits[r, m] = a0
            logits[r, m + 1] = a1
            logits[r, m + 2] = a2
            logits[r, m + 3] = a3
            m += 4
        while m < arity:
            base = m * dim
            acc = np.float32(0.0)
            acc2 = np.float32(0.0)
            for k in range(dim):
                acc += weight[n, base + k] * h[ba, k]
                acc2 += weight[n, base + k] * h[bb, k]
            logits[r, m] = acc
            if pair:
                logits[r + 1, m] = acc2
            m += 1
        q += 2 if pair else 1


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _add_offsets_and_max(row, bias, penalty, n, arity):  # pragma: no cover - compiled
    """Add node ``n``'s bias and slot penalty (each may be a [0, M] array: none) to ``row``
    (its M logits) and return the largest, the shift of a stable softmax."""
    if bias.shape[0] > 0:
        for m in range(arity):
            row[m] += bias[n, m]
    if penalty.shape[0] > 0:
        for m in range(arity):
            row[m] += penalty[n, m]
    top = row[0]
    for m in range(1, arity):
        top = max(top, row[m])
    return top


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def path_forward(h, weight, bias, penalty, example, node, child, order, starts, arity, node_prob, pair_log_prob,
                 cursor):  # pragma: no cover - compiled
    """Eq. 5 for every pair, grouped by node.

    ``h`` [B, d], ``weight`` [N, M*d], ``bias`` [N, M] (or shape [0, M]: no bias), ``penalty``
    [N, M] with -inf on empty slots (or shape [0, M]: a full tree); pairs ``example, node, child``
    [P]; ``order, starts`` from :func:`group_pairs`. Writes ``node_prob`` [P, M] (the node
    softmax of each pair; may have 0 rows when not needed: inference) and ``pair_log_prob`` [P]
    (``log p(child | node, h)``; their sum over an example's pairs is eq. 5, :func:`sum_by_example`).
    Groups are claimed one at a time from ``cursor`` (int64 [1], zeroed by the caller), so any
    number of threads may run this on the same batch (see :func:`run_path_forward`).
    """
    keep = node_prob.shape[0] > 0
    groups = starts.shape[0] - 1
    largest, scratch = _largest_group(starts)
    logits = np.empty((largest, arity), dtype=h.dtype)
    rows = np.empty((scratch, h.shape[1]), dtype=h.dtype)
    while True:
        g = _claim(cursor)
        if g >= groups:
            break
        first, last = starts[g], starts[g + 1]
        n = node[order[first]]
        _logits_of_group(h, weight, example, order, first, last, n, arity, logits, rows)
        for q in range(first, last):
            p = order[q]
            row = logits[q - first]
            top = _add_offsets_and_max(row, bias, penalty, n, arity)
            total = np.float32(0.0)
            if keep:  # the softmax itself is kept: the backward and the statistics need no exp again
                for m in range(arity):
                    e = np.exp(row[m] - top)
                    node_prob[p, m] = e
                    total += e
                inverse = np.float32(1.0) / total
                for m in range(arity):
                    node_prob[p, m] *= inverse
            else:
                for m in range(arity):
                    total += np.exp(row[m] - top)
            pair_log_prob[p] = row[child[p]] - top - np.log(total)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _adagrad_update(p, s, g, clr, eps):  # pragma: no cover - compiled
    """torch.optim.Adagrad's update of one row, in place: per element ``s += g**2``;
    ``p -= clr * g / (sqrt(s) + eps)`` (the one copy every Adagrad kernel here calls)."""
    for j in range(g.shape[0]):
        total = s[j] + g[j] * g[j]
        s[j] = total
        p[j] -= clr * g[j] / (np.sqrt(total) + eps)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _fused_adagrad(weight, bias, state_weight, state_bias, n, grad_w, grad_b, need_weight, clr,
                   eps):  # pragma: no cover - compiled
    """:func:`adagrad_rows` on node n's weight row (``grad_w[0]``) and bias row (``grad_b[0]``)."""
    if need_weight:
        p = weight[n]
        s = state_weight[n]
        g = grad_w[0]
        _adagrad_update(p, s, g, clr, eps)
    if bias.shape[0] > 0:
        p = bias[n]
        s = state_bias[n]
        g = grad_b[0]
        _adagrad_update(p, s, g, clr, eps)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def path_backward(h, weight, example, node, child, order, starts, node_prob, grad_output,
                  grad_pair_h, grad_weight, grad_bias, need_h, need_weight, cursor,
                  bias, state_weight, state_bias, clr, eps):  # pragma: no cover - compiled
    """Gradients of ``sum_b grad_output[b] * log p(y_b | h_b)`` from the saved node softmax.

    Per pair, ``d/d logit_m = g_b (onehot(child)_m - softmax_m)``. Writes ``grad_pair_h`` [P, d]
    (each pair's part of its example's input gradient, summed by :func:`sum_by_example`),
    ``grad_weight`` [G, M*d] (one row per unique node, in ``starts`` order) and ``grad_bias``
    [G, M]. Both products are blocked by four (four pairs per weight-gradient row, four weight
    rows per input gradient) so each load and store serves four multiply-adds. Groups are
    claimed from ``cursor`` as in :func:`path_forward`.

    Fused Adagrad (``state_weight`` with rows; :meth:`hsm.RowSparseAdagrad.fuse`): once a node's
    input-gradient share is done (the last read of its old weights), its gradient row goes
    straight into :func:`adagrad_rows`' update of ``weight[n]`` (and ``bias[n]`` with
    ``state_bias``, when ``bias`` has rows) with ``clr``, ``eps``: the row is computed in a
    per-thread scratch row and consumed while in cache, instead of being written to
    ``grad_weight`` and read back by the optimiser (two passes over the batch's node blocks
    saved); ``grad_weight`` and ``grad_bias`` are then not written. The same arithmetic, so the
    same bits as the optimiser's update of the gradient this kernel would otherwise return.

    Longer than the package's ~120-line rule on purpose: the two blocked products and the fused
    update share one pass over a node's pairs (splitting them into functions would read each
    node block again, the cost this kernel exists to avoid)."""
    dim = h.shape[1]
    arity = node_prob.shape[1]
    count = node_prob.shape[0]
    fused = state_weight.shape[0] > 0
    pair_grad = np.empty((count, arity), dtype=h.dtype)  # rows of this thread's pairs only
    groups = starts.shape[0] - 1
    _, scratch = _largest_group(starts)
    group_grad = np.empty((scratch, arity), dtype=h.dtype)
    rows = np.empty((scratch, dim), dtype=h.dtype)
    rows_grad = np.empty((scratch, dim), dtype=h.dtype)
    # fused: this thread's gradient rows (one node at a time) instead of the batch's [G, M*d]
    grad_w = np.empty((1, arity * dim), dtype=h.dtype) if fused else grad_weight
    grad_b = np.empty((1, arity), dtype=h.dtype) if fused else grad_bias
    while True:
        g = _claim(cursor)
        if g >= groups:
            break
        first, last = starts[g], starts[g + 1]
        n = node[order[first]]
        gi = 0 if fused else g
        for q in range(first, last):
            p = order[q]
            scale = grad_output[example[p]]
            for m in range(arity):
                pair_grad[p, m] = -scale * node_prob[p, m]
            pair_grad[p, child[p]] += scale
        for m in range(arity):
            acc = np.float32(0.0)
            for q in range(first, last):
                acc += pair_grad[order[q], m]
            grad_b[gi, m] = acc
        if last - first >= BLAS_MIN_PAIRS:
            # the node's two products as matrix products: grad W_n = S_n^T H_n, grad H_n = S_n W_n
            size = last - first
            for q in range(first, last):
                group_grad[q - first, :] = pair_grad[order[q]]
            block = weight[n].reshape(arity, dim)
            if need_weight:
                np.dot(group_grad[:size].T, _gather_rows(h, example, order, first, last, rows),
                       grad_w[gi].reshape(arity, dim))
            if need_h:
                np.dot(group_grad[:size], block, rows_grad[:size])
                for q in range(first, last):
                    grad_pair_h[order[q], :] = rows_grad[q - first]
            if fused:
                _fused_adagrad(weight, bias, state_weight, state_bias, n, grad_w, grad_b, need_weight, clr, eps)
            continue
        if need_weight:
            # grad W_n[m] = sum over the node's pairs of s_pm h_b
            for m in range(arity):
                base = m * dim
                q = first
                if last - first >= 4:
                    p0, p1, p2, p3 = order[q], order[q + 1], order[q + 2], order[q + 3]
                    s0, s1, s2, s3 = pair_grad[p0, m], pair_grad[p1, m], pair_grad[p2, m], pair_grad[p3, m]
                    e0, e1, e2, e3 = example[p0], example[p1], example[p2], example[p3]
                    for k in range(dim):
                        grad_w[gi, base + k] = s0 * h[e0, k] + s1 * h[e1, k] + s2 * h[e2, k] + s3 * h[e3, k]
                    q += 4
                else:
                    for k in range(dim):
                        grad_w[gi, base + k] = 0.0
                while q + 4 <= last:
                    p0, p1, p2, p3 = order[q], order[q + 1], order[q + 2], order[q + 3]
                    s0, s1, s2, s3 = pair_grad[p0, m], pair_grad[p1, m], pair_grad[p2, m], pair_grad[p3, m]
                    e0, e1, e2, e3 = example[p0], example[p1], example[p2], example[p3]
                    for k in range(dim):
                        grad_w[gi, base + k] += s0 * h[e0, k] + s1 * h[e1, k] + s2 * h[e2, k] + s3 * h[e3, k]
                    q += 4
                while q < last:
                    p = order[q]
                    s = pair_grad[p, m]
                    e = example[p]
                    for k in range(dim):
                        grad_w[gi, base + k] += s * h[e, k]
                    q += 1
        if need_h:
            # grad h_b += sum_m s_pm W_n[m], two pairs at a time sharing the loads of W_n
            for q in range(first, last):
                for k in range(dim):
                    grad_pair_h[order[q], k] = 0.0
            q = first
            while q + 2 <= last:
                p, o = order[q], order[q + 1]
                b, c = example[p], example[o]
                m = 0
                while m + 4 <= arity:
                    b0, b1, b2, b3 = m * dim, (m + 1) * dim, (m + 2) * dim, (m + 3) * dim
                    s0, s1, s2, s3 = pair_grad[p, m], pair_grad[p, m + 1], pair_grad[p, m + 2], pair_grad[p, m + 3]
                    t0, t1, t2, t3 = pair_grad[o, m], pair_grad[o, m + 1], pair_grad[o, m + 2], pair_grad[o, m + 3]
                    for k in range(dim):
                        w0 = weight[n, b0 + k]
                        w1 = weight[n, b1 + k]
                        w2 = weight[n, b2 + k]
                        w3 = weight[n, b3 + k]
                        grad_pair_h[p, k] += s0 * w0 + s1 * w1 + s2 * w2 + s3 * w3
                        grad_pair_h[o, k] += t0 * w0 + t1 * w1 + t2 * w2 + t3 * w3
                    m += 4
                while m < arity:
                    base = m * dim
                    s = pair_grad[p, m]
                    t = pair_grad[o, m]
                    for k in range(dim):
                        grad_pair_h[p, k] += s * weight[n, base + k]
                        grad_pair_h[o, k] += t * weight[n, base + k]
                    m += 1
                q += 2
            if q < last:
                p = order[q]
                b = example[p]
                m = 0
                while m + 4 <= arity:
                    b0, b1, b2, b3 = m * dim, (m + 1) * dim, (m + 2) * dim, (m + 3) * dim
                    s0, s1, s2, s3 = pair_grad[p, m], pair_grad[p, m + 1], pair_grad[p, m + 2], pair_grad[p, m + 3]
                    for k in range(dim):
                        grad_pair_h[p, k] += (s0 * weight[n, b0 + k] + s1 * weight[n, b1 + k]
                                         + s2 * weight[n, b2 + k] + s3 * weight[n, b3 + k])
                    m += 4
                while m < arity:
                    base = m * dim
                    s = pair_grad[p, m]
                    for k in range(dim):
                        grad_pair_h[p, k] += s * weight[n, base + k]
                    m += 1
        if fused:
            _fused_adagrad(weight, bias, state_weight, state_bias, n, grad_w, grad_b, need_weight, clr, eps)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _node_log_softmax(h, b, weight, bias, penalty, n, arity, out):  # pragma: no cover - compiled
    dim = h.shape[1]
    for m in range(arity):
        base = m * dim
        acc = np.float32(0.0)
        for k in range(dim):
            acc += weight[n, base + k] * h[b, k]
        out[m] = acc
    return _log_softmax_in_place(out, bias, penalty, n, arity)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _log_softmax_in_place(out, bias, penalty, n, arity):  # pragma: no cover - compiled
    """Node ``n``'s log-softmax over its M logits ``out`` (bias and slot penalty added here), in
    place; returns the log normaliser."""
    top = _add_offsets_and_max(out, bias, penalty, n, arity)
    total = np.float32(0.0)
    for m in range(arity):
        total += np.exp(out[m] - top)
    log_z = top + np.log(total)
    for m in range(arity):
        out[m] -= log_z
    return log_z  # not finite when the node's logits overflow the dtype (finite but huge inputs)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def top1_search(h, weight, bias, penalty, child_node, child_label, lowest, max_depth, labels, values, visited,
                cursor):  # pragma: no cover - compiled
    """Exact arg max of ``log p(y | h_b)`` for every row (ICML §11.1's branch and bound).

    A greedy descent (most likely child at each node) gives a label and so a lower bound; then a
    depth-first search from the root keeps a child only while its path log-probability exceeds
    the best label found so far, which is exact because a node's path probability bounds every
    label below it. Equal log-probabilities go to the lowest label id (as :func:`topk_search`
    orders them), so a subtree whose path log-probability equals the best is still searched when
    its lowest label id (``lowest`` [N], :func:`lowest_labels`) is below the best label's (a node
    whose other children are all but impossible has a child of log-probability 0 in float32).
    ``child_node`` / ``child_label`` [N, M] (-1 where the slot holds no node /
    label; empty slots have -inf in ``penalty``). Writes ``labels``, ``values`` (the best
    log-probability; NaN when a node the search evaluated had logits that overflow, so that no
    label is trustworthy) and ``visited`` (distinct node evaluations) per row. The greedy path's node
    distributions are kept so the search does not evaluate them twice. Rows are claimed from
    ``cursor`` as groups are in :func:`path_forward` (a search's cost varies a lot by row)."""
    arity = child_node.shape[1]
    lp = np.empty(arity, dtype=h.dtype)
    greedy_nodes = np.empty(max_depth, dtype=np.int64)
    greedy_lp = np.empty((max_depth, arity), dtype=h.dtype)
    stack_node = np.empty(max_depth * arity + 1, dtype=np.int64)
    stack_score = np.empty(max_depth * arity + 1, dtype=h.dtype)
    neg_inf = np.float32(-np.inf)
    while True:
        b = _claim(cursor)
        if b >= h.shape[0]:
            break
        # greedy descent
        n = 0
        score = np.float32(0.0)
        best = neg_inf
        best_label = -1
        depth = 0
        count = 0
        overflow = False
        while n >= 0 and depth < max_depth:
            if not np.isfinite(_node_log_softmax(h, b, weight, bias, penalty, n, arity, lp)):
                overflow = True
            count += 1
            greedy_nodes[depth] = n
            greedy_lp[depth, :] = lp
            depth += 1
            step, nxt = neg_inf, -1
            for m in range(arity):
                v = score + lp[m]
                if child_label[n, m] >= 0 and (v > best or (v == best and child_label[n, m] < best_label)):
                    best, best_label = v, child_label[n, m]
                if child_node[n, m] >= 0 and v > step:
                    step, nxt = v, child_node[n, m]
            score = step
            n = nxt
        greedy_len = depth
        # branch and bound (depth first); the root is always the greedy path's first node
        top = 0
        stack_node[0] = 0
        stack_score[0] = 0.0
        top = 1
        while top > 0:
            top -= 1
            n = stack_node[top]
            score = stack_score[top]
            if score < best or (score == best and lowest[n] >= best_label):
                continue  # the bound improved since this node was pushed
            cached = -1
            for level in range(greedy_len):
                if greedy_nodes[level] == n:
                    cached = level
                    break
            if cached >= 0:
                lp[:] = greedy_lp[cached]
            else:
                if not np.isfinite(_node_log_softmax(h, b, weight, bias, penalty, n, arity, lp)):
                    overflow = True
                count += 1
            for m in range(arity):
                v = score + lp[m]
                if v < best or v == neg_inf:
                    continue
                if child_label[n, m] >= 0:
                    if v > best or child_label[n, m] < best_label:
                        best, best_label = v, child_label[n, m]
                elif child_node[n, m] >= 0 and (v > best or lowest[child_node[n, m]] < best_label):
                    stack_node[top] = child_node[n, m]
                    stack_score[top] = v
                    top += 1
        labels[b] = best_label
        values[b] = np.nan if overflow else best
        visited[b] = count


@numba.njit(cache=True)
def lowest_labels(child_node, child_label):  # pragma: no cover - compiled
    """[N] the smallest label id below each node (the int64 maximum for a node with no label
    below, or unreachable from the root): where the exact top-1 searches look for a tied label
    of lower id. ``child_node`` / ``child_label`` [N, M] as in :func:`top1_search`."""
    order = parents_first(child_node)
    none = np.iinfo(np.int64).max
    out = np.full(child_node.shape[0], none, dtype=np.int64)
    for i in range(order.size - 1, -1, -1):  # children before their parents
        n = order[i]
        low = none
        for m in range(child_node.shape[1]):
            label, child = child_label[n, m], child_node[n, m]
            if 0 <= label < low:
                low = label
            if child >= 0 and out[child] < low:
                low = out[child]
        out[n] = low
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _comes_first(value_a, code_a, value_b, code_b):  # pragma: no cover - compiled
    """Order of :func:`topk_search`'s queue (``code`` >= 0: a label; ``-(n + 1)``: inner node n):
    the larger path log-probability first; at equal values an inner node before a label (its
    subtree may hold a label of that same value and a smaller id), labels by increasing id and
    inner nodes by increasing node id, so ties come out as a stable sort by label id gives them."""
    if value_a != value_b:
        return value_a > value_b
    if (code_a < 0) != (code_b < 0):
        return code_a < 0
    if code_a < 0:
        return code_a > code_b
    return code_a < code_b


@numba.njit(cache=True, nogil=True)
def _queue_push(values, codes, size, value, code):  # pragma: no cover - compiled
    """Add (value, code) to the binary heap ``values, codes [:size]``; returns the new size."""
    i = size
    while i > 0:
        parent = (i - 1) // 2
        if not _comes_first(value, code, values[parent], codes[parent]):
            break
        values[i] = values[parent]
        codes[i] = codes[parent]
        i = parent
    values[i] = value
    codes[i] = code
    return size + 1


@numba.njit(cache=True, nogil=True)
def _queue_pop(values, codes, size):  # pragma: no cover - compiled
    """Remove the first entry (index 0) of the binary heap ``values, codes [:size]``; returns the
    new size (the caller reads the entry before)."""
    size -= 1
    value, code = values[size], codes[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _comes_first(values[child + 1], codes[child + 1], values[child], codes[child]):
            child += 1
        if not _comes_first(values[child], codes[child], value, code):
            break
        values[i] = values[child]
        codes[i] = codes[child]
        i = child
    if size > 0:
        values[i] = value
        codes[i] = code
    return size


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def topk_search(h, weight, bias, penalty, child_node, child_label, values, labels, visited,
                cursor):  # pragma: no cover - compiled
    """Exact k most likely labels of every row (k = ``values.shape[1]``), best first: a best-first
    branch and bound over the tree.

    A queue holds the row's open entries (inner nodes and labels) keyed by their path
    log-probability; the best is taken out; a label taken out is the next most likely one (every
    entry still queued, and every label below a queued node, has a path log-probability at most
    its own: a node's path probability bounds every label below it), and a node taken out is
    evaluated (its log-softmax, M dot products of length d) and its children queued. The search
    stops after k labels, so it evaluates exactly the nodes whose path log-probability is above
    the k-th label's (ties aside), the fewest any exact search can: each node once, no cache needed.

    ``child_node`` / ``child_label`` [N, M] as in :func:`top1_search`. Writes ``values`` [B, k]
    (NaN on the whole row when a node the search evaluated had logits that overflow), ``labels``
    [B, k], best first, ties by increasing label id, and ``visited`` [B] (nodes evaluated). Rows are
    claimed from ``cursor`` as in :func:`top1_search`."""
    arity = child_node.shape[1]
    k = values.shape[1]
    capacity = child_node.shape[0] * arity + 1  # each evaluated node adds at most M entries
    queue_value = np.empty(capacity, dtype=h.dtype)
    queue_code = np.empty(capacity, dtype=np.int64)
    lp = np.empty(arity, dtype=h.dtype)
    neg_inf = np.float32(-np.inf)
    while True:
        b = _claim(cursor)
        if b >= h.shape[0]:
            break
        size = _queue_push(queue_value, queue_code, 0, np.float32(0.0), -1)  # the root, node 0
        found = 0
        count = 0
        overflow = False
        while found < k and size > 0:
            score, code = queue_value[0], queue_code[0]
            size = _queue_pop(queue_value, queue_code, size)
            if code >= 0:
                values[b, found] = score
                labels[b, found] = code
                found += 1
                continue
            n = -code - 1
            count += 1
            if not np.isfinite(_node_log_softmax(h, b, weight, bias, penalty, n, arity, lp)):
                overflow = True
                break
            for m in range(arity):
                v = score + lp[m]
                if v == neg_inf:  # an empty slot
                    continue
                if child_label[n, m] >= 0:
                    size = _queue_push(queue_value, queue_code, size, v, child_label[n, m])
                elif child_node[n, m] >= 0:
                    size = _queue_push(queue_value, queue_code, size, v, -child_node[n, m] - 1)
        for r in range(found, k):
            values[b, r] = neg_inf
            labels[b, r] = -1
        if overflow:
            for r in range(k):
                values[b, r] = np.nan
        visited[b] = count


@numba.njit(cache=True)
def parents_first(child_node):  # pragma: no cover - compiled
    """The nodes reachable from the root (node 0) through ``child_node`` [N, M] (-1: no node),
    in breadth-first order: every node after its parent."""
    order = np.empty(child_node.shape[0], dtype=np.int64)
    order[0] = 0
    count = 1
    i = 0
    while i < count:
        n = order[i]
        for m in range(child_node.shape[1]):
            c = child_node[n, m]
            if c >= 0:
                order[count] = c
                count += 1
        i += 1
    return order[:count].copy()


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def all_log_probs(h, weight, bias, penalty, child_node, child_label, order, chunk, out,
                  cursor):  # pragma: no cover - compiled
    """``log p(y | h_b)`` of every label y (eq. 5 for all K at once), O(N M d) per row.

    Rows are taken ``chunk`` at a time from ``cursor``; a chunk's logits for every node are one
    matrix product (``[chunk, d] x [d, N*M]``, BLAS); then per row the nodes are visited parents
    first (``order``, :func:`parents_first`): each node's log-softmax is computed once and added to
    its path log-probability, which is handed to its child nodes and written for its labels. The
    sums run root first, as the reference sums a path's steps. ``out`` [B, K] (every real label is
    one leaf, so every entry is written); a row with a node whose logits overflow is all NaN. The
    chunks do not depend on the thread count, so neither do the results."""
    nodes, arity = child_node.shape[0], child_node.shape[1]
    dim = h.shape[1]
    batch = h.shape[0]
    flat = weight.reshape(nodes * arity, dim)
    logits = np.empty((chunk, nodes * arity), dtype=h.dtype)
    prefix = np.empty(nodes, dtype=h.dtype)
    chunks = (batch + chunk - 1) // chunk
    while True:
        c = _claim(cursor)
        if c >= chunks:
            break
        lo = c * chunk
        hi = min(batch, lo + chunk)
        np.dot(h[lo:hi], flat.T, logits[: hi - lo])
        for b in range(lo, hi):
            row = logits[b - lo]
            prefix[0] = 0.0
            finite = True
            for i in range(order.shape[0]):
                n = order[i]
                lp = row[n * arity:(n + 1) * arity]
                if not np.isfinite(_log_softmax_in_place(lp, bias, penalty, n, arity)):
                    finite = False
                base = prefix[n]
                for m in range(arity):
                    if child_label[n, m] >= 0:
                        out[b, child_label[n, m]] = base + lp[m]
                    elif child_node[n, m] >= 0:
                        prefix[child_node[n, m]] = base + lp[m]
            if not finite:
                for y in range(out.shape[1]):
                    out[b, y] = np.nan


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def adagrad_rows(param, state, rows, grad, clr, eps, r_lo, r_hi):  # pragma: no cover - compiled
    """Row-sparse Adagrad (torch.optim.Adagrad's update on the touched rows): per element
    ``state += g**2``; ``param -= clr * g / (sqrt(state) + eps)``. ``rows`` must be distinct."""
    for r in range(r_lo, r_hi):
        row = rows[r]
        p = param[row]
        s = state[row]
        _adagrad_update(p, s, grad[r], clr, eps)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def adagrad_dense(param, state, grad, clr, eps, lo, hi):  # pragma: no cover - compiled
    """Adagrad on elements ``lo..hi-1`` of flat (1-D) arrays: :func:`adagrad_rows`' update for a
    dense gradient, in one pass where torch's takes four (``addcmul_``, ``sqrt``, ``add_``,
    ``addcdiv_``, each reading and writing a whole parameter-sized tensor)."""
    # on slices: indexing the whole arrays at lo + j kept LLVM from vectorising the loop (7x slower)
    _adagrad_update(param[lo:hi], state[lo:hi], grad[lo:hi], clr, eps)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def accumulate_statistics(sum_probas, path_counts, label_counts, target, example, depth, node_prob):  # pragma: no cover - compiled
    """Algorithm 1's NodeCompute for one batch (:meth:`hsm.statistics.NodeStatistics.accumulate`):
    for every pair, ``sum_probas[y, depth] += softmax`` and ``path_counts[y, depth] += 1``; for
    every example ``label_counts[y] += 1``. One pass over the batch's node distributions, which the
    forward kernel has just written (``node_prob`` [P, M])."""
    for b in range(target.shape[0]):
        label_counts[target[b]] += 1.0
    arity = node_prob.shape[1]
    for p in range(node_prob.shape[0]):
        label = target[example[p]]
        level = depth[p]
        path_counts[label, level] += 1.0
        for m in range(arity):
            sum_probas[label, level, m] += node_prob[p, m]


# ------------------------------------------------------------------ the log-bilinear model
@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def lbl_forward(weight, ids, context_weight, gathered, out, chunk, cursor):  # pragma: no cover - compiled
    """The log-bilinear representation ``out[b] = sum_k R_k U[w_{t-k}]`` (:class:`hsm.models.LogBilinearLM`).

    ``weight`` [V, d] (U), ``ids`` [T * B] position-major (entry ``k * B + b`` is the word ``k + 1``
    back of example b), ``context_weight`` [T, d, d] (``R_{k+1}`` at k). Writes ``gathered``
    [T, B, d] (the context rows, kept for the backward) and ``out`` [B, d]. Examples are taken
    ``chunk`` at a time from ``cursor``; a chunk's rows are gathered, then ``T`` matrix products
    with ``R_k^T`` (BLAS reads the transposed block in place) are summed in order of k; the chunks
    are the same on any number of threads (:data:`LBL_FORWARD_CHUNK`), so a row's result does not
    depend on how the batch was shared."""
    context = context_weight.shape[0]
    batch = out.shape[0]
    chunks = (batch + chunk - 1) // chunk
    scratch = np.empty((chunk, out.shape[1]), dtype=out.dtype)
    while True:
        c = _claim(cursor)
        if c >= chunks:
            break
        lo = c * chunk
        hi = min(batch, lo + chunk)
        for k in range(context):
            for b in range(lo, hi):
                gathered[k, b, :] = weight[ids[k * batch + b]]
        np.dot(gathered[0, lo:hi], context_weight[0].T, out[lo:hi])
        for k in range(1, context):
            part = scratch[: hi - lo]
            np.dot(gathered[k, lo:hi], context_weight[k].T, part)
            for b in range(hi - lo):
                for j in range(out.shape[1]):
                    out[lo + b, j] += part[b, j]


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def lbl_backward(grad_out, gathered, context_weight, grad_context, rows, need_context, need_rows,
                 cursor):  # pragma: no cover - compiled
    """Gradients of :func:`lbl_forward`: ``grad_context[k] = g^T gathered[k]`` (dL/dR_{k+1}) and
    ``rows[k] = g R_k`` (the gradient of each context row, position-major like ``ids``). The 2T
    products (T of each kind, all the same size) are claimed one at a time from ``cursor``."""
    context = context_weight.shape[0]
    while True:
        task = _claim(cursor)
        if task >= 2 * context:
            break
        if task < context:
            if need_context:
                np.dot(grad_out.T, gathered[task], grad_context[task])
        elif need_rows:
            k = task - context
            np.dot(grad_out, context_weight[k], rows[k])


@numba.njit(cache=True, nogil=True)
def sum_rows_by_id(ids, rows):  # pragma: no cover - compiled
    """The rows of equal ids summed: ``(unique ids, increasing; their summed rows)``. A word that
    occurs several times in a batch's contexts gets one gradient row (as ``Tensor.coalesce``
    gives, without a sparse tensor's sort and temporaries); duplicates are added in the order
    they occur (a stable sort), so the result is deterministic."""
    n = ids.shape[0]
    order = np.argsort(ids, kind="mergesort")
    count = 0
    for i in range(n):
        if i == 0 or ids[order[i]] != ids[order[i - 1]]:
            count += 1
    unique = np.empty(count, dtype=np.int64)
    out = np.zeros((count, rows.shape[1]), dtype=rows.dtype)
    u = -1
    for i in range(n):
        r = order[i]
        if i == 0 or ids[r] != ids[order[i - 1]]:
            u += 1
            unique[u] = ids[r]
        for j in range(rows.shape[1]):
            out[u, j] += rows[r, j]
    return unique, out


# ------------------------------------------------------------------ thread shares
class _Worker:
    """A pool thread with the lightest hand-off Python has: two bare locks (a futex each way).
    ``concurrent.futures`` adds a queue, a Future and a Condition per task, about 0.1 ms per batch
    on a 2-core AMD EPYC, a quarter of a log-probability pass."""

    def __init__(self) -> None:
        self.start, self.done = threading.Lock(), threading.Lock()
        self.start.acquire()
        self.done.acquire()
        self.job: tuple[Callable[[int, int, int], None], int, int, int] | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._loop, name="hsm-kernel", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.start.acquire()
            task, index, lo, hi = self.job  # type: ignore[misc]
            try:
                task(index, lo, hi)
            except BaseException as error:  # noqa: BLE001 - handed to the caller, raised there
                self.error = error
            self.job = None
            self.done.release()

    def submit(self, task: Callable[[int, int, int], None], index: int, lo: int, hi: int) -> None:
        self.job = (task, index, lo, hi)
        self.start.release()

    def wait(self) -> None:
        # a KeyboardInterrupt can arrive while the lock is awaited: keep waiting for the task
        # (one kernel step), then raise it; raised at once, it would leave the task running and
        # its release behind, which the next wait would take for the end of the next task
        interrupted: BaseException | None = None
        while True:
            try:
                self.done.acquire()
                break
            except BaseException as error:  # noqa: BLE001 - re-raised once the worker is idle
                interrupted = interrupted or error
        error, self.error = self.error, None
        if interrupted is not None:
            raise interrupted
        if error is not None:
            raise error


_WORKERS: list[_Worker] = []
_WORKERS_BUSY = threading.Lock()  # one batch at a time on the pool; a concurrent caller runs inline


def _forget_workers() -> None:
    """In a forked child (DataLoader workers): the parent's threads do not exist there, and the
    busy lock may have been held by one of them at the fork."""
    global _WORKERS, _WORKERS_BUSY
    _WORKERS, _WORKERS_BUSY = [], threading.Lock()


os.register_at_fork(after_in_child=_forget_workers)


def _workers(count: int) -> list[_Worker]:
    while len(_WORKERS) < count:
        _WORKERS.append(_Worker())
    return _WORKERS[:count]


@numba.njit(cache=True)
def _share_bounds(cumulative, parts):  # pragma: no cover - compiled
    """Boundaries of ``parts`` contiguous ranges of items of about equal load (``cumulative`` as
    in :func:`_shares`); empty ranges are dropped."""
    items = cumulative.shape[0] - 1
    total = cumulative[items] - cumulative[0]
    bounds = np.empty(parts + 1, dtype=np.int64)
    bounds[0] = 0
    count = 1
    i = 0
    for part in range(1, parts):
        goal = cumulative[0] + total * part / parts
        while i < items and cumulative[i] < goal:
            i += 1
        if i > bounds[count - 1] and i < items:
            bounds[count] = i
            count += 1
    bounds[count] = items
    return bounds[: count + 1].copy()


def _shares(cumulative: np.ndarray, work: float) -> list[tuple[int, int]]:
    """Split items ``0..len(cumulative)-2`` (item i's load is ``cumulative[i+1] - cumulative[i]``)
    into contiguous ranges of about equal load, one per thread."""
    items = len(cumulative) - 1
    parts = int(min(torch.get_num_threads(), items, max(1, work // MIN_WORK_PER_THREAD)))
    if parts <= 1:
        return [(0, items)]
    bounds = _share_bounds(np.ascontiguousarray(cumulative, dtype=np.float64), parts).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


class _SingleThreadedBlas:
    """While any kernel runs: the BLAS libraries loaded in this process (scipy's OpenBLAS is the
    one numba's ``np.dot`` calls) use one thread, and get their own setting back afterwards.

    Why: the kernels already run on every core, and OpenBLAS's own threads busy-wait for a while
    after each call, taking the core the kernels' second thread needs (measured: a training step
    at V = 250k went from 1.5-2.0 ms to 2.7-3.8 ms with scipy's OpenBLAS left at 2 threads).
    Nested and concurrent uses are counted, so the setting is restored once, by the last one
    out. Via threadpoolctl (scikit-learn's dependency); nothing happens where it is missing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._libraries: list | None = None
        self._saved: list[int] = []

    def _find(self) -> list:
        try:
            import scipy.linalg.cython_blas  # noqa: F401 - loads the BLAS numba's np.dot calls
            from threadpoolctl import ThreadpoolController

            return [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
        except Exception:  # noqa: BLE001 - no threadpoolctl / scipy: leave BLAS as it is
            return []

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                if self._libraries is None:
                    self._libraries = self._find()
                self._saved = [lib.num_threads for lib in self._libraries]
                for lib, threads in zip(self._libraries, self._saved):
                    if threads != 1:
                        lib.set_num_threads(1)
            self._depth += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for lib, threads in zip(self._libraries or [], self._saved):
                    if threads != 1:
                        lib.set_num_threads(threads)


_BLAS_ONE_THREAD = _SingleThreadedBlas()


def run_on_pool(task: Callable[[int, int, int], None], shares: list[tuple[int, int]]) -> None:
    """``task(share_index, lo, hi)`` for every share: the first on this thread, the rest on the
    pool (or all here, one after the other, while another thread is using the pool)."""
    with _BLAS_ONE_THREAD:
        _run_shares(task, shares)


def _run_shares(task: Callable[[int, int, int], None], shares: list[tuple[int, int]]) -> None:
    if len(shares) == 1 or not _WORKERS_BUSY.acquire(blocking=False):
        for i, (lo, hi) in enumerate(shares):
            task(i, lo, hi)
        return
    try:
        workers = _workers(len(shares) - 1)
        for worker, (i, (lo, hi)) in zip(workers, enumerate(shares[1:], 1)):
            worker.submit(task, i, lo, hi)
        try:
            task(0, *shares[0])
        finally:
            errors = []
            for worker in workers:  # every worker, even after an error: each must be idle again
                try:
                    worker.wait()
                except BaseException as error:  # noqa: BLE001
                    errors.append(error)
            if errors:
                raise errors[0]
    finally:
        _WORKERS_BUSY.release()


def _run_claiming(task: Callable[[], None], threads: int) -> None:
    """``task()`` on ``threads`` threads at once: kernels whose threads claim their work from a
    shared cursor (:func:`_claim`)."""
    run_on_pool(lambda i, lo, hi: task(), [(0, 0)] * threads)


def _threads_for(work: float, items: int) -> int:
    """Threads worth using: ``torch.get_num_threads()``, fewer for little work."""
    return int(min(torch.get_num_threads(), items, max(1, work // MIN_WORK_PER_THREAD)))


def run_path_forward(h, weight, bias, penalty, example, node, child, order, starts, arity, node_prob) -> np.ndarray:
    """:func:`path_forward` on all groups, shared by the threads; returns ``output`` [B]."""
    threads = _threads_for(float(node.shape[0]) * arity * h.shape[1], starts.shape[0] - 1)
    cursor = np.zeros(1, dtype=np.int64)
    pair_log_prob = np.empty(node.shape[0], dtype=h.dtype)

    _run_claiming(lambda: path_forward(h, weight, bias, penalty, example, node, child, order, starts, arity, node_prob, pair_log_prob,
                     cursor), threads)
    output = np.zeros(h.shape[0], dtype=h.dtype)
    sum_by_example(pair_log_prob, example, output)
    return output


def run_path_backward(h, weight, example, node, child, order, starts, node_prob, grad_output,
                      grad_weight, grad_bias, need_h, need_weight, adagrad=None) -> np.ndarray:
    """:func:`path_backward` on all groups, shared by the threads; returns ``grad_h`` [B, d].
    ``adagrad``: ``(bias, state_weight, state_bias, clr, eps)`` for the fused update (``bias``
    and ``state_bias`` with 0 rows when the layer has no bias), else None."""
    threads = _threads_for(2.0 * node.shape[0] * node_prob.shape[1] * h.shape[1], starts.shape[0] - 1)
    cursor = np.zeros(1, dtype=np.int64)
    grad_pair_h = np.empty((node.shape[0] if need_h else 0, h.shape[1]), dtype=h.dtype)
    if adagrad is None:
        none = np.empty((0, node_prob.shape[1]), dtype=h.dtype)
        adagrad = (none, np.empty((0, weight.shape[1]), dtype=h.dtype), none, h.dtype.type(0), h.dtype.type(0))
    bias, state_weight, state_bias, clr, eps = adagrad

    _run_claiming(lambda: path_backward(h, weight, example, node, child, order, starts, node_prob, grad_output, grad_pair_h,
                      grad_weight, grad_bias, need_h, need_weight, cursor, bias, state_weight, state_bias, clr, eps),
                  threads)
    grad_h = np.zeros(h.shape, dtype=h.dtype)
    if need_h:
        sum_rows_by_example(grad_pair_h, example, grad_h)
    return grad_h


def run_top1_search(h, weight, bias, penalty, child_node, child_label, lowest, max_depth):
    """:func:`top1_search` for every row, rows split over threads; (labels, values, visited).
    ``lowest``: :func:`lowest_labels` of the tree."""
    batch = h.shape[0]
    labels = np.empty(batch, dtype=np.int64)
    values = np.empty(batch, dtype=h.dtype)
    visited = np.empty(batch, dtype=np.int64)
    threads = _threads_for(float(max_depth) * child_node.shape[1] * h.shape[1] * batch, batch)
    cursor = np.zeros(1, dtype=np.int64)

    _run_claiming(lambda: top1_search(h, weight, bias, penalty, child_node, child_label, lowest, max_depth, labels,
                                      values, visited, cursor), threads)
    return labels, values, visited


def run_topk_search(h, weight, bias, penalty, child_node, child_label, k: int,
                    max_depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`topk_search` for every row (B >= 1), rows claimed by the threads; returns
    ``(values [B, k], labels [B, k], visited [B])``. ValueError for ``k`` < 1."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    batch = h.shape[0]
    values = np.empty((batch, k), dtype=h.dtype)
    labels = np.empty((batch, k), dtype=np.int64)
    visited = np.empty(batch, dtype=np.int64)
    # a confident model evaluates about one node per level plus a few per extra label
    threads = _threads_for(float(max_depth + k - 1) * child_node.shape[1] * h.shape[1] * batch, batch)
    cursor = np.zeros(1, dtype=np.int64)
    _run_claiming(lambda: topk_search(h, weight, bias, penalty, child_node, child_label, values, labels, visited,
                                      cursor), threads)
    return values, labels, visited


#: floats of node logits a thread of :func:`run_all_log_probs` holds at once (8 MB): the row chunk
ALL_LOG_PROBS_SCRATCH = 1 << 21


def run_all_log_probs(h, weight, bias, penalty, child_node, child_label, num_labels: int) -> np.ndarray:
    """:func:`all_log_probs` for every row (B >= 1), row chunks claimed by the threads: ``[B, K]``."""
    batch, dim = h.shape
    nodes, arity = child_node.shape
    chunk = int(max(1, min(64, ALL_LOG_PROBS_SCRATCH // (nodes * arity))))
    out = np.empty((batch, num_labels), dtype=h.dtype)
    threads = _threads_for(float(batch) * nodes * arity * dim, -(-batch // chunk))
    cursor = np.zeros(1, dtype=np.int64)
    order = parents_first(child_node)
    _run_claiming(lambda: all_log_probs(h, weight, bias, penalty, child_node, child_label, order, chunk, out, cursor),
                  threads)
    return out


#: rows per product in :func:`lbl_forward` (the same on any number of threads)
LBL_FORWARD_CHUNK = 64


def run_lbl_forward(weight, ids, context_weight, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lbl_forward` shared by the threads: returns ``(out [B, d], gathered [T, B, d])``."""
    context, dim = context_weight.shape[0], weight.shape[1]
    gathered = np.empty((context, batch, dim), dtype=weight.dtype)
    out = np.empty((batch, dim), dtype=weight.dtype)
    threads = max(1, _threads_for(2.0 * batch * context * dim * dim, batch))
    # a fixed chunk, not batch / threads: BLAS may round a row differently in a product of another
    # height (OpenBLAS picks its kernels by shape), so the chunks must not depend on the threads
    chunk = min(batch, LBL_FORWARD_CHUNK) if batch else 1
    threads = min(threads, -(-batch // chunk)) if batch else 1
    cursor = np.zeros(1, dtype=np.int64)
    _run_claiming(lambda: lbl_forward(weight, ids, context_weight, gathered, out, chunk, cursor), threads)
    return out, gathered


def run_lbl_backward(grad_out, gathered, context_weight, need_context: bool,
                     need_rows: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lbl_backward` shared by the threads: ``(grad_context [T, d, d], rows [T, B, d])``
    (either with 0 entries when not needed)."""
    context, batch, dim = gathered.shape
    grad_context = np.empty(context_weight.shape if need_context else (0, dim, dim), dtype=gathered.dtype)
    rows = np.empty((context if need_rows else 0, batch, dim), dtype=gathered.dtype)
    threads = max(1, _threads_for(2.0 * batch * context * dim * dim * (need_context + need_rows), 2 * context))
    cursor = np.zeros(1, dtype=np.int64)
    _run_claiming(lambda: lbl_backward(grad_out, gathered, context_weight, grad_context, rows, need_context,
                                       need_rows, cursor), threads)
    return grad_context, rows


def run_adagrad_dense(param, state, grad, clr, eps) -> None:
    """:func:`adagrad_dense` over all elements of the flat arrays, split over threads in blocks
    of whole cache lines (a thread never writes a line another one writes)."""
    size = param.shape[0]
    parts = int(min(torch.get_num_threads(), max(1, size // (4 * MIN_WORK_PER_THREAD))))
    step = max(16, -(-(-(-size // parts)) // 16) * 16)  # ceil(size / parts), rounded up to 16 elements
    shares = [(lo, min(size, lo + step)) for lo in range(0, size, step)] or [(0, 0)]

    def task(i: int, lo: int, hi: int) -> None:
        adagrad_dense(param, state, grad, clr, eps, lo, hi)

    run_on_pool(task, shares)


def run_adagrad_rows(param, state, rows, grad, clr, eps) -> None:
    """:func:`adagrad_rows` over all ``rows`` (distinct), split over threads."""
    shares = _shares(np.arange(rows.shape[0] + 1), float(rows.shape[0]) * grad.shape[1] / 4)

    def task(i: int, lo: int, hi: int) -> None:
        adagrad_rows(param, state, rows, grad, clr, eps, lo, hi)

    run_on_pool(task, shares)
