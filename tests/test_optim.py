"""hsm.optim: the row-sparse optimisers against torch.optim's Adagrad and SGD, alone and through
the layer's sparse gradients (compiled and PyTorch paths), and the Adagrad update fused into the
layer's compiled backward."""
import copy

import numpy as np
import pytest
import torch

from hsm.layers import HierarchicalSoftmax
from hsm.optim import FusedGradient, RowSparseAdagrad, RowSparseSGD
from hsm.tree import Tree


def _zipf_targets(tree, batch, seed):
    """A few labels repeated many times (node groups of every size), as in tests/test_layers.py."""
    weights = 1.0 / np.arange(1, tree.num_labels + 1) ** 1.5
    labels = np.random.default_rng(seed).choice(tree.num_labels, batch, p=weights / weights.sum())
    return torch.as_tensor(labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_sparse_adagrad_matches_torch_adagrad(dtype):
    tree = Tree.random(110, 5, 3, seed=0)
    layers = [HierarchicalSoftmax(6, tree, sparse=True).to(dtype) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    dense = torch.randn(4, 6, dtype=dtype)
    extra = [torch.nn.Parameter(dense.clone()) for _ in range(2)]  # a dense parameter
    opts = [RowSparseAdagrad(list(layers[0].parameters()) + [extra[0]], lr=0.3, lr_decay=0.01,
                             initial_accumulator_value=0.1),
            torch.optim.Adagrad(list(layers[1].parameters()) + [extra[1]], lr=0.3, lr_decay=0.01,
                                initial_accumulator_value=0.1)]
    for step in range(4):
        h = torch.randn(20, 6, dtype=dtype)
        y = _zipf_targets(tree, 20, step)
        for layer, opt, param in zip(layers, opts, extra):
            opt.zero_grad()
            (layer(h @ param.t() @ param / 10, y).loss).backward()
            opt.step()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    torch.testing.assert_close(layers[0].weight, layers[1].weight, **tol)
    torch.testing.assert_close(layers[0].bias, layers[1].bias, **tol)
    torch.testing.assert_close(extra[0], extra[1], **tol)


def test_row_sparse_adagrad_sums_duplicate_rows_and_checks_settings():
    params = [torch.nn.Parameter(torch.zeros(5, 3)) for _ in range(2)]
    opts = [RowSparseAdagrad([params[0]], lr=1.0), torch.optim.Adagrad([params[1]], lr=1.0)]
    grad = torch.sparse_coo_tensor(torch.tensor([[1, 3, 1]]), torch.ones(3, 3), (5, 3))  # row 1 twice
    for param, opt in zip(params, opts):
        param.grad = grad.clone()
        opt.step()
    torch.testing.assert_close(params[0], params[1])
    with pytest.raises(ValueError, match="invalid Adagrad"):
        RowSparseAdagrad(params, lr=-1)


def test_row_sparse_sgd_matches_torch_sgd():
    """Sparse steps (rows listed twice: both added), a dense step, and the settings check."""
    params = [torch.nn.Parameter(torch.arange(15.0).view(5, 3)) for _ in range(2)]
    opts = [RowSparseSGD([params[0]], lr=0.5), torch.optim.SGD([params[1]], lr=0.5)]
    sparse = torch.sparse_coo_tensor(torch.tensor([[1, 3, 1]]), torch.randn(3, 3), (5, 3))  # row 1 twice
    for grad in (sparse, torch.randn(5, 3)):
        for param, opt in zip(params, opts):
            param.grad = grad.clone()
            opt.step()
        torch.testing.assert_close(params[0], params[1])
    with pytest.raises(ValueError, match="invalid SGD"):
        RowSparseSGD(params, lr=0)


def test_row_sparse_sgd_trains_the_layer_like_torch_sgd():
    """Through the layer's sparse gradients (kernels and PyTorch paths alike)."""
    tree = Tree.random(60, 4, 3, seed=1)
    layers = [HierarchicalSoftmax(8, tree, sparse=True) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    opts = [RowSparseSGD(layers[0].parameters(), lr=0.3), torch.optim.SGD(layers[1].parameters(), lr=0.3)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        h, y = torch.randn(16, 8, generator=gen), torch.randint(0, 60, (16,), generator=gen)
        for layer, opt in zip(layers, opts):
            opt.zero_grad()
            layer(h, y).loss.backward()
            opt.step()
    torch.testing.assert_close(layers[0].weight, layers[1].weight)
    torch.testing.assert_close(layers[0].bias, layers[1].bias)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_sparse_adagrad_dense_parameters_match_torch_adagrad(dtype):
    """Dense gradients (the compiled one-pass update for contiguous CPU tensors; a non-contiguous
    gradient takes torch's ops) give torch.optim.Adagrad's parameters and state, step by step."""
    torch.manual_seed(0)
    start = [torch.randn(7, 5, dtype=dtype), torch.randn(3, dtype=dtype)]
    params = [[torch.nn.Parameter(p.clone()) for p in start] for _ in range(2)]
    opts = [RowSparseAdagrad(params[0], lr=0.2, lr_decay=0.05, initial_accumulator_value=0.1),
            torch.optim.Adagrad(params[1], lr=0.2, lr_decay=0.05, initial_accumulator_value=0.1)]
    for step in range(5):
        grads = [torch.randn(7, 5, dtype=dtype), torch.randn(3, dtype=dtype)]
        for group, opt in zip(params, opts):
            group[0].grad = grads[0].clone() if step % 2 else grads[0].t().contiguous().t()  # non-contiguous too
            group[1].grad = grads[1].clone()
            opt.step()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    for got, want in zip(params[0], params[1]):
        torch.testing.assert_close(got, want, **tol)
        torch.testing.assert_close(opts[0].state[got]["sum"], opts[1].state[want]["sum"], **tol)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_adagrad_is_the_unfused_update_bit_for_bit(threads, bias, monkeypatch):
    """RowSparseAdagrad.fuse(layer): the update applied inside the compiled backward gives the
    parameters and the Adagrad state of the unfused optimiser exactly (and torch.optim.Adagrad's
    within float32 rounding), on one thread and on two, with node groups large enough for the
    BLAS branch (the root: all 40 examples) and small ones; the fused layer gets no gradient."""
    from hsm import kernels
    monkeypatch.setattr(kernels, "MIN_WORK_PER_THREAD", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tree = Tree.random(300, 7, 3, seed=1)
        layers = [HierarchicalSoftmax(6, tree, bias=bias, sparse=True) for _ in range(3)]
        for layer in layers[1:]:
            layer.load_state_dict(layers[0].state_dict())
        opts = [RowSparseAdagrad(layers[0].parameters(), lr=0.2, lr_decay=0.01, initial_accumulator_value=0.1),
                RowSparseAdagrad(layers[1].parameters(), lr=0.2, lr_decay=0.01, initial_accumulator_value=0.1),
                torch.optim.Adagrad(layers[2].parameters(), lr=0.2, lr_decay=0.01, initial_accumulator_value=0.1)]
        opts[0].fuse(layers[0])
        for step in range(4):
            h = torch.randn(40, 6)
            y = _zipf_targets(tree, 40, step)
            for layer, opt in zip(layers, opts):
                opt.zero_grad(set_to_none=True)
                x = h.clone().requires_grad_()
                layer(x, y).loss.backward()
                if layer is layers[0]:
                    assert isinstance(layer.weight.grad, FusedGradient) and x.grad is not None
                opt.step()
        for name in ("weight",) + (("bias",) if bias else ()):
            fused, plain, reference = (getattr(layer, name) for layer in layers)
            assert torch.equal(fused, plain)
            assert torch.equal(opts[0].state[fused]["sum"], opts[1].state[plain]["sum"])
            assert opts[0].state[fused]["step"] == opts[1].state[plain]["step"] == 4
            torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
    finally:
        torch.set_num_threads(before)


def test_fuse_checks_the_layer_and_the_parameters():
    layer = HierarchicalSoftmax(4, Tree.random(20, 3, 3, seed=0), sparse=True)
    with pytest.raises(ValueError, match="parameters of this optimiser"):
        RowSparseAdagrad([layer.weight], lr=0.1).fuse(layer)
    with pytest.raises(ValueError, match="one parameter group"):
        RowSparseAdagrad([{"params": [layer.weight]}, {"params": [layer.bias]}], lr=0.1).fuse(layer)
    with pytest.raises(TypeError, match="HierarchicalSoftmax"):
        RowSparseAdagrad(layer.parameters(), lr=0.1).fuse(torch.nn.Linear(2, 2))
    # a float64 layer keeps its gradients (the compiled update is float32 only) and step() applies them
    layer64 = HierarchicalSoftmax(4, Tree.random(20, 3, 3, seed=0), sparse=True).double()
    opt = RowSparseAdagrad(layer64.parameters(), lr=0.1)
    opt.fuse(layer64)
    start = layer64.weight.detach().clone()
    layer64(torch.randn(5, 4, dtype=torch.double), torch.tensor([0, 1, 2, 3, 4])).loss.backward()
    assert layer64.weight.grad is not None
    opt.step()
    assert not torch.equal(layer64.weight, start)


# --- TreeModelOptimizer: a body's optimiser and the layer's fused Adagrad as one -----------------------------


def _body_and_layer(seed=0, sparse=True):
    torch.manual_seed(seed)
    body = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh())
    layer = HierarchicalSoftmax(8, Tree.random(40, 4, 3, seed=seed), sparse=sparse)
    return body, layer


def _train(body, layer, optimizer, scheduler=None, steps=4, clip=None):
    draw = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=draw), torch.randint(0, 40, (16,), generator=draw)
        layer(body(x), y).loss.backward()
        if clip is not None:
            optimizer.clip_grad_norm_(clip)
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()


def test_tree_model_optimizer_is_the_two_optimisers_stepped_together():
    from hsm import TreeModelOptimizer

    body, layer = _body_and_layer()
    body2, layer2 = _body_and_layer()
    pair = TreeModelOptimizer(torch.optim.AdamW(body.parameters(), lr=1e-2), layer, lr=0.2)
    _train(body, layer, pair)
    adamw, adagrad = torch.optim.AdamW(body2.parameters(), lr=1e-2), RowSparseAdagrad(layer2.parameters(), lr=0.2)

    class Both:
        def step(self):
            adamw.step(), adagrad.step()

        def zero_grad(self):
            adamw.zero_grad(), adagrad.zero_grad()

    _train(body2, layer2, Both())
    for a, b in zip(list(body.parameters()) + list(layer.parameters()), list(body2.parameters()) + list(layer2.parameters())):
        # the fused update is the unfused one bit for bit; AdamW's arithmetic is the same on both sides
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("schedule_layer", [False, True])
def test_a_scheduler_drives_the_body_and_the_layer_only_when_asked(schedule_layer):
    from hsm import TreeModelOptimizer

    body, layer = _body_and_layer()
    pair = TreeModelOptimizer(torch.optim.AdamW(body.parameters(), lr=1e-2), layer, lr=0.2, schedule_layer=schedule_layer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(pair, lambda step: 0.5 ** step)
    _train(body, layer, pair, scheduler, steps=3, clip=1.0)
    assert pair.body.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5 ** 3)
    assert pair.layer_optimizer.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5 ** 3 if schedule_layer else 0.2)


def test_tree_model_optimizer_state_resumes_the_same_trajectory():
    from hsm import TreeModelOptimizer

    body, layer = _body_and_layer()
    pair = TreeModelOptimizer(torch.optim.AdamW(body.parameters(), lr=1e-2), layer)
    _train(body, layer, pair, steps=2)
    saved = copy.deepcopy((body.state_dict(), layer.state_dict(), pair.state_dict()))  # the in-place steps would edit them
    _train(body, layer, pair, steps=2)
    body2, layer2 = _body_and_layer(seed=5)
    body2.load_state_dict(saved[0]), layer2.load_state_dict(saved[1])
    pair2 = TreeModelOptimizer(torch.optim.AdamW(body2.parameters(), lr=1e-2), layer2)
    pair2.load_state_dict(saved[2])
    _train(body2, layer2, pair2, steps=2)
    for a, b in zip(list(body.parameters()) + list(layer.parameters()), list(body2.parameters()) + list(layer2.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_tree_model_optimizer_refuses_what_would_update_a_parameter_twice_or_nothing():
    from hsm import TreeModelOptimizer

    body, layer = _body_and_layer()
    everything = list(body.parameters()) + list(layer.parameters())
    with pytest.raises(ValueError, match="also in the body's optimiser"):
        TreeModelOptimizer(torch.optim.SGD(everything, lr=0.1), layer)
    with pytest.raises(TypeError, match="body must be"):
        TreeModelOptimizer(list(body.parameters()), layer)
    with pytest.raises(TypeError, match="layer must be an hsm.HierarchicalSoftmax"):
        TreeModelOptimizer(torch.optim.SGD(body.parameters(), lr=0.1), torch.nn.Linear(8, 40))
    pair = TreeModelOptimizer(torch.optim.SGD(body.parameters(), lr=0.1), layer)
    with pytest.raises(ValueError, match="not a TreeModelOptimizer state"):
        pair.load_state_dict(pair.body.state_dict())
