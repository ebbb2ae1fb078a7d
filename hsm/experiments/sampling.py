"""Seed 004 (Barber & Botev): softmax regression trained with approximations of the likelihood.

Two registered experiments redraw the paper's figures:

* ``sampling-fig2``: their Fig. 2. Synthetic softmax regression drawn from the model (N = 2000,
  D = 100, C = 1000), minibatch 50, K = 20 negatives, gradient ascent with momentum 0.99, one
  shared initialisation (zeros) and one shared minibatch sequence. Methods: the exact gradient;
  the normalisation approximations with importance sampling and with Bernoulli sampling
  (explicit minibatch classes plus sampled negatives, Eq. 22-26); ranking with alpha = 1 and
  alpha = log(C - 1) (Eq. 35, 42); BlackOut (Eq. 46-47); NCE with z = 1 (Eq. 30-31); negative
  sampling (Eq. 43-45). Recorded per evaluation point: the exact mean log-likelihood on the
  training set (panel a), the log mean absolute difference of the predicted class probabilities
  against the exact-gradient run (panel b; the caption says "parameters", the text says
  predictions: parameters are not identifiable under ``w_c^T x + a(x)``, so we compare
  predictions, and record the parameter difference as well), and against the true model.
* ``sampling-fig1``: their Fig. 1, the ranking objective for a sweep of alpha, with the exact
  gradient beside it.

And one beyond the paper:

* ``lm-ptb-sampling``: "tree or sampling?" -- the log-bilinear language model of ``lm-ptb`` (the
  main paper's PTB experiment) with its output layer trained by each approximation
  (:class:`hsm.sampling.SampledSoftmax` through :func:`hsm.experiments.lm.train_lm`), evaluated
  exactly, so that its perplexity and speed sit beside the flat softmax and the trees of
  ``results/lm/ptb.json`` (:func:`run_lm_ptb_sampling`).

Learning rates (Figs. 1-2). The paper sets the exact and normalisation approximations to one rate and
ranking/BlackOut to "the largest values that ensured convergence", without numbers. We use
``lr_exact = 1e-4`` (on the summed minibatch loss; with momentum 0.99 the exact run reaches a
training log-likelihood near 0 within about 1000 iterations, since N = 2000 points in D = 100
with C = 1000 classes are separable) for the exact and normalisation methods, and pick, for every
other method, the largest rate of a grid (seed 0, a short run) whose exact log-likelihood stays
finite, ends above its start and never drops more than 1 nat below it; the rates are in the
result file.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm import sampling as S
from hsm.config import seed_everything
from hsm.experiments import (check_device, check_scale, experiment, option_choice, option_float, option_floats,
                             option_int, option_ints)
from hsm.results import check_replace, make_record, output_path, provenance, write_results

__all__ = ["SoftmaxRegressionProblem", "make_problem", "train_softmax_regression", "METHODS", "run_fig2", "run_fig1",
           "LM_METHODS", "run_lm_ptb_sampling", "lm_rows"]

#: the methods of Fig. 2 (and the two the paper leaves out of it)
METHODS = ("exact", "importance", "bernoulli", "ranking_1", "ranking_logC", "blackout", "nce", "negative_sampling")


#: learning rates the full-scale run picked (results/sampling/fig2.json, fig1.json: the same rate for every
#: ranking offset), used by quick mode, which does not search
DEFAULT_RATES: dict[str, float] = {"ranking": 0.03, "blackout": 0.003, "nce": 1e-4, "negative_sampling": 0.01}


@dataclass
class SoftmaxRegressionProblem:
    """Data drawn from a softmax regression ``p(c|x) = softmax(W0 x)`` (realisable, §4)."""

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
    """The minibatch loss (a sum over the minibatch, Eq. 8) and how many scores ``w^T x`` it computed."""
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
    log-likelihood on the training set), ``bias_vs_true`` (log10 mean |p_theta - p_theta0|),
    ``bias_vs_exact`` and ``param_diff_vs_exact`` (log10 mean |W - W_exact|) when ``reference`` is given,
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


#: how each Fig. 1 / Fig. 2 option is parsed and range-checked (ValueError naming it and its value)
_FIG_CHECKS = {
    "num_points": lambda k, v: option_int(k, v, minimum=1), "dim": lambda k, v: option_int(k, v, minimum=1),
    "num_classes": lambda k, v: option_int(k, v, minimum=2), "batch_size": lambda k, v: option_int(k, v, minimum=1),
    "num_negatives": lambda k, v: option_int(k, v, minimum=1),
    "momentum": lambda k, v: option_float(k, v, minimum=0.0, below=1.0),
    "score_scale": lambda k, v: option_float(k, v, positive=True),
    "iterations": lambda k, v: option_int(k, v, minimum=1), "eval_every": lambda k, v: option_int(k, v, minimum=1),
    "lr_exact": lambda k, v: option_float(k, v, positive=True),
    "seeds": lambda k, v: list(option_ints(k, v, minimum=0)),
    "explicit": lambda k, v: option_choice(k, v, ("minibatch", "target")),
    "blackout_power": lambda k, v: option_float(k, v, minimum=0.0),
    "lr_grid": lambda k, v: list(option_floats(k, v, positive=True)),
    "lr_pick_iterations": lambda k, v: option_int(k, v, minimum=1),
    "pick_lr": lambda k, v: option_int(k, v, minimum=0, maximum=1),
}


def _settings(scale: str, options: dict[str, Any]) -> dict[str, Any]:
    """The Fig. 1 / Fig. 2 preset of ``scale`` with ``options`` applied; ValueError naming an unknown
    option or a bad value (counts >= 1, rates finite and > 0, momentum in [0, 1), ...)."""
    quick = check_scale(scale) == "quick"
    cfg = {
        "num_points": 2000, "dim": 100, "num_classes": 1000, "batch_size": 50, "num_negatives": 20,
        "momentum": 0.99, "score_scale": 3.0, "iterations": 200 if quick else 2000, "eval_every": 20 if quick else 25,
        "lr_exact": 1e-4,
        "seeds": [0] if quick else [0, 1, 2], "explicit": "minibatch", "blackout_power": 0.5,
        "lr_grid": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0], "lr_pick_iterations": 1000, "pick_lr": 0 if quick else 1,
    }
    for key, value in options.items():
        if key not in cfg:
            raise ValueError(f"unknown option {key!r}; known: {sorted(cfg)}")
        cfg[key] = _FIG_CHECKS[key](key, value)
    if cfg["batch_size"] > cfg["num_points"]:
        raise ValueError(f"option batch_size={cfg['batch_size']}: more than the {cfg['num_points']} points (num_points)")
    if cfg["num_negatives"] >= cfg["num_classes"]:
        raise ValueError(f"option num_negatives={cfg['num_negatives']}: must be < num_classes={cfg['num_classes']}")
    return cfg


def _run_methods(cfg: dict[str, Any], methods: dict[str, dict[str, Any]], figure: str) -> tuple[list[dict], dict]:
    """Run every method for every seed; return records and the chosen learning rates."""
    records: list[dict[str, Any]] = []
    rates: dict[str, float] = {}
    common = dict(batch_size=cfg["batch_size"], num_negatives=cfg["num_negatives"], momentum=cfg["momentum"],
                  explicit=cfg["explicit"], blackout_power=cfg["blackout_power"])
    for seed in cfg["seeds"]:
        seed_everything(seed)
        problem = make_problem(cfg["num_points"], cfg["dim"], cfg["num_classes"], cfg["score_scale"], seed=seed)
        true_ll = _mean_loglik(problem.true_weight, problem)
        if not rates:  # rates are picked once, on the first seed; the normalisation methods share exact's rate
            for label, spec in methods.items():
                if label == "exact" or spec.get("share_exact_lr"):
                    rates[label] = cfg["lr_exact"]
                    continue
                if not cfg["pick_lr"]:  # quick mode: the rates the full run picked
                    rates[label] = DEFAULT_RATES.get(spec["method"], cfg["lr_exact"])
                    continue
                rates[label] = _pick_lr(problem, spec["method"], cfg["lr_grid"], cfg["lr_pick_iterations"],
                                        alpha=spec.get("alpha", 1.0), **common)
        exact = train_softmax_regression(problem, "exact", cfg["iterations"], rates["exact"], eval_every=cfg["eval_every"],
                                         data_seed=seed, sample_seed=1000 + seed, **common)
        for label, spec in methods.items():
            print(f"[{figure}] seed {seed}: {label} (lr {rates[label]:g})", file=sys.stderr, flush=True)
            run = exact if label == "exact" else train_softmax_regression(
                problem, spec["method"], cfg["iterations"], rates[label], eval_every=cfg["eval_every"],
                data_seed=seed, sample_seed=1000 + seed, alpha=spec.get("alpha", 1.0), reference=exact["weights"], **common)
            if label == "exact":
                run = dict(run, bias_vs_exact=[-30.0] * len(run["iteration"]), param_diff_vs_exact=[-30.0] * len(run["iteration"]))
            records.append(make_record(
                None, run["loglik"][-1] if run["loglik"] else float("nan"), figure=figure, method=label, seed=seed,
                alpha=spec.get("alpha"), lr=rates[label], final_loglik=run["loglik"][-1] if run["loglik"] else None,
                true_model_loglik=true_ll, diverged=run["diverged"], scores_per_batch=run["scores_per_batch"],
                iteration=run["iteration"], loglik=run["loglik"], bias_vs_true=run["bias_vs_true"],
                bias_vs_exact=run["bias_vs_exact"] if label != "exact" else None,
                param_diff_vs_exact=run["param_diff_vs_exact"] if label != "exact" else None,
            ))
    return records, rates


def _default_path(out: Path | str | None, default: str) -> Path:
    """``out``, else ``default`` under :func:`hsm.results.output_root` (not the committed results)."""
    return output_path(default, out)


@experiment("sampling-fig2", "Barber & Botev Fig. 2: exact LL and bias of likelihood approximations, softmax regression",
            "results/sampling/fig2.json")
def run_fig2(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
             **options: Any) -> Path:
    """Fig. 2 (plus NCE and negative sampling, which the paper leaves out as 'very poor'). ``out``
    None: ``hsm-results/sampling/fig2.json``; a full-scale file is not replaced by a quick run
    unless ``force``. ValueError for a bad scale, device or option, before any work."""
    start = time.perf_counter()
    cfg = _settings(scale, options)
    check_device(device)
    path = _default_path(out, "results/sampling/fig2.json")
    check_replace(path, scale, force)
    torch.set_num_threads(1)  # small matrices: one thread, no oversubscription on a shared machine
    log_c = S.ranking_offset(cfg["num_classes"])
    methods = {
        "exact": {"method": "exact"},
        "importance": {"method": "importance", "share_exact_lr": True},
        "bernoulli": {"method": "bernoulli", "share_exact_lr": True},
        "ranking_alpha1": {"method": "ranking", "alpha": 1.0},
        "ranking_alpha_logC": {"method": "ranking", "alpha": log_c},
        "blackout": {"method": "blackout"},
        "nce": {"method": "nce"},
        "negative_sampling": {"method": "negative_sampling"},
    }
    records, rates = _run_methods(cfg, methods, "fig2")
    cfg = dict(cfg, device=device, learning_rates=rates, log_C_minus_1=log_c)
    return write_results(path, records, provenance(cfg, time.perf_counter() - start, scale=scale), force=force)


@experiment("sampling-fig1", "Barber & Botev Fig. 1: ranking objective, sweep of the offset alpha (log(C-1) suggested)",
            "results/sampling/fig1.json")
def run_fig1(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
             **options: Any) -> Path:
    """Fig. 1: ranking with several alpha, including 1, log(499) = 6.2126 (the paper's printed
    value) and log(C - 1) = 6.9068 for C = 1000; the exact gradient beside them. ``out``, ``force``
    and the checks as :func:`run_fig2`."""
    start = time.perf_counter()
    cfg = _settings(scale, options)
    check_device(device)
    path = _default_path(out, "results/sampling/fig1.json")
    check_replace(path, scale, force)
    torch.set_num_threads(1)  # small matrices: one thread, no oversubscription on a shared machine
    log_c = S.ranking_offset(cfg["num_classes"])
    alphas = [0.0, 1.0, 3.0, math.log(499), log_c, 9.0, 12.0] if scale != "quick" else [1.0, log_c, 12.0]
    methods: dict[str, dict[str, Any]] = {"exact": {"method": "exact"}}
    for a in alphas:
        methods[f"ranking_alpha{a:.4f}"] = {"method": "ranking", "alpha": a}
    records, rates = _run_methods(cfg, methods, "fig1")
    cfg = dict(cfg, device=device, learning_rates=rates, alphas=alphas, log_C_minus_1=log_c)
    return write_results(path, records, provenance(cfg, time.perf_counter() - start, scale=scale), force=force)


# ============================================================================ beyond the paper: "tree or sampling?"
#: the sampled outputs of the PTB comparison, in the order they are trained (the most informative first)
LM_METHODS = ("importance", "bernoulli", "blackout", "negative_sampling", "ranking", "nce")
#: names shown in tables
LM_METHOD_NAMES = {"importance": "importance sampling (Eq. 22-23)", "bernoulli": "Bernoulli sampling (Eq. 22-23)",
                   "blackout": "BlackOut (Eq. 47)", "negative_sampling": "negative sampling (Eq. 43)",
                   "ranking": "ranking, alpha = log(V - 1) (Eq. 35)", "nce": "NCE, z = 1 (Eq. 30-31)",
                   "flat": "Flat soft-max (exact)", "random": "Random Tree (HSM)"}


def _lm_settings(scale: str, options: dict[str, Any]) -> dict[str, Any]:
    """Settings of ``lm-ptb-sampling``; ``options`` (strings from the CLI) override them."""
    quick = check_scale(scale) == "quick"
    cfg: dict[str, Any] = {
        # the data and model of lm-ptb (results/lm/ptb.json): log-bilinear LM, d = 200, T = 3, batch 128, Adagrad
        "vocab_size": 2000 if quick else 0, "train_tokens": 100_000 if quick else 0,
        "eval_tokens": 10_000 if quick else 0, "context": 3, "dim": 200, "batch_size": 128,
        "epochs": 1 if quick else 4,
        "methods": list(LM_METHODS[:4]) if quick else list(LM_METHODS),
        "num_negatives": 20,
        # runs with more negatives, "method:K" (importance / Bernoulli: the cost grows little, the negatives
        # are shared by the minibatch); each reuses its method's learning rate from the K = num_negatives grid
        "more_negatives": [] if quick else ["importance:200", "bernoulli:200"],
        "lr_grid": [0.1] if quick else [0.025, 0.05, 0.1, 0.2], "select_steps": 0 if quick else 1500,
        "lr_extend": 0 if quick else 2,  # extra rates tried when the best is at an edge of the grid
        # flat and random-tree runs at the same scale (at full scale they come from results/lm/ptb.json)
        "reference": ["flat", "random"] if quick else [],
        "bench_steps": 20 if quick else 100, "bench_rounds": 2 if quick else 3,
        # the random tree of the reference run and of the benchmark: lm-ptb's arity (25 on PTB, 13 at V = 2,000;
        # 0: the smallest M with M**3 >= V)
        "arity": 13 if quick else 25,
        "seed": 0,
    }
    for key, value in options.items():
        if key not in cfg:
            raise ValueError(f"unknown option {key!r}; known: {sorted(cfg)}")
        if key == "lr_grid":
            cfg[key] = list(option_floats(key, value, positive=True))
        elif isinstance(cfg[key], list):
            items = [v for v in str(value).split(",") if v] if isinstance(value, str) else list(value)
            cfg[key] = [str(v).strip() for v in items]
        else:
            # 0 means "the whole split / vocabulary" (vocab_size, train_tokens, eval_tokens) or "choose" (arity)
            cfg[key] = option_int(key, value, minimum=_LM_MINIMUM.get(key, 1))
            if key in ("vocab_size", "arity") and cfg[key] == 1:
                raise ValueError(f"option {key}=1: must be 0 (automatic) or >= 2")
    from hsm.experiments.lm import SAMPLED_KINDS

    for item in cfg["more_negatives"]:
        method, _, k = item.partition(":")
        if method not in cfg["methods"] or not k.isdigit() or int(k) < 1:
            raise ValueError(f"more_negatives entries are 'method:K' with a method of 'methods' and K >= 1, got {item!r}")
    for method in cfg["methods"]:
        if method not in SAMPLED_KINDS:
            raise ValueError(f"unknown sampled output {method!r}; known: {SAMPLED_KINDS}")
    for ref in cfg["reference"]:
        if ref not in ("flat", "random"):
            raise ValueError(f"reference runs are 'flat' and/or 'random', got {ref!r}")
    if not cfg["lr_grid"] or min(cfg["lr_grid"]) <= 0:
        raise ValueError("lr_grid must hold positive learning rates")
    return cfg


#: lm-ptb-sampling integer options whose minimum is not 1 (0 has a meaning for them)
_LM_MINIMUM = {"vocab_size": 0, "train_tokens": 0, "eval_tokens": 0, "select_steps": 0, "lr_extend": 0, "arity": 0,
               "seed": 0}


class _SparseSampledOutputs:
    """While active, the sampled output layers that :func:`hsm.experiments.lm.train_lm` builds use
    :class:`hsm.sampling.SampledSoftmax`'s sparse path (as the trees use ``sparse=True``), so Adagrad
    updates only the rows a step scored instead of the whole ``[V, d]`` matrix. The values of the
    updates are the dense path's (``tests/test_sampling.py``); only the cost changes."""

    def __enter__(self) -> None:
        # the module whose train_lm builds the layers (hsm.experiments.lm re-exports it)
        from hsm.experiments.lm import training

        self._module, self._original = training, training._make_output

        def make(cfg, vocab_size, tree, counts=None):
            layer = self._original(cfg, vocab_size, tree, counts)
            if isinstance(layer, S.SampledSoftmax):
                layer.sparse = True
            return layer

        training._make_output = make

    def __exit__(self, *exc: Any) -> None:
        self._module._make_output = self._original


def _benchmark_steps(corpus, cfg: dict[str, Any], contestants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """ms per training step (forward, backward, Adagrad) of every output layer, measured in one process,
    round-robin (``bench_rounds`` rounds of ``bench_steps`` steps each, after 5 warm-up steps), on the
    same batches: the load of a shared machine then weighs on all of them alike."""
    from hsm.experiments.lm import LMRunConfig, _make_output
    from hsm.layers import HierarchicalSoftmax
    from hsm.models import LogBilinearLM
    from hsm.tree import Tree

    x_all, y_all = corpus.windows("train", cfg["context"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    order = torch.randperm(len(y_all), generator=gen)
    batches = [order[i * cfg["batch_size"]:(i + 1) * cfg["batch_size"]] for i in range(cfg["bench_steps"] + 5)]
    arity = cfg["arity"] or _tree_arity(corpus.vocab_size)
    states = {}
    for label, spec in contestants.items():
        seed_everything(cfg["seed"])
        model = LogBilinearLM(corpus.vocab_size, cfg["dim"], cfg["context"], sparse=True)
        kind = spec["output"]
        if kind == "random":
            layer = HierarchicalSoftmax(cfg["dim"], Tree.random(corpus.vocab_size, arity, 3, seed=0), sparse=True)
        else:
            layer = _make_output(LMRunConfig(output=kind, dim=cfg["dim"], num_negatives=spec.get("num_negatives", 20)),
                                 corpus.vocab_size, None, corpus.counts)
            if isinstance(layer, S.SampledSoftmax):
                layer.sparse = spec.get("sparse", True)
        states[label] = (model, layer, torch.optim.Adagrad(list(model.parameters()) + list(layer.parameters()), lr=0.05))
    times: dict[str, list[float]] = {label: [] for label in contestants}
    for round_ in range(cfg["bench_rounds"]):
        for label, (model, layer, optimizer) in states.items():
            model.train()
            layer.train()
            for i, index in enumerate(batches):
                t0 = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                layer(model(x_all[index]), y_all[index]).loss.backward()
                optimizer.step()
                if i >= 5:  # warm-up steps (allocator, first sampler calls) are not counted
                    times[label].append(time.perf_counter() - t0)
    return {label: {"ms_per_step": 1000 * float(np.median(t)), "ms_per_step_mean": 1000 * float(np.mean(t)),
                    "steps": len(t), **contestants[label]} for label, t in times.items()}


def _tree_arity(vocab_size: int) -> int:
    """The smallest arity M with M**3 >= V (25 for PTB's 10k words, as in lm-ptb)."""
    arity = max(2, round(vocab_size ** (1 / 3)))
    while arity**3 < vocab_size:
        arity += 1
    return arity


def _sampling_plan(cfg: dict[str, Any]) -> list[tuple[str, str, int]]:
    """The runs of lm-ptb-sampling in order, as ``(label, output kind, K)``: the reference runs
    (K 0), each method with ``num_negatives``, then the ``more_negatives`` runs."""
    plan: list[tuple[str, str, int]] = [(f"{m}-K{cfg['num_negatives']}", m, cfg["num_negatives"]) for m in cfg["methods"]]
    for item in cfg["more_negatives"]:
        method, _, k = item.partition(":")
        plan.append((f"{method}-K{int(k)}", method, int(k)))
    return [(ref, ref, 0) for ref in cfg["reference"]] + plan


def _select_sampling_lr(corpus, base, cfg: dict[str, Any], kind: str, k: int, tree, device: str,
                        run_dir: Path | None, log) -> tuple[float, list[dict[str, Any]]]:
    """The learning rate of output ``kind`` (K ``k``): the best of ``lr_grid`` on validation
    perplexity after ``select_steps`` steps, the grid extended (halved or doubled, up to
    ``lr_extend`` times) while the best rate is at its edge; with one rate in the grid, that rate."""
    from dataclasses import replace

    from hsm.experiments.lm import train_lm

    trials: list[dict[str, Any]] = []

    def trial(lr: float) -> None:
        trial_cfg = replace(base, output=kind, lr=lr, epochs=1, max_steps_per_epoch=cfg["select_steps"],
                            num_negatives=k or cfg["num_negatives"])
        try:
            res = train_lm(corpus, trial_cfg, tree=tree if kind == "random" else None, device=device,
                           checkpoint_dir=run_dir, log=log)
            ppl, seconds = res.valid_perplexity, res.seconds
        except FloatingPointError:
            ppl, seconds = math.inf, 0.0
        trials.append({"lr": lr, "valid_perplexity": ppl if math.isfinite(ppl) else None, "seconds": seconds})
        log(f"{kind} lr {lr}: valid perplexity {ppl:.1f} after {cfg['select_steps']} steps")

    if len(cfg["lr_grid"]) <= 1:
        return cfg["lr_grid"][0], trials
    for lr in sorted(cfg["lr_grid"]):
        trial(lr)
    # a best rate at the edge of the grid: extend the grid that way (halve / double)
    for _ in range(cfg["lr_extend"]):
        rates = [t["lr"] for t in trials]
        best = min(trials, key=lambda t: t["valid_perplexity"] or math.inf)["lr"]
        if best == min(rates):
            trial(best / 2)
        elif best == max(rates):
            trial(best * 2)
        else:
            break
    return min(trials, key=lambda t: t["valid_perplexity"] or math.inf)["lr"], trials


def _sampling_run_records(run, label: str, kind: str, k: int, lr: float, arity: int, cfg: dict[str, Any],
                          common: dict[str, Any]) -> list[dict[str, Any]]:
    """The test-perplexity and ms/batch records of one finished lm-ptb-sampling run."""
    fields = dict(common, model=LM_METHOD_NAMES[kind] + (f", K = {k}" if k else ""), run=label, method=kind,
                  num_negatives=k or None, lr=lr, epochs=cfg["epochs"], per_epoch=run.epochs, wall_time_s=run.seconds,
                  trained_on=run.device, arity=arity if kind == "random" else None, diverged=None)
    return [make_record(None, run.test_perplexity, measure="test_perplexity", valid_perplexity=run.valid_perplexity,
                        **fields),
            make_record(None, run.train_ms_per_batch, measure="train_ms_per_batch", **fields),
            make_record(None, run.test_ms_per_batch, measure="test_ms_per_batch", **fields)]


def _bench_contestants(cfg: dict[str, Any], plan: list[tuple[str, str, int]], arity: int) -> dict[str, dict[str, Any]]:
    """The output layers of the round-robin step benchmark: flat, the random tree, every sampled run
    (sparse gradient), and the first method with a dense ``[V, d]`` gradient (what the sparse path buys)."""
    contestants: dict[str, dict[str, Any]] = {
        "flat": {"output": "flat", "model": LM_METHOD_NAMES["flat"]},
        "random": {"output": "random", "model": LM_METHOD_NAMES["random"] + f", {arity}-ary depth 3"},
    }
    for label, kind, k in plan:
        if k:
            contestants[label] = {"output": kind, "num_negatives": k, "sparse": True,
                                  "model": LM_METHOD_NAMES[kind] + f", K = {k}"}
    if cfg["methods"]:
        first = cfg["methods"][0]
        contestants[f"{first}-K{cfg['num_negatives']}-dense"] = {
            "output": first, "num_negatives": cfg["num_negatives"], "sparse": False,
            "model": LM_METHOD_NAMES[first] + f", K = {cfg['num_negatives']}, dense gradient"}
    return contestants


def _bench_records(bench: dict[str, dict[str, Any]] | None, common: dict[str, Any]) -> list[dict[str, Any]]:
    return [make_record(None, spec["ms_per_step"], measure="bench_train_ms_per_step", run=label, model=spec["model"],
                        method=spec["output"], num_negatives=spec.get("num_negatives"), sparse=spec.get("sparse"),
                        ms_per_step_mean=spec["ms_per_step_mean"], steps=spec["steps"], **common)
            for label, spec in (bench or {}).items()]


@experiment("lm-ptb-sampling", "Beyond seed 004: PTB log-bilinear LM trained with sampled softmax approximations "
            "(importance, Bernoulli, BlackOut, negative sampling, ranking, NCE), exact perplexity and ms/step",
            "results/sampling/lm-ptb.json")
def run_lm_ptb_sampling(scale: str = "quick", device: str = "cpu", out: Path | str | None = None,
                        force: bool = False, **options: Any) -> Path:
    """"Tree or sampling?": the log-bilinear LM of ``lm-ptb`` (arXiv Table 1's PTB setting) with its
    output layer trained by each approximation of Barber & Botev (seed 004), evaluated exactly.

    Every sampled run is :func:`hsm.experiments.lm.train_lm` with ``output`` one of
    :data:`hsm.experiments.lm.SAMPLED_KINDS` (add-one-smoothed training counts as proposal; the
    sparse path of :class:`hsm.sampling.SampledSoftmax`, like the trees' ``sparse=True``). The
    learning rate of each method is the best of ``lr_grid`` on validation perplexity after
    ``select_steps`` steps, the grid extended (halved or doubled, up to ``lr_extend`` times) while
    the best rate is at its edge (the ``more_negatives`` runs reuse their method's choice). Test
    perplexity is exact (the full softmax at evaluation), so it compares with the flat softmax and
    the trees of ``results/lm/ptb.json`` (same data, model, batch size and optimiser); at full
    scale those are read from that file, at a reduced scale (``reference``) they are trained here.
    Train ms/batch of each run is measured under whatever else the machine was running; the
    round-robin benchmark (:func:`_benchmark_steps`, flat and random tree included) is the fair
    speed comparison. The result file is rewritten after every run (``complete`` says whether all
    finished); finished runs are kept under the cache (``hsm.config.cache_dir()``) at full scale,
    so an interrupted command resumes.
    """
    from dataclasses import replace

    from hsm import config as hsm_config
    from hsm.experiments.lm import LMRunConfig, load_lm_corpus, train_lm
    from hsm.tree import Tree

    start = time.perf_counter()
    cfg = _lm_settings(scale, options)
    device = check_device(device)
    path = _default_path(out, "results/sampling/lm-ptb.json")
    check_replace(path, scale, force)  # before any training: the result file is rewritten after every run
    hsm_config.configure_threads(default=1)  # HSM_THREADS (checked), else 1: a shared machine, see hsm.experiments.lm
    corpus = load_lm_corpus("ptb", vocab_size=cfg["vocab_size"] or None, train_tokens=cfg["train_tokens"] or None,
                            eval_tokens=cfg["eval_tokens"] or None)
    arity = cfg["arity"] or _tree_arity(corpus.vocab_size)
    if arity**3 < corpus.vocab_size:
        raise ValueError(f"a {arity}-ary depth-3 tree holds {arity**3} words < vocabulary {corpus.vocab_size}")
    run_dir = None
    if scale == "full":
        run_dir = hsm_config.cache_dir() / "lm-runs" / "lm-ptb-sampling"
        run_dir.mkdir(parents=True, exist_ok=True)
    base = LMRunConfig(output="flat", context=cfg["context"], dim=cfg["dim"], arity=arity, depth=3,
                       batch_size=cfg["batch_size"], epochs=cfg["epochs"], seed=cfg["seed"],
                       num_negatives=cfg["num_negatives"])
    log = lambda message: print(f"[lm-ptb-sampling] {message}", file=sys.stderr, flush=True)  # noqa: E731
    common = {"dataset": "ptb", "vocab_size": corpus.vocab_size, "train_tokens": int(corpus.train.numel()),
              "valid_tokens": int(corpus.valid.numel()), "test_tokens": int(corpus.test.numel()),
              "context": cfg["context"], "dim": cfg["dim"], "batch_size": cfg["batch_size"], "scale": scale,
              "beyond_paper": True}
    plan = _sampling_plan(cfg)
    tree = Tree.random(corpus.vocab_size, arity, 3, seed=0, label_names=corpus.vocab) if "random" in cfg["reference"] else None
    records: list[dict[str, Any]] = []
    chosen_lr: dict[str, float] = {}
    selection: dict[str, list[dict[str, Any]]] = {}

    def write(complete: bool, bench: dict[str, dict[str, Any]] | None = None) -> Path:
        prov = provenance(dict(cfg, experiment="lm-ptb-sampling", device=device, optimizer="Adagrad", l2=0.0,
                               tree_arity=arity, learning_rates=chosen_lr, lr_selection=selection, complete=complete,
                               proposal="add-one-smoothed unigram counts of the training split",
                               explicit="minibatch (importance, Bernoulli: the minibatch's classes summed exactly, "
                                        "K negatives shared by the minibatch)",
                               note="beyond the papers: no paper number to compare with"),
                          time.perf_counter() - start, scale=scale)
        return write_results(path, records + _bench_records(bench, common), prov, force=force)

    with _SparseSampledOutputs():
        for label, kind, k in plan:
            if kind not in chosen_lr:
                chosen_lr[kind], selection[kind] = _select_sampling_lr(corpus, base, cfg, kind, k, tree, device,
                                                                       run_dir, log)
            run_cfg = replace(base, output=kind, lr=chosen_lr[kind], num_negatives=k or cfg["num_negatives"])
            try:
                run = train_lm(corpus, run_cfg, tree=tree if kind == "random" else None, device=device,
                               checkpoint_dir=run_dir, log=log)
            except FloatingPointError as exc:  # recorded, not fatal: the other methods still run
                log(f"{label}: diverged ({exc})")
                records.append(make_record(None, math.nan, measure="test_perplexity", diverged=str(exc),
                                           **dict(common, model=LM_METHOD_NAMES[kind] + (f", K = {k}" if k else ""),
                                                  run=label, method=kind, num_negatives=k or None,
                                                  lr=run_cfg.lr, epochs=cfg["epochs"])))
                write(False)
                continue
            records.extend(_sampling_run_records(run, label, kind, k, run_cfg.lr, arity, cfg, common))
            log(f"{label}: test perplexity {run.test_perplexity:.1f}, {run.train_ms_per_batch:.1f} ms/step")
            write(False)
        log("round-robin step benchmark")
        bench = _benchmark_steps(corpus, cfg, _bench_contestants(cfg, plan, arity))
    return write(True, bench)


def lm_rows(payload: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{run: {measure: record}}`` of an ``lm-ptb-sampling`` result file (benchmark records under
    ``bench:<run>``)."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for record in payload["records"]:
        key = ("bench:" if record["measure"] == "bench_train_ms_per_step" else "") + record["run"]
        rows.setdefault(key, {})[record["measure"]] = record
    return rows
