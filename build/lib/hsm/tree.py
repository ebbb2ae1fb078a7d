"""M-ary label trees: every label is a leaf, every label has a path (eq. 3).

A :class:`Tree` stores, for each internal node ``n`` and each of its ``M`` child slots ``j``,
what sits in slot ``(n, j)``:

* ``child_node[n, j] >= 0``: another internal node;
* ``child_label[n, j] >= 0``: a leaf holding that label (ids ``>= num_labels`` are *dummy* leaves,
  the zero-count padding that makes an M-ary tree well formed, see Algorithm 2 of the ICML paper);
* both ``-1``: an empty slot (fixed-depth trees with ``M**D > K`` have unused leaves).

The layer masks every slot whose subtree holds no real label, so the probabilities over the
``K`` real labels always sum to one (:attr:`Tree.slot_mask`).

From these the tree derives the paths ``c^l = ((c_{1,1}, c_{1,2}), ..., (c_{D,1}, c_{D,2}))`` of
eq. 3 as two ``[K, L]`` arrays (node index, child index per depth), padded to the longest path
``L`` with a boolean mask.

Two shapes of tree are used by the papers:

* **fixed depth** (``depth_limit = D``, Algorithm 3 of the ICML supplement, arXiv Algorithm 2):
  the complete M-ary tree of depth ``D`` in heap numbering (root 0, child ``j`` of node ``n`` is
  ``M n + j + 1``), labels placed at leaf positions ``0 .. M**D - 1``; node ids never change, so
  the node parameters keep their place when labels move;
* **well formed** (``depth_limit = None``, ICML Algorithm 2, Huffman trees, taxonomies): any tree;
  :meth:`Tree.is_well_formed` says whether every internal node has all ``M`` slots filled.

This module holds the structure and its queries. The constructors live in
:mod:`hsm.tree_builders`, the JSON file format in :mod:`hsm.tree_io` and the outline and
drawing in :mod:`hsm.tree_draw`; the classmethods and methods of :class:`Tree` call them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Tree"]

EMPTY_SLOT = -1


def as_int_array(values: Any, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind == "b":  # True / False are flags, not node or label ids
        raise TypeError(f"{name} must hold integers, got booleans")
    if array.dtype.kind not in "iu":
        if array.size and not np.all(np.equal(np.mod(array, 1), 0)):
            raise TypeError(f"{name} must hold integers")
        array = array.astype(np.int64)
    return array.astype(np.int64, copy=False)


def check_integer(value: Any, name: str) -> int:
    """``value`` as a Python int: Python and NumPy integers pass; bool (a flag, not a count), floats
    (even 10.0: a size given as a float is usually a computation gone wrong) and anything else
    raise TypeError naming the argument."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


def _checked_arguments(child_node: Any, child_label: Any, num_labels: Any,
                       depth_limit: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """:class:`Tree`'s arguments checked one by one (the tree shape itself is checked by
    :meth:`Tree._derive`): the two ``[N, M]`` slot arrays as int64 and ``K`` as an int. Raises
    TypeError for non-integers, ValueError naming the first bad shape, size or slot."""
    child_node = as_int_array(child_node, "child_node")
    child_label = as_int_array(child_label, "child_label")
    if child_node.ndim != 2 or child_node.shape != child_label.shape:
        raise ValueError(
            f"child_node and child_label must be [N, M] arrays of the same shape, got "
            f"{child_node.shape} and {child_label.shape}"
        )
    num_nodes, arity = child_node.shape
    if num_nodes < 1:
        raise ValueError("a tree needs at least one internal node (the root)")
    if arity < 2:
        raise ValueError(f"arity M must be >= 2, got {arity}")
    num_labels = check_integer(num_labels, "num_labels")
    if num_labels < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    if depth_limit is not None and check_integer(depth_limit, "depth_limit") < 1:
        raise ValueError(f"depth_limit must be >= 1 or None, got {depth_limit}")
    if depth_limit is not None:
        _check_heap_layout(child_node, child_label, int(depth_limit))
    both = (child_node >= 0) & (child_label >= 0)
    if both.any():
        n, j = np.argwhere(both)[0]
        raise ValueError(f"slot ({n}, {j}) holds both an internal node and a label")
    if (child_node >= num_nodes).any() or (child_node < EMPTY_SLOT).any():
        raise ValueError(f"child_node entries must be -1 or in [0, {num_nodes})")
    if (child_label < EMPTY_SLOT).any():
        raise ValueError("child_label entries must be -1 or a leaf id >= 0")
    return child_node, child_label, num_labels


def _check_heap_layout(child_node: np.ndarray, child_label: np.ndarray, depth: int) -> None:
    """A fixed-depth tree (``depth_limit = D``) is the complete M-ary tree of depth D in heap
    numbering, with labels in its last level only: Algorithm 3 re-assigns labels to those
    positions and keeps the node ids, so a tree of another shape would fail at its first
    re-assignment. ValueError naming the mismatch."""
    num_nodes, arity = child_node.shape
    expected = (arity**depth - 1) // (arity - 1)  # Python ints: no wrap-around
    if num_nodes != expected:
        raise ValueError(f"depth_limit={depth} needs the complete {arity}-ary tree of depth {depth} "
                         f"({expected} internal nodes in heap order), got {num_nodes} nodes: pass the tree's "
                         f"true depth limit, or depth_limit=None for a tree of any shape")
    inner = (arity ** (depth - 1) - 1) // (arity - 1)  # nodes above the last internal level
    heap = np.arange(inner)[:, None] * arity + np.arange(arity)[None, :] + 1
    if not (np.array_equal(child_node[:inner], heap) and (child_node[inner:] == EMPTY_SLOT).all()
            and (child_label[:inner] == EMPTY_SLOT).all()):
        raise ValueError(f"depth_limit={depth}: child_node / child_label are not the heap layout of a complete "
                         f"{arity}-ary tree of depth {depth} (child j of node n is M n + j + 1, labels in the last "
                         f"level only); pass depth_limit=None for a tree of any shape")


class Tree:
    """An M-ary label tree.

    Parameters
    ----------
    child_node, child_label:
        ``[N, M]`` integer arrays described in the module docstring. Node 0 is the root.
    num_labels:
        ``K``, the number of real labels; leaf ids ``>= K`` are dummy leaves.
    depth_limit:
        ``D`` for a fixed-depth tree in heap layout, None otherwise.
    label_names:
        Optional names, used by :meth:`summary` and :meth:`draw`.

    Most users call a constructor (:mod:`hsm.tree_builders`): :meth:`random`, :meth:`balanced`,
    :meth:`complete`, :meth:`huffman`, :meth:`from_nested`, :meth:`from_taxonomy`, :meth:`from_clusters`.
    """

    def __init__(
        self,
        child_node: Any,
        child_label: Any,
        num_labels: int,
        depth_limit: int | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        child_node, child_label, num_labels = _checked_arguments(child_node, child_label, num_labels, depth_limit)
        self.child_node = child_node
        self.child_label = child_label
        self.num_labels = int(num_labels)
        self.depth_limit = None if depth_limit is None else int(depth_limit)
        if isinstance(label_names, (str, bytes)):  # list("abc") would make one name per character
            raise TypeError(f"label_names must be a list of names, got a {type(label_names).__name__}")
        self.label_names = None if label_names is None else list(label_names)
        if self.label_names is not None and len(self.label_names) != self.num_labels:
            raise ValueError(f"{len(self.label_names)} label names for {self.num_labels} labels")
        self._derive()

    # ------------------------------------------------------------------ structure
    @property
    def arity(self) -> int:
        """M, the number of child slots per internal node."""
        return int(self.child_node.shape[1])

    @property
    def num_nodes(self) -> int:
        """N, the number of internal nodes (each owns M softmax outputs)."""
        return int(self.child_node.shape[0])

    @property
    def num_leaves(self) -> int:
        """Real plus dummy leaves."""
        return int(self.leaf_ids_max + 1)

    @property
    def num_dummies(self) -> int:
        return self.num_leaves - self.num_labels

    @property
    def max_depth(self) -> int:
        """L, the length of the longest label path."""
        return int(self.path_nodes.shape[1])

    def _derive(self) -> None:
        """Walk the tree from the root once: parents, depths, paths, masks; check it is a tree."""
        num_nodes, arity = self.child_node.shape
        parent = np.full(num_nodes, EMPTY_SLOT, dtype=np.int64)
        parent_slot = np.full(num_nodes, EMPTY_SLOT, dtype=np.int64)
        node_depth = np.full(num_nodes, EMPTY_SLOT, dtype=np.int64)
        node_depth[0] = 0
        order = [0]
        frontier = np.array([0])
        while frontier.size:
            kids = self.child_node[frontier]
            n_idx, j_idx = np.nonzero(kids >= 0)
            children = kids[n_idx, j_idx]
            if children.size:
                if (node_depth[children] != EMPTY_SLOT).any() or np.unique(children).size != children.size:
                    raise ValueError("child_node does not describe a tree (a node is reached twice or is the root)")
                parent[children] = frontier[n_idx]
                parent_slot[children] = j_idx
                node_depth[children] = node_depth[frontier[n_idx]] + 1
                order.extend(children.tolist())
            frontier = children
        unreachable = np.nonzero(node_depth == EMPTY_SLOT)[0]
        self._unreachable_nodes = unreachable
        self.parent, self.parent_slot, self.node_depth = parent, parent_slot, node_depth
        self.bfs_order = np.asarray(order, dtype=np.int64)

        # leaves: (node, slot) of every label / dummy leaf
        reachable_rows = np.zeros(num_nodes, dtype=bool)
        reachable_rows[self.bfs_order] = True
        label_slots = (self.child_label >= 0) & reachable_rows[:, None]
        leaf_nodes, leaf_slots = np.nonzero(label_slots)
        leaf_ids = self.child_label[leaf_nodes, leaf_slots]
        self.leaf_ids_max = int(leaf_ids.max()) if leaf_ids.size else -1
        if leaf_ids.size != np.unique(leaf_ids).size:
            dup = np.bincount(leaf_ids).argmax()
            raise ValueError(f"label {dup} sits in more than one leaf")
        present = np.zeros(max(self.leaf_ids_max + 1, self.num_labels), dtype=bool)
        present[leaf_ids] = True
        missing = np.nonzero(~present[: self.num_labels])[0]
        if missing.size:
            raise ValueError(f"{missing.size} labels have no leaf (first: {missing[:5].tolist()})")
        if self.leaf_ids_max + 1 > present.sum():
            raise ValueError("leaf ids must be contiguous: dummy leaves are numbered K, K+1, ...")
        stray = self.child_label[unreachable]
        if (stray >= max(self.leaf_ids_max + 1, self.num_labels)).any():
            n = unreachable[np.nonzero((stray >= max(self.leaf_ids_max + 1, self.num_labels)).any(axis=1))[0][0]]
            raise ValueError(f"unreachable node {n} holds leaf id {int(self.child_label[n].max())}, outside the "
                             f"tree's leaves 0..{max(self.leaf_ids_max, self.num_labels - 1)}")

        # paths (eq. 3): walk up from each leaf
        depth_of_leaf = node_depth[leaf_nodes] + 1
        max_len = int(depth_of_leaf.max())
        num_leaves = self.leaf_ids_max + 1
        path_nodes = np.zeros((num_leaves, max_len), dtype=np.int64)
        path_children = np.zeros((num_leaves, max_len), dtype=np.int64)
        path_mask = np.zeros((num_leaves, max_len), dtype=bool)
        node, slot, pos = leaf_nodes.copy(), leaf_slots.copy(), depth_of_leaf - 1
        rows = leaf_ids.copy()
        while rows.size:
            path_nodes[rows, pos] = node
            path_children[rows, pos] = slot
            path_mask[rows, pos] = True
            keep = node != 0
            rows, node, pos = rows[keep], node[keep], pos[keep] - 1
            slot = parent_slot[node]
            node = parent[node]
        self.depths = depth_of_leaf[np.argsort(leaf_ids)]
        # padded steps point at (root, child 0) and are masked out
        self.path_nodes, self.path_children, self.path_mask = path_nodes, path_children, path_mask

        # a slot is usable iff its subtree holds at least one real label
        holds_real = np.zeros(num_nodes, dtype=bool)
        real = np.arange(num_leaves) < self.num_labels
        holds_real[path_nodes[real][path_mask[real]]] = True
        slot_mask = (self.child_label >= 0) & (self.child_label < self.num_labels)
        inner = self.child_node >= 0
        slot_mask[inner] = holds_real[self.child_node[inner]]
        self.slot_mask = slot_mask

    # ------------------------------------------------------------------ queries
    def path(self, label: int) -> list[tuple[int, int]]:
        """The path ``c^label`` of eq. 3 as a list of (node, child) pairs, root first."""
        if not 0 <= label < self.num_leaves:
            raise ValueError(f"unknown label {label}: the tree has labels 0..{self.num_labels - 1}")
        mask = self.path_mask[label]
        return list(zip(self.path_nodes[label][mask].tolist(), self.path_children[label][mask].tolist()))

    def labels_under(self, node: int) -> np.ndarray:
        """Real labels whose path passes through ``node`` (sorted)."""
        hit = ((self.path_nodes == node) & self.path_mask).any(axis=1)
        hit[self.num_labels :] = False
        return np.nonzero(hit)[0]

    def nodes_at_depth(self, depth: int) -> np.ndarray:
        """Reachable internal nodes at ``depth`` (root = depth 0)."""
        return np.nonzero(self.node_depth == depth)[0]

    def is_well_formed(self) -> bool:
        """Every reachable internal node has all M slots filled (a full M-ary tree)."""
        rows = self.bfs_order
        filled = (self.child_node[rows] >= 0) | (self.child_label[rows] >= 0)
        return bool(filled.all())

    def expected_depth(self, counts: Any) -> float:
        """Average path length under label frequencies ``counts`` (what Huffman trees minimise)."""
        counts = np.asarray(counts, dtype=np.float64)
        if counts.shape != (self.num_labels,):
            raise ValueError(f"counts must have shape ({self.num_labels},), got {counts.shape}")
        return float((counts * self.depths[: self.num_labels]).sum() / counts.sum())

    def leaf_positions(self) -> np.ndarray:
        """For a fixed-depth tree: the leaf position ``0 .. M**D - 1`` of every real label."""
        if self.depth_limit is None:
            raise ValueError("leaf positions exist only for fixed-depth trees")
        positions = np.zeros(self.num_labels, dtype=np.int64)
        for level in range(self.depth_limit):
            positions = positions * self.arity + self.path_children[: self.num_labels, level]
        return positions

    def __repr__(self) -> str:
        kind = f"depth {self.depth_limit}" if self.depth_limit is not None else f"max depth {self.max_depth}"
        extra = f", {self.num_dummies} dummy leaves" if self.num_dummies else ""
        return f"Tree(K={self.num_labels}, M={self.arity}, {kind}, {self.num_nodes} internal nodes{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return (
            self.num_labels == other.num_labels
            and self.depth_limit == other.depth_limit
            and np.array_equal(self.child_node, other.child_node)
            and np.array_equal(self.child_label, other.child_label)
        )

    def same_partition(self, other: "Tree") -> bool:
        """True when both trees put the same labels under the same node ids (paths equal)."""
        k = self.num_labels
        return (
            k == other.num_labels
            and self.path_nodes.shape == other.path_nodes.shape
            and np.array_equal(self.path_nodes[:k], other.path_nodes[:k])
            and np.array_equal(self.path_children[:k], other.path_children[:k])
        )

    # ------------------------------------------------------------------ constructors (hsm.tree_builders)
    @classmethod
    def complete(cls, leaf_position: Any, arity: int, depth: int,
                 label_names: Sequence[str] | None = None) -> "Tree":
        """Fixed-depth tree with label ``i`` at leaf ``leaf_position[i]``: :func:`hsm.tree_builders.complete_tree`."""
        from .tree_builders import complete_tree
        return complete_tree(leaf_position, arity, depth, label_names=label_names)

    @classmethod
    def balanced(cls, order: Any, arity: int, depth: int | None = None,
                 label_names: Sequence[str] | None = None) -> "Tree":
        """Fixed-depth tree filled evenly from an ordering: :func:`hsm.tree_builders.balanced_tree`."""
        from .tree_builders import balanced_tree
        return balanced_tree(order, arity, depth, label_names=label_names)

    @classmethod
    def random(cls, num_labels: int, arity: int, depth: int | None = None,
               seed: int | np.random.Generator | None = 0, label_names: Sequence[str] | None = None) -> "Tree":
        """The random fixed-depth tree baseline (ICML §6, §7.2): :func:`hsm.tree_builders.random_tree`."""
        from .tree_builders import random_tree
        return random_tree(num_labels, arity, depth, seed=seed, label_names=label_names)

    @classmethod
    def huffman(cls, counts: Any, arity: int = 2, label_names: Sequence[str] | None = None) -> "Tree":
        """M-ary Huffman tree over label counts (ICML §7.1): :func:`hsm.tree_builders.huffman_tree`."""
        from .tree_builders import huffman_tree
        return huffman_tree(counts, arity, label_names=label_names)

    @classmethod
    def from_nested(cls, nested: Sequence[Any], num_labels: int | None = None, arity: int | None = None,
                    label_names: Sequence[str] | None = None) -> "Tree":
        """Any tree from nested lists of labels: :func:`hsm.tree_builders.nested_tree`."""
        from .tree_builders import nested_tree
        return nested_tree(nested, num_labels=num_labels, arity=arity, label_names=label_names)

    @classmethod
    def from_taxonomy(cls, taxonomy: Mapping[str, Sequence[str]], label_names: Sequence[str],
                      arity: int | None = None) -> "Tree":
        """Two-level tree from a natural taxonomy (Schuurmans & Frasincar): :func:`hsm.tree_builders.taxonomy_tree`."""
        from .tree_builders import taxonomy_tree
        return taxonomy_tree(taxonomy, label_names, arity=arity)

    @classmethod
    def from_clusters(cls, cluster_of_label: Any, arity: int, depth: int, cluster_order: Any | None = None,
                      label_names: Sequence[str] | None = None, cluster_group: Any | None = None) -> "Tree":
        """Fixed-depth tree from a flat clustering (ICML §7.2): :func:`hsm.tree_builders.cluster_tree`."""
        from .tree_builders import cluster_tree
        return cluster_tree(cluster_of_label, arity, depth, cluster_order=cluster_order, label_names=label_names,
                            cluster_group=cluster_group)

    # ------------------------------------------------------------------ persistence (hsm.tree_io)
    def to_dict(self) -> dict[str, Any]:
        """The ``hsm.Tree/1`` JSON description: :func:`hsm.tree_io.tree_to_dict`."""
        from .tree_io import tree_to_dict
        return tree_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Tree":
        """The tree :meth:`to_dict` described: :func:`hsm.tree_io.tree_from_dict`."""
        from .tree_io import tree_from_dict
        return tree_from_dict(data)

    def save(self, path: str | Path) -> Path:
        """Write the tree as JSON, atomically: :func:`hsm.tree_io.save_tree`."""
        from .tree_io import save_tree
        return save_tree(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "Tree":
        """The tree :meth:`save` wrote to ``path``: :func:`hsm.tree_io.load_tree`."""
        from .tree_io import load_tree
        return load_tree(path)

    # ------------------------------------------------------------------ display (hsm.tree_draw)
    def _names(self, labels: np.ndarray) -> list[str]:
        if self.label_names is None:
            return [str(i) for i in labels]
        return [self.label_names[i] for i in labels]

    def top_labels(self, node: int, counts: Any | None = None, k: int = 4) -> list[str]:
        """The ``k`` most frequent labels under ``node`` (by ``counts``; by id without counts)."""
        labels = self.labels_under(node)
        if counts is not None:
            weights = np.asarray(counts)[labels]
            labels = labels[np.argsort(-weights, kind="stable")]
        return self._names(labels[:k])

    def summary(self, counts: Any | None = None, k: int = 4, max_depth: int = 1, max_children: int = 8) -> str:
        """A readable outline of the top of the tree: :func:`hsm.tree_draw.tree_summary`."""
        from .tree_draw import tree_summary
        return tree_summary(self, counts, k=k, max_depth=max_depth, max_children=max_children)

    def draw(self, ax: Any = None, counts: Any | None = None, k: int = 4, max_depth: int = 2,
             max_children: int = 6, root: int = 0) -> Any:
        """Draw the top of the tree with matplotlib: :func:`hsm.tree_draw.draw_tree`."""
        from .tree_draw import draw_tree
        return draw_tree(self, ax, counts, k=k, max_depth=max_depth, max_children=max_children, root=root)
