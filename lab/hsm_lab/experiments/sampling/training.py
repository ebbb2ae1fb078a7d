"""Figs. 1 and 2 of Barber & Botev: softmax regression on data drawn from the model (their §4),
trained by gradient ascent with momentum on the exact likelihood or on one of its approximations
(§2-3), with the exact log-likelihood and the bias of the predictions tracked along the way.

:func:`make_problem` draws the data, :func:`_method_loss` is each method's minibatch objective
(the losses themselves are :mod:`hsm.sampling`'s), :func:`train_softmax_regression` is one run,
:func:`_pick_lr` the "largest rate that ensured convergence" of the paper's Fig. 2 caption, and
:func:`_run_methods` every run of a figure."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hsm import sampling as S
from hsm_lab.config import seed_everything

from hsm_lab.experiments.sampling.presets import DEFAULT_RATES
from hsm_lab.experiments.sampling.report import _fig_record

__all__ = ["SoftmaxRegressionProblem", "make_problem", "train_softmax_regression"]


@dataclass
class SoftmaxRegressionProblem:
    """Data drawn from a softmax regression ``p(c|x) = softmax(W0 x)`` (realisable, Barber & Botev §4)."""

    x: torch.Tensor  #: [N, D]
    y: torch.Tensor  #: [N]
    true_weight: torch.Tensor  #: [C, D]

    @property
    def num_classes(self) -> int:
        return self.true_weight.shape[0]


def make_problem(num_points: int = 2000, dim: int = 100, num_classes: int = 1000, score_scale: float = 3.0,
                 seed: int = 0) -> SoftmaxRegressionProblem:
    """``x ~ N(0, I_D)``, ``W0 ~ N(0, score_scale^2 / D)`` (so each score ``w_c^T x`` has standard deviation
    ``score_scale``), ``c ~ softmax(W0 x)``. The paper gives no scale; 3 makes the true model fairly
    confident (its mean log-likelihood is printed in the result file)."""
    if min(num_points, dim) < 1 or num_classes < 2:
        raise ValueError("need num_points, dim >= 1 and num_classes >= 2")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_points, dim, generator=gen)
    weight = torch.randn(num_classes, dim, generator=gen) * (score_scale / math.sqrt(dim))
    probs = torch.softmax(x @ weight.t(), dim=1)
    y = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return SoftmaxRegressionProblem(x, y, weight)


def _mean_loglik(weight: torch.Tensor, problem: SoftmaxRegressionProblem) -> float:
    logp = torch.log_softmax(problem.x @ weight.t(), dim=1)
    return float(logp.gather(1, problem.y[:, None]).mean())


def _probs(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ weight.t(), dim=1)


def _method_loss(method: str, weight: torch.Tensor, x: torch.Tensor, y: torch.Tensor, freq: torch.Tensor,
                 num_negatives: int, gen: torch.Generator, alpha: float, explicit: str,
                 blackout_power: float) -> tuple[torch.Tensor, int]:
    """The minibatch loss (a sum over the minibatch, Barber & Botev Eq. 8) and how many scores
    ``w^T x`` it computed. ``method``: ``exact`` (Eq. 8); the normalisation approximations
    ``importance`` and ``bernoulli`` (§2.1, Eq. 22-26: the minibatch's classes plus sampled ones);
    ``ranking`` (§3.3, Eq. 35 with offset ``alpha``); ``negative_sampling`` (§3.3.2, Eq. 43-45);
    ``blackout`` (§3.4, Eq. 46-47); ``nce`` with z = 1 (§3.2, Eq. 30-31)."""
    num_classes = weight.shape[0]
    batch = y.shape[0]
    if method == "exact":
        return S.exact_nll(x @ weight.t(), y), batch * num_classes
    if method in ("importance", "bernoulli"):
        chosen = S.normalisation_classes(y, freq, num_negatives, method, explicit, gen)
        # a shared set is scored once per example as well: B * S dot products
        scores = S.gather_scores(x, weight, None, chosen.classes)
        finite = torch.isfinite(chosen.log_weight).sum()
        return S.sampled_softmax_nll(scores, chosen.log_weight, chosen.target_column), int(finite)
    target_scores = (x * weight[y]).sum(1)
    if method == "ranking":
        negatives = S.sample_uniform_negatives(y, num_classes, num_negatives, gen)
        scores = S.gather_scores(x, weight, None, negatives)
        return S.ranking_loss(target_scores, scores, alpha), batch * (1 + num_negatives)
    if method == "negative_sampling":
        proposal = freq ** 0.75  # word2vec's unigram^(3/4), excluding the target
        negatives, _ = S.sample_importance(proposal / proposal.sum(), num_negatives,
                                           torch.nn.functional.one_hot(y, num_classes).bool(), gen)
        return S.negative_sampling_loss(target_scores, S.gather_scores(x, weight, None, negatives)), \
            batch * (1 + num_negatives)
    if method == "blackout":
        proposal = freq.double() ** blackout_power
        proposal = proposal / proposal.sum()
        negatives, _ = S.sample_importance(proposal, num_negatives, torch.nn.functional.one_hot(y, num_classes).bool(), gen)
        log_q = proposal.log().to(x.dtype)
        loss = S.blackout_loss(target_scores, S.gather_scores(x, weight, None, negatives), log_q[y], log_q[negatives])
        return loss, batch * (1 + num_negatives)
    if method == "nce":
        noise = torch.multinomial(freq.double(), batch * num_negatives, replacement=True, generator=gen)
        noise = noise.view(batch, num_negatives)
        log_pn = freq.log().to(x.dtype)
        loss = S.nce_loss(target_scores, S.gather_scores(x, weight, None, noise), log_pn[y], log_pn[noise], num_negatives)
        return loss, batch * (1 + num_negatives)
    raise ValueError(f"unknown method {method!r}; known: exact, importance, bernoulli, ranking, blackout, nce, negative_sampling")


def train_softmax_regression(problem: SoftmaxRegressionProblem, method: str, iterations: int, lr: float,
                             batch_size: int = 50, num_negatives: int = 20, momentum: float = 0.99,
                             alpha: float = 1.0, explicit: str = "minibatch", blackout_power: float = 0.5,
                             eval_every: int = 25, data_seed: int = 0, sample_seed: int = 1,
                             reference: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """Gradient ascent with momentum on one objective; the exact log-likelihood is tracked.

    Every method starts from ``W = 0`` and sees the same minibatch sequence (``data_seed``); the
    negatives come from a separate generator (``sample_seed``). ``reference`` (the exact run's
    weights at the evaluation points) gives the bias against the exact-gradient run.

    Returns a dict of lists per evaluation point: ``iteration``, ``loglik`` (mean exact
    log-likelihood on the training set), ``bias_vs_true`` (log10 mean ``|p_theta - p_theta0|``),
    ``bias_vs_exact`` and ``param_diff_vs_exact`` (log10 mean ``|W - W_exact|``) when ``reference`` is given,
    plus ``weights`` (the snapshots), ``scores_per_batch`` (mean w^T x computed) and ``diverged``.
    """
    name = "ranking" if method.startswith("ranking") else method
    num_points = problem.x.shape[0]
    weight = torch.zeros(problem.num_classes, problem.x.shape[1], requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=lr, momentum=momentum)
    freq = S.class_frequencies(problem.y, problem.num_classes).float()
    data_gen = torch.Generator().manual_seed(data_seed)
    sample_gen = torch.Generator().manual_seed(sample_seed)
    true_probs = _probs(problem.true_weight, problem.x)
    out: dict[str, Any] = {"iteration": [], "loglik": [], "bias_vs_true": [], "bias_vs_exact": [],
                           "param_diff_vs_exact": [], "weights": [], "diverged": False}
    scores_used = []
    order = torch.randperm(num_points, generator=data_gen)
    cursor = 0

    def evaluate(step: int) -> bool:
        with torch.no_grad():
            ll = _mean_loglik(weight, problem)
            if not math.isfinite(ll):
                out["diverged"] = True
                return False
            probs = _probs(weight, problem.x)
            out["iteration"].append(step)
            out["loglik"].append(ll)
            out["bias_vs_true"].append(math.log10(float((probs - true_probs).abs().mean()) + 1e-30))
            if reference is not None:
                ref = reference[len(out["weights"])]
                out["bias_vs_exact"].append(math.log10(float((probs - _probs(ref, problem.x)).abs().mean()) + 1e-30))
                out["param_diff_vs_exact"].append(math.log10(float((weight - ref).abs().mean()) + 1e-30))
            out["weights"].append(weight.detach().clone())
        return True

    evaluate(0)
    for step in range(1, iterations + 1):
        if cursor + batch_size > num_points:
            order = torch.randperm(num_points, generator=data_gen)
            cursor = 0
        idx = order[cursor:cursor + batch_size]
        cursor += batch_size
        loss, used = _method_loss(name, weight, problem.x[idx], problem.y[idx], freq, num_negatives, sample_gen,
                                  alpha, explicit, blackout_power)
        scores_used.append(used)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % eval_every == 0 and not evaluate(step):
            break
    out["scores_per_batch"] = float(np.mean(scores_used)) if scores_used else 0.0
    return out


def _pick_lr(problem: SoftmaxRegressionProblem, method: str, grid: list[float], iterations: int, **kw: Any) -> float:
    """Largest rate of ``grid`` whose short run stays finite and ends above its starting log-likelihood."""
    best = None
    for lr in sorted(grid):
        run = train_softmax_regression(problem, method, iterations, lr, eval_every=max(iterations // 4, 1), **kw)
        if run["diverged"] or len(run["loglik"]) < 2 or not run["loglik"][-1] > run["loglik"][0] \
                or min(run["loglik"]) < run["loglik"][0] - 1.0:
            break
        best = lr
    # NCE with z = 1 never raises the exact likelihood (the paper's "very poor"): keep the smallest rate
    return best if best is not None else min(grid)


def _pick_rates(cfg: dict[str, Any], methods: dict[str, dict[str, Any]], problem: SoftmaxRegressionProblem,
                common: dict[str, Any]) -> dict[str, float]:
    """The learning rate of every method of a figure (on the first seed's ``problem``): the exact and
    normalisation methods share ``lr_exact`` (Fig. 2 caption: "set the same"); every other method
    gets :func:`_pick_lr`'s rate at full scale (``pick_lr``), the full run's choice (DEFAULT_RATES)
    at quick scale."""
    rates: dict[str, float] = {}
    for label, spec in methods.items():
        if label == "exact" or spec.get("share_exact_lr"):
            rates[label] = cfg["lr_exact"]
            continue
        if not cfg["pick_lr"]:  # quick mode: the rates the full run picked
            rates[label] = DEFAULT_RATES.get(spec["method"], cfg["lr_exact"])
            continue
        rates[label] = _pick_lr(problem, spec["method"], cfg["lr_grid"], cfg["lr_pick_iterations"],
                                alpha=spec.get("alpha", 1.0), **common)
    return rates


def _run_methods(cfg: dict[str, Any], methods: dict[str, dict[str, Any]], figure: str) -> tuple[list[dict], dict]:
    """Run every method for every seed, all from ``W = 0`` on the seed's minibatch sequence; return
    the records (:func:`~.report._fig_record`) and the learning rates, picked once, on the first seed."""
    records: list[dict[str, Any]] = []
    rates: dict[str, float] = {}
    common = dict(batch_size=cfg["batch_size"], num_negatives=cfg["num_negatives"], momentum=cfg["momentum"],
                  explicit=cfg["explicit"], blackout_power=cfg["blackout_power"])
    for seed in cfg["seeds"]:
        seed_everything(seed)
        problem = make_problem(cfg["num_points"], cfg["dim"], cfg["num_classes"], cfg["score_scale"], seed=seed)
        true_ll = _mean_loglik(problem.true_weight, problem)
        if not rates:
            rates = _pick_rates(cfg, methods, problem, common)
        exact = train_softmax_regression(problem, "exact", cfg["iterations"], rates["exact"], eval_every=cfg["eval_every"],
                                         data_seed=seed, sample_seed=1000 + seed, **common)
        for label, spec in methods.items():
            print(f"[{figure}] seed {seed}: {label} (lr {rates[label]:g})", file=sys.stderr, flush=True)
            run = exact if label == "exact" else train_softmax_regression(
                problem, spec["method"], cfg["iterations"], rates[label], eval_every=cfg["eval_every"],
                data_seed=seed, sample_seed=1000 + seed, alpha=spec.get("alpha", 1.0), reference=exact["weights"], **common)
            records.append(_fig_record(run, figure, label, spec, seed, rates[label], true_ll))
    return records, rates
