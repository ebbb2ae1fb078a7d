"""New labels without retraining: place a label training never saw by the node objective J_n,
from a few of its examples.

A trained tree already says where a label belongs: at each node, the examples of a label are
routed to the children with probabilities :math:`p_{j|i}` (eq. 9), and Algorithm 2 gives label
``i`` to the child ``j`` with the best pair score (eq. 12, or eq. 10),

.. math::  s_{ij} = \\tfrac{2}{M} q_i (1 - q_i)\\, \\mathrm{sign}(p_{j|i} - p_j)\\; p_{j|i},

against the node's marginal :math:`p_j` (eq. 7). :func:`add_labels` runs that step for a label
the model has never seen, one node at a time from the root, with :math:`p_{j|i}` the mean
routing of the label's examples through the trained node (the continuous estimate Algorithm 1
collects for trained labels) and :math:`p_j` from the trained labels' node statistics and the new
label's own routing, weighted by their example counts (the uniform distribution over the node's
used children stands for the trained labels when there are no statistics). Since :math:`p_j`
does not depend on where label ``i`` goes, the best pair is also the child that maximises the
assignment score of the whole node (:func:`hsm.assign.assignment_score`) with every other label
kept where it is. Only children with room are eligible:

* a fixed-depth tree (Algorithm 3) keeps every label at depth ``D``: a child is eligible while an
  empty leaf position is left below it;
* in a well-formed tree (Algorithm 2) every child is: the descent ends at a leaf slot, where a
  dummy (or empty) leaf takes the label, and a leaf holding a trained label ``L`` becomes a new
  internal node whose children are ``L``, the new label and ``M - 2`` dummy leaves (the tree stays
  a full M-ary tree, with ``M - 1`` more leaves).

The label's slot then gets parameters from its examples: the row of its best sibling (the used
slot of that node whose logit is highest on the examples; a new node's only sibling is ``L``, whose
row there is 0) plus :math:`\\alpha u`, with :math:`u` the unit mean representation of the examples,
and the sibling's bias minus :math:`\\alpha t`. At that node the new label then beats the sibling
by :math:`\\alpha (u \\cdot h - t)`: for inputs whose projection on :math:`u` exceeds :math:`t`,
which is set below the examples' projections (:data:`THRESHOLD_SPREADS` standard deviations, at
least :data:`THRESHOLD_SHARE` of their mean), and with :math:`\\alpha` chosen so that the mean
example gets a margin of :data:`MARGIN` nats. Reference inputs (below) may raise the threshold;
the slope :math:`\\alpha` stays that of a threshold :data:`THRESHOLD_SHARE` of the mean below it
(the examples then get less than :data:`MARGIN`), so every input keeps a probability a language
model's perplexity can use.

A slot without a bias (the fastText-style command line trains its layers without) cannot hold
the threshold: its decision passes through the origin. Given reference inputs, its row adds the
direction that best separates the examples from them through the origin (a logistic regression
without intercept, the reference weighted up until at most ``1 - REFERENCE_QUANTILE`` of it is
on the new label's side); it finds fewer of the new label's inputs than a slot with a bias.

The placement reads and writes parameters only through :class:`NodeSlots`, so the same
:func:`place_labels` serves the layer (:class:`DenseSlots`) and the sparse classifier.

Trained labels keep their paths (a label whose leaf became a new node gets one more step, to its
own slot of that node) and every trained parameter; their probabilities change only by the mass
the new labels take. :meth:`hsm.TreeLearner.add_labels` and
:meth:`hsm.FastBowClassifier.add_labels` call this and bring the node statistics along.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np
import torch
from torch import Tensor

from .objective import RankingScore, check_ranking_score, ranking_scores
from .tree import EMPTY_SLOT, Tree, check_integer

__all__ = ["DenseSlots", "LabelAddition", "NodeSlots", "add_labels", "check_placement", "place_labels", "MARGIN",
           "REFERENCE_QUANTILE", "THRESHOLD_SHARE", "THRESHOLD_SPREADS"]

#: nats by which a new label beats its best sibling, at its node, on the mean of its examples
MARGIN = 4.0
#: the threshold t sits this many standard deviations of the examples' projections below their mean
THRESHOLD_SPREADS = 2.0
#: and at least this share of the mean projection below it (one example has no spread)
THRESHOLD_SHARE = 0.25
#: with reference inputs, the threshold is at least this quantile of their projections
REFERENCE_QUANTILE = 0.99


@dataclass
class LabelAddition:
    """What :func:`add_labels` did."""

    tree: Tree  #: the tree with the new labels
    labels: np.ndarray  #: [m] the new labels' ids (K .. K + m - 1)
    slots: np.ndarray  #: [m, 2] (node, child slot) of each new label's leaf
    new_nodes: np.ndarray  #: internal nodes created (a leaf of a trained label split in two)
    seconds: float  #: wall time of the whole addition
    paths: list[list[tuple[int, int]]] = field(default_factory=list)  #: each new label's path
    #: [m] nats by which each new label's slot beats the best other slot of its node on the mean of its
    #: examples (:data:`MARGIN` as placed; below 0 where the reference set the threshold past the
    #: examples, so that the label's own inputs mostly go elsewhere; inf where no other label shares its
    #: node). Dense layers only (empty otherwise)
    margins: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _check_examples(examples: Any, dim: int, dtype: torch.dtype) -> list[Tensor]:
    """The examples as a list of [n_i, d] tensors of the layer's dtype; one-line errors otherwise."""
    if isinstance(examples, Tensor) or not isinstance(examples, Sequence) or isinstance(examples, (str, bytes)):
        raise TypeError("examples must be a list with one [n, d] tensor of representations per new label")
    if len(examples) == 0:
        raise ValueError("no new labels: examples is empty (give one [n, d] tensor per new label)")
    out = []
    for index, rows in enumerate(examples):
        if not isinstance(rows, Tensor):
            raise TypeError(f"examples[{index}] must be a torch tensor [n, {dim}], got {type(rows).__name__}")
        if rows.ndim != 2 or rows.shape[1] != dim:
            raise ValueError(f"examples[{index}] has shape {tuple(rows.shape)}; the layer takes [n, {dim}]")
        if rows.shape[0] == 0:
            raise ValueError(f"examples[{index}] holds no example: a new label needs at least one")
        if not bool(torch.isfinite(rows).all()):
            raise ValueError(f"examples[{index}] holds NaN or infinite values")
        out.append(rows.detach().to(device="cpu", dtype=dtype))  # the descent runs on the host
    return out


class _GrowingTree:
    """The slot arrays of a tree while labels are added, with what the descent needs: which slots
    hold a real label below them, and (fixed depth) how many empty leaf positions each node has."""

    def __init__(self, tree: Tree, added: int) -> None:
        self.arity, self.depth_limit = tree.arity, tree.depth_limit
        self.child_node = tree.child_node.copy()
        self.child_label = tree.child_label.copy()
        # dummies move up by `added`: the new labels take ids K .. K + added - 1
        dummies = self.child_label >= tree.num_labels
        self.child_label[dummies] += added
        self.next_dummy = tree.num_leaves + added
        self.used = tree.slot_mask.copy()  # slots with a real label below them
        self.parent, self.parent_slot = list(tree.parent), list(tree.parent_slot)
        self.free = None
        if tree.depth_limit is not None:  # empty leaf positions below each node, bottom-up
            free = np.zeros(tree.num_nodes, dtype=np.int64)
            bottom = self.child_node[:, 0] < 0
            free[bottom] = (self.child_label[bottom] < 0).sum(axis=1)
            for node in tree.bfs_order[::-1]:
                inner = self.child_node[node] >= 0
                if inner.any():
                    free[node] = free[self.child_node[node][inner]].sum()
            self.free = free

    def eligible(self, node: int) -> np.ndarray:
        """[M] the children of ``node`` that have room for one more label."""
        if self.free is None:
            return np.ones(self.arity, dtype=bool)
        children, labels = self.child_node[node], self.child_label[node]
        room = np.where(children >= 0, self.free[np.maximum(children, 0)] > 0, labels < 0)
        return room

    def add_node(self, parent: int, slot: int) -> int:
        """A new internal node in slot ``(parent, slot)``, its slots empty; returns its id."""
        node = self.child_node.shape[0]
        self.child_node = np.vstack([self.child_node, np.full((1, self.arity), EMPTY_SLOT, dtype=np.int64)])
        self.child_label = np.vstack([self.child_label, np.full((1, self.arity), EMPTY_SLOT, dtype=np.int64)])
        self.used = np.vstack([self.used, np.zeros((1, self.arity), dtype=bool)])
        self.child_node[parent, slot] = node
        self.child_label[parent, slot] = EMPTY_SLOT
        self.parent.append(parent)
        self.parent_slot.append(slot)
        return node

    def put(self, node: int, slot: int, label: int) -> None:
        """Label ``label`` (real) into leaf slot ``(node, slot)``: the slots above it become used."""
        self.child_label[node, slot] = label
        self.used[node, slot] = True
        while node != 0:
            parent, parent_slot = self.parent[node], self.parent_slot[node]
            self.used[parent, parent_slot] = True
            if self.free is not None:
                self.free[node] -= 1
            node = parent
        if self.free is not None:
            self.free[0] -= 1

    def path(self, node: int, slot: int) -> list[tuple[int, int]]:
        steps = [(node, slot)]
        while node != 0:
            steps.append((self.parent[node], self.parent_slot[node]))
            node = self.parent[node]
        return steps[::-1]

    def tree(self, num_labels: int, label_names: list[str] | None) -> Tree:
        """The final tree, dummy leaves renumbered ``num_labels, num_labels + 1, ...``."""
        labels = self.child_label.copy()
        dummy = labels >= num_labels
        labels[dummy] = num_labels + np.searchsorted(np.sort(labels[dummy]), labels[dummy])
        return Tree(self.child_node, labels, num_labels, depth_limit=self.depth_limit, label_names=label_names)


class NodeSlots:
    """The parameters of a tree's node slots as the placement reads and writes them: the logits of
    a node for some inputs, and one slot's row and bias. :class:`DenseSlots` holds those of a
    :class:`hsm.HierarchicalSoftmax` (inputs: representations [n, d]); the sparse classifier
    (:meth:`hsm.SparseTreeClassifier.add_labels`) gives its own, on TF-IDF rows. Room for the
    nodes the placement may create (one per new label) is allocated by the holder, all zeros."""

    #: whether the slots have biases; a slot without cannot hold a threshold, and takes a direction
    #: separating its examples from the reference inputs instead (module docstring)
    has_bias: bool = True

    def logits(self, rows: Any, node: int) -> np.ndarray:  # pragma: no cover - interface
        """[n, M] float64 logits of ``node`` for ``rows`` [n, d]."""
        raise NotImplementedError

    def slot(self, node: int, slot: int) -> tuple[np.ndarray, float]:  # pragma: no cover - interface
        """The row [d] (float64) and bias of slot ``(node, slot)``."""
        raise NotImplementedError

    def set_slot(self, node: int, slot: int, row: np.ndarray, bias: float) -> None:  # pragma: no cover
        raise NotImplementedError


class DenseSlots(NodeSlots):
    """The slots of a :class:`hsm.HierarchicalSoftmax` on the host: ``weight`` [N', M, d] and
    ``bias`` [N', M] (or None), in the layer's dtype."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.has_bias = bias is not None

    def logits(self, rows: np.ndarray, node: int) -> np.ndarray:
        out = rows @ self.weight[node].to(torch.float64).numpy().T
        return out + self.bias[node].to(torch.float64).numpy() if self.bias is not None else out

    def slot(self, node: int, slot: int) -> tuple[np.ndarray, float]:
        bias = float(self.bias[node, slot]) if self.bias is not None else 0.0
        return self.weight[node, slot].to(torch.float64).numpy().copy(), bias

    def set_slot(self, node: int, slot: int, row: np.ndarray, bias: float) -> None:
        self.weight[node, slot] = torch.as_tensor(row, dtype=self.weight.dtype)
        if self.bias is not None:
            self.bias[node, slot] = bias


def _node_marginal(tree: Tree, statistics: Any, label_weights: np.ndarray | None, node: int, depth: int,
                   used: np.ndarray, p_new: np.ndarray, count_new: int) -> np.ndarray:
    """p_j (eq. 7) of a node: the trained labels' p_{j|i} (from their statistics) and the new
    label's, weighted by their example counts; without statistics (or trained labels at the node),
    the uniform distribution over the used children stands for the trained labels, with weight 1."""
    if statistics is not None and node < tree.num_nodes:
        labels = tree.labels_under(node)
        if labels.size:
            weights = label_weights[labels]
            p_cond = np.asarray(statistics.p_cond(depth, labels, np.full(labels.size, node)), dtype=np.float64)
            return (weights @ p_cond + count_new * p_new) / (weights.sum() + count_new)
    trained = used / used.sum() if used.any() else np.full(used.size, 1.0 / used.size)
    return (trained + count_new * p_new) / (1.0 + count_new)


def _mean_row(rows: Any) -> np.ndarray:
    """The mean of the rows of a dense array or a sparse matrix, as a dense float64 vector."""
    return np.asarray(rows.mean(axis=0), dtype=np.float64).ravel()


def place_labels(tree: Tree, examples: Sequence[Any], slots: NodeSlots, statistics: Any = None,
                 score: RankingScore = "eq12", label_names: Sequence[str] | None = None,
                 placement: Literal["objective", "random"] = "objective", seed: int = 0,
                 reference: Any = None) -> tuple[Tree, np.ndarray, list[list[tuple[int, int]]], np.ndarray]:
    """Algorithm 2's step for labels the tree has never seen (module docstring), and the new slots'
    parameters: new label ``K + i`` descends from the root by the pair score of ``examples[i]``'
    routing (rows [n_i, d], dense or sparse, float64) and its slot is written into ``slots``.
    Checked inputs only (:func:`add_labels` and the classifiers check them). Returns the new tree,
    each label's ``(node, slot)``, its path and the internal nodes created."""
    if reference is not None:
        centre = _mean_row(reference)
    elif len(examples) > 1:
        total = sum(rows.shape[0] for rows in examples)
        centre = sum(_mean_row(rows) * rows.shape[0] for rows in examples) / total
    else:
        centre = np.zeros(examples[0].shape[1])
    rng = np.random.default_rng(seed)
    arity, old_k, added = tree.arity, tree.num_labels, len(examples)
    names = None
    if tree.label_names is not None or label_names is not None:
        if label_names is None or tree.label_names is None or len(label_names) != added:
            raise ValueError(f"the tree {'has' if tree.label_names is not None else 'has no'} label names: give "
                             f"{'one name per new label' if tree.label_names is not None else 'none'} "
                             f"(label_names for {added} new labels)")
        taken = set(tree.label_names)
        clash = [name for name in label_names if name in taken]
        if clash:
            raise ValueError(f"label {clash[0]} already in the model: new labels need new names")
        twice = next((name for i, name in enumerate(label_names) if name in label_names[:i]), None)
        if twice is not None:
            raise ValueError(f"label {twice} is given twice: each new label needs its own name")
        names = list(tree.label_names) + list(label_names)
    growing = _GrowingTree(tree, added)
    if growing.free is not None and growing.free[0] < added:
        raise ValueError(f"the fixed-depth tree has {int(growing.free[0])} empty leaves for {added} new labels: "
                         f"build it one level deeper (depth {tree.depth_limit + 1})")
    label_weights = (np.asarray(statistics.label_weights(), dtype=np.float64) if statistics is not None else None)
    placed, paths, new_nodes = [], [], []
    for index, h in enumerate(examples):
        label = old_k + index
        node, depth = 0, 0
        while True:
            used = growing.used[node]
            logits = slots.logits(h, node)
            if used.any():
                logits = np.where(used, logits, -np.inf)
            routing = np.exp(logits - logits.max(axis=1, keepdims=True))
            p_cond = (routing / routing.sum(axis=1, keepdims=True)).mean(axis=0)
            marginal = _node_marginal(tree, statistics, label_weights, node, depth, used, p_cond, h.shape[0])
            pair = ranking_scores(np.ones(1), p_cond[None], marginal[None], times_p_cond=score == "eq12")[0]
            if placement == "random":
                pair = rng.random(arity)
            pair = np.where(growing.eligible(node), pair, -np.inf)
            # the best pair score; ties by the larger routing probability, then the first slot
            order = np.lexsort((np.arange(arity), -p_cond, -pair))
            slot = int(order[0])
            child, leaf = growing.child_node[node, slot], growing.child_label[node, slot]
            if child >= 0:
                node, depth = int(child), depth + 1
                continue
            if 0 <= leaf < old_k + added and leaf != label:  # a trained (or just added) label: split its leaf
                parent = node
                node = growing.add_node(parent, slot)
                new_nodes.append(node)
                growing.put(node, 0, int(leaf))
                for extra in range(2, arity):
                    growing.child_label[node, extra] = growing.next_dummy
                    growing.next_dummy += 1
                slot = 1
                used = growing.used[node]
            _initialise_slot(slots, node, slot, used, h, centre, reference, arity)
            growing.put(node, slot, label)
            placed.append((node, slot))
            paths.append(growing.path(node, slot))
            break
    return (growing.tree(old_k + added, names), np.asarray(placed, dtype=np.int64).reshape(-1, 2), paths,
            np.asarray(new_nodes, dtype=np.int64))


@torch.no_grad()
def add_labels(layer: Any, examples: Sequence[Tensor], statistics: Any = None, score: RankingScore | None = None,
               label_names: Sequence[str] | None = None, placement: Literal["objective", "random"] = "objective",
               seed: int = 0, local_steps: int = 0, local_lr: float = 0.1,
               reference: Tensor | None = None, rehearsal: tuple[Tensor, Tensor] | None = None) -> LabelAddition:
    """Add ``len(examples)`` labels to a trained :class:`hsm.HierarchicalSoftmax` (in place) without
    retraining: new label ``K + i`` is placed by Algorithm 2's pair score from the representations
    ``examples[i]`` [n_i, d] of a few of its examples (module docstring), and its slot gets
    parameters from them. ``statistics``: the trained labels' node statistics (the learner's), for
    the nodes' marginals; ``score``: "eq12" (default) or "eq10"; ``label_names``: names of the new
    labels when the tree has names. ``placement="random"`` walks down to a random eligible child
    instead (the baseline that shows what the objective buys; ``seed`` draws it).

    ``reference`` [R, d]: representations of inputs the model already serves (a sample of its
    training data, any labels): the new slots' direction is measured from their mean, and each
    threshold is kept above :data:`REFERENCE_QUANTILE` of their projections, so that few of them
    move to a new label. Without it, the mean of all the new labels' examples stands for theirs
    (0 for a single new label).

    ``local_steps`` > 0: after the placement, that many gradient steps (rate ``local_lr``) on the
    new labels' examples, moving only the slots on the new labels' paths (the new slots, and the
    slots above them, which trained labels below them share): the only case in which trained
    parameters change. ``rehearsal`` = (representations [R, d], labels [R]): examples of trained
    labels mixed into those steps, the ones whose paths pass through a node of a new label's path,
    every label weighted as much as a new one (each trained label among them as much as each new
    label, however many examples it has): the slots above a new label then learn to take its
    examples without taking the trained labels' (without them, the steps raise the new path's
    logits for every input), and the trained labels, many against one new label, hold their ground
    as they would in the full training loss.

    Raises TypeError / ValueError in one line, before anything changes, for a layer that is not a
    tree layer, no examples, a tensor of another width, an empty one or one with NaN / inf, names
    that do not match, and a fixed-depth tree with no empty leaf left (build it one level deeper).
    """
    start = time.perf_counter()
    # the tree layer, known by what an addition uses (this module does not import the layers)
    if not (isinstance(layer, torch.nn.Module) and hasattr(layer, "tree") and hasattr(layer, "grow")):
        raise TypeError(f"add_labels needs an hsm.HierarchicalSoftmax, got {type(layer).__name__}")
    score = check_ranking_score(score, default="eq12")
    check_placement(placement, seed)
    if isinstance(local_steps, bool) or not isinstance(local_steps, (int, np.integer)) or local_steps < 0:
        raise ValueError(f"local_steps must be an integer >= 0, got {local_steps!r}")
    if not (isinstance(local_lr, (int, float)) and math.isfinite(local_lr) and local_lr > 0):
        raise ValueError(f"local_lr must be a finite number > 0, got {local_lr!r}")
    rows = _check_examples(examples, layer.in_features, layer.weight.dtype)
    if rehearsal is not None:
        rehearsal = _check_rehearsal(rehearsal, layer)
    if reference is not None:
        reference = _check_examples([reference], layer.in_features, layer.weight.dtype)[0]
        reference = reference.to(torch.float64).numpy()
    tree, arity, dim = layer.tree, layer.arity, layer.in_features
    added = len(rows)
    # placed on the host (a few nodes per label); grow() moves the parameters back to the layer's device
    # room for the nodes the additions may create (at most one per label), trimmed at the end
    weight = torch.cat([layer.weight.detach().cpu().view(tree.num_nodes, arity, dim),
                        layer.weight.new_zeros(added, arity, dim, device="cpu")])
    bias = (torch.cat([layer.bias.detach().cpu(), layer.bias.new_zeros(added, arity, device="cpu")])
            if layer.bias is not None else None)
    new_tree, slots, paths, new_nodes = place_labels(
        tree, [r.to(torch.float64).numpy() for r in rows], DenseSlots(weight, bias), statistics, score,
        label_names, placement, seed, reference)
    nodes = new_tree.num_nodes
    layer.grow(new_tree, weight[:nodes].reshape(nodes, arity * dim), bias[:nodes] if bias is not None else None)
    old_k = tree.num_labels
    if local_steps:
        _local_steps(layer, rows, np.arange(old_k, old_k + added), paths, local_steps, local_lr, rehearsal)
    return LabelAddition(new_tree, np.arange(old_k, old_k + added), slots, new_nodes, time.perf_counter() - start,
                         paths, _slot_margins(layer, rows, slots))


def _slot_margins(layer: Any, rows: list[Tensor], slots: np.ndarray) -> np.ndarray:
    """:attr:`LabelAddition.margins`: at each new label's node, its slot's logit on the mean of its
    examples minus the best other usable slot's."""
    means = torch.stack([r.mean(dim=0) for r in rows]).to(layer.weight.device, layer.weight.dtype)
    nodes = torch.as_tensor(slots[:, :1], device=layer.weight.device)  # [m, 1]
    logits = layer.node_logits(means, nodes)[:, 0].double().cpu().numpy()  # [m, M], unusable at -inf
    rows_at = np.arange(len(slots))
    own = logits[rows_at, slots[:, 1]]
    logits[rows_at, slots[:, 1]] = -np.inf
    return own - logits.max(axis=1)


def check_placement(placement: Any, seed: Any = 0) -> str:
    """``placement`` checked: "objective" (Algorithm 2's pair score) or "random"; and ``seed``, the
    seed of the random placement: an integer >= 0, as numpy's generators take (checked before any
    file is read or example encoded, not by numpy afterwards)."""
    if placement not in ("objective", "random"):
        raise ValueError(f"placement must be 'objective' or 'random', got {placement!r}")
    if check_integer(seed, "seed") < 0:
        raise ValueError(f"seed must be an integer >= 0 (numpy's generators take no negative seed), got {seed}")
    return placement


def _separating_direction(positives: np.ndarray, negatives: np.ndarray, ridge: float = 1e-3,
                          iterations: int = 30) -> np.ndarray:
    """``w`` [d] of a logistic regression without intercept that tells ``positives`` (the new
    label's examples) from ``negatives`` (the reference inputs): Newton's method in float64 (d is
    a representation's width), L2 penalty ``ridge``, the positives weighing 1 in all and the
    negatives 1, 2, 4, ... 1024 until at most ``1 - REFERENCE_QUANTILE`` of them lie on the
    positive side (the rule the threshold follows when the slot has a bias)."""
    x = np.concatenate([positives, negatives])
    y = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))])
    w = np.zeros(x.shape[1])
    for negative_weight in 2.0 ** np.arange(11):
        weight = np.concatenate([np.full(len(positives), 1.0 / len(positives)),
                                 np.full(len(negatives), negative_weight / len(negatives))])
        for _ in range(iterations):
            p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -30, 30)))
            gradient = x.T @ (weight * (p - y)) + ridge * w
            hessian = (x * (weight * p * (1 - p))[:, None]).T @ x + ridge * np.eye(x.shape[1])
            step = np.linalg.solve(hessian, gradient)
            w = w - step
            if np.abs(step).max() < 1e-10 * max(1.0, np.abs(w).max()):
                break
        if (negatives @ w > 0).mean() <= 1.0 - REFERENCE_QUANTILE:
            break
    return w


def _initialise_slot(slots: NodeSlots, node: int, slot: int, used: np.ndarray, h: Any, centre: np.ndarray,
                     reference: Any, arity: int) -> None:
    """The new label's row at ``(node, slot)``: its best used sibling's plus ``alpha * u`` (module
    docstring), ``u`` the unit direction from ``centre`` to the examples' mean, in float64.

    Slots without biases cannot hold the threshold (their decision ``w . h > 0`` passes through
    the origin): with reference inputs, the row adds instead the direction that best separates the
    examples from them through the origin (:func:`_separating_direction`), scaled to a margin of
    :data:`MARGIN` on the examples' mean; without, ``alpha * u`` alone."""
    siblings = [j for j in range(arity) if used[j] and j != slot]
    if siblings:
        mean_logits = slots.logits(h, node)[:, siblings].mean(axis=0)
        row, offset = slots.slot(node, siblings[int(np.argmax(mean_logits))])
    else:
        row, offset = np.zeros(centre.size), 0.0
    direction = _mean_row(h) - centre
    norm = float(np.linalg.norm(direction))
    u = direction / norm if norm > 0 else np.zeros_like(direction)
    shift = float(centre @ u)
    projection = np.asarray(h @ u, dtype=np.float64).ravel() - shift  # (h - centre) . u, h kept sparse
    mean_projection = float(projection.mean())
    spread = float(projection.std(ddof=1)) if h.shape[0] > 1 else 0.0
    floor = max(THRESHOLD_SHARE * abs(mean_projection), 1e-6)
    threshold = mean_projection - max(THRESHOLD_SPREADS * spread, floor)
    if reference is not None:
        seen = np.asarray(reference @ u, dtype=np.float64).ravel() - shift
        threshold = max(threshold, float(np.quantile(seen, REFERENCE_QUANTILE)))
    # the slope of a threshold within the floor of the mean (or past it, where the reference reaches
    # beyond the examples) is the floor's: a smaller gap would make a step that gives the inputs on
    # its other side a probability of exp(-1e7), which a language model's perplexity cannot take
    alpha = MARGIN / max(mean_projection - threshold, floor)
    if not slots.has_bias and reference is not None:
        w = _separating_direction(np.asarray(h, dtype=np.float64), np.asarray(reference, dtype=np.float64))
        margin = float(_mean_row(h) @ w)
        slots.set_slot(node, slot, row + (MARGIN / margin if margin > 1e-6 else 1.0) * w, offset)
        return
    # alpha * ((h - centre) . u - threshold) = alpha * h . u - alpha * (centre . u + threshold)
    slots.set_slot(node, slot, row + alpha * u, offset - alpha * (shift + threshold))


def _check_rehearsal(rehearsal: Any, layer: Any) -> tuple[Tensor, Tensor]:
    """(representations [R, d], labels [R]) of trained labels, checked; ValueError / TypeError in one line."""
    if not (isinstance(rehearsal, (tuple, list)) and len(rehearsal) == 2):
        raise TypeError("rehearsal must be a pair (representations [R, d], labels [R]) of trained labels' examples")
    h = _check_examples([rehearsal[0]], layer.in_features, layer.weight.dtype)[0]
    labels = torch.as_tensor(rehearsal[1])
    if labels.dtype.is_floating_point or labels.dim() != 1 or labels.numel() != h.shape[0]:
        raise ValueError(f"rehearsal labels must be {h.shape[0]} integer labels (one per row), got "
                         f"{labels.dtype} of shape {list(labels.shape)}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= layer.num_labels):
        raise ValueError(f"rehearsal labels must be trained labels, 0 to {layer.num_labels - 1}")
    return h, labels.long()


def _local_steps(layer: Any, rows: list[Tensor], labels: np.ndarray, paths: list[list[tuple[int, int]]],
                 steps: int, lr: float, rehearsal: tuple[Tensor, Tensor] | None = None) -> None:
    """Plain gradient steps on the new labels' NLL, each label weighted as much (its examples
    share the label's weight), plus, with ``rehearsal``, the NLL of the trained labels' examples
    that pass through a node of a new path, each of those trained labels weighted as much as a new
    one, on the slots of the new paths only (eq. 5 through
    :meth:`HierarchicalSoftmax.forward_reference`)."""
    nodes, arity = layer.num_nodes, layer.arity
    allowed = torch.zeros(nodes, arity, dtype=layer.weight.dtype, device=layer.weight.device)
    for path in paths:
        for node, slot in path:
            allowed[node, slot] = 1.0
    h = torch.cat(rows).to(layer.weight.device)
    target = torch.as_tensor(np.repeat(labels, [r.shape[0] for r in rows]), device=h.device)
    weights = torch.cat([torch.full((r.shape[0],), 1.0 / (r.shape[0] * len(rows)), dtype=h.dtype) for r in rows])
    if rehearsal is not None:
        tree = layer.tree
        on_new_paths = np.zeros(tree.num_nodes, dtype=bool)
        on_new_paths[[node for path in paths for node, _ in path]] = True
        old = rehearsal[1].numpy()
        path_nodes = np.where(tree.path_mask[old], tree.path_nodes[old], 0)
        shares = (on_new_paths[path_nodes] & tree.path_mask[old]).any(axis=1)
        if shares.any():
            keep = np.flatnonzero(shares)
            _, inverse, counts = np.unique(old[keep], return_inverse=True, return_counts=True)
            # per trained label, as much weight as one new label: the label's examples share it
            kept_weights = torch.as_tensor(1.0 / (counts[inverse] * len(rows)), dtype=h.dtype)
            keep_t = torch.as_tensor(keep)
            h = torch.cat([h, rehearsal[0][keep_t].to(h.device)])
            target = torch.cat([target, rehearsal[1][keep_t].to(h.device)])
            weights = torch.cat([weights, kept_weights])
    with torch.enable_grad():
        for _ in range(steps):
            layer.zero_grad(set_to_none=True)
            out = layer.forward_reference(h, target)
            (-(out.output * weights.to(h.device)).sum()).backward()
            with torch.no_grad():
                grad = layer.weight.grad.to_dense() if layer.weight.grad.is_sparse else layer.weight.grad
                layer.weight -= lr * (grad.view(nodes, arity, -1) * allowed[:, :, None]).view_as(layer.weight)
                if layer.bias is not None:
                    grad_b = layer.bias.grad.to_dense() if layer.bias.grad.is_sparse else layer.bias.grad
                    layer.bias -= lr * grad_b * allowed
    layer.zero_grad(set_to_none=True)
