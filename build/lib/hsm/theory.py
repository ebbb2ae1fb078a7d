"""The theory around the node objective :math:`J_n` (:mod:`hsm.objective`), as functions the book
checks numerically:

* Lemma 4 (balance of a pure split) and Lemma 5 as printed and repaired (purity of a balanced
  split), and the bound that holds for every split, :func:`purity_bound_from_balance`;
* Theorem 1 and Corollary 1 (how many nodes reach a given error, as log10), and the thesis'
  Corollary 3.2;
* the estimates of :math:`q` and :math:`p_{j|i}` at a node from a sample (§4): discrete (the child
  each example goes to) and continuous (the probabilities the node gives it).

Arrays in and out as in :mod:`hsm.objective`.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from ._arrays import ArrayLike, as_float64_numpy, check_arity, check_finite, check_real, to_float_arrays, torch_if_tensor
from .objective import DEFAULT_ATOL, max_objective

__all__ = [
    "NodeEstimates",
    "continuous_estimates",
    "corollary1_log10_nodes",
    "discrete_estimates",
    "lemma4_balance_lower_bound",
    "lemma5_purity_bound_printed",
    "lemma5_purity_bound_repaired",
    "purity_bound_from_balance",
    "theorem1_log10_nodes",
    "thesis_corollary32_error_bound",
]

#: :math:`\log_2 e`, the constant that appears in Theorem 1 and Corollary 1.
LOG2_E = 1.0 / math.log(2.0)


# ----------------------------------------------------------------------------------------------------
# Lemmas 4 and 5
# ----------------------------------------------------------------------------------------------------


def _objective_gap(J: Any, M: Any, atol: float) -> tuple[Any, int, Any]:
    """Validate J in [0, J*] (within atol) and return (J* - J clipped at 0, M, torch module or None)."""
    M = check_arity(M)
    (J,), torch = to_float_arrays({"J": J})
    check_finite("J", J)
    j64 = as_float64_numpy(J)
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
    beta = check_real("beta", beta)
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
    torch = torch_if_tensor(children, labels)
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
    torch = torch_if_tensor(probs, labels)
    if torch is not None and not isinstance(probs, torch.Tensor):
        # tensor labels with array probs: results are still tensors (default dtype, labels' device)
        (probs,), _ = to_float_arrays({"probs": probs})
        probs = torch.as_tensor(probs, dtype=torch.get_default_dtype(), device=labels.device)
    (probs,), torch = to_float_arrays({"probs": probs})
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
    p64 = as_float64_numpy(probs)
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
    gamma = check_real("gamma", gamma)
    M = check_arity(M)
    K = check_real("K", K)
    if not K.is_integer() or K < 1:
        raise ValueError(f"K (number of labels) must be an integer >= 1, got {K}")
    if gamma <= 0.0:
        raise ValueError(f"gamma must be > 0 (Weak Hypothesis Assumption J_n >= gamma), got {gamma}")
    return gamma, M, K


def _check_kappa(kappa: Any) -> float:
    kappa = check_real("kappa", kappa)
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
