"""Synthetic problems with a known answer, for tests and the book.

:func:`planted_hierarchy` draws inputs whose labels come in groups: labels of one group share a
direction in input space, so a tree that puts each group under its own root child is the one
a good tree learner should find. :func:`grouping_agreement` measures how close a tree's
top-level split comes to the planted groups.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from hsm.tree import Tree

__all__ = ["PlantedHierarchy", "grouping_agreement", "planted_hierarchy"]


class PlantedHierarchy(NamedTuple):
    x: torch.Tensor  #: [n, dim] inputs
    y: torch.Tensor  #: [n] labels
    group_of_label: np.ndarray  #: [K] planted group of each label
    label_probs: np.ndarray  #: [K] label frequencies used to draw y


def planted_hierarchy(
    num_groups: int = 4,
    labels_per_group: int = 4,
    dim: int = 16,
    num_examples: int = 20_000,
    group_scale: float = 3.0,
    label_scale: float = 1.0,
    noise: float = 0.5,
    zipf: float = 0.0,
    seed: int = 0,
) -> PlantedHierarchy:
    """Inputs ``x = group_scale * c_g + label_scale * o_l + noise * eps`` for label ``l`` of group
    ``g``, with random unit-ish directions ``c_g`` and ``o_l``. Label ``l`` is drawn with
    probability proportional to ``(rank+1)**-zipf`` (0: uniform). Label ids are shuffled, so
    the planted groups are not contiguous ids."""
    if num_groups < 2 or labels_per_group < 1:
        raise ValueError("need at least 2 groups of at least 1 label")
    rng = np.random.default_rng(seed)
    num_labels = num_groups * labels_per_group
    group_of_label = rng.permutation(np.repeat(np.arange(num_groups), labels_per_group))
    centers = rng.standard_normal((num_groups, dim)) / np.sqrt(dim)
    offsets = rng.standard_normal((num_labels, dim)) / np.sqrt(dim)
    probs = (np.arange(num_labels) + 1.0) ** -zipf
    probs = rng.permutation(probs / probs.sum())
    y = rng.choice(num_labels, size=num_examples, p=probs)
    x = (group_scale * centers[group_of_label[y]] + label_scale * offsets[y]
         + noise * rng.standard_normal((num_examples, dim)) / np.sqrt(dim))
    return PlantedHierarchy(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y), group_of_label, probs)


def grouping_agreement(tree: Tree, group_of_label: np.ndarray) -> float:
    """Adjusted Rand index between the root child of each label and its planted group
    (1 = the top-level split is the planted grouping, about 0 = unrelated)."""
    from sklearn.metrics import adjusted_rand_score

    root_child = tree.path_children[: tree.num_labels, 0]
    return float(adjusted_rand_score(group_of_label, root_child))
