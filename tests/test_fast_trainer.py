"""hsm.fast_trainer: the rebuild plans of the compiled bag-of-words trainer (the training itself is
checked against PyTorch in tests/test_fast_classifier.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.fast_trainer import FitHistory, first_half_plan, output_arrays, statistics_arrays, token_plan
from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.tree import Tree


@settings(max_examples=60, deadline=None)
@given(total=st.integers(2, 5000), rebuilds=st.integers(1, 80))
def test_first_half_plan_rebuilds_evenly_in_the_first_half(total: int, rebuilds: int) -> None:
    points, frozen = first_half_plan(total, rebuilds)
    half = total // 2
    assert len(points) <= rebuilds
    if points:
        assert 0 < points[0] and points[-1] <= half
        assert len(set(np.diff([0, *points]).tolist())) == 1  # evenly spaced, increasing
    assert frozen == (points[-1] if len(points) == rebuilds else half)
    assert frozen <= half


def test_first_half_plan_example() -> None:
    assert first_half_plan(100, 5) == ([10, 20, 30, 40, 50], 50)
    assert first_half_plan(10, 8) == ([1, 2, 3, 4, 5], 5)  # more rebuilds than examples in the half


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=200), rate=st.integers(1, 60),
       epochs=st.integers(1, 4), rebuilds=st.integers(1, 10))
def test_token_plan_checks_at_most_once_per_check(lengths: list[int], rate: int, epochs: int, rebuilds: int) -> None:
    lengths_array = np.asarray(lengths, dtype=np.int64)
    samples = int(epochs * lengths_array.sum())
    state = {"samples": samples, "period": samples // 2 // rebuilds, "local": 0, "tokens": 0}
    state["next"] = state["period"]
    points: list[int] = []
    for epoch in range(epochs):
        points += token_plan(lengths_array, state, epoch * len(lengths), rate)
    assert points == sorted(set(points))  # increasing: at most one rebuild per check
    assert all(0 < p <= epochs * len(lengths) for p in points)
    assert state["tokens"] <= samples


def test_operands_views_of_the_layer() -> None:
    tree = Tree.huffman([5, 1, 1, 3, 2], 3)
    layer = HierarchicalSoftmax(4, tree)
    weight, bias, penalty, nodes, children, mask = output_arrays(layer, 4)
    weight[0, 0] = 7.0  # a view: the kernel trains the layer's tensor in place
    assert float(layer.weight.detach()[0, 0]) == 7.0
    np.testing.assert_array_equal(nodes, tree.path_nodes)
    flat = output_arrays(FlatSoftmax(4, 5), 4)
    assert flat[0].shape == (1, 20) and flat[3].shape == (5, 1)
    assert [a.size for a in statistics_arrays(None)] == [0, 0, 0]
    assert FitHistory().rebuilds == []
