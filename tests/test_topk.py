"""The compiled exact top-k (best first) and all-label log-probabilities against the float64 reference.

The reference is the plain PyTorch ``log_prob`` in float64 followed by a sort of every row by
decreasing value, equal values by increasing label id. Every check runs with one thread and with
the rows shared by two."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hsm.kernels as kernels
from hsm import search
from hsm.layers import NonFiniteInputError
from hsm.tree import Tree

from kernel_cases import float64_reference, kernel_test_trees, scaled_layer


def _trees():
    return kernel_test_trees() + [Tree.random(1_000, 11, 3, seed=4)]  # K not a power of M


def _confident_layer(tree, d=7, scale=3.0, seed=0):
    return scaled_layer(tree, d=d, scale=scale, seed=seed)


def _reference_log_prob(layer, h):
    """``log_prob`` of the same parameters in float64 through the PyTorch implementation."""
    with torch.no_grad():
        return float64_reference(layer).log_prob(h.double())


def _reference_topk(log_prob, k):
    """(values, labels) [B, k]: best first, equal values by increasing label id."""
    lp = log_prob.numpy()
    order = np.lexsort((np.broadcast_to(np.arange(lp.shape[1]), lp.shape), -lp), axis=1)[:, :k]
    return np.take_along_axis(lp, order, axis=1), order


TOL = dict(rtol=1e-5, atol=2e-5)


def _check_exact_topk(values, labels, log_prob, k):
    """``values, labels`` [B, k] are the k most likely labels of every row of the reference
    ``log_prob`` [B, K] (float64), best first. Labels are compared one for one where the reference
    separates neighbouring values by more than float32 rounding; everywhere the labels must be
    distinct and carry the reference's k best values."""
    want_values, want_labels = _reference_topk(log_prob, k)
    np.testing.assert_allclose(values, want_values, **TOL)
    np.testing.assert_allclose(values, np.take_along_axis(log_prob.numpy(), labels, axis=1), **TOL)
    assert all(len(set(row)) == k for row in labels.tolist())
    assert (np.diff(values, axis=1) <= 0).all()
    full = np.sort(log_prob.numpy(), axis=1)[:, ::-1]
    gaps = np.abs(np.diff(full[:, : k + 1], axis=1)) if full.shape[1] > k else np.abs(np.diff(full, axis=1))
    separated = (gaps > 1e-4).all(axis=1) if gaps.shape[1] else np.ones(len(full), bool)
    np.testing.assert_array_equal(labels[separated], want_labels[separated])


@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_compiled_topk_equals_the_reference(tree, threads):
    layer = _confident_layer(tree)
    h = torch.randn(41, layer.in_features)
    log_prob = _reference_log_prob(layer, h)
    for k in sorted({2, 5, 20, tree.num_labels} & set(range(2, tree.num_labels + 1))):
        top = layer.topk(h, k)
        _check_exact_topk(top.values.numpy(), top.indices.numpy(), log_prob, k)
        assert top.values.dtype == torch.float32 and top.indices.dtype == torch.long
        assert ((top.nodes_visited >= 1) & (top.nodes_visited <= tree.num_nodes)).all()


@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_kernel_topk_for_k_1_and_its_visits(tree, threads):
    """k = 1 through the kernel itself (the layer keeps its PyTorch search there), and a node is
    evaluated at most once per row."""
    layer = _confident_layer(tree)
    h = torch.randn(23, layer.in_features)
    operands = search._kernel_operands(layer, h)
    tables = layer.tables
    for k in (1, min(5, tree.num_labels)):
        values, labels, visited = kernels.run_topk_search(*operands, tables.child_node, tables.child_label, k,
                                                          tables.paths[0].shape[1])
        _check_exact_topk(values, labels, _reference_log_prob(layer, h), k)
        assert ((visited >= 1) & (visited <= tree.num_nodes)).all()
    np.testing.assert_array_equal(labels[:, 0], layer.predict(h).numpy())


@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_compiled_log_prob_equals_the_reference(tree, threads):
    layer = _confident_layer(tree)
    h = torch.randn(70, layer.in_features)
    with torch.no_grad():
        got = search.all_log_probs(layer, h)
    assert got.shape == (70, tree.num_labels) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _reference_log_prob(layer, h), **TOL)


def test_results_do_not_depend_on_the_thread_count(monkeypatch):
    layer = _confident_layer(Tree.random(400, 9, 3, seed=3))
    h = torch.randn(150, layer.in_features)
    monkeypatch.setattr(kernels, "MIN_WORK_PER_THREAD", 1)
    monkeypatch.setattr(kernels, "ALL_LOG_PROBS_SCRATCH", 9 * 50 * 4)  # several row chunks
    before = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.no_grad():
                results.append((search.all_log_probs(layer, h), layer.topk(h, 7)))
    finally:
        torch.set_num_threads(before)
    (lp1, top1), (lp2, top2) = results
    assert torch.equal(lp1, lp2)
    assert torch.equal(top1.values, top2.values) and torch.equal(top1.indices, top2.indices)
    assert torch.equal(top1.nodes_visited, top2.nodes_visited)


@pytest.mark.parametrize("tree", [Tree.random(27, 3, 3, seed=2), Tree.huffman(np.arange(1, 21), 4)], ids=repr)
def test_equal_values_come_in_label_order(tree, threads):
    """Zero weights and biases: every node is uniform, so labels at the same depth tie exactly."""
    layer = _confident_layer(tree)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
        h = torch.randn(5, layer.in_features)
        log_prob = search.all_log_probs(layer, h)
        for k in (2, 7, tree.num_labels):
            top = layer.topk(h, k)
            want_values, want_labels = _reference_topk(log_prob, k)
            np.testing.assert_array_equal(top.indices.numpy(), want_labels)
            np.testing.assert_array_equal(top.values.numpy(), want_values)


def test_k_outside_1_to_k_is_refused():
    layer = _confident_layer(Tree.random(50, 4, 3, seed=1))
    h = torch.randn(3, layer.in_features)
    with pytest.raises(ValueError, match="k"):
        layer.topk(h, 51)
    with pytest.raises(ValueError, match="k must be >= 1"):
        kernels.run_topk_search(*search._kernel_operands(layer, h), layer.tables.child_node,
                                layer.tables.child_label, 0, 3)


def test_overflowing_logits_are_refused_by_name():
    layer = _confident_layer(Tree.random(50, 4, 3, seed=1))
    h = torch.randn(4, layer.in_features)
    h[2] = 3e38
    with pytest.raises(NonFiniteInputError, match=r"rows \[2\]"):
        layer.topk(h, 5)
    with torch.no_grad(), pytest.raises(NonFiniteInputError, match=r"rows \[2\]"):
        search.all_log_probs(layer, h)


def test_compiled_log_prob_only_where_it_applies():
    """None (the caller's PyTorch path) for float64, or when a gradient is needed; an empty
    batch gives [0, K]."""
    layer = _confident_layer(Tree.random(50, 4, 3, seed=1))
    h = torch.randn(3, layer.in_features)
    assert search.all_log_probs(layer, h) is None  # grad mode: the weights require grad
    with torch.no_grad():
        assert search.all_log_probs(layer, h).shape == (3, 50)
        assert search.all_log_probs(layer, h[:0]).shape == (0, 50)
        assert search.all_log_probs(layer.double(), h.double()) is None


@settings(max_examples=25, deadline=None)
@given(num_labels=st.integers(2, 150), arity=st.integers(2, 9), well_formed=st.booleans(),
       batch=st.integers(1, 40), k=st.integers(1, 25), seed=st.integers(0, 10_000))
def test_topk_and_log_prob_property(num_labels, arity, well_formed, batch, k, seed):
    rng = np.random.default_rng(seed)
    if well_formed:
        tree = Tree.huffman(rng.integers(1, 100, num_labels), arity)
    else:
        depth = max(1, int(np.ceil(np.log(num_labels) / np.log(arity))))
        tree = Tree.random(num_labels, arity, depth, seed=seed)
    k = min(k, num_labels)
    layer = _confident_layer(tree, d=5, scale=float(rng.uniform(0.5, 8.0)), seed=seed)
    h = torch.from_numpy(rng.standard_normal((batch, 5)).astype(np.float32))
    reference = _reference_log_prob(layer, h)
    with torch.no_grad():
        torch.testing.assert_close(search.all_log_probs(layer, h).double(), reference, **TOL)
    tables = layer.tables
    values, labels, _ = kernels.run_topk_search(*search._kernel_operands(layer, h), tables.child_node,
                                                tables.child_label, k, tables.paths[0].shape[1])
    _check_exact_topk(values, labels, reference, k)



def _tied_layers():
    """Layers whose labels tie: every weight zero (all labels of a tree level equally likely), and
    random weights with each node's slots 0 and 1 made equal and likely (siblings tie in pairs)."""
    for tree in (Tree.random(60, 4, 3, seed=0), Tree.random(50, 7, 3, seed=1)):
        zero = scaled_layer(tree, d=6, seed=2)
        with torch.no_grad():
            zero.weight.zero_()
            zero.bias.zero_()
        yield zero
        pairs = scaled_layer(tree, d=6, seed=3)
        with torch.no_grad():
            pairs.weight[:, 1] = pairs.weight[:, 0]
            pairs.bias[:, :2] = 5.0  # the best labels lie below slots 0 and 1: they tie
        yield pairs
    # below the root, every node all but certain of its slot 0: in float32 (and float64) that
    # child's log-probability is exactly 0, so whole subtrees tie with the best label found
    certain = scaled_layer(Tree.random(27, 3, 3, seed=4), d=6, seed=5)
    with torch.no_grad():
        certain.weight.zero_()
        certain.bias.fill_(-1e4)
        certain.bias[:, 0] = 0.0
        certain.bias[0] = 0.0  # the root: its three subtrees equally likely
    yield certain


@pytest.mark.parametrize("layer", list(_tied_layers()),
                         ids=["zero-4ary", "pairs-4ary", "zero-7ary", "pairs-7ary", "certain-subtrees"])
def test_equal_log_probabilities_go_to_the_lowest_label_id_on_every_engine_and_k(layer) -> None:
    """predict, topk for every k and method "exact", the compiled float32 searches, the PyTorch
    ones (float64, and float32 with the kernels off) and the static engine's all order equal
    values by label id."""
    h = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    h[0] = 0.0  # an all-zero row: every node uniform under the zero layer
    engines = {"compiled": layer}
    engines["pytorch-float64"] = float64_reference(layer)
    engines["pytorch-float32"] = scaled_layer(layer.tree, d=6)
    engines["pytorch-float32"].load_state_dict(layer.state_dict())
    engines["pytorch-float32"].use_kernels = False
    engines["static-float32"] = scaled_layer(layer.tree, d=6)
    engines["static-float32"].load_state_dict(layer.state_dict())
    engines["static-float32"].engine = "torch"  # hsm.engine.topk: a fixed-width beam, then branch and bound
    for name, engine in engines.items():
        x = h.to(engine.weight.dtype)
        with torch.no_grad():
            lp = engine.log_prob(x)
        top = lp.topk(3).values
        assert bool((top[:, :-1] == top[:, 1:]).any())  # some row's best labels do tie
        for k in (1, 2, 3, 7):
            _, want = _reference_topk(lp, k)
            got = engine.topk(x, k)
            assert got.indices.tolist() == want.tolist(), (name, k)
        assert engine.predict(x).tolist() == _reference_topk(lp, 1)[1][:, 0].tolist(), name


def test_the_flat_softmax_orders_equal_values_by_label_id() -> None:
    from hsm import FlatSoftmax

    flat = FlatSoftmax(4, 30)
    with torch.no_grad():
        flat.linear.weight.zero_()
        flat.linear.bias.zero_()
        flat.linear.bias[[7, 21, 3]] = 1.0  # three labels tie above the others
    h = torch.zeros(3, 4)
    assert flat.predict(h).tolist() == [3, 3, 3]
    assert flat.topk(h, 1).indices.tolist() == [[3]] * 3
    assert flat.topk(h, 5).indices.tolist() == [[3, 7, 21, 0, 1]] * 3
    values, indices = search.topk_lowest_id(torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]]), 3)
    assert indices.tolist() == [[1, 2, 3], [0, 1, 2]] and values.tolist() == [[2.0, 2.0, 1.0], [5.0] * 3]
