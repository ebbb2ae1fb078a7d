"""hsm.tree_builders: the module functions and the ``Tree`` classmethods that call them build the
same trees (the constructors' own properties are tested in tests/test_tree.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm import tree_builders as tb
from hsm.tree import Tree


@settings(max_examples=30, deadline=None)
@given(num_labels=st.integers(2, 60), arity=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_random_balanced_complete_agree(num_labels: int, arity: int, seed: int) -> None:
    tree = tb.random_tree(num_labels, arity, seed=seed)
    assert tree == Tree.random(num_labels, arity, seed=seed)
    order = np.random.default_rng(seed).permutation(num_labels)
    assert tb.balanced_tree(order, arity) == Tree.balanced(order, arity)
    positions = tree.leaf_positions()
    assert tb.complete_tree(positions, arity, tree.depth_limit) == Tree.complete(positions, arity, tree.depth_limit)
    assert tb.complete_tree(positions, arity, tree.depth_limit) == tree


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(0, 100), min_size=2, max_size=40), arity=st.integers(2, 5))
def test_huffman_agrees(counts: list[int], arity: int) -> None:
    tree = tb.huffman_tree(counts, arity)
    assert tree == Tree.huffman(counts, arity)
    assert tree.is_well_formed()


def test_nested_taxonomy_clusters_agree() -> None:
    nested = [[0, 1, 2], [3, [4, 5]], 6]
    assert tb.nested_tree(nested) == Tree.from_nested(nested)
    names = ["a", "b", "c", "d"]
    taxonomy = {"x": ["a", "c"], "y": ["b", "d"]}
    assert tb.taxonomy_tree(taxonomy, names) == Tree.from_taxonomy(taxonomy, names)
    clusters = [0, 1, 1, 2, 0, 2, 3]
    assert tb.cluster_tree(clusters, 2, 3) == Tree.from_clusters(clusters, 2, 3)
    assert (tb.cluster_tree(clusters, 2, 3, cluster_group=[1, 0, 1, 0])
            == Tree.from_clusters(clusters, 2, 3, cluster_group=[1, 0, 1, 0]))


def test_bad_sizes_still_name_the_argument() -> None:
    with pytest.raises(TypeError, match="depth"):
        tb.complete_tree([0, 1], 2, 2.0)
    with pytest.raises(ValueError, match="do not fit"):
        tb.random_tree(10, 2, 3)
