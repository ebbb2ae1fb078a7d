"""hsm.clustering: the clustering tree of ICML §7.2 (k-means into M**2 clusters, greedy fill)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.clustering import clustering_tree, greedy_fill


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 8), seed=st.integers(0, 1000))
def test_greedy_fill_respects_capacity(rows, cols, seed) -> None:
    capacity = math.ceil(rows / cols)
    dist = np.random.default_rng(seed).random((rows, cols))
    assignment = greedy_fill(dist, capacity)
    assert assignment.shape == (rows,)
    assert np.bincount(assignment, minlength=cols).max() <= capacity
    # with room for everyone, each row gets its nearest column
    assert (greedy_fill(dist, rows) == dist.argmin(1)).all()


def test_greedy_fill_rejects_too_little_room() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        greedy_fill(np.zeros((10, 3)), 3)


def test_clustering_tree_groups_nearby_words() -> None:
    """Four well-separated blobs of 4 words each, M = 4 (16 centroids, one word each): the second
    k-means groups each blob's clusters under one child of the root."""
    rng = np.random.default_rng(0)
    centres = np.eye(4) * 10
    points = np.repeat(centres, 4, axis=0) + rng.normal(0, 0.01, (16, 4))
    tree = clustering_tree(points, arity=4, depth=3, seed=0)
    assert tree.num_labels == 16 and tree.arity == 4
    root_child = [tree.path(i)[0][1] for i in range(16)]
    for blob in range(4):
        assert len(set(root_child[4 * blob:4 * blob + 4])) == 1
    assert len(set(root_child)) == 4
    with pytest.raises(ValueError, match="depth 3"):
        clustering_tree(points, arity=4, depth=2)


def test_random_groups_keep_the_clusters_and_scatter_them_under_the_root() -> None:
    """The same four blobs: with ``groups="random"`` every bottom cluster keeps its words, but a
    blob's clusters no longer share one child of the root."""
    rng = np.random.default_rng(0)
    points = np.repeat(np.eye(4) * 10, 4, axis=0) + rng.normal(0, 0.01, (16, 4))
    by_kmeans = clustering_tree(points, arity=4, depth=3, seed=0)
    at_random = clustering_tree(points, arity=4, depth=3, seed=0, groups="random")

    def clusters(tree):
        bottom = [tree.path(i)[-1][0] for i in range(16)]  # the node above each word
        return sorted(sorted(i for i in range(16) if bottom[i] == node) for node in set(bottom))

    assert clusters(at_random) == clusters(by_kmeans)
    root_child = [at_random.path(i)[0][1] for i in range(16)]
    assert any(len(set(root_child[4 * blob:4 * blob + 4])) > 1 for blob in range(4))
    bottom = [at_random.path(i)[-1][0] for i in range(16)]
    assert all(len({b for b, c in zip(bottom, root_child) if c == child}) <= 4 for child in set(root_child))
    with pytest.raises(ValueError, match="groups must be one of"):
        clustering_tree(points, arity=4, groups="nearest")
