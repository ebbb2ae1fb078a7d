"""The presets of the sampled-softmax experiments, as plain values: the methods of Barber & Botev's
Figs. 1 and 2 and the learning rates the full-scale run picked for them, the settings of each
scale (:data:`FIG_SETTINGS`, :data:`LM_SETTINGS`), the sampled outputs of the PTB comparison and
their names in tables, and where each experiment writes. ``-o key=value`` options override the
settings (:mod:`hsm_lab.experiments.sampling.config`)."""
from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_OUT", "DEFAULT_RATES", "FIG_SETTINGS", "LM_METHODS", "LM_METHOD_NAMES", "LM_SETTINGS", "METHODS"]

#: result file of each experiment (committed under results/; a run without ``out`` writes the same
#: path under hsm-results/, :func:`hsm_lab.results.output_path`)
DEFAULT_OUT = {"sampling-fig2": "results/sampling/fig2.json", "sampling-fig1": "results/sampling/fig1.json",
               "lm-ptb-sampling": "results/sampling/lm-ptb.json"}

# ------------------------------------------------------------------------- Figs. 1 and 2: softmax regression
#: the methods of Fig. 2 (and the two the paper leaves out of it)
METHODS = ("exact", "importance", "bernoulli", "ranking_1", "ranking_logC", "blackout", "nce", "negative_sampling")

#: learning rates the full-scale run picked (results/sampling/fig2.json, fig1.json: the same rate for every
#: ranking offset), used by quick mode, which does not search
DEFAULT_RATES: dict[str, float] = {"ranking": 0.03, "blackout": 0.003, "nce": 1e-4, "negative_sampling": 0.01}

#: the Fig. 1 / Fig. 2 setting of each scale (Barber & Botev §4: N = 2000, D = 100, C = 1000, minibatch 50,
#: K = 20, momentum 0.99). ``lr_exact`` is ours (the paper gives no rate; see the package docstring); the
#: full scale picks every other rate from ``lr_grid`` (``pick_lr``), the quick scale uses DEFAULT_RATES.
FIG_SETTINGS: dict[str, dict[str, Any]] = {
    scale: {
        "num_points": 2000, "dim": 100, "num_classes": 1000, "batch_size": 50, "num_negatives": 20,
        "momentum": 0.99, "score_scale": 3.0, "iterations": 200 if quick else 2000, "eval_every": 20 if quick else 25,
        "lr_exact": 1e-4,
        "seeds": [0] if quick else [0, 1, 2], "explicit": "minibatch", "blackout_power": 0.5,
        "lr_grid": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0], "lr_pick_iterations": 1000,
        "pick_lr": 0 if quick else 1,
    }
    for scale, quick in (("quick", True), ("full", False))
}

# ------------------------------------------------------------------- beyond the paper: "tree or sampling?"
#: the sampled outputs of the PTB comparison, in the order they are trained (the most informative first)
LM_METHODS = ("importance", "bernoulli", "blackout", "negative_sampling", "ranking", "nce")
#: names shown in tables
LM_METHOD_NAMES = {"importance": "importance sampling (Eq. 22-23)", "bernoulli": "Bernoulli sampling (Eq. 22-23)",
                   "blackout": "BlackOut (Eq. 47)", "negative_sampling": "negative sampling (Eq. 43)",
                   "ranking": "ranking, alpha = log(V - 1) (Eq. 35)", "nce": "NCE, z = 1 (Eq. 30-31)",
                   "flat": "Flat soft-max (exact)", "random": "Random Tree (HSM)"}

#: the lm-ptb-sampling setting of each scale
LM_SETTINGS: dict[str, dict[str, Any]] = {
    scale: {
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
    for scale, quick in (("quick", True), ("full", False))
}
