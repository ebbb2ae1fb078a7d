"""draw_label_tree: the full drawing of a small tree (ICML Figure 1, thesis Figures 3.3 and 3.6)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import hsm  # noqa: E402
from hsm.tree_draw import MAX_DRAWN_LEAVES, draw_label_tree  # noqa: E402


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_every_node_and_leaf_is_drawn_with_its_name():
    tree = hsm.Tree.from_nested([[0, 1, 2], [3, 4, 5], [6, 7, 8]], label_names=list("abcdefghi"))
    ax = draw_label_tree(tree, child_numbers=True)
    texts = _texts(ax)
    assert {"n1", "n2", "n3", "n4"} <= set(texts)
    assert set("abcdefghi") <= set(texts)
    assert texts.count("3") == 4  # every node's third child is numbered
    plt.close("all")


def test_highlighted_path_and_edge_text():
    words = ["lost", "time", "pie", "was", "the"]
    tree = hsm.Tree.from_nested([[[0, 1], [2, 3]], 4], label_names=words)
    fig, ax = plt.subplots()
    draw_label_tree(tree, ax, highlight=2, edge_text={(0, 0): "0.55"}, marked_nodes=[3],
                    node_names={3: "new"})
    assert "0.55" in _texts(ax) and "new" in _texts(ax)
    red = [line for line in ax.lines if line.get_color() == "tab:red"]
    assert len(red) == len(tree.path(2)) == 3  # the path to "pie" has three edges
    plt.close(fig)


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="highlight"):
        draw_label_tree(hsm.Tree.from_nested([[0, 1], 2]), highlight=7)
    big = hsm.Tree.random(MAX_DRAWN_LEAVES + 1, 2, seed=0)
    with pytest.raises(ValueError, match="draw_tree"):
        draw_label_tree(big)
    plt.close("all")
