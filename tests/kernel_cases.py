"""The tree shapes and layers every test of the compiled kernels runs on, and the float64
reference they are compared with."""
import numpy as np
import torch

from hsm.layers import HierarchicalSoftmax
from hsm.tree import Tree


def kernel_test_trees() -> list[Tree]:
    return [
        Tree.random(50, 4, 3, seed=1),  # fixed depth with unused leaves (slot penalty)
        Tree.random(27, 3, 3, seed=2),  # exactly full
        Tree.random(400, 9, 3, seed=3),  # arity not a multiple of the kernels' blocking (4)
        Tree.huffman(np.arange(1, 38), 3),  # well formed, variable depth
        Tree.huffman(np.arange(1, 21), 4),  # with dummy leaves
        Tree.huffman(np.arange(1, 20), 2),  # binary
        Tree.from_taxonomy({"a": ["x", "y", "z"], "b": ["w"], "c": ["u", "v"]}, list("xyzwuv")),  # ragged
    ]


def scaled_layer(tree: Tree, d: int = 7, scale: float = 2.0, seed: int = 0, sparse: bool = True) -> HierarchicalSoftmax:
    """A layer on ``tree`` with its initial weights times ``scale`` (confident nodes) and random biases."""
    torch.manual_seed(seed)
    layer = HierarchicalSoftmax(d, tree, sparse=sparse)
    with torch.no_grad():
        layer.weight.mul_(scale)
        layer.bias.normal_()
    return layer


def float64_reference(layer: HierarchicalSoftmax) -> HierarchicalSoftmax:
    """The same parameters in float64 through the plain PyTorch implementation."""
    ref = HierarchicalSoftmax(layer.in_features, layer.tree, sparse=False).double()
    ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    ref.use_kernels = False
    return ref
