"""How often approximate searches miss the tree model's most likely next word (thesis §3.5: greedy
and beam search "may fail to find the true MAP"; the stochastic path predictor g_s of thesis Eq. 3.6).

On the first ``tokens`` test tokens of the Gutenberg corpus, with the random-tree model that
``lm-gutenberg-offset`` trains and keeps (65-ary, one epoch; the run is reused when it exists), or
with ``tree=learned`` the table's learned-tree model (two epochs, the first learning the tree;
:func:`~.offset.kept_learned_run`), each decoder's word is compared with the exact arg max (branch and bound,
:meth:`hsm.HierarchicalSoftmax.topk`): how often it is the arg max, how often it is the next word
(accuracy), and how much log-probability it gives up against the arg max. g_s samples a child at
every node from the node's distribution, so its word is a sample of the model's distribution
``p(.|x)``: its agreement with the arg max is ``E[max_y p(y|x)]`` and its accuracy
``E[p(w|x)]`` for the next word ``w``, computed exactly instead of by sampling.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm_lab.experiments import check_device, check_scale, experiment, option_choice, option_int, option_ints
from hsm_lab.results import check_replace, make_record

from hsm_lab.experiments.lm.offset import OFFSET_EXPERIMENT, kept_learned_run, kept_random_run
from hsm_lab.experiments.lm.report import _common_fields, _out_path, _write
from hsm_lab.experiments.lm.tables import kept_model_scale
from hsm_lab.experiments.lm.training import load_trained_model

__all__ = ["DECODING_TREES", "decoder_agreement", "run_lm_gutenberg_decoding"]

DEFAULT_TOKENS = {"quick": 2_000, "full": 100_000}
#: the kept models it can decode with: ``tree`` option value -> (the run, the records' model name)
DECODING_TREES = {"random": (kept_random_run, "Random Tree"), "learned": (kept_learned_run, "Learned Tree")}


@torch.no_grad()
def decoder_agreement(output, hidden: torch.Tensor, targets: torch.Tensor, beams: tuple[int, ...],
                      batch_size: int = 512) -> dict[str, dict[str, float]]:
    """Per decoder (``exact``, ``beam<b>``, ``sampled path``): agreement with the exact arg max,
    accuracy on ``targets``, mean log-probability given up against the arg max, nodes visited
    and milliseconds per example."""
    totals: dict[str, dict[str, float]] = {}

    def add(name: str, **values: float) -> None:
        row = totals.setdefault(name, {})
        for key, value in values.items():
            row[key] = row.get(key, 0.0) + value

    for start in range(0, len(targets), batch_size):
        h, y = hidden[start:start + batch_size], targets[start:start + batch_size]
        t0 = time.perf_counter()
        exact = output.topk(h, 1, method="exact", beam=1)
        seconds = time.perf_counter() - t0
        best_value, best = exact.values[:, 0].double(), exact.indices[:, 0]
        add("exact", agree=float(len(y)), correct=float((best == y).sum()), gap=0.0,
            visited=float(exact.nodes_visited.sum()), seconds=seconds)
        for width in beams:
            t0 = time.perf_counter()
            found = output.topk(h, 1, method="beam", beam=width)
            seconds = time.perf_counter() - t0
            word = found.indices[:, 0]
            add(f"beam{width}", agree=float((word == best).sum()), correct=float((word == y).sum()),
                gap=float((best_value - found.values[:, 0].double()).sum()),
                visited=float(found.nodes_visited.sum()), seconds=seconds)
        # the sampled path's word is a draw from p(.|x): expectations in closed form
        target_logp = output(h, y).output.double()
        add("sampled path", agree=float(best_value.exp().sum()), correct=float(target_logp.exp().sum()),
            gap=float(math.nan), visited=float(math.nan), seconds=float(math.nan))
    n = float(len(targets))
    return {name: {"agreement": row["agree"] / n, "accuracy": row["correct"] / n,
                   "logp_given_up": row["gap"] / n, "nodes_visited": row["visited"] / n,
                   "ms_per_example": 1000 * row["seconds"] / n}
            for name, row in totals.items()}


@experiment("lm-gutenberg-decoding", "Thesis §3.5: how often greedy, beam and sampled-path decoding miss the exact "
            "arg max of the Gutenberg random-tree model (lm-gutenberg-offset's), and the accuracy each gets",
            "results/lm/gutenberg-decoding.json")
def run_lm_gutenberg_decoding(scale: str = "quick", device: str = "cpu", out: Path | None = None,
                              force: bool = False, **options: Any) -> Path:
    """See the module docstring. Options: ``tokens`` (first test tokens scored), ``beams`` (beam
    widths; 1 is the greedy descent), ``tree`` (``random``, the default, or ``learned``)."""
    from hsm_lab.experiments.lm.commands import _scale_for

    start = time.perf_counter()
    scale = check_scale(scale)
    given, options = dict(options), dict(options)
    tokens = option_int("tokens", options.pop("tokens", DEFAULT_TOKENS[scale]), minimum=1)
    beams = option_ints("beams", options.pop("beams", "1,2,5,10"), minimum=1)
    tree = option_choice("tree", options.pop("tree", "random"), tuple(DECODING_TREES))
    if options:
        raise ValueError(f"unknown options {sorted(options)}; known: beams, tokens, tree")
    sc = _scale_for(OFFSET_EXPERIMENT, scale, {})
    device = check_device(device)
    path = _out_path(out, "results/lm/gutenberg-decoding.json")
    check_replace(path, scale, force)
    kept_run, model_name = DECODING_TREES[tree]
    corpus, run, cfg, files = kept_run(sc, device)
    model, output, _ = load_trained_model(files.model, device)
    contexts, targets = (t[:tokens].to(device) for t in corpus.windows("test", cfg.context))
    with torch.no_grad():
        hidden = torch.cat([model(contexts[i:i + 4096]) for i in range(0, len(targets), 4096)])
    rows = decoder_agreement(output, hidden, targets, tuple(beams))
    # the file describes the model decoded (the learned one: two epochs, decay 1), not the preset
    sc = kept_model_scale(sc, cfg, scale)
    common = dict(_common_fields(corpus, sc, scale), model=model_name, run=tree,
                  lr=run.config["lr"], epochs=run.config["epochs"], scored_tokens=int(len(targets)),
                  model_test_perplexity=run.test_perplexity)
    records = [make_record(None, row["agreement"], measure="agreement_with_exact", decoder=name,
                           **{k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                              for k, v in row.items() if k != "agreement"}, **common)
               for name, row in rows.items()]
    return _write("lm-gutenberg-decoding", out, "results/lm/gutenberg-decoding.json", records, sc, scale, device,
                  time.perf_counter() - start, None, given, run.seconds,
                  extra_config={"model_of": OFFSET_EXPERIMENT, "tokens": tokens, "beams": list(beams),
                                "tree": tree, "model_config": run.config}, force=force)
