"""Thesis Lemma 3.1, measured: does one SGD step on the log-likelihood raise the node objective J_n
in expectation?

The lemma says it does, for a fixed tree, when the gradients of the node functions are independent
across nodes; the errata chapter shows a gap in its proof (weights taken as non-negative that can be
negative). This experiment measures the expectation instead. At a few points of a random-tree run
of the PTB model (the log-bilinear model of ``lm-ptb``, trained with Adagrad as in the tables), the
mass-weighted mean J_n of the nodes at each depth is estimated on a fixed sample of validation
tokens (soft estimates, Eqs. 8-9, thesis Eq. 3.12: :class:`hsm.NodeStatistics` with a negligible
prior). Then, from those same parameters, ``probes`` plain-SGD steps of rate ``eta`` on independent
random training minibatches are taken one at a time, J_n is estimated again after each and the step
is undone. The mean change over the probes estimates E[Delta J_n]; its standard error and the share
of probes that raise J_n stand beside it.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm_lab import config as hsm_config
from hsm_lab.experiments import check_device, check_scale, experiment, option_floats, option_int, option_ints
from hsm.layers import HierarchicalSoftmax
from hsm.optim import RowSparseAdagrad
from hsm.models import LogBilinearLM
from hsm_lab.results import check_replace, make_record, output_path, provenance, write_results
from hsm.statistics import NodeStatistics, node_objectives
from hsm.tree import Tree

from hsm_lab.experiments.lm.data import load_lm_corpus

__all__ = ["LEMMA_SCALES", "mean_objective_by_depth", "run_lm_ptb_lemma31"]

DEFAULT_OUT = "results/lm/ptb-lemma31.json"
#: the prior of the measuring statistics: a pseudo-count small enough to leave the estimates unchanged
_TINY_PRIOR = 1e-9

#: scale -> settings (every one a ``-o`` option)
LEMMA_SCALES: dict[str, dict[str, Any]] = {
    "quick": {"vocab_size": 2000, "train_tokens": 150_000, "arity": 13, "dim": 50, "context": 3,
              "batch_size": 128, "lr": 0.05, "checkpoints": (0, 300), "probes": 40, "eval_tokens": 5_000,
              "etas": (0.05, 0.5), "seed": 0,
              "description": "quick: first 150k PTB training tokens, vocabulary 2,000, 13-ary depth-3 random tree, "
                             "d = 50; J_n on the first 5,000 validation tokens; 40 probes"},
    "full": {"vocab_size": None, "train_tokens": None, "arity": 25, "dim": 200, "context": 3,
             "batch_size": 128, "lr": 0.05, "checkpoints": (0, 1_000, 7_262), "probes": 300, "eval_tokens": 20_000,
             "etas": (0.05, 0.5), "seed": 0,
             "description": "full: PTB (929k training tokens, 10k vocabulary), lm-ptb's model (d = 200, T = 3) on a "
                            "25-ary depth-3 random tree (seed 0), Adagrad at 0.05, batch 128; J_n on the first 20,000 "
                            "validation tokens; 300 probes per point and step size"},
}


@torch.no_grad()
def mean_objective_by_depth(model: LogBilinearLM, output: HierarchicalSoftmax, contexts: torch.Tensor,
                            targets: torch.Tensor, batch_size: int = 4096) -> dict[int, float]:
    """Mass-weighted mean J_n of the nodes at each depth, estimated on ``(contexts, targets)``."""
    statistics = NodeStatistics(output.tree, prior=_TINY_PRIOR, decay=1.0, dtype=torch.float64)
    kept, was_training = output.statistics, output.training
    output.statistics = statistics
    output.train()  # statistics are collected in training mode only; no_grad: nothing is updated
    try:
        for start in range(0, len(targets), batch_size):
            output(model(contexts[start:start + batch_size]), targets[start:start + batch_size])
    finally:
        output.statistics = kept
        output.train(was_training)
    stats = node_objectives(output.tree, statistics)
    return {int(d): float(np.average(stats["objective"][stats["depth"] == d], weights=stats["mass"][stats["depth"] == d]))
            for d in np.unique(stats["depth"])}


def _sgd_probe(model, output, parameters, x, y, eta, measure) -> dict[int, float]:
    """J_n per depth after one plain-SGD step of rate ``eta`` on ``(x, y)``; the step is undone."""
    saved = [p.detach().clone() for p in parameters]
    for p in parameters:
        p.grad = None
    output(model(x), y).loss.backward()
    with torch.no_grad():
        for p in parameters:
            if p.grad is not None:
                p.add_(p.grad, alpha=-eta)
    after = measure()
    with torch.no_grad():
        for p, value in zip(parameters, saved):
            p.copy_(value)
            p.grad = None
    return after


def _options(scale: str, options: dict[str, Any]) -> dict[str, Any]:
    settings = dict(LEMMA_SCALES[scale])
    for key, value in options.items():
        if key not in settings or key == "description":
            raise ValueError(f"unknown option {key!r}; known: {sorted(k for k in settings if k != 'description')}")
        if key in ("checkpoints",):
            settings[key] = tuple(sorted(set(option_ints(key, value, minimum=0))))
        elif key == "etas":
            settings[key] = option_floats(key, value, positive=True)
        elif key == "lr":
            settings[key] = option_floats(key, value, positive=True)[0]
        elif key in ("vocab_size", "train_tokens"):
            settings[key] = option_int(key, value, minimum=2, allow_none=True)
        else:
            settings[key] = option_int(key, value, minimum=2 if key == "arity" else 0 if key == "seed" else 1)
    return settings


@experiment("lm-ptb-lemma31", "Thesis Lemma 3.1 measured on PTB: the mean change of J_n per depth after one SGD "
            "step on the log-likelihood, at several points of a random-tree run", DEFAULT_OUT)
def run_lm_ptb_lemma31(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                       **options: Any) -> Path:
    """See the module docstring. Options: ``checkpoints`` (Adagrad steps before each measuring
    point), ``probes``, ``etas``, ``eval_tokens``, ``lr``, ``arity``, ``dim``, ``batch_size``,
    ``vocab_size``, ``train_tokens``, ``seed``."""
    start = time.perf_counter()
    scale = check_scale(scale)
    s = _options(scale, options)
    device = check_device(device)
    path = output_path(DEFAULT_OUT, out)
    check_replace(path, scale, force)
    if torch.device(device).type == "cpu":
        hsm_config.configure_threads(default=1)
    corpus = load_lm_corpus("ptb", vocab_size=s["vocab_size"], train_tokens=s["train_tokens"],
                            eval_tokens=s["eval_tokens"])
    V = corpus.vocab_size
    if s["arity"] ** 3 < V:
        raise ValueError(f"a {s['arity']}-ary depth-3 tree holds {s['arity'] ** 3} words < vocabulary {V}")
    hsm_config.seed_everything(s["seed"])
    model = LogBilinearLM(V, s["dim"], s["context"], sparse=True).to(device)
    tree = Tree.random(V, s["arity"], 3, seed=s["seed"], label_names=corpus.vocab)
    output = HierarchicalSoftmax(s["dim"], tree, sparse=True).to(device)
    parameters = list(model.parameters()) + list(output.parameters())
    optimizer = RowSparseAdagrad(parameters, lr=s["lr"])
    x_train, y_train = (t.to(device) for t in corpus.windows("train", s["context"]))
    x_eval, y_eval = (t.to(device) for t in corpus.windows("valid", s["context"]))
    generator = torch.Generator().manual_seed(s["seed"])
    measure = lambda: mean_objective_by_depth(model, output, x_eval, y_eval)  # noqa: E731
    records, trained = [], 0
    for checkpoint in s["checkpoints"]:
        while trained < checkpoint:  # Adagrad steps on shuffled minibatches, as the tables train
            index = torch.randint(len(y_train), (s["batch_size"],), generator=generator)
            optimizer.zero_grad(set_to_none=True)
            output(model(x_train[index]), y_train[index]).loss.backward()
            optimizer.step()
            trained += 1
        before = measure()
        for eta in s["etas"]:
            changes: dict[int, list[float]] = {d: [] for d in before}
            for _ in range(s["probes"]):
                index = torch.randint(len(y_train), (s["batch_size"],), generator=generator)
                after = _sgd_probe(model, output, parameters, x_train[index], y_train[index], eta, measure)
                for d in before:
                    changes[d].append(after[d] - before[d])
            for d, values in changes.items():
                values = np.asarray(values)
                records.append(make_record(
                    None, float(values.mean()), measure="mean_objective_change", depth=d, adagrad_steps=checkpoint,
                    eta=eta, objective=before[d], se=float(values.std(ddof=1) / math.sqrt(len(values))),
                    share_raised=float((values > 0).mean()), probes=len(values), changes=values.tolist(),
                    vocab_size=V, arity=s["arity"], batch_size=s["batch_size"], eval_tokens=int(len(y_eval)),
                    scale=scale, description=s["description"]))
    overrides = dict(options)
    prov = provenance(config={"experiment": "lm-ptb-lemma31", "scale": scale, "device": device, **s,
                              "overrides": overrides},
                      wall_time_s=time.perf_counter() - start, scale=scale)
    if overrides:
        prov["hsm_scale"] = f"{scale}, settings: " + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    return write_results(path, records, prov, force=force)
