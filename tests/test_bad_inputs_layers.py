"""Reliability of the layer, tree, learner and optimisers: bad input gets a named error,
odd input (an empty batch) a defined result, and a checkpoint round-trips the learned tree.

Every layer check runs on the compiled CPU path (float32, ``use_kernels=True``) and on the
PyTorch path (``use_kernels=False``, what runs on a GPU) where the two differ."""
import json
import warnings

import numpy as np
import pytest
import torch

from hsm.layers import FlatSoftmax, HierarchicalSoftmax, NonFiniteInputError
from hsm.optim import RowSparseAdagrad, RowSparseSGD
from hsm.sampling import SampledSoftmax, class_frequencies
from hsm.statistics import NodeStatistics
from hsm_lab.synthetic import planted_hierarchy
from hsm.training import TreeLearner, train_epoch
from hsm.tree import Tree

PATHS = pytest.mark.parametrize("kernels", [True, False], ids=["compiled", "torch"])


def _layer(kernels: bool, tree: Tree | None = None, d: int = 5, sparse: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    layer = HierarchicalSoftmax(d, tree or Tree.random(20, 3, 3, seed=0), sparse=sparse)
    layer.use_kernels = kernels
    return layer


def _data():
    return planted_hierarchy(num_groups=3, labels_per_group=3, dim=8, num_examples=600, seed=2)


def _batches(data, start=0, stop=600, size=50):
    return [(data.x[i:i + size], data.y[i:i + size]) for i in range(start, stop, size)]


# ---------------------------------------------------------------------------------------------
# 1. the learned tree is part of the layer's state dict

def _trained(kernels: bool, sparse: bool = False):
    """A layer trained with Algorithm 1 until its tree differs from the initial one."""
    data = _data()
    initial = Tree.random(9, 3, 2, seed=0)
    torch.manual_seed(0)
    layer = HierarchicalSoftmax(8, initial, sparse=sparse)
    layer.use_kernels = kernels
    learner = TreeLearner(layer, reassign_every=3)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    train_epoch(torch.nn.Identity(), layer, _batches(data), opt, learner)
    assert layer.tree != initial and not layer.tree.same_partition(initial)  # the tree was learned
    return data, initial, layer, learner


@PATHS
def test_state_dict_carries_the_learned_tree(tmp_path, kernels):
    data, initial, layer, _ = _trained(kernels)
    torch.save(layer.state_dict(), tmp_path / "layer.pt")
    state = torch.load(tmp_path / "layer.pt")  # weights_only=True, torch's default
    fresh = HierarchicalSoftmax(8, initial)
    fresh.use_kernels = kernels
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "the state dict has no tree" warning
        result = fresh.load_state_dict(state)
    assert not result.missing_keys and not result.unexpected_keys
    assert fresh.tree == layer.tree
    h = data.x[:40]
    for path_kernels in (True, False):  # the loaded layer on both paths, against the saved one
        fresh.use_kernels = layer.use_kernels = path_kernels
        assert torch.equal(fresh.log_prob(h), layer.log_prob(h))
        assert torch.equal(fresh.predict(h), layer.predict(h))
        assert torch.equal(fresh(h, data.y[:40]).output, layer(h, data.y[:40]).output)
        top_a, top_b = fresh.topk(h, 3), layer.topk(h, 3)
        assert torch.equal(top_a.indices, top_b.indices) and torch.equal(top_a.values, top_b.values)
    # the float64 torch path too (the reference the kernels are tested against)
    ref = HierarchicalSoftmax(8, initial).double()
    ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    assert ref.tree == layer.tree
    torch.testing.assert_close(ref.log_prob(h.double()), layer.log_prob(h).double(), rtol=1e-5, atol=1e-5)
    assert torch.equal(ref.predict(h.double()), layer.predict(h))


def test_state_dict_tree_encoding_is_compact_and_safe():
    tree = Tree.random(250_000, 65, 3, seed=0)
    layer = HierarchicalSoftmax(1, tree)  # d = 1: only the encoding's size matters here
    state = layer.get_extra_state()
    assert state.dtype == torch.int64 and state.numel() == 2 * tree.num_nodes * tree.arity + 9
    assert state.numel() * 8 < 5 * 2**20  # 4.5 MB beside 223 MB of weights at d = 200
    other = HierarchicalSoftmax(1, Tree.random(250_000, 65, 3, seed=1))
    other.load_state_dict(layer.state_dict())
    assert other.tree == tree


def test_state_dict_of_another_shape_is_refused_before_loading_anything():
    saved = HierarchicalSoftmax(5, Tree.random(9, 3, 2, seed=0)).state_dict()
    for layer, shape in [(HierarchicalSoftmax(5, Tree.random(8, 3, 2, seed=0)), "K=8, M=3, N=4, in_features=5"),
                         (HierarchicalSoftmax(5, Tree.random(9, 2, 4, seed=0)), "K=9, M=2, N=15, in_features=5"),
                         (HierarchicalSoftmax(6, Tree.random(9, 3, 2, seed=0)), "K=9, M=3, N=4, in_features=6")]:
        before = layer.weight.detach().clone()
        expected = f"holds a layer with K=9, M=3, N=4, in_features=5; this layer has {shape}"
        with pytest.raises(RuntimeError, match=expected):
            layer.load_state_dict(saved)
        assert torch.equal(layer.weight, before)  # nothing copied


def test_state_dict_without_a_tree_loads_with_a_warning():
    """State dicts written before the tree was part of them still load (strict), keeping the tree."""
    layer = HierarchicalSoftmax(5, Tree.random(9, 3, 2, seed=0))
    old = {k: v for k, v in layer.state_dict().items() if k != "_extra_state"}
    other = HierarchicalSoftmax(5, Tree.random(9, 3, 2, seed=1))
    with pytest.warns(UserWarning, match="has no tree"):
        result = other.load_state_dict(old)
    assert not result.missing_keys
    assert other.tree == Tree.random(9, 3, 2, seed=1) and torch.equal(other.weight, layer.weight)


def test_damaged_tree_in_state_dict_is_an_error():
    layer = HierarchicalSoftmax(5, Tree.random(300, 3, 6, seed=0))
    other = HierarchicalSoftmax(5, Tree.random(300, 3, 6, seed=1))
    state = layer.state_dict()
    # float16 cannot hold node ids above 2048: the checksum notices
    with pytest.raises(RuntimeError, match="damaged"):
        other.load_state_dict({**state, "_extra_state": state["_extra_state"].half()})
    # bfloat16 rounds even the small numbers of the header: named as the damaging cast it is
    with pytest.raises(RuntimeError, match="damaged: it was cast to bfloat16, which rounds its integers"):
        other.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()})
    with pytest.raises(RuntimeError, match="not the tree of an hsm"):
        other.load_state_dict({**state, "_extra_state": {"tree": "x"}})
    edited = state["_extra_state"].clone()
    edited[-1] += 1
    with pytest.raises(RuntimeError, match="damaged"):
        other.load_state_dict({**state, "_extra_state": edited})
    assert other.tree == Tree.random(300, 3, 6, seed=1)
    # float64 and float32 casts (state dicts mapped through .double() / .float()) are exact
    for cast in (torch.float64, torch.float32):
        other.load_state_dict({k: v.to(cast) for k, v in state.items()})
        assert other.tree == layer.tree


@PATHS
def test_layer_and_learner_checkpoint_resumes_training_identically(tmp_path, kernels):
    data = _data()
    initial = Tree.random(9, 3, 2, seed=0)

    def build():
        torch.manual_seed(0)
        layer = HierarchicalSoftmax(8, initial, sparse=True)
        layer.use_kernels = kernels
        learner = TreeLearner(layer, reassign_every=3)
        return layer, learner, RowSparseAdagrad(layer.parameters(), lr=0.3)

    layer, learner, opt = build()
    train_epoch(torch.nn.Identity(), layer, _batches(data, 0, 300), opt, learner)
    assert layer.tree != initial
    torch.save({"layer": layer.state_dict(), "learner": learner.state_dict(), "opt": opt.state_dict()},
               tmp_path / "ckpt.pt")
    train_epoch(torch.nn.Identity(), layer, _batches(data, 300, 600), opt, learner)

    fresh, fresh_learner, fresh_opt = build()
    state = torch.load(tmp_path / "ckpt.pt")  # weights_only=True
    fresh.load_state_dict(state["layer"])
    fresh_learner.load_state_dict(state["learner"])
    fresh_opt.load_state_dict(state["opt"])
    train_epoch(torch.nn.Identity(), fresh, _batches(data, 300, 600), fresh_opt, fresh_learner)

    assert fresh.tree == layer.tree and fresh_learner.steps == learner.steps == 12
    assert len(fresh_learner.history) == len(learner.history) == 4
    torch.testing.assert_close(fresh.weight, layer.weight, rtol=0, atol=0)
    torch.testing.assert_close(fresh.bias, layer.bias, rtol=0, atol=0)
    torch.testing.assert_close(fresh_learner.statistics.sum_probas, learner.statistics.sum_probas, rtol=0, atol=0)


def test_loading_a_tree_realigns_attached_statistics():
    """Loading only the layer's state while a learner is attached: the statistics follow the new
    tree (no stale node ids, no out-of-range depth), and training goes on."""
    data, initial, layer, _ = _trained(kernels=True)
    fresh = HierarchicalSoftmax(8, initial)
    learner = TreeLearner(fresh, reassign_every=100)
    fresh.load_state_dict(layer.state_dict())
    expected = torch.as_tensor(np.where(layer.tree.path_mask, layer.tree.path_nodes, -1))
    assert torch.equal(learner.statistics.stat_node, expected)
    fresh.train()
    fresh(data.x[:50], data.y[:50]).loss.backward()
    assert learner.statistics.label_counts.sum() == 50


def _deferred(tree: Tree, kernels: bool) -> torch.nn.ModuleDict:
    """A model built on the ``meta`` device (PyTorch's deferred initialisation): no storage yet."""
    with torch.device("meta"):
        model = torch.nn.ModuleDict({"encoder": torch.nn.Linear(8, 8), "out": HierarchicalSoftmax(8, tree)})
    model["out"].use_kernels = kernels
    assert model["out"].weight.is_meta and model["out"].path_nodes.is_meta
    return model


def _agree(model: torch.nn.ModuleDict, layer: HierarchicalSoftmax, data) -> None:
    """``model["out"]`` computes what ``layer`` does, on both paths, from the same encoder output."""
    h, y = data.x[:40], data.y[:40]
    out = model["out"]
    assert out.tree == layer.tree
    for buffer in ("path_nodes", "path_children", "path_mask", "slot_mask", "child_node", "child_label"):
        assert torch.equal(getattr(out, buffer), getattr(layer, buffer)), buffer
    for path_kernels in (True, False):
        out.use_kernels = layer.use_kernels = path_kernels
        assert torch.equal(out(h, y).output, layer(h, y).output)
        assert torch.equal(out.log_prob(h), layer.log_prob(h))
        assert torch.equal(out.predict(h), layer.predict(h))
        assert torch.equal(out.topk(h, 3).indices, layer.topk(h, 3).indices)


@PATHS
@pytest.mark.parametrize("same_tree", [True, False], ids=["same-tree", "learned-tree"])
def test_layer_built_on_meta_then_to_empty_loads_exactly(kernels, same_tree):
    """``to_empty()`` leaves every buffer uninitialised, the tree-derived ones too (they are not in
    the state dict); loading must rebuild them even when the saved tree is the layer's own."""
    data, initial, layer, _ = _trained(kernels)
    model = _deferred(layer.tree if same_tree else initial, kernels)
    model.to_empty(device="cpu")
    with torch.no_grad():  # what uninitialised memory may hold: out-of-range ids, wrong masks
        for buffer in model["out"].buffers():
            buffer.copy_(torch.full_like(buffer, 7))
    saved = torch.nn.ModuleDict({"encoder": torch.nn.Linear(8, 8), "out": layer})
    result = model.load_state_dict(saved.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    _agree(model, layer, data)


@PATHS
@pytest.mark.parametrize("same_tree", [True, False], ids=["same-tree", "learned-tree"])
def test_layer_built_on_meta_loads_with_assign(kernels, same_tree):
    """``load_state_dict(assign=True)`` straight into the meta model: the parameters take the saved
    tensors and the tree-derived buffers move off ``meta`` with them; the model then trains."""
    data, initial, layer, _ = _trained(kernels)
    model = _deferred(layer.tree if same_tree else initial, kernels)
    saved = torch.nn.ModuleDict({"encoder": torch.nn.Linear(8, 8), "out": layer})
    model.load_state_dict({k: v.clone() for k, v in saved.state_dict().items()}, assign=True)
    out = model["out"]
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert isinstance(out.weight, torch.nn.Parameter) and out.weight.requires_grad
    _agree(model, layer, data)
    out.train()
    out(data.x[:50], data.y[:50]).loss.backward()
    assert out.weight.grad is not None and torch.isfinite(out.weight.grad).all()


def test_layer_built_on_meta_then_to_empty_and_reset_parameters_is_a_fresh_layer():
    """Without a state dict, ``reset_parameters()`` after ``to_empty()`` (how FSDP-style
    initialisers finish a deferred model) gives a usable layer: its tables are rebuilt too."""
    tree = Tree.random(20, 3, 3, seed=0)  # 27 slots for 20 labels: a slot penalty as well
    with torch.device("meta"):
        layer = HierarchicalSoftmax(5, tree)
    layer.to_empty(device="cpu")
    with torch.no_grad():
        for buffer in layer.buffers():
            buffer.copy_(torch.full_like(buffer, 7))
    layer.reset_parameters()
    fresh = HierarchicalSoftmax(5, tree)
    for name, buffer in fresh.named_buffers():
        assert torch.equal(dict(layer.named_buffers())[name], buffer), name
    torch.testing.assert_close(layer.log_prob(torch.randn(4, 5)).exp().sum(-1), torch.ones(4))


def test_statistics_refuse_paths_deeper_than_their_arrays():
    stats = NodeStatistics(Tree.random(9, 3, 2, seed=0))
    probs = np.full((2, 3), 1 / 3, dtype=np.float32)
    with pytest.raises(ValueError, match="on_reassign"):
        stats.accumulate_pairs(np.array([0]), np.array([0, 0]), np.array([0, 2]), probs)
    with pytest.raises(ValueError, match="children per node"):
        stats.accumulate_pairs(np.array([0]), np.array([0, 0]), np.array([0, 1]), probs[:, :2].copy())


def test_learner_load_state_dict_errors():
    learner = TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), 3)
    state = learner.state_dict()
    with pytest.raises(ValueError, match="lacks 'statistics'"):
        learner.load_state_dict({k: v for k, v in state.items() if k != "statistics"})
    with pytest.raises(ValueError, match="is a dict"):
        learner.load_state_dict([1, 2])
    other = TreeLearner(HierarchicalSoftmax(4, Tree.random(10, 3, 3)), 3)
    with pytest.raises(ValueError, match="built for"):
        other.load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# 5. NaN / inf input: one documented error on every path

def _calls():
    return {
        "forward": lambda layer, h: layer(h, torch.zeros(h.shape[0], dtype=torch.long)),
        "forward_reference": lambda layer, h: layer.forward_reference(h, torch.zeros(h.shape[0], dtype=torch.long)),
        "log_prob": lambda layer, h: layer.log_prob(h),
        "predict": lambda layer, h: layer.predict(h),
        "topk": lambda layer, h: layer.topk(h, 2),
        "topk_beam": lambda layer, h: layer.topk(h, 2, method="beam"),
    }


@PATHS
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("call", list(_calls()))
def test_non_finite_input_is_an_error_naming_the_rows(kernels, value, call):
    layer = _layer(kernels)
    h = torch.randn(4, 5)
    h[1, 2] = value
    h[3, 0] = value
    with pytest.raises(NonFiniteInputError, match=r"NaN or infinite values in 2 of 4 rows \(rows \[1, 3\]\)"):
        _calls()[call](layer, h)
    h.requires_grad_(True)
    with pytest.raises(ValueError, match="rows \\[1, 3\\]"):
        _calls()[call](layer, h)


def test_non_finite_input_flat_and_sampled_softmax():
    flat = FlatSoftmax(5, 20)
    sampled = SampledSoftmax(5, 20, class_frequencies(torch.arange(20), 20), num_negatives=3)
    h = torch.randn(3, 5)
    h[2, 4] = float("nan")
    for layer in (flat, sampled):
        for call in ("forward", "log_prob", "predict", "topk"):
            with pytest.raises(NonFiniteInputError, match=r"rows \[2\]"):
                _calls()[call](layer, h)


@PATHS
def test_large_finite_input_is_not_an_error(kernels):
    """The fast test sums the input; a sum that overflows is re-checked element by element (the
    weights are small enough that the logits stay finite)."""
    layer = _layer(kernels)
    with torch.no_grad():
        layer.weight.mul_(1e-10)
    h = torch.full((3, 5), 3e38)
    assert layer.predict(h).shape == (3,)


def test_train_epoch_reports_a_non_finite_representation_with_its_step():
    layer = HierarchicalSoftmax(4, Tree.random(9, 3, 2))
    y = torch.tensor([0, 1, 2])
    batches = [(torch.randn(3, 4), y), (torch.full((3, 4), float("nan")), y)]
    with pytest.raises(FloatingPointError, match="at step 1"):
        train_epoch(torch.nn.Identity(), layer, batches, torch.optim.SGD(layer.parameters(), lr=0.1))


# ---------------------------------------------------------------------------------------------
# 9. empty batches: empty in, empty out; the mean loss is NaN as torch's

@PATHS
@pytest.mark.parametrize("sparse", [False, True])
def test_empty_batch(kernels, sparse):
    layer = _layer(kernels, sparse=sparse)
    h = torch.zeros(0, 5, requires_grad=True)
    y = torch.zeros(0, dtype=torch.long)
    out = layer(h, y)
    reference = torch.nn.AdaptiveLogSoftmaxWithLoss(5, 20, [10])(torch.zeros(0, 5), y)
    assert out.output.shape == reference.output.shape == (0,)
    assert torch.isnan(out.loss) and torch.isnan(reference.loss)  # the mean of nothing
    out.loss.backward()
    assert h.grad.shape == (0, 5)
    for param in (layer.weight, layer.bias):
        grad = param.grad.to_dense() if param.grad.is_sparse else param.grad
        assert grad.shape == param.shape and not grad.any()
    before = layer.weight.detach().clone()
    (RowSparseAdagrad if sparse else RowSparseSGD)(layer.parameters(), lr=0.1).step()
    assert torch.equal(layer.weight, before)
    with torch.no_grad():
        assert layer(h, y).output.shape == (0,)
    assert layer.forward_reference(h, y).output.shape == (0,)
    assert layer.log_prob(h).shape == (0, 20)
    assert layer.predict(h).shape == (0,) and layer.predict(h).dtype == torch.long
    top = layer.topk(h, 3)
    assert top.values.shape == top.indices.shape == (0, 3) and top.nodes_visited.shape == (0,)
    assert layer.topk(h, 3, method="beam").indices.shape == (0, 3)


def test_empty_batch_collecting_statistics():
    layer = _layer(True)
    learner = TreeLearner(layer, reassign_every=1)
    layer.train()
    assert layer(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long)).output.shape == (0,)
    assert learner.statistics.label_counts.sum() == 0


def test_empty_batch_flat_and_sampled_softmax():
    freq = class_frequencies(torch.arange(20), 20)
    for layer in (FlatSoftmax(5, 20), SampledSoftmax(5, 20, freq, num_negatives=3),
                  SampledSoftmax(5, 20, freq, method="nce", num_negatives=3)):
        layer.train()
        out = layer(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long))
        assert out.output.shape == (0,) and torch.isnan(out.loss)
        assert layer.predict(torch.zeros(0, 5)).shape == (0,)
        assert layer.topk(torch.zeros(0, 5), 2).indices.shape == (0, 2)


# ---------------------------------------------------------------------------------------------
# 10. dtypes and devices; Tree sizes; Tree.load

@PATHS
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("call", list(_calls()))
def test_input_dtype_other_than_the_layers_is_a_type_error(kernels, dtype, call):
    layer = _layer(kernels)
    with pytest.raises(TypeError, match=f"input has dtype {dtype} but the layer's parameters are torch.float32"):
        _calls()[call](layer, torch.randn(3, 5).to(dtype))


def test_float32_input_into_float64_layer_and_other_layers():
    layer = _layer(False).double()
    with pytest.raises(TypeError, match="torch.float32 but the layer's parameters are torch.float64"):
        layer.predict(torch.randn(3, 5))
    with pytest.raises(TypeError, match="dtype torch.int64"):
        layer.log_prob(torch.zeros(3, 5, dtype=torch.long))
    sampled = SampledSoftmax(5, 20, class_frequencies(torch.arange(20), 20), num_negatives=3)
    for other in (FlatSoftmax(5, 20), sampled):
        for call in ("forward", "log_prob", "predict", "topk"):
            with pytest.raises(TypeError, match="torch.float64 but the layer's parameters are torch.float32"):
                _calls()[call](other, torch.randn(3, 5, dtype=torch.float64))


@PATHS
def test_input_on_another_device_is_named(kernels):
    layer = _layer(kernels)
    with pytest.raises(ValueError, match="input is on meta but the layer's parameters are on cpu"):
        layer.predict(torch.empty(3, 5, device="meta"))


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (lambda: Tree.random(10.5, 3, 3), TypeError, "num_labels must be an integer, got 10.5"),
        (lambda: Tree.random(True, 3, 3), TypeError, "num_labels must be an integer, got True"),
        (lambda: Tree.random(10, 3.0, 3), TypeError, "arity must be an integer"),
        (lambda: Tree.random(10, 3, 2.5), TypeError, "depth must be an integer"),
        (lambda: Tree.random(10, 3, 0), ValueError, "depth D must be >= 1"),
        (lambda: Tree.random(10, 1, None), ValueError, "arity M must be >= 2"),
        (lambda: Tree.balanced(np.arange(9), 3.5), TypeError, "arity must be an integer"),
        (lambda: Tree.complete([0, 1], 2, False), TypeError, "depth must be an integer"),
        (lambda: Tree.huffman([1, 2, 3], 2.5), TypeError, "arity must be an integer"),
        (lambda: Tree.from_nested([[0, 1], [2]], arity=2.0), TypeError, "arity must be an integer"),
        (lambda: Tree.from_nested([[0, 1], [2]], arity=1), ValueError, "arity M must be >= 2"),
        (lambda: Tree.from_nested([[0, 1], [2]], num_labels=3.0), TypeError, "num_labels must be an integer"),
        (lambda: Tree.from_clusters([0, 0, 1], 2.0, 2), TypeError, "arity must be an integer"),
        (lambda: Tree(np.array([[-1, -1]]), np.array([[0, 1]]), 2.0), TypeError, "num_labels must be an integer"),
        (lambda: Tree(np.array([[-1, -1]]), np.array([[0, 1]]), 2, depth_limit=0), ValueError, "depth_limit"),
        (lambda: Tree.from_dict([1, 2]), ValueError, "JSON object"),
        (lambda: Tree.from_dict({"format": "hsm.Tree/1", "arity": 2}), ValueError, "lacks 'num_labels', 'child_node'"),
        (lambda: Tree.from_dict({"format": "hsm.Tree/1", "arity": 2, "num_labels": 2, "child_node": [-1, -1, -1],
                                 "child_label": [0, 1]}), ValueError, "child_node must hold N \\* arity"),
        (lambda: Tree.from_dict({"format": "hsm.Tree/1", "arity": 2, "num_labels": 2, "child_node": ["a", -1],
                                 "child_label": [0, 1]}), TypeError, "child_node must hold integers, got 'a'"),
    ],
)
def test_tree_sizes_are_checked(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_tree_accepts_numpy_integers():
    tree = Tree.random(np.int64(20), np.int32(3), np.int64(3), seed=0)
    assert tree == Tree.random(20, 3, 3, seed=0)
    assert Tree.huffman([1, 2, 3, 4], np.int64(3)).arity == 3


def test_tree_load_names_the_file_and_the_problem(tmp_path):
    good = Tree.random(9, 3, 2, seed=0).save(tmp_path / "tree.json")
    truncated = tmp_path / "truncated.json"
    truncated.write_text(good.read_text()[:50])
    with pytest.raises(ValueError, match=r"truncated\.json: not valid JSON, truncated"):
        Tree.load(truncated)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match=r"list\.json: holds a JSON list, not an hsm tree"):
        Tree.load(listed)
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({k: v for k, v in json.loads(good.read_text()).items() if k != "child_label"}))
    with pytest.raises(ValueError, match=r"missing\.json: the hsm tree description lacks 'child_label'"):
        Tree.load(missing)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something"}))
    with pytest.raises(ValueError, match=r"other\.json: not an hsm tree description"):
        Tree.load(other)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x80\x81\xff")
    with pytest.raises(ValueError, match=r"binary\.json: not a tree file"):
        Tree.load(binary)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        Tree.load(tmp_path / "nowhere.json")
    assert Tree.load(good) == Tree.random(9, 3, 2, seed=0)


def test_layer_sizes_are_checked():
    with pytest.raises(TypeError, match="in_features must be an integer, got 5.5"):
        HierarchicalSoftmax(5.5, Tree.random(9, 3, 2))
    with pytest.raises(TypeError, match="tree must be an hsm.Tree"):
        HierarchicalSoftmax(5, Tree.random(9, 3, 2)).set_tree("tree.json")
    with pytest.raises(TypeError, match="num_labels must be an integer, got 10.5"):
        FlatSoftmax(5, 10.5)
    with pytest.raises(ValueError, match="in_features must be >= 1"):
        FlatSoftmax(0, 10)


# ---------------------------------------------------------------------------------------------
# 4. topk's k and beam; optimiser and learner settings

@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(k=2, method="beam", beam=0), ValueError, "beam must be >= 1"),
        (dict(k=2, method="beam", beam=-3), ValueError, "beam must be >= 1"),
        (dict(k=2, beam=-3), ValueError, "beam must be >= 1"),
        (dict(k=2, method="beam", beam=2.5), TypeError, "beam must be an integer"),
        (dict(k=2, method="beam", beam=True), TypeError, "beam must be an integer"),
        (dict(k=0), ValueError, "k must be in 1..20"),
        (dict(k=21), ValueError, "k must be in 1..20"),
        (dict(k=-1), ValueError, "k must be in 1..20"),
        (dict(k=2.0), TypeError, "k must be an integer"),
        (dict(k=True), TypeError, "k must be an integer"),
        (dict(k=2, method="greedy"), ValueError, "method must be 'exact' or 'beam'"),
    ],
)
def test_topk_arguments(kwargs, exc, message):
    h = torch.randn(3, 5)
    sampled = SampledSoftmax(5, 20, class_frequencies(torch.arange(20), 20), num_negatives=3)
    for layer in (_layer(True), _layer(False), FlatSoftmax(5, 20), sampled):
        with pytest.raises(exc, match=message):
            layer.topk(h, **kwargs)


def test_topk_valid_beam_and_numpy_k():
    layer = _layer(True)
    h = torch.randn(3, 5)
    narrow = layer.topk(h, 4, method="beam", beam=1)  # a width below k is widened to k
    assert torch.equal(narrow.indices, layer.topk(h, 4, method="beam", beam=4).indices)
    assert torch.equal(layer.topk(h, np.int64(2)).indices, layer.topk(h, 2).indices)


@pytest.mark.parametrize(
    "make, exc, message",
    [
        (lambda p: RowSparseAdagrad(p, lr=float("nan")), ValueError, "lr=nan"),
        (lambda p: RowSparseAdagrad(p, lr=float("inf")), ValueError, "lr=inf"),
        (lambda p: RowSparseAdagrad(p, lr=0.0), ValueError, "lr=0.0 \\(must be finite and > 0\\)"),
        (lambda p: RowSparseAdagrad(p, lr=-1), ValueError, "lr=-1.0"),
        (lambda p: RowSparseAdagrad(p, lr="0.1"), TypeError, "lr must be a real number"),
        (lambda p: RowSparseAdagrad(p, lr_decay=-0.1), ValueError, "lr_decay=-0.1"),
        (lambda p: RowSparseAdagrad(p, lr_decay=float("nan")), ValueError, "lr_decay=nan"),
        (lambda p: RowSparseAdagrad(p, eps=-1e-10), ValueError, "eps=-1e-10"),
        (lambda p: RowSparseAdagrad(p, eps=float("nan")), ValueError, "eps=nan"),
        (lambda p: RowSparseAdagrad(p, initial_accumulator_value=-1), ValueError, "initial_accumulator_value=-1.0"),
        (lambda p: RowSparseSGD(p, lr=float("nan")), ValueError, "invalid SGD settings: lr=nan"),
        (lambda p: RowSparseSGD(p, lr=float("-inf")), ValueError, "lr=-inf"),
        (lambda p: RowSparseSGD(p, lr=True), TypeError, "lr must be a real number"),
        (lambda p: RowSparseAdagrad([{"params": p, "lr": float("nan")}]), ValueError, "lr=nan"),
        (lambda p: RowSparseAdagrad([{"params": p, "eps": -1.0}]), ValueError, "eps=-1.0"),
        (lambda p: RowSparseSGD([{"params": p, "lr": -0.5}]), ValueError, "invalid SGD settings: lr=-0.5"),
        (lambda p: RowSparseAdagrad(p, weight_decay=0.01), ValueError, "weight_decay=0.01 is not supported"),
        (lambda p: RowSparseAdagrad(p, weight_decay=float("nan")), ValueError, "weight_decay=nan"),
        (lambda p: RowSparseSGD(p, weight_decay=1e-4), ValueError, "weight_decay=0.0001 is not supported"),
    ],
)
def test_optimiser_settings(make, exc, message):
    with pytest.raises(exc, match=message):
        make([torch.nn.Parameter(torch.zeros(3, 2))])


def test_optimiser_groups_and_zero_weight_decay_as_torch():
    """Per-group settings (checked above) are used as torch uses them (torch fills the
    accumulator from the constructor's initial_accumulator_value, whatever the group says);
    weight_decay=0 is accepted."""
    params = [torch.nn.Parameter(torch.ones(3, 2)) for _ in range(4)]
    ours = RowSparseAdagrad([{"params": params[:1]}, {"params": params[1:2], "lr": 0.1, "eps": 0.5}],
                            lr=0.5, weight_decay=0, initial_accumulator_value=2.0)
    theirs = torch.optim.Adagrad([{"params": params[2:3]}, {"params": params[3:], "lr": 0.1, "eps": 0.5}],
                                 lr=0.5, weight_decay=0, initial_accumulator_value=2.0)
    for param in params:
        param.grad = torch.ones(3, 2)
    ours.step()
    theirs.step()
    torch.testing.assert_close(params[0], params[2])
    torch.testing.assert_close(params[1], params[3])
    assert RowSparseSGD(params, lr=0.1, weight_decay=0.0).param_groups[0]["lr"] == 0.1


def test_optimiser_valid_settings_accept_numpy_numbers():
    param = torch.nn.Parameter(torch.ones(3, 2))
    opt = RowSparseAdagrad([param], lr=np.float32(0.5), lr_decay=0, eps=0)
    param.grad = torch.ones(3, 2)
    opt.step()
    torch.testing.assert_close(param.detach(), torch.full((3, 2), 0.5))


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(reassign_every=0), ValueError, "reassign_every must be >= 1"),
        (dict(reassign_every=2.5), TypeError, "reassign_every must be an integer"),
        (dict(reassign_every=True), TypeError, "reassign_every must be an integer"),
        (dict(reassign_every=3, score="p"), ValueError, "score must be 'eq10'"),
        (dict(reassign_every=3, algorithm="best"), ValueError, "algorithm must be"),
        (dict(reassign_every=3, decay=float("nan")), ValueError, "decay must lie in \\[0, 1\\]"),
        (dict(reassign_every=3, decay=1.5), ValueError, "decay must lie in \\[0, 1\\]"),
        (dict(reassign_every=3, decay="0.5"), TypeError, "decay must be a real number"),
        (dict(reassign_every=3, prior=float("nan")), ValueError, "prior must be finite and > 0"),
        (dict(reassign_every=3, prior=float("inf")), ValueError, "prior must be finite and > 0"),
        (dict(reassign_every=3, prior=0), ValueError, "prior must be finite and > 0"),
        (dict(reassign_every=3, prior_mode="flat"), ValueError, "prior_mode"),
        (dict(reassign_every=3, record_objective=-1), ValueError, "record_objective"),
        (dict(reassign_every=3, record_objective="yes"), TypeError, "record_objective"),
        (dict(reassign_every=3, statistics="stats"), TypeError, "statistics must be an hsm.NodeStatistics"),
        (dict(reassign_every=3, statistics=NodeStatistics(Tree.random(10, 3, 3))), ValueError,
         "statistics are for K=10, M=3; the layer has K=9, M=3"),
    ],
)
def test_learner_settings(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), **kwargs)


@PATHS
def test_layer_copies_and_pickles_after_inference(tmp_path, kernels):
    """The inference buffers (per thread) stay behind: deepcopy and torch.save(layer) work after
    predict / topk, and the copy computes the same."""
    import copy

    layer = _layer(kernels)
    h = torch.randn(4, 5)
    expected = layer.topk(h, 3).indices, layer.predict(h)
    twin = copy.deepcopy(layer)
    torch.save(layer, tmp_path / "layer.pt")
    loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
    for other in (twin, loaded):
        assert torch.equal(other.topk(h, 3).indices, expected[0]) and torch.equal(other.predict(h), expected[1])


@PATHS
def test_target_and_batch_chunk_errors(kernels):
    layer = _layer(kernels)
    with pytest.raises(TypeError, match="integer tensor of label ids .* got torch.float32"):
        layer(torch.randn(2, 5), torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="got list"):
        layer(torch.randn(2, 5), [0, 1])
    with pytest.raises(ValueError, match="batch_chunk must be >= 1, got 0"):
        layer.log_prob(torch.randn(2, 5), batch_chunk=0)
    with pytest.raises(TypeError, match="batch_chunk must be an integer"):
        layer.log_prob(torch.randn(2, 5), batch_chunk=2.5)


def test_tree_round_trips_inside_a_model():
    """A layer inside a model: its tree travels under the layer's prefix, the old-format warning
    points at the caller's line."""
    def model(seed):
        return torch.nn.Sequential(torch.nn.Linear(5, 5), HierarchicalSoftmax(5, Tree.random(9, 3, 2, seed=seed)))

    saved, fresh = model(0), model(1)
    state = saved.state_dict()
    assert "1._extra_state" in state
    fresh.load_state_dict(state)
    assert fresh[1].tree == saved[1].tree
    with pytest.warns(UserWarning, match="'1._extra_state'") as record:
        model(2).load_state_dict({k: v for k, v in state.items() if k != "1._extra_state"})
    assert record[0].filename == __file__
    bigger = torch.nn.Sequential(torch.nn.Linear(5, 5), HierarchicalSoftmax(5, Tree.random(10, 3, 3)))
    with pytest.raises(RuntimeError, match=r"1\._extra_state: the state dict holds a layer with K=9"):
        bigger.load_state_dict(state)
