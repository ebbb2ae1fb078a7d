"""The tree shapes every test of the compiled kernels runs on."""
import numpy as np

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
