"""The node objective :math:`J_n` of Jernite, Choromanska & Sontag (ICML 2017): its value, purity,
balance, gradients and the ranking scores of Algorithms 2 and 3 (the bounds around it: :mod:`hsm.theory`).

Notation (ICML §4, Eqs. 6-9; thesis Eqs. 3.10-3.12). A node :math:`n` of an :math:`M`-ary tree
receives examples of :math:`K` classes:

* ``q[i]``         :math:`q^{(n)}_i`, the fraction of the examples reaching :math:`n` that have class
  :math:`i` (the papers say "proportion of *nodes*", a typo the thesis corrects);
* ``p_cond[i, j]`` :math:`p^{(n)}_{j|i}`, the probability that an example of class :math:`i` reaching
  :math:`n` is sent to child :math:`j`;
* ``p[j]``         :math:`p^{(n)}_j = \\sum_i q_i p_{j|i}` (Eq. 7), the same for an example of any class.

The node objective (Eq. 6) is

.. math::  J_n = \\frac{2}{M} \\sum_{i=1}^K q_i \\sum_{j=1}^M |p_j - p_{j|i}|,

with range :math:`[0, J^*]`, :math:`J^* = \\frac{4}{M}(1 - \\frac{1}{M})` (Lemma 2).

What this module checks or corrects about the paper (details in the function docstrings and in
``tests/test_objective.py``; all of it is verified numerically there):

* Eq. 10 / Eq. 12 are *not* the partial derivative of Eq. 6: they drop the terms that move through
  :math:`p_j`. They are kept as the ranking scores of Algorithms 2/3 (:func:`node_objective_grad`);
  the true derivative is :func:`node_objective_full_grad`.
* Lemma 5 as printed (:math:`\\alpha \\le (J^* - J_n)/2` for balanced splits) is false for
  :math:`M \\ge 3`; :func:`hsm.theory.lemma5_purity_bound_repaired` gives :math:`\\alpha \\le M(J^*-J_n)/4`,
  which is tight for every :math:`M`.
* A short argument shows more than Lemmas 2-5 state. Because :math:`\\min(a,b) \\ge ab` on
  :math:`[0,1]`, :math:`|p_j - p_{j|i}| = p_j + p_{j|i} - 2\\min(p_j, p_{j|i})` gives, for *every*
  split (pure or not, balanced or not),

  .. math:: J^* - J_n \\;\\ge\\; \\frac{4}{M}\\sum_j \\Big(p_j - \\frac1M\\Big)^2 + 4\\beta\\alpha,
            \\qquad \\beta = \\min_j p_j,\\ \\alpha = \\text{purity sum of Definition 2}.

  The first term gives Lemma 4's balance bound without the purity assumption; the second gives
  :math:`\\alpha \\le (J^*-J_n)/(4\\beta)` (:func:`hsm.theory.purity_bound_from_balance`), which is the repaired
  Lemma 5 at :math:`\\beta = 1/M`, and both together give Lemma 3's "only if" direction.

Array conventions: every function that takes distributions accepts NumPy arrays, (nested) lists or
torch tensors. If any input is a torch tensor the result is a torch tensor with the (floating) dtype
and device of the tensor inputs, and it stays differentiable for autograd; otherwise the result is a
float64 NumPy array, and scalars come back as Python ``float``. Distributions are validated (finite,
non-negative, summing to 1 within ``atol``, consistent shapes) and a ``ValueError`` names the problem.
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._arrays import ArrayLike, check_arity, check_distribution_inputs, scalar, torch_if_tensor

__all__ = [
    "DEFAULT_ATOL",
    "RankingScore",
    "TIE_TOLERANCE",
    "balance",
    "marginal",
    "max_objective",
    "node_objective",
    "node_objective_full_grad",
    "node_objective_grad",
    "purity",
    "ranking_scores",
]

#: Tolerance used when checking that probabilities are non-negative and sum to one.
DEFAULT_ATOL = 1e-6



def max_objective(M: int) -> float:
    """:math:`J^* = \\frac{4}{M}(1 - \\frac{1}{M})`, the largest value of :math:`J_n` (Lemma 2).

    Reached exactly by perfectly balanced, perfectly pure splits (Lemma 3). ``M < 2`` raises ValueError.
    """
    M = check_arity(M)
    return 4.0 / M * (1.0 - 1.0 / M)


def marginal(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """:math:`p_j = \\sum_i q_i p_{j|i}` (Eq. 7): the routing distribution of an example of any class.

    Args:
        q: class proportions at the node, shape [K].
        p_cond: per-class routing distributions, shape [K, M] (row i is :math:`p_{\\cdot|i}`).
    Returns:
        shape [M].
    """
    q, p_cond, _ = check_distribution_inputs(q, p_cond, atol)
    return q @ p_cond


def node_objective(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """The node objective :math:`J_n = \\frac{2}{M}\\sum_i q_i \\sum_j |p_j - p_{j|i}|` (Eq. 6).

    For M = 2 it equals the LOM-tree objective :math:`2\\sum_i q_i |p_1 - p_{1|i}|`. Its range is
    :math:`[0, J^*]` (Lemma 2, :func:`max_objective`). With torch inputs the result is a 0-d tensor
    that autograd can differentiate (its gradient is :func:`node_objective_full_grad`).
    """
    q, p_cond, torch = check_distribution_inputs(q, p_cond, atol)
    xp = torch if torch is not None else np
    num_children = p_cond.shape[1]
    p = q @ p_cond
    per_class = xp.sum(xp.abs(p[None, :] - p_cond), axis=1)
    return scalar(2.0 / num_children * (q @ per_class), torch)


#: :math:`|p_{j|i} - p_j|` at or below this counts as a tie and scores 0 in Eqs. 10 / 12 (the papers'
#: :math:`\mathrm{sign}(0) = 0`). With exact zero instead, a label with no statistics (:math:`p_{\cdot|i}`
#: uniform) would score :math:`\pm` its coefficient from the last bit of :math:`p_j`'s rounding, and the
#: greedy of Algorithms 2/3 would rank such labels by rounding noise.
TIE_TOLERANCE = 1e-12


#: Which of the paper's ranking scores: ``"eq10"`` (ICML Eq. 10, "derivative with respect to
#: :math:`p_{j|i}`") or ``"eq12"`` (Eq. 12, with respect to :math:`\log p_{j|i}`: Eq. 10 times :math:`p_{j|i}`).
RankingScore = Literal["eq10", "eq12"]

def check_ranking_score(score: str | None, default: RankingScore) -> RankingScore:
    """The :data:`RankingScore` a public function was asked for (``default`` for None): the one check
    of the ``score`` keyword, so every function that takes it rejects a bad value with the same
    message."""
    if score is None:
        return default
    if score not in ("eq10", "eq12"):
        raise ValueError(f"score must be 'eq10' (ICML eq. 10) or 'eq12' (eq. 12), got {score!r}")
    return score  # type: ignore[return-value]


def ranking_scores(coefficient: Any, p_cond: Any, p: Any, times_p_cond: bool,
                   tie_tolerance: float = TIE_TOLERANCE) -> Any:
    """Eq. 10 (``times_p_cond=False``) or Eq. 12 (``True``) from their parts, shape [K, M]: the one
    definition of the scores that Algorithms 2/3 rank (label, child) pairs by.

    .. math::  s_{ij} = c_i \\,\\mathrm{sign}(p_{j|i} - p_j) \\;[\\times\\, p_{j|i}],
               \\qquad c_i = \\tfrac{2}{M} q_i (1 - q_i),

    with the tie rule :math:`\\mathrm{sign}(x) = 0` for :math:`|x| \\le` ``tie_tolerance``
    (:data:`TIE_TOLERANCE`, the rule of Algorithms 2/3; :func:`node_objective_grad` passes 0, the
    exact sign, so that it stays the first term of :func:`node_objective_full_grad`).

    Args:
        coefficient: [K] :math:`c_i` (computed by the caller, so that the labels of many nodes,
            each with its own :math:`q`, can be scored at once).
        p_cond: [K, M] :math:`p_{j|i}`.
        p: [K, M] or [M] the marginal :math:`p_j` (Eq. 7) of the node of each label.

    No validation (:func:`node_objective_grad` and :func:`hsm.assign.pair_scores` validate). NumPy
    arrays give a NumPy array, torch tensors a tensor. The compiled greedy of :mod:`hsm.assign`
    computes the same numbers one pair at a time (``tests/test_assign.py`` checks it against this).
    """
    torch = torch_if_tensor(coefficient, p_cond, p)
    gap = p_cond - p
    if torch is not None:
        sign = torch.where(gap.abs() <= tie_tolerance, torch.zeros_like(gap), torch.sign(gap))
    else:
        sign = np.where(np.abs(gap) <= tie_tolerance, 0.0, np.sign(gap))
    scores = sign * coefficient[:, None]
    return scores * p_cond if times_p_cond else scores


def node_objective_grad(
    q: ArrayLike,
    p_cond: ArrayLike,
    score: RankingScore | None = None,
    *,
    atol: float = DEFAULT_ATOL,
) -> Any:
    """The paper's gradient *scores*: Eq. 10 (``score="eq10"``, the default) or Eq. 12
    (``score="eq12"``), shape [K, M].

    * Eq. 10: :math:`\\frac{2}{M} q_i (1 - q_i)\\, \\mathrm{sign}(p_{j|i} - p_j)`.
    * Eq. 12: the same times :math:`p_{j|i}` ("derivative with respect to :math:`\\log p_{j|i}`").

    These are **not** the full derivative of Eq. 6. Each class's term
    :math:`q_k |p_j - p_{j|k}|` also depends on :math:`p_{j|i}` through :math:`p_j = \\sum_k q_k p_{j|k}`
    (Eq. 7); Eqs. 10/12 drop those :math:`k \\ne i` terms and keep only the first term of
    :func:`node_objective_full_grad`. They are the ranking scores that Algorithm 2 (ICML, = thesis
    Algorithm 3.2) and Algorithm 3 (ICML supplement) sort by when they assign labels to children
    ("the label-child pair (i, j) with the highest value of ∂J_n/∂p_{j|i}"), and that is what this
    function is for. ``sign(0) = 0``.

    Eq. 10 does have the sign of the true derivative: writing :math:`S_{kj} = \\mathrm{sign}(p_j -
    p_{j|k})` and :math:`s_j = \\sum_k q_k S_{kj} \\in [-1, 1]`, the true derivative is
    :math:`\\frac2M q_i (s_j - S_{ij})` and Eq. 10 is :math:`-\\frac2M q_i(1-q_i) S_{ij}`. So the paper's
    reading "raising :math:`p_{j|i}` above :math:`p_j` increases :math:`J_n`" is right; what differs is
    the size, :math:`q_i|s_j - S_{ij}|` (which depends on j) against :math:`q_i(1-q_i)` (the same for every
    child), and hence the greedy ranking and its tie-breaking.

    Computed by :func:`ranking_scores`, the definition Algorithms 2/3 use, with the exact sign
    (tie tolerance 0): this function is the first term of the exact derivative
    :func:`node_objective_full_grad`, whose signs are exact too. The assignment ranks with
    :data:`TIE_TOLERANCE` instead (:func:`hsm.assign.pair_scores`); the two differ only where
    :math:`0 < |p_{j|i} - p_j| \\le 10^{-12}`, i.e. where :math:`p_{j|i} = p_j` up to rounding.
    """
    score = check_ranking_score(score, default="eq10")
    q, p_cond, _ = check_distribution_inputs(q, p_cond, atol)
    num_children = p_cond.shape[1]
    p = q @ p_cond
    coefficient = (2.0 / num_children) * (q * (1.0 - q))
    return ranking_scores(coefficient, p_cond, p[None, :], times_p_cond=score == "eq12", tie_tolerance=0.0)


def node_objective_full_grad(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """The full partial derivative of Eq. 6 with respect to :math:`p_{j|i}`, holding q fixed; shape [K, M].

    Differentiating :math:`J_n = \\frac2M\\sum_k q_k\\sum_j |p_j - p_{j|k}|` with
    :math:`\\partial p_j / \\partial p_{j|i} = q_i` (Eq. 7): the :math:`k = i` term gives
    :math:`q_i \\,\\mathrm{sign}(p_j - p_{j|i})(q_i - 1)` and each :math:`k \\ne i` term gives
    :math:`q_k\\,\\mathrm{sign}(p_j - p_{j|k})\\, q_i`, so

    .. math::
        \\frac{\\partial J_n}{\\partial p_{j|i}} = \\frac{2}{M}\\Big[q_i(1-q_i)\\,\\mathrm{sign}(p_{j|i}-p_j)
        + q_i\\sum_{k\\ne i} q_k\\,\\mathrm{sign}(p_j - p_{j|k})\\Big]
        = \\frac{2}{M}\\, q_i\\Big[\\sum_k q_k\\,\\mathrm{sign}(p_j - p_{j|k}) - \\mathrm{sign}(p_j - p_{j|i})\\Big].

    The first term is Eq. 10 (:func:`node_objective_grad`); the paper drops the second. Each
    :math:`p_{j|i}` is treated as a free coordinate (the simplex constraint on rows is not projected
    out: only within-row differences of this gradient matter along the simplex). :math:`J_n` is
    piecewise linear and convex in ``p_cond``; at a kink (:math:`p_j = p_{j|k}`) ``sign(0) = 0`` makes
    the result one valid subgradient.
    """
    q, p_cond, torch = check_distribution_inputs(q, p_cond, atol)
    xp = torch if torch is not None else np
    num_children = p_cond.shape[1]
    p = q @ p_cond
    sign_gap = xp.sign(p[None, :] - p_cond)  # [K, M]: sign(p_j - p_{j|k})
    weighted = q @ sign_gap  # [M]: sum_k q_k sign(p_j - p_{j|k})
    # q_i (1 - q_i) sign(p_{j|i} - p_j) + q_i (weighted_j - q_i sign(p_j - p_{j|i})) simplifies to:
    return (2.0 / num_children) * q[:, None] * (weighted[None, :] - sign_gap)


def purity(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """:math:`\\alpha = \\frac1M\\sum_j\\sum_i q_i \\min(p_{j|i}, 1 - p_{j|i})` (Definition 2, left-hand side).

    Definition 2 calls a split :math:`\\alpha`-pure when this sum is at most :math:`\\alpha`; the sum
    itself is the smallest valid purity factor, and 0 means perfectly pure (every
    :math:`p_{j|i} \\in \\{0, 1\\}`). Note that the sum runs over *all* M children: thesis Fig. 3.7
    counts one child of a binary node only and so prints half this value (0.17 instead of 0.3422).
    """
    q, p_cond, torch = check_distribution_inputs(q, p_cond, atol)
    xp = torch if torch is not None else np
    num_children = p_cond.shape[1]
    per_class = xp.sum(xp.minimum(p_cond, 1.0 - p_cond), axis=1)
    return scalar((q @ per_class) / num_children, torch)


def balance(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """:math:`\\beta = \\min_j p_j` (Definition 1): the largest valid balancedness factor.

    Perfectly balanced means :math:`\\beta = 1/M`, i.e. :math:`p_j = 1/M` for all j.
    """
    q, p_cond, torch = check_distribution_inputs(q, p_cond, atol)
    p = q @ p_cond
    return scalar(p.min(), torch)
