"""The output layers as a drop-in for ``F.cross_entropy``: ``ignore_index``, ``reduction`` and
inputs ``[..., d]`` with targets ``[...]``, on the compiled and the PyTorch path, gradients
included, with the fused optimiser and with Algorithm 1's statistics."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hsm import FlatSoftmax, HierarchicalSoftmax, RowSparseAdagrad, Tree, TreeLearner

K, D = 7, 5


def one_node_layer(use_kernels: bool, sparse: bool = False, **options) -> HierarchicalSoftmax:
    """A tree of one node with K children: the layer is then a flat softmax (eq. 5 with L = 1)."""
    torch.manual_seed(0)
    layer = HierarchicalSoftmax(D, Tree.random(K, K, 1, seed=3), sparse=sparse, **options)
    with torch.no_grad():
        layer.bias.normal_()  # non-zero biases, so that their gradient is checked too
    layer.use_kernels = use_kernels
    return layer


def label_logits(layer: HierarchicalSoftmax, h: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor) -> torch.Tensor:
    """The flat logits [..., K] of a one-node layer, labels in label order (slot m holds label
    ``child_label[0, m]``)."""
    slot_logits = h @ weight.view(K, D).t() + bias[0]
    order = torch.as_tensor(np.argsort(layer.tree.child_label[0]))
    return slot_logits[..., order]


def batch(shape=(3, 4), ignored=((0, 3), (1, 2), (1, 3), (2, 0)), seed=1):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(*shape, D, generator=generator)
    y = torch.randint(0, K, shape, generator=generator)
    for index in ignored:
        y[index] = -100
    return h, y


@pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "pytorch"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(3, 4), (12,)], ids=["BxT", "B"])
def test_matches_cross_entropy_with_gradients(use_kernels, reduction, shape):
    layer = one_node_layer(use_kernels, reduction=reduction)
    ignored = ((0, 3), (1, 2), (1, 3), (2, 0)) if len(shape) == 2 else ((3,), (7,), (8,))
    h, y = batch(shape, ignored)
    h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
    weight = layer.weight.detach().clone().requires_grad_()
    bias = layer.bias.detach().clone().requires_grad_()

    out = layer(h1, y)
    logits = label_logits(layer, h2, weight, bias)
    expected = F.cross_entropy(logits.reshape(-1, K), y.reshape(-1), reduction=reduction)
    per_row = -F.cross_entropy(logits.reshape(-1, K), y.reshape(-1), reduction="none").view(shape)

    assert out.output.shape == y.shape
    torch.testing.assert_close(out.output, per_row)  # 0 on the ignored rows
    assert (out.output[y == -100] == 0).all()
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    expected.backward()
    torch.testing.assert_close(h1.grad, h2.grad)
    assert (h1.grad[y == -100] == 0).all()
    torch.testing.assert_close(layer.weight.grad, weight.grad)
    torch.testing.assert_close(layer.bias.grad, bias.grad)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "pytorch"])
def test_other_ignore_index_and_unbatched_input(use_kernels):
    layer = one_node_layer(use_kernels, ignore_index=2)
    h, y = batch((10,), ())
    logits = label_logits(layer, h, layer.weight, layer.bias)
    torch.testing.assert_close(layer(h, y).loss, F.cross_entropy(logits, y, ignore_index=2))
    # one row, as F.cross_entropy takes it: input [d], target []
    one = layer(h[0], y[0])
    assert one.output.shape == ()
    torch.testing.assert_close(one.output, layer(h[:1], y[:1]).output[0])


@pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "pytorch"])
def test_every_row_ignored(use_kernels):
    """Nothing to average: NaN mean (as F.cross_entropy), 0 sum, zero gradients."""
    for reduction in ("mean", "sum"):
        layer = one_node_layer(use_kernels, reduction=reduction)
        h = torch.randn(2, 3, D, requires_grad=True)
        y = torch.full((2, 3), -100)
        out = layer(h, y)
        assert (out.output == 0).all() and out.output.shape == (2, 3)
        reference = F.cross_entropy(torch.randn(6, K), y.view(-1), reduction=reduction)
        assert torch.isnan(out.loss) == torch.isnan(reference) and (reduction == "mean") == bool(torch.isnan(out.loss))
        if reduction == "sum":
            assert out.loss.item() == 0.0
            out.loss.backward()
            assert not h.grad.any()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_flat_softmax_matches_cross_entropy(reduction):
    torch.manual_seed(0)
    flat = FlatSoftmax(D, K, reduction=reduction)
    reference = copy.deepcopy(flat)
    h, y = batch()
    h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
    out = flat(h1, y)
    expected = F.cross_entropy(reference.linear(h2).reshape(-1, K), y.reshape(-1), reduction=reduction)
    torch.testing.assert_close(out.loss, expected)
    assert out.output.shape == y.shape and (out.output[y == -100] == 0).all()
    out.loss.backward()
    expected.backward()
    torch.testing.assert_close(h1.grad, h2.grad)
    torch.testing.assert_close(flat.linear.weight.grad, reference.linear.weight.grad)
    torch.testing.assert_close(flat.linear.bias.grad, reference.linear.bias.grad)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "pytorch"])
def test_deep_tree_ignored_rows_are_as_if_absent(use_kernels):
    """On a real (3-level) tree: a batch with padding gives the loss, output and gradients of the
    batch without it, and sparse gradients stay sparse."""
    tree = Tree.random(40, 4, 3, seed=0)
    layers = [HierarchicalSoftmax(D, tree, sparse=True) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    for layer in layers:
        layer.use_kernels = use_kernels
    torch.manual_seed(2)
    h = torch.randn(4, 6, D)
    y = torch.randint(0, 40, (4, 6))
    y[:, 4:] = -100
    kept = y != -100
    padded = layers[0](h, y)
    plain = layers[1](h[kept], y[kept])
    torch.testing.assert_close(padded.loss, plain.loss)
    torch.testing.assert_close(padded.output[kept], plain.output)
    padded.loss.backward()
    plain.loss.backward()
    assert layers[0].weight.grad.is_sparse
    torch.testing.assert_close(layers[0].weight.grad.to_dense(), layers[1].weight.grad.to_dense())
    torch.testing.assert_close(layers[0].bias.grad.to_dense(), layers[1].bias.grad.to_dense())


def test_fused_adagrad_with_padding():
    """RowSparseAdagrad.fuse: the update inside the compiled backward of a padded batch is the
    unfused update of the same batch and the update of the batch without its padding."""
    tree = Tree.random(40, 4, 3, seed=0)
    layers = [HierarchicalSoftmax(D, tree, sparse=True) for _ in range(3)]
    for layer in layers[1:]:
        layer.load_state_dict(layers[0].state_dict())
    optimizers = [RowSparseAdagrad(layer.parameters(), lr=0.5) for layer in layers]
    optimizers[0].fuse(layers[0])
    generator = torch.Generator().manual_seed(4)
    for _ in range(3):
        h = torch.randn(5, 7, D, generator=generator)
        y = torch.randint(0, 40, (5, 7), generator=generator)
        y[torch.rand(5, 7, generator=generator) < 0.3] = -100
        kept = y != -100
        for index, (layer, optimizer) in enumerate(zip(layers, optimizers)):
            optimizer.zero_grad()
            out = layer(h[kept], y[kept]) if index == 2 else layer(h, y)
            out.loss.backward()
            optimizer.step()
    from hsm.optim import FusedGradient

    # the fused update wrote no gradient: only the placeholder that says so
    assert isinstance(layers[0].weight.grad, FusedGradient)
    for layer in layers[1:]:
        torch.testing.assert_close(layers[0].weight, layer.weight)
        torch.testing.assert_close(layers[0].bias, layer.bias)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "pytorch"])
def test_ignored_rows_stay_out_of_the_tree_statistics(use_kernels):
    """Algorithm 1's SumProbas / Counts after a padded batch are those of the batch without padding."""
    tree = Tree.random(30, 3, 4, seed=1)
    layers = [HierarchicalSoftmax(D, tree) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    learners = [TreeLearner(layer, reassign_every=10**6) for layer in layers]
    torch.manual_seed(3)
    h = torch.randn(6, 5, D)
    y = torch.randint(0, 30, (6, 5))
    y[::2, 3:] = -100
    kept = y != -100
    for layer in layers:
        layer.use_kernels = use_kernels
    layers[0](h, y)
    layers[1](h[kept], y[kept])
    first, second = (learner.statistics.state_dict() for learner in learners)
    for key in ("sum_probas", "path_counts", "label_counts"):
        torch.testing.assert_close(torch.as_tensor(first[key]), torch.as_tensor(second[key]))
    assert float(torch.as_tensor(first["label_counts"]).sum()) == int(kept.sum())


@pytest.mark.parametrize("make", [lambda: HierarchicalSoftmax(D, Tree.random(K, 3, 2, seed=0)),
                                  lambda: FlatSoftmax(D, K)], ids=["tree", "flat"])
def test_inference_takes_leading_dimensions(make):
    layer = make()
    h = torch.randn(2, 3, D)
    rows = h.reshape(6, D)
    assert torch.equal(layer.predict(h), layer.predict(rows).view(2, 3))
    torch.testing.assert_close(layer.log_prob(h), layer.log_prob(rows).view(2, 3, K))
    top, top_rows = layer.topk(h, 2), layer.topk(rows, 2)
    assert top.indices.shape == (2, 3, 2) and top.nodes_visited.shape == (2, 3)
    assert torch.equal(top.indices, top_rows.indices.view(2, 3, 2))
    assert layer.predict(h[:0]).shape == (0, 3)  # an empty batch keeps its shape


@pytest.mark.parametrize("call, exc, message", [
    (lambda: HierarchicalSoftmax(D, Tree.random(K, 3, 2), reduction="none"), ValueError, "reduction must be"),
    (lambda: FlatSoftmax(D, K, reduction="avg"), ValueError, "reduction must be"),
    (lambda: FlatSoftmax(D, K, ignore_index=1.5), TypeError, "ignore_index"),
    (lambda: FlatSoftmax(D, K)(torch.randn(2, 3, D), torch.zeros(2, 4, dtype=torch.long)), ValueError,
     r"target must have shape \[2, 3\]"),
    (lambda: FlatSoftmax(D, K)(torch.randn(2, 3, D + 1), torch.zeros(2, 3, dtype=torch.long)), ValueError,
     r"input must have shape \[B, 5\] or \[\.\.\., 5\]"),
    (lambda: HierarchicalSoftmax(D, Tree.random(K, 3, 2))(torch.randn(2, D), torch.tensor([-100, K])),
     ValueError, f"unknown label {K}"),
])
def test_bad_options_and_shapes(call, exc, message):
    with pytest.raises(exc, match=message):
        call()
