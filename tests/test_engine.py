"""hsm.engine: the static torch engine (``engine="torch"``) against the reference and the compiled
kernels, and what a GPU needs of it, counted on the CPU (which runs the same aten ops): no
host-device synchronisation, the same ops and shapes for every batch, few launches, and
``torch.compile(fullgraph=True)`` without recompiling."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hsm
from hsm.op_count import OpCounter
from hsm.engine import adagrad_rows_
from hsm.layers import HierarchicalSoftmax
from hsm.optim import RowSparseAdagrad
from hsm.tree import Tree


def _trees():
    return [
        Tree.random(50, 4, 3, seed=1),  # fixed depth with unused leaves (empty slots)
        Tree.random(27, 3, 3, seed=2),  # exactly full
        Tree.huffman(np.arange(1, 38), 3),  # variable depth
        Tree.huffman(np.arange(1, 21), 4),  # with dummy leaves
        Tree.huffman(np.arange(1, 20), 2),  # binary
        Tree.from_taxonomy({"a": ["x", "y", "z"], "b": ["w"], "c": ["u", "v"]}, list("xyzwuv")),  # ragged
    ]


def _pair(tree, d=6, sparse=False, dtype=torch.float64, seed=0):
    """A static-engine layer and a copy on the default engine, with the same parameters."""
    torch.manual_seed(seed)
    layers = [HierarchicalSoftmax(d, tree, sparse=sparse, engine=e).to(dtype) for e in ("torch", "auto")]
    with torch.no_grad():
        layers[0].weight.mul_(3.0)
        layers[0].bias.normal_()
    layers[1].load_state_dict(layers[0].state_dict())
    return layers


def _grad(param):
    return param.grad.to_dense() if param.grad.is_sparse else param.grad


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_values_and_gradients_equal_the_reference(tree, sparse):
    layer, _ = _pair(tree, sparse=sparse)
    h = torch.randn(23, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, tree.num_labels, (23,))
    out = layer(h, y)
    grads = torch.autograd.grad(out.loss, [h, layer.weight, layer.bias])
    ref = layer.forward_reference(h, y)
    ref_grads = torch.autograd.grad(ref.loss, [h, layer.weight, layer.bias])
    torch.testing.assert_close(out.output, ref.output)
    torch.testing.assert_close(out.loss, ref.loss)
    for got, want in zip(grads, ref_grads):
        dense = [g.to_dense() if g.is_sparse else g for g in (got, want)]
        torch.testing.assert_close(*dense)


def test_ignore_index_reduction_and_leading_dims_as_the_default_engine():
    tree = Tree.huffman(np.arange(1, 38), 3)
    for reduction in ("mean", "sum"):
        static, default = _pair(tree)
        for layer in (static, default):
            layer.reduction = reduction
        h = torch.randn(3, 5, 6, dtype=torch.float64)
        y = torch.randint(0, tree.num_labels, (3, 5))
        y[0, 1] = y[2, 4] = -100
        outs = []
        for layer in (static, default):
            x = h.clone().requires_grad_()
            out = layer(x, y)
            out.loss.backward()
            outs.append((out.output, out.loss, x.grad, layer.weight.grad, layer.bias.grad))
        for got, want in zip(*outs):
            torch.testing.assert_close(got, want)
        assert outs[0][0][0, 1] == 0 and (outs[0][2][0, 1] == 0).all()


def test_bad_input_is_named_or_gives_nan():
    tree = Tree.random(50, 4, 3, seed=1)
    layer = HierarchicalSoftmax(6, tree, engine="torch")
    with pytest.raises(ValueError, match="unknown label 50"):
        layer(torch.randn(4, 6), torch.tensor([0, 50, 1, 2]))
    with pytest.raises(ValueError, match="unknown label -3"):
        layer(torch.randn(4, 6), torch.tensor([0, -3, 1, 2]))
    with pytest.raises(TypeError, match="dtype"):
        layer(torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 1, 2]))
    with pytest.raises(ValueError, match="shape"):
        layer(torch.randn(4, 5), torch.tensor([0, 1, 1, 2]))
    with pytest.raises(ValueError, match="engine must be"):
        HierarchicalSoftmax(6, tree, engine="gpu")
    h = torch.randn(4, 6)
    h[2, 3] = math.nan  # no check reads the device: the loss says it, as F.cross_entropy's does
    assert math.isnan(float(layer(h, torch.tensor([0, 1, 1, 2])).loss.detach()))


def test_empty_batch():
    layer = HierarchicalSoftmax(6, Tree.random(50, 4, 3, seed=1), sparse=True, engine="torch")
    h = torch.randn(0, 6, requires_grad=True)
    out = layer(h, torch.zeros(0, dtype=torch.long))
    assert out.output.shape == (0,) and math.isnan(float(out.loss.detach()))


@pytest.mark.parametrize("tree", _trees()[:4], ids=repr)
def test_statistics_equal_the_default_engines(tree):
    static, default = _pair(tree, dtype=torch.float32)
    learners = [hsm.TreeLearner(layer, reassign_every=10**6) for layer in (static, default)]
    for step in range(3):
        h = torch.randn(19, 6)
        y = torch.randint(0, tree.num_labels, (19,))
        y[3] = -100
        for layer in (static, default):
            layer(h, y)
    for name in ("sum_probas", "path_counts", "label_counts"):
        torch.testing.assert_close(getattr(learners[0].statistics, name), getattr(learners[1].statistics, name),
                                   rtol=1e-5, atol=1e-6)


def test_adagrad_rows_sums_repeated_rows_first():
    torch.manual_seed(0)
    param = torch.randn(7, 3, 2, dtype=torch.float64)
    state = torch.full_like(param, 0.1)
    indices = torch.tensor([4, 1, 4, 4, 0, 1, 6])
    values = torch.randn(7, 3, 2, dtype=torch.float64)
    expected = param.clone()
    reference = torch.optim.Adagrad([expected := torch.nn.Parameter(expected)], lr=0.5, initial_accumulator_value=0.1)
    expected.grad = torch.sparse_coo_tensor(indices[None], values, param.shape, check_invariants=True).coalesce()
    reference.step = torch.no_grad()(reference.step)
    reference.step()
    adagrad_rows_(param, state, indices, values, 0.5, 1e-10)
    torch.testing.assert_close(param, expected.detach())
    torch.testing.assert_close(state, reference.state[expected]["sum"])


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.integers(0, 5), min_size=0, max_size=12), seed=st.integers(0, 100))
def test_adagrad_rows_equals_torch_adagrad_on_any_repetition(rows, seed):
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    values = torch.randn(len(rows), 3, generator=generator, dtype=torch.float64)
    indices = torch.tensor(rows, dtype=torch.long)
    param, state = start.clone(), torch.full_like(start, 0.2)
    adagrad_rows_(param, state, indices, values, 0.3, 1e-10)
    expected = torch.nn.Parameter(start.clone())
    reference = torch.optim.Adagrad([expected], lr=0.3, initial_accumulator_value=0.2)
    # the summed rows as a dense gradient: an untouched row's zero gradient changes nothing either
    expected.grad = torch.zeros_like(start).index_add_(0, indices, values)
    reference.step()
    torch.testing.assert_close(param, expected.detach())
    torch.testing.assert_close(state, reference.state[expected]["sum"])


def test_dense_gradients_on_the_static_engine_equal_torch_adagrad():
    tree = Tree.random(50, 4, 3, seed=1)
    layers = [HierarchicalSoftmax(6, tree, engine="torch") for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    optimizers = [RowSparseAdagrad(layers[0].parameters(), lr=0.2, engine="torch"),
                  torch.optim.Adagrad(layers[1].parameters(), lr=0.2)]
    for step in range(3):
        h, y = torch.randn(9, 6), torch.randint(0, 50, (9,))
        for layer, optimizer in zip(layers, optimizers):
            layer(h, y).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    torch.testing.assert_close(layers[0].weight, layers[1].weight)


# ------------------------------------------------------------------ what a GPU needs, counted on the CPU

_SIZES = [pytest.param((4_000, 16), id="V=4000,M=16"), pytest.param((250_000, 65), id="V=250k,M=65")]
_DIM, _BATCH = 32, 128


def _batches(num_labels, seed=0):
    """Zipf, all one label, spread out (every kind of node sharing), twice."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, num_labels + 1) ** 1.1
    kinds = [lambda: rng.choice(num_labels, _BATCH, p=zipf / zipf.sum()), lambda: np.full(_BATCH, 7),
             lambda: rng.permutation(num_labels)[:_BATCH]]
    return [(torch.randn(_BATCH, _DIM), torch.as_tensor(kind())) for kind in kinds * 2]


@pytest.fixture(scope="module", params=_SIZES)
def big(request):
    num_labels, arity = request.param
    return Tree.random(num_labels, arity, 3, seed=0)


def _layer_and_optimizer(tree, engine="torch"):
    torch.manual_seed(0)
    layer = HierarchicalSoftmax(_DIM, tree, sparse=True, engine=engine)
    return layer, RowSparseAdagrad(layer.parameters(), lr=0.1, initial_accumulator_value=0.1, engine=engine)


def test_steps_never_synchronise_and_repeat_the_same_ops(big):
    torch.manual_seed(0)
    layer = HierarchicalSoftmax(_DIM, big, sparse=True, engine="torch")
    model = torch.nn.Linear(_DIM, _DIM)  # the user's model in front of the layer, in the same optimiser
    optimizer = RowSparseAdagrad([*model.parameters(), *layer.parameters()], lr=0.1, initial_accumulator_value=0.1,
                                 engine="torch")
    train, test = [], []
    for h, y in _batches(big.num_labels):
        with OpCounter() as counter:
            out = layer(model(h), y)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        train.append(counter)
        with torch.no_grad(), OpCounter() as counter:
            layer(h, y)
        test.append(counter)
    # the layer's 60 (test below) and the Linear's: forward, backward, a dense Adagrad step of 2 tensors
    for counters, limit in ((train, 60 + 12), (test, 16)):
        assert all(not c.synchronising for c in counters), [op.name for c in counters for op in c.synchronising]
        assert all(c.signature == counters[0].signature for c in counters)
        assert len(counters[0].launching) <= limit, [op.name for op in counters[0].launching]


def test_a_layer_alone_launches_at_most_60_ops_per_training_step(big):
    layer, optimizer = _layer_and_optimizer(big)
    h, y = _batches(big.num_labels)[0]
    with OpCounter() as counter:
        layer(h.requires_grad_(), y).loss.backward()
        optimizer.step()
    assert len(counter.launching) <= 60 and not counter.synchronising


def test_statistics_add_no_synchronisation(big):
    layer, _ = _layer_and_optimizer(big)
    hsm.TreeLearner(layer, reassign_every=10**6)
    signatures = []
    for h, y in _batches(big.num_labels)[:3]:
        with OpCounter() as counter:
            layer(h, y).loss.backward()
        layer.zero_grad()
        assert not counter.synchronising
        signatures.append(counter.signature)
    assert signatures[0] == signatures[1] == signatures[2]


def test_compiles_without_graph_breaks_or_recompiles(big):
    import torch._dynamo

    torch._dynamo.reset()
    layer, optimizer = _layer_and_optimizer(big)
    hsm.TreeLearner(layer, reassign_every=10**6)
    step = torch.compile(lambda h, y: layer(h, y).loss, fullgraph=True, dynamic=False, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for h, y in _batches(big.num_labels):
            loss = step(h, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            assert math.isfinite(float(loss.detach()))
    torch._dynamo.reset()


def test_three_steps_equal_the_compiled_kernels_with_row_sparse_adagrad():
    tree = Tree.random(250_000, 65, 3, seed=0)
    static, static_opt = _layer_and_optimizer(tree, "torch")
    default, default_opt = _layer_and_optimizer(tree, "auto")
    assert torch.equal(static.weight, default.weight)
    for h, y in _batches(tree.num_labels)[:3]:
        for layer, optimizer in ((static, static_opt), (default, default_opt)):
            layer(h, y).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for name in ("weight", "bias"):
        got, want = getattr(static, name), getattr(default, name)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.detach().abs().max()))
        torch.testing.assert_close(static_opt.state[got]["sum"], default_opt.state[want]["sum"], rtol=1e-5, atol=1e-9)


def test_a_new_tree_is_written_into_the_same_buffers():
    tree = Tree.random(4_000, 16, 3, seed=0)
    layer = HierarchicalSoftmax(_DIM, tree, engine="torch")
    addresses = {name: getattr(layer, name).data_ptr() for name in hsm.engine.TABLES}
    other = Tree.random(4_000, 16, 3, seed=5)
    layer.set_tree(other)
    assert {name: getattr(layer, name).data_ptr() for name in hsm.engine.TABLES} == addresses
    h, y = _batches(tree.num_labels)[0]
    torch.testing.assert_close(layer(h, y).output, layer.forward_reference(h, y).output)


def test_capture_step_needs_a_gpu():
    with pytest.raises(ValueError, match="CUDA graph"):
        hsm.engine.capture_step(lambda x: x, torch.zeros(2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_captured_step_equals_eager_steps_and_follows_a_new_tree():
    tree = Tree.random(4_000, 16, 3, seed=0)
    layers = [HierarchicalSoftmax(_DIM, tree, sparse=True, engine="torch").cuda() for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    optimizers = [RowSparseAdagrad(layer.parameters(), lr=0.1, initial_accumulator_value=0.1) for layer in layers]

    def stepper(layer, optimizer):
        def step(h, y):
            optimizer.zero_grad(set_to_none=True)
            loss = layer(h, y).loss
            loss.backward()
            optimizer.step()
            return loss.detach()
        return step

    batches = [(h.cuda(), y.cuda()) for h, y in _batches(tree.num_labels)]
    replay = hsm.engine.capture_step(stepper(layers[0], optimizers[0]), *batches[0], warmup=1)
    eager = stepper(layers[1], optimizers[1])
    eager(*batches[0]), eager(*batches[0])  # the warm-up step and the captured one
    for number, (h, y) in enumerate(batches[1:]):
        if number == 2:
            for layer in layers:
                layer.set_tree(Tree.random(4_000, 16, 3, seed=9))
        torch.testing.assert_close(replay(h, y), eager(h, y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layers[0].weight, layers[1].weight, rtol=1e-5, atol=1e-6)


def test_a_shallower_tree_keeps_the_tables_and_feeds_the_statistics():
    deep = Tree.from_nested([[0, [1, [2, 3]]], [4, 5]], num_labels=6, arity=2)
    shallow = Tree.from_nested([[0, 1], [[2, 3], [4, 5]]], num_labels=6, arity=2)
    assert (deep.max_depth, shallow.max_depth, deep.num_nodes) == (4, 3, shallow.num_nodes)
    layer = HierarchicalSoftmax(5, deep, engine="torch")
    learner = hsm.TreeLearner(layer, reassign_every=10**6)
    address = layer.engine_paths.data_ptr()
    layer.set_tree(shallow)
    learner.statistics.on_reassign(shallow)
    assert layer.engine_paths.data_ptr() == address
    h, y = torch.randn(7, 5), torch.tensor([0, 1, 2, 3, 4, 5, 5])
    torch.testing.assert_close(layer(h, y).output, layer.forward_reference(h, y).output)
    assert float(learner.statistics.path_counts.sum()) == 2 + 2 + 3 + 3 + 3 + 3 * 2  # the steps of the 7 paths


@pytest.mark.parametrize("scale", [1.0, 5.0])
@pytest.mark.parametrize("tree", _trees(), ids=repr)
def test_topk_and_predict_are_exact(tree, scale):
    layer, _ = _pair(tree)
    with torch.no_grad():
        layer.weight.mul_(scale / 3.0)
    h = torch.randn(40, 6, dtype=torch.float64)
    full = layer.log_prob(h)
    k = min(3, tree.num_labels)
    top = layer.topk(h, k)
    torch.testing.assert_close(top.values, full.topk(k, dim=1).values)
    torch.testing.assert_close(full.gather(1, top.indices), top.values)  # the labels have those values
    assert (layer.predict(h) == full.argmax(1)).all()
    assert layer.topk(h[:0], k).values.shape == (0, k)


def test_topk_of_a_confident_model_reads_the_device_once():
    tree = Tree.random(4096, 16, 3, seed=0)
    layer = HierarchicalSoftmax(8, tree, engine="torch")
    with torch.no_grad():
        layer.weight.mul_(20.0)
    h = torch.randn(64, 8)
    with OpCounter() as counter:
        top = hsm.engine.topk(layer, h, 2)
    assert [op.name for op in counter.synchronising] == ["aten.nonzero.default"]  # which rows are not proven
    torch.testing.assert_close(top[0], layer.log_prob(h).topk(2, dim=1).values)
    assert float(top[2].float().mean()) < 0.1 * tree.num_nodes


def test_a_whole_language_model_step_reads_nothing_back():
    """The log-bilinear model (sparse embeddings), the tree layer on the static engine, the row-sparse
    Adagrad over both and Algorithm 1's statistics: a whole training step that a CUDA graph can
    capture (no synchronisation), the same operations for every batch."""
    from hsm.models import LogBilinearLM

    torch.manual_seed(0)
    vocab, dim, context = 2_000, 16, 4
    model = LogBilinearLM(vocab, dim, context, sparse=True)
    model.use_kernels = False  # the torch path, what a GPU runs
    layer = HierarchicalSoftmax(dim, Tree.random(vocab, 13, 3, seed=0), sparse=True, engine="torch")
    optimizer = RowSparseAdagrad(list(model.parameters()) + list(layer.parameters()), lr=0.05,
                                 initial_accumulator_value=0.1, engine="torch")
    learner = hsm.TreeLearner(layer, reassign_every=10**9)

    def step(contexts, targets):
        optimizer.zero_grad(set_to_none=True)
        layer(model(contexts), targets).loss.backward()
        optimizer.step()
        learner.step()

    batches = [(torch.randint(0, vocab, (32, context)), torch.randint(0, vocab, (32,))) for _ in range(3)]
    step(*batches[0])
    sequences = []
    for contexts, targets in batches:
        with OpCounter() as counter:
            step(contexts, targets)
        assert counter.synchronising == []
        sequences.append([(op.name, op.shapes) for op in counter.launching])
    assert sequences[0] == sequences[1] == sequences[2]
    with pytest.raises(ValueError, match="word ids must lie in 0..1999, got 0..2000"):
        model(torch.tensor([[0, 1, 2, vocab]]))
