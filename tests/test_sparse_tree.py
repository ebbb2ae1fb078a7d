"""hsm.classifiers.sparse_tree and hsm.classifiers.sparse_features: TF-IDF rows, the sparse kernels against autograd and
a plain reference, the starting trees, the classifier end to end, and its errors."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm import Tree
from hsm.classifiers.sparse_features import count_matrix, tfidf_features
from hsm.classifiers.sparse_tree import (SparseTreeClassifier, _binary_sparse_examples, _sgd_sparse_examples, full_tree,
                             kmeans_label_tree, label_centroids)


def _toy(n: int = 400, k: int = 12, f: int = 60, seed: int = 0):
    """Documents whose features name their label (3 private features per label) plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    rows, cols = [], []
    for i, y in enumerate(labels):
        own = 3 * y + rng.integers(0, 3, 2)
        noise = rng.integers(3 * k, f, 3)
        cols += own.tolist() + noise.tolist()
        rows += [i] * 5
    x = sp.csr_matrix((np.ones(len(cols), np.float32), (rows, cols)), shape=(n, f))
    x.sum_duplicates()
    norms = np.sqrt(np.asarray(x.multiply(x).sum(1)).ravel())
    return sp.diags(1 / norms).dot(x).tocsr().astype(np.float32), labels


# ---------------------------------------------------------------------------------------------- features
def test_tfidf_rows_have_unit_length_and_sublinear_idf_weights():
    values = np.array([0, 0, 1, 1, 2, 3], dtype=np.int64)  # doc 0: 0 0 1, doc 1: 1 2, doc 2: 3
    offsets = np.array([0, 3, 5, 6], dtype=np.int64)
    feats = tfidf_features(values, offsets, 5, min_df=1)
    assert feats.columns.tolist() == [0, 1, 2, 3]  # id 4 is never seen
    x = feats.transform(values, offsets).toarray()
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-6)
    idf = 1 + np.log(4 / np.array([2, 3, 2, 2]))  # n = 3 documents, smoothed
    raw0 = np.array([(1 + np.log(2)) * idf[0], idf[1], 0, 0])
    np.testing.assert_allclose(x[0], raw0 / np.linalg.norm(raw0), rtol=1e-6)


def test_tfidf_min_df_and_max_features_keep_the_most_frequent_ids():
    values = np.array([0, 1, 0, 2, 0, 1, 3], dtype=np.int64)
    offsets = np.array([0, 2, 4, 7], dtype=np.int64)
    assert tfidf_features(values, offsets, 4, min_df=2).columns.tolist() == [0, 1]
    assert tfidf_features(values, offsets, 4, min_df=1, max_features=1).columns.tolist() == [0]
    with pytest.raises(ValueError, match="lower min_df"):
        tfidf_features(values, offsets, 4, min_df=9)


def test_count_matrix_refuses_ids_out_of_range():
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        count_matrix(np.array([0, 3]), np.array([0, 2]), 3)


# ---------------------------------------------------------------------------------------------- kernels
def _autograd_step(x_dense, y, tree, weight, bias, lr):
    """One SGD step on -log p(y | x) (eq. 3 with f(x) = x) by autograd, weights feature-major."""
    w = torch.tensor(weight, requires_grad=True)
    b = torch.tensor(bias, requires_grad=True)
    x = torch.tensor(x_dense)
    arity = tree.arity
    loss = torch.zeros(())
    for depth in range(tree.path_nodes.shape[1]):
        if not tree.path_mask[y, depth]:
            break
        n, c = int(tree.path_nodes[y, depth]), int(tree.path_children[y, depth])
        logits = x @ w[:, n * arity:(n + 1) * arity] + b[n]
        logits = logits.masked_fill(torch.tensor(~tree.slot_mask[n]), float("-inf"))
        loss = loss - torch.log_softmax(logits, 0)[c]
    loss.backward()
    return (w - lr * w.grad).detach().numpy(), (b - lr * b.grad).detach().numpy(), float(loss.detach())


def _one_step_case(seed: int, arity: int, k: int):
    """A Huffman tree over k labels, a one-row CSR x over 7 features (never empty), and the rng."""
    rng = np.random.default_rng(seed)
    tree = Tree.huffman(rng.integers(1, 20, k).astype(float), arity)
    x = sp.random(1, 7, density=0.5, random_state=seed, format="csr", dtype=np.float32)
    if x.nnz == 0:
        x = sp.csr_matrix(np.eye(1, 7, dtype=np.float32))
    return rng, tree, x, 7


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), arity=st.integers(2, 4), k=st.integers(3, 9))
def test_one_sparse_sgd_step_is_the_autograd_step(seed, arity, k):
    rng, tree, x, f = _one_step_case(seed, arity, k)
    y = int(rng.integers(0, k))
    weight = rng.normal(0, 0.3, (f, tree.num_nodes * arity)).astype(np.float32)
    bias = rng.normal(0, 0.3, (tree.num_nodes, arity)).astype(np.float32)
    expected_w, expected_b, expected_loss = _autograd_step(x.toarray()[0], y, tree, weight, bias, 0.1)
    penalty = (np.zeros((0, arity), np.float32) if tree.slot_mask.all()
               else np.where(tree.slot_mask, 0.0, -np.inf).astype(np.float32))
    losses = np.zeros(1)
    # schedule 1 (constant then linear) at progress 0: the rate is lr
    bad = _sgd_sparse_examples(x.indptr.astype(np.int64), x.indices.astype(np.int64), x.data, np.zeros(1, np.int64),
                               np.array([y]), weight, bias, penalty, tree.path_nodes, tree.path_children,
                               tree.path_mask, 0.1, 1, 0.0, 1.0, 0.0, 10.0, False, np.zeros((0, 1, 1), np.float32),
                               np.zeros((0, 1), np.float32), np.zeros(0, np.float32), losses, np.zeros((0, 1), np.float32))
    assert bad == -1
    np.testing.assert_allclose(weight, expected_w, atol=1e-5)
    np.testing.assert_allclose(bias, expected_b, atol=1e-5)
    assert losses[0] == pytest.approx(expected_loss, rel=1e-5)


@pytest.mark.parametrize("output,start", [("flat", "huffman"), ("tree", "huffman"), ("tree", "kmeans")])
def test_log_prob_is_a_distribution_and_predict_is_its_top_k(output, start):
    x, y = _toy()
    clf = SparseTreeClassifier(output=output, start=start, arity=4, lr=0.5, epochs=2, threads=1).fit(x, y)
    logp = clf.log_prob(x[:50]).astype(np.float64)
    np.testing.assert_allclose(np.exp(logp).sum(1), 1.0, rtol=1e-4)
    pred = clf.predict(x[:50], k=3)
    np.testing.assert_array_equal(pred.labels[:, 0], logp.argmax(1))
    np.testing.assert_allclose(pred.log_probs, np.take_along_axis(logp, pred.labels, 1), rtol=1e-6)
    assert (np.diff(pred.log_probs, axis=1) <= 0).all()


def test_log_prob_matches_a_plain_reference():
    x, y = _toy(n=120, k=7)
    clf = SparseTreeClassifier(output="tree", arity=3, lr=0.5, epochs=1, threads=1).fit(x, y)
    tree, dense = clf.tree, x.toarray()
    for i in range(5):
        for label in range(7):
            ref = 0.0
            for n, c in tree.path(label):
                logits = dense[i] @ clf.weight[:, n * 3:(n + 1) * 3] + clf.bias[n]
                logits = np.where(tree.slot_mask[n], logits, -np.inf)
                ref += logits[c] - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
            assert clf.log_prob(x[i])[0, label] == pytest.approx(ref, abs=1e-4)


# ---------------------------------------------------------------------------------------------- trees
def test_label_centroids_are_unit_sums_of_their_documents():
    x, y = _toy(n=200, k=6, f=40)
    centroids = label_centroids(x, y, np.arange(y.size + 1), 6).toarray()
    for label in range(6):
        total = np.asarray(x[y == label].sum(0)).ravel()
        np.testing.assert_allclose(centroids[label], total / np.linalg.norm(total), rtol=1e-5, atol=1e-7)


def test_kmeans_label_tree_groups_labels_with_similar_centroids():
    rng = np.random.default_rng(0)
    family = np.repeat([0, 1], 8)  # labels 0-7 near one direction, 8-15 near another
    points = np.eye(10)[family * 5] + 0.05 * rng.normal(size=(16, 10))
    tree = kmeans_label_tree(sp.csr_matrix(points), arity=4)
    assert tree.is_well_formed() and tree.depths.max() == 2
    for node in tree.child_node[0]:
        assert len(set(family[tree.labels_under(int(node))])) == 1  # no cluster mixes the families


@settings(max_examples=20, deadline=None)
@given(k=st.integers(4, 40), arity=st.integers(2, 7), seed=st.integers(0, 100))
def test_full_tree_keeps_every_label_in_place_and_is_well_formed(k, arity, seed):
    rng = np.random.default_rng(seed)
    arity = min(arity, k)
    depth = 1
    while arity**depth < k:
        depth += 1
    positions = rng.permutation(arity**depth)[:k]
    tree = Tree.complete(positions, arity, depth)
    full = full_tree(tree)
    assert full.is_well_formed()
    for label in range(k):
        assert full.path(label) == tree.path(label)


def test_kmeans_label_tree_refuses_a_tree_deeper_than_three():
    with pytest.raises(ValueError, match="use arity >= 3"):
        kmeans_label_tree(np.eye(20), arity=2)


# ---------------------------------------------------------------------------------------------- the classifier
@pytest.mark.parametrize("output,start", [("flat", "huffman"), ("tree", "kmeans"), ("learned", "huffman"),
                                          ("learned", "kmeans")])
def test_classifier_learns_a_separable_problem(output, start):
    x, y = _toy(seed=1)
    clf = SparseTreeClassifier(output=output, start=start, arity=4, lr=1.0, epochs=5, threads=1, rebuilds=5)
    clf.fit(x[:300], y[:300])
    assert (clf.predict(x[300:]).labels[:, 0] == y[300:]).mean() > 0.9
    if output == "learned":
        assert len(clf.history.rebuilds) == 5 and clf.tree.is_well_formed()


def test_multi_label_all_trains_one_example_per_label():
    x, y = _toy(n=100)
    sets = [[int(a), int((a + 1) % 12)] for a in y]
    clf = SparseTreeClassifier(output="flat", lr=0.5, epochs=1, threads=1, multi_label="all").fit(x, sets)
    assert clf.history.examples_per_second > 0
    assert len(clf.history.epoch_loss) == 1
    sampled = SparseTreeClassifier(output="flat", lr=0.5, epochs=1, threads=1).fit(x, sets)
    assert not np.allclose(clf.weight, sampled.weight)


def test_one_thread_is_deterministic():
    x, y = _toy()
    a = SparseTreeClassifier(arity=4, epochs=2, threads=1, rebuilds=3, seed=3).fit(x, y)
    b = SparseTreeClassifier(arity=4, epochs=2, threads=1, rebuilds=3, seed=3).fit(x, y)
    np.testing.assert_array_equal(a.weight, b.weight)
    assert a.tree == b.tree


def test_errors_name_the_problem():
    x, y = _toy(n=50)
    with pytest.raises(TypeError, match="scipy.sparse"):
        SparseTreeClassifier().fit(x.toarray(), y)
    with pytest.raises(ValueError, match="output"):
        SparseTreeClassifier(output="deep")
    with pytest.raises(ValueError, match="start"):
        SparseTreeClassifier(start="random")
    clf = SparseTreeClassifier(output="flat", epochs=1, threads=1).fit(x, y)
    with pytest.raises(ValueError, match="same fitted TfidfFeatures"):
        clf.predict(x[:, :10])
    with pytest.raises(RuntimeError, match="call fit"):
        SparseTreeClassifier().predict(x)
    with pytest.raises(ValueError, match="num_labels"):
        SparseTreeClassifier().fit(x, y, num_labels=3)


def test_adagrad_divides_each_step_by_its_feature_and_node_history():
    x = sp.csr_matrix(np.array([[0.6, 0.8, 0.0]], dtype=np.float32))
    tree = Tree.huffman(np.ones(3), 3)  # one node, three labels
    weight = np.zeros((3, 3), np.float32)
    bias = np.zeros((1, 3), np.float32)
    squares = np.zeros((3, 1), np.float32)
    losses = np.zeros(2)
    args = (np.zeros((0, 3), np.float32), tree.path_nodes, tree.path_children, tree.path_mask, 1.0, 1, 0.0, 1.0, 0.0,
            10.0, False, np.zeros((0, 1, 1), np.float32), np.zeros((0, 1), np.float32), np.zeros(0, np.float32))
    y = int(tree.child_label[0].tolist().index(0))  # label 0's slot
    _sgd_sparse_examples(x.indptr.astype(np.int64), x.indices.astype(np.int64), x.data, np.zeros(1, np.int64),
                         np.array([0]), weight, bias, *args, losses, squares)
    residual = (1 - 1 / 3) ** 2 + 2 * (1 / 3) ** 2  # uniform p at zero weights
    np.testing.assert_allclose(squares[:, 0], [0.36 * residual, 0.64 * residual, 0], rtol=1e-5)
    expected = np.array([0.6, 0.8]) / np.sqrt(1 + squares[:2, 0]) * (1 - 1 / 3)
    np.testing.assert_allclose(weight[:2, y], expected, rtol=1e-5)


def test_adagrad_learns_a_separable_problem():
    x, y = _toy(seed=2)
    clf = SparseTreeClassifier(output="learned", arity=4, lr=2.0, epochs=5, threads=1, rebuilds=5,
                               optimizer="adagrad").fit(x[:300], y[:300])
    assert (clf.predict(x[300:]).labels[:, 0] == y[300:]).mean() > 0.9


def test_changed_nodes_are_those_whose_children_differ() -> None:
    from hsm.classifiers.sparse_tree import _changed_nodes

    old = Tree.balanced(np.arange(9), 3, 2)
    order = np.arange(9)
    order[[0, 3]] = order[[3, 0]]  # labels 0 and 3 trade places: nodes 1 and 2 change, the root does not
    new = Tree.balanced(order, 3, 2)
    assert _changed_nodes(old, new, np.array([], np.int64)).tolist() == sorted(
        int(n) for n in np.flatnonzero((old.child_label != new.child_label).any(1)))
    assert 0 not in _changed_nodes(old, new, np.array([], np.int64))
    assert 0 in _changed_nodes(old, new, np.array([0]))


@pytest.mark.parametrize("changed", ["fresh_steps", "fresh"])
def test_fresh_changed_nodes_learn_and_zero_what_they_say(changed: str) -> None:
    x, y = _toy(k=9)
    clf = SparseTreeClassifier(output="learned", arity=3, lr=0.5, epochs=3, threads=1, optimizer="adagrad",
                               changed_nodes=changed, rebuilds=5, seed=0).fit(x, y)
    assert np.isfinite(clf.weight).all() and clf.predict(x).labels.shape == (x.shape[0], 1)
    clf.squares[:] = 1.0
    clf.weight[:] = 1.0
    clf.bias[:] = 1.0
    clf._refresh(np.array([1]))
    assert (clf.squares[:, 1] == 0).all() and (clf.squares[:, [0, 2]] == 1).all()
    m = clf.bias.shape[1]
    fresh = changed == "fresh"
    assert (clf.weight[:, m:2 * m] == (0 if fresh else 1)).all() and (clf.bias[1] == (0 if fresh else 1)).all()
    assert (np.delete(clf.weight, np.s_[m:2 * m], axis=1) == 1).all() and (np.delete(clf.bias, 1, axis=0) == 1).all()


def test_fresh_steps_needs_adagrad() -> None:
    with pytest.raises(ValueError, match="optimizer='adagrad'"):
        SparseTreeClassifier(optimizer="sgd", changed_nodes="fresh_steps")


# ---------------------------------------------------------------------------------------------- binary node decisions
def _autograd_binary_step(x_dense, labels, tree, weight, bias, lr):
    """One SGD step on the probabilistic label tree's loss by autograd: at every node on the paths
    of ``labels``, a logistic loss per real child slot, positive where a label lies below."""
    w = torch.tensor(weight, requires_grad=True)
    b = torch.tensor(bias, requires_grad=True)
    x = torch.tensor(x_dense)
    arity = tree.arity
    positive: dict[int, set[int]] = {}
    for y in labels:
        for n, c in tree.path(y):
            positive.setdefault(n, set()).add(c)
    loss = torch.zeros(())
    for n, slots in positive.items():
        logits = x @ w[:, n * arity:(n + 1) * arity] + b[n]
        target = torch.tensor([1.0 if m in slots else 0.0 for m in range(arity)])
        real = torch.tensor(tree.slot_mask[n])
        loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(logits[real], target[real],
                                                                          reduction="sum")
    loss.backward()
    return (w - lr * w.grad).detach().numpy(), (b - lr * b.grad).detach().numpy(), float(loss.detach())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), arity=st.integers(2, 4), k=st.integers(3, 9), size=st.integers(1, 3))
def test_one_binary_step_is_the_autograd_step(seed, arity, k, size):
    rng, tree, x, f = _one_step_case(seed, arity, k)
    labels = rng.choice(k, size=min(size, k), replace=False).astype(np.int64)
    weight = rng.normal(0, 0.3, (f, tree.num_nodes * arity)).astype(np.float32)
    bias = rng.normal(0, 0.3, (tree.num_nodes, arity)).astype(np.float32)
    expected_w, expected_b, expected_loss = _autograd_binary_step(x.toarray()[0], labels, tree, weight, bias, 0.1)
    penalty = (np.zeros((0, arity), np.float32) if tree.slot_mask.all()
               else np.where(tree.slot_mask, 0.0, -np.inf).astype(np.float32))
    losses = np.zeros(1)
    bad = _binary_sparse_examples(x.indptr.astype(np.int64), x.indices.astype(np.int64), x.data,
                                  np.zeros(1, np.int64), labels, np.array([0, labels.size], np.int64), weight, bias,
                                  penalty, tree.path_nodes, tree.path_children, tree.path_mask, 0.1, 1, 0.0, 1.0, 0.0,
                                  10.0, losses, np.zeros((0, 1), np.float32))
    assert bad == -1
    np.testing.assert_allclose(weight, expected_w, atol=1e-5)
    np.testing.assert_allclose(bias, expected_b, atol=1e-5)
    assert losses[0] == pytest.approx(expected_loss, rel=1e-5)


@pytest.mark.parametrize("output", ["flat", "tree"])
def test_binary_log_prob_is_the_sum_of_log_sigmoids_on_the_path(output):
    x, y = _toy(n=150, k=7)
    sets = [[int(a), int((a + 1) % 7)] for a in y]
    clf = SparseTreeClassifier(output=output, arity=3, lr=0.5, epochs=2, threads=1, node_loss="binary",
                               optimizer="adagrad").fit(x, sets)
    dense = x.toarray()
    paths = ([[(0, label)] for label in range(7)] if output == "flat"
             else [clf.tree.path(label) for label in range(7)])
    arity = clf.bias.shape[1]
    for i in range(4):
        for label in range(7):
            ref = sum(-np.logaddexp(0.0, -(dense[i] @ clf.weight[:, n * arity + c] + clf.bias[n, c]))
                      for n, c in paths[label])
            assert clf.log_prob(x[i])[0, label] == pytest.approx(ref, abs=1e-4)
    # it learns: each label's own features put it in the top 2
    top = clf.predict(x, k=2).labels
    assert np.mean([a in row for a, row in zip(y, top)]) > 0.9


def test_binary_nodes_take_a_fixed_tree_only():
    with pytest.raises(ValueError, match="no distribution over children"):
        SparseTreeClassifier(output="learned", node_loss="binary")


def test_fixed_depth_learning_keeps_every_label_at_the_start_depth():
    x, y = _toy(n=400, k=12)
    clf = SparseTreeClassifier(output="learned", start="kmeans", depth="fixed", arity=4, lr=0.5, epochs=3,
                               threads=1, rebuilds=6, seed=1).fit(x, y)
    assert clf.start_tree.depth_limit == 2 and clf.tree.depth_limit == 2
    assert (clf.tree.depths[:12] == 2).all() and len(clf.history.rebuilds) > 0
    assert sorted(clf.tree.leaf_positions()[:12].tolist()) == sorted(set(clf.tree.leaf_positions()[:12].tolist()))
    np.testing.assert_allclose(np.exp(clf.log_prob(x[:20]).astype(np.float64)).sum(1), 1.0, rtol=1e-4)


def test_fixed_depth_needs_a_fixed_depth_start():
    with pytest.raises(ValueError, match="fixed-depth start"):
        SparseTreeClassifier(start="huffman", depth="fixed")
    x, y = _toy(n=100, k=6)
    with pytest.raises(ValueError, match="well-formed"):
        SparseTreeClassifier(output="learned", start=Tree.balanced(np.arange(6), 4, 2), threads=1).fit(x, y)


@pytest.mark.parametrize("output", ["flat", "learned"])
def test_equal_scores_go_to_the_lowest_label_id_for_every_k(output):
    """A model whose weights are all zero scores its labels by the biases alone; labels that tie
    are ordered by id, the rule of the layers' searches, whatever k."""
    from hsm.classifiers.sparse_tree import _topk_lowest_id

    rng = np.random.default_rng(0)
    features = sp.random(60, 20, density=0.3, format="csr", random_state=0, dtype=np.float32)
    clf = SparseTreeClassifier(output=output, arity=2, epochs=1, threads=1).fit(features, rng.integers(0, 9, 60),
                                                                            num_labels=9)
    clf.weight[:] = 0.0
    clf.bias[:] = 0.0
    empty = sp.csr_matrix((2, 20), dtype=np.float32)
    lp = clf.log_prob(empty)
    for k in (1, 2, 4, 9):
        want = np.lexsort((np.broadcast_to(np.arange(9), lp.shape), -lp), axis=1)[:, :k]
        assert clf.predict(empty, k=k).labels.tolist() == want.tolist(), k
    scores = np.array([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0], [1.0, 3.0, 2.0, 3.0]], dtype=np.float32)
    assert _topk_lowest_id(scores, 2).tolist() == [[1, 2], [0, 1], [1, 3]]
