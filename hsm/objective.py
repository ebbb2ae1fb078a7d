"""The node objective :math:`J_n` of Jernite, Choromanska & Sontag (ICML 2017) and its theory.

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
  :math:`M \\ge 3`; :func:`lemma5_purity_bound_repaired` gives :math:`\\alpha \\le M(J^*-J_n)/4`,
  which is tight for every :math:`M`.
* A short argument shows more than Lemmas 2-5 state. Because :math:`\\min(a,b) \\ge ab` on
  :math:`[0,1]`, :math:`|p_j - p_{j|i}| = p_j + p_{j|i} - 2\\min(p_j, p_{j|i})` gives, for *every*
  split (pure or not, balanced or not),

  .. math:: J^* - J_n \\;\\ge\\; \\frac{4}{M}\\sum_j \\Big(p_j - \\frac1M\\Big)^2 + 4\\beta\\alpha,
            \\qquad \\beta = \\min_j p_j,\\ \\alpha = \\text{purity sum of Definition 2}.

  The first term gives Lemma 4's balance bound without the purity assumption; the second gives
  :math:`\\alpha \\le (J^*-J_n)/(4\\beta)` (:func:`purity_bound_from_balance`), which is the repaired
  Lemma 5 at :math:`\\beta = 1/M`, and both together give Lemma 3's "only if" direction.

Array conventions: every function that takes distributions accepts NumPy arrays, (nested) lists or
torch tensors. If any input is a torch tensor the result is a torch tensor with the (floating) dtype
and device of the tensor inputs, and it stays differentiable for autograd; otherwise the result is a
float64 NumPy array, and scalars come back as Python ``float``. Distributions are validated (finite,
non-negative, summing to 1 within ``atol``, consistent shapes) and a ``ValueError`` names the problem.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Literal, NamedTuple

import numpy as np

__all__ = [
    "DEFAULT_ATOL",
    "RankingScore",
    "TIE_TOLERANCE",
    "NodeEstimates",
    "balance",
    "continuous_estimates",
    "corollary1_log10_nodes",
    "discrete_estimates",
    "lemma4_balance_lower_bound",
    "lemma5_purity_bound_printed",
    "lemma5_purity_bound_repaired",
    "marginal",
    "max_objective",
    "node_objective",
    "node_objective_full_grad",
    "node_objective_grad",
    "purity",
    "purity_bound_from_balance",
    "ranking_scores",
    "theorem1_log10_nodes",
    "thesis_corollary32_error_bound",
]

#: Tolerance used when checking that probabilities are non-negative and sum to one.
DEFAULT_ATOL = 1e-6

#: :math:`\log_2 e`, the constant that appears in Theorem 1 and Corollary 1.
LOG2_E = 1.0 / math.log(2.0)

# NumPy array, nested list, or torch.Tensor. torch is only touched when the caller passes a tensor, so
# NumPy-only users of this module never pay for importing it.
ArrayLike = Any


# ----------------------------------------------------------------------------------------------------
# Input handling
# ----------------------------------------------------------------------------------------------------


def _torch_if_tensor(*values: Any) -> Any:
    """The torch module if any value is a torch tensor, else None (torch cannot be needed otherwise)."""
    torch = sys.modules.get("torch")
    if torch is not None and any(isinstance(v, torch.Tensor) for v in values):
        return torch
    return None


def _to_float_arrays(named: dict[str, Any]) -> tuple[list[Any], Any]:
    """Convert the named inputs to one common floating array type.

    Returns the converted arrays (in the order of ``named``) and the torch module (torch mode) or
    None (NumPy mode, float64). In torch mode the dtype is the promotion of the floating dtypes of the
    tensor inputs (the default dtype when none is floating) and the device is the tensors' device.
    """
    torch = _torch_if_tensor(*named.values())
    if torch is None:
        out = []
        for name, value in named.items():
            try:
                array = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise TypeError(f"{name} must be a numeric array, list or tensor ({err})") from None
            out.append(array)
        return out, None

    tensors = {name: v for name, v in named.items() if isinstance(v, torch.Tensor)}
    devices = {v.device for v in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"tensor inputs are on different devices: {sorted(map(str, devices))}")
    device = devices.pop()
    dtype = None
    for name, tensor in tensors.items():
        if tensor.is_complex():
            raise TypeError(f"{name} must be real, got dtype {tensor.dtype}")
        if tensor.is_floating_point():
            dtype = tensor.dtype if dtype is None else torch.promote_types(dtype, tensor.dtype)
    if dtype is None:
        dtype = torch.get_default_dtype()
    out = []
    for name, value in named.items():
        if isinstance(value, torch.Tensor):
            out.append(value.to(dtype=dtype))
        else:
            try:
                array = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise TypeError(f"{name} must be a numeric array, list or tensor ({err})") from None
            out.append(torch.as_tensor(array, dtype=dtype, device=device))
    return out, torch


def _as_float64_numpy(x: Any) -> np.ndarray:
    """A float64 NumPy view of an array or tensor, for validation only (never for results)."""
    torch = _torch_if_tensor(x)
    if torch is not None:
        return x.detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _check_finite(name: str, x: Any) -> None:
    if not np.all(np.isfinite(_as_float64_numpy(x))):
        raise ValueError(f"{name} contains NaN or infinite values")


def _check_distribution_inputs(q: Any, p_cond: Any, atol: float) -> tuple[Any, Any, Any]:
    """Validate (q, p_cond) and return them as arrays of one type plus the torch module or None."""
    (q, p_cond), torch = _to_float_arrays({"q": q, "p_cond": p_cond})
    if q.ndim != 1:
        raise ValueError(f"q must be 1-D with shape [K], got shape {tuple(q.shape)}")
    if p_cond.ndim != 2:
        raise ValueError(f"p_cond must be 2-D with shape [K, M], got shape {tuple(p_cond.shape)}")
    num_classes = q.shape[0]
    if num_classes < 1:
        raise ValueError("q is empty: a node needs at least one class (K >= 1)")
    if p_cond.shape[0] != num_classes:
        raise ValueError(
            f"p_cond has {p_cond.shape[0]} rows but q has {num_classes} entries; "
            "p_cond must have shape [K, M] with K = len(q)"
        )
    if p_cond.shape[1] < 2:
        raise ValueError(f"p_cond must have M >= 2 columns (children), got M = {p_cond.shape[1]}")
    q64 = _as_float64_numpy(q)
    p64 = _as_float64_numpy(p_cond)
    if not np.all(np.isfinite(q64)):
        raise ValueError("q contains NaN or infinite values")
    if not np.all(np.isfinite(p64)):
        raise ValueError("p_cond contains NaN or infinite values")
    if q64.min() < -atol:
        raise ValueError(f"q must be non-negative, got min {q64.min():.3g}")
    if abs(q64.sum() - 1.0) > atol:
        raise ValueError(f"q must sum to 1 (tolerance {atol:g}), got sum {q64.sum():.9g}")
    if p64.min() < -atol:
        raise ValueError(f"p_cond must be non-negative, got min {p64.min():.3g}")
    row_error = np.abs(p64.sum(axis=1) - 1.0)
    if row_error.max() > atol:
        bad = int(row_error.argmax())
        raise ValueError(
            f"each row of p_cond must sum to 1 (tolerance {atol:g}); "
            f"row {bad} sums to {p64[bad].sum():.9g}"
        )
    return q, p_cond, torch


def _scalar(value: Any, torch: Any) -> Any:
    """Python float in NumPy mode, 0-d tensor in torch mode."""
    return value if torch is not None else float(value)


def _check_arity(M: Any, name: str = "M") -> int:
    """An integer number of children >= 2 (integral floats such as 3.0 are accepted)."""
    if isinstance(M, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    if isinstance(M, numbers.Integral):
        value = int(M)
    elif isinstance(M, numbers.Real) and float(M).is_integer():
        value = int(M)
    else:
        raise ValueError(f"{name} must be an integer, got {M!r}")
    if value < 2:
        raise ValueError(f"{name} must be >= 2 (a node needs at least two children), got {value}")
    return value


def _check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


# ----------------------------------------------------------------------------------------------------
# The objective
# ----------------------------------------------------------------------------------------------------


def max_objective(M: int) -> float:
    """:math:`J^* = \\frac{4}{M}(1 - \\frac{1}{M})`, the largest value of :math:`J_n` (Lemma 2).

    Reached exactly by perfectly balanced, perfectly pure splits (Lemma 3). ``M < 2`` raises ValueError.
    """
    M = _check_arity(M)
    return 4.0 / M * (1.0 - 1.0 / M)


def marginal(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """:math:`p_j = \\sum_i q_i p_{j|i}` (Eq. 7): the routing distribution of an example of any class.

    Args:
        q: class proportions at the node, shape [K].
        p_cond: per-class routing distributions, shape [K, M] (row i is :math:`p_{\\cdot|i}`).
    Returns:
        shape [M].
    """
    q, p_cond, _ = _check_distribution_inputs(q, p_cond, atol)
    return q @ p_cond


def node_objective(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """The node objective :math:`J_n = \\frac{2}{M}\\sum_i q_i \\sum_j |p_j - p_{j|i}|` (Eq. 6).

    For M = 2 it equals the LOM-tree objective :math:`2\\sum_i q_i |p_1 - p_{1|i}|`. Its range is
    :math:`[0, J^*]` (Lemma 2, :func:`max_objective`). With torch inputs the result is a 0-d tensor
    that autograd can differentiate (its gradient is :func:`node_objective_full_grad`).
    """
    q, p_cond, torch = _check_distribution_inputs(q, p_cond, atol)
    xp = torch if torch is not None else np
    num_children = p_cond.shape[1]
    p = q @ p_cond
    per_class = xp.sum(xp.abs(p[None, :] - p_cond), axis=1)
    return _scalar(2.0 / num_children * (q @ per_class), torch)


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
    torch = _torch_if_tensor(coefficient, p_cond, p)
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
    q, p_cond, _ = _check_distribution_inputs(q, p_cond, atol)
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
    q, p_cond, torch = _check_distribution_inputs(q, p_cond, atol)
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
    q, p_cond, torch = _check_distribution_inputs(q, p_cond, atol)
    xp = torch if torch is not None else np
    num_children = p_cond.shape[1]
    per_class = xp.sum(xp.minimum(p_cond, 1.0 - p_cond), axis=1)
    return _scalar((q @ per_class) / num_children, torch)


def balance(q: ArrayLike, p_cond: ArrayLike, *, atol: float = DEFAULT_ATOL) -> Any:
    """:math:`\\beta = \\min_j p_j` (Definition 1): the largest valid balancedness factor.

    Perfectly balanced means :math:`\\beta = 1/M`, i.e. :math:`p_j = 1/M` for all j.
    """
    q, p_cond, torch = _check_distribution_inputs(q, p_cond, atol)
    p = q @ p_cond
    return _scalar(p.min(), torch)


# ----------------------------------------------------------------------------------------------------
# Lemmas 4 and 5
# ----------------------------------------------------------------------------------------------------


def _objective_gap(J: Any, M: Any, atol: float) -> tuple[Any, int, Any]:
    """Validate J in [0, J*] (within atol) and return (J* - J clipped at 0, M, torch module or None)."""
    M = _check_arity(M)
    (J,), torch = _to_float_arrays({"J": J})
    _check_finite("J", J)
    j64 = _as_float64_numpy(J)
    j_star = max_objective(M)
    if j64.size and j64.min() < -atol:
        raise ValueError(f"J must be >= 0 (Lemma 2), got {j64.min():.6g}")
    if j64.size and j64.max() > j_star + atol:
        raise ValueError(f"J must be <= J* = 4/M (1 - 1/M) = {j_star:.6g} for M = {M} (Lemma 2), got {j64.max():.6g}")
    gap = j_star - J
    # J slightly above J* (within atol, e.g. rounding at the optimum) counts as J = J*.
    gap = gap.clamp(min=0.0) if torch is not None else np.maximum(gap, 0.0)
    return gap, M, torch


def _finish(value: Any, torch: Any) -> Any:
    if torch is not None:
        return value
    return float(value) if np.ndim(value) == 0 else value


def lemma4_balance_lower_bound(J: Any, M: int, *, atol: float = DEFAULT_ATOL) -> Any:
    """Lemma 4: a perfectly pure split with objective J has :math:`\\beta \\ge \\frac1M - \\frac{\\sqrt{M(J^*-J)}}{2}`.

    Proof idea: for a pure split :math:`J = \\frac4M(1 - \\sum_j p_j^2)` (ICML Eq. 16), so
    :math:`\\sum_j (p_j - \\frac1M)^2 = \\frac{M(J^*-J)}{4}` and every :math:`|p_j - \\frac1M|` is at most
    its square root. (The seed writes :math:`\\min_j p_j = \\frac1M - \\max_j \\epsilon_j`; the sign is
    wrong but the bound stands.) It is never attained: since :math:`\\sum_j \\epsilon_j = 0`,
    :math:`\\max_j|\\epsilon_j| \\le \\sqrt{\\frac{M-1}{M}\\sum_j\\epsilon_j^2}`, which gives the sharp
    :math:`\\beta \\ge \\frac1M - \\frac{\\sqrt{(M-1)(J^*-J)}}{2}` (attained, e.g. M = 2, q = (3/4, 1/4)).
    The bound in fact holds for *every* split, pure or not: in general
    :math:`J^* - J \\ge \\frac4M\\sum_j(p_j - \\frac1M)^2` (module docstring). ``J`` may be a float,
    an array or a tensor; it must lie in :math:`[0, J^*]`.
    """
    gap, M, torch = _objective_gap(J, M, atol)
    xp = torch if torch is not None else np
    return _finish(1.0 / M - xp.sqrt(M * gap) / 2.0, torch)


def lemma5_purity_bound_printed(J: Any, M: int, *, atol: float = DEFAULT_ATOL) -> Any:
    """Lemma 5 *as printed*: a perfectly balanced split has :math:`\\alpha \\le (J^* - J)/2`.

    **False for M >= 3.** The proof's step "since :math:`\\mathcal B_i` has at least one element"
    drops a term :math:`(1-\\frac2M)(1-|\\mathcal B_i|)` that is negative when two or more children get
    :math:`p_{j|i} \\ge 1/M`. Counterexample (M = 3): q = (1/2, 1/2), :math:`p_{\\cdot|1} = (0.6, 0.4, 0)`,
    :math:`p_{\\cdot|2} = (1/15, 4/15, 2/3)` is perfectly balanced with :math:`J = 4/9`, so the bound is
    0.2222 while :math:`\\alpha = 0.2444`. It holds for M = 2, where it equals the repaired bound
    :func:`lemma5_purity_bound_repaired`.
    """
    gap, _, torch = _objective_gap(J, M, atol)
    return _finish(gap / 2.0, torch)


def lemma5_purity_bound_repaired(J: Any, M: int, *, atol: float = DEFAULT_ATOL) -> Any:
    """Repaired Lemma 5: a perfectly balanced split has :math:`\\alpha \\le \\frac{M}{4}(J^* - J)`.

    Proof (ours): with :math:`p_j = 1/M` and :math:`|a - b| = a + b - 2\\min(a, b)`,
    :math:`J^* - J = \\frac4M\\sum_i q_i\\sum_j[\\min(\\frac1M, p_{j|i}) - \\frac1M p_{j|i}]` and
    :math:`\\min(\\frac1M, b) - \\frac{b}{M} = \\min(\\frac{1-b}{M}, b(1-\\frac1M)) \\ge \\frac1M\\min(b, 1-b)`,
    so :math:`J^* - J \\ge \\frac{4}{M}\\alpha`. The constant is tight for every M: M classes in equal
    proportions, class i routed half and half to children i and i+1 (cyclically), give a perfectly
    balanced split with equality (see the Lemmas chapter). For M = 2 it coincides with the printed :math:`(J^*-J)/2`. This is the
    :math:`\\beta = 1/M` case of :func:`purity_bound_from_balance`.
    """
    gap, M, torch = _objective_gap(J, M, atol)
    return _finish(M * gap / 4.0, torch)


def purity_bound_from_balance(J: Any, M: int, beta: float, *, atol: float = DEFAULT_ATOL) -> Any:
    """For *any* split with balance :math:`\\beta = \\min_j p_j > 0`: :math:`\\alpha \\le (J^* - J)/(4\\beta)`.

    Not in the paper; derived here (module docstring). With :math:`a = p_j \\in [\\beta, 1-\\beta]` and
    :math:`b = p_{j|i}`: :math:`\\min(a, b) - ab = \\min(a(1-b), b(1-a)) \\ge \\beta\\min(b, 1-b)`, so
    :math:`J^* - J \\ge \\frac4M\\sum_j(p_j-\\frac1M)^2 + 4\\beta\\alpha`. At :math:`\\beta = 1/M` this is
    the repaired Lemma 5; together with Lemma 4's bound (which holds for every split) it makes Lemma 3's
    "J = J* only if balanced and pure" quantitative.
    """
    beta = _check_real("beta", beta)
    gap, M, torch = _objective_gap(J, M, atol)
    if not 0.0 < beta <= 1.0 / M + atol:
        raise ValueError(f"beta = min_j p_j must lie in (0, 1/M] = (0, {1.0 / M:.6g}], got {beta}")
    return _finish(gap / (4.0 * beta), torch)


# ----------------------------------------------------------------------------------------------------
# Estimates of q, p, p_cond from a batch of examples reaching one node
# ----------------------------------------------------------------------------------------------------


class NodeEstimates(NamedTuple):
    """Batch estimates at one node: ``q`` [K], ``p`` [M] and ``p_cond`` [K, M] (Eqs. 7-9).

    A class with no example in the batch gets ``q[i] = 0`` and the uniform row ``p_cond[i] = 1/M``
    (any row would do, since it has weight 0 in :math:`J_n`, :math:`\\alpha` and :math:`p_j`; uniform
    keeps every row a valid distribution).
    """

    q: Any
    p: Any
    p_cond: Any


def _to_index_array(name: str, value: Any, torch: Any) -> Any:
    """A 1-D integer array (NumPy int64 or torch long on the tensors' device)."""
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
        array = value.long()
    else:
        array = np.asarray(value)
        if array.size == 0:
            array = array.astype(np.int64)
        if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
        array = array.astype(np.int64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D with shape [B], got shape {tuple(array.shape)}")
    return array


def _check_index_range(name: str, array: Any, upper: int, upper_name: str) -> None:
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= upper:
        raise ValueError(f"{name} must lie in [0, {upper_name}) = [0, {upper}), got values in [{low}, {high}]")


def _check_count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def discrete_estimates(children: ArrayLike, labels: ArrayLike, num_labels: int, arity: int) -> NodeEstimates:
    """Hard-count estimates (arXiv Remark 1, ICML supplement Remark 3): the discrete definitions.

    ``children[b]`` is the child (0-based) the node sends example b to, e.g. the argmax of
    :math:`g_n`; ``labels[b]`` its class in ``[0, num_labels)``. Then ``q[i]`` is the fraction of the
    batch with class i, ``p_cond[i, j]`` the fraction of class-i examples sent to child j and ``p[j]``
    the fraction of all examples sent to child j (equal to Eq. 7 applied to ``q``, ``p_cond``). Classes
    absent from the batch get ``q[i] = 0`` and a uniform row (see :class:`NodeEstimates`).

    Returns float64 NumPy arrays, or tensors of the default float dtype on the inputs' device when
    ``children`` or ``labels`` is a tensor.
    """
    num_labels = _check_count("num_labels", num_labels, 1)
    arity = _check_count("arity", arity, 2)
    torch = _torch_if_tensor(children, labels)
    children = _to_index_array("children", children, torch)
    labels = _to_index_array("labels", labels, torch)
    if torch is not None:  # move a NumPy/list argument onto the tensor argument's device
        device = next(v.device for v in (children, labels) if isinstance(v, torch.Tensor))
        children, labels = (torch.as_tensor(v, device=device) for v in (children, labels))
    batch = labels.shape[0]
    if children.shape[0] != batch:
        raise ValueError(f"children has {children.shape[0]} entries but labels has {batch}")
    if batch == 0:
        raise ValueError("empty batch: q is undefined when no example reaches the node")
    _check_index_range("labels", labels, num_labels, "num_labels")
    _check_index_range("children", children, arity, "arity")

    flat = labels * arity + children
    if torch is not None:
        dtype = torch.get_default_dtype()
        counts = torch.bincount(flat, minlength=num_labels * arity).reshape(num_labels, arity).to(dtype)
    else:
        counts = np.bincount(flat, minlength=num_labels * arity).reshape(num_labels, arity).astype(np.float64)
    return _estimates_from_sums(counts, counts.sum(1), batch, torch)


def continuous_estimates(
    probs: ArrayLike, labels: ArrayLike, num_labels: int, *, atol: float = DEFAULT_ATOL
) -> NodeEstimates:
    """Soft estimates (Eqs. 8-9, thesis Eq. 3.12): expected node outputs per class.

    ``probs[b]`` is :math:`g_n(f_\\Theta(x_b))`, the node's distribution over its M children for
    example b (rows must be distributions); ``labels[b]`` is its class. Then ``p_cond[i]`` is the mean
    of ``probs`` over the class-i examples, ``p`` the mean over the whole batch and ``q`` the class
    fractions. The expectations are taken over the examples that reach the node (the batch passed
    here), which is what Algorithm 1 accumulates (Eqs. 8-9 leave the population open; thesis Eq. 3.12).
    Classes absent from the batch get ``q[i] = 0`` and a uniform row (see :class:`NodeEstimates`).

    With a tensor ``probs`` the results keep its dtype/device and stay differentiable (with tensor
    ``labels`` only, they are tensors of the default dtype), so
    ``node_objective(*continuous_estimates(...)[::2])`` can be back-propagated into the node function.
    """
    num_labels = _check_count("num_labels", num_labels, 1)
    torch = _torch_if_tensor(probs, labels)
    if torch is not None and not isinstance(probs, torch.Tensor):
        # tensor labels with array probs: results are still tensors (default dtype, labels' device)
        (probs,), _ = _to_float_arrays({"probs": probs})
        probs = torch.as_tensor(probs, dtype=torch.get_default_dtype(), device=labels.device)
    (probs,), torch = _to_float_arrays({"probs": probs})
    labels = _to_index_array("labels", labels, torch)
    if torch is not None:
        labels = torch.as_tensor(labels, device=probs.device)
    if probs.ndim != 2:
        raise ValueError(f"probs must be 2-D with shape [B, M], got shape {tuple(probs.shape)}")
    batch, num_children = probs.shape
    if num_children < 2:
        raise ValueError(f"probs must have M >= 2 columns (children), got M = {num_children}")
    if labels.shape[0] != batch:
        raise ValueError(f"probs has {batch} rows but labels has {labels.shape[0]} entries")
    if batch == 0:
        raise ValueError("empty batch: q is undefined when no example reaches the node")
    _check_index_range("labels", labels, num_labels, "num_labels")
    p64 = _as_float64_numpy(probs)
    if not np.all(np.isfinite(p64)):
        raise ValueError("probs contains NaN or infinite values")
    if p64.min() < -atol:
        raise ValueError(f"probs must be non-negative, got min {p64.min():.3g}")
    row_error = np.abs(p64.sum(axis=1) - 1.0)
    if row_error.max() > atol:
        bad = int(row_error.argmax())
        raise ValueError(f"each row of probs must sum to 1 (tolerance {atol:g}); row {bad} sums to {p64[bad].sum():.9g}")

    if torch is not None:
        sums = torch.zeros(num_labels, num_children, dtype=probs.dtype, device=probs.device).index_add(0, labels, probs)
        class_counts = torch.bincount(labels, minlength=num_labels).to(probs.dtype)
    else:
        sums = np.zeros((num_labels, num_children))
        np.add.at(sums, labels, probs)
        class_counts = np.bincount(labels, minlength=num_labels).astype(np.float64)
    return _estimates_from_sums(sums, class_counts, batch, torch)


def _estimates_from_sums(sums: Any, class_counts: Any, batch: int, torch: Any) -> NodeEstimates:
    """Turn per-class routing sums [K, M] and class counts [K] into (q, p, p_cond)."""
    num_children = sums.shape[1]
    present = class_counts > 0
    if torch is not None:
        # clamp avoids 0/0 in the rows that torch.where then replaces (NaNs would poison autograd)
        rows = sums / class_counts.clamp(min=1.0)[:, None]
        p_cond = torch.where(present[:, None], rows, torch.full_like(rows, 1.0 / num_children))
    else:
        rows = sums / np.maximum(class_counts, 1.0)[:, None]
        p_cond = np.where(present[:, None], rows, 1.0 / num_children)
    q = class_counts / batch
    p = sums.sum(0) / batch
    return NodeEstimates(q=q, p=p, p_cond=p_cond)


# ----------------------------------------------------------------------------------------------------
# Theorem 1, Corollary 1 and thesis Corollary 3.2
# ----------------------------------------------------------------------------------------------------


def _check_bound_args(gamma: Any, M: Any, K: Any) -> tuple[float, int, float]:
    gamma = _check_real("gamma", gamma)
    M = _check_arity(M)
    K = _check_real("K", K)
    if not K.is_integer() or K < 1:
        raise ValueError(f"K (number of labels) must be an integer >= 1, got {K}")
    if gamma <= 0.0:
        raise ValueError(f"gamma must be > 0 (Weak Hypothesis Assumption J_n >= gamma), got {gamma}")
    return gamma, M, K


def _check_kappa(kappa: Any) -> float:
    kappa = _check_real("kappa", kappa)
    if not 0.0 < kappa <= 1.0:
        raise ValueError(f"kappa (target error) must lie in (0, 1]; (1/kappa)^... is undefined at 0, got {kappa}")
    return kappa


def _theorem1_factor(gamma: float, M: int) -> float:
    """:math:`M(1 - 2\\gamma) + 2\\gamma`, the bound on :math:`M \\max_j p_j` that Theorem 1 uses."""
    factor = M * (1.0 - 2.0 * gamma) + 2.0 * gamma
    if factor <= 0.0:
        raise ValueError(
            f"Theorem 1 is undefined for gamma = {gamma} and M = {M}: M(1 - 2 gamma) + 2 gamma = {factor:.6g} <= 0 "
            f"(needs gamma < M / (2 (M - 1)) = {M / (2 * (M - 1)):.6g})"
        )
    return factor


def theorem1_log10_nodes(gamma: float, M: int, K: float, kappa: float) -> float:
    """:math:`\\log_{10}` of the number N of internal nodes that Theorem 1 (ICML §5.2) asks for.

    Under the Weak Hypothesis Assumption (every node has :math:`J_n \\ge \\gamma`), the tree error is at
    most :math:`\\kappa` once

    .. math:: N \\ge \\Big(\\frac1\\kappa\\Big)^{\\frac{16[M(1-2\\gamma)+2\\gamma](M-1)}{\\log_2 e\\; M^2\\gamma^2}\\ln K},

    so the function returns that exponent times :math:`\\log_{10}(1/\\kappa)` (N itself overflows
    floats: e.g. :math:`10^{4236}` for M = 20, K = 312,000, :math:`\\gamma` = 0.15, :math:`\\kappa` = 0.1).
    The same formula is thesis Theorem 3.1, stated there for the entropy :math:`G^e \\le \\kappa`.

    Raises ValueError where the bound is undefined: :math:`\\gamma \\le 0`,
    :math:`M(1-2\\gamma)+2\\gamma \\le 0` (i.e. :math:`\\gamma \\ge M/(2(M-1))`), or
    :math:`\\kappa \\notin (0, 1]`.

    The assumption as printed (ICML Theorem 1; the book's Errata and Boosting theorem chapters): the WHA is stated with
    :math:`\\gamma \\in [\\frac M2\\min_j p_j, 1 - \\frac M2\\min_j p_j]`, which gives an *upper* bound
    :math:`\\min_j p_j \\le 2\\gamma/M`, whereas the proof uses :math:`p_j \\ge 2\\gamma/M` (hence
    :math:`\\max_j p_j \\le (M(1-2\\gamma)+2\\gamma)/M`). Read as intended ("every :math:`p_j \\ge
    2\\gamma/M`") the assumption forces :math:`\\gamma \\le 1/2`, and then the factor is always
    positive. Taken literally, :math:`\\gamma` can reach :math:`M/(2(M-1))` and the bound breaks down;
    this is attainable (:math:`\\gamma \\le J^*`) only for M in {3, 4, 5}. This function does not
    reject :math:`1/2 < \\gamma < M/(2(M-1))` or :math:`\\gamma > J^*` (where the assumption cannot hold
    since :math:`J_n \\le J^*`); it evaluates the printed formula there. The statement's
    :math:`(1/\\kappa)` also differs from the proof's recursion, which yields
    :math:`(2(M-1)\\ln K/\\kappa)`.
    """
    gamma, M, K = _check_bound_args(gamma, M, K)
    kappa = _check_kappa(kappa)
    factor = _theorem1_factor(gamma, M)
    exponent = 16.0 * factor * (M - 1) * math.log(K) / (LOG2_E * M * M * gamma * gamma)
    return exponent * -math.log10(kappa)


def corollary1_log10_nodes(gamma: float, M: int, K: float, kappa: float) -> float:
    """:math:`\\log_{10} N` for Corollary 1 (every node perfectly balanced):
    :math:`N \\ge (1/\\kappa)^{16(M-1)\\ln K / (\\log_2 e\\, M^2\\gamma^2)}`.

    This is Theorem 1 with the factor :math:`M(1-2\\gamma)+2\\gamma` replaced by 1 (balanced splits
    give :math:`p_j = 1/M` in step 3 of the proof), so it is never larger than Theorem 1's number when
    :math:`\\gamma \\le 1/2`. Same as thesis Corollary 3.1. Raises ValueError for :math:`\\gamma \\le 0`
    or :math:`\\kappa \\notin (0, 1]`; :math:`\\gamma > J^*` is not rejected (the assumption cannot
    hold there, see :func:`theorem1_log10_nodes`).
    """
    gamma, M, K = _check_bound_args(gamma, M, K)
    kappa = _check_kappa(kappa)
    exponent = 16.0 * (M - 1) * math.log(K) / (LOG2_E * M * M * gamma * gamma)
    return exponent * -math.log10(kappa)


def thesis_corollary32_error_bound(
    gamma: float, M: int, K: float, balanced: bool = False, with_m_minus_1_factor: bool = True
) -> float:
    """Thesis Corollary 3.2: the error bound obtained by inverting Theorem 3.1 / Corollary 3.1.

    .. math:: \\epsilon \\le \\Big(\\frac{M-1}{K}\\Big)^{\\frac{M^2\\log_2 e\\;\\gamma^2}{16\\, F\\, \\ln K}}

    where F is chosen by the flags:

    ==========  =====================  ====================================  ==========================
    balanced    with_m_minus_1_factor  F                                     as printed in the thesis?
    ==========  =====================  ====================================  ==========================
    False       False                  :math:`M(1-2\\gamma)+2\\gamma`           yes (general case)
    False       True                   :math:`[M(1-2\\gamma)+2\\gamma](M-1)`    no: the correct inversion
    True        True                   :math:`M-1`                           yes (balanced case), correct
    True        False                  1                                     no (for comparison only)
    ==========  =====================  ====================================  ==========================

    The proof sets :math:`N = K/(M-1)` internal nodes (an M-ary tree with K leaves has
    :math:`(K-1)/(M-1)`, strictly) in :math:`N = (1/\\kappa)^{c\\ln K}` and solves for
    :math:`\\kappa = N^{-1/(c\\ln K)}`; Theorem 3.1's :math:`c` contains :math:`(M-1)`, which the printed
    general formula omits while the balanced one keeps it. "log" is read as :math:`\\ln`, the only reading
    consistent with Theorem 3.1's :math:`\\ln K`. The value is at least 1 (vacuous) when
    :math:`K \\le M - 1`. Requires K >= 2; raises ValueError for :math:`\\gamma \\le 0` and, in the
    general case, for :math:`M(1-2\\gamma)+2\\gamma \\le 0`.
    """
    gamma, M, K = _check_bound_args(gamma, M, K)
    if K < 2:
        raise ValueError(f"K must be >= 2 (ln K appears in a denominator), got {K}")
    factor = 1.0 if balanced else _theorem1_factor(gamma, M)
    if with_m_minus_1_factor:
        factor *= M - 1
    exponent = M * M * LOG2_E * gamma * gamma / (16.0 * factor * math.log(K))
    return ((M - 1) / K) ** exponent
