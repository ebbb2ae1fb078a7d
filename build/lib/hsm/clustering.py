"""The clustering tree of ICML §7.2: a :class:`hsm.tree.Tree` built from word embeddings.

Words go to ``M**2`` clusters of at most M words (MiniBatchKMeans, then each word to the nearest
cluster that still has room: "greedily assign words to clusters until full"); the clusters go to
M groups of M under the root (a second k-means over the centroids with the same greedy fill: our
choice, the paper does not say how the clusters are grouped). The language-model experiments
(the book's language-model experiments) build it from fastText or log-bilinear embeddings.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._optional import require
from .tree import Tree

__all__ = ["clustering_tree", "greedy_fill"]


def greedy_fill(distances: np.ndarray, capacity: int, order: np.ndarray | None = None) -> np.ndarray:
    """Give every row (word) the nearest column (centroid) that still has room (ICML §7.2:
    "greedily assign words to clusters until full").

    Rows are served in ``order`` (default: by increasing distance to their nearest centroid, so
    the words that are surest of their cluster go first). Needs ``capacity * n_cols >= n_rows``.
    """
    n_rows, n_cols = distances.shape
    if capacity * n_cols < n_rows:
        raise ValueError(f"{n_cols} clusters of {capacity} cannot hold {n_rows} items")
    if order is None:
        order = np.argsort(distances.min(axis=1), kind="stable")
    load = np.zeros(n_cols, dtype=np.int64)
    assignment = np.empty(n_rows, dtype=np.int64)
    full_penalty = np.zeros(n_cols)
    for row in order:
        col = int(np.argmin(distances[row] + full_penalty))
        assignment[row] = col
        load[col] += 1
        if load[col] == capacity:
            full_penalty[col] = np.inf
    return assignment


def kmeans_fill(points: np.ndarray, n_clusters: int, capacity: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    MiniBatchKMeans = require("sklearn.cluster", "k-means label clustering").MiniBatchKMeans

    n_clusters = min(n_clusters, len(points))
    km = MiniBatchKMeans(n_clusters=n_clusters, random_state=seed, batch_size=4096, n_init=3)
    km.fit(points)
    centres = km.cluster_centers_
    # squared distances, chunked (250k words x 4225 centroids would be 8 GB at once)
    dist = np.empty((len(points), n_clusters), dtype=np.float32)
    c_norm = (centres**2).sum(1)
    for start in range(0, len(points), 8192):
        chunk = points[start:start + 8192]
        dist[start:start + 8192] = (chunk**2).sum(1)[:, None] - 2 * chunk @ centres.T + c_norm[None, :]
    return greedy_fill(dist, capacity), centres


#: how the clustering tree groups its clusters under the root: a second k-means over the centroids
#: (ours) or at random (the top decisions then follow no similarity)
CLUSTER_GROUPINGS = ("kmeans", "random")


def clustering_tree(embeddings: np.ndarray, arity: int, depth: int = 3, seed: int = 0,
                    label_names: Sequence[str] | None = None, groups: str = "kmeans") -> Tree:
    """The clustering tree of ICML §7.2 (depth 3): words -> ``M**2`` clusters of at most M words
    (MiniBatchKMeans + greedy fill); clusters -> M groups of M clusters under the root (the paper is
    silent on this level): ``groups="kmeans"``, a second k-means over the centroids with the same
    greedy fill (ours); ``groups="random"``, clusters dealt to the groups at random (seeded)."""
    if depth != 3:
        raise ValueError("the clustering tree is built for depth 3 (root -> groups -> clusters -> words)")
    if groups not in CLUSTER_GROUPINGS:
        raise ValueError(f"groups must be one of {CLUSTER_GROUPINGS}, got {groups!r}")
    points = np.asarray(embeddings, dtype=np.float64)
    if points.ndim != 2 or len(points) < 2:
        raise ValueError(f"embeddings must be a [K, d] array with K >= 2, got shape {points.shape}")
    cluster_of_word, centres = kmeans_fill(points, arity**2, arity, seed)
    # renumber clusters 0..C-1 (some may be empty after the fill)
    used, cluster_of_word = np.unique(cluster_of_word, return_inverse=True)
    centres = centres[used]
    if groups == "kmeans":
        group_of_cluster, _ = kmeans_fill(centres, arity, arity, seed + 1)
    else:
        group_of_cluster = np.empty(len(centres), dtype=np.int64)
        group_of_cluster[np.random.default_rng(seed + 1).permutation(len(centres))] = (
            np.arange(len(centres)) // arity)
    # cluster c, the r-th of group g, fills bottom node g*M + r: group g is the g-th child of the
    # root even when groups have fewer than M clusters (fewer than M**2 clusters in use)
    order = np.argsort(group_of_cluster, kind="stable")
    sizes = np.bincount(group_of_cluster, minlength=arity)
    rank_in_group = np.empty(len(centres), dtype=np.int64)
    rank_in_group[order] = np.arange(len(centres)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    bottom_node = group_of_cluster * arity + rank_in_group
    return Tree.from_clusters(bottom_node[cluster_of_word], arity, depth, label_names=label_names)
