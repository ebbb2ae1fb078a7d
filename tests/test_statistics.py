"""hsm.statistics: SumProbas / Counts of Algorithm 1, kept per (label, depth)."""
import numpy as np
import pytest
import torch

from hsm.layers import HierarchicalSoftmax
from hsm.statistics import NodeStatistics, node_objectives
from hsm.objective import node_objective
from hsm.tree import Tree


def test_accumulate_matches_a_dense_reference():
    tree = Tree.random(12, 3, 3, seed=0)
    layer = HierarchicalSoftmax(4, tree)
    stats = NodeStatistics(tree, prior=1.0, prior_mode="uniform")
    layer.statistics = stats
    dense_sum = np.zeros((tree.num_nodes, tree.num_labels, 3))
    dense_count = np.zeros((tree.num_nodes, tree.num_labels))
    for _ in range(5):
        h, y = torch.randn(16, 4), torch.randint(0, 12, (16,))
        layer(h, y)
        weight = layer.weight.detach().view(tree.num_nodes, 3, 4)
        for b in range(16):
            for node, _child in tree.path(int(y[b])):
                probs = torch.softmax((weight[node] @ h[b] + layer.bias[node].detach()).masked_fill(
                    ~torch.as_tensor(tree.slot_mask[node]), -np.inf), 0)
                dense_sum[node, y[b]] += probs.numpy()
                dense_count[node, y[b]] += 1
    labels = np.arange(12)
    for depth in range(3):
        nodes = tree.path_nodes[:12, depth]
        got = stats.p_cond(depth, labels, nodes)
        want = (dense_sum[nodes, labels] + 1.0 / 3) / (dense_count[nodes, labels] + 1.0)[:, None]
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert stats.label_weights()[:12].sum() == pytest.approx(80 + 12)  # 80 examples + prior 1 each


def test_prior_for_unseen_labels_and_wrong_node():
    tree = Tree.random(9, 3, 2, seed=0)
    stats = NodeStatistics(tree, prior=2.0, prior_mode="uniform")
    p = stats.p_cond(0, np.arange(9), np.zeros(9, dtype=int))
    np.testing.assert_allclose(p, 1.0 / 3)
    stats.accumulate(torch.tensor([0]), torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]]]), torch.tensor([[True, True]]))
    node = tree.path_nodes[0, 1]
    np.testing.assert_allclose(stats.p_cond(1, np.array([0]), np.array([node])), [[(0 + 2 / 3) / 3, (1 + 2 / 3) / 3, (2 / 3) / 3]])
    # asked at another node: the sums were not collected there, so the prior comes back
    np.testing.assert_allclose(stats.p_cond(1, np.array([0]), np.array([node + 1])), [[1 / 3, 1 / 3, 1 / 3]])


def test_on_reassign_decays_and_drops_moved_labels():
    tree = Tree.random(9, 3, 2, seed=0)
    stats = NodeStatistics(tree, decay=0.5)
    stats.accumulate(torch.arange(9), torch.full((9, 2, 3), 1 / 3), torch.ones(9, 2, dtype=torch.bool))
    new_tree = Tree.random(9, 3, 2, seed=5)
    stats.on_reassign(new_tree)
    moved = tree.path_nodes[:, 1] != new_tree.path_nodes[:, 1]
    assert moved.any() and (~moved).any()
    assert torch.all(stats.path_counts[torch.as_tensor(moved), 1] == 0)
    assert torch.all(stats.path_counts[torch.as_tensor(~moved), 1] == 0.5)
    assert torch.all(stats.path_counts[:, 0] == 0.5)  # the root never moves
    assert torch.allclose(stats.label_counts, torch.full((9,), 0.5))


def test_node_objectives_agree_with_objective_module():
    tree = Tree.random(6, 2, 3, seed=0)
    stats = NodeStatistics(tree, prior=1e-9)
    rng = np.random.default_rng(0)
    probs = torch.as_tensor(rng.dirichlet(np.ones(2), size=(6, 3)), dtype=torch.float32)
    stats.accumulate(torch.arange(6), probs, torch.ones(6, 3, dtype=torch.bool))
    out = node_objectives(tree, stats)
    root = out["objective"][(out["node"] == 0)][0]
    q = np.full(6, 1 / 6)
    assert root == pytest.approx(node_objective(q, probs[:, 0].double().numpy()), rel=1e-5)


def test_bad_arguments():
    tree = Tree.random(9, 3, 2)
    with pytest.raises(ValueError, match="prior"):
        NodeStatistics(tree, prior=0)
    with pytest.raises(ValueError, match="decay"):
        NodeStatistics(tree, decay=1.5)


def test_current_child_prior_keeps_unseen_labels_in_place():
    """The released code's prior: an unseen label leans 0.5 towards the child it sits in, so the
    greedy keeps it there; with evidence the statistics take over."""
    from hsm.assign import assign_labels_depth_constrained

    tree = Tree.random(27, 3, 3, seed=0)
    sticky = NodeStatistics(tree, prior_mode="current_child")
    p = sticky.p_cond(1, np.arange(27), tree.path_nodes[:27, 1])
    expected = np.full((27, 3), 0.5 / 3)
    expected[np.arange(27), tree.path_children[:27, 1]] += 0.5
    np.testing.assert_allclose(p, expected)
    assert assign_labels_depth_constrained(tree, sticky).moved_labels == 0.0
    uniform = NodeStatistics(tree, prior_mode="uniform")
    assert assign_labels_depth_constrained(tree, uniform).moved_labels > 0.5
    # 20 examples of label 0 routed to child 2 at the root outweigh the prior
    sticky.accumulate(torch.zeros(20, dtype=torch.long), torch.tensor([[[0.0, 0.0, 1.0]] * 3] * 20),
                      torch.ones(20, 3, dtype=torch.bool))
    assert sticky.p_cond(0, np.array([0]), np.array([0]))[0].argmax() == 2
