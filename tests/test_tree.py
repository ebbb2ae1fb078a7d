"""hsm.Tree: constructors, paths (eq. 3), masks, persistence, errors."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.tree import Tree
from hsm.tree_draw import draw_tree_vertical


def _check_paths_consistent(tree: Tree) -> None:
    """Following path(label) from the root through child_node ends at the label's leaf slot."""
    for label in range(tree.num_leaves):
        steps = tree.path(label)
        assert steps[0][0] == 0
        for (node, child), (next_node, _) in zip(steps, steps[1:]):
            assert tree.child_node[node, child] == next_node
        node, child = steps[-1]
        assert tree.child_label[node, child] == label
        assert len(steps) == tree.depths[label]


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 60), m=st.integers(2, 6), extra=st.integers(0, 1), seed=st.integers(0, 10**6))
def test_random_fixed_depth_tree(k, m, extra, seed):
    depth = 1
    while m**depth < k:
        depth += 1
    tree = Tree.random(k, m, depth + extra, seed=seed)
    assert tree.depth_limit == depth + extra
    assert (tree.depths == depth + extra).all()
    _check_paths_consistent(tree)
    positions = tree.leaf_positions()
    assert np.unique(positions).size == k and positions.max() < m ** (depth + extra)
    # a slot is usable iff a real label lies below it
    for node in tree.bfs_order:
        for slot in range(m):
            child = tree.child_node[node, slot]
            below = tree.labels_under(child).size if child >= 0 else int(0 <= tree.child_label[node, slot] < k)
            assert tree.slot_mask[node, slot] == (below > 0)


def test_balanced_spreads_labels_evenly():
    tree = Tree.balanced(np.arange(10), arity=3, depth=3)
    sizes = [tree.labels_under(c).size for c in tree.child_node[0]]
    assert sorted(sizes) == [3, 3, 4]
    # consecutive labels share subtrees
    assert set(tree.labels_under(tree.child_node[0, 0])) == {0, 1, 2, 3}


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 1000), min_size=2, max_size=60), m=st.integers(2, 7))
def test_huffman_is_well_formed_and_optimal_order(counts, m):
    counts = np.array(counts, dtype=float)
    tree = Tree.huffman(counts, m)
    assert tree.is_well_formed()
    assert (tree.num_leaves - 1) % (m - 1) == 0
    assert tree.num_dummies == (-(len(counts) - 1)) % (m - 1)
    _check_paths_consistent(tree)
    # more frequent labels are never deeper than less frequent ones (Huffman's sibling property)
    order = np.argsort(-counts, kind="stable")
    depths = tree.depths[: len(counts)][order]
    sorted_counts = counts[order]
    for a in range(len(counts)):
        for b in range(a + 1, len(counts)):
            if sorted_counts[a] > sorted_counts[b]:
                assert depths[a] <= depths[b]


def test_huffman_binary_matches_known_code_lengths():
    # classic example: weights 45, 13, 12, 16, 9, 5 -> code lengths 1, 3, 3, 3, 4, 4
    tree = Tree.huffman([45, 13, 12, 16, 9, 5], arity=2)
    assert tree.depths.tolist() == [1, 3, 3, 3, 4, 4]
    assert tree.expected_depth([45, 13, 12, 16, 9, 5]) == pytest.approx(2.24)


def test_taxonomy_tree_masks_unused_slots():
    names = ["hockey", "baseball", "crypt", "med", "space", "forsale"]
    taxonomy = {"rec": ["hockey", "baseball"], "sci": ["crypt", "med", "space"], "misc": ["forsale"]}
    tree = Tree.from_taxonomy(taxonomy, names)
    assert tree.arity == 3 and tree.num_nodes == 4
    assert tree.path(names.index("space")) == [(0, 1), (2, 2)]
    assert tree.slot_mask.sum() == 3 + 6
    assert not tree.is_well_formed()
    with pytest.raises(ValueError, match="unknown label 'golf'"):
        Tree.from_taxonomy({"rec": ["golf"]}, names)
    with pytest.raises(ValueError, match="in no taxonomy category"):
        Tree.from_taxonomy({"rec": ["hockey"]}, names)


def test_from_clusters_groups_cluster_members():
    clusters = np.array([2, 0, 1, 0, 2, 1, 0])
    tree = Tree.from_clusters(clusters, arity=3, depth=2)
    for c in range(3):
        members = np.nonzero(clusters == c)[0]
        parents = {tree.path(int(i))[-1][0] for i in members}
        assert len(parents) == 1
    with pytest.raises(ValueError, match="more than the arity"):
        Tree.from_clusters(np.zeros(5, dtype=int), arity=3, depth=2)


def test_save_load_roundtrip(tmp_path):
    tree = Tree.huffman([5, 1, 1, 3, 2, 8], 3, label_names=list("abcdef"))
    path = tree.save(tmp_path / "tree.json")
    again = Tree.load(path)
    assert again == tree and again.label_names == list("abcdef")
    assert json.loads(path.read_text())["format"] == "hsm.Tree/1"
    with pytest.raises(ValueError, match="not an hsm tree"):
        Tree.from_dict({"format": "other"})


def test_summary_and_draw():
    import matplotlib

    matplotlib.use("Agg")
    tree = Tree.random(30, 3, 4, seed=0, label_names=[f"w{i}" for i in range(30)])
    counts = np.arange(30)[::-1]
    text = tree.summary(counts=counts, k=4)
    assert "node 0: 30 labels: w0, w1, w2, w3" in text
    ax = tree.draw(counts=counts, max_depth=2)
    assert len(ax.texts) > 3
    # two levels, one node per line: root, 3 children, 2 grandchildren each, 2 column headers
    ax = draw_tree_vertical(tree, counts=counts, children=3, grandchildren=2)
    assert len(ax.texts) == 1 + 3 + 3 * 2 + 2
    assert ax.texts[-3].get_text() == "w0\nw1\nw2\nw3"  # the root, its 4 most frequent labels
    with pytest.raises(ValueError, match="draw at least one"):
        draw_tree_vertical(tree, children=0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: Tree.random(100, 3, 2), "M\\*\\*D = 3\\*\\*2 = 9 < K = 100"),
        (lambda: Tree.random(10, 1, 3), "arity M must be >= 2"),
        (lambda: Tree.random(1, 3, 2), "K >= 2"),
        (lambda: Tree.complete([0, 0], 2, 2), "share a leaf"),
        (lambda: Tree.huffman([1.0, np.nan]), "finite"),
        (lambda: Tree(np.array([[1, -1], [-1, -1]]), np.array([[-1, 0], [1, 1]]), 2), "more than one leaf"),
        (lambda: Tree(np.array([[-1, -1]]), np.array([[0, -1]]), 2), "no leaf"),
        (lambda: Tree(np.array([[0, -1]]), np.array([[-1, 0]]), 1), "not describe a tree"),
    ],
)
def test_errors(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_unknown_label_path():
    with pytest.raises(ValueError, match="unknown label 7"):
        Tree.random(5, 2, 3).path(7)


def test_from_clusters_by_group_keeps_groups_under_their_root_child():
    # 6 clusters of 2 labels, in 3 groups of sizes 1, 3, 2 (M = 3, D = 3: room for 3 clusters per root child)
    cluster_of_label = np.repeat(np.arange(6), 2)
    groups = np.array([1, 0, 2, 1, 1, 2])
    tree = Tree.from_clusters(cluster_of_label, arity=3, depth=3, cluster_group=groups)
    root_child = tree.path_children[:12, 0]
    np.testing.assert_array_equal(root_child, np.repeat(groups, 2))
    with pytest.raises(ValueError, match="room for 3"):
        Tree.from_clusters(cluster_of_label, arity=3, depth=3, cluster_group=np.zeros(6, dtype=int))
