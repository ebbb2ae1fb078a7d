"""hsm.fused: the Triton kernels of the tree layer's training step, run by Triton's interpreter on
CPU tensors (``TRITON_INTERPRET=1``) where there is no GPU, against the reference forward and the
unfused optimiser. Skipped where Triton is not installed (it is optional)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import hsm  # noqa: E402
from hsm import fused  # noqa: E402
from hsm.layers import HierarchicalSoftmax  # noqa: E402
from hsm.optim import FusedGradient, RowSparseAdagrad  # noqa: E402
from hsm.tree import Tree  # noqa: E402

#: where the kernels run in this process: a GPU, the interpreter (TRITON_INTERPRET=1 when triton was
#: first imported: it decides then), or nowhere
_DEVICE = "cuda" if torch.cuda.is_available() else "cpu" if fused.applies(torch.empty(0)) else None


def test_the_kernels_under_the_interpreter():
    """Without a GPU, the tests below run in a fresh process with TRITON_INTERPRET=1."""
    if _DEVICE is not None:
        pytest.skip("the kernels run in this process")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__))],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.fixture
def interpreter():
    """The device the kernels run on: the GPU, or the CPU under the interpreter."""
    if _DEVICE is None:
        pytest.skip("no GPU and no interpreter in this process (test_the_kernels_under_the_interpreter runs these)")
    return _DEVICE


_TREES = [
    Tree.random(50, 4, 3, seed=1),  # empty slots
    Tree.huffman(np.arange(1, 21), 4),  # variable depth, dummy leaves
    Tree.huffman(np.arange(1, 20), 2),  # binary
    Tree.from_taxonomy({"a": ["x", "y", "z"], "b": ["w"], "c": ["u", "v"]}, list("xyzwuv")),  # ragged
]


def _layers(tree, device, dim=70, seed=0):
    """A static-engine layer fused with its optimiser, and an unfused copy on the default engine."""
    torch.manual_seed(seed)
    layers = [HierarchicalSoftmax(dim, tree, sparse=True, engine=e).to(device) for e in ("torch", "auto")]
    with torch.no_grad():
        layers[0].weight.mul_(3.0)
        layers[0].bias.normal_()
    layers[1].load_state_dict(layers[0].state_dict())
    optimizers = [RowSparseAdagrad(layer.parameters(), lr=0.2, initial_accumulator_value=0.1) for layer in layers]
    optimizers[0].fuse(layers[0])
    return layers, optimizers


@pytest.mark.parametrize("tree", _TREES, ids=repr)
def test_forward_equals_the_reference(tree, interpreter):
    (layer, _), _ = _layers(tree, interpreter)
    h = torch.randn(11, 70, device=interpreter)
    y = torch.randint(0, tree.num_labels, (11,), device=interpreter)
    y[3] = y[4]  # a node shared by several rows
    rows = layer.engine_paths.index_select(0, y)
    length = (layer.engine_paths.shape[1] - 1) // 3
    output, log_probs, _ = fused.path_forward(h, layer.weight.detach(), layer.bias.detach(), layer.engine_penalty,
                                              rows, length, tree.arity)
    torch.testing.assert_close(output, layer.forward_reference(h, y).output.detach(), rtol=1e-5, atol=1e-5)
    # the real steps' log-softmax rows are distributions
    real = rows[:, length:2 * length] < tree.num_nodes
    torch.testing.assert_close(log_probs.exp().sum(-1)[real], torch.ones(int(real.sum()), device=interpreter))


@pytest.mark.parametrize("tree", _TREES, ids=repr)
def test_three_fused_steps_equal_the_unfused_optimiser(tree, interpreter):
    layers, optimizers = _layers(tree, interpreter)
    for step in range(3):
        h = torch.randn(13, 70, device=interpreter)
        y = torch.randint(0, tree.num_labels, (13,), device=interpreter)
        y[1] = y[2] = y[5]
        y[7] = -100  # an ignored row: no gradient, no update
        results = []
        for layer, optimizer in zip(layers, optimizers):
            x = h.clone().requires_grad_()
            out = layer(x, y)
            out.loss.backward()
            results.append((out.output.detach(), out.loss.detach(), x.grad))
            if layer is layers[0]:
                assert isinstance(layer.weight.grad, FusedGradient)  # the update was applied in backward
            optimizer.step()
            optimizer.zero_grad()
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name in ("weight", "bias"):
        got, want = getattr(layers[0], name), getattr(layers[1], name)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(optimizers[0].state[got]["sum"], optimizers[1].state[want]["sum"], rtol=1e-5,
                                   atol=1e-6)
        assert optimizers[0].state[got]["step"] == optimizers[1].state[want]["step"] == 3


def test_statistics_through_the_fused_kernels(interpreter):
    tree = Tree.random(50, 4, 3, seed=1)
    layers, optimizers = _layers(tree, interpreter, dim=8)
    learners = [hsm.TreeLearner(layer, reassign_every=10**6) for layer in layers]
    for step in range(2):
        h = torch.randn(17, 8, device=interpreter)
        y = torch.randint(0, tree.num_labels, (17,), device=interpreter)
        for layer, optimizer in zip(layers, optimizers):
            layer(h, y).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for name in ("sum_probas", "path_counts", "label_counts"):
        torch.testing.assert_close(getattr(learners[0].statistics, name), getattr(learners[1].statistics, name),
                                   rtol=1e-5, atol=1e-6)
