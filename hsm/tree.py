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
"""
from __future__ import annotations

import heapq
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Tree"]

_EMPTY = -1


def _as_int_array(values: Any, name: str) -> np.ndarray:
    array = np.asarray(values)
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

    Most users call a constructor: :meth:`random`, :meth:`balanced`, :meth:`complete`,
    :meth:`huffman`, :meth:`from_nested`, :meth:`from_taxonomy`, :meth:`from_clusters`.
    """

    def __init__(
        self,
        child_node: Any,
        child_label: Any,
        num_labels: int,
        depth_limit: int | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        child_node = _as_int_array(child_node, "child_node")
        child_label = _as_int_array(child_label, "child_label")
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
        both = (child_node >= 0) & (child_label >= 0)
        if both.any():
            n, j = np.argwhere(both)[0]
            raise ValueError(f"slot ({n}, {j}) holds both an internal node and a label")
        if (child_node >= num_nodes).any() or (child_node < _EMPTY).any():
            raise ValueError(f"child_node entries must be -1 or in [0, {num_nodes})")
        if (child_label < _EMPTY).any():
            raise ValueError("child_label entries must be -1 or a leaf id >= 0")
        self.child_node = child_node
        self.child_label = child_label
        self.num_labels = int(num_labels)
        self.depth_limit = None if depth_limit is None else int(depth_limit)
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
        parent = np.full(num_nodes, _EMPTY, dtype=np.int64)
        parent_slot = np.full(num_nodes, _EMPTY, dtype=np.int64)
        node_depth = np.full(num_nodes, _EMPTY, dtype=np.int64)
        node_depth[0] = 0
        order = [0]
        frontier = np.array([0])
        while frontier.size:
            kids = self.child_node[frontier]
            n_idx, j_idx = np.nonzero(kids >= 0)
            children = kids[n_idx, j_idx]
            if children.size:
                if (node_depth[children] != _EMPTY).any() or np.unique(children).size != children.size:
                    raise ValueError("child_node does not describe a tree (a node is reached twice or is the root)")
                parent[children] = frontier[n_idx]
                parent_slot[children] = j_idx
                node_depth[children] = node_depth[frontier[n_idx]] + 1
                order.extend(children.tolist())
            frontier = children
        unreachable = np.nonzero(node_depth == _EMPTY)[0]
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

    # ------------------------------------------------------------------ constructors
    @classmethod
    def complete(
        cls,
        leaf_position: Any,
        arity: int,
        depth: int,
        label_names: Sequence[str] | None = None,
    ) -> "Tree":
        """Fixed-depth tree: label ``i`` sits at leaf position ``leaf_position[i]`` of the complete
        M-ary tree of depth ``D`` (heap numbering). Requires ``M**D >= K`` (the depth constraint of
        Algorithm 3); unused leaves are empty slots."""
        positions = _as_int_array(leaf_position, "leaf_position")
        num_labels = positions.size
        _check_arity_depth(num_labels, arity, depth)
        arity, depth = int(arity), int(depth)  # Python ints: M**D must not wrap around
        capacity = arity**depth
        if positions.ndim != 1 or (positions < 0).any() or (positions >= capacity).any():
            raise ValueError(f"leaf positions must lie in [0, M**D) = [0, {capacity})")
        if np.unique(positions).size != num_labels:
            raise ValueError("two labels share a leaf position")
        num_nodes = (capacity - 1) // (arity - 1)  # internal nodes of the complete tree
        first_bottom = (arity ** (depth - 1) - 1) // (arity - 1)  # first node of the last internal level
        child_node = np.arange(num_nodes)[:, None] * arity + np.arange(arity)[None, :] + 1
        child_node[first_bottom:] = _EMPTY
        child_label = np.full((num_nodes, arity), _EMPTY, dtype=np.int64)
        bottom = first_bottom + positions // arity
        child_label[bottom, positions % arity] = np.arange(num_labels)
        return cls(child_node, child_label, num_labels, depth_limit=depth, label_names=label_names)

    @classmethod
    def balanced(
        cls,
        order: Any,
        arity: int,
        depth: int | None = None,
        label_names: Sequence[str] | None = None,
    ) -> "Tree":
        """Fixed-depth tree filled from an ordering of the labels: consecutive labels share
        subtrees, and at every node the labels are split as evenly as possible over the M
        children (so unused leaves are spread out, not piled at the end).

        ``depth`` defaults to the smallest D with ``M**D >= K``."""
        order = _as_int_array(order, "order")
        num_labels = order.size
        if num_labels < 1:
            raise ValueError("cannot build a tree over zero labels")
        if np.unique(order).size != num_labels or order.min() < 0 or order.max() >= num_labels:
            raise ValueError("order must be a permutation of 0..K-1")
        arity = check_integer(arity, "arity")
        depth = _min_depth(num_labels, arity) if depth is None else depth
        _check_arity_depth(num_labels, arity, depth)
        # rank r of the ordering goes to a position whose digits split ranks evenly at each level
        ranks = np.arange(num_labels)
        positions = np.zeros(num_labels, dtype=np.int64)
        start = np.zeros(num_labels, dtype=np.int64)  # first rank of the current subtree
        size = np.full(num_labels, num_labels, dtype=np.int64)  # number of ranks in it
        for _ in range(depth):
            base, extra = size // arity, size % arity
            local = ranks - start
            # children 0..extra-1 get base+1 ranks, the others base
            big = extra * (base + 1)
            child = np.where(local < big, local // np.maximum(base + 1, 1), extra + (local - big) // np.maximum(base, 1))
            child_start = np.where(child < extra, child * (base + 1), big + (child - extra) * base)
            start = start + child_start
            size = np.where(child < extra, base + 1, base)
            positions = positions * arity + child
        leaf_position = np.empty(num_labels, dtype=np.int64)
        leaf_position[order] = positions
        return cls.complete(leaf_position, arity, depth, label_names=label_names)

    @classmethod
    def random(
        cls,
        num_labels: int,
        arity: int,
        depth: int | None = None,
        seed: int | np.random.Generator | None = 0,
        label_names: Sequence[str] | None = None,
    ) -> "Tree":
        """A random fixed-depth tree: a uniformly random ordering filled by :meth:`balanced`
        (the papers' "random tree" baseline)."""
        num_labels = check_integer(num_labels, "num_labels")
        if num_labels < 2:
            raise ValueError(f"a label tree needs K >= 2 labels, got {num_labels}")
        arity = check_integer(arity, "arity")
        depth = None if depth is None else check_integer(depth, "depth")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        return cls.balanced(rng.permutation(num_labels), arity, depth, label_names=label_names)

    @classmethod
    def huffman(
        cls,
        counts: Any,
        arity: int = 2,
        label_names: Sequence[str] | None = None,
    ) -> "Tree":
        """M-ary Huffman tree over label frequencies (arity 2 = fastText's ``-loss hs`` tree).

        Zero-count dummy leaves are added so the leaf count is ``1 mod (M-1)`` (inventory §7.7):
        the tree is then well formed (every node has M children) and the expected depth
        ``sum_i f_i depth_i`` is minimal. Ties are broken by label id, so the tree is
        deterministic. Node 0 is the root; nodes are numbered breadth first."""
        counts = np.asarray(counts, dtype=np.float64)
        if counts.ndim != 1 or counts.size < 2:
            raise ValueError(f"Huffman needs a 1-D array of K >= 2 label counts, got shape {counts.shape}")
        if (counts < 0).any() or not np.isfinite(counts).all():
            raise ValueError("label counts must be finite and non-negative")
        arity = check_integer(arity, "arity")
        if arity < 2:
            raise ValueError(f"arity M must be >= 2, got {arity}")
        num_labels = counts.size
        num_dummies = (-(num_labels - 1)) % (arity - 1)
        # heap entries: (weight, tiebreak, kind, id) with kind 0 = leaf, 1 = merged node
        heap: list[tuple[float, int, int, int]] = [(float(c), i, 0, i) for i, c in enumerate(counts)]
        heap += [(0.0, -1 - d, 0, num_labels + d) for d in range(num_dummies)]
        heapq.heapify(heap)
        merged_children: list[list[tuple[int, int]]] = []
        tiebreak = num_labels
        while len(heap) > 1:
            group = [heapq.heappop(heap) for _ in range(arity)]
            merged_children.append([(kind, ident) for _, _, kind, ident in group])
            heapq.heappush(heap, (sum(g[0] for g in group), tiebreak, 1, len(merged_children) - 1))
            tiebreak += 1
        # renumber merged nodes breadth first from the root (the last merge)
        root = len(merged_children) - 1
        new_id = {root: 0}
        queue = [root]
        child_node = np.full((len(merged_children), arity), _EMPTY, dtype=np.int64)
        child_label = np.full((len(merged_children), arity), _EMPTY, dtype=np.int64)
        head = 0
        while head < len(queue):
            old = queue[head]
            head += 1
            for slot, (kind, ident) in enumerate(merged_children[old]):
                if kind == 1:
                    new_id[ident] = len(new_id)
                    queue.append(ident)
                    child_node[new_id[old], slot] = new_id[ident]
                else:
                    child_label[new_id[old], slot] = ident
        return cls(child_node, child_label, num_labels, label_names=label_names)

    @classmethod
    def from_nested(
        cls,
        nested: Sequence[Any],
        num_labels: int | None = None,
        arity: int | None = None,
        label_names: Sequence[str] | None = None,
    ) -> "Tree":
        """General tree from nested lists: ``[[0, 1, 2], [3, [4, 5]]]`` is a root with two
        children, the second of which has a leaf (3) and a subtree over 4 and 5. Integers are
        labels. ``arity`` defaults to the largest number of children; nodes with fewer children
        get empty (masked) slots."""
        def width(item: Any) -> int:
            if isinstance(item, (int, np.integer)):
                return 0
            if len(item) == 0:
                raise ValueError("empty subtree in nested tree description")
            return max(len(item), *(width(child) for child in item))

        if isinstance(nested, (int, np.integer)) or len(nested) == 0:
            raise ValueError("the root must be a non-empty list")
        arity = max(2, width(nested)) if arity is None else check_integer(arity, "arity")
        if arity < 2:
            raise ValueError(f"arity M must be >= 2, got {arity}")
        if width(nested) > arity:
            raise ValueError(f"a node has {width(nested)} children but arity is {arity}")
        child_node: list[list[int]] = []
        child_label: list[list[int]] = []
        labels_seen: list[int] = []
        queue: list[Sequence[Any]] = [nested]
        head = 0
        while head < len(queue):
            item = queue[head]
            head += 1
            nodes_row, labels_row = [_EMPTY] * arity, [_EMPTY] * arity
            for slot, child in enumerate(item):
                if isinstance(child, (int, np.integer)):
                    labels_row[slot] = int(child)
                    labels_seen.append(int(child))
                else:
                    queue.append(child)
                    nodes_row[slot] = len(queue) - 1
            child_node.append(nodes_row)
            child_label.append(labels_row)
        num_labels = max(labels_seen) + 1 if num_labels is None else check_integer(num_labels, "num_labels")
        return cls(np.array(child_node), np.array(child_label), num_labels, label_names=label_names)

    @classmethod
    def from_taxonomy(
        cls,
        taxonomy: Mapping[str, Sequence[str]],
        label_names: Sequence[str],
        arity: int | None = None,
    ) -> "Tree":
        """Two-level tree root -> categories -> classes from a natural taxonomy
        (``{category: [class names]}``, as in Schuurmans & Frasincar). Every label must appear in
        exactly one category. A category with a single class stays an internal node with one
        usable slot (its softmax is then always 1), so every path has the same two steps as in the
        paper's two-level model; ``arity`` defaults to the widest level."""
        index = {name: i for i, name in enumerate(label_names)}
        if len(index) != len(label_names):
            raise ValueError("label names must be unique")
        nested: list[list[int]] = []
        seen: dict[str, str] = {}
        for category, members in taxonomy.items():
            if len(members) == 0:
                raise ValueError(f"taxonomy category {category!r} has no classes")
            group = []
            for name in members:
                if name not in index:
                    raise ValueError(f"taxonomy category {category!r} names unknown label {name!r}")
                if name in seen:
                    raise ValueError(f"label {name!r} is in categories {seen[name]!r} and {category!r}")
                seen[name] = category
                group.append(index[name])
            nested.append(group)
        missing = [name for name in label_names if name not in seen]
        if missing:
            raise ValueError(f"{len(missing)} labels are in no taxonomy category, e.g. {missing[:3]}")
        return cls.from_nested(nested, num_labels=len(label_names), arity=arity, label_names=label_names)

    @classmethod
    def from_clusters(
        cls,
        cluster_of_label: Any,
        arity: int,
        depth: int,
        cluster_order: Any | None = None,
        label_names: Sequence[str] | None = None,
        cluster_group: Any | None = None,
    ) -> "Tree":
        """Fixed-depth tree from a flat clustering (the clustering-tree baseline of ICML §7.2):
        cluster ``c`` fills the ``c``-th node of the last internal level, so each cluster must
        hold at most M labels and there can be at most ``M**(D-1)`` clusters. ``cluster_order``
        permutes the clusters first (consecutive clusters share ancestors: pass an ordering
        from a coarser clustering of the centroids to group similar clusters).

        ``cluster_group`` (one group id < M per cluster, e.g. a k-means of the centroids into M
        groups) instead puts group ``g``'s clusters under root child ``g``, filling that
        subtree's bottom nodes in cluster order; a group may hold at most ``M**(D-2)`` clusters.
        Unlike ``cluster_order``, a small group does not shift the groups after it."""
        clusters = _as_int_array(cluster_of_label, "cluster_of_label")
        num_labels = clusters.size
        _check_arity_depth(num_labels, arity, depth)
        arity, depth = int(arity), int(depth)
        num_clusters = int(clusters.max()) + 1
        if num_clusters > arity ** (depth - 1):
            raise ValueError(f"{num_clusters} clusters do not fit the {arity ** (depth - 1)} bottom nodes")
        if cluster_group is not None:
            if cluster_order is not None:
                raise ValueError("pass cluster_order or cluster_group, not both")
            groups = _as_int_array(cluster_group, "cluster_group")
            if groups.shape != (num_clusters,) or groups.min() < 0 or groups.max() >= arity:
                raise ValueError(f"cluster_group must give each of the {num_clusters} clusters a group in [0, {arity})")
            per_group = arity ** (depth - 2) if depth >= 2 else 1
            order = np.argsort(groups, kind="stable")
            sizes_g = np.bincount(groups, minlength=arity)
            if sizes_g.max() > per_group:
                raise ValueError(f"a group holds {sizes_g.max()} clusters; a root child has room for {per_group}")
            rank_in_group = np.empty(num_clusters, dtype=np.int64)
            rank_in_group[order] = np.arange(num_clusters) - np.repeat(np.cumsum(sizes_g) - sizes_g, sizes_g)
            bottom = groups * per_group + rank_in_group  # index among the bottom internal nodes
            clusters = bottom[clusters]
            num_clusters = arity ** (depth - 1)
        elif cluster_order is not None:
            cluster_order = _as_int_array(cluster_order, "cluster_order")
            rank = np.empty(num_clusters, dtype=np.int64)
            rank[cluster_order] = np.arange(num_clusters)
            clusters = rank[clusters]
        sizes = np.bincount(clusters, minlength=num_clusters)
        if sizes.max() > arity:
            raise ValueError(f"a cluster holds {sizes.max()} labels, more than the arity {arity}")
        order = np.argsort(clusters, kind="stable")
        slot_in_cluster = np.arange(num_labels) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        positions = np.empty(num_labels, dtype=np.int64)
        positions[order] = clusters[order] * arity + slot_in_cluster
        return cls.complete(positions, arity, depth, label_names=label_names)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "hsm.Tree/1",
            "num_labels": self.num_labels,
            "arity": self.arity,
            "depth_limit": self.depth_limit,
            "child_node": self.child_node.tolist(),
            "child_label": self.child_label.tolist(),
            "label_names": self.label_names,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Tree":
        """The tree :meth:`to_dict` described. Raises ValueError when ``data`` is not such a
        description (not a mapping, another ``format``, a missing key, or arrays that do not
        form a tree), naming what is wrong; TypeError for a non-integer size."""
        if not isinstance(data, Mapping):
            raise ValueError(f"an hsm tree description is a JSON object / dict, got {type(data).__name__}")
        if data.get("format") != "hsm.Tree/1":
            raise ValueError(f"not an hsm tree description (format={data.get('format')!r}, expected 'hsm.Tree/1')")
        missing = [key for key in ("num_labels", "arity", "child_node", "child_label") if key not in data]
        if missing:
            raise ValueError(f"the hsm tree description lacks {', '.join(map(repr, missing))}")
        arity = check_integer(data["arity"], "arity")
        if arity < 2:
            raise ValueError(f"arity M must be >= 2, got {arity}")
        arrays = []
        for key in ("child_node", "child_label"):
            try:
                array = np.asarray(data[key], dtype=np.int64)
            except (TypeError, ValueError, OverflowError) as error:
                raise ValueError(f"{key} must be a list of integers ({error})") from None
            if array.ndim not in (1, 2) or array.size % arity:
                raise ValueError(f"{key} must hold N * arity = N * {arity} integers, got shape {list(array.shape)}")
            arrays.append(array.reshape(-1, arity))
        return cls(arrays[0], arrays[1], data["num_labels"], depth_limit=data.get("depth_limit"),
                   label_names=data.get("label_names"))

    def save(self, path: str | Path) -> Path:
        """Write the tree as JSON, atomically (a per-process temporary file, fsynced and renamed
        into place): a reader sees the previous file or the complete new one, and two writers of
        the same path do not collide."""
        from hsm.data.fetch import write_text_atomically  # the package's one atomic writer (lazy: no import cycle)

        return write_text_atomically(Path(path), json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "Tree":
        """The tree :meth:`save` wrote to ``path``. Raises FileNotFoundError for a missing file
        and ValueError naming the path when the file is not JSON (truncated, another format),
        not a JSON object, or not a tree description (:meth:`from_dict` says what is wrong)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not a tree file (not UTF-8 text: {error})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON, truncated or not a tree file ({error})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: holds a JSON {type(data).__name__}, not an hsm tree description (a JSON object)")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{path}: {error}") from None

    # ------------------------------------------------------------------ display
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
        """A readable outline: each node down to ``max_depth`` with its label count and its ``k``
        most frequent labels (the papers' Figure 3 / 4 shows the four most frequent words)."""
        lines = [repr(self)]

        def visit(node: int, indent: str) -> None:
            labels = self.labels_under(node)
            lines.append(f"{indent}node {node}: {labels.size} labels: {', '.join(self.top_labels(node, counts, k))}")
            if self.node_depth[node] >= max_depth:
                return
            shown = 0
            for slot in range(self.arity):
                child = self.child_node[node, slot]
                if child >= 0 and self.slot_mask[node, slot]:
                    if shown == max_children:
                        lines.append(f"{indent}  ...")
                        break
                    visit(int(child), indent + "  ")
                    shown += 1

        visit(0, "")
        return "\n".join(lines)

    def draw(
        self,
        ax: Any = None,
        counts: Any | None = None,
        k: int = 4,
        max_depth: int = 2,
        max_children: int = 6,
        root: int = 0,
    ) -> Any:
        """Draw the top of the tree with matplotlib: each node shows its ``k`` most frequent
        labels; at most ``max_children`` children per node are drawn (the busiest ones)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(12, 1.8 * (max_depth + 1)))
        weights = None if counts is None else np.asarray(counts, dtype=np.float64)
        positions: dict[int, tuple[float, int]] = {}
        edges: list[tuple[int, int]] = []
        next_x = [0.0]

        def mass(node: int) -> float:
            labels = self.labels_under(node)
            return float(weights[labels].sum()) if weights is not None else float(labels.size)

        def layout(node: int, depth: int) -> float:
            kids = [int(c) for c, ok in zip(self.child_node[node], self.slot_mask[node]) if c >= 0 and ok]
            if depth >= max_depth or not kids:
                x = next_x[0]
                next_x[0] += 1.0
            else:
                kids = sorted(kids, key=mass, reverse=True)[:max_children]
                xs = [layout(child, depth + 1) for child in kids]
                edges.extend((node, child) for child in kids)
                x = float(np.mean(xs))
            positions[node] = (x, depth)
            return x

        layout(root, 0)
        for a, b in edges:
            (xa, ya), (xb, yb) = positions[a], positions[b]
            ax.plot([xa, xb], [-ya, -yb], color="0.7", lw=1, zorder=1)
        for node, (x, y) in positions.items():
            text = "\n".join(self.top_labels(node, counts, k))
            ax.text(x, -y, text, ha="center", va="center", fontsize=7, zorder=2,
                    bbox=dict(boxstyle="round", fc="white", ec="0.5"))
        ax.set_xlim(-0.7, max(next_x[0] - 0.3, 0.7))
        ax.set_ylim(-max_depth - 0.6, 0.6)
        ax.axis("off")
        return ax


def _min_depth(num_labels: int, arity: int) -> int:
    if arity < 2:
        raise ValueError(f"arity M must be >= 2, got {arity}")
    depth = 1
    while arity**depth < num_labels:
        depth += 1
    return depth


def _check_arity_depth(num_labels: int, arity: int, depth: int) -> None:
    """Raises TypeError when ``arity`` or ``depth`` is not an integer, ValueError when the labels
    cannot fit (the messages name the argument and its value)."""
    arity, depth = check_integer(arity, "arity"), check_integer(depth, "depth")
    if num_labels < 1:
        raise ValueError("cannot build a tree over zero labels")
    if arity < 2:
        raise ValueError(f"arity M must be >= 2, got {arity}")
    if depth < 1:
        raise ValueError(f"depth D must be >= 1, got {depth}")
    if arity**depth < num_labels:
        raise ValueError(f"M**D = {arity}**{depth} = {arity**depth} < K = {num_labels}: the labels do not fit")
