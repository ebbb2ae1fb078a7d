"""The output layer with PyTorch's standard tools: torch.compile, torch.autocast (bf16), TF32
matmul settings, gradient clipping, torch's optimisers and DistributedDataParallel, for dense
(``sparse=False``) and sparse (``sparse=True``) node gradients."""
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.parallel import DistributedDataParallel

import hsm
from hsm.distributed import average_gradients, broadcast_parameters

D_IN, D = 8, 6


def _tree() -> hsm.Tree:
    return hsm.Tree.random(num_labels=50, arity=4, depth=3, seed=0)


class _Model(torch.nn.Module):
    """An encoder and the tree softmax: what a user compiles, autocasts or wraps in DDP."""

    def __init__(self, sparse: bool, use_kernels: bool = True, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Linear(D_IN, D).to(dtype)
        self.layer = hsm.HierarchicalSoftmax(D, _tree(), sparse=sparse).to(dtype)
        self.layer.use_kernels = use_kernels

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.layer(torch.tanh(self.encoder(x)), y).loss


def _batch(size: int = 7, seed: int = 1, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, D_IN, generator=generator).to(dtype),
            torch.randint(0, _tree().num_labels, (size,), generator=generator))


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone() for name, p in model.named_parameters()}


def _loss_and_grads(model: torch.nn.Module, forward, x, y):
    model.zero_grad(set_to_none=True)
    loss = forward(x, y)
    loss.backward()
    return loss.detach(), _grads(model)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ------------------------------------------------------------------ torch.compile


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_gives_the_eager_loss_and_gradients(backend, sparse):
    model = _Model(sparse)
    x, y = _batch()
    loss, grads = _loss_and_grads(model, model, x, y)
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):  # the second call runs the cached graphs
        got_loss, got_grads = _loss_and_grads(model, compiled, x, y)
        torch.testing.assert_close(got_loss, loss)
        for name in grads:
            torch.testing.assert_close(got_grads[name], grads[name], msg=name)
    assert model.layer.weight.grad.is_sparse == sparse


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_on_the_pytorch_path(backend):
    # use_kernels=False: the implementation that runs on a GPU
    model = _Model(sparse=False, use_kernels=False)
    x, y = _batch()
    loss, grads = _loss_and_grads(model, model, x, y)
    got_loss, got_grads = _loss_and_grads(model, torch.compile(model, backend=backend), x, y)
    torch.testing.assert_close(got_loss, loss)
    for name in grads:
        torch.testing.assert_close(got_grads[name], grads[name], msg=name)


def test_compile_of_the_inference_methods():
    model = _Model(sparse=False)
    x, _ = _batch()
    h = torch.tanh(model.encoder(x))

    def infer(x):
        h = torch.tanh(model.encoder(x))
        return model.layer.log_prob(h), model.layer.predict(h), model.layer.topk(h, 3)

    with torch.no_grad():
        log_prob, predicted, top = torch.compile(infer, backend="aot_eager")(x)
        torch.testing.assert_close(log_prob, model.layer.log_prob(h))
        assert torch.equal(predicted, model.layer.predict(h))
        assert torch.equal(top.indices, model.layer.topk(h, 3).indices)


def test_compile_with_the_layer_inside_a_tree_learner_loop():
    # Algorithm 1's statistics are collected by the (eager) layer inside the compiled model
    model = _Model(sparse=True)
    learner = hsm.TreeLearner(model.layer, reassign_every=2)
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = hsm.RowSparseAdagrad(model.layer.parameters(), lr=0.1)
    for step in range(4):
        x, y = _batch(seed=step)
        optimizer.zero_grad()
        compiled(x, y).backward()
        optimizer.step()
        learner.step()
    assert learner.steps == 4
    assert torch.isfinite(model.layer.weight).all()


# ------------------------------------------------------------------ autocast and TF32


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "pytorch"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_autocast_bf16_computes_the_layer_in_float32(sparse, use_kernels):
    model = _Model(sparse, use_kernels)
    x, y = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.tanh(model.encoder(x))
        out = model.layer(h, y)
        log_prob = model.layer.log_prob(h)
        predicted = model.layer.predict(h)
    assert h.dtype == torch.bfloat16
    assert out.output.dtype == out.loss.dtype == log_prob.dtype == torch.float32
    # exactly the float32 computation on the bf16-rounded input
    reference = model.layer(h.detach().float(), y)
    torch.testing.assert_close(out.output, reference.output)
    torch.testing.assert_close(log_prob, model.layer.log_prob(h.detach().float()))
    assert torch.equal(predicted, model.layer.predict(h.detach().float()))
    # and the float32 model within bf16's precision (the encoder ran in bf16)
    loss32, grads32 = _loss_and_grads(model, model, x, y)
    torch.testing.assert_close(out.loss.detach(), loss32, rtol=2e-2, atol=2e-2)
    model.zero_grad(set_to_none=True)
    out.loss.backward()
    grads = _grads(model)
    assert model.layer.weight.grad.is_sparse == sparse
    for name in grads32:
        assert grads[name].dtype == torch.float32
        torch.testing.assert_close(grads[name], grads32[name], rtol=5e-2, atol=2e-2, msg=name)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "pytorch"])
def test_the_decoders_called_directly_run_in_float32_under_autocast(use_kernels):
    # hsm.search's decoders (which the benchmark calls for the nodes a search visits) take a bf16
    # input as the layer's own predict does: converted to float32, searched with autocast off
    from hsm import search

    model = _Model(sparse=True, use_kernels=use_kernels)
    x, _ = _batch(size=9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.tanh(model.encoder(x))
        labels, visited = search.top1(model.layer, h)
        exact = search.exact_topk(model.layer, h, 3, 4)
        beam = search.beam_search(model.layer, h, 3, 4)
    assert h.dtype == torch.bfloat16
    h32 = h.detach().float()
    want_labels, want_visited = search.top1(model.layer, h32)
    assert torch.equal(labels, want_labels) and torch.equal(visited, want_visited)
    for got, want in ((exact, search.exact_topk(model.layer, h32, 3, 4)), (beam, search.beam_search(model.layer, h32, 3, 4))):
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "pytorch"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_backward_inside_the_autocast_region_gives_the_same_gradients(sparse, use_kernels):
    # loss.backward() inside ``with torch.autocast``: the layer's backward runs in float32 too
    grads = []
    for inside in (False, True):
        model = _Model(sparse, use_kernels)
        x, y = _batch()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        grads.append(_grads(model))
    for name in grads[0]:
        assert grads[1][name].dtype == torch.float32
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0, msg=name)


def test_the_log_bilinear_model_trains_inside_an_autocast_region():
    from hsm.models import LogBilinearLM

    for use_kernels in (True, False):
        torch.manual_seed(0)
        model = LogBilinearLM(30, dim=8, context=3, sparse=True)
        model.use_kernels = use_kernels
        contexts = torch.randint(0, 30, (5, 3))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(contexts).float().square().sum().backward()
        assert model.embedding.weight.grad is not None


def test_autocast_leaves_an_input_of_another_dtype_refused():
    # only the autocast dtype is converted: a float64 input is still the caller's mistake
    model = _Model(sparse=False)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="dtype torch.float64"):
        model.layer(torch.zeros(2, D, dtype=torch.float64), torch.zeros(2, dtype=torch.long))


def test_autocast_with_flat_softmax():
    flat = hsm.FlatSoftmax(D, 20)
    h = torch.randn(5, D).bfloat16()
    y = torch.arange(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = flat(h, y)
    assert out.loss.dtype == torch.float32
    torch.testing.assert_close(out.output, flat(h.float(), y).output)


def test_autocast_inside_a_compiled_model():
    model = _Model(sparse=False)
    x, y = _batch()

    def forward(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x, y)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = model(x, y)
    got = torch.compile(forward, backend="aot_eager")(x, y)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, eager, rtol=1e-2, atol=1e-2)
    got.backward()
    assert torch.isfinite(model.encoder.weight.grad).all()


@pytest.fixture
def _tf32():
    precision = torch.get_float32_matmul_precision()
    cuda_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = cuda_tf32


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "pytorch"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_tf32_matmul_settings(_tf32, sparse, use_kernels):
    # a no-op on CPU (the setting is for GPUs' matmuls): the layer runs and gives float32 values
    model = _Model(sparse, use_kernels)
    x, y = _batch()
    loss, grads = _loss_and_grads(model, model, x, y)
    reference = model.layer.forward_reference(torch.tanh(model.encoder(x)), y).loss
    torch.testing.assert_close(loss, reference.detach(), rtol=1e-2, atol=1e-3)
    assert all(torch.isfinite(g).all() for g in grads.values())


# ------------------------------------------------------------------ clipping


def _sparse_model_grads(seed: int = 1):
    model = _Model(sparse=True)
    x, y = _batch(seed=seed)
    model(x, y).backward()
    return model


def test_torch_clip_grad_norm_fails_on_sparse_gradients_and_hsm_clips_them():
    model = _sparse_model_grads()
    with pytest.raises((NotImplementedError, RuntimeError)):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    dense = _grads(model)
    expected_total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in dense.values()]))
    total = hsm.clip_grad_norm_(model.parameters(), 0.1)
    torch.testing.assert_close(total, expected_total)
    scale = 0.1 / (expected_total + 1e-6)
    clipped = _grads(model)
    for name in dense:
        torch.testing.assert_close(clipped[name], dense[name] * scale, msg=name)
    assert model.layer.weight.grad.is_sparse


def test_hsm_clip_grad_norm_sums_duplicate_rows_first():
    # two backward passes leave an uncoalesced gradient (rows listed twice): its norm is that of the sum
    model = _Model(sparse=True, use_kernels=False)
    for seed in (1, 2):
        model(*_batch(seed=seed)).backward()
    dense = _grads(model)
    total = hsm.clip_grad_norm_(model.parameters(), 1e6, norm_type=2.0)
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in dense.values()]))
    torch.testing.assert_close(total, expected)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, dense[name], msg=name)  # below max_norm: unchanged


@settings(max_examples=30, deadline=None)
@given(max_norm=st.floats(1e-3, 10.0), norm_type=st.sampled_from([1.0, 2.0, 3.0, float("inf")]),
       seed=st.integers(0, 1000))
def test_hsm_clip_grad_norm_is_torchs_on_dense_and_on_densified_sparse_gradients(max_norm, norm_type, seed):
    rng = np.random.default_rng(seed)
    shapes = [(5, 3), (4,), (6, 2)]
    grads = [torch.as_tensor(rng.normal(size=s), dtype=torch.float32) for s in shapes]
    # the same gradients, the first and last as sparse row gradients with a duplicate row split in two
    dense_params = [torch.zeros(s, requires_grad=True) for s in shapes]
    torch_params = [torch.zeros(s, requires_grad=True) for s in shapes]
    mixed_params = [torch.zeros(s, requires_grad=True) for s in shapes]
    for g, a, b, c in zip(grads, dense_params, torch_params, mixed_params):
        a.grad, b.grad = g.clone(), g.clone()
        if g.dim() == 2:
            rows = torch.tensor([[0, 1, 1, *range(2, g.shape[0])]])
            values = torch.cat([g[:1], g[1:2] / 2, g[1:2] / 2, g[2:]])
            c.grad = torch.sparse_coo_tensor(rows, values, g.shape, check_invariants=True)
        else:
            c.grad = g.clone()
    expected = torch.nn.utils.clip_grad_norm_(torch_params, max_norm, norm_type)
    torch.testing.assert_close(hsm.clip_grad_norm_(dense_params, max_norm, norm_type), expected)
    torch.testing.assert_close(hsm.clip_grad_norm_(mixed_params, max_norm, norm_type), expected)
    for a, b, c in zip(dense_params, torch_params, mixed_params):
        assert torch.equal(a.grad, b.grad)
        torch.testing.assert_close(c.grad.to_dense(), b.grad)


def test_hsm_clip_grad_norm_on_a_dense_layer_is_torchs():
    model = _Model(sparse=False)
    model(*_batch()).backward()
    twins = {name: torch.nn.Parameter(p.detach().clone()) for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        twins[name].grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(twins.values(), 0.05)
    torch.testing.assert_close(hsm.clip_grad_norm_(model.parameters(), 0.05), expected)
    for name, grad in _grads(model).items():
        assert torch.equal(grad, twins[name].grad), name
    weight = model.layer.weight  # a single tensor, as torch takes it
    torch.testing.assert_close(hsm.clip_grad_norm_(weight, 1e6), torch.linalg.vector_norm(weight.grad))


# ------------------------------------------------------------------ optimisers

_OPTIMISERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "Adagrad": lambda params: torch.optim.Adagrad(params, lr=0.1),
    "SparseAdam": lambda params: torch.optim.SparseAdam(params, lr=0.01),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01),
    "RowSparseAdagrad": lambda params: hsm.RowSparseAdagrad(params, lr=0.1),
    "RowSparseSGD": lambda params: hsm.RowSparseSGD(params, lr=0.1),
}
#: (optimiser, sparse) pairs torch refuses, with the words of its error
_REFUSED = {("SparseAdam", False): "does not support dense gradients",
            ("AdamW", True): "does not support sparse gradients"}


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("name", list(_OPTIMISERS))
def test_optimisers_on_the_layers_gradients(name, sparse):
    model = _Model(sparse)
    optimizer = _OPTIMISERS[name](model.layer.parameters())
    encoder_optimizer = torch.optim.SGD(model.encoder.parameters(), lr=0.1)
    x, y = _batch(size=32)
    if (name, sparse) in _REFUSED:
        model(x, y).backward()
        with pytest.raises(RuntimeError, match=_REFUSED[name, sparse]):
            optimizer.step()
        return
    before = model(x, y).item()
    for _ in range(10):
        optimizer.zero_grad()
        encoder_optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()
        encoder_optimizer.step()
    assert model(x, y).item() < before


# ------------------------------------------------------------------ DistributedDataParallel

STEPS, GLOBAL_BATCH = 3, 8


def _train(mode: str, sparse: bool, rank: int | None = None, world: int = 1) -> dict[str, torch.Tensor]:
    """Three SGD steps; rank None: one process on the whole batches. ``mode`` "wrapped": the
    whole model in DDP; "outside": the encoder in DDP, the layer outside with average_gradients."""
    model = _Model(sparse)
    forward = model
    if rank is not None:
        if mode == "wrapped":
            forward = DistributedDataParallel(model)
        else:
            model.encoder = DistributedDataParallel(model.encoder)
            broadcast_parameters(model.layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        x, y = _batch(GLOBAL_BATCH, seed=10 + step)
        if rank is not None:
            share = GLOBAL_BATCH // world
            x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        optimizer.zero_grad()
        forward(x, y).backward()
        if rank is not None and mode == "outside":
            average_gradients(model.layer)
        optimizer.step()
    layer = model.layer
    return {"weight": layer.weight.detach().clone(), "bias": layer.bias.detach().clone()}


_DDP_CASES = [("wrapped", False), ("outside", False), ("outside", True)]


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {f"{mode}-{sparse}": _train(mode, sparse, rank, world) for mode, sparse in _DDP_CASES}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_tools")
    mp.spawn(_ddp_worker, args=(2, str(out / "init"), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.parametrize("mode,sparse", _DDP_CASES, ids=["wrapped-dense", "outside-dense", "outside-sparse"])
def test_ddp_two_ranks_match_one_process(ddp_results, mode, sparse):
    single = _train(mode, sparse)
    for rank in ddp_results:
        got = rank[f"{mode}-{sparse}"]
        for name in single:
            torch.testing.assert_close(got[name], single[name], rtol=1e-4, atol=1e-5, msg=name)
