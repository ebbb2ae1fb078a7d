"""Algorithm 1 (TreeLearner) and the training loops."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.statistics import NodeStatistics
from hsm_lab.synthetic import grouping_agreement, planted_hierarchy
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


def _feed(layer, steps, learner, seed=0):
    """``steps`` forward passes in training mode (the statistics' input), each counted by the learner."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        h = torch.randn(8, layer.in_features, generator=generator)
        layer(h, torch.randint(0, layer.num_labels, (8,), generator=generator))
        learner.step()


def test_tree_learner_never_decays_the_statistics_by_default():
    # the book's advice (decay=1); NodeStatistics built directly keeps its own default of 0.5
    layer = HierarchicalSoftmax(4, Tree.random(9, 3, 2))
    learner = TreeLearner(layer, reassign_every=2)
    assert learner.statistics.decay == 1.0
    _feed(layer, 4, learner)
    assert len(learner.history) == 2
    assert float(learner.statistics.label_counts.sum()) == pytest.approx(4 * 8)  # every example still counted
    halved = TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), reassign_every=2, decay=0.5)
    _feed(halved.layer, 4, halved)
    assert float(halved.statistics.label_counts.sum()) == pytest.approx((2 * 8 * 0.5 + 2 * 8) * 0.5)
    assert NodeStatistics(Tree.random(9, 3, 2)).decay == 0.5


@settings(max_examples=25, deadline=None)
@given(reassign_every=st.integers(1, 5), freeze_after=st.integers(1, 12), extra=st.integers(0, 6))
def test_freeze_after_learns_for_that_many_steps_then_freezes(reassign_every, freeze_after, extra):
    layer = HierarchicalSoftmax(4, Tree.random(9, 3, 2))
    learner = TreeLearner(layer, reassign_every=reassign_every, freeze_after=freeze_after)
    _feed(layer, freeze_after - 1, learner)
    assert not learner.frozen and layer.statistics is learner.statistics
    _feed(layer, 1 + extra, learner, seed=1)
    # the rebuild due at the freezing step still runs; none after it
    assert learner.frozen and layer.statistics is None
    assert [r.step for r in learner.history] == list(range(reassign_every, freeze_after + 1, reassign_every))
    assert learner.state_dict()["frozen"] is True


def test_freeze_after_freezes_once_and_respects_a_later_unfreeze():
    layer = HierarchicalSoftmax(4, Tree.random(9, 3, 2))
    learner = TreeLearner(layer, reassign_every=1, freeze_after=2)
    _feed(layer, 2, learner)
    assert learner.frozen
    learner.unfreeze()
    _feed(layer, 3, learner)
    assert not learner.frozen and len(learner.history) == 5
    never = TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), reassign_every=1)
    assert never.freeze_after is None
    _feed(never.layer, 5, never)
    assert not never.frozen


@pytest.mark.parametrize("value, error, match", [(0, ValueError, "freeze_after must be None or >= 1, got 0"),
                                                 (-3, ValueError, "freeze_after must be None or >= 1"),
                                                 (2.5, TypeError, "freeze_after"),
                                                 ("10", TypeError, "freeze_after")])
def test_freeze_after_must_be_a_positive_integer(value, error, match):
    with pytest.raises(error, match=match):
        TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), 3, freeze_after=value)


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
    with pytest.raises(ValueError, match="score must be"):
        TreeLearner(layer, 10, score="eq11")


# ---------------------------------------------------------------------------------------------
# padded sequences: the loops count the targets that are not ignore_index, whatever the layout
# of the batches and the layer's reduction

K, T = 42, 6
LENGTHS = [6, 3, 1, 4]  # 14 real tokens in 24 positions


def _padded(lengths=LENGTHS, seed=0):
    """``x`` [B, T, K] one-hot of the true next token (of label 0 at padding), ``y`` [B, T] with
    -100 past each sequence's length."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, K, (len(lengths), T), generator=gen)
    for b, length in enumerate(lengths):
        y[b, length:] = -100
    x = torch.nn.functional.one_hot(y.clamp(min=0), K).float()
    return x, y


def _layouts(x, y):
    """The same tokens as batches of sequences [B, T], of flattened rows [B*T] and of one
    sequence each [T] (batches of different sizes)."""
    return {"sequences": [(x[:2], y[:2]), (x[2:], y[2:])],
            "flattened": [(x[:2].reshape(-1, K), y[:2].reshape(-1)), (x[2:].reshape(-1, K), y[2:].reshape(-1))],
            "rows": [(x[b], y[b]) for b in range(len(y))]}


def _flat(scale: float, reduction: str = "mean") -> FlatSoftmax:
    """A flat softmax whose logits are ``scale`` times the one-hot input: 0 is uniform
    (NLL = log K, perplexity K), a large scale predicts the token perfectly."""
    layer = FlatSoftmax(K, K, reduction=reduction)
    with torch.no_grad():
        layer.linear.weight.copy_(scale * torch.eye(K))
        layer.linear.bias.zero_()
    return layer


@pytest.mark.parametrize("layout", ["sequences", "flattened", "rows"])
def test_evaluate_counts_only_the_targets_that_are_not_padding(layout):
    """Uniform over 42 labels: NLL log 42 = 3.74 and perplexity 42 (not 22.5 and 5.8e9, the sums
    over B); perfect predictions: accuracy 1.0 (the padding is neither evaluated nor wrong)."""
    x, y = _padded()
    batches = _layouts(x, y)[layout]
    uniform = evaluate(torch.nn.Identity(), _flat(0.0), batches)
    assert uniform["nll"] == pytest.approx(math.log(K), rel=1e-5)
    assert uniform["perplexity"] == pytest.approx(K, rel=1e-4)
    perfect = evaluate(torch.nn.Identity(), _flat(30.0), batches)
    assert perfect["accuracy"] == 1.0 and perfect["nll"] < 1e-6


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(0, T), min_size=1, max_size=5).filter(any), seed=st.integers(0, 2**16),
       layout=st.sampled_from(["sequences", "flattened", "rows"]))
def test_evaluate_equals_the_metrics_of_the_real_tokens_alone(lengths, seed, layout):
    """Any padding, any layout, the tree softmax: the metrics of the real tokens evaluated alone."""
    x, y = _padded(lengths, seed)
    torch.manual_seed(seed)
    model = torch.nn.Linear(K, 8)
    layer = HierarchicalSoftmax(8, Tree.random(K, 4, 3, seed=seed))
    got = evaluate(model, layer, _layouts(x, y)[layout])
    real = y != -100
    want = evaluate(model, layer, [(x[real], y[real])])
    assert got["nll"] == pytest.approx(want["nll"], rel=1e-5)
    assert got["accuracy"] == pytest.approx(want["accuracy"])


@pytest.mark.parametrize("layer_kind", ["flat", "tree"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("layout", ["sequences", "flattened", "rows"])
def test_train_epoch_reports_the_mean_per_real_token_whatever_the_reduction(layer_kind, reduction, layout):
    """With a zero learning rate nothing changes during the epoch, so its reported loss is the
    held-out NLL of the same batches: the mean over real tokens, for reduction="sum" too (not the
    sum, 157.2 for 3.93) and with batches weighted by their real tokens (not by B)."""
    x, y = _padded()
    torch.manual_seed(0)
    if layer_kind == "flat":
        layer = FlatSoftmax(K, K, reduction=reduction)
    else:
        layer = HierarchicalSoftmax(K, Tree.random(K, 4, 3, seed=0), reduction=reduction)
    batches = _layouts(x, y)[layout]
    steps = []
    loss = train_epoch(torch.nn.Identity(), layer, batches, torch.optim.SGD(layer.parameters(), lr=0.0),
                       on_step=lambda step, value: steps.append(value))
    want = evaluate(torch.nn.Identity(), layer, batches, accuracy=False)["nll"]
    assert loss == pytest.approx(want, rel=1e-5)
    kept = [int((b != -100).sum()) for _, b in batches]
    assert sum(v * n for v, n in zip(steps, kept)) / sum(kept) == pytest.approx(want, rel=1e-5)
    if layer_kind == "flat":
        zero = _flat(0.0, reduction)
        uniform = train_epoch(torch.nn.Identity(), zero, batches, torch.optim.SGD(zero.parameters(), lr=0.0))
        assert uniform == pytest.approx(math.log(K), rel=1e-5)


def test_all_padding_batches_are_skipped_and_all_padding_data_is_an_error():
    x, y = _padded()
    padding = (x[:1], torch.full((1, T), -100))
    layer = _flat(0.0)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    assert train_epoch(torch.nn.Identity(), layer, [padding, (x, y)], opt) == pytest.approx(math.log(K), rel=1e-5)
    assert evaluate(torch.nn.Identity(), _flat(30.0), [padding, (x, y)])["accuracy"] == 1.0
    with pytest.raises(ValueError, match="ignore_index .-100.; mark only the padding"):
        train_epoch(torch.nn.Identity(), layer, [padding], opt)
    with pytest.raises(ValueError, match="no targets to evaluate"):
        evaluate(torch.nn.Identity(), layer, [padding])


@settings(max_examples=60, deadline=None)
@given(planned=st.integers(1, 100_000), share=st.floats(0.01, 1.0), rebuilds=st.integers(1, 200))
def test_for_planned_steps_rebuilds_within_the_learning_share_then_freezes(planned, share, rebuilds):
    layer = HierarchicalSoftmax(4, Tree.random(30, 4, 3, seed=0))
    learner = TreeLearner.for_planned_steps(layer, planned, learn_share=share, rebuilds=rebuilds)
    learning = max(1, round(share * planned))
    assert 1 <= learner.freeze_after <= learning
    assert learner.freeze_after % learner.reassign_every == 0
    count = learner.freeze_after // learner.reassign_every  # rebuilds before the tree freezes
    assert count == learning if learning < rebuilds else rebuilds <= count < 2 * rebuilds


@pytest.mark.parametrize("kwargs, error", [({"planned_steps": 0}, ValueError), ({"learn_share": 0.0}, ValueError),
                                           ({"learn_share": 1.5}, ValueError), ({"rebuilds": 2.5}, TypeError),
                                           ({"learn_share": "half"}, TypeError)])
def test_for_planned_steps_checks_its_settings(kwargs, error):
    layer = HierarchicalSoftmax(4, Tree.random(30, 4, 3, seed=0))
    with pytest.raises(error):
        TreeLearner.for_planned_steps(layer, **{"planned_steps": 100, **kwargs})
