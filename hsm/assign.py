"""Label assignment: the greedy AssignLabels of ICML Algorithms 2 and 3.

At a node ``n`` the algorithms rank every (label ``i``, child ``j``) pair by the paper's score

* eq. 10 (``score="eq10"``): (2/M) q_i (1 - q_i) sign(p_{j|i} - p_j)
* eq. 12 (``score="eq12"``): (2/M) q_i (1 - q_i) sign(p_{j|i} - p_j) p_{j|i}   (the language-model variant)

(:func:`hsm.objective.ranking_scores`, with its tie rule)

and walk the pairs in decreasing score, giving label ``i`` to child ``j`` when ``i`` is still
unassigned and ``j`` may still take labels. What "may take" means is the only difference:

* **Algorithm 3** (depth constraint, ICML supplement; arXiv Algorithm 2): a node at depth ``d``
  (the root at depth 0) takes at most ``M**(D-d)`` labels, the leaves below it. The papers write
  the same exponent with the parent's depth, counted from 1 at the root. The arXiv pseudocode
  prints ``M**(D-d+1)``, which lets one child of the root take all ``M**D`` leaves' worth of labels
  and so cannot produce a depth-``D`` tree (``capacity_rule="arxiv_printed"`` reproduces the
  failure).
* **Algorithm 2** (well-formed trees, ICML): every child must end with a label count
  ``= 1 (mod M-1)``, none empty, so the tree stays a full M-ary tree. The printed CheckFull
  deadlocks for M = 2 and M >= 4 (the book's Algorithms chapter; ``rule="printed"`` reproduces it). The rule we
  use is the released code's: a child that is *closed* (count ``= 1 mod (M-1)``) is eligible only
  while the slack (labels left minus labels still needed to close every child) is at least
  ``M - 1``, since one more label there opens a block of ``M - 1``.

The greedy is the sequential scan of the sorted pairs in the paper. We run it with a heap
holding each unassigned label's best remaining pair (compiled with numba), which visits the pairs
in exactly the same order (ties broken by label id, then child id) without sorting all ``K M``
pairs: a full re-assignment at K = 250k, M = 65, D = 3 takes about a second.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numba
import numpy as np

from .objective import TIE_TOLERANCE, RankingScore, check_ranking_score, ranking_scores
from .tree import Tree

__all__ = [
    "AssignmentDeadlock",
    "AssignmentError",
    "ReassignRecord",
    "Reassignment",
    "StatisticsSource",
    "assign_labels",
    "assign_labels_depth_constrained",
    "assign_labels_well_formed",
    "assign_node",
    "assign_node_well_formed",
    "assignment_score",
    "brute_force_assign",
    "greedy_assign_reference",
    "moved_fraction",
    "pair_scores",
    "rebuild_tree",
]


class AssignmentError(ValueError):
    """The assignment problem has no solution (not enough room, malformed input)."""


class AssignmentDeadlock(AssignmentError):
    """The greedy stopped with labels left and no child allowed to take them."""


# ---------------------------------------------------------------------------- scores
@numba.njit(cache=True)
def _node_terms_kernel(p_cond, weights, group, num_groups):  # pragma: no cover - compiled
    n, m = p_cond.shape
    total = np.zeros(num_groups)
    for i in range(n):
        total[group[i]] += weights[i]
    coef = np.zeros(n)
    marginal = np.zeros((num_groups, m))
    for i in range(n):
        g = group[i]
        q = weights[i] / total[g] if total[g] > 0 else 0.0
        coef[i] = (2.0 / m) * q * (1.0 - q)
        for j in range(m):
            marginal[g, j] += q * p_cond[i, j]
    return coef, marginal


def node_terms(p_cond: np.ndarray, weights: np.ndarray, group: np.ndarray, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(2/M) q_i (1 - q_i) per label and p_j = sum_i q_i p_{j|i} per node (eq. 7), where q_i is the
    label's share of its node's weight and ``group[i]`` the node of label i."""
    return _node_terms_kernel(np.ascontiguousarray(p_cond, dtype=np.float64), np.ascontiguousarray(weights, dtype=np.float64),
                              np.ascontiguousarray(group, dtype=np.int64), num_groups)


def _segment_scores(p_cond: np.ndarray, weights: np.ndarray, group: np.ndarray, num_groups: int,
                    score: RankingScore) -> np.ndarray:
    """Eq. 10 / 12 scores [n, M] for labels of several nodes at once (:func:`hsm.objective.ranking_scores`,
    materialised; the greedy computes the same numbers on the fly, :func:`_pair_score`)."""
    coef, marginal = node_terms(p_cond, weights, group, num_groups)
    return ranking_scores(coef, p_cond, marginal[group], times_p_cond=score == "eq12")


def _validate_node_inputs(p_cond: Any, counts: Any) -> tuple[np.ndarray, np.ndarray]:
    p_cond = np.asarray(p_cond, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if p_cond.ndim != 2 or p_cond.shape[1] < 2:
        raise ValueError(f"p_cond must be a [K, M] array with M >= 2, got shape {p_cond.shape}")
    if counts.shape != (p_cond.shape[0],):
        raise ValueError(f"counts must have shape ({p_cond.shape[0]},) to match p_cond, got {counts.shape}")
    if not (np.isfinite(p_cond).all() and np.isfinite(counts).all()):
        raise ValueError("p_cond and counts must be finite (NaN or inf found)")
    if (p_cond < 0).any() or (counts < 0).any():
        raise ValueError("p_cond and counts must be non-negative")
    if counts.sum() <= 0:
        raise ValueError("counts must not all be zero: q (eq. 6) is undefined")
    return p_cond, counts


def pair_scores(p_cond: Any, counts: Any, score: RankingScore | None = None) -> np.ndarray:
    """The [K, M] scores of eq. 10 (``score="eq10"``) or eq. 12 (``score="eq12"``, the default) at
    one node, with ``q = counts / counts.sum()`` (the Counts statistics of Algorithm 1) and p_j from
    eq. 7."""
    score = check_ranking_score(score, default="eq12")
    p_cond, counts = _validate_node_inputs(p_cond, counts)
    return _segment_scores(p_cond, counts, np.zeros(len(counts), dtype=np.int64), 1, score)


# ---------------------------------------------------------------------------- the greedy kernel
@numba.njit(cache=True)
def _before(score_a: float, label_a: int, score_b: float, label_b: int) -> bool:
    return score_a > score_b or (score_a == score_b and label_a < label_b)


@numba.njit(cache=True)
def _sift_down(heap_score, heap_label, pos, size):  # pragma: no cover - compiled
    while True:
        left = 2 * pos + 1
        if left >= size:
            return
        best = left
        right = left + 1
        if right < size and _before(heap_score[right], heap_label[right], heap_score[left], heap_label[left]):
            best = right
        if _before(heap_score[best], heap_label[best], heap_score[pos], heap_label[pos]):
            heap_score[pos], heap_score[best] = heap_score[best], heap_score[pos]
            heap_label[pos], heap_label[best] = heap_label[best], heap_label[pos]
            pos = best
        else:
            return


@numba.njit(cache=True)
def _pair_score(p_cond, marginal, coef, logp, i, g, j):  # pragma: no cover - compiled
    """:func:`hsm.objective.ranking_scores` for one (label i of node g, child j) pair, its tie rule
    included (tests/test_assign.py checks the two agree)."""
    diff = p_cond[i, j] - marginal[g, j]
    sign = 0.0 if abs(diff) <= TIE_TOLERANCE else (1.0 if diff > 0 else -1.0)
    score = sign * coef[i]
    return score * p_cond[i, j] if logp else score


@numba.njit(cache=True)
def _best_child(p_cond, marginal, coef, logp, i, g, rank, arity):  # pragma: no cover - compiled
    """Label i's first child in the order: score decreasing, then rotation (j - rank) mod M
    increasing. Returns (child, score)."""
    best_j, best_s, best_r = -1, -np.inf, arity
    for j in range(arity):
        s = _pair_score(p_cond, marginal, coef, logp, i, g, j)
        r = (j - rank) % arity
        if best_j < 0 or s > best_s or (s == best_s and r < best_r):
            best_j, best_s, best_r = j, s, r
    return best_j, best_s


@numba.njit(cache=True)
def _greedy_kernel(p_cond, marginal, coef, group, rank, capacity, well_formed, logp):  # pragma: no cover
    """Visit (label, child) pairs in decreasing score; accept when allowed.

    Each unassigned label keeps one entry in a heap, its best pair not yet rejected, so the heap
    top is always the next pair of the global sorted order (score, then label id, then rotated
    child). Returns (child per label, -1) or (partial result, label that could not be placed).
    """
    n, arity = p_cond.shape
    num_groups = capacity.shape[0]
    heap_score = np.empty(n)
    heap_label = np.arange(n)
    child_of = np.empty(n, dtype=np.int64)
    prefs = np.empty((n, arity), dtype=np.int32)  # filled for a label at its first rejection
    pointer = np.full(n, -1, dtype=np.int64)
    result = np.full(n, -1, dtype=np.int64)
    sizes = np.zeros((num_groups, arity), dtype=np.int64)
    remaining = np.zeros(num_groups, dtype=np.int64)
    needed = np.full(num_groups, arity, dtype=np.int64)  # labels still needed to close every child
    for i in range(n):
        remaining[group[i]] += 1
        child_of[i], heap_score[i] = _best_child(p_cond, marginal, coef, logp, i, group[i], rank[i], arity)
    for pos in range(n // 2 - 1, -1, -1):
        _sift_down(heap_score, heap_label, pos, n)
    size = n
    while size > 0:
        label = heap_label[0]
        g = group[label]
        child = child_of[label]
        if well_formed:
            count = sizes[g, child]
            closed = count >= 1 and (count - 1) % (arity - 1) == 0
            allowed = (not closed) or (remaining[g] - needed[g] >= arity - 1)
        else:
            closed = False
            allowed = capacity[g, child] > 0
        if allowed:
            result[label] = child
            sizes[g, child] += 1
            capacity[g, child] -= 1
            remaining[g] -= 1
            if closed:
                needed[g] += arity - 2
            else:
                needed[g] -= 1
            size -= 1
            heap_score[0] = heap_score[size]
            heap_label[0] = heap_label[size]
            _sift_down(heap_score, heap_label, 0, size)
        else:
            # First rejection: sort this label's children once (insertion sort on the M keys),
            # so that later rejections cost O(1) instead of a rescan (O(M^2) per label when
            # capacities are tight, as at the last level of a full depth-D tree).
            if pointer[label] < 0:
                row = prefs[label]
                for j in range(arity):
                    row[j] = j
                keys_s = np.empty(arity)
                keys_r = np.empty(arity, dtype=np.int64)
                for j in range(arity):
                    keys_s[j] = _pair_score(p_cond, marginal, coef, logp, label, g, j)
                    keys_r[j] = (j - rank[label]) % arity
                for a in range(1, arity):
                    cur = row[a]
                    b = a - 1
                    while b >= 0 and (keys_s[row[b]] < keys_s[cur] or (keys_s[row[b]] == keys_s[cur] and keys_r[row[b]] > keys_r[cur])):
                        row[b + 1] = row[b]
                        b -= 1
                    row[b + 1] = cur
                for a in range(arity):
                    if row[a] == child:
                        pointer[label] = a
            nxt = pointer[label] + 1
            if nxt >= arity:
                return result, label
            pointer[label] = nxt
            child_of[label] = prefs[label, nxt]
            heap_score[0] = _pair_score(p_cond, marginal, coef, logp, label, g, child_of[label])  # smaller key
            _sift_down(heap_score, heap_label, 0, size)
    return result, -1


def _rank_in_group(group: np.ndarray) -> np.ndarray:
    """Position of each label among the labels of its node, in label-id order. Ties between
    equal scores are broken by rotating from child ``rank mod M``: uninformed labels (no
    statistics: every score 0) are then dealt round-robin instead of all landing in child 0,
    which under the well-formed rule would grow a chain of depth K / (M - 1). The released code
    breaks the same symmetry by seeding each label's statistics with 0.5 on child (position mod M)."""
    order = np.argsort(group, kind="stable")
    sizes = np.bincount(group)
    rank = np.empty(len(group), dtype=np.int64)
    rank[order] = np.arange(len(group)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return rank


def _run_greedy(
    p_cond: np.ndarray,
    weights: np.ndarray,
    group: np.ndarray,
    capacity: np.ndarray,
    well_formed: bool,
    score: RankingScore,
) -> np.ndarray:
    """The greedy over all labels of several nodes (``group[i]`` = node of label i)."""
    if not np.isfinite(p_cond).all():
        raise ValueError("p_{j|i} must be finite (NaN in the node statistics?)")
    group = np.ascontiguousarray(group, dtype=np.int64)
    num_groups = capacity.shape[0]
    p_cond = np.ascontiguousarray(p_cond, dtype=np.float64)
    coef, marginal = node_terms(p_cond, weights, group, num_groups)
    result, stuck = _greedy_kernel(p_cond, marginal, coef, group, _rank_in_group(group),
                                   capacity.astype(np.int64).copy(), well_formed, score == "eq12")
    if stuck >= 0:
        raise AssignmentDeadlock(
            f"label {stuck} could not be placed: every child of its node is full"
            + (" under the well-formedness rule" if well_formed else " (capacity too small for the labels)")
        )
    return result


# ---------------------------------------------------------------------------- node level
def _capacity_row(capacity: Any, arity: int) -> np.ndarray:
    cap = np.asarray(capacity)
    if cap.ndim == 0:
        cap = np.full(arity, int(cap))
    if cap.shape != (arity,):
        raise ValueError(f"capacity must be an int or one int per child ({arity}), got shape {cap.shape}")
    if (cap < 0).any():
        raise ValueError("capacities must be non-negative")
    return cap.astype(np.int64)


def assign_node(p_cond: Any, counts: Any, capacity: Any, score: RankingScore | None = None) -> np.ndarray:
    """Greedy assignment of the labels at one node under per-child capacities (ICML Algorithm 3,
    lines "argmax over (i, j) with j not full ... if ``|assigned_j| = M^{D-d}``: full").

    Parameters
    ----------
    p_cond: [K, M] p_{j|i} at the node. counts: [K] examples per label (q = counts / sum).
    capacity: an int (every child) or [M] ints. score: "eq12" (default) ranks by eq. 12,
    "eq10" by eq. 10.

    Returns the child index of every label, shape [K].
    """
    score = check_ranking_score(score, default="eq12")
    p_cond, counts = _validate_node_inputs(p_cond, counts)
    cap = _capacity_row(capacity, p_cond.shape[1])
    if cap.sum() < len(counts):
        raise AssignmentError(f"{len(counts)} labels do not fit in total capacity {cap.sum()}")
    return _run_greedy(p_cond, counts, np.zeros(len(counts), dtype=np.int64), cap[None, :], False, score)


def assign_node_well_formed(
    p_cond: Any, counts: Any, score: RankingScore | None = None, rule: Literal["corrected", "printed"] = "corrected",
) -> np.ndarray:
    """Greedy assignment at one node of a well-formed M-ary tree (ICML Algorithm 2): every child
    ends with ``= 1 (mod M-1)`` labels and none is empty. Needs ``K = 1 (mod M-1)``, K >= M.

    ``rule="corrected"`` is the released code's eligibility rule (module docstring);
    ``rule="printed"`` runs the CheckFull procedure exactly as printed in the paper, which raises
    :class:`AssignmentDeadlock` for M = 2 and M >= 4 as soon as K > M (the book's Algorithms chapter,
    "Algorithm 2: well-formed trees, and a CheckFull that deadlocks").
    """
    score = check_ranking_score(score, default="eq12")
    p_cond, counts = _validate_node_inputs(p_cond, counts)
    num_labels, arity = p_cond.shape
    if num_labels < arity or (num_labels - 1) % (arity - 1) != 0:
        raise AssignmentError(
            f"a well-formed split needs K >= M and K = 1 (mod M-1); got K = {num_labels}, M = {arity}: "
            "pad with zero-count dummy labels"
        )
    if rule == "printed":
        return _check_full_printed(_segment_scores(p_cond, counts, np.zeros(num_labels, dtype=np.int64), 1, score))
    if rule != "corrected":
        raise ValueError(f"rule must be 'corrected' or 'printed', got {rule!r}")
    zeros = np.zeros(num_labels, dtype=np.int64)
    return _run_greedy(p_cond, counts, zeros, np.zeros((1, arity), dtype=np.int64), True, score)


def _sorted_pairs(scores: np.ndarray) -> list[tuple[int, int]]:
    """All (label, child) pairs in the greedy's order: decreasing score, then label id, then child
    rotated to start at ``label mod M`` (the tie rule of :func:`_rank_in_group`)."""
    num_labels, arity = scores.shape
    labels, children = np.meshgrid(np.arange(num_labels), np.arange(arity), indexing="ij")
    rotation = (children - labels) % arity
    order = np.lexsort((rotation.ravel(), labels.ravel(), -scores.ravel()))
    return [(int(labels.ravel()[k]), int(children.ravel()[k])) for k in order]


def _check_full_printed(scores: np.ndarray) -> np.ndarray:
    """ICML Algorithm 2 with CheckFull transcribed literally (the procedure read as not nested in the
    loop, as printed)."""
    num_labels, arity = scores.shape
    assigned = np.full(num_labels, -1)
    sizes = [0] * arity
    full: set[int] = set()
    count = num_labels - (arity - 1)
    while (assigned < 0).any():
        pair = next(((i, j) for i, j in _sorted_pairs(scores) if assigned[i] < 0 and j not in full), None)
        if pair is None:
            raise AssignmentDeadlock(
                f"printed CheckFull deadlocked: child sizes {sizes}, {(assigned < 0).sum()} labels unassigned, "
                f"every child marked full (M = {arity}, K = {num_labels})"
            )
        i, j = pair
        assigned[i] = j
        sizes[j] += 1
        # procedure CheckFull(full, assigned, count, j)
        if sizes[j] % (arity - 1) == 2 % (arity - 1):
            count -= arity - 1
        if count == 0:
            full.add(j)
        if count == 1:
            count = 0
            full.update(jj for jj in range(arity) if sizes[jj] % (arity - 1) == 1 % (arity - 1))
    return assigned


def greedy_assign_reference(
    p_cond: Any, counts: Any, capacity: Any, score: RankingScore | None = None, return_order: bool = False,
) -> Any:
    """Plain-Python transcription of the capacity greedy (the test oracle for :func:`assign_node`):
    sort all pairs, scan them once. With ``return_order`` also returns the accepted pairs in order."""
    score = check_ranking_score(score, default="eq12")
    p_cond, counts = _validate_node_inputs(p_cond, counts)
    cap = list(_capacity_row(capacity, p_cond.shape[1]))
    scores = pair_scores(p_cond, counts, score)
    assigned = np.full(len(counts), -1)
    accepted = []
    for i, j in _sorted_pairs(scores):
        if assigned[i] < 0 and cap[j] > 0:
            assigned[i] = j
            cap[j] -= 1
            accepted.append((i, j, float(scores[i, j])))
    if (assigned < 0).any():
        raise AssignmentError("labels left over: total capacity too small")
    return (assigned, accepted) if return_order else assigned


def assignment_score(p_cond: Any, counts: Any, assignment: Any, score: RankingScore | None = None) -> float:
    """The first-order gain the greedy maximises: sum_i score[i, assignment[i]] (eqs. 13 / 14)."""
    scores = pair_scores(p_cond, counts, check_ranking_score(score, default="eq12"))
    assignment = np.asarray(assignment, dtype=np.int64)
    return float(scores[np.arange(len(assignment)), assignment].sum())


def brute_force_assign(p_cond: Any, counts: Any, capacity: Any,
                       score: RankingScore | None = None) -> tuple[np.ndarray, float]:
    """The best assignment under the capacities by enumeration (M**K candidates; small K only).
    Lemma 1 claims the greedy attains this; it does not always (see the book's Lemmas chapter)."""
    score = check_ranking_score(score, default="eq12")
    p_cond, counts = _validate_node_inputs(p_cond, counts)
    num_labels, arity = p_cond.shape
    if arity**num_labels > 2_000_000:
        raise ValueError(f"M**K = {arity}**{num_labels} candidates is too many to enumerate")
    cap = _capacity_row(capacity, arity)
    scores = pair_scores(p_cond, counts, score)
    best, best_value = None, -np.inf
    for candidate in itertools.product(range(arity), repeat=num_labels):
        if (np.bincount(candidate, minlength=arity) > cap).any():
            continue
        value = scores[np.arange(num_labels), candidate].sum()
        if value > best_value + 1e-15:
            best, best_value = np.array(candidate), value
    if best is None:
        raise AssignmentError("no assignment fits the capacities")
    return best, float(best_value)


# ---------------------------------------------------------------------------- tree level
class StatisticsSource(Protocol):
    """What the tree-level algorithms read: the SumProbas / Counts of Algorithm 1."""

    def label_weights(self) -> np.ndarray:
        """[num_leaves] example counts per label (0 for dummy leaves); q is their share at a node."""

    def p_cond(self, depth: int, labels: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """[len(labels), M] estimate of p_{.|i} at ``nodes[k]`` (depth ``depth``, root 0) for
        ``labels[k]``; a node the label was not seen at gets the prior."""


@dataclass
class Reassignment:
    """Result of a tree-level re-assignment."""

    tree: Tree
    #: internal node ids whose place in the tree is new (their old parameters describe another node)
    moved_nodes: np.ndarray
    #: fraction of real labels whose path (node, child) sequence changed
    moved_labels: float


def moved_fraction(old: Tree, new: Tree) -> float:
    k = old.num_labels
    if old.path_nodes.shape != new.path_nodes.shape:
        width = max(old.max_depth, new.max_depth)
        pad = lambda a: np.pad(a[:k], ((0, 0), (0, width - a.shape[1])), constant_values=-1)  # noqa: E731
        a = np.where(old.path_mask[:k], old.path_children[:k], -1)
        b = np.where(new.path_mask[:k], new.path_children[:k], -1)
        return float((pad(a) != pad(b)).any(axis=1).mean())
    same = (old.path_children[:k] == new.path_children[:k]) & (old.path_nodes[:k] == new.path_nodes[:k])
    return float((~(same | ~old.path_mask[:k])).any(axis=1).mean())


def assign_labels_depth_constrained(
    tree: Tree,
    statistics: StatisticsSource,
    score: RankingScore | None = None,
    capacity_rule: Literal["icml", "arxiv_printed"] = "icml",
) -> Reassignment:
    """ICML supplement Algorithm 3 (arXiv Algorithm 2): re-assign every label top-down in a
    fixed-depth tree. A node at depth d (the root at depth 0) takes at most ``M**(D-d)`` labels.

    All nodes of one depth are solved in one greedy pass (their problems are independent). Node
    ids are the heap positions, so they never move: the node parameters stay in place.
    ``capacity_rule="arxiv_printed"`` uses the arXiv pseudocode's ``M**(D-d+1)`` and raises
    :class:`AssignmentError` when, as it can, a subtree receives more labels than it has leaves.
    ``score``: "eq12" (default) or "eq10".
    """
    score = check_ranking_score(score, default="eq12")
    if tree.depth_limit is None:
        raise ValueError("Algorithm 3 needs a fixed-depth tree (Tree.random / balanced / complete)")
    arity, depth, num_labels = tree.arity, tree.depth_limit, tree.num_labels
    weights = np.asarray(statistics.label_weights(), dtype=np.float64)[:num_labels]
    labels = np.arange(num_labels)
    node = np.zeros(num_labels, dtype=np.int64)
    position = np.zeros(num_labels, dtype=np.int64)
    for level in range(depth):
        exponent = depth - 1 - level if capacity_rule == "icml" else depth - level
        uniq, group = np.unique(node, return_inverse=True)
        p_cond = np.asarray(statistics.p_cond(level, labels, node), dtype=np.float64)
        capacity = np.full((len(uniq), arity), arity**exponent, dtype=np.int64)
        child = _run_greedy(p_cond, weights, group, capacity, False, score)
        node = node * arity + child + 1
        position = position * arity + child
        leaves_below = arity ** (depth - 1 - level)
        if capacity_rule != "icml":
            loads = np.bincount(position, minlength=position.max() + 1)
            if loads.max() > leaves_below:
                raise AssignmentError(
                    f"with the arXiv print's capacity M^(D-d+1) a depth-{level + 2} subtree received "
                    f"{loads.max()} labels but has only {leaves_below} leaves"
                )
    new_tree = Tree.complete(position, arity, depth, label_names=tree.label_names)
    return Reassignment(new_tree, np.zeros(0, np.int64), moved_fraction(tree, new_tree))


def assign_labels_well_formed(tree: Tree, statistics: StatisticsSource,
                              score: RankingScore | None = None) -> Reassignment:
    """ICML Algorithm 2: re-assign every label (and dummy leaf) top-down so that the tree stays a
    full M-ary tree; the number of internal nodes, (K' - 1) / (M - 1), never changes.

    Node ids are reused so that parameters stay where they were: a new internal node at slot j of
    a node that kept its id gets the id that sat there before, if that was an internal node; the
    other new nodes take the ids left over, and are reported in ``moved_nodes`` (their parameters
    were trained for another place in the tree: :meth:`HierarchicalSoftmax.set_tree` can reset
    them). ``score``: "eq12" (default) or "eq10".
    """
    score = check_ranking_score(score, default="eq12")
    arity = tree.arity
    num_leaves = tree.num_leaves
    if (num_leaves - 1) % (arity - 1) != 0 or not tree.is_well_formed():
        raise ValueError(
            "Algorithm 2 needs a well-formed tree (every node with M children, leaves = 1 mod (M-1)); "
            "start from Tree.huffman(...) or another full M-ary tree"
        )
    num_nodes = (num_leaves - 1) // (arity - 1)
    weights = np.asarray(statistics.label_weights(), dtype=np.float64)
    if weights.shape != (num_leaves,):
        raise ValueError(f"label_weights() must give {num_leaves} values (labels and dummy leaves)")

    # Provisional nodes are numbered in creation order (root = 0); their final ids are resolved
    # at the end: a node keeps the id that sat at its place in the old tree when its parent kept
    # its own id and that id is still free; the others take the ids left over.
    prov_final = np.full(num_nodes, -1, dtype=np.int64)
    prov_final[0] = 0
    claimed = np.zeros(num_nodes, dtype=bool)
    claimed[0] = True
    child_node_prov = np.full((num_nodes, arity), -1, dtype=np.int64)
    child_label_prov = np.full((num_nodes, arity), -1, dtype=np.int64)
    num_prov = 1

    active = np.arange(num_leaves)
    active_prov = np.zeros(num_leaves, dtype=np.int64)
    level = 0
    while active.size:
        uniq, group = np.unique(active_prov, return_inverse=True)
        nodes_for_stats = prov_final[uniq][group]  # -1 (not yet known) means: no statistics, use the prior
        p_cond = np.asarray(statistics.p_cond(level, active, nodes_for_stats), dtype=np.float64)
        child = _run_greedy(p_cond, weights[active], group, np.zeros((len(uniq), arity), dtype=np.int64), True, score)

        key = group * arity + child
        sizes = np.bincount(key, minlength=len(uniq) * arity)
        singles = sizes[key] == 1
        child_label_prov[uniq[group[singles]], child[singles]] = active[singles]
        # every (node, child) with several labels becomes a new internal node
        multi = np.nonzero(sizes > 1)[0]
        if num_prov + multi.size > num_nodes:
            raise AssertionError("well-formed rebuild made more internal nodes than (K'-1)/(M-1)")
        new_ids = np.arange(num_prov, num_prov + multi.size)
        num_prov += multi.size
        parent_prov, slot = uniq[multi // arity], multi % arity
        child_node_prov[parent_prov, slot] = new_ids
        parent_final = prov_final[parent_prov]
        preferred = np.where(parent_final >= 0, tree.child_node[np.maximum(parent_final, 0), slot], -1)
        ok = preferred >= 0
        ok[ok] = ~claimed[preferred[ok]]
        claimed[preferred[ok]] = True
        prov_final[new_ids[ok]] = preferred[ok]
        prov_of_key = np.full(len(uniq) * arity, -1, dtype=np.int64)
        prov_of_key[multi] = new_ids
        keep = ~singles
        active = active[keep]
        active_prov = prov_of_key[key[keep]]
        level += 1

    if num_prov != num_nodes:
        raise AssertionError(f"well-formed rebuild made {num_prov} nodes, expected {num_nodes}")
    unresolved = np.nonzero(prov_final < 0)[0]
    prov_final[unresolved] = np.nonzero(~claimed)[0]
    moved = np.sort(prov_final[unresolved])
    child_node = np.full((num_nodes, arity), -1, dtype=np.int64)
    child_label = np.full((num_nodes, arity), -1, dtype=np.int64)
    child_node[prov_final] = np.where(child_node_prov >= 0, prov_final[np.maximum(child_node_prov, 0)], -1)
    child_label[prov_final] = child_label_prov
    new_tree = Tree(child_node, child_label, tree.num_labels, label_names=tree.label_names)
    return Reassignment(new_tree, moved, moved_fraction(tree, new_tree))


# ---------------------------------------------------------------------------- Algorithm 1's rebuild
class RebuildStatistics(StatisticsSource, Protocol):
    """Statistics that Algorithm 1 both reads (AssignLabels) and updates after the new tree is in."""

    def on_reassign(self, new_tree: Tree, reset_nodes: Any = None, apply_decay: bool = True) -> None:
        """Decay the sums and follow ``new_tree`` (dropping the sums of ``reset_nodes``)."""


@dataclass
class ReassignRecord:
    """What one AssignLabels call did (kept in ``TreeLearner.history`` and ``FitHistory.rebuilds``)."""

    step: int
    seconds: float
    moved_labels: float  #: fraction of labels whose path changed
    moved_nodes: int  #: internal nodes placed somewhere new (Algorithm 2 only)
    objective_by_depth: dict[int, float] = field(default_factory=dict)  #: mass-weighted mean J_n before the rebuild


def assign_labels(tree: Tree, statistics: StatisticsSource, algorithm: Literal["depth", "well_formed"],
                  score: RankingScore | None = None) -> Reassignment:
    """AssignLabels by name: ``"depth"`` is Algorithm 3 (:func:`assign_labels_depth_constrained`),
    ``"well_formed"`` Algorithm 2 (:func:`assign_labels_well_formed`)."""
    if algorithm == "depth":
        return assign_labels_depth_constrained(tree, statistics, score=score)
    if algorithm == "well_formed":
        return assign_labels_well_formed(tree, statistics, score=score)
    raise ValueError(f"algorithm must be 'depth' or 'well_formed', got {algorithm!r}")


def rebuild_tree(tree: Tree, statistics: RebuildStatistics, algorithm: Literal["depth", "well_formed"],
                 install: Callable[[Reassignment], None], *, step: int, score: RankingScore | None = None,
                 objective_by_depth: dict[int, float] | None = None) -> tuple[Reassignment, ReassignRecord]:
    """Algorithm 1, lines 8-10: AssignLabels on the statistics so far, then ``install(result)`` puts
    the new tree into the model (each model keeps its parameters its own way), then the statistics
    follow the new tree (decayed, the moved nodes' sums dropped). Every training driver (the
    layer's :class:`~hsm.training.TreeLearner`, the classifiers' Hogwild trainers) rebuilds
    through this function. ``step``: the driver's clock, recorded in the returned record."""
    start = time.perf_counter()
    result = assign_labels(tree, statistics, algorithm, score=score)
    install(result)
    statistics.on_reassign(result.tree, reset_nodes=result.moved_nodes)
    record = ReassignRecord(step, time.perf_counter() - start, result.moved_labels, len(result.moved_nodes),
                            dict(objective_by_depth or {}))
    return result, record
