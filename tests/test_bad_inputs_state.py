"""Reliability of the layer's numbers and state: finite inputs whose logits overflow, trees and
learner states read back from disk, and optimiser fusion that would silently ignore a user's
gradient edits. Layer checks run on the compiled CPU path (``use_kernels=True``) and the PyTorch
path (``use_kernels=False``, what runs on a GPU)."""
import json

import numpy as np
import pytest
import torch

from hsm.layers import FlatSoftmax, HierarchicalSoftmax, NonFiniteInputError
from hsm.training import train_epoch
from hsm.tree import Tree

PATHS = pytest.mark.parametrize("kernels", [True, False], ids=["compiled", "torch"])


def _calls():
    return {
        "forward": lambda layer, h: layer(h, torch.zeros(h.shape[0], dtype=torch.long)),
        "log_prob": lambda layer, h: layer.log_prob(h),
        "predict": lambda layer, h: layer.predict(h),
        "topk": lambda layer, h: layer.topk(h, 2),
        "topk_beam": lambda layer, h: layer.topk(h, 2, method="beam"),
    }


# ---------------------------------------------------------------------------------------------
# finite inputs whose logits overflow: the named non-finite error, never NaN or a disagreement

def _huge_rows(layer: torch.nn.Module, rows=(1, 3), batch: int = 4) -> torch.Tensor:
    """Finite inputs; the rows ``rows`` are large enough that W h + b overflows float32."""
    torch.manual_seed(1)
    h = torch.randn(batch, 5)
    for row in rows:
        h[row] = torch.sign(torch.randn(5)) * 1e37
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(1000)
    return h


@PATHS
@pytest.mark.parametrize("call", list(_calls()))
def test_overflowing_logits_raise_the_non_finite_error_naming_the_rows(kernels, call):
    layer = HierarchicalSoftmax(5, Tree.random(20, 3, 3, seed=0))
    layer.use_kernels = kernels
    h = _huge_rows(layer)
    assert torch.isfinite(h).all()
    with pytest.raises(NonFiniteInputError, match=r"logits overflow float32 in 2 of 4 rows \(rows \[1, 3\]\).*scale"):
        _calls()[call](layer, h)


@pytest.mark.parametrize("call", ["forward", "log_prob", "predict", "topk"])
def test_overflowing_logits_flat_softmax(call):
    layer = FlatSoftmax(5, 20)
    h = _huge_rows(layer, rows=(2,))
    with pytest.raises(NonFiniteInputError, match=r"rows \[2\]"):
        _calls()[call](layer, h)


@PATHS
def test_predict_agrees_with_topk_on_large_finite_inputs(kernels):
    """Inputs as large as float32 allows without overflowing the logits: both searches agree with
    the arg max of log_prob, and float64 computes rows that overflow float32."""
    torch.manual_seed(0)
    layer = HierarchicalSoftmax(5, Tree.random(20, 3, 3, seed=0))
    layer.use_kernels = kernels
    h = torch.randn(16, 5) * 1e30
    log_prob = layer.log_prob(h)
    assert torch.isfinite(log_prob).all()
    assert torch.equal(layer.predict(h), layer.topk(h, 3).indices[:, 0])
    assert torch.equal(layer.predict(h), log_prob.argmax(dim=1))
    flat = FlatSoftmax(5, 20)
    assert torch.equal(flat.predict(h), flat.topk(h, 2).indices[:, 0])
    big = _huge_rows(layer)
    layer64 = layer.double()
    assert torch.isfinite(layer64.log_prob(big.double())).all()


@PATHS
def test_training_on_overflowing_logits_reports_the_step(kernels):
    layer = HierarchicalSoftmax(5, Tree.random(9, 3, 2, seed=0))
    layer.use_kernels = kernels
    y = torch.tensor([0, 1, 2, 3])
    big = _huge_rows(layer)
    batches = [(torch.randn(4, 5), y), (big, y)]
    with pytest.raises(FloatingPointError, match="at step 1"):
        train_epoch(torch.nn.Identity(), layer, batches, torch.optim.SGD(layer.parameters(), lr=0.0))


# ---------------------------------------------------------------------------------------------
# Tree.load goes through the same checks as Tree(): nothing is coerced on the way in

def _tree_file(tmp_path, **change):
    data = Tree.random(9, 3, 2, seed=0).to_dict()
    data.update(change)
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(data))
    return path


def _rows(key, old, new):
    rows = [list(r) for r in Tree.random(9, 3, 2, seed=0).to_dict()[key]]
    flat = [x for r in rows for x in r]
    i = flat.index(old)
    return [[new if (n * 3 + j) == i else x for j, x in enumerate(r)] for n, r in enumerate(rows)]


@pytest.mark.parametrize("change, error, message", [
    (lambda: {"child_node": _rows("child_node", 1, 1.5)}, TypeError, r"child_node must hold integers, got 1\.5"),
    (lambda: {"child_node": _rows("child_node", 1, 1.0)}, TypeError, r"child_node must hold integers, got 1\.0"),
    (lambda: {"child_label": _rows("child_label", 1, True)}, TypeError, r"child_label must hold integers, got True"),
    (lambda: {"child_label": _rows("child_label", 1, "1")}, TypeError, r"child_label must hold integers, got '1'"),
    (lambda: {"label_names": "abcdefghi"}, ValueError, r"label_names must be a list of strings"),
    (lambda: {"label_names": list(range(9))}, ValueError, r"label_names must be a list of strings"),
    (lambda: {"depth_limit": 1}, ValueError, r"depth_limit=1 needs the complete 3-ary tree of depth 1"),
    (lambda: {"depth_limit": 3}, ValueError, r"depth_limit=3 needs the complete 3-ary tree of depth 3"),
    (lambda: {"num_labels": 9.0}, TypeError, r"num_labels must be an integer"),
    (lambda: {"num_labels": True}, TypeError, r"num_labels must be an integer"),
])
def test_tree_load_refuses_what_a_cast_would_silently_change(tmp_path, change, error, message):
    path = _tree_file(tmp_path, **change())
    with pytest.raises(error, match=message) as info:
        Tree.load(path)
    assert str(path) in str(info.value)


def test_tree_load_refuses_an_unreachable_node_with_out_of_range_ids(tmp_path):
    tree = Tree.huffman(np.arange(1, 10, dtype=float), 3)
    data = tree.to_dict()
    data["child_node"] = data["child_node"] + [[-1, -1, -1]]
    data["child_label"] = data["child_label"] + [[99, -1, -1]]
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"unreachable node 4 holds leaf id 99"):
        Tree.load(path)
    with pytest.raises(ValueError, match=r"unreachable node 4 holds leaf id 99"):
        Tree(np.array(data["child_node"]), np.array(data["child_label"]), 9)


def test_tree_constructor_refuses_the_same_inputs():
    tree = Tree.random(9, 3, 2, seed=0)
    with pytest.raises(TypeError, match="label_names must be a list of names, got a str"):
        Tree(tree.child_node, tree.child_label, 9, label_names="abcdefghi")
    with pytest.raises(TypeError, match="child_label must hold integers, got booleans"):
        Tree(tree.child_node, tree.child_label.astype(bool), 9)
    with pytest.raises(ValueError, match="depth_limit=1 needs the complete 3-ary tree"):
        Tree(tree.child_node, tree.child_label, 9, depth_limit=1)
    # the right number of nodes, but not in heap order, is not a fixed-depth tree
    node = tree.child_node.copy()
    node[0] = [2, 1, 3]
    with pytest.raises(ValueError, match="not the heap layout"):
        Tree(node, tree.child_label, 9, depth_limit=2)
    assert Tree(node, tree.child_label, 9).num_labels == 9  # the same arrays are a tree of free shape
    # round trip of every builder still works
    for built in (tree, Tree.huffman(np.arange(1, 10, dtype=float), 3), Tree.balanced(np.arange(9), 3)):
        assert Tree.from_dict(json.loads(json.dumps(built.to_dict()))) == built


# ---------------------------------------------------------------------------------------------
# TreeLearner.load_state_dict: everything checked against the saved tree first; all or nothing

def _learner_pair(kernels: bool):
    """A learner whose tree was learned (the state to load) and a fresh one on the initial tree."""
    from hsm_lab.synthetic import planted_hierarchy
    from hsm.training import TreeLearner

    data = planted_hierarchy(num_groups=3, labels_per_group=3, dim=8, num_examples=300, seed=2)
    initial = Tree.random(9, 3, 2, seed=0)
    torch.manual_seed(0)
    layer = HierarchicalSoftmax(8, initial)
    layer.use_kernels = kernels
    learner = TreeLearner(layer, reassign_every=3)
    batches = [(data.x[i:i + 50], data.y[i:i + 50]) for i in range(0, 300, 50)]
    train_epoch(torch.nn.Identity(), layer, batches, torch.optim.SGD(layer.parameters(), lr=0.5), learner)
    assert layer.tree != initial
    fresh_layer = HierarchicalSoftmax(8, initial)
    fresh_layer.use_kernels = kernels
    return learner.state_dict(), TreeLearner(fresh_layer, reassign_every=3), initial


def _damage(state, path, value):
    import copy

    state = copy.deepcopy(state)
    target = state
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value(target[path[-1]]) if callable(value) else value
    return state


_DELETE = object()


@PATHS
@pytest.mark.parametrize("path, value, message", [
    (("statistics", "sum_probas"), _DELETE, "statistics state lacks 'sum_probas'"),
    (("statistics", "label_counts"), lambda t: t[:-1], r"label_counts must be a tensor of shape \[9\]"),
    (("statistics", "sum_probas"), lambda t: t[:, :1], r"sum_probas must be a tensor of shape \[9, 2, 3\]"),
    (("statistics", "path_counts"), lambda t: t.fill_(float("nan")), "finite, non-negative"),
    (("statistics", "label_counts"), lambda t: t - 100, "finite, non-negative"),
    (("statistics", "stat_node"), lambda t: t.flip(0), "stat_node are not the saved tree's path nodes"),
    (("statistics", "prior"), -1.0, "prior must be finite and > 0, got -1"),
    (("statistics", "decay"), 5.0, r"decay must lie in \[0, 1\], got 5"),
    (("statistics", "prior_mode"), "bogus", "prior_mode must be 'current_child' or 'uniform', got 'bogus'"),
    (("steps",), -3, "steps must be an integer >= 0"),
    (("steps",), 2.5, "steps must be an integer >= 0"),
    (("frozen",), "no", "frozen must be True or False"),
    (("history",), [{"when": 1}], "history holds a record that is not a ReassignRecord"),
    (("tree", "child_node"), lambda rows: [[1.5] + r[1:] for r in rows[:1]] + rows[1:], "tree: child_node must hold"),
])
def test_a_damaged_learner_state_is_refused_and_nothing_is_loaded(kernels, path, value, message):
    state, learner, initial = _learner_pair(kernels)
    before = (learner.layer.tree, learner.steps, learner.frozen, list(learner.history),
              {k: v.clone() for k, v in learner.statistics.state_dict().items() if isinstance(v, torch.Tensor)})
    with pytest.raises(ValueError, match=message):
        learner.load_state_dict(_damage(state, path, value))
    assert learner.layer.tree is before[0] and learner.layer.tree == initial  # the saved tree was not installed
    assert (learner.steps, learner.frozen, learner.history) == before[1:4]
    for key, tensor in before[4].items():
        assert torch.equal(getattr(learner.statistics, key), tensor)
    # the undamaged state still loads, and the learner resumes on the learned tree
    learner.load_state_dict(state)
    assert learner.layer.tree == Tree.from_dict(state["tree"]) and learner.steps == state["steps"]
    h = torch.randn(4, 8)
    assert torch.isfinite(learner.layer(h, torch.arange(4)).output).all()


# ---------------------------------------------------------------------------------------------
# RowSparseAdagrad.fuse: clipping a gradient that was already applied is refused, by name

def _fused(bias: bool = True):
    from hsm.optim import RowSparseAdagrad

    torch.manual_seed(0)
    layer = HierarchicalSoftmax(6, Tree.random(40, 4, 3, seed=1), bias=bias, sparse=True)
    model = torch.nn.Linear(6, 6)
    opt = RowSparseAdagrad(list(model.parameters()) + list(layer.parameters()), lr=0.1)
    opt.fuse(layer)
    layer(model(torch.randn(8, 6)), torch.arange(8)).loss.backward()
    return model, layer, opt


@pytest.mark.parametrize("edit", [
    lambda params: torch.nn.utils.clip_grad_norm_(params, 0.5),
    lambda params: torch.nn.utils.clip_grad_value_(params, 0.1),
    lambda params: [p.grad.add_(p, alpha=1e-4) for p in params if p.grad is not None],
    lambda params: sum(float(p.grad.norm()) for p in params if p.grad is not None),
], ids=["clip_grad_norm_", "clip_grad_value_", "l2-term", "grad-norm-log"])
def test_editing_a_fused_layers_gradient_is_refused_by_name(edit):
    model, layer, opt = _fused()
    params = list(model.parameters()) + list(layer.parameters())
    with pytest.raises(RuntimeError, match=r"RowSparseAdagrad.fuse\(layer\) already applied .*fused_optimizer = None"):
        edit(params)


def test_a_fused_layer_steps_and_zeroes_as_before():
    model, layer, opt = _fused()
    weight = layer.weight.detach().clone()
    opt.step()  # the placeholder is skipped: the layer was updated once, in backward
    assert torch.equal(layer.weight, weight) and opt.state[layer.weight]["step"] == 1
    opt.zero_grad(set_to_none=False)
    opt.zero_grad()
    assert layer.weight.grad is None
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.5)  # the rest of the model clips as usual
    layer.fused_optimizer = None  # unfused: real gradients again, which clip
    layer(model(torch.randn(8, 6)), torch.arange(8)).loss.backward()
    assert layer.weight.grad.is_sparse
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters()], 0.5)


def test_a_second_fuse_does_not_silently_take_the_layer():
    from hsm.optim import RowSparseAdagrad

    model, layer, opt = _fused()
    other = RowSparseAdagrad(layer.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="already fused with another RowSparseAdagrad"):
        other.fuse(layer)
    assert layer.fused_optimizer is opt
    opt.fuse(layer)  # the same one again is fine
    layer.fused_optimizer = None
    other.fuse(layer)
    assert layer.fused_optimizer is other


def test_a_fused_layer_on_the_pytorch_path_keeps_real_gradients_that_clip():
    """The fused update runs in the compiled backward only; on the PyTorch path (GPUs, float64,
    use_kernels=False) the layer gets its gradients and clipping reaches them."""
    from hsm.optim import RowSparseAdagrad

    torch.manual_seed(0)
    layer = HierarchicalSoftmax(6, Tree.random(40, 4, 3, seed=1), sparse=False)
    layer.use_kernels = False
    opt = RowSparseAdagrad(layer.parameters(), lr=0.1)
    opt.fuse(layer)
    layer(torch.randn(8, 6), torch.arange(8)).loss.backward()
    assert layer.weight.grad is not None and not layer.weight.grad.is_sparse
    norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), 1e-3)
    assert float(norm) > 1e-3 and float(torch.linalg.vector_norm(layer.weight.grad)) <= 1e-3 + 1e-9
    weight = layer.weight.detach().clone()
    opt.step()
    assert not torch.equal(layer.weight, weight)
