"""Constructors of label trees: every shape of :class:`hsm.tree.Tree` the papers start from.

Each function returns a :class:`~hsm.tree.Tree`; the classmethods of the same name on ``Tree``
(``Tree.random``, ``Tree.huffman``, ...) call them, so either spelling builds the same tree.

* :func:`complete_tree`, :func:`balanced_tree`, :func:`random_tree`: fixed-depth trees (the
  complete M-ary tree of depth ``D`` with ``M**D >= K``, the depth constraint of Algorithm 3 in
  the ICML supplement), the random tree being the papers' baseline (ICML §6 and §7.2);
* :func:`huffman_tree`: the M-ary Huffman tree over label frequencies (ICML §7.1);
* :func:`nested_tree`, :func:`taxonomy_tree`: any tree, e.g. the two-level natural taxonomies of
  Schuurmans & Frasincar;
* :func:`cluster_tree`: the clustering-tree baseline (ICML §7.2, thesis §3.5).
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .tree import EMPTY_SLOT, Tree, as_int_array, check_integer

__all__ = ["balanced_tree", "cluster_tree", "complete_tree", "huffman_tree", "nested_tree", "random_tree",
           "taxonomy_tree"]


def complete_tree(
    leaf_position: Any,
    arity: int,
    depth: int,
    label_names: Sequence[str] | None = None,
) -> Tree:
    """Fixed-depth tree: label ``i`` sits at leaf position ``leaf_position[i]`` of the complete
    M-ary tree of depth ``D`` (heap numbering). Requires ``M**D >= K`` (the depth constraint of
    Algorithm 3, ICML supplement); unused leaves are empty slots. ``Tree.complete``."""
    positions = as_int_array(leaf_position, "leaf_position")
    num_labels = positions.size
    _check_arity_depth(num_labels, arity, depth)
    arity, depth = int(arity), int(depth)  # Python ints: M**D must not wrap around
    capacity = arity**depth
    if positions.ndim != 1 or (positions < 0).any() or (positions >= capacity).any():
        raise ValueError(f"leaf positions must lie in [0, M**D) = [0, {capacity})")
    if np.unique(positions).size != num_labels:
        raise ValueError("two labels share a leaf position")
    num_nodes = (capacity - 1) // (arity - 1)  # internal nodes of the complete tree
    _check_complete_size(num_nodes, arity, depth, num_labels)
    first_bottom = (arity ** (depth - 1) - 1) // (arity - 1)  # first node of the last internal level
    child_node = np.arange(num_nodes)[:, None] * arity + np.arange(arity)[None, :] + 1
    child_node[first_bottom:] = EMPTY_SLOT
    child_label = np.full((num_nodes, arity), EMPTY_SLOT, dtype=np.int64)
    bottom = first_bottom + positions // arity
    child_label[bottom, positions % arity] = np.arange(num_labels)
    return Tree(child_node, child_label, num_labels, depth_limit=depth, label_names=label_names)


def balanced_tree(
    order: Any,
    arity: int,
    depth: int | None = None,
    label_names: Sequence[str] | None = None,
) -> Tree:
    """Fixed-depth tree filled from an ordering of the labels: consecutive labels share
    subtrees, and at every node the labels are split as evenly as possible over the M
    children (so unused leaves are spread out, not piled at the end).

    ``depth`` defaults to the smallest D with ``M**D >= K`` (Algorithm 3's depth constraint).
    ``Tree.balanced``."""
    order = as_int_array(order, "order")
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
    return complete_tree(leaf_position, arity, depth, label_names=label_names)


def random_tree(
    num_labels: int,
    arity: int,
    depth: int | None = None,
    seed: int | np.random.Generator | None = 0,
    label_names: Sequence[str] | None = None,
) -> Tree:
    """A random fixed-depth tree: a uniformly random ordering filled by :func:`balanced_tree`
    (the papers' "random tree" baseline, ICML §6 and §7.2; the starting tree of Algorithm 3).
    ``Tree.random``."""
    num_labels = check_integer(num_labels, "num_labels")
    if num_labels < 2:
        raise ValueError(f"a label tree needs K >= 2 labels, got {num_labels}")
    arity = check_integer(arity, "arity")
    depth = None if depth is None else check_integer(depth, "depth")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return balanced_tree(rng.permutation(num_labels), arity, depth, label_names=label_names)


def huffman_tree(
    counts: Any,
    arity: int = 2,
    label_names: Sequence[str] | None = None,
) -> Tree:
    """M-ary Huffman tree over label frequencies (ICML §7.1; arity 2 = fastText's ``-loss hs``
    tree). ``Tree.huffman``.

    Zero-count dummy leaves are added so the leaf count is ``1 mod (M-1)`` (M-ary Huffman coding):
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
    child_node = np.full((len(merged_children), arity), EMPTY_SLOT, dtype=np.int64)
    child_label = np.full((len(merged_children), arity), EMPTY_SLOT, dtype=np.int64)
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
    return Tree(child_node, child_label, num_labels, label_names=label_names)


def nested_tree(
    nested: Sequence[Any],
    num_labels: int | None = None,
    arity: int | None = None,
    label_names: Sequence[str] | None = None,
) -> Tree:
    """General tree from nested lists: ``[[0, 1, 2], [3, [4, 5]]]`` is a root with two
    children, the second of which has a leaf (3) and a subtree over 4 and 5. Integers are
    labels. ``arity`` defaults to the largest number of children; nodes with fewer children
    get empty (masked) slots. ``Tree.from_nested``."""
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
        nodes_row, labels_row = [EMPTY_SLOT] * arity, [EMPTY_SLOT] * arity
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
    return Tree(np.array(child_node), np.array(child_label), num_labels, label_names=label_names)


def taxonomy_tree(
    taxonomy: Mapping[str, Sequence[str]],
    label_names: Sequence[str],
    arity: int | None = None,
) -> Tree:
    """Two-level tree root -> categories -> classes from a natural taxonomy
    (``{category: [class names]}``, as in Schuurmans & Frasincar). Every label must appear in
    exactly one category. A category with a single class stays an internal node with one
    usable slot (its softmax is then always 1), so every path has the same two steps as in the
    paper's two-level model; ``arity`` defaults to the widest level. ``Tree.from_taxonomy``."""
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
    return nested_tree(nested, num_labels=len(label_names), arity=arity, label_names=label_names)


def cluster_tree(
    cluster_of_label: Any,
    arity: int,
    depth: int,
    cluster_order: Any | None = None,
    label_names: Sequence[str] | None = None,
    cluster_group: Any | None = None,
) -> Tree:
    """Fixed-depth tree from a flat clustering (the clustering-tree baseline of ICML §7.2 and
    thesis §3.5; ``Tree.from_clusters``):
    cluster ``c`` fills the ``c``-th node of the last internal level, so each cluster must
    hold at most M labels and there can be at most ``M**(D-1)`` clusters. ``cluster_order``
    permutes the clusters first (consecutive clusters share ancestors: pass an ordering
    from a coarser clustering of the centroids to group similar clusters).

    ``cluster_group`` (one group id < M per cluster, e.g. a k-means of the centroids into M
    groups) instead puts group ``g``'s clusters under root child ``g``, filling that
    subtree's bottom nodes in cluster order; a group may hold at most ``M**(D-2)`` clusters.
    Unlike ``cluster_order``, a small group does not shift the groups after it."""
    clusters = as_int_array(cluster_of_label, "cluster_of_label")
    num_labels = clusters.size
    _check_arity_depth(num_labels, arity, depth)
    arity, depth = int(arity), int(depth)
    num_clusters = int(clusters.max()) + 1
    if num_clusters > arity ** (depth - 1):
        raise ValueError(f"{num_clusters} clusters do not fit the {arity ** (depth - 1)} bottom nodes")
    if cluster_group is not None:
        if cluster_order is not None:
            raise ValueError("pass cluster_order or cluster_group, not both")
        groups = as_int_array(cluster_group, "cluster_group")
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
        cluster_order = as_int_array(cluster_order, "cluster_order")
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
    return complete_tree(positions, arity, depth, label_names=label_names)


#: the most slots (nodes x M) a complete tree may have per label before it is refused: the complete
#: M-ary tree of depth D has about M**D slots whatever K is (M = 1000, D = 3: 10**9 slots, 16 GB)
MAX_SLOTS_PER_LABEL = 1024


def _check_complete_size(num_nodes: int, arity: int, depth: int, num_labels: int) -> None:
    """ValueError, before anything is allocated, when the complete M-ary tree of depth D would
    have far more slots than there are labels (an arity meant for another vocabulary)."""
    slots = num_nodes * arity
    if slots > MAX_SLOTS_PER_LABEL * num_labels + 2**20:
        raise ValueError(f"a complete {arity}-ary tree of depth {depth} has {slots:.3g} slots "
                         f"({16 * slots / 2**30:.3g} GiB) for K = {num_labels} labels: use a smaller arity M "
                         f"(M**D just above K) or depth D")


def _min_depth(num_labels: int, arity: int) -> int:
    """The smallest depth D with ``M**D >= K``."""
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
