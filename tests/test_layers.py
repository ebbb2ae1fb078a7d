"""hsm.layers: the tree softmax against a brute-force per-example computation."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hsm.backend
import hsm.search
from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.tree import Tree


def _trees():
    return [
        Tree.random(50, 4, 3, seed=1),  # fixed depth with unused leaves
        Tree.random(27, 3, 3, seed=2),  # exactly full
        Tree.huffman(np.arange(1, 38), 3),  # well formed, variable depth
        Tree.huffman(np.arange(1, 21), 4),  # with dummy leaves
        Tree.huffman(np.arange(1, 20), 2),  # binary (fastText's tree)
        Tree.from_taxonomy({"a": ["x", "y", "z"], "b": ["w"], "c": ["u", "v"]}, list("xyzwuv")),  # ragged
    ]


def _layer(tree, d=6, scale=3.0, seed=0):
    torch.manual_seed(seed)
    layer = HierarchicalSoftmax(d, tree).double()
    with torch.no_grad():
        layer.weight.mul_(scale)
        layer.bias.normal_()
    return layer


def _brute_force_log_prob(layer, tree, h, label):
    weight = layer.weight.view(tree.num_nodes, tree.arity, -1)
    total = torch.zeros((), dtype=h.dtype)
    for node, child in tree.path(label):
        logits = weight[node] @ h + layer.bias[node]
        logits = logits.masked_fill(~torch.as_tensor(tree.slot_mask[node]), -math.inf)
        total = total + torch.log_softmax(logits, 0)[child]
    return total


@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_forward_equals_brute_force_and_log_prob(tree):
    layer = _layer(tree)
    h = torch.randn(17, 6, dtype=torch.double)
    y = torch.randint(0, tree.num_labels, (17,))
    out = layer(h, y)
    expected = torch.stack([_brute_force_log_prob(layer, tree, h[b], int(y[b])) for b in range(17)])
    torch.testing.assert_close(out.output, expected)
    torch.testing.assert_close(out.loss, -expected.mean())
    full = layer.log_prob(h)
    assert full.shape == (17, tree.num_labels)
    torch.testing.assert_close(full.exp().sum(1), torch.ones(17, dtype=torch.double))
    torch.testing.assert_close(full[torch.arange(17), y], out.output)


@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_predict_and_topk_are_exact(tree):
    layer = _layer(tree, scale=5.0, seed=3)
    h = torch.randn(40, 6, dtype=torch.double)
    full = layer.log_prob(h)
    assert (layer.predict(h) == full.argmax(1)).all()
    k = min(4, tree.num_labels)
    top = layer.topk(h, k)
    ref = full.topk(k, dim=1)
    torch.testing.assert_close(top.values, ref.values)
    assert (top.nodes_visited >= 1).all()
    beam = layer.topk(h, k, method="beam", beam=1)
    assert (beam.values <= top.values + 1e-12).all()  # beam search never beats the exact search


def test_branch_and_bound_prunes_on_a_confident_model():
    tree = Tree.random(4096, 16, 3, seed=0)
    layer = HierarchicalSoftmax(8, tree)
    with torch.no_grad():
        layer.weight.mul_(20.0)
    top = layer.topk(torch.randn(32, 8), 1)
    # beam pass visits 3 nodes; pruning keeps the exact pass far below all 273 nodes
    assert top.nodes_visited.float().mean() < 40


def test_gradients_match_autograd_of_reference_and_are_sparse():
    tree = Tree.huffman(np.arange(1, 30), 3)
    dense = _layer(tree)
    sparse = HierarchicalSoftmax(6, tree, sparse=True).double()
    sparse.load_state_dict(dense.state_dict())
    h = torch.randn(9, 6, dtype=torch.double, requires_grad=True)
    y = torch.randint(0, tree.num_labels, (9,))
    ref = -torch.stack([_brute_force_log_prob(dense, tree, h[b], int(y[b])) for b in range(9)]).mean()
    grads_ref = torch.autograd.grad(ref, [h, dense.weight, dense.bias])
    out = sparse(h, y)
    grads = torch.autograd.grad(out.loss, [h, sparse.weight, sparse.bias])
    assert grads[1].is_sparse and grads[2].is_sparse
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got.to_dense(), want)


def test_gradcheck_small():
    tree = Tree.random(10, 3, 3, seed=0)
    layer = _layer(tree, d=4)
    h = torch.randn(3, 4, dtype=torch.double, requires_grad=True)
    y = torch.tensor([0, 5, 9])
    assert torch.autograd.gradcheck(lambda x: layer(x, y).output, (h,))


def test_sparse_optimisers_accept_the_gradients():
    tree = Tree.random(100, 5, 3, seed=0)
    layer = HierarchicalSoftmax(8, tree, sparse=True)
    for opt in (torch.optim.SGD(layer.parameters(), lr=0.1), torch.optim.Adagrad(layer.parameters(), lr=0.1)):
        before = layer.weight.detach().clone()
        layer(torch.randn(4, 8), torch.tensor([1, 2, 3, 4])).loss.backward()
        opt.step()
        opt.zero_grad()
        changed = (layer.weight.detach() != before).any(dim=1)
        touched = set(np.unique(tree.path_nodes[[1, 2, 3, 4]]).tolist())
        assert set(torch.nonzero(changed).flatten().tolist()) <= touched


def test_set_tree_and_reset_nodes():
    tree = Tree.random(20, 3, 3, seed=0)
    layer = HierarchicalSoftmax(5, tree)
    w = layer.weight.detach().clone()
    layer.set_tree(Tree.random(20, 3, 3, seed=1), reset_nodes=np.array([2]))
    assert torch.equal(layer.weight[0], w[0]) and not torch.equal(layer.weight[2], w[2])
    with pytest.raises(ValueError, match="built for"):
        layer.set_tree(Tree.random(20, 4, 3))


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (lambda l: l(torch.randn(2, 5), torch.tensor([0, 20])), ValueError, "unknown label 20"),
        (lambda l: l(torch.randn(2, 5), torch.tensor([0, -1])), ValueError, "unknown label -1"),
        (lambda l: l(torch.randn(2, 4), torch.tensor([0, 1])), ValueError, "shape \\[B, 5\\]"),
        (lambda l: l(torch.randn(2, 5), torch.tensor([0.0, 1.0])), TypeError, "integer tensor"),
        (lambda l: l(torch.randn(2, 5), torch.tensor([0, 1, 2])), ValueError, "target must have shape"),
        (lambda l: l.topk(torch.randn(2, 5), 0), ValueError, "k must be"),
    ],
)
def test_errors(call, exc, message):
    layer = HierarchicalSoftmax(5, Tree.random(20, 3, 3))
    with pytest.raises(exc, match=message):
        call(layer)


def test_flat_softmax_interface():
    flat = FlatSoftmax(6, 30).double()
    h = torch.randn(8, 6, dtype=torch.double)
    y = torch.randint(0, 30, (8,))
    out = flat(h, y)
    torch.testing.assert_close(out.output, torch.log_softmax(flat.linear(h), 1)[torch.arange(8), y])
    assert (flat.predict(h) == flat.log_prob(h).argmax(1)).all()
    assert flat.topk(h, 3).indices.shape == (8, 3)


@settings(max_examples=20, deadline=None)
@given(k=st.integers(2, 80), m=st.integers(2, 6), seed=st.integers(0, 1000))
def test_full_distribution_sums_to_one(k, m, seed):
    tree = Tree.huffman(np.random.default_rng(seed).integers(1, 9, size=k), m) if seed % 2 else Tree.random(k, m, seed=seed)
    layer = _layer(tree, seed=seed)
    torch.testing.assert_close(layer.log_prob(torch.randn(3, 6, dtype=torch.double)).exp().sum(1), torch.ones(3, dtype=torch.double))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cpu_and_cuda_agree():
    tree = Tree.huffman(np.arange(1, 100), 4)
    layer = _layer(tree)
    h = torch.randn(16, 6, dtype=torch.double)
    y = torch.randint(0, tree.num_labels, (16,))
    cpu = layer(h, y).output
    gpu = layer.cuda()(h.cuda(), y.cuda()).output.cpu()
    torch.testing.assert_close(cpu, gpu)
    assert (layer.predict(h.cuda()).cpu() == layer.cpu().predict(h)).all()


# ---------------------------------------------------------------- fast paths against the reference
def _duplicate_heavy_targets(tree, batch, seed):
    """Zipf-like targets: a few labels repeated many times (groups of every bucket size)."""
    rng = np.random.default_rng(seed)
    probs = 1.0 / np.arange(1, tree.num_labels + 1) ** 1.5
    return torch.as_tensor(rng.choice(tree.num_labels, batch, p=probs / probs.sum()))


@pytest.mark.parametrize("tree", _trees(), ids=repr)
@pytest.mark.parametrize("sparse", [False, True])
def test_fast_forward_and_gradients_equal_reference(tree, sparse):
    layer = _layer(tree, seed=4)
    layer.sparse = sparse
    for batch, seed in ((1, 0), (23, 1), (300, 2)):  # 300 rows: groups far larger than the bucket base
        y = _duplicate_heavy_targets(tree, batch, seed)
        h = torch.randn(batch, 6, dtype=torch.double, requires_grad=True)
        upstream = torch.randn(batch, dtype=torch.double)  # a non-uniform gradient of the outputs
        fast = layer(h, y).output
        ref = layer.forward_reference(h, y).output
        torch.testing.assert_close(fast, ref)
        got = torch.autograd.grad((fast * upstream).sum(), [h, layer.weight, layer.bias])
        want = torch.autograd.grad((ref * upstream).sum(), [h, layer.weight, layer.bias])
        for g, w in zip(got, want):
            assert g.is_sparse == (sparse and g.shape != h.shape)
            torch.testing.assert_close(g.to_dense(), w.to_dense())


def test_fast_sparse_gradient_has_one_row_per_node():
    tree = Tree.random(300, 7, 3, seed=0)
    layer = HierarchicalSoftmax(5, tree, sparse=True)
    y = torch.tensor([3] * 50 + list(range(40)))
    layer(torch.randn(len(y), 5), y).loss.backward()
    rows = layer.weight.grad._indices()[0]
    assert rows.numel() == np.unique(tree.path_nodes[y.numpy()]).size == torch.unique(rows).numel()


def test_fast_forward_collects_the_same_statistics_as_the_reference():
    from hsm.statistics import NodeStatistics

    for tree in (Tree.random(60, 4, 3, seed=0), Tree.huffman(np.arange(1, 30), 3)):
        layer = _layer(tree, seed=1)
        h = torch.randn(40, 6, dtype=torch.double)
        y = _duplicate_heavy_targets(tree, 40, 3)
        layer.statistics = NodeStatistics(tree, dtype=torch.double)
        layer(h, y)
        expected = NodeStatistics(tree, dtype=torch.double)
        nodes, mask = layer.path_nodes[y], layer.path_mask[y]
        probs = torch.softmax(layer.node_logits(h, nodes), dim=-1)
        expected.accumulate(y, probs, mask)
        torch.testing.assert_close(layer.statistics.sum_probas, expected.sum_probas)
        torch.testing.assert_close(layer.statistics.path_counts, expected.path_counts)
        torch.testing.assert_close(layer.statistics.label_counts, expected.label_counts)


@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_fast_predict_is_exact_for_confident_and_uniform_models(tree):
    for scale in (0.01, 8.0):  # near uniform: the search visits everything; confident: it prunes
        layer = _layer(tree, scale=scale, seed=5)
        h = torch.randn(33, 6, dtype=torch.double)
        labels, visited = hsm.search.top1(layer, h)
        assert (labels == layer.log_prob(h).argmax(1)).all()
        assert (visited >= 1).all()


def test_grouped_evaluation_in_chunks(monkeypatch):
    """Exact search on an untrained layer evaluates more pairs than one chunk holds."""
    tree = Tree.random(200, 6, 3, seed=0)
    layer = _layer(tree, scale=0.01)
    h = torch.randn(8, 6, dtype=torch.double)
    example = np.repeat(np.arange(8), tree.num_nodes)
    node = np.tile(np.arange(tree.num_nodes), 8)
    whole = hsm.backend.pair_log_softmax(layer, h, example, node)
    import hsm.backend as backend_module

    monkeypatch.setattr(backend_module, "PAIR_CHUNK", 37)
    torch.testing.assert_close(hsm.backend.pair_log_softmax(layer, h, example, node), whole)
    expected = torch.log_softmax(layer.node_logits(h[example], torch.as_tensor(node)[:, None])[:, 0], -1)
    torch.testing.assert_close(whole, expected)


def test_fast_path_trains_like_the_reference():
    """A few SGD and Adagrad steps with the fast path and the reference give the same parameters."""
    tree = Tree.random(120, 5, 3, seed=0)
    for opt_class in (torch.optim.SGD, torch.optim.Adagrad):
        layers = [_layer(tree, seed=2) for _ in range(2)]
        for layer in layers:
            layer.sparse = True
        opts = [opt_class(layer.parameters(), lr=0.1) for layer in layers]
        for step in range(4):
            h = torch.randn(16, 6, dtype=torch.double)
            y = _duplicate_heavy_targets(tree, 16, step)
            for layer, opt, fn in zip(layers, opts, ("forward", "forward_reference")):
                opt.zero_grad()
                getattr(layer, fn)(h, y).loss.backward()
                opt.step()
        torch.testing.assert_close(layers[0].weight, layers[1].weight)
        torch.testing.assert_close(layers[0].bias, layers[1].bias)



@pytest.mark.parametrize("tree", _trees()[:4], ids=repr)
def test_inference_path_reuses_buffers_correctly(tree):
    """Under no_grad the forward takes the inference path (shared gather buffers): batches of
    growing and shrinking size must still equal the reference."""
    layer = _layer(tree, seed=6)
    for batch, seed in ((5, 0), (200, 1), (3, 2), (64, 3)):
        h = torch.randn(batch, 6, dtype=torch.double)
        y = _duplicate_heavy_targets(tree, batch, seed)
        with torch.no_grad():
            got = layer(h, y)
        torch.testing.assert_close(got.output, layer.forward_reference(h, y).output.detach())
        assert not got.output.requires_grad


def test_each_name_has_one_home_and_the_package_exports_it():
    """The optimisers live in hsm.optim and the input checks in hsm._checks; hsm.layers keeps no
    aliases of them (hsm exports the optimisers)."""
    import hsm
    import hsm.layers as layers
    from hsm import _checks, optim

    assert hsm.RowSparseAdagrad is optim.RowSparseAdagrad and hsm.RowSparseSGD is optim.RowSparseSGD
    assert layers.NonFiniteInputError is _checks.NonFiniteInputError is hsm.NonFiniteInputError
    for alias in ("RowSparseAdagrad", "RowSparseSGD", "_check_input", "_check_k", "_merge_topk"):
        assert not hasattr(layers, alias), alias


def test_flat_softmax_refuses_overflowing_logits_on_the_cpu():
    from hsm.layers import NonFiniteInputError

    torch.manual_seed(0)
    flat = FlatSoftmax(4, 12)
    with torch.no_grad():
        flat.linear.weight.abs_()
    hidden = torch.randn(5, 4)
    hidden[3] = 3e38  # finite, but W h (four positive terms) overflows float32
    with pytest.raises(NonFiniteInputError, match=r"overflow float32 in 1 of 5 rows \(rows \[3\]\)"):
        flat(hidden, torch.zeros(5, dtype=torch.long))
    for call in (flat.log_prob, flat.predict, lambda h: flat.topk(h, 2)):
        with pytest.raises(NonFiniteInputError, match="overflow"):
            call(hidden)
    # the other rows are fine on their own
    assert torch.isfinite(flat.log_prob(hidden[:3])).all()


def test_flat_softmax_reads_nothing_back_from_another_device():
    """Off the CPU the overflow test would wait for the device at every step: it is left out. On
    the meta device any read of a value fails, so the log-softmax there proves none happens."""
    flat = FlatSoftmax(4, 12).to("meta")
    out = flat._log_softmax(torch.empty(5, 4, device="meta"))
    assert out.shape == (5, 12) and out.device.type == "meta"
