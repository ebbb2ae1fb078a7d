"""Statements of the Theory chapters that hold for every node, as property tests.

The chapters run these checks on a fixed sample and print the result; here hypothesis searches
for a counterexample. The sharper form of Lemma 4, the tightness of the repaired Lemma 5 for every
M (the even case is in test_objective.py) and the optimality of the greedy on binary nodes with
Eq. 10 scores are the statements the chapters make beyond the paper's.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.assign import assign_node, assignment_score, brute_force_assign
from hsm.objective import balance, marginal, max_objective, node_objective, purity
from hsm.theory import lemma4_balance_lower_bound, lemma5_purity_bound_repaired

FAST = settings(max_examples=60, deadline=None)


@st.composite
def random_nodes(draw, pure: bool = False, max_arity: int = 8):
    """(q, p_cond) with K in 1..10 labels and M in 2..max_arity children, rows from a Dirichlet whose
    concentration spans nearly pure to nearly uniform (or one-hot rows when ``pure``)."""
    K = draw(st.integers(1, 10))
    M = draw(st.integers(2, max_arity))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.dirichlet(np.ones(K))
    if pure:
        return q, np.eye(M)[rng.integers(M, size=K)]
    concentration = draw(st.sampled_from([0.05, 0.3, 1.0, 10.0]))
    return q, rng.dirichlet(np.full(M, concentration), size=K)


def sharper_lemma4(J: float, M: int) -> float:
    """beta >= 1/M - sqrt((M - 1)(J* - J_n)) / 2: Lemma 4 with the constant sum_j eps_j = 0 allows."""
    return 1 / M - np.sqrt((M - 1) * max(max_objective(M) - J, 0.0)) / 2


@FAST
@given(random_nodes(pure=True))
def test_sharper_lemma4_holds_on_pure_splits(node):
    q, p_cond = node
    M = p_cond.shape[1]
    J = node_objective(q, p_cond)
    # the square root turns a rounding error of 1e-16 in J* - J_n into about 1e-8
    assert balance(q, p_cond) >= sharper_lemma4(J, M) - 1e-9
    assert sharper_lemma4(J, M) >= lemma4_balance_lower_bound(J, M) - 1e-12


@FAST
@given(random_nodes())
def test_sharper_lemma4_needs_no_purity(node):
    q, p_cond = node
    M = p_cond.shape[1]
    assert balance(q, p_cond) >= sharper_lemma4(node_objective(q, p_cond), M) - 1e-9


@pytest.mark.parametrize("M, x", [(2, 0.3), (3, 0.2), (5, 0.15), (8, 0.1)])
def test_sharper_lemma4_is_attained(M, x):
    q = np.array([1 / M - x] + [1 / M + x / (M - 1)] * (M - 1))
    J = node_objective(q, np.eye(M))
    assert balance(q, np.eye(M)) == pytest.approx(sharper_lemma4(J, M), abs=1e-12)


@pytest.mark.parametrize("M", [2, 3, 4, 5, 7, 8, 20])
def test_repaired_lemma5_is_tight_for_every_m(M):
    # label i routed half and half over children i and i + 1 (mod M), equal shares
    p_cyclic = np.zeros((M, M))
    for i in range(M):
        p_cyclic[i, i] += 0.5
        p_cyclic[i, (i + 1) % M] += 0.5
    q = np.full(M, 1 / M)
    J = node_objective(q, p_cyclic)
    np.testing.assert_allclose(marginal(q, p_cyclic), 1 / M, atol=1e-12)
    assert max_objective(M) - J == pytest.approx(4 / M**2, abs=1e-12)
    assert purity(q, p_cyclic) == pytest.approx(1 / M, abs=1e-12)
    assert purity(q, p_cyclic) == pytest.approx(lemma5_purity_bound_repaired(J, M), abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 8), st.data())
def test_greedy_is_optimal_on_binary_nodes_with_eq10(K, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    counts = rng.integers(1, 100, size=K).astype(float)
    p_cond = rng.dirichlet(np.full(2, 0.7), size=K)
    capacity = data.draw(st.integers(-(-K // 2), K))
    greedy = assign_node(p_cond, counts, capacity, score="eq10")
    _, best_value = brute_force_assign(p_cond, counts, capacity, score="eq10")
    assert assignment_score(p_cond, counts, greedy, score="eq10") >= best_value - 1e-12
