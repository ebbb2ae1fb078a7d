"""Node statistics of Algorithm 1 (SumProbas and Counts), kept cheaply during training.

Algorithm 1 keeps, for every node ``n`` and label ``i``, the sum of the node's output
distributions over the examples of class ``i`` that reached ``n`` (SumProbas[n, i], an M-vector)
and their number (Counts[n, i]); AssignLabels reads ``p_{.|i} = SumProbas / Counts`` (eq. 9) and
``q_i`` from the counts. A dense [N, K, M] table is out of the question at K = 250k, but a label
only ever reaches the D nodes on its path, so we store the statistics by (label, depth):

* ``sum_probas[i, d]``: sum of the softmax at the depth-d node of i's path ([K', L, M]);
* ``path_counts[i, d]``: how many examples contributed to it;
* ``label_counts[i]``: examples of label i, the Counts that give q (every example of class i
  reaches every node of its path, so Counts[n, i] is the same for all of them);
* ``stat_node[i, d]``: the node those sums were collected at.

The papers leave three things open (Algorithm 1's pseudocode in ICML §4 and arXiv §4; the
book's errata chapter, notebooks/errata.md); our choices:

1. **Initialisation / prior (0/0 in the arXiv and ICML pseudocode).** A pseudo-count ``prior``
   (default 1, the thesis' Counts = 1) of a prior distribution, applied at read time. Two priors:
   ``prior_mode="current_child"`` (default), the released code's: 0.5/M on every child plus 0.5 on
   the child the label sits in now, so a label with little evidence stays where it is; and
   ``prior_mode="uniform"``, the thesis' SumProbas = 1/M. With the uniform prior an unseen label
   looks the same at every child and the greedy places it by the children's marginals alone: on
   the cooking tags (736 labels, 50 rebuilds in half of training) 90-97 % of the labels changed
   path at every rebuild and the learned trees fell below their Huffman start (measured by the
   classification chapter, which compares both).
2. **A label that moves.** When re-assignment sends label i to a different node at depth d, its
   sums at depth d describe another node's outputs: they are dropped (the label falls back to
   the prior there until it has been seen at its new node). Reading is checked too: the tree
   algorithms ask for p_{.|i} *at a given node*, and get the prior unless the sums were
   collected there. The label's count (q) is kept: its frequency does not depend on the tree.
3. **Decay.** The node functions change during training, so old sums grow stale; at every
   re-assignment all statistics are multiplied by ``decay`` (default 0.5: the last period
   weighs as much as everything before it). ``decay=1`` keeps everything (the released code),
   ``decay=0`` starts every period afresh (rare labels then fall back to the prior).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ._checks import check_positive
from .assign import node_terms
from .tree import Tree

__all__ = ["NodeStatistics", "ReleasedStatistics", "node_objectives"]


class NodeStatistics:
    """SumProbas / Counts of Algorithm 1, stored per (label, depth); see the module docstring."""

    def __init__(
        self,
        tree: Tree,
        prior: float = 1.0,
        decay: float = 0.5,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        prior_mode: str = "current_child",
    ) -> None:
        if prior_mode not in ("current_child", "uniform"):
            raise ValueError(f"prior_mode must be 'current_child' or 'uniform', got {prior_mode!r}")
        self.prior_mode = prior_mode
        if isinstance(prior, bool) or not isinstance(prior, (int, float, np.integer, np.floating)):
            raise TypeError(f"prior must be a real number, got {prior!r}")
        if isinstance(decay, bool) or not isinstance(decay, (int, float, np.integer, np.floating)):
            raise TypeError(f"decay must be a real number, got {decay!r}")
        if not (math.isfinite(prior) and prior > 0):
            raise ValueError(f"prior must be finite and > 0 (it is the pseudo-count that avoids 0/0), got {prior}")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must lie in [0, 1], got {decay}")
        self.prior = float(prior)
        self.decay = float(decay)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        self.arity = tree.arity
        self.num_labels = tree.num_labels
        num_leaves = tree.num_leaves
        self.label_counts = torch.zeros(num_leaves, device=self.device, dtype=dtype)
        self._allocate(tree)

    def _allocate(self, tree: Tree) -> None:
        self._tree = tree
        num_leaves, length = tree.num_leaves, tree.max_depth
        self.sum_probas = torch.zeros(num_leaves, length, self.arity, device=self.device, dtype=self.dtype)
        self.path_counts = torch.zeros(num_leaves, length, device=self.device, dtype=self.dtype)
        self.stat_node = torch.as_tensor(np.where(tree.path_mask, tree.path_nodes, -1), device=self.device)
        self.current_child = torch.as_tensor(tree.path_children, device=self.device)

    @property
    def max_depth(self) -> int:
        return int(self.sum_probas.shape[1])

    # ------------------------------------------------------------------ collection
    @torch.no_grad()
    def accumulate(self, target: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor,
                   row_weight: torch.Tensor | None = None) -> None:
        """Add one batch: ``probs`` [B, L, M] are the node distributions on each example's path
        (computed before the gradient step, as Algorithm 1's NodeCompute), ``mask`` [B, L] marks
        the real steps of each path (bool, or 1.0 / 0.0), ``target`` [B] the labels, ``row_weight``
        [B] (1.0 / 0.0, default all 1) the rows that count for the labels' counts.

        Fixed-shape ops only (no boolean indexing, whose output size the host would read back
        from the device): every step is added, weighted by its mask, so the padding adds zeros."""
        length = self.max_depth
        if probs.shape[1] != length:
            raise ValueError(f"probs cover {probs.shape[1]} depths, statistics {length}: was the tree changed "
                             "without NodeStatistics.on_reassign?")
        flat = (target[:, None] * length + torch.arange(length, device=target.device)).reshape(-1)
        weight = mask.reshape(-1).to(self.dtype)
        steps = probs.reshape(-1, self.arity).to(self.dtype)
        # where, not a product: a padding step's distribution may hold NaN (a NaN input row)
        steps = torch.where(weight[:, None] > 0, steps, 0.0) * weight[:, None]
        self.sum_probas.view(-1, self.arity).index_add_(0, flat, steps)
        self.path_counts.view(-1).index_add_(0, flat, weight)
        rows = torch.ones_like(target, dtype=self.dtype) if row_weight is None else row_weight.to(self.dtype)
        self.label_counts.index_add_(0, target, rows)

    def accumulate_pairs(self, target: np.ndarray, example: np.ndarray, depth: np.ndarray,
                         node_probs: np.ndarray) -> bool:
        """:meth:`accumulate` from per-pair node distributions (what the layer's compiled CPU
        path produces: pair p is depth ``depth[p]`` of example ``example[p]``'s path), in one
        compiled pass. Returns False, having done nothing, when the statistics are not plain CPU
        tensors (the caller then uses :meth:`accumulate`)."""
        tensors = (self.sum_probas, self.path_counts, self.label_counts)
        if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
            return False
        # the compiled pass does not check its indices: a tree deeper than the statistics (a tree
        # installed without on_reassign) would write outside the arrays
        if depth.size and int(depth.max()) >= self.max_depth:
            raise ValueError(f"the batch's paths have {int(depth.max()) + 1} levels, the statistics {self.max_depth}: "
                             "was the tree changed without NodeStatistics.on_reassign?")
        if node_probs.shape[1] != self.arity:
            raise ValueError(f"node_probs have {node_probs.shape[1]} children per node, the statistics {self.arity}")
        from .kernels import accumulate_statistics

        accumulate_statistics(self.sum_probas.numpy(), self.path_counts.numpy(), self.label_counts.numpy(),
                              np.ascontiguousarray(target, dtype=np.int64), example, depth, node_probs)
        return True

    # ------------------------------------------------------------------ reading (StatisticsSource)
    def label_weights(self) -> np.ndarray:
        """Counts with the prior for real labels, 0 for dummy leaves (they carry no examples)."""
        weights = self.label_counts.double().cpu().numpy() + self.prior
        weights[self.num_labels :] = 0.0
        return weights

    def p_cond(self, depth: int, labels: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """p_{.|i} (eq. 9) for ``labels`` at ``nodes`` (depth ``depth``): (sums + prior * pi) /
        (count + prior), using the sums only where they were collected at that node (the label's
        node in the tree in place); pi is the prior distribution (module docstring, point 1)."""
        labels = np.asarray(labels, dtype=np.int64)
        nodes = np.asarray(nodes, dtype=np.int64)
        prior = np.full((len(labels), self.arity), 1.0 / self.arity)
        if depth >= self.max_depth:
            return prior
        # one gather per array, then in-place arithmetic in NumPy (the statistics live on the
        # training device; a GPU copy is moved to the CPU once per depth)
        host = lambda t: t[:, depth].cpu().numpy()  # noqa: E731
        valid = (host(self.stat_node)[labels] == nodes) & (nodes >= 0)
        sums = host(self.sum_probas)[labels].astype(np.float64)
        counts = host(self.path_counts)[labels].astype(np.float64)
        sums[~valid] = 0.0
        counts[~valid] = 0.0
        if self.prior_mode == "current_child":
            rows = np.flatnonzero(valid)
            prior[rows] *= 0.5
            prior[rows, host(self.current_child)[labels[rows]]] += 0.5
        sums += self.prior * prior
        sums /= (counts + self.prior)[:, None]
        return sums

    # ------------------------------------------------------------------ after a re-assignment
    @torch.no_grad()
    def on_reassign(self, new_tree: Tree, reset_nodes: Any = None, apply_decay: bool = True) -> None:
        """Decay everything, drop the sums whose node changed, follow the new tree's depth.
        ``apply_decay=False`` only follows the tree (what loading a layer's saved tree does)."""
        if apply_decay:
            self.sum_probas.mul_(self.decay)
            self.path_counts.mul_(self.decay)
            self.label_counts.mul_(self.decay)
        new_nodes = torch.as_tensor(np.where(new_tree.path_mask, new_tree.path_nodes, -1), device=self.device)
        old_nodes = self.stat_node
        if reset_nodes is not None and len(reset_nodes):
            stale = torch.isin(old_nodes, torch.as_tensor(np.asarray(reset_nodes), device=self.device))
            old_nodes = old_nodes.masked_fill(stale, -2)
        length = new_nodes.shape[1]
        if length != old_nodes.shape[1]:
            width = min(length, old_nodes.shape[1])
            sums = torch.zeros(new_nodes.shape[0], length, self.arity, device=self.device, dtype=self.dtype)
            counts = torch.zeros(new_nodes.shape[0], length, device=self.device, dtype=self.dtype)
            sums[:, :width] = self.sum_probas[:, :width]
            counts[:, :width] = self.path_counts[:, :width]
            padded = torch.full((new_nodes.shape[0], length), -3, device=self.device, dtype=old_nodes.dtype)
            padded[:, :width] = old_nodes[:, :width]
            self.sum_probas, self.path_counts, old_nodes = sums, counts, padded
        changed = old_nodes != new_nodes
        self.sum_probas[changed] = 0.0
        self.path_counts[changed] = 0.0
        self.stat_node = new_nodes
        self.current_child = torch.as_tensor(new_tree.path_children, device=self.device)
        self._tree = new_tree

    def grown(self, new_tree: Tree, old_labels: int) -> "NodeStatistics":
        """The statistics for ``new_tree``, a tree with labels added after its first ``old_labels``
        (:func:`hsm.label_addition.add_labels`): the trained labels keep what was collected for
        them at the depths they had (their nodes there are unchanged), new labels and the new
        depths start empty; same prior, decay and device."""
        grown = NodeStatistics(new_tree, prior=self.prior, decay=self.decay, device=self.device, dtype=self.dtype,
                               prior_mode=self.prior_mode)
        depth = min(self.max_depth, grown.max_depth)
        grown.label_counts[:old_labels] = self.label_counts[:old_labels]
        grown.sum_probas[:old_labels, :depth] = self.sum_probas[:old_labels, :depth]
        grown.path_counts[:old_labels, :depth] = self.path_counts[:old_labels, :depth]
        return grown

    def state_dict(self) -> dict[str, Any]:
        return {"sum_probas": self.sum_probas, "path_counts": self.path_counts, "label_counts": self.label_counts,
                "stat_node": self.stat_node, "current_child": self.current_child, "prior": self.prior,
                "decay": self.decay, "prior_mode": self.prior_mode}

    def checked_state(self, state: Any, tree: Tree) -> dict[str, Any]:
        """``state`` (from :meth:`state_dict`) checked against ``tree``, the tree it is loaded
        with, converted to this object's device and dtype; nothing is changed. ValueError naming
        the entry: a missing key, an array that is not a tensor of the shape ``tree`` gives
        (truncated), NaN / infinite or negative sums and counts, ``stat_node`` /
        ``current_child`` that are not ``tree``'s paths, ``prior`` not finite and > 0, ``decay``
        outside [0, 1], an unknown ``prior_mode``."""
        if not isinstance(state, Mapping):
            raise ValueError(f"statistics state must be a dict from NodeStatistics.state_dict(), got "
                             f"{type(state).__name__}")
        arrays = ("sum_probas", "path_counts", "label_counts", "stat_node", "current_child")
        missing = [key for key in (*arrays, "prior", "decay") if key not in state]
        if missing:
            raise ValueError(f"statistics state lacks {', '.join(map(repr, missing))}")
        leaves, length = tree.num_leaves, tree.max_depth
        shapes = {"sum_probas": (leaves, length, tree.arity), "path_counts": (leaves, length),
                  "label_counts": (leaves,), "stat_node": (leaves, length), "current_child": (leaves, length)}
        out: dict[str, Any] = {}
        for key in arrays:
            value = state[key]
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != shapes[key]:
                got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"statistics {key} must be a tensor of shape {list(shapes[key])} for the saved "
                                 f"tree (K'={leaves} leaves, depth {length}, M={tree.arity}), got {got}")
            if key in ("sum_probas", "path_counts", "label_counts"):
                if not value.is_floating_point() or not bool(torch.isfinite(value).all()) or bool((value < 0).any()):
                    raise ValueError(f"statistics {key} must hold finite, non-negative sums and counts")
                out[key] = value.to(self.device, self.dtype)
            else:
                out[key] = value.to(self.device)
        expected_node = torch.as_tensor(np.where(tree.path_mask, tree.path_nodes, -1))
        if not torch.equal(out["stat_node"].cpu().long(), expected_node):
            raise ValueError("statistics stat_node are not the saved tree's path nodes: the statistics belong to "
                             "another tree")
        if not torch.equal(out["current_child"].cpu().long(), torch.as_tensor(tree.path_children)):
            raise ValueError("statistics current_child are not the saved tree's path children: the statistics "
                             "belong to another tree")
        prior, decay = state["prior"], state["decay"]
        for name, value in (("prior", prior), ("decay", decay)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"statistics {name} must be a real number, got {value!r}")
        if not (math.isfinite(prior) and prior > 0):
            raise ValueError(f"statistics prior must be finite and > 0, got {prior}")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"statistics decay must lie in [0, 1], got {decay}")
        prior_mode = state.get("prior_mode", "current_child")
        if prior_mode not in ("current_child", "uniform"):
            raise ValueError(f"statistics prior_mode must be 'current_child' or 'uniform', got {prior_mode!r}")
        return {**out, "prior": float(prior), "decay": float(decay), "prior_mode": prior_mode}

    def load_state_dict(self, state: dict[str, Any], tree: Tree | None = None) -> None:
        """Restore :meth:`state_dict`, checked first (:meth:`checked_state`, against ``tree``, by
        default the tree the current arrays were allocated for): all or nothing."""
        if tree is None:
            tree = self._tree
        checked = self.checked_state(state, tree)
        self._install(tree, checked)

    def _install(self, tree: Tree, checked: dict[str, Any]) -> None:
        """Take a state that :meth:`checked_state` returned for ``tree`` (cannot fail)."""
        self._allocate(tree)
        for key, value in checked.items():
            setattr(self, key, value)


def node_objectives(tree: Tree, statistics: NodeStatistics) -> dict[str, np.ndarray]:
    """J_n (eq. 6) of every internal node that real labels reach, estimated from the statistics
    (continuous definition, eqs. 8-9). Returns arrays ``node``, ``depth``, ``objective``,
    ``mass`` (share of examples reaching the node)."""
    weights = statistics.label_weights()[: tree.num_labels]
    labels = np.arange(tree.num_labels)
    out_node, out_depth, out_j, out_mass = [], [], [], []
    for depth in range(tree.max_depth):
        on_path = tree.path_mask[: tree.num_labels, depth]
        if not on_path.any():
            break
        lab = labels[on_path]
        nodes = tree.path_nodes[lab, depth]
        uniq, group = np.unique(nodes, return_inverse=True)
        p_cond = statistics.p_cond(depth, lab, nodes)
        w = weights[lab]
        total = np.bincount(group, weights=w, minlength=len(uniq))
        q = w / total[group]
        _, marginal = node_terms(p_cond, w, group, len(uniq))
        per_label = q * np.abs(marginal[group] - p_cond).sum(axis=1)
        objective = (2.0 / tree.arity) * np.bincount(group, weights=per_label, minlength=len(uniq))
        out_node.append(uniq)
        out_depth.append(np.full(len(uniq), depth))
        out_j.append(objective)
        out_mass.append(total / weights.sum())
    return {"node": np.concatenate(out_node), "depth": np.concatenate(out_depth),
            "objective": np.concatenate(out_j), "mass": np.concatenate(out_mass)}


class ReleasedStatistics:
    """The node statistics of the authors' released code (``src/lomtree.cc``), as a
    :class:`hsm.assign.StatisticsSource` for :func:`hsm.assign.assign_labels_well_formed`.

    The fork keeps ``acc_probas[(node, label)]`` (SumProbas, an M-vector) and
    ``acc_counts[(node, label)]`` (Counts) in hash maps (``LOMtree::updateStats``). A pair is
    created, the first time the label reaches the node, with one pseudo-example (``initNodeStats``:
    count 1, ``0.5 / M`` on every child plus ``0.5`` on child ``position mod M``, ``position`` being
    the label's place in the node's label list); it is never decayed, never reset, and survives
    the label's moving away (it is found again if the label comes back).

    Here: between two rebuilds the tree is fixed, so (label, depth) names the same pair as (node,
    label); the training kernel adds to the current period's ``sum_probas`` [K', L, M],
    ``path_counts`` [K', L] and ``label_counts`` [K'] (the :class:`hsm.NodeStatistics` layout), and
    :meth:`flush` (called by :meth:`p_cond` and :meth:`on_reassign`) adds them to the store keyed
    by (node, label) (sorted int64 keys ``node * K' + label``, merged with NumPy, no per-pair Python).

    Differences from the fork, for reasons of interface: ``position`` is the label's rank by id
    among the node's real labels (the fork lists them in the order they arrived: child by child at
    the start, in the greedy's order later); a label that Algorithm 2 sends to a node that has no id
    yet during the rebuild (a new internal node) is read with the prior (the fork knows which freed
    id the node will get); and q_i uses the label's count over all of training plus the
    pseudo-count (``label_weights``: the :class:`~hsm.assign.StatisticsSource` protocol has one
    weight per label), where the fork uses ``acc_counts[(node, label)]`` (the examples seen at
    that node; :meth:`node_weights` gives them), which differs only for a label that moved. ``prior`` scales the pseudo-example
    (1 in the fork). ``decay`` (1 in the fork, the default) multiplies the whole store at every
    rebuild, pseudo-examples included: an option that separates the keying from the decay.
    """

    def __init__(self, tree: Tree, prior: float = 1.0, decay: float = 1.0) -> None:
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be an hsm.Tree, got {type(tree).__name__}")
        self.prior = check_positive(prior, "prior")
        if isinstance(decay, bool) or not isinstance(decay, (int, float, np.integer, np.floating)):
            raise TypeError(f"decay must be a real number, got {decay!r}")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must lie in [0, 1], got {decay}")
        self.decay = float(decay)
        self.arity = tree.arity
        self.num_labels = tree.num_labels
        self.num_leaves = tree.num_leaves
        self.keys = np.zeros(0, dtype=np.int64)
        self.sums = np.zeros((0, self.arity))
        self.counts = np.zeros(0)
        self.total_label_counts = np.zeros(self.num_leaves)
        self.label_counts = np.zeros(self.num_leaves, dtype=np.float32)
        self._install(tree)

    def _install(self, tree: Tree) -> None:
        self.tree = tree
        self.sum_probas = np.zeros((self.num_leaves, tree.max_depth, self.arity), dtype=np.float32)
        self.path_counts = np.zeros((self.num_leaves, tree.max_depth), dtype=np.float32)
        labels, depths = np.nonzero(tree.path_mask[: self.num_labels])
        nodes = tree.path_nodes[labels, depths]
        self._create(nodes, labels)

    def _prior_rows(self, nodes: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The pseudo-example of each (node, label) pair: ``prior`` x (0.5/M + 0.5 on child
        ``rank mod M``), rank = the label's rank by id among the pairs of the same node."""
        order = np.lexsort((labels, nodes))
        sorted_nodes = nodes[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_nodes)) + 1] if order.size else np.zeros(0, np.int64)
        first_of = np.repeat(starts, np.diff(np.r_[starts, order.size]))
        rank = np.empty(order.size, dtype=np.int64)
        rank[order] = np.arange(order.size) - first_of
        rows = np.full((labels.size, self.arity), 0.5 / self.arity)
        rows[np.arange(labels.size), rank % self.arity] += 0.5
        return rows * self.prior

    def _create(self, nodes: np.ndarray, labels: np.ndarray) -> None:
        """Add the pairs not in the store yet, each with its pseudo-example (``initNodeStats``)."""
        keys = nodes * self.num_leaves + labels
        found = self._find(keys) >= 0
        if found.all():
            return
        new_keys = keys[~found]
        rows = self._prior_rows(nodes, labels)[~found]
        keys = np.concatenate([self.keys, new_keys])
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.sums = np.concatenate([self.sums, rows])[order]
        self.counts = np.concatenate([self.counts, np.full(new_keys.size, self.prior)])[order]

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Index of each key in the store, -1 where absent."""
        if self.keys.size == 0:
            return np.full(keys.shape, -1, dtype=np.int64)
        where = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return np.where(self.keys[where] == keys, where, -1)

    def flush(self) -> None:
        """Add the current period's sums (collected on :attr:`tree`) to the (node, label) store."""
        tree = self.tree
        labels, depths = np.nonzero(tree.path_mask[: self.num_labels] & (self.path_counts[: self.num_labels] > 0))
        if labels.size:
            where = self._find(tree.path_nodes[labels, depths] * self.num_leaves + labels)
            assert (where >= 0).all(), "every pair of the tree in place was created when it was installed"
            self.sums[where] += self.sum_probas[labels, depths]
            self.counts[where] += self.path_counts[labels, depths]
        self.total_label_counts += self.label_counts
        self.sum_probas[:] = 0.0
        self.path_counts[:] = 0.0
        self.label_counts[:] = 0.0

    # -------------------------------------------------------------- StatisticsSource
    def label_weights(self) -> np.ndarray:
        """Examples per label (all of training) plus the pseudo-count; 0 for dummy leaves."""
        self.flush()
        weights = self.total_label_counts + self.prior
        weights[self.num_labels :] = 0.0
        return weights

    def p_cond(self, depth: int, labels: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """SumProbas / Counts of each (node, label) pair; a pair never seen gets the pseudo-example
        it would be created with (its rank among the same node's real labels in this query, which
        are the labels the rebuild sends to that node); dummy leaves get the uniform 1/M."""
        self.flush()
        labels = np.asarray(labels, dtype=np.int64)
        nodes = np.asarray(nodes, dtype=np.int64)
        out = np.full((labels.size, self.arity), 1.0 / self.arity)
        real = labels < self.num_labels
        where = np.where(real & (nodes >= 0), self._find(nodes * self.num_leaves + labels), -1)
        seen = where >= 0
        out[seen] = self.sums[where[seen]] / self.counts[where[seen], None]
        fresh = real & ~seen
        if fresh.any():
            real_rows = np.flatnonzero(real)
            priors = self._prior_rows(nodes[real_rows], labels[real_rows]) / self.prior
            pick = fresh[real_rows]
            out[real_rows[pick]] = priors[pick]
        return out

    def node_weights(self, depth: int, labels: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """The fork's q_i weights at a node (``LOMtree::computeNodeStats``): ``acc_counts[(node,
        label)]``, the examples of the label seen at that node plus the pseudo-example; the
        pseudo-count for a pair never seen; 0 for dummy leaves. Not in the
        :class:`~hsm.assign.StatisticsSource` protocol: :func:`hsm.assign.assign_labels_well_formed`
        reads one weight per label (:meth:`label_weights`); this is for an AssignLabels that
        takes per-node weights."""
        self.flush()
        labels = np.asarray(labels, dtype=np.int64)
        nodes = np.asarray(nodes, dtype=np.int64)
        real = labels < self.num_labels
        where = np.where(real & (nodes >= 0), self._find(nodes * self.num_leaves + labels), -1)
        out = np.where(real, self.prior, 0.0)
        out[where >= 0] = self.counts[where[where >= 0]]
        return out

    def on_reassign(self, new_tree: Tree, reset_nodes: Any = None, apply_decay: bool = True) -> None:
        """After a rebuild: flush, multiply the store by ``decay`` (1: the fork, nothing decays),
        create the new tree's new pairs; nothing is reset (``reset_nodes`` is accepted for
        :class:`hsm.NodeStatistics`' interface)."""
        self.flush()
        if apply_decay and self.decay != 1.0:
            self.sums *= self.decay
            self.counts *= self.decay
            self.total_label_counts *= self.decay
        self._install(new_tree)
