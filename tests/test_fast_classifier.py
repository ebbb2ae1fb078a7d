"""hsm.classifiers.fast_classifier: the compiled per-example trainer against the PyTorch path.

The key checks: one epoch of the kernel (one thread) gives the parameters and per-example losses
of plain per-example SGD in PyTorch (BagOfWordsClassifier + HierarchicalSoftmax / FlatSoftmax +
torch.optim.SGD at the same rate schedule), and the learned tree (Algorithm 1 with Algorithm 2)
follows TreeLearner's trees, statistics and parameters step for step. Then the released-code
statistics policy and rebuild schedule, properties of the predictions, Hogwild, bad inputs."""
import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.classifiers.fast_classifier import FastBowClassifier, as_ragged
from hsm.statistics import ReleasedStatistics
from hsm.layers import FlatSoftmax
from hsm.statistics import NodeStatistics
from hsm.text_models import make_bags
from hsm.training import TreeLearner
from hsm.tree import Tree


def _problem(num_docs=40, vocab=25, num_labels=7, seed=0, signal=True):
    """Random documents (lengths 0..6, repeated words, one empty document) and labels; with
    ``signal`` each label has its own frequent words, so training can learn something."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_labels, num_docs)
    labels[:num_labels] = np.arange(num_labels)  # every label occurs
    own = rng.integers(0, vocab, size=(num_labels, 3))
    docs = []
    for y in labels:
        length = int(rng.integers(0, 7))
        words = rng.integers(0, vocab, length)
        if signal and length:
            words[: (length + 1) // 2] = own[y][rng.integers(0, 3, (length + 1) // 2)]
        docs.append(words)
    docs[3] = np.zeros(0, dtype=np.int64)
    docs[5] = np.array([2, 2, 2, 7])  # a word repeated in a bag
    return docs, labels


def _rate(lr, step, total, schedule):
    progress = step / total
    return lr * (1.0 - progress) if schedule == "linear" else lr * min(1.0, 2.0 * (1.0 - progress))


def _sgd_reference(model, layer, docs, labels, orders, lr, schedule, learner=None, rebuilds=0):
    """Per-example SGD in PyTorch (train_bow with a batch of one): returns the losses per epoch."""
    values, offsets = as_ragged(docs)
    params = [p for p in list(model.parameters()) + list(layer.parameters())]
    optimizer = torch.optim.SGD(params, lr=lr)
    total = sum(len(order) for order in orders)
    half = total // 2
    step = 0
    losses = []
    for order in orders:
        epoch_losses = []
        for i in order:
            for group in optimizer.param_groups:
                group["lr"] = _rate(lr, step, total, schedule)
            ids, bag_offsets = make_bags(values, offsets, [i])
            optimizer.zero_grad(set_to_none=True)
            target = torch.tensor([int(labels[i])])
            h = model(ids, bag_offsets)
            output = layer(h, target).output if learner is not None or isinstance(layer, FlatSoftmax) \
                else layer.forward_reference(h, target).output
            loss = -output.sum()
            loss.backward()
            optimizer.step()
            step += 1
            if learner is not None and not learner.frozen:
                learner.step()
                if len(learner.history) >= rebuilds or step >= half:
                    learner.freeze()
            epoch_losses.append(float(loss.detach()))
        losses.append(np.array(epoch_losses))
    return losses


def _output_params(layer):
    if isinstance(layer, FlatSoftmax):
        return layer.linear.weight.detach().numpy(), layer.linear.bias.detach().numpy()
    return layer.weight.detach().numpy(), layer.bias.detach().numpy()


# ---------------------------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("output", ["huffman", "flat"])
@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_one_epoch_matches_pytorch_per_example_sgd(output, reduce):
    docs, labels = _problem()
    clf = FastBowClassifier(dim=6, output=output, arity=3, lr=0.4, epochs=1, threads=1, reduce=reduce,
                            shuffle=False, seed=3)
    clf.init_model(25, np.bincount(labels, minlength=7))
    model, layer = copy.deepcopy(clf.model), copy.deepcopy(clf.layer)
    start = clf.model.embedding.weight.detach().clone().numpy()
    # start from non-zero output weights so every term of the gradient is exercised
    with torch.no_grad():
        for source in (clf.layer, layer):
            for p in source.parameters():
                p.copy_(torch.from_numpy(np.random.default_rng(1).normal(0, 0.3, tuple(p.shape)).astype(np.float32)))
    clf.fit(docs, labels, warm_start=True, record_losses=True)
    reference = _sgd_reference(model, layer, docs, labels, [np.arange(len(docs))], 0.4, "linear")
    np.testing.assert_allclose(clf.history.example_losses[0], reference[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(clf.model.embedding.weight.detach().numpy(), model.embedding.weight.detach().numpy(),
                               atol=1e-5)
    for ours, theirs in zip(_output_params(clf.layer), _output_params(layer)):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    # the parameters did move (the comparison is not between two untouched copies)
    assert np.abs(clf.model.embedding.weight.detach().numpy() - start).max() > 1e-2
    assert clf.history.epoch_loss[0] == pytest.approx(reference[0].mean(), abs=1e-5)


def _fasttext_softmax_steps(wi, num_labels, docs, labels, order, lr):
    """fastText's supervised training with ``-loss softmax``, written out (``Model::update``,
    ``SoftmaxLoss::forward``): the output matrix starts at zero; per example, the hidden vector is
    the mean of the input rows, ``alpha_i = lr_t (1[i = y] - p_i)`` for every label, the gradient
    gets ``alpha_i wo_i`` (the row before its own update), ``wo_i += alpha_i hidden``, then every
    input word (a repeated word once per occurrence) gets the gradient over the line's length.
    The rate decays linearly, ``lr (1 - t / T)``, t counted in examples. Returns (wi, wo)."""
    wi = wi.astype(np.float64).copy()
    wo = np.zeros((num_labels, wi.shape[1]))
    for t, i in enumerate(order):
        rate = lr * (1.0 - t / len(order))
        doc = np.asarray(docs[i])
        hidden = wi[doc].mean(0)
        output = wo @ hidden
        output = np.exp(output - output.max())
        output /= output.sum()
        grad = np.zeros(wi.shape[1])
        for label in range(num_labels):
            alpha = rate * (float(label == labels[i]) - output[label])
            grad += alpha * wo[label]
            wo[label] += alpha * hidden
        grad *= 1.0 / doc.size
        for word in doc:
            wi[word] += grad
    return wi, wo


def test_flat_softmax_update_is_fasttexts():
    """At the command line's settings for ``-loss softmax`` (no bias, linear rate, the mean of
    the word vectors), a few steps give fastText's input and output matrices, step by step as
    fastText computes them; the initialisation is fastText's (uniform in [-1/d, 1/d], output zero)."""
    docs = [np.array([0, 1, 2]), np.array([3, 3, 4]), np.array([1, 5]), np.array([2, 4, 0, 5])]
    labels = np.array([0, 2, 1, 2])
    dim, lr, epochs = 4, 0.8, 2
    clf = FastBowClassifier(dim=dim, output="flat", lr=lr, epochs=epochs, threads=1, bias=False,
                            lr_schedule="linear", shuffle=False, seed=4)
    clf.init_model(6, np.bincount(labels, minlength=3))
    start = clf.model.embedding.weight.detach().numpy().copy()
    assert np.abs(start).max() <= 1.0 / dim and clf.layer.linear.bias is None
    assert not clf.layer.linear.weight.detach().numpy().any()
    clf.fit(docs, labels, warm_start=True)
    order = np.tile(np.arange(len(docs)), epochs)
    wi, wo = _fasttext_softmax_steps(start, 3, docs, labels, order, lr)
    np.testing.assert_allclose(clf.model.embedding.weight.detach().numpy(), wi, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(clf.layer.linear.weight.detach().numpy(), wo, rtol=1e-5, atol=1e-6)
    assert np.abs(wo).max() > 0.1 and np.abs(wi - start).max() > 1e-3  # the steps did move both matrices


@pytest.mark.parametrize("decay, depth", [(1.0, "free"), (0.5, "free"), (1.0, "fixed")])
def test_learned_tree_statistics_and_parameters_match_tree_learner(decay, depth):
    """Algorithm 1 (statistics in the kernel, Algorithm 2, or Algorithm 3 for a fixed depth, between
    chunks) = TreeLearner + per-example SGD."""
    docs, labels = _problem(num_docs=60, num_labels=8, seed=4)
    rebuilds = 4
    clf = FastBowClassifier(dim=5, output="learned", arity=3, lr=0.8, epochs=2, threads=1, shuffle=False,
                            rebuilds=rebuilds, decay=decay, seed=2, depth=depth)
    clf.init_model(25, np.bincount(labels, minlength=8))
    model, layer = copy.deepcopy(clf.model), copy.deepcopy(clf.layer)
    clf.fit(docs, labels, warm_start=True, record_losses=True)
    total = 2 * len(docs)
    algorithm = "depth" if depth == "fixed" else "well_formed"
    learner = TreeLearner(layer, reassign_every=(total // 2) // rebuilds, algorithm=algorithm, decay=decay,
                          prior=1.0, reset_moved_nodes=False, prior_mode="current_child", record_objective=False)
    reference = _sgd_reference(model, layer, docs, labels, [np.arange(len(docs))] * 2, 0.8, "constant_then_linear",
                               learner=learner, rebuilds=rebuilds)
    assert [r.step for r in clf.history.rebuilds] == [r.step for r in learner.history] == [15, 30, 45, 60]
    assert [r.moved_labels for r in clf.history.rebuilds] == [r.moved_labels for r in learner.history]
    assert sum(r.moved_labels for r in learner.history) > 0  # the tree did change
    assert clf.tree == layer.tree
    if depth == "fixed":  # 8 labels, M = 3: every label stays at depth 2
        assert clf.tree.depth_limit == 2 and (clf.tree.depths[:8] == 2).all()
        assert clf.start_tree == Tree.balanced(np.argsort(-np.bincount(labels, minlength=8), kind="stable"), 3)
    stats: NodeStatistics = clf.statistics
    for name in ("sum_probas", "path_counts", "label_counts"):
        np.testing.assert_allclose(getattr(stats, name).numpy(), getattr(learner.statistics, name).numpy(), atol=2e-5,
                                   err_msg=name)
    assert torch.equal(stats.stat_node, learner.statistics.stat_node)
    for epoch in range(2):
        np.testing.assert_allclose(clf.history.example_losses[epoch], reference[epoch], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(clf.model.embedding.weight.detach().numpy(), model.embedding.weight.detach().numpy(),
                               atol=1e-5)
    for ours, theirs in zip(_output_params(clf.layer), _output_params(layer)):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_statistics_are_collected_only_until_the_tree_is_frozen():
    docs, labels = _problem(num_docs=40, num_labels=6, seed=5)
    clf = FastBowClassifier(dim=4, output="learned", arity=3, lr=0.3, epochs=3, threads=1, rebuilds=2, shuffle=False)
    clf.fit(docs, labels)
    # 120 examples, half 60, a rebuild every 30: at 30 and 60, then frozen; decay 1 keeps every count
    assert [r.step for r in clf.history.rebuilds] == [30, 60]
    assert float(clf.statistics.label_counts.sum()) == 60


# ---------------------------------------------------------------------------------------------- released policy
def _two_trees():
    a = Tree.from_nested([[0, 1, 2], 3, 4], num_labels=5, arity=3)
    b = Tree.from_nested([[0, 1, 3], 2, 4], num_labels=5, arity=3)
    return a, b


def test_released_prior_is_half_on_rank_mod_m():
    a, _ = _two_trees()
    stats = ReleasedStatistics(a)
    labels = np.arange(5)
    p = stats.p_cond(0, labels, np.zeros(5, dtype=np.int64))
    np.testing.assert_allclose(p.sum(1), 1.0)
    np.testing.assert_allclose(p.max(1), 0.5 + 0.5 / 3)
    assert p.argmax(1).tolist() == (labels % 3).tolist()  # rank by id among the root's labels


def test_released_statistics_survive_a_move_and_never_decay():
    a, b = _two_trees()
    released = ReleasedStatistics(a)
    ours = NodeStatistics(a, decay=0.5)
    seen = np.array([0.1, 0.2, 0.7], dtype=np.float32)
    for stats in (released, ours):
        sums = stats.sum_probas if isinstance(stats, ReleasedStatistics) else stats.sum_probas.numpy()
        counts = stats.path_counts if isinstance(stats, ReleasedStatistics) else stats.path_counts.numpy()
        sums[2, 1] += 3 * seen  # label 2 seen three times at node 1 (its depth-1 node in tree a)
        counts[2, 1] += 3
    before = released.p_cond(1, np.array([2]), np.array([1]))
    np.testing.assert_allclose(released.node_weights(1, np.array([2, 0, 5]), np.array([1, 1, 1])), [4.0, 1.0, 0.0])
    prior = ReleasedStatistics(a).p_cond(1, np.array([2]), np.array([1]))
    np.testing.assert_allclose(before[0], (prior[0] + 3 * seen) / 4, rtol=1e-6)
    for stats in (released, ours):
        stats.on_reassign(b)  # label 2 moves up to the root ...
        stats.on_reassign(a)  # ... and back
    # the fork finds its (node 1, label 2) sums again, never decayed; ours dropped them at the move
    np.testing.assert_allclose(released.p_cond(1, np.array([2]), np.array([1])), before, rtol=1e-6)
    assert float(ours.path_counts[2, 1]) == 0
    assert released.label_weights()[:5].tolist() == [1.0] * 5 and released.label_weights().size == a.num_leaves


def test_released_store_decays_only_when_asked():
    a, b = _two_trees()
    stats = ReleasedStatistics(a, decay=0.5)
    stats.sum_probas[2, 1] += np.array([0.0, 0.0, 4.0], dtype=np.float32)
    stats.path_counts[2, 1] += 4
    stats.label_counts[2] += 4
    stats.on_reassign(b)
    # (pseudo-example + 4 examples) halved: the ratio is unchanged, the weight halves
    expected = (ReleasedStatistics(a).p_cond(1, np.array([2]), np.array([1]))[0] + [0, 0, 4]) / 5
    np.testing.assert_allclose(stats.p_cond(1, np.array([2]), np.array([1]))[0], expected, rtol=1e-6)
    assert stats.label_weights()[2] == pytest.approx(4 * 0.5 + 1.0)
    with pytest.raises(ValueError, match="decay"):
        ReleasedStatistics(a, decay=2.0)


def _fork_rebuild_steps(lengths, orders, epochs, rebuilds, rate):
    """FastText::trainThread's schedule, one thread, written out example by example."""
    samples = epochs * int(lengths.sum())
    period = samples // 2 // rebuilds
    next_update, token_count, local, steps = period, 0, 0, []
    for epoch, order in enumerate(orders):
        for k, i in enumerate(order):
            local += int(lengths[i])
            if local > rate:
                token_count += local
                local = 0
                if token_count >= next_update:
                    steps.append(epoch * len(order) + k + 1)
                    next_update += period if next_update + 1 < samples // 2 else samples
    return steps


def test_every_tokens_schedule_is_the_forks():
    docs, labels = _problem(num_docs=100, num_labels=6, seed=6)
    clf = FastBowClassifier(dim=4, output="learned", arity=3, lr=0.2, epochs=4, threads=1, rebuilds=50,
                            schedule="every_tokens", rebuild_tokens=30, statistics="released", seed=1)
    clf.fit(docs, labels, record_losses=True)
    lengths = np.array([len(d) for d in docs])
    expected = _fork_rebuild_steps(lengths, clf.history.orders, 4, 50, 30)
    assert [r.step for r in clf.history.rebuilds] == expected
    assert max(expected) > 2 * len(docs)  # on small data, rebuilds go on past the first half
    # checks every 10 tokens: the schedule runs out (period = samples // 2 // 50 rounds down, so a few more than
    # 50), and statistics are collected up to the last rebuild only
    clf = FastBowClassifier(dim=4, output="learned", arity=3, lr=0.2, epochs=4, threads=1, rebuilds=50,
                            schedule="every_tokens", rebuild_tokens=10, statistics="released", seed=1)
    clf.fit(docs, labels, record_losses=True)
    expected = _fork_rebuild_steps(lengths, clf.history.orders, 4, 50, 10)
    assert [r.step for r in clf.history.rebuilds] == expected and len(expected) >= 50
    stats = clf.statistics
    assert stats.total_label_counts.sum() + stats.label_counts.sum() == expected[-1]
    assert all(np.isfinite(clf.history.epoch_loss))


def test_first_half_schedule_steps():
    docs, labels = _problem(num_docs=50, num_labels=5, seed=7)
    clf = FastBowClassifier(dim=4, output="learned", arity=2, lr=0.2, epochs=2, threads=1, rebuilds=7,
                            statistics="released").fit(docs, labels)
    assert [r.step for r in clf.history.rebuilds] == [7 * k for k in range(1, 8)]  # half 50, every 50 // 7 = 7


# ---------------------------------------------------------------------------------------------- properties
@settings(max_examples=20, deadline=None)
@given(num_labels=st.integers(2, 9), arity=st.integers(2, 4), output=st.sampled_from(["flat", "huffman", "learned"]),
       reduce=st.sampled_from(["mean", "sum"]), seed=st.integers(0, 1000))
def test_log_probs_normalised_and_predict_is_their_argmax(num_labels, arity, output, reduce, seed):
    arity = min(arity, num_labels)  # a node has at most K children (a larger arity is refused)
    docs, labels = _problem(num_docs=30, num_labels=num_labels, seed=seed)
    clf = FastBowClassifier(dim=5, output=output, arity=arity, lr=0.5, epochs=2, threads=1, reduce=reduce,
                            rebuilds=3, seed=seed).fit(docs, labels)
    every = clf.log_prob(docs)
    assert every.shape == (len(docs), num_labels)
    np.testing.assert_allclose(np.logaddexp.reduce(every, axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(clf.log_prob(docs, labels), every[np.arange(len(docs)), labels], atol=1e-5)
    k = min(3, num_labels)
    top = clf.predict(docs, k=k)
    assert top.labels.shape == (len(docs), k)
    np.testing.assert_allclose(top.log_probs, np.take_along_axis(every, top.labels, axis=1), atol=1e-5)
    np.testing.assert_allclose(top.log_probs, -np.sort(-every, axis=1)[:, :k], atol=1e-5)  # exact top k, in order
    first = clf.predict(docs).labels[:, 0]
    assert (every[np.arange(len(docs)), first] >= every.max(1) - 1e-5).all()


def test_ragged_pair_input_gives_the_same_model():
    docs, labels = _problem(seed=8)
    a = FastBowClassifier(dim=4, output="huffman", arity=3, epochs=2, threads=1).fit(docs, labels)
    b = FastBowClassifier(dim=4, output="huffman", arity=3, epochs=2, threads=1).fit(as_ragged(docs), labels)
    assert torch.equal(a.model.embedding.weight, b.model.embedding.weight)
    assert torch.equal(a.layer.weight, b.layer.weight)


def test_fit_leaves_torch_random_stream_alone():
    docs, labels = _problem(seed=15)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    FastBowClassifier(dim=4, output="huffman", arity=3, epochs=1, threads=1).fit(docs, labels)
    assert torch.equal(torch.rand(3), expected)


def test_ragged_objects_are_read_by_their_values_and_offsets():
    from types import SimpleNamespace

    docs, labels = _problem(seed=16)
    values, offsets = as_ragged(docs)
    gold = [[int(y), (int(y) + 2) % 7] for y in labels]
    gold_values, gold_offsets = as_ragged(gold)
    a = FastBowClassifier(dim=4, output="flat", epochs=2, threads=1).fit(docs, gold)
    b = FastBowClassifier(dim=4, output="flat", epochs=2, threads=1).fit(
        SimpleNamespace(values=values, offsets=offsets), SimpleNamespace(values=gold_values, offsets=gold_offsets))
    assert torch.equal(a.model.embedding.weight, b.model.embedding.weight)
    empty_set = SimpleNamespace(values=gold_values[1:], offsets=np.r_[0, 0, gold_offsets[2:] - 1])
    with pytest.raises(ValueError, match="empty label set"):
        FastBowClassifier(dim=4, output="flat", epochs=1, threads=1).fit(docs, empty_set)


def test_test_reports_fasttext_precision_and_recall():
    docs, labels = _problem(num_docs=30, seed=9)
    clf = FastBowClassifier(dim=4, output="flat", lr=0.5, epochs=3, threads=1).fit(docs, labels)
    gold = [[int(y), (int(y) + 1) % 7] for y in labels]  # two labels per document
    predicted = clf.predict(docs).labels[:, 0]
    hits = sum(p in g for p, g in zip(predicted, gold))
    result = clf.test(docs, gold)
    assert result == {"examples": 30, "precision_at_1": pytest.approx(hits / 30),
                      "recall_at_1": pytest.approx(hits / 60)}
    result2 = clf.test(docs, labels, k=2)
    top2 = clf.predict(docs, k=2).labels
    assert result2["precision_at_2"] == pytest.approx(float((top2 == labels[:, None]).sum()) / 60)


def test_multi_label_training_draws_one_label_per_epoch():
    docs, labels = _problem(num_docs=30, seed=10)
    gold = [[int(y), (int(y) + 3) % 7] for y in labels]
    clf = FastBowClassifier(dim=4, output="learned", arity=3, lr=0.3, epochs=3, threads=1, rebuilds=2).fit(docs, gold)
    assert clf.num_labels == 7 and all(np.isfinite(clf.history.epoch_loss))
    assert clf.test(docs, gold)["examples"] == 30


# ---------------------------------------------------------------------------------------------- Hogwild
def test_hogwild_two_threads_repeated_fits():
    rng = np.random.default_rng(11)
    num_labels, vocab = 6, 60
    own = rng.permutation(vocab)[: num_labels * 4].reshape(num_labels, 4)
    labels = rng.integers(0, num_labels, 400)
    docs = [np.concatenate([own[y][rng.integers(0, 4, 3)], rng.integers(0, vocab, 2)]) for y in labels]
    for repeat in range(20):
        output = ("flat", "huffman", "learned")[repeat % 3]
        clf = FastBowClassifier(dim=8, output=output, arity=3, lr=0.5, epochs=3, threads=2, rebuilds=4,
                                seed=repeat).fit(docs, labels)
        assert all(np.isfinite(clf.history.epoch_loss)), (repeat, clf.history.epoch_loss)
        assert clf.test(docs, labels)["precision_at_1"] > 2.0 / num_labels, repeat


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, error", [
    ({"lr": 0.0}, ValueError), ({"lr": -1.0}, ValueError), ({"lr": float("nan")}, ValueError),
    ({"lr": "0.1"}, TypeError), ({"output": "softmax"}, ValueError), ({"arity": 1}, ValueError),
    ({"arity": 2.0}, TypeError), ({"dim": 0}, ValueError),
    ({"epochs": 0}, ValueError), ({"threads": 0}, ValueError), ({"statistics": "fork"}, ValueError),
    ({"schedule": "often"}, ValueError), ({"decay": 1.5}, ValueError), ({"prior": 0.0}, ValueError),
    ({"reduce": "max"}, ValueError), ({"rebuilds": -1}, ValueError), ({"lr_schedule": "cosine"}, ValueError),
    ({"depth": "limited"}, ValueError), ({"output": "huffman", "depth": "fixed"}, ValueError),
])
def test_bad_settings_are_refused(kwargs, error):
    with pytest.raises(error):
        FastBowClassifier(**kwargs)


def test_bad_training_data_is_refused():
    docs, labels = _problem(seed=12)
    clf = FastBowClassifier(dim=4, output="huffman", arity=3, epochs=1, threads=1)
    with pytest.raises(ValueError, match="empty"):
        clf.fit([], [])
    with pytest.raises(ValueError, match="K >= 2"):
        clf.fit(docs, np.zeros(len(docs), dtype=np.int64))
    with pytest.raises(ValueError, match="unknown label 9"):
        clf.fit(docs, np.where(labels == 0, 9, labels), num_labels=8)
    with pytest.raises(ValueError, match="unknown label -1"):
        clf.fit(docs, np.where(labels == 0, -1, labels))
    with pytest.raises(ValueError, match="labels for"):
        clf.fit(docs, labels[:-1])
    with pytest.raises(TypeError, match="integer"):
        clf.fit([np.array([0.5, 1.0])] + docs[1:], labels)
    with pytest.raises(ValueError, match="negative word id"):
        clf.fit([np.array([1, -2])] + docs[1:], labels)
    with pytest.raises(ValueError, match="word id"):
        clf.fit(docs, labels, num_words=3)
    with pytest.raises(TypeError):
        clf.fit("a b c", labels)
    with pytest.raises(ValueError, match="offsets"):
        clf.fit((np.arange(5), np.array([0, 2, 9])), np.array([0, 1]))


def test_diverging_rate_names_the_loss():
    docs, labels = _problem(seed=13)
    clf = FastBowClassifier(dim=4, output="flat", lr=1e30, epochs=2, threads=1, reduce="sum")
    with pytest.raises(FloatingPointError, match="loss is .* at epoch"):
        clf.fit(docs, labels)


def test_bad_prediction_input_is_refused():
    docs, labels = _problem(seed=14)
    with pytest.raises(RuntimeError, match="fit"):
        FastBowClassifier().predict(docs)
    clf = FastBowClassifier(dim=4, output="huffman", arity=3, epochs=1, threads=1).fit(docs, labels, num_words=25)
    with pytest.raises(ValueError, match=r"docs\[1\] holds word id 25"):
        clf.predict([np.array([1]), np.array([25])])
    for k in (0, 8):
        with pytest.raises(ValueError, match="k must"):
            clf.predict(docs, k=k)
    with pytest.raises(ValueError, match="unknown label 7"):
        clf.test(docs, np.full(len(docs), 7))
    with pytest.raises(ValueError, match="unknown label 7"):
        clf.log_prob(docs, np.full(len(docs), 7))


def test_ranking_score_is_named_by_equation():
    assert FastBowClassifier(dim=4, output="learned", arity=2).score == "eq12"
    assert FastBowClassifier(dim=4, output="learned", arity=2, score="eq10").score == "eq10"


def test_fixed_depth_model_saves_and_loads(tmp_path):
    """A depth-fixed learned model comes back with its setting, its tree and its predictions."""
    docs, labels = _problem(num_docs=60, num_labels=8, seed=5)
    clf = FastBowClassifier(dim=5, output="learned", arity=3, lr=0.5, epochs=2, threads=1, rebuilds=3,
                            depth="fixed", seed=1).fit(docs, labels)
    loaded = FastBowClassifier.load(clf.save(tmp_path / "model.bin"))
    assert loaded.depth == "fixed" and loaded.tree == clf.tree and loaded.tree.depth_limit == 2
    np.testing.assert_array_equal(loaded.predict(docs, k=2).labels, clf.predict(docs, k=2).labels)


# ---------------------------------------------------------------------------------------------- memory
@pytest.mark.parametrize("output", ["flat", "learned"])
def test_predict_in_blocks_is_predict_in_one_go(output, monkeypatch):
    """Documents go through predict in blocks (memory does not grow with n x d); each row's
    labels and log-probabilities are the ones of a single pass."""
    import hsm.classifiers.fast_classifier as fc

    docs, labels = _problem(num_docs=300, seed=3)
    clf = FastBowClassifier(dim=8, output=output, arity=3, lr=0.3, epochs=2, threads=1).fit(docs, labels)
    whole = clf.predict(docs, k=3)
    monkeypatch.setattr(fc, "PREDICT_BLOCK", 8 * 7)  # 7 rows a block
    blocks = clf.predict(docs, k=3)
    np.testing.assert_array_equal(blocks.labels, whole.labels)
    np.testing.assert_allclose(blocks.log_probs, whole.log_probs, rtol=1e-6, atol=1e-6)


def test_the_embeddings_are_drawn_in_blocks_as_in_one_draw(monkeypatch):
    """The initialisation draws V x d in blocks of rows (no float64 copy of the table): the values
    are the single draw's, so a seed gives the model it always gave."""
    import hsm.classifiers.fast_classifier as fc

    monkeypatch.setattr(fc, "INIT_BLOCK", 5 * 7 + 3)  # blocks of 5 rows of d = 7
    clf = FastBowClassifier(dim=7, output="flat", seed=11).init_model(23, np.ones(4))
    expected = np.random.default_rng(11).uniform(-1 / 7, 1 / 7, (23, 7)).astype(np.float32)
    np.testing.assert_array_equal(clf.model.embedding.weight.detach().numpy(), expected)


@pytest.mark.parametrize("output", ["flat", "huffman", "learned"])
def test_an_empty_document_gets_the_lowest_label_id_among_equal_labels(output):
    """An empty document has a zero representation: its labels tie, and every k and every path
    (predict, the layer's predict and topk, log_prob) orders them by label id."""
    from hsm import FastBowClassifier

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 40, size=int(rng.integers(1, 6))) for _ in range(80)]
    labels = rng.integers(0, 12, size=len(docs))
    clf = FastBowClassifier(dim=6, output=output, arity=3, epochs=1, threads=1, rebuilds=1, seed=0)
    clf.fit(docs, labels, num_words=40, num_labels=12)
    empty = [np.zeros(0, dtype=np.int64), docs[0]]
    lp = clf.log_prob(empty)
    for k in (1, 2, 5):
        want = np.lexsort((np.broadcast_to(np.arange(12), lp.shape), -lp), axis=1)[:, :k]
        assert clf.predict(empty, k=k).labels.tolist() == want.tolist(), k
    h = clf.representations(empty)
    assert int(clf.layer.predict(h)[0]) == int(clf.predict(empty, k=1).labels[0, 0])
    assert clf.layer.topk(h, 3).indices[0].tolist() == clf.predict(empty, k=3).labels[0].tolist()
