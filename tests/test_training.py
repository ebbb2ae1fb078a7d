"""Algorithm 1 (TreeLearner) and the training loops."""
import numpy as np
import pytest
import torch

from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.synthetic import grouping_agreement, planted_hierarchy
from hsm.training import TreeLearner, evaluate, train_epoch
from hsm.tree import Tree


def _run(data, learn, seed, epochs=2, tree=None, algorithm="auto"):
    torch.manual_seed(seed)
    tree = tree or Tree.random(16, 4, 2, seed=seed)
    model = torch.nn.Linear(16, 16)
    layer = HierarchicalSoftmax(16, tree)
    opt = torch.optim.Adagrad(list(model.parameters()) + list(layer.parameters()), lr=0.1)
    learner = TreeLearner(layer, reassign_every=25, algorithm=algorithm) if learn else None
    for epoch in range(epochs):
        perm = torch.randperm(6000, generator=torch.Generator().manual_seed(epoch))
        batches = [(data.x[perm[i:i + 100]], data.y[perm[i:i + 100]]) for i in range(0, 6000, 100)]
        train_epoch(model, layer, batches, opt, learner)
    metrics = evaluate(model, layer, [(data.x[6000:], data.y[6000:])])
    return grouping_agreement(layer.tree, data.group_of_label), metrics, learner


def test_algorithm1_recovers_a_planted_hierarchy():
    """Labels come in 4 planted groups (within a group, labels are hard to tell apart: noise 1.5 vs
    offsets 0.7; groups are easy); the learned 4-ary depth-2 tree puts groups under root
    children (adjusted Rand index) far better than random trees, J_n at the root rises, and the
    learned tree has the lower held-out perplexity."""
    data = planted_hierarchy(num_groups=4, labels_per_group=4, dim=16, num_examples=8000, noise=1.5, label_scale=0.7, seed=0)
    learned = [_run(data, True, s) for s in range(3)]
    random = [_run(data, False, s) for s in range(3)]
    ari_learned = np.mean([r[0] for r in learned])
    ari_random = np.mean([r[0] for r in random])
    assert ari_learned >= 0.5 and ari_learned - ari_random >= 0.4, (ari_learned, ari_random)
    ppl_learned = np.mean([r[1]["perplexity"] for r in learned])
    ppl_random = np.mean([r[1]["perplexity"] for r in random])
    assert ppl_learned < ppl_random - 0.3, (ppl_learned, ppl_random)
    history = learned[0][2].history
    assert history[-1].objective_by_depth[0] > history[0].objective_by_depth[0] + 0.05
    assert history[-1].moved_labels <= history[0].moved_labels  # the tree settles


def test_algorithm2_learner_keeps_the_tree_well_formed():
    data = planted_hierarchy(num_groups=4, labels_per_group=4, dim=16, num_examples=8000, seed=1)
    start = Tree.huffman(np.bincount(data.y.numpy(), minlength=16), 4)
    ari, metrics, learner = _run(data, True, 0, epochs=1, tree=start)
    assert learner.algorithm == "well_formed" and len(learner.history) == 2 * 60 // 25 // 2
    assert learner.layer.tree.is_well_formed() and learner.layer.tree.num_nodes == start.num_nodes
    assert np.isfinite(metrics["perplexity"])


def test_freeze_stops_reassignment():
    layer = HierarchicalSoftmax(4, Tree.random(9, 3, 2))
    learner = TreeLearner(layer, reassign_every=1)
    learner.freeze()
    assert learner.step() is None and layer.statistics is None
    learner.unfreeze()
    assert learner.step() is not None


def test_nan_loss_is_reported_with_its_step():
    layer = FlatSoftmax(4, 5)
    model = torch.nn.Identity()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    batches = [(torch.randn(3, 4), torch.tensor([0, 1, 2])), (torch.full((3, 4), float("nan")), torch.tensor([0, 1, 2]))]
    with pytest.raises(FloatingPointError, match="at step 1"):
        train_epoch(model, layer, batches, opt)


def test_empty_data_is_an_error():
    with pytest.raises(ValueError, match="no batches"):
        train_epoch(torch.nn.Identity(), FlatSoftmax(4, 5), [], torch.optim.SGD(FlatSoftmax(4, 5).parameters(), lr=0.1))


def test_learner_argument_errors():
    with pytest.raises(ValueError, match="fixed-depth"):
        TreeLearner(HierarchicalSoftmax(4, Tree.huffman([1, 2, 3, 4], 2)), 10, algorithm="depth")
    with pytest.raises(ValueError, match="reassign_every"):
        TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), 0)
    with pytest.raises(TypeError):
        TreeLearner(FlatSoftmax(4, 9), 10)


def test_learner_checkpoint_roundtrip(tmp_path):
    data = planted_hierarchy(num_groups=3, labels_per_group=3, dim=8, num_examples=600, seed=2)
    layer = HierarchicalSoftmax(8, Tree.random(9, 3, 2, seed=0))
    learner = TreeLearner(layer, reassign_every=3)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    batches = [(data.x[i:i + 50], data.y[i:i + 50]) for i in range(0, 600, 50)]
    train_epoch(torch.nn.Identity(), layer, batches, opt, learner)
    torch.save({"layer": layer.state_dict(), "learner": learner.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    other = HierarchicalSoftmax(8, Tree.random(9, 3, 2, seed=5))
    restored = TreeLearner(other, reassign_every=3)
    other.load_state_dict(state["layer"])
    restored.load_state_dict(state["learner"])
    assert other.tree == layer.tree and restored.steps == learner.steps == 12
    assert len(restored.history) == len(learner.history) == 4
    torch.testing.assert_close(restored.statistics.sum_probas, learner.statistics.sum_probas)
    h = data.x[:20]
    torch.testing.assert_close(other.log_prob(h), layer.log_prob(h))


def test_record_objective_every_n():
    layer = HierarchicalSoftmax(4, Tree.random(9, 3, 2))
    learner = TreeLearner(layer, reassign_every=1, record_objective=2)
    for _ in range(4):
        layer(torch.randn(8, 4), torch.randint(0, 9, (8,)))
        learner.step()
    assert [bool(r.objective_by_depth) for r in learner.history] == [True, False, True, False]
    silent = TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), reassign_every=1, record_objective=False)
    silent.step()
    assert silent.history[0].objective_by_depth == {}


def test_tree_learner_names_its_ranking_score_by_equation():
    layer = HierarchicalSoftmax(4, Tree.random(9, 3, 2))
    assert TreeLearner(layer, 10).score == "eq12"  # the LM variant, the default
    assert TreeLearner(layer, 10, score="eq10").score == "eq10"
    with pytest.warns(DeprecationWarning, match="score='eq10'"):
        assert TreeLearner(layer, 10, wrt="p").score == "eq10"
    with pytest.raises(ValueError, match="score must be"):
        TreeLearner(layer, 10, score="eq11")
