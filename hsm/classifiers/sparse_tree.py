"""A label tree with linear node models on sparse TF-IDF features, learned by Algorithm 1.

The paper's model is ``p(y | x) = prod_{(n, c) in path(y)} softmax_c(W_n f(x) + b_n)`` (ICML eq. 3)
with a learned representation ``f(x)``. Today's label-tree classifiers (Parabel, Bonsai, PLT)
keep the tree and drop the learned representation: ``f(x)`` is the document's sparse TF-IDF
vector (:mod:`hsm.classifiers.sparse_features`) and each node is a linear model over it. Algorithm 1 needs
nothing of ``f`` but the node probabilities, so it applies unchanged: this module is the paper's
tree learning on their representation.

* **Parameters.** ``W`` is stored feature-major, ``[F, N * M]``: row ``f`` holds feature f's
  weight for child c of node n at column ``n * M + c``. A step touches, for each non-zero of x
  and each node on the path, M consecutive floats (one cache line or two), and the exact
  posterior over every label reads one contiguous row per non-zero.
* **Training.** Per-example SGD on eq. 5 along the label's path (the compiled Hogwild driver of
  :class:`hsm.classifiers.fast_classifier.FastBowClassifier`, :class:`hsm.classifiers.fast_trainer.HogwildTrainer`,
  with a sparse kernel), NodeCompute's statistics collected on the way, and AssignLabels
  (Algorithm 2) between chunks in the first half of training (ICML §11.1).
* **Starting trees.** The M-ary Huffman tree of the label counts (the paper's), or the
  balanced k-means label tree the label-tree libraries build before training
  (:func:`kmeans_label_tree`).
* **Prediction.** Exact: every node's log-softmax, summed along every label's path.

Multi-label documents are trained on one of their labels drawn uniformly per epoch (fastText's
softmax over a multi-label example, as everywhere in this package).
"""
from __future__ import annotations

import math
import time
from typing import Any, Literal, Sequence

import numba
import numpy as np
import scipy.sparse as sp

from hsm._checks import NonFiniteInputError, check_choice, check_count, check_fraction, check_positive
from hsm._optional import require
from hsm.assign import ReassignRecord, Reassignment, rebuild_tree
from hsm.classifiers.fast_classifier import Prediction, as_labels, check_inferred_size
from hsm.classifiers.fast_trainer import FitHistory, HogwildTrainer, example_rate, path_arrays, statistics_arrays
from hsm.kernels import FASTMATH, run_on_pool
from hsm.label_addition import LabelAddition, NodeSlots, check_placement, place_labels
from hsm.objective import RankingScore, check_ranking_score
from hsm.statistics import NodeStatistics
from hsm.tree import Tree, check_integer

__all__ = ["SparseTreeClassifier", "full_tree", "kmeans_label_tree", "label_centroids"]

_NEG_INF = np.float32(-np.inf)

#: the largest |feature value| :meth:`SparseTreeClassifier.fit` accepts. A step adds about
#: ``lr * x`` to a weight, so a node logit ``W x`` grows like ``lr * x**2``, and AdaGrad adds
#: ``x**2`` to its sums: float32 ends at 3.4e38 = (1.8e19)**2, so values beyond about 1.8e19
#: overflow in the first steps, and 1e18 leaves room for a row's sum over its features. The
#: model expects rows of about unit length (TF-IDF rows), far below this.
LARGEST_FEATURE = 1e18


# ---------------------------------------------------------------------------------------------- kernels
@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _node_logits(indices, data, first, last, weight, bias, n, logit):  # pragma: no cover - compiled
    """``logit[m] = b_n[m] + W_n[m] . x`` for the M slots of node ``n``, x the CSR row
    ``indices/data[first:last]`` (one contiguous run of M floats of ``weight`` per non-zero)."""
    arity = bias.shape[1]
    base = n * arity
    for m in range(arity):
        logit[m] = bias[n, m]
    for t in range(first, last):
        f = indices[t]
        v = data[t]
        for m in range(arity):
            logit[m] += weight[f, base + m] * v


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _node_step(indices, data, first, last, weight, n, alpha, residual, squares):  # pragma: no cover - compiled
    """``W_n[m] += alpha[m] * x`` for the M slots of node ``n``; with AdaGrad (``squares`` has
    rows) each feature's step is first divided by ``sqrt(1 + squares[f, n])`` after adding
    ``x_f^2 * residual`` (the squared gradient summed over the node's slots)."""
    arity = alpha.shape[0]
    base = n * arity
    adagrad = squares.shape[0] > 0
    for t in range(first, last):
        f = indices[t]
        v = data[t]
        if adagrad:
            squares[f, n] += v * v * residual
            v = v / np.sqrt(np.float32(1.0) + squares[f, n])
        for m in range(arity):
            weight[f, base + m] += alpha[m] * v


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _sgd_sparse_examples(indptr, indices, data, order, targets, weight, bias, penalty, path_nodes, path_children,
                         path_mask, lr, schedule, start, stride, phase, total, collect, sum_probas, path_counts,
                         label_counts, losses, squares):  # pragma: no cover - compiled
    """One SGD step of eq. 5 per example ``order[k]``, in place; ``losses[k]`` gets its NLL.

    ``indptr``/``indices``/``data``: the CSR rows of x; ``weight`` [F, N*M] (feature-major),
    ``bias`` [N, M], ``penalty`` [N, M] (-inf on slots holding no real label; 0 rows: none), the
    label paths ``path_*`` [K', L]. Rate and statistics as :func:`hsm.classifiers.fast_trainer._sgd_examples`.
    ``squares`` [F, N] (0 rows: plain SGD): AdaGrad's running sum of squared gradients per
    (feature, node), shared by the node's M weights of that feature; the step of feature f at
    node n is divided by ``sqrt(1 + squares[f, n])`` (so it starts as the plain SGD step and
    shrinks for features seen often, leaving rare ones large).
    Returns -1, or the k of the first example whose loss is not finite (it stops there)."""
    arity = bias.shape[1]
    has_penalty = penalty.shape[0] > 0
    length = path_nodes.shape[1]
    logit = np.empty(arity, dtype=np.float32)
    alpha = np.empty(arity, dtype=np.float32)
    for k in range(order.shape[0]):
        i = order[k]
        rate = example_rate(lr, schedule, start, k, stride, phase, total)
        first, last = indptr[i], indptr[i + 1]
        y = targets[i]
        loss = 0.0
        for depth in range(length):
            if not path_mask[y, depth]:
                break
            n = path_nodes[y, depth]
            c = path_children[y, depth]
            _node_logits(indices, data, first, last, weight, bias, n, logit)
            top = _NEG_INF
            for m in range(arity):
                if has_penalty and penalty[n, m] == _NEG_INF:
                    logit[m] = _NEG_INF  # a slot holding no real label: probability 0
                top = max(top, logit[m])
            norm = np.float32(0.0)
            for m in range(arity):
                norm += np.exp(logit[m] - top)
            loss += np.log(norm) + top - logit[c]
            residual = np.float32(0.0)  # sum over children of (1[m = c] - p_m)^2
            for m in range(arity):
                p = np.exp(logit[m] - top) / norm
                if collect:
                    sum_probas[y, depth, m] += p
                r = (1.0 if m == c else 0.0) - p
                residual += r * r
                alpha[m] = rate * r
                bias[n, m] += alpha[m]
            _node_step(indices, data, first, last, weight, n, alpha, residual, squares)
            if collect:
                path_counts[y, depth] += 1.0
        if collect:
            label_counts[y] += 1.0
        losses[k] = loss
        if not np.isfinite(loss):
            return k
    return -1


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _binary_sparse_examples(indptr, indices, data, order, label_values, label_offsets, weight, bias, penalty,
                            path_nodes, path_children, path_mask, lr, schedule, start, stride, phase, total, losses,
                            squares):  # pragma: no cover - compiled
    """One SGD step per example ``order[k]`` of the probabilistic label tree's loss, in place:
    every child slot (n, m) is an independent logistic decision "a label of x lies below", trained
    at every node on the paths of *all* of x's labels (``label_values[label_offsets[i]:
    label_offsets[i + 1]]``): positive on those paths, negative on their other slots. ``losses[k]``
    gets the summed binary log-losses. Rate, AdaGrad ``squares`` and the rest as
    :func:`_sgd_sparse_examples`; returns -1 or the k of the first non-finite loss."""
    num_nodes, arity = bias.shape
    has_penalty = penalty.shape[0] > 0
    length = path_nodes.shape[1]
    logit = np.empty(arity, dtype=np.float32)
    alpha = np.empty(arity, dtype=np.float32)
    positive = np.zeros((num_nodes, arity), dtype=np.bool_)
    seen = np.zeros(num_nodes, dtype=np.bool_)
    visited = np.empty(num_nodes, dtype=np.int64)
    for k in range(order.shape[0]):
        i = order[k]
        rate = example_rate(lr, schedule, start, k, stride, phase, total)
        first, last = indptr[i], indptr[i + 1]
        count = 0
        for j in range(label_offsets[i], label_offsets[i + 1]):
            y = label_values[j]
            for depth in range(length):
                if not path_mask[y, depth]:
                    break
                n = path_nodes[y, depth]
                if not seen[n]:
                    seen[n] = True
                    visited[count] = n
                    count += 1
                positive[n, path_children[y, depth]] = True
        loss = 0.0
        for v_index in range(count):
            n = visited[v_index]
            _node_logits(indices, data, first, last, weight, bias, n, logit)
            residual = np.float32(0.0)
            for m in range(arity):
                if has_penalty and penalty[n, m] == _NEG_INF:
                    alpha[m] = 0.0  # a slot holding no real label: never trained
                    continue
                z = logit[m]
                # log(1 + e^-|z|) + max(0, -z) is -log sigmoid(z), stable for both signs
                softplus = np.log1p(np.exp(-abs(z)))
                if positive[n, m]:
                    loss += softplus + max(np.float32(0.0), -z)
                    r = np.float32(1.0) - np.float32(1.0) / (np.float32(1.0) + np.exp(-z))
                else:
                    loss += softplus + max(np.float32(0.0), z)
                    r = np.float32(0.0) - np.float32(1.0) / (np.float32(1.0) + np.exp(-z))
                residual += r * r
                alpha[m] = rate * r
                bias[n, m] += alpha[m]
            _node_step(indices, data, first, last, weight, n, alpha, residual, squares)
            for m in range(arity):
                positive[n, m] = False
            seen[n] = False
        losses[k] = loss
        if not np.isfinite(loss):
            return k
    return -1


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _label_log_probs(indptr, indices, data, lo, hi, weight, bias, penalty, path_nodes, path_children, path_mask,
                     binary, out):  # pragma: no cover - compiled
    """``out[i - lo, y]`` = log p(y | x_i) (eq. 3) for rows ``lo <= i < hi`` and every label y:
    every node's log-softmax (one contiguous row of ``weight`` per non-zero), summed on the paths.
    ``binary``: each slot's log-sigmoid instead (the probabilistic label tree's marginal of y)."""
    num_nodes, arity = bias.shape
    has_penalty = penalty.shape[0] > 0
    num_labels = out.shape[1]
    length = path_nodes.shape[1]
    logit = np.empty(num_nodes * arity, dtype=np.float32)
    for i in range(lo, hi):
        for j in range(num_nodes * arity):
            logit[j] = bias[j // arity, j % arity]
        for t in range(indptr[i], indptr[i + 1]):
            f = indices[t]
            v = data[t]
            for j in range(num_nodes * arity):
                logit[j] += weight[f, j] * v
        if binary:
            for j in range(num_nodes * arity):
                z = logit[j]
                if has_penalty and penalty[j // arity, j % arity] == _NEG_INF:
                    logit[j] = _NEG_INF
                else:
                    logit[j] = -(np.log1p(np.exp(-abs(z))) + max(np.float32(0.0), -z))
        for n in range(num_nodes if not binary else 0):
            base = n * arity
            top = _NEG_INF
            for m in range(arity):
                if has_penalty and penalty[n, m] == _NEG_INF:
                    logit[base + m] = _NEG_INF
                top = max(top, logit[base + m])
            norm = np.float32(0.0)
            for m in range(arity):
                norm += np.exp(logit[base + m] - top)
            shift = top + np.log(norm)
            for m in range(arity):
                logit[base + m] -= shift
        for y in range(num_labels):
            s = np.float32(0.0)
            for depth in range(length):
                if not path_mask[y, depth]:
                    break
                s += logit[path_nodes[y, depth] * arity + path_children[y, depth]]
            out[i - lo, y] = s


# ---------------------------------------------------------------------------------------------- starting trees
def label_centroids(features: sp.csr_matrix, label_values: np.ndarray, label_offsets: np.ndarray,
                    num_labels: int) -> sp.csr_matrix:
    """[K, F] label centroids: the sum of the feature rows of each label's documents, scaled to
    unit length (Parabel's label representation; a label without documents is a zero row)."""
    lengths = np.diff(label_offsets)
    docs = np.repeat(np.arange(lengths.size), lengths)
    membership = sp.csr_matrix((np.ones(label_values.size, dtype=np.float32), (label_values, docs)),
                               shape=(num_labels, lengths.size))
    centroids = (membership @ features).tocsr()
    norms = np.sqrt(np.asarray(centroids.multiply(centroids).sum(axis=1)).ravel())
    return sp.diags(1.0 / np.maximum(norms, 1e-12)).dot(centroids).tocsr().astype(np.float32)


def kmeans_label_tree(centroids: sp.csr_matrix | np.ndarray, arity: int, seed: int = 0, components: int = 100,
                      fixed_depth: bool = False) -> Tree:
    """The balanced k-means label tree of the label-tree classifiers (Parabel, Bonsai, napkinXC's
    k-means trees): labels clustered by their centroids (:func:`label_centroids`), every cluster
    holding at most M labels, built before training and never changed.

    The centroids are projected on their ``components`` leading singular directions (truncated
    SVD) and normalised, then: depth 2 when K <= M**2 (M clusters of at most M labels under the
    root, k-means with a greedy fill), else the depth-3 tree of :func:`hsm.clustering.clustering_tree`
    (M**2 clusters grouped M by M); deeper trees are refused (raise ``arity``). ``fixed_depth``:
    the complete tree of that depth in heap layout (empty leaf positions where a cluster holds
    fewer than M labels), the shape Algorithm 3 re-assigns, instead of a well-formed tree."""
    TruncatedSVD = require("sklearn.decomposition", "the k-means start tree").TruncatedSVD

    from hsm.clustering import kmeans_fill, clustering_tree

    num_labels = centroids.shape[0]
    arity = check_integer(arity, "arity")
    if not 2 <= arity <= num_labels:
        raise ValueError(f"arity must be in [2, K = {num_labels}], got {arity}")
    if num_labels > arity**3:
        raise ValueError(f"K = {num_labels} labels need a tree deeper than 3 at arity {arity}: "
                         f"use arity >= {math.ceil(num_labels ** (1 / 3))}")
    width = min(components, centroids.shape[1] - 1, num_labels - 1)
    if sp.issparse(centroids) and width >= 2:
        points = TruncatedSVD(width, random_state=seed).fit_transform(centroids)
    else:
        points = np.asarray(centroids.todense() if sp.issparse(centroids) else centroids, dtype=np.float64)
    points = points / np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1e-12)
    if num_labels <= arity**2:
        clusters, _ = kmeans_fill(points, arity, arity, seed)
        _, clusters = np.unique(clusters, return_inverse=True)
        tree = Tree.from_clusters(clusters, arity, 2)
    else:
        tree = clustering_tree(points, arity, depth=3, seed=seed)
    return tree if fixed_depth else full_tree(tree)


def full_tree(tree: Tree) -> Tree:
    """``tree`` with every empty slot of a reachable node holding a dummy leaf (ids K, K+1, ...),
    so that it is the full M-ary tree Algorithm 2 needs (ICML §5); dummy slots keep probability 0."""
    child_node, child_label = tree.child_node.copy(), tree.child_label.copy()
    rows = np.zeros(child_node.shape[0], dtype=bool)
    rows[tree.bfs_order] = True
    empty = rows[:, None] & (child_node < 0) & (child_label < 0)
    first = max(tree.leaf_ids_max + 1, tree.num_labels)
    child_label[empty] = first + np.arange(int(empty.sum()))
    return Tree(child_node, child_label, tree.num_labels, label_names=tree.label_names)


# ---------------------------------------------------------------------------------------------- the trainer
class _SparseHogwildTrainer(HogwildTrainer):
    """:class:`HogwildTrainer`'s epochs, chunks and rebuild plans on the sparse kernel."""

    def __init__(self, classifier: "SparseTreeClassifier", data: np.ndarray, label_values: np.ndarray,
                 label_offsets: np.ndarray) -> None:
        super().__init__(classifier)
        self.data, self.label_values, self.label_offsets = data, label_values, label_offsets

    def _inputs(self) -> tuple[bool, np.ndarray]:
        return False, np.zeros((0, 0), dtype=np.float32)  # no embedding: x is the representation

    def _step_examples(self, lengths: np.ndarray, num_docs: int) -> int:
        """The sparse kernel runs each thread's whole share in one call (:meth:`_run_chunk`), so
        the step is the whole epoch; the base class sizes its steps from the dense layer, which
        this classifier does not have."""
        return max(1, int(num_docs))

    def _run_chunk(self, values, offsets, order, targets, mean, embedding, schedule_code, done, total, collect,
                   losses, threads, epoch, position) -> None:
        size = order.size
        if size == 0:
            return
        clf = self.classifier
        sums, paths, counts = statistics_arrays(clf.statistics)
        nodes, children, mask, penalty = clf._path_arrays()
        parts = max(1, min(threads, size))
        bounds = np.linspace(0, size, parts + 1).astype(np.int64)
        shares = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        bad = [-1] * len(shares)

        def task(index: int, lo: int, hi: int) -> None:
            if clf.node_loss == "binary":  # every label of the example at once: the targets are not used
                bad[index] = _binary_sparse_examples(offsets, values, self.data, order[lo:hi], self.label_values,
                                                     self.label_offsets, clf.weight, clf.bias, penalty, nodes,
                                                     children, mask, clf.lr, schedule_code, float(done),
                                                     float(parts), float(index), float(total), losses[lo:hi],
                                                     clf.squares)
                return
            bad[index] = _sgd_sparse_examples(offsets, values, self.data, order[lo:hi], targets, clf.weight, clf.bias,
                                              penalty, nodes, children, mask, clf.lr, schedule_code, float(done),
                                              float(parts), float(index), float(total), collect, sums, paths, counts,
                                              losses[lo:hi], clf.squares)

        run_on_pool(task, shares)
        for index, k in enumerate(bad):
            if k >= 0:
                raise FloatingPointError(f"training loss is not finite at epoch {epoch}, example "
                                         f"{int(order[shares[index][0] + k])} (lr={clf.lr}): lower lr")

    def _rebuild(self, done: int) -> ReassignRecord:
        """AssignLabels (Algorithm 2); node parameters stay with their node ids (ICML §4)."""
        clf = self.classifier
        old = clf.tree

        def install(result: Reassignment) -> None:
            if clf.changed_nodes != "keep":
                clf._refresh(_changed_nodes(old, result.tree, result.moved_nodes))
            clf._set_tree(result.tree)

        # ICML supplement Algorithm 3 keeps every label at the tree's depth
        algorithm = "depth" if clf.depth == "fixed" else "well_formed"
        return rebuild_tree(old, clf.statistics, algorithm, install, step=done, score=clf.score)[1]


def _changed_nodes(old: Tree, new: Tree, moved_nodes: np.ndarray) -> np.ndarray:
    """Internal node ids whose children differ between ``old`` and ``new`` (a label or a subtree
    moved into or out of one of their slots), with Algorithm 2's ``moved_nodes``."""
    differs = ((old.child_node != new.child_node) | (old.child_label != new.child_label)).any(axis=1)
    return np.union1d(np.flatnonzero(differs), np.asarray(moved_nodes, dtype=np.int64))


# ---------------------------------------------------------------------------------------------- the classifier
def _check_weights_fit(num_features: int, slots: int, fix: str, growing: bool = False) -> None:
    """ValueError naming the size and ``fix`` when weights [num_features, slots] in float32 would
    take more than 80 % of this machine's memory (checked before they are allocated, so that a
    model too large fails in one line rather than in numpy's allocator or the system's OOM killer);
    ``growing``: the weights of a model being grown, which add_labels builds beside the old ones."""
    from hsm.classifiers.fast_classifier import beyond_memory

    need = 4 * num_features * slots
    have = beyond_memory(need)
    if have is not None:
        what = "the grown weights" if growing else "the weights"
        raise ValueError(f"{what} of {num_features:,} features x {slots:,} slots need {need / 2**30:.1f} GiB, "
                         f"more than 80 % of this machine's {have / 2**30:.1f} GiB: {fix}")


def _topk_lowest_id(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest ``scores`` [n, K] of each row, best first, equal values ordered
    by index (the lowest first, as :func:`hsm.search.topk_lowest_id` and the layers' searches).
    ``argpartition`` finds the k-th value; every entry at least that large (k of them, more with
    ties) is then sorted by value, then index."""
    if k >= scores.shape[1]:
        return np.argsort(-scores, axis=1, kind="stable")[:, :k]
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]
    rows, index = np.nonzero(scores >= kth)
    order = np.lexsort((index, -scores[rows, index], rows))
    rows, index = rows[order], index[order]
    starts = np.searchsorted(rows, np.arange(scores.shape[0]))
    return index[starts[:, None] + np.arange(k)]


class SparseTreeClassifier:
    """Hierarchical softmax with a linear model per node on sparse features (ICML eq. 3 with
    ``f(x) = x``), the tree fixed or learned by Algorithm 1.

    Parameters
    ----------
    output: ``"flat"`` (one softmax over all K labels), ``"tree"`` (the starting tree, fixed) or
        ``"learned"`` (Algorithm 1 from the starting tree).
    start: the starting tree: ``"huffman"`` (M-ary Huffman tree of the label counts plus one,
        ICML §7.1), ``"kmeans"`` (:func:`kmeans_label_tree`) or a :class:`hsm.Tree`.
    arity: M; None picks ``ceil(sqrt(K))``, a tree of depth 2 for balanced trees.
    lr: the initial per-example learning rate (rows of x have unit length).
    epochs: passes over the training data.
    threads: Hogwild threads (1 is deterministic).
    lr_schedule: as :class:`hsm.classifiers.fast_classifier.FastBowClassifier` (``"auto"``: constant then
        linear for ``"learned"``, linear otherwise).
    rebuilds: AssignLabels calls in the first half of training (ICML §11.1: 50).
    prior, decay, score: Algorithm 1's statistics (:class:`hsm.NodeStatistics`) and Algorithm 2's
        ranking score (ICML eq. 12 by default).
    multi_label: how a document with several labels is trained: ``"sample"`` one of them per
        epoch, uniformly (fastText), or ``"all"`` of them every epoch, as one example per label
        (the pick-all-labels reduction of Menon et al. 2019, whose top-k is consistent for P@k);
        ``node_loss="binary"`` always trains all of them at once.
    optimizer: ``"sgd"`` (fastText's per-example step) or ``"adagrad"`` (the step of each
        feature at each node scaled by its own gradient history, Duchi et al. 2011: rare
        features, most bigrams, keep large steps).
    node_loss: ``"softmax"`` over the M children of each node (eq. 3: p(y|x) is a distribution
        over labels) or ``"binary"``: an independent logistic decision per child, "one of x's
        labels lies below", trained on the paths of all of x's labels at once (the probabilistic
        label tree of Jasinska-Kobus et al. 2020; with ``output="flat"``, one-vs-rest logistic
        regression). ``log_prob`` is then each label's estimated marginal probability. Algorithm 1
        learns from the children's distribution, so ``"binary"`` takes a fixed tree only.
    depth: ``"free"``: the tree is well formed and Algorithm 2 may deepen it; ``"fixed"``: the
        start is the complete tree of its depth (the k-means tree in heap layout, or a
        fixed-depth :class:`hsm.Tree`) and rebuilds use Algorithm 3 of the ICML supplement,
        which keeps every label at that depth. A Huffman start has no fixed depth.
    changed_nodes: what a rebuild does to a node whose children changed: ``"keep"`` its weights
        and step sizes (ICML §4: parameters stay with their node ids), ``"fresh_steps"``: keep
        the weights but restart its AdaGrad sums, so the re-fit takes full steps again, or
        ``"fresh"``: zero its weights and sums, as an untrained node.
    seed: the orders, the multi-label draws and the k-means tree.

    Attributes after :meth:`fit`: ``weight`` [F, N*M], ``bias`` [N, M], ``tree`` (None for
    flat), ``start_tree``, ``statistics``, ``history`` (:class:`hsm.classifiers.fast_trainer.FitHistory`).
    """

    def __init__(self, output: Literal["flat", "tree", "learned"] = "learned",
                 start: Literal["huffman", "kmeans"] | Tree = "huffman", arity: int | None = None, lr: float = 0.5,
                 epochs: int = 5, threads: int | None = None,
                 lr_schedule: Literal["auto", "linear", "constant_then_linear"] = "auto", rebuilds: int = 50,
                 prior: float = 1.0, decay: float = 1.0, score: RankingScore | None = None,
                 multi_label: Literal["sample", "all"] = "sample", optimizer: Literal["sgd", "adagrad"] = "sgd",
                 node_loss: Literal["softmax", "binary"] = "softmax", depth: Literal["free", "fixed"] = "free",
                 changed_nodes: Literal["keep", "fresh_steps", "fresh"] = "keep", seed: int = 0) -> None:
        self.output = check_choice(output, "output", ("flat", "tree", "learned"))
        if not isinstance(start, Tree):
            start = check_choice(start, "start", ("huffman", "kmeans"), described="'huffman', 'kmeans' or a Tree")
        self.start = start
        self.arity = None if arity is None else check_count(arity, "arity", 2, shown="arity M")
        self.lr = check_positive(lr, "lr")
        self.epochs = check_count(epochs, "epochs", 1)
        if threads is not None and check_integer(threads, "threads") < 1:
            raise ValueError(f"threads must be >= 1 or None, got {threads}")
        self.threads = threads
        self.lr_schedule = check_choice(lr_schedule, "lr_schedule", ("auto", "linear", "constant_then_linear"))
        self.rebuilds = check_count(rebuilds, "rebuilds", 0)
        self.prior = check_positive(prior, "prior")
        self.decay = check_fraction(decay, "decay")
        self.score: RankingScore = check_ranking_score(score, default="eq12")
        self.multi_label = check_choice(multi_label, "multi_label", ("sample", "all"))
        self.optimizer = check_choice(optimizer, "optimizer", ("sgd", "adagrad"))
        self.node_loss = check_choice(node_loss, "node_loss", ("softmax", "binary"))
        if self.node_loss == "binary" and self.output == "learned":
            raise ValueError("node_loss='binary' has no distribution over children for Algorithm 1 to learn from: "
                             "use output='tree' or 'flat', or node_loss='softmax' to learn the tree")
        self.depth = check_choice(depth, "depth", ("free", "fixed"))
        if self.depth == "fixed" and (start == "huffman" or isinstance(start, Tree) and start.depth_limit is None):
            raise ValueError("depth='fixed' needs a fixed-depth start: start='kmeans' or a Tree with depth_limit "
                             "(Tree.balanced / Tree.random); a Huffman tree's leaves lie at many depths")
        self.changed_nodes = check_choice(changed_nodes, "changed_nodes", ("keep", "fresh_steps", "fresh"))
        if self.changed_nodes == "fresh_steps" and self.optimizer != "adagrad":
            raise ValueError("changed_nodes='fresh_steps' restarts AdaGrad's sums: use optimizer='adagrad'")
        self.seed = check_count(seed, "seed", 0)  # numpy's generators take seeds >= 0
        # what HogwildTrainer reads besides the above
        self.schedule, self.rebuild_tokens, self.reduce, self.shuffle, self.reset_moved_nodes = (
            "first_half", 100_000, "sum", True, False)
        self.weight: np.ndarray | None = None
        self.bias: np.ndarray | None = None
        self.squares: np.ndarray | None = None
        self.tree: Tree | None = None
        self.start_tree: Tree | None = None
        self.statistics: NodeStatistics | None = None
        self.history = FitHistory()
        self._paths: tuple[np.ndarray, ...] | None = None

    # ------------------------------------------------------------------ set-up
    @property
    def num_features(self) -> int:
        self._check_fitted()
        return self.weight.shape[0]

    @property
    def num_labels(self) -> int:
        self._check_fitted()
        return self._num_labels

    def _set_tree(self, tree: Tree | None) -> None:
        self.tree = tree
        penalty, nodes, children, mask = path_arrays(tree, self._num_labels)
        self._paths = (nodes, children, mask, penalty)

    def _path_arrays(self) -> tuple[np.ndarray, ...]:
        return self._paths

    def _starting_tree(self, features: sp.csr_matrix, label_values: np.ndarray, label_offsets: np.ndarray,
                       counts: np.ndarray) -> Tree:
        if isinstance(self.start, Tree):
            if self.start.num_labels != counts.size:
                raise ValueError(f"the start tree has {self.start.num_labels} labels, the data {counts.size}")
            return self.start
        arity = self.arity or max(2, math.ceil(math.sqrt(counts.size)))
        if arity > counts.size:
            raise ValueError(f"arity M = {arity} exceeds the K = {counts.size} labels; use arity <= {counts.size}")
        if self.start == "huffman":
            return Tree.huffman(counts + 1.0, arity)
        return kmeans_label_tree(label_centroids(features, label_values, label_offsets, counts.size), arity,
                                 seed=self.seed, fixed_depth=self.depth == "fixed")

    def _refresh(self, nodes: np.ndarray) -> None:
        """Restart the AdaGrad sums of ``nodes`` (and, for ``changed_nodes="fresh"``, zero their
        weights and biases): called by a rebuild before the new tree is set."""
        if nodes.size == 0:
            return
        if self.squares.shape[0]:
            self.squares[:, nodes] = 0.0
        if self.changed_nodes == "fresh":
            arity = self.bias.shape[1]
            columns = (nodes[:, None] * arity + np.arange(arity)).ravel()
            self.weight[:, columns] = 0.0
            self.bias[nodes] = 0.0

    def _check_fitted(self) -> None:
        if self.weight is None:
            raise RuntimeError("the classifier has no model yet: call fit first")

    # ------------------------------------------------------------------ training
    def fit(self, features: sp.spmatrix, labels: Any, num_labels: int | None = None) -> "SparseTreeClassifier":
        """Train on ``features`` ([n, F] sparse, e.g. :func:`hsm.classifiers.sparse_features.tfidf_features`'
        rows) and ``labels`` (one int per row, or a label set per row).

        ``num_labels``: K when the training data do not show the largest label id; a label id of
        K or more is then refused, naming it and its row. Without it K is the largest id plus one,
        refused (as by :class:`hsm.classifiers.fast_classifier.FastBowClassifier`) when that exceeds 10 times
        the distinct ids seen plus 1,000: a stray id (10**6 among 0..9) would otherwise size and
        train a model of a million labels no example uses.

        Raises ValueError for a non-2-D or empty matrix, mismatched lengths, fewer than 2 labels, a
        label id out of range, a feature value beyond :data:`LARGEST_FEATURE` (1e18: scale the features) or
        a model too large for this machine's memory, and :class:`hsm.NonFiniteInputError` (a
        ValueError) naming the first row holding NaN or inf, all before anything is allocated."""
        features = _as_csr(features, "features", largest=LARGEST_FEATURE)
        n, num_features = features.shape
        label_values, label_offsets = as_labels(labels, n)
        seen = int(label_values.max()) + 1
        if num_labels is None:
            check_inferred_size(label_values, seen, "label", "num_labels")
            k = seen
        else:
            k = check_integer(num_labels, "num_labels")
            if seen > k:
                first = int(np.argmax(label_values >= k))
                row = int(np.searchsorted(label_offsets, first, side="right")) - 1
                raise ValueError(f"unknown label {int(label_values[first])} in labels[{row}]: num_labels={k} gives "
                                 f"labels 0..{k - 1}; renumber the labels or pass a larger num_labels")
        if k < 2:
            raise ValueError(f"a classifier needs K >= 2 labels, got {k}")
        counts = np.bincount(label_values, minlength=k).astype(np.float64)
        self._num_labels = k
        tree = None if self.output == "flat" else self._starting_tree(features, label_values, label_offsets, counts)
        slots = k if tree is None else tree.num_nodes * tree.arity
        _check_weights_fit(num_features, slots, "keep fewer features (tfidf_features' min_df / max_features)")
        if self.output == "learned" and self.depth == "free" and not tree.is_well_formed():
            raise ValueError("Algorithm 2 re-assigns a well-formed tree (every node with M children): pass "
                             "full_tree(start) or depth='fixed' with a fixed-depth start")
        self.start_tree = tree
        # written once in order: np.zeros maps pages lazily, and the first random touch of each page
        # by the SGD steps is a page fault (on virtual machines, orders of magnitude slower than a write)
        self.weight = np.empty((num_features, slots), dtype=np.float32)
        self.weight.fill(0.0)
        self.bias = np.zeros((1 if tree is None else tree.num_nodes, k if tree is None else tree.arity), np.float32)
        self.squares = np.empty((num_features if self.optimizer == "adagrad" else 0, self.bias.shape[0]), np.float32)
        self.squares.fill(0.0)
        self._set_tree(tree)
        self.statistics = (NodeStatistics(tree, prior=self.prior, decay=self.decay)
                           if self.output == "learned" else None)
        if (self.node_loss == "softmax" and self.multi_label == "all"
                and (np.diff(label_offsets) != 1).any()):  # one example per (document, label)
            features = features[np.repeat(np.arange(n), np.diff(label_offsets))]
            label_offsets = np.arange(label_values.size + 1, dtype=np.int64)
        trainer = _SparseHogwildTrainer(self, features.data, label_values, label_offsets)
        self.history = trainer.train(features.indices, features.indptr, label_values, label_offsets, False)
        return self

    # ------------------------------------------------------------------ inference
    def log_prob(self, features: sp.spmatrix) -> np.ndarray:
        """[n, K] log p(y | x) of every label (eq. 3), exact.

        Raises :class:`hsm.NonFiniteInputError` (a ValueError) naming the first row holding NaN or
        inf, or whose node logits overflow float32 (finite but too large features), rather than
        returning NaN log-probabilities."""
        self._check_fitted()
        features = _as_csr(features, "features", self.num_features)
        n = features.shape[0]
        out = np.empty((n, self._num_labels), dtype=np.float32)
        self._log_probs_into(features, 0, n, out)
        _check_scores_finite(out, 0)
        return out

    def _log_probs_into(self, features: sp.csr_matrix, lo: int, hi: int, out: np.ndarray) -> None:
        nodes, children, mask, penalty = self._paths
        threads = max(1, min(self.threads or 1, hi - lo))
        bounds = np.linspace(lo, hi, threads + 1).astype(np.int64)
        shares = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

        def task(index: int, a: int, b: int) -> None:
            _label_log_probs(features.indptr, features.indices, features.data, a, b, self.weight, self.bias, penalty,
                             nodes, children, mask, self.node_loss == "binary", out[a - lo:b - lo])

        run_on_pool(task, shares)

    def predict(self, features: sp.spmatrix, k: int = 1, batch: int = 4096) -> Prediction:
        """The ``k`` most likely labels of every row (exact) and their log-probabilities, computed
        ``batch`` rows at a time (a [batch, K] block of scores).

        Raises ValueError for ``k`` or ``batch`` below 1 and, as :meth:`log_prob`,
        :class:`hsm.NonFiniteInputError` for rows with NaN, inf or overflowing logits (a NaN score
        would make the "most likely" label arbitrary)."""
        self._check_fitted()
        features = _as_csr(features, "features", self.num_features)
        k = check_count(k, "k", 1)
        batch = check_count(batch, "batch", 1)
        k = min(k, self._num_labels)
        n = features.shape[0]
        labels = np.empty((n, k), dtype=np.int64)
        scores = np.empty((n, k), dtype=np.float32)
        block = np.empty((min(batch, max(n, 1)), self._num_labels), dtype=np.float32)
        for lo in range(0, n, batch):
            hi = min(n, lo + batch)
            part = block[:hi - lo]
            self._log_probs_into(features, lo, hi, part)
            _check_scores_finite(part, lo)
            labels[lo:hi] = _topk_lowest_id(part, k)
            scores[lo:hi] = np.take_along_axis(part, labels[lo:hi], axis=1)
        return Prediction(labels, scores)

    def add_labels(self, features_per_label: Sequence[sp.spmatrix], placement: Literal["objective", "random"] = "objective",
                   seed: int = 0, reference: sp.spmatrix | None = None) -> LabelAddition:
        """Add labels this model was not trained on, without retraining: ``features_per_label[i]``
        ([n_i, F] sparse, transformed as the training rows) holds a few examples of new label
        ``K + i``; their routing places it in the tree by Algorithm 2's pair score and their mean
        row initialises its slot (:func:`hsm.label_addition.place_labels`, under the model's depth
        rule). ``reference``: a sample of rows the model already serves (its training rows, say),
        which the new slots are calibrated against (as ``reference`` of
        :func:`hsm.label_addition.add_labels`). ``placement="random"``: a random eligible child at
        each node instead (``seed`` draws it). Trained labels keep their paths and parameters;
        the node statistics of a learned tree grow with it (:meth:`hsm.NodeStatistics.grown`).

        Raises ValueError in one line, before anything changes, for a flat or binary-node model
        (no tree, or no distribution over children to place by), no labels, an example matrix with
        no row or another number of columns, and NaN or infinite values."""
        start = time.perf_counter()
        self._check_fitted()
        if self.tree is None:
            raise ValueError("add_labels places labels in a tree: this model's output is flat (train it with "
                             "output='tree' or 'learned')")
        if self.node_loss != "softmax":
            raise ValueError("add_labels places labels by the children's distribution at each node: node_loss='binary' "
                             "has none (train with node_loss='softmax')")
        check_placement(placement, seed)
        if sp.issparse(features_per_label) or not isinstance(features_per_label, Sequence) or not features_per_label:
            raise ValueError("features_per_label must be a non-empty list with one [n, F] sparse matrix per new label")
        examples = [_as_csr(rows, f"features_per_label[{index}]", self.num_features).astype(np.float64)
                    for index, rows in enumerate(features_per_label)]
        if reference is not None:
            reference = _as_csr(reference, "reference", self.num_features).astype(np.float64)
        tree, arity = self.tree, self.tree.arity
        added, old_k, num_features = len(examples), self._num_labels, self.weight.shape[0]
        _check_weights_fit(num_features, self.weight.shape[1] + added * arity,
                           f"add fewer than {added:,} labels at once or train on fewer features", growing=True)
        # room for one new node per label, trimmed once the tree is known
        slots = _SparseSlots(np.concatenate([self.weight, np.zeros((num_features, added * arity), np.float32)], axis=1),
                             np.concatenate([self.bias, np.zeros((added, arity), np.float32)]), arity)
        new_tree, placed, paths, new_nodes = place_labels(tree, examples, slots, self.statistics, self.score,
                                                          placement=placement, seed=seed, reference=reference)
        nodes = new_tree.num_nodes
        self.weight = np.ascontiguousarray(slots.weight[:, :nodes * arity])
        self.bias = slots.bias[:nodes].copy()
        if self.squares.shape[0]:  # AdaGrad's sums: the new nodes start fresh
            self.squares = np.concatenate([self.squares, np.zeros((num_features, nodes - tree.num_nodes),
                                                                  np.float32)], axis=1)
        else:
            self.squares = np.empty((0, nodes), np.float32)
        if self.statistics is not None:
            self.statistics = self.statistics.grown(new_tree, old_k)
        self._num_labels = old_k + added
        self._set_tree(new_tree)
        return LabelAddition(new_tree, np.arange(old_k, old_k + added), placed, new_nodes,
                             time.perf_counter() - start, paths)

    def model_bytes(self) -> int:
        """Bytes of the parameters (dense; the weights of features a node never saw are zeros)."""
        self._check_fitted()
        return int(self.weight.nbytes + self.bias.nbytes)


class _SparseSlots(NodeSlots):
    """The node slots of :class:`SparseTreeClassifier` as :func:`hsm.label_addition.place_labels`
    reads them (:class:`hsm.label_addition.NodeSlots`): ``weight`` [F, N' * M], ``bias`` [N', M]."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, arity: int) -> None:
        self.weight, self.bias, self.arity = weight, bias, arity

    def logits(self, rows: sp.csr_matrix, node: int) -> np.ndarray:
        block = self.weight[:, node * self.arity:(node + 1) * self.arity]
        return np.asarray(rows @ block, dtype=np.float64) + self.bias[node]

    def slot(self, node: int, slot: int) -> tuple[np.ndarray, float]:
        return self.weight[:, node * self.arity + slot].astype(np.float64), float(self.bias[node, slot])

    def set_slot(self, node: int, slot: int, row: np.ndarray, bias: float) -> None:
        self.weight[:, node * self.arity + slot] = row
        self.bias[node, slot] = bias


def _as_csr(features: Any, name: str, num_features: int | None = None,
            largest: float | None = None) -> sp.csr_matrix:
    """``features`` as a float32 CSR matrix with sorted int64 indices, checked: TypeError unless
    sparse, ValueError for a wrong shape, :class:`NonFiniteInputError` naming the first row with
    NaN or inf, and ValueError naming the first value above ``largest`` in magnitude (None: above
    float32's range), which the kernels' float32 arithmetic would turn into inf or NaN."""
    if not sp.issparse(features):
        raise TypeError(f"{name} must be a scipy.sparse matrix (e.g. TfidfFeatures.transform), got "
                        f"{type(features).__name__}")
    features = features.tocsr()
    if features.ndim != 2 or features.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty [n, F] matrix, got shape {features.shape}")
    if num_features is not None and features.shape[1] != num_features:
        raise ValueError(f"{name} has {features.shape[1]} columns, the model {num_features} features: transform "
                         f"with the same fitted TfidfFeatures")
    if not features.has_sorted_indices:
        features = features.sorted_indices()
    data = np.asarray(features.data)
    if data.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
    finite = np.isfinite(data)
    if not finite.all():
        rows = np.unique(_rows_of(features.indptr, np.flatnonzero(~finite)))
        raise NonFiniteInputError(f"{name} has NaN or infinite values in {rows.size} of {features.shape[0]} rows "
                                  f"(first: row {rows[0]}): drop or repair those rows")
    bound = float(np.finfo(np.float32).max) if largest is None else largest
    if data.size and max(abs(float(data.max())), abs(float(data.min()))) > bound:
        first = int(np.argmax(np.abs(data.astype(np.float64)) > bound))
        raise ValueError(f"{name} has the value {float(data[first]):.3g} in row {_rows_of(features.indptr, first)}, "
                         f"beyond {bound:.3g} in magnitude, where the model's float32 arithmetic overflows: scale "
                         f"the features (e.g. rows of unit length, as tfidf_features gives)")
    return sp.csr_matrix((np.asarray(data, dtype=np.float32), features.indices.astype(np.int64),
                          features.indptr.astype(np.int64)), shape=features.shape)


def _rows_of(indptr: np.ndarray, positions: Any) -> Any:
    """The CSR rows holding the entries at ``positions`` of ``data``/``indices``."""
    return np.searchsorted(indptr, positions, side="right") - 1


def _check_scores_finite(scores: np.ndarray, lo: int) -> None:
    """:class:`NonFiniteInputError` naming the first row ``lo + i`` of ``scores`` holding NaN or inf.

    The rows' features are finite (checked before), and every log-probability of finite node
    logits is finite, so such a row's logits overflowed float32: its features are too large for
    the trained weights."""
    bad = np.flatnonzero(~np.isfinite(scores).all(axis=1))
    if bad.size:
        raise NonFiniteInputError(f"the node logits of row {lo + int(bad[0])} overflow float32: its features are "
                                  f"finite but too large; scale them (e.g. rows of unit length, as tfidf_features "
                                  f"gives)")
