"""The runs of ``lm-ptb-sampling`` ("tree or sampling?", beyond the papers): the log-bilinear LM of
``lm-ptb`` with its output layer trained by each approximation of Barber & Botev through
:func:`hsm_lab.experiments.lm.train_lm`, in the order :func:`_sampling_plan` gives, each method's
learning rate chosen on validation (:func:`_select_sampling_lr`), and a round-robin benchmark of
the output layers' training steps (:func:`_benchmark_steps`), the fair speed comparison."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm import sampling as S
from hsm_lab.config import seed_everything

from hsm_lab.experiments.sampling.presets import LM_METHOD_NAMES

__all__: list[str] = []


def _tree_arity(vocab_size: int) -> int:
    """The smallest arity M with M**3 >= V (22 for PTB's 10k words; lm-ptb's 25-ary trees are the
    preset's ``arity``, this is its ``arity=0``)."""
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

    from hsm_lab.experiments.lm import train_lm

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


class _SparseSampledOutputs:
    """While active, the sampled output layers that :func:`hsm_lab.experiments.lm.train_lm` builds use
    :class:`hsm.sampling.SampledSoftmax`'s sparse path (as the trees use ``sparse=True``), so Adagrad
    updates only the rows a step scored instead of the whole ``[V, d]`` matrix. The values of the
    updates are the dense path's (``tests/test_sampling.py``); only the cost changes."""

    def __enter__(self) -> None:
        # the module whose train_lm builds the layers (hsm_lab.experiments.lm re-exports it)
        from hsm_lab.experiments.lm import training

        self._module, self._original = training, training._make_output

        def make(cfg, vocab_size, tree, counts=None):
            layer = self._original(cfg, vocab_size, tree, counts)
            if isinstance(layer, S.SampledSoftmax):
                layer.sparse = True
            return layer

        training._make_output = make

    def __exit__(self, *exc: Any) -> None:
        self._module._make_output = self._original


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


def _benchmark_steps(corpus, cfg: dict[str, Any], contestants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """ms per training step (forward, backward, Adagrad) of every output layer, measured in one process,
    round-robin (``bench_rounds`` rounds of ``bench_steps`` steps each, after 5 warm-up steps), on the
    same batches: the load of a shared machine then weighs on all of them alike."""
    from hsm_lab.experiments.lm import LMRunConfig, _make_output
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

