"""The output layers every experiment and benchmark of the book compares, built in one place.

:func:`output_layer` gives the flat softmax (:class:`hsm.FlatSoftmax`), the adaptive softmax
(:class:`AdaptiveSoftmaxBaseline`, :class:`torch.nn.AdaptiveLogSoftmaxWithLoss` with this project's
cutoffs) or the tree (:class:`hsm.HierarchicalSoftmax` over the experiment's own tree).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hsm.layers import FlatSoftmax, HierarchicalSoftmax

__all__ = ["ADAPTIVE_CUTOFFS", "ADAPTIVE_CUTOFFS_X5", "OUTPUT_LAYERS", "AdaptiveSoftmaxBaseline", "adaptive_cutoffs",
           "output_layer"]


#: the adaptive softmax's cutoffs (those below V are used): a head of the 2,000 most frequent
#: words and tails of growing size, the shape of Grave et al.'s large-vocabulary setups; among
#: the configurations of that shape timed at V = 250k, d = 200, B = 128 (head 1k-5k words, two or
#: three tails, ``div_value`` 2 or 4; the performance chapter), among the fastest (three tails with
#: ``div_value=4`` and a head of 1k-2k words were equally fast within the timing noise)
ADAPTIVE_CUTOFFS = (2_000, 20_000, 100_000)
#: the cutoffs of this benchmark's first committed runs (method ``adaptive-x5``): smaller tail
#: clusters, about 2.5 times slower at V = 250k (the performance chapter compares both)
ADAPTIVE_CUTOFFS_X5 = (2_000, 10_000, 50_000, 200_000)


def adaptive_cutoffs(num_labels: int, dim: int = 200, div_value: float = 4.0,
                     base: Sequence[int] = ADAPTIVE_CUTOFFS_X5) -> list[int]:
    """Cutoffs for AdaptiveLogSoftmaxWithLoss: those of ``base`` below V (the benchmark's
    ``adaptive`` passes :data:`ADAPTIVE_CUTOFFS`; the default, :data:`ADAPTIVE_CUTOFFS_X5`, is
    what this function returned for the first committed runs), and no more clusters than leave every tail a
    projection of at least one dimension (torch gives tail i the size ``dim // div_value**(i + 1)``:
    with d = 200 and ``div_value=4`` a fourth tail would get 0 dimensions, a degenerate model).
    A vocabulary at or below the first cutoff gets one cutoff at V / 4. ValueError unless ``base``
    is increasing positive integers."""
    base = [int(c) for c in base]
    if not base or base[0] < 1 or any(b <= a for a, b in zip(base, base[1:])):
        raise ValueError(f"base must be increasing positive cutoffs, got {base}")
    cutoffs = [c for c in base if c < num_labels]
    while cutoffs and int(dim // div_value ** len(cutoffs)) < 1:
        cutoffs.pop()
    return cutoffs or [max(1, num_labels // 4)]


class AdaptiveSoftmaxBaseline(torch.nn.Module):
    """The adaptive softmax every comparison of this project runs against:
    :class:`torch.nn.AdaptiveLogSoftmaxWithLoss` with :func:`adaptive_cutoffs` of ``cutoffs`` (a
    setting of each experiment: :data:`ADAPTIVE_CUTOFFS` by default, 2k/20k/100k below V) and
    ``div_value=4`` (Grave et al.'s setting for large vocabularies). Its cutoffs split the label
    ids into a head of frequent labels and tails of rarer ones, so the ids must be frequency
    ranks: given the training ``counts``, labels are renumbered by rank inside (``rank`` [V]);
    without, the ids are taken to be ranks already (the benchmarks' Zipf targets).

    forward(h [B, d], y [B]) -> (output [B] log-probabilities of the targets, loss []): the
    interface of the tree and flat layers."""

    def __init__(self, dim: int, num_labels: int, counts: np.ndarray | None = None,
                 cutoffs: Sequence[int] = ADAPTIVE_CUTOFFS, div_value: float = 4.0) -> None:
        super().__init__()
        if counts is None:
            self.rank: torch.Tensor | None = None
        else:
            counts = np.asarray(counts)
            if counts.shape != (num_labels,):
                raise ValueError(f"counts must hold one count per label ({num_labels}), got shape {counts.shape}")
            order = np.argsort(-counts, kind="stable")  # label ids by decreasing count
            rank = np.empty(num_labels, dtype=np.int64)
            rank[order] = np.arange(num_labels)
            self.register_buffer("rank", torch.from_numpy(rank))
        self.adaptive = torch.nn.AdaptiveLogSoftmaxWithLoss(
            dim, num_labels, adaptive_cutoffs(num_labels, dim, div_value=div_value, base=cutoffs),
            div_value=div_value)

    def forward(self, hidden: torch.Tensor, target: torch.Tensor):
        return self.adaptive(hidden, target if self.rank is None else self.rank[target])


#: the output layers :func:`output_layer` builds
OUTPUT_LAYERS = ("flat", "adaptive", "tree")


def output_layer(kind: str, dim: int, num_labels: int, *, tree: Any = None, counts: np.ndarray | None = None,
                 sparse: bool = False, zero: bool = False,
                 cutoffs: Sequence[int] = ADAPTIVE_CUTOFFS) -> torch.nn.Module:
    """The output layer of every experiment and benchmark, in one place: ``"flat"``
    (:class:`hsm.FlatSoftmax`), ``"adaptive"`` (:class:`AdaptiveSoftmaxBaseline`, ``counts`` and
    ``cutoffs`` its settings) or ``"tree"`` (:class:`hsm.HierarchicalSoftmax` over ``tree``, which
    each experiment builds its own way; ``sparse``: row-sparse gradients). ``zero``: weights and
    biases start at 0 (fastText's output matrix: every run starts from the uniform distribution).
    ValueError for an unknown kind, a tree layer without a tree or a zero adaptive softmax."""
    if kind == "flat":
        layer: torch.nn.Module = FlatSoftmax(dim, num_labels)
        parameters = [layer.linear.weight, layer.linear.bias]
    elif kind == "adaptive":
        if zero:  # an all-zero adaptive softmax cannot learn its tail projections
            raise ValueError("zero initialisation is for the flat and tree layers, not the adaptive softmax")
        return AdaptiveSoftmaxBaseline(dim, num_labels, counts=counts, cutoffs=cutoffs)
    elif kind == "tree":
        if tree is None:
            raise ValueError("a tree output layer needs its tree")
        layer = HierarchicalSoftmax(dim, tree, sparse=sparse)
        parameters = [layer.weight, layer.bias]
    else:
        raise ValueError(f"unknown output layer {kind!r}; known: {list(OUTPUT_LAYERS)}")
    if zero:
        with torch.no_grad():
            for parameter in parameters:
                if parameter is not None:
                    parameter.zero_()
    return layer
