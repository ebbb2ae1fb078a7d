"""Approximations of the softmax likelihood that avoid the sum over all classes (Barber & Botev).

The softmax ``p(c|x) = u(c, x) / Z(x)`` with ``u = exp(s)`` needs ``Z(x) = sum_d u(d, x)`` over all C
classes (their Eq. 1-2). This module gives, as losses to *minimise* (so each is minus the paper's
objective), every approximation the paper compares:

* :func:`exact_nll`: minus Eq. 3, the exact log-likelihood;
* :func:`sampled_softmax_nll`: minus Eq. 23 with ``Z~`` of Eq. 22, the paper's proposal. The explicit
  classes ``C_n`` (which must contain the target ``c_n``, so that ``gamma~`` stays in [-1, 1],
  Eq. 26) enter with weight 1, the sampled negatives ``N_n`` with ``kappa = 1 / (K q_n(d))``
  (importance sampling, :func:`sample_importance`) or ``kappa = 1 / b_d`` (Bernoulli sampling,
  :func:`sample_bernoulli`, :func:`bernoulli_inclusion`);
* :func:`ranking_loss`: minus Eq. 35 (log-ranking with offset ``alpha``; Eq. 41 shows that
  ``alpha = log(C - 1)`` is a one-sample likelihood approximation, :func:`ranking_offset`);
* :func:`blackout_loss`: minus Eq. 47 (BlackOut, Ji et al. 2016);
* :func:`nce_loss`: the NCE objective whose gradient is Eq. 30, with ``z_m = 1`` (Eq. 31);
* :func:`negative_sampling_loss`: minus Eq. 43 with the negative terms scaled by ``1/K`` (Eq. 45).

All losses take ``scores`` of the classes involved, ``s = w_c^T h + b_c``, gathered by the caller
(:func:`gather_scores`), so they are output layers for any network (the softmax regression of the
paper's §4 has ``h = x``). Autograd then gives exactly the paper's ``gamma``-weighted gradients
(Eq. 24-25, 34-35, 44-45; checked in ``tests/test_sampling.py``).

:class:`SampledSoftmax` packs them as an output layer (exact at evaluation) with a sparse-gradient
path, so a training step costs ``O((U + K) d)`` for U scored classes instead of ``O(C d)``.

Also here: the variance formulas (18) and (21) and the expected variances of footnote 2 (the
paper's, and the corrected importance-sampling one), used by the notebook
``notebooks/sampling_softmax.md``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "SampledClasses",
    "SampledSoftmax",
    "bernoulli_inclusion",
    "bernoulli_variance",
    "blackout_loss",
    "class_frequencies",
    "exact_nll",
    "expected_variance_bernoulli",
    "expected_variance_importance",
    "expected_variance_importance_as_printed",
    "gather_scores",
    "importance_variance",
    "nce_loss",
    "negative_sampling_loss",
    "normalisation_classes",
    "ranking_loss",
    "ranking_offset",
    "sample_bernoulli",
    "sample_importance",
    "sample_negatives_excluding_target",
    "sample_uniform_negatives",
    "sampled_softmax_nll",
]


class SampledClasses(NamedTuple):
    """The classes one approximation looks at, per example.

    ``classes[b, j]`` is a class id (``-1``/anything where ``log_weight`` is ``-inf``: padding),
    ``log_weight[b, j]`` is ``log kappa`` (0 for the explicit classes ``C_n``; ``-inf`` for padding),
    ``target_column[b]`` is the column of ``classes`` holding the target ``c_n``.
    """

    classes: Tensor  #: [B, S] int64
    log_weight: Tensor  #: [B, S] float
    target_column: Tensor  #: [B] int64


# ------------------------------------------------------------------------------------------ checks


def _check_scores(scores: Tensor, name: str = "scores") -> None:
    if not isinstance(scores, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scores).__name__}")
    if scores.dim() != 2:
        raise ValueError(f"{name} must have shape [B, S], got {list(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {scores.dtype}")


def _check_target(target: Tensor, batch: int, num_classes: int, name: str = "target") -> None:
    if not isinstance(target, Tensor) or target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an integer tensor")
    if target.shape != (batch,):
        raise ValueError(f"{name} must have shape [{batch}], got {list(target.shape)}")
    if batch and (int(target.min()) < 0 or int(target.max()) >= num_classes):
        raise ValueError(f"{name} holds ids outside 0..{num_classes - 1}")


def _check_frequencies(freq: Tensor) -> None:
    if not isinstance(freq, Tensor) or freq.dim() != 1 or not freq.is_floating_point():
        raise TypeError("freq must be a 1-d floating-point tensor of class frequencies")
    if bool((freq <= 0).any()):
        raise ValueError("class frequencies must be > 0 (smooth them: class_frequencies(..., smoothing=1)); "
                         "a class with zero probability is never sampled and the estimate of Z is biased")


# ------------------------------------------------------------------------------------------ scores


def gather_scores(hidden: Tensor, weight: Tensor, bias: Tensor | None, classes: Tensor) -> Tensor:
    """Scores ``s[b, j] = w_{classes[b, j]}^T h_b + bias`` of only the classes asked for.

    ``classes`` is ``[S]`` (one set shared by the batch: a matrix product) or ``[B, S]`` (a set per
    example). Negative ids (padding) are scored as class 0; mask them with ``log_weight = -inf``.
    This is the only place the cost is paid: ``B * S`` dot products instead of ``B * C``.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [B, d] and weight [C, d] do not match: {list(hidden.shape)}, {list(weight.shape)}")
    safe = classes.clamp_min(0)
    if classes.dim() == 1:
        scores = hidden @ weight[safe].t()
        if bias is not None:
            scores = scores + bias[safe]
        return scores
    if classes.dim() != 2 or classes.shape[0] != hidden.shape[0]:
        raise ValueError(f"classes must be [S] or [B, S] with B = {hidden.shape[0]}, got {list(classes.shape)}")
    scores = torch.einsum("bd,bsd->bs", hidden, weight[safe])
    if bias is not None:
        scores = scores + bias[safe]
    return scores


# ------------------------------------------------------------------------------------------ samplers


def class_frequencies(labels: Tensor, num_classes: int, smoothing: float = 1.0) -> Tensor:
    """Empirical class frequencies ``f(c)`` (§2.1.2, §4), with add-``smoothing`` counts.

    The paper uses the raw empirical frequency. A class absent from the training set then has
    ``f = 0`` and is never sampled, so neither the importance nor the Bernoulli estimate of ``Z``
    is unbiased for it (both need ``q, b > 0`` wherever ``u > 0``); ``smoothing = 1`` (our default)
    keeps every class reachable. Returns a float64 tensor summing to one.
    """
    if smoothing < 0:
        raise ValueError(f"smoothing must be >= 0, got {smoothing}")
    labels = torch.as_tensor(labels)
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must be in 0..{num_classes - 1}")
    counts = torch.bincount(labels.reshape(-1).long(), minlength=num_classes).double() + smoothing
    if float(counts.sum()) <= 0:
        raise ValueError("no labels and no smoothing: frequencies are undefined")
    return counts / counts.sum()


def bernoulli_inclusion(freq: Tensor, num_negatives: float, exclude: Tensor | None = None,
                        tol: float = 1e-10) -> tuple[Tensor, Tensor]:
    """Bernoulli probabilities ``b_c = f(c)^alpha`` with ``alpha`` set so that ``sum_{c not in C_n} b_c = K`` (§2.1.2).

    Args:
        freq: [C] class frequencies, all > 0 and < 1.
        num_negatives: K, the expected number of sampled classes, ``0 < K <= |C_n^c|``.
        exclude: [C] or [B, C] bool, the explicit classes ``C_n`` (not sampled, ``b = 0`` there).

    Returns:
        ``(b, alpha)``: b of the shape of ``exclude`` (or [C]) and ``alpha`` ([] or [B]).
        ``alpha`` is found by bisection on [0, 1]: the sum decreases in ``alpha`` since ``f < 1``,
        equals ``|C_n^c|`` at 0 and ``f(C_n^c) <= 1`` at 1 (so ``0 < alpha < 1`` when ``1 < K < |C_n^c|``).
    """
    _check_frequencies(freq)
    if exclude is None:
        exclude = torch.zeros_like(freq, dtype=torch.bool)
    if exclude.dtype != torch.bool or exclude.shape[-1] != freq.shape[0] or exclude.dim() > 2:
        raise ValueError("exclude must be a bool tensor [C] or [B, C]")
    free = (~exclude).sum(-1).double()
    if bool((free < num_negatives).any()) or num_negatives <= 0:
        raise ValueError(f"K = {num_negatives} must be in (0, |C_n^c|]; the complement has {int(free.min())} classes")
    log_f = freq.double().log()
    if bool((freq >= 1).any()):
        raise ValueError("class frequencies must be < 1 (b = f^alpha decreases in alpha only then)")
    lo = torch.zeros(free.shape, dtype=torch.float64)
    hi = torch.ones(free.shape, dtype=torch.float64)
    # at alpha = 1 the sum is f(C_n^c) <= 1; double hi until the sum falls below K (needed when K < 1)
    for _ in range(64):
        total = torch.where(exclude, 0.0, torch.exp(hi.unsqueeze(-1) * log_f)).sum(-1)
        if not bool((total > num_negatives).any()):
            break
        hi = torch.where(total > num_negatives, hi * 2, hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        total = torch.where(exclude, 0.0, torch.exp(mid.unsqueeze(-1) * log_f)).sum(-1)
        too_many = total > num_negatives
        lo = torch.where(too_many, mid, lo)
        hi = torch.where(too_many, hi, mid)
        if float((hi - lo).max()) < tol:
            break
    alpha = (lo + hi) / 2
    b = torch.where(exclude, 0.0, torch.exp(alpha.unsqueeze(-1) * log_f)).to(freq.dtype)
    return b, alpha


def sample_bernoulli(b: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One joint sample ``s ~ prod_i Bernoulli(b_i)`` (Eq. 19-20): a bool mask of the shape of ``b``."""
    if bool(((b < 0) | (b > 1)).any()):
        raise ValueError("Bernoulli probabilities must lie in [0, 1]")
    return torch.rand(b.shape, generator=generator, dtype=b.dtype) < b


def sample_importance(freq: Tensor, num_samples: int, exclude: Tensor | None = None,
                      generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``K`` draws with replacement from ``q_n(d) proportional to f(d)`` over the complement of ``C_n`` (footnote 3).

    Returns ``(samples, q)``: ids ``[K]`` (or ``[B, K]`` when ``exclude`` is ``[B, C]``) and their
    probabilities under ``q_n``; Eq. 22's weight is ``kappa = 1 / (K q_n(d))``.
    """
    _check_frequencies(freq)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    q = freq.double()
    if exclude is not None:
        q = torch.where(exclude, 0.0, q)
    q = q / q.sum(-1, keepdim=True)
    rows = q if q.dim() == 2 else q.unsqueeze(0)
    samples = torch.multinomial(rows, num_samples, replacement=True, generator=generator)
    probs = rows.gather(1, samples)
    if q.dim() == 1:
        samples, probs = samples[0], probs[0]
    return samples, probs.to(freq.dtype)


def sample_uniform_negatives(target: Tensor, num_classes: int, num_samples: int,
                             generator: torch.Generator | None = None) -> Tensor:
    """``[B, K]`` classes drawn uniformly from ``{d != c_b}`` with replacement (the ``q(d) = 1/(C-1)`` of Eq. 38)."""
    if num_classes < 2:
        raise ValueError("need at least 2 classes to draw a negative")
    draws = torch.randint(0, num_classes - 1, (target.shape[0], num_samples), generator=generator)
    return draws + (draws >= target.unsqueeze(1)).long()  # skip the target: uniform over the other C-1


def normalisation_classes(target: Tensor, freq: Tensor, num_negatives: int, method: str = "bernoulli",
                          explicit: str = "minibatch", generator: torch.Generator | None = None) -> SampledClasses:
    """The classes and weights of Eq. 22 for a minibatch, ready for :func:`gather_scores` and
    :func:`sampled_softmax_nll`.

    Args:
        target: [B] labels ``c_n``.
        freq: [C] class frequencies ``f(c) > 0`` (:func:`class_frequencies`).
        num_negatives: K.
        method: ``"importance"`` (K draws with replacement from ``q_n proportional to f`` on the
            complement, ``kappa = 1/(K q_n)``, §4: ``Q(c) = f(c)``) or ``"bernoulli"`` (one joint draw with
            ``b = f^alpha``, ``sum b = K`` on the complement, ``kappa = 1/b``, §2.1.2).
        explicit: ``"minibatch"``: ``C_n`` = every class of the minibatch, shared by its examples
            (the Fig. 2 caption: K negatives "in addition to the classes in each minibatch"); the
            negatives are shared too. ``"target"``: ``C_n = {c_n}`` and K negatives per example (the
            "closest comparator to BlackOut" of §2.1.3; 1 + K classes per example, the caption's
            "roughly 1050 calculations" for 50 examples and K = 20).

    Returns:
        :class:`SampledClasses` with ``classes`` ``[B, S]`` (the shared case is broadcast).
    """
    if method not in ("importance", "bernoulli"):
        raise ValueError(f"method must be 'importance' or 'bernoulli', got {method!r}")
    if explicit not in ("minibatch", "target"):
        raise ValueError(f"explicit must be 'minibatch' or 'target', got {explicit!r}")
    _check_frequencies(freq)
    num_classes = freq.shape[0]
    _check_target(target, target.shape[0] if target.dim() == 1 else -1, num_classes)
    batch = target.shape[0]
    if explicit == "minibatch":
        explicit_classes, target_column = torch.unique(target, return_inverse=True)
        exclude = torch.zeros(num_classes, dtype=torch.bool)
        exclude[explicit_classes] = True
        explicit_classes = explicit_classes.unsqueeze(0).expand(batch, -1)
    else:
        explicit_classes = target.unsqueeze(1)
        target_column = torch.zeros(batch, dtype=torch.long)
        exclude = F.one_hot(target, num_classes).bool()
    if method == "importance":
        negatives, q = sample_importance(freq, num_negatives, exclude, generator)
        log_kappa = -(math.log(num_negatives) + q.log())
        if negatives.dim() == 1:
            negatives, log_kappa = negatives.expand(batch, -1), log_kappa.expand(batch, -1)
    else:
        b, _ = bernoulli_inclusion(freq, num_negatives, exclude)
        chosen = sample_bernoulli(b, generator)
        if chosen.dim() == 1:
            negatives = torch.nonzero(chosen).squeeze(1).expand(batch, -1)
            log_kappa = -b[negatives].log()
        else:  # a different number per example: pad to the longest with -inf weights
            width = max(int(chosen.sum(1).max()), 1)
            order = torch.argsort(chosen.int(), dim=1, descending=True, stable=True)[:, :width]
            valid = chosen.gather(1, order)
            negatives = torch.where(valid, order, torch.full_like(order, -1))
            log_kappa = torch.where(valid, -b.gather(1, order).log(), torch.full(order.shape, -math.inf, dtype=b.dtype))
    classes = torch.cat([explicit_classes, negatives], dim=1)
    log_weight = torch.cat([torch.zeros(explicit_classes.shape, dtype=log_kappa.dtype), log_kappa], dim=1)
    return SampledClasses(classes, log_weight, target_column)


# ------------------------------------------------------------------------------------------ losses


def exact_nll(scores: Tensor, target: Tensor, reduction: str = "sum") -> Tensor:
    """Minus the exact log-likelihood, Eq. 3, from all C scores ``[B, C]``.

    ``reduction="sum"`` matches Eq. 8 (the minibatch gradient is a sum), ``"mean"`` / ``"none"`` too.
    """
    _check_scores(scores)
    _check_target(target, scores.shape[0], scores.shape[1])
    return _reduce(-torch.log_softmax(scores, dim=1).gather(1, target[:, None]).squeeze(1), reduction)


def sampled_softmax_nll(scores: Tensor, log_weight: Tensor, target_column: Tensor, reduction: str = "sum") -> Tensor:
    """Minus the approximate log-likelihood of Eq. 23 (with the ``log`` the paper drops on ``u(c_n, x_n)``).

    ``log Z~ = logsumexp_j (s_j + log kappa_j)`` over the columns: the explicit classes ``C_n``
    (``log kappa = 0``) and the sampled negatives ``N_n`` (``log kappa = -log(K q_n(d))`` or
    ``-log b_d``); ``-inf`` masks padding. The target's column must be an explicit one
    (``log kappa = 0``): that is what keeps ``p~(c_n|x_n) <= 1`` and ``gamma~`` in [-1, 1] (Eq. 26).
    The gradient with respect to ``s_j`` is ``-(delta_{j, c_n} - p~_j)`` with ``p~`` of Eq. 25.
    """
    _check_scores(scores)
    if log_weight.shape != scores.shape:
        raise ValueError(f"log_weight must have the shape of scores {list(scores.shape)}, got {list(log_weight.shape)}")
    _check_target(target_column, scores.shape[0], scores.shape[1], "target_column")
    target_lw = log_weight.gather(1, target_column[:, None]).squeeze(1)
    if bool((target_lw != 0).any()):
        raise ValueError("the target must be an explicit class (log_weight 0 in its column): Eq. 15 requires c_n in C_n")
    log_z = torch.logsumexp(scores + log_weight.to(scores.dtype), dim=1)
    return _reduce(log_z - scores.gather(1, target_column[:, None]).squeeze(1), reduction)


def ranking_loss(target_scores: Tensor, negative_scores: Tensor, alpha: float,
                 negative_mask: Tensor | None = None, reduction: str = "sum") -> Tensor:
    """Minus the log-ranking objective of Eq. 33/35: ``-(1/|N_m|) sum_d log sigma(s_c - s_d - alpha)``.

    ``sigma`` is the logistic ``1/(1 + e^{-x})`` (the paper prints ``1/(1 + e^{x})``, a typo: with it the
    objective would reward ranking the negative above the target). ``alpha = log(C - 1)`` makes each
    term the one-sample likelihood approximation of Eq. 41 (:func:`ranking_offset`).
    """
    _check_scores(negative_scores, "negative_scores")
    if target_scores.shape != (negative_scores.shape[0],):
        raise ValueError("target_scores must be [B] to match negative_scores [B, K]")
    terms = F.logsigmoid(target_scores[:, None] - negative_scores - alpha)
    return _reduce(-_masked_mean(terms, negative_mask), reduction)


def blackout_loss(target_scores: Tensor, negative_scores: Tensor, log_q_target: Tensor, log_q_negative: Tensor,
                  negative_mask: Tensor | None = None, reduction: str = "sum") -> Tensor:
    """Minus the BlackOut objective, Eq. 46-47: ``log p~(c) + sum_{d in N} log(1 - p~(d))`` with
    ``p~(j) proportional to u(j)/Q(j)`` normalised over ``{c} union N``.

    ``log_q_*`` are ``log Q`` of the proposal ``Q(c) proportional to f(c)^alpha`` (the weights are ``q_c = 1/Q(c)``).
    """
    _check_scores(negative_scores, "negative_scores")
    logits = torch.cat([(target_scores - log_q_target)[:, None], negative_scores - log_q_negative], dim=1)
    if negative_mask is not None:
        keep = torch.cat([torch.ones_like(negative_mask[:, :1]), negative_mask], dim=1)
        logits = logits.masked_fill(~keep, -math.inf)
    log_total = torch.logsumexp(logits, dim=1, keepdim=True)
    log_p = logits - log_total
    # log(1 - p_d) = log(sum of the columns other than d) - log(sum of all): exact even where p_d
    # rounds to 1 (a rare negative with a large weight 1/Q), where log(1 - exp(log p_d)) is -inf
    num_negatives = logits.shape[1] - 1
    leave_out = torch.zeros(num_negatives, num_negatives + 1, dtype=logits.dtype, device=logits.device)
    leave_out[torch.arange(num_negatives), torch.arange(1, num_negatives + 1)] = -math.inf
    log_others = torch.logsumexp(logits.unsqueeze(1) + leave_out, dim=2)  # [B, K]
    log_one_minus = log_others - log_total
    if negative_mask is not None:
        log_one_minus = torch.where(negative_mask, log_one_minus, torch.zeros_like(log_one_minus))
    return _reduce(-(log_p[:, 0] + log_one_minus.sum(1)), reduction)


def nce_loss(target_scores: Tensor, noise_scores: Tensor, log_noise_target: Tensor, log_noise_samples: Tensor,
             num_noise: int, log_z: float | Tensor = 0.0, reduction: str = "sum") -> Tensor:
    """Noise-contrastive estimation (Gutmann & Hyvarinen) with ``p'(c|x) = u(c, x) / z`` (Eq. 31).

    Minus ``log sigma(D_c) + sum_i log(1 - sigma(D_{d_i}))`` with ``D_j = log p'(j) - log(k p_n(j))``:
    its gradient is Eq. 30. ``log_z = 0`` is the ``z_m = 1`` of Mnih & Teh that the paper tests (and
    finds very poor for softmax regression). The noise samples ``d_i ~ p_n`` range over all classes.
    """
    _check_scores(noise_scores, "noise_scores")
    log_k = math.log(num_noise)
    delta_target = target_scores - log_z - (log_k + log_noise_target)
    delta_noise = noise_scores - log_z - (log_k + log_noise_samples)
    objective = F.logsigmoid(delta_target) + F.logsigmoid(-delta_noise).sum(1)
    return _reduce(-objective, reduction)


def negative_sampling_loss(target_scores: Tensor, negative_scores: Tensor, scale_negatives: bool = True,
                           negative_mask: Tensor | None = None, reduction: str = "sum") -> Tensor:
    """Minus the negative-sampling objective, Eq. 43 (Mikolov et al.): ``log sigma(s_c) + sum_d log sigma(-s_d)``.

    ``scale_negatives`` divides the negative terms by their number, which is the normalisation of
    Eq. 45 (the positive term keeps weight 1).
    """
    _check_scores(negative_scores, "negative_scores")
    neg = F.logsigmoid(-negative_scores)
    neg_term = _masked_mean(neg, negative_mask) if scale_negatives else _masked_sum(neg, negative_mask)
    return _reduce(-(F.logsigmoid(target_scores) + neg_term), reduction)


def ranking_offset(num_classes: int) -> float:
    """``alpha = log(C - 1)``, the offset that makes the ranking objective the one-sample likelihood
    approximation (Eq. 36-41). ``log(999) = 6.9068``; the paper's 6.2126 is ``log(499)``."""
    if num_classes < 2:
        raise ValueError("num_classes must be >= 2")
    return math.log(num_classes - 1)


# ------------------------------------------------------------------------------------------ variances


def importance_variance(z: Tensor, q: Tensor, num_samples: int) -> Tensor:
    """Variance of the importance estimate ``(1/S) sum_s z_s / q(s)`` of ``Z = sum z``, Eq. 18."""
    return ((z**2 / q).sum(-1) - z.sum(-1) ** 2) / num_samples


def bernoulli_variance(z: Tensor, b: Tensor) -> Tensor:
    """Variance of the Bernoulli estimate ``sum_{s_i = 1} z_i / b_i`` of ``Z``, Eq. 21."""
    return ((1.0 / b - 1.0) * z**2).sum(-1)


def expected_variance_importance_as_printed(mu: float, sigma: float, num_classes: int, fraction: float) -> float:
    """Footnote 2 as printed: ``(sigma^2 + mu^2) C/f - mu^2 / (f C)`` (uniform q, ``S = f C``)."""
    return (sigma**2 + mu**2) * num_classes / fraction - mu**2 / (fraction * num_classes)


def expected_variance_importance(mu: float, sigma: float, num_classes: int, fraction: float) -> float:
    """The correct expectation of Eq. 18 over i.i.d. ``z_i ~ (mu, sigma^2)``, uniform ``q``, ``S = f C``:
    ``(1/S)(C^2 (sigma^2 + mu^2) - E[Z^2])`` with ``E[Z^2] = C^2 mu^2 + C sigma^2``, i.e. ``sigma^2 (C - 1) / f``.
    (The footnote subtracts ``mu^2`` where ``E[Z^2]`` belongs.) It does not grow with ``mu``."""
    return sigma**2 * (num_classes - 1) / fraction


def expected_variance_bernoulli(mu: float, sigma: float, num_classes: int, fraction: float) -> float:
    """Footnote 2's Bernoulli expectation of Eq. 21 with ``b_c = f``: ``(sigma^2 + mu^2) C (1/f - 1)`` (correct as printed)."""
    return (sigma**2 + mu**2) * num_classes * (1.0 / fraction - 1.0)


# ------------------------------------------------------------------------------------------ helpers


def _reduce(values: Tensor, reduction: str) -> Tensor:
    if reduction == "sum":
        return values.sum()
    if reduction == "mean":
        return values.mean()
    if reduction == "none":
        return values
    raise ValueError(f"reduction must be 'sum', 'mean' or 'none', got {reduction!r}")


def _masked_mean(values: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return values.mean(1)
    count = mask.sum(1).clamp_min(1)
    return torch.where(mask, values, torch.zeros_like(values)).sum(1) / count


def _masked_sum(values: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return values.sum(1)
    return torch.where(mask, values, torch.zeros_like(values)).sum(1)


# ------------------------------------------------------------------------------------------ output layer


def sample_negatives_excluding_target(proposal: Tensor, target: Tensor, num_samples: int,
                                      generator: torch.Generator | None = None, max_rounds: int = 8) -> Tensor:
    """``[B, K]`` draws with replacement from ``proposal`` restricted to ``{d != c_b}``, by rejection.

    The same distribution as :func:`sample_importance` with ``exclude = one_hot(target)``
    (``q_b(d) = proposal(d) / (1 - proposal(c_b))``, the negatives of BlackOut and negative sampling),
    but drawn from the shared 1-d proposal in ``O(C + B K log C)`` instead of ``O(B C)``: every draw
    that hits its row's target is drawn again (each round keeps a fraction ``proposal(c_b)`` of them,
    so a handful of rounds suffice; rows still hitting their target after ``max_rounds`` are drawn
    from the renormalised complement directly).
    """
    _check_frequencies(proposal)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    batch = target.shape[0]
    probs = proposal.double() / proposal.double().sum()
    if bool((probs[target] >= 1.0 - 1e-12).any()):
        raise ValueError("a target holds all the proposal's mass: there is no other class to draw")
    draws = torch.multinomial(probs, batch * num_samples, replacement=True, generator=generator)
    draws = draws.view(batch, num_samples)
    for _ in range(max_rounds):
        hit = draws == target[:, None]
        count = int(hit.sum())
        if count == 0:
            return draws
        draws[hit] = torch.multinomial(probs, count, replacement=True, generator=generator)
    # a class with most of the mass keeps being redrawn: draw the rest from the renormalised
    # complement directly (exact, O(C) per remaining row)
    for row in torch.nonzero((draws == target[:, None]).any(1)).squeeze(1).tolist():
        hit = draws[row] == target[row]
        rest = probs.clone()
        rest[target[row]] = 0.0
        draws[row, hit] = torch.multinomial(rest, int(hit.sum()), replacement=True, generator=generator)
    return draws


class _SparseRows1d(torch.autograd.Function):
    """``vector[index]`` whose gradient w.r.t. ``vector`` is a sparse COO tensor (only the rows used),
    the 1-d counterpart of ``F.embedding(..., sparse=True)`` (which needs a 2-d weight)."""

    @staticmethod
    def forward(ctx, vector: Tensor, index: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(index)
        ctx.size = vector.shape[0]
        return vector[index]

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (index,) = ctx.saved_tensors
        sparse = torch.sparse_coo_tensor(index.reshape(1, -1), grad.reshape(-1), (ctx.size,), check_invariants=False)
        return sparse, None


class SampledSoftmax(torch.nn.Module):
    """A flat softmax output layer trained with one of the approximations above, exact at evaluation.

    Same interface as :class:`hsm.FlatSoftmax` / :class:`hsm.HierarchicalSoftmax`
    (``forward(h, y) -> HSMOutput(output, loss)``, ``log_prob``, ``predict``, ``topk``), so it can be
    the output layer of any model in :mod:`hsm.models`. In training mode ``forward`` computes only
    the scores of the classes an approximation looks at and returns the approximate objective:
    ``output`` is the approximate log-likelihood for ``"importance"``/``"bernoulli"`` (Eq. 23) and
    minus the per-example loss otherwise; ``loss`` is the mean over the batch. In eval mode
    ``forward`` is the exact log-softmax (so perplexities are exact).

    Methods: ``"exact"``, ``"importance"``, ``"bernoulli"``, ``"ranking"`` (uniform negatives, offset
    ``alpha``, default ``log(C - 1)``), ``"blackout"`` (proposal ``f^blackout_power``), ``"nce"``
    (``z = 1``, noise ``f``), ``"negative_sampling"`` (proposal ``f^0.75``).

    Which classes are scored per minibatch of B examples:

    * ``"importance"``/``"bernoulli"`` with ``explicit="minibatch"`` (the default, the paper's Fig. 2
      setting): the distinct classes of the minibatch, summed exactly for every example, plus K
      sampled negatives shared by the minibatch, one ``[B, d] x [d, U + K]`` product;
    * with ``explicit="target"``: the target plus K negatives per example (``B (1 + K)`` scores; the
      Bernoulli inclusion probabilities are then solved per example, ``O(B C)`` per step: slow for
      large C);
    * the others: the target plus K negatives per example, drawn from a shared proposal with the
      target rejected (:func:`sample_negatives_excluding_target`).

    ``sparse=True`` gathers only the rows of the classes scored (``F.embedding(..., sparse=True)``),
    so the weight and bias gradients are sparse COO tensors touching those rows: an optimiser step
    then costs ``O((U + K) d)`` instead of ``O(C d)`` (``torch.optim.Adagrad`` / ``SGD`` accept
    sparse gradients; Adam does not). The values are the dense path's (``tests/test_sampling.py``).
    Evaluation is always dense (every class is scored anyway).
    """

    METHODS = ("exact", "importance", "bernoulli", "ranking", "blackout", "nce", "negative_sampling")

    def __init__(self, in_features: int, num_classes: int, freq: Tensor, method: str = "bernoulli",
                 num_negatives: int = 20, explicit: str = "minibatch", alpha: float | None = None,
                 blackout_power: float = 0.5, bias: bool = True, seed: int | None = None,
                 sparse: bool = False) -> None:
        super().__init__()
        if method not in self.METHODS:
            raise ValueError(f"method must be one of {self.METHODS}, got {method!r}")
        if explicit not in ("minibatch", "target"):
            raise ValueError(f"explicit must be 'minibatch' or 'target', got {explicit!r}")
        if num_classes < 2 or in_features < 1:
            raise ValueError("num_classes >= 2 and in_features >= 1 are required")
        freq = torch.as_tensor(freq, dtype=torch.float64)
        if freq.shape != (num_classes,):
            raise ValueError(f"freq must have shape [{num_classes}], got {list(freq.shape)}")
        _check_frequencies(freq)
        if num_negatives < 1 or num_negatives >= num_classes:
            raise ValueError(f"num_negatives must be in 1..{num_classes - 1}, got {num_negatives}")
        self.in_features, self.num_labels = in_features, num_classes
        self.method, self.num_negatives, self.explicit = method, num_negatives, explicit
        self.sparse = bool(sparse)
        self.alpha = ranking_offset(num_classes) if alpha is None else float(alpha)
        self.linear = torch.nn.Linear(in_features, num_classes, bias=bias)
        freq = freq / freq.sum()
        self.register_buffer("freq", freq.float(), persistent=False)
        # the samplers' proposals, normalised once (float64: the bisection and multinomial want it)
        self._freq64 = freq
        blackout = freq**blackout_power
        self._blackout64 = blackout / blackout.sum()
        self.register_buffer("log_blackout", self._blackout64.log().float(), persistent=False)
        word2vec = freq**0.75  # word2vec's unigram^(3/4)
        self._word2vec64 = word2vec / word2vec.sum()
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def _check(self, input: Tensor) -> None:
        """The output layers' input checks (:func:`hsm._checks.check_input`): TypeError for a
        non-tensor or another dtype than the layer's, ValueError for another shape or device and
        for NaN / infinite rows (named)."""
        from ._checks import check_input

        check_input(input, self.in_features, self.linear.weight)

    def _scores(self, input: Tensor, classes: Tensor) -> Tensor:
        """Scores of ``classes`` ([S] shared by the batch, or [B, S]), reading only those rows of the
        weight (sparsely with ``sparse=True``: one gradient row per column, duplicates summed by the
        optimiser's coalesce). Negative ids (padding) are scored as class 0."""
        classes = classes.clamp_min(0).to(input.device)
        if classes.dim() == 1:
            rows = torch.nn.functional.embedding(classes, self.linear.weight, sparse=self.sparse)  # [S, d]
            scores = input @ rows.t()
            index = classes
        else:
            # each distinct row is read (and gets a gradient row) once: the optimiser's sparse step
            # costs per gradient row, and B (1 + K) draws hold many repeats of the frequent classes
            unique, inverse = torch.unique(classes, return_inverse=True)
            rows = torch.nn.functional.embedding(unique, self.linear.weight, sparse=self.sparse)  # [U, d]
            # an elementwise product and a sum: a batched [1, d] x [d, S] product (bmm) is several times slower
            scores = (torch.nn.functional.embedding(inverse, rows) * input.unsqueeze(1)).sum(-1)
            index = inverse
        bias = self.linear.bias
        if bias is None:
            return scores
        if classes.dim() == 1:
            return scores + (_SparseRows1d.apply(bias, classes) if self.sparse else bias[classes])
        bias_rows = _SparseRows1d.apply(bias, unique) if self.sparse else bias[unique]
        return scores + bias_rows[index]

    def forward(self, input: Tensor, target: Tensor):
        from .layers import HSMOutput

        self._check(input)
        _check_target(target, input.shape[0], self.num_labels)
        # an empty batch has nothing to sample for: the exact path gives the empty output and the
        # NaN mean loss torch's losses give
        if not self.training or self.method == "exact" or input.shape[0] == 0:
            output = torch.log_softmax(self.linear(input), dim=1).gather(1, target[:, None]).squeeze(1)
            return HSMOutput(output, -output.mean())
        device = input.device
        target_cpu = target.cpu()
        m = self.method
        if m in ("importance", "bernoulli"):
            chosen = normalisation_classes(target_cpu, self._freq64, self.num_negatives, m, self.explicit,
                                           self.generator)
            # explicit="minibatch": every row of chosen.classes is the same shared set
            classes = chosen.classes[0] if self.explicit == "minibatch" else chosen.classes
            scores = self._scores(input, classes)
            if classes.dim() == 1:
                scores = scores.expand(input.shape[0], -1)
            per = -sampled_softmax_nll(scores, chosen.log_weight.to(device, scores.dtype),
                                       chosen.target_column.to(device), "none")
            return HSMOutput(per, -per.mean())
        if m == "ranking":
            negatives = sample_uniform_negatives(target_cpu, self.num_labels, self.num_negatives, self.generator)
        elif m == "blackout":
            negatives = sample_negatives_excluding_target(self._blackout64, target_cpu, self.num_negatives,
                                                          self.generator)
        elif m == "nce":  # NCE's noise ranges over all classes, the target included
            negatives = torch.multinomial(self._freq64, target.shape[0] * self.num_negatives, replacement=True,
                                          generator=self.generator).view(target.shape[0], -1)
        else:
            negatives = sample_negatives_excluding_target(self._word2vec64, target_cpu, self.num_negatives,
                                                          self.generator)
        # one gather for the target and its negatives: column 0 is the target
        scores = self._scores(input, torch.cat([target_cpu[:, None], negatives], dim=1))
        target_scores, negative_scores = scores[:, 0], scores[:, 1:]
        negatives = negatives.to(device)
        if m == "ranking":
            per = -ranking_loss(target_scores, negative_scores, self.alpha, reduction="none")
        elif m == "blackout":
            per = -blackout_loss(target_scores, negative_scores, self.log_blackout[target],
                                 self.log_blackout[negatives], reduction="none")
        elif m == "nce":
            log_pn = self.freq.log()
            per = -nce_loss(target_scores, negative_scores, log_pn[target], log_pn[negatives], self.num_negatives,
                            reduction="none")
        else:
            per = -negative_sampling_loss(target_scores, negative_scores, reduction="none")
        return HSMOutput(per, -per.mean())

    def log_prob(self, input: Tensor) -> Tensor:
        self._check(input)
        return torch.log_softmax(self.linear(input), dim=1)

    @torch.no_grad()
    def predict(self, input: Tensor) -> Tensor:
        self._check(input)
        return self.linear(input).argmax(dim=1)  # torch's argmax: the first (lowest) id among equal values

    @torch.no_grad()
    def topk(self, input: Tensor, k: int = 1, method: str = "exact", beam: int | None = None):
        from ._checks import check_k
        from .layers import TopK
        from .search import topk_lowest_id

        self._check(input)
        check_k(k, self.num_labels, method, beam)
        values, indices = topk_lowest_id(self.log_prob(input), int(k))  # equal values: the lowest id first
        visited = torch.full((input.shape[0],), self.num_labels, dtype=torch.long, device=input.device)
        return TopK(values, indices, visited)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_classes={self.num_labels}, method={self.method!r}, "
                f"num_negatives={self.num_negatives}, explicit={self.explicit!r}, sparse={self.sparse}")
