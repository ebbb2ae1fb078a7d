"""Which depth of the tree the perplexity is lost at (ICML §7.2's conjecture for its clustering tree:
grouping similar words makes the decisions at the bottom of the tree hard).

For every node on the path of a test word (``tokens`` of them, evenly spaced over the test split),
the node's decision is scored two ways
(:func:`node_decisions_by_depth`): its accuracy (is the path's child the most likely child?) and
the nats it costs (``-log p(child | node, context)``; summed over the depths this is the word's
negative log-likelihood, so the depths split the log-perplexity between them).

The models are trained at the Gutenberg table's settings for one epoch (65-ary depth-3 trees, the
table's learning rate) and kept in lm-gutenberg-offset's run folder; each is reused when it exists:

- ``random``: the random tree (lm-gutenberg-offset's own run);
- ``clustering``: the clustering tree of the table (:func:`hsm.clustering.clustering_tree` on the
  table's word vectors: fastText at full scale);
- ``mnih-hinton``: the tree of lm-gutenberg-mnih-hinton (words clustered by the random-tree
  model's mean predicted vectors);
- ``learned`` (only when asked for, ``-o models=...,learned``): the table's learned-tree model, two
  epochs, the first learning the tree (:func:`~.offset.kept_learned_run`).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm_lab.experiments import check_device, check_scale, experiment, option_choices, option_int
from hsm_lab.results import check_replace, make_record

from hsm_lab.experiments.lm.config import LMRunConfig
from hsm_lab.experiments.lm.mnih_hinton import train_mnih_hinton
from hsm_lab.experiments.lm.offset import OFFSET_EXPERIMENT, kept_learned_run, kept_random_run
from hsm_lab.experiments.lm.report import _common_fields, _out_path, _write
from hsm_lab.experiments.lm.tables import _run_dir, kept_model_scale, table_clustering_tree
from hsm_lab.experiments.lm.training import RunFiles, load_trained_model, train_lm

__all__ = ["NODE_ACCURACY_MODELS", "node_accuracy_markdown", "node_accuracy_rows", "node_decisions_by_depth",
           "run_lm_gutenberg_node_accuracy"]

#: the models it can score, in the order the records list them
NODE_ACCURACY_MODELS = ("random", "clustering", "mnih-hinton", "learned")
#: the models scored without a ``models`` option (the one-epoch models)
DEFAULT_MODELS = ("random", "clustering", "mnih-hinton")
DEFAULT_TOKENS = {"quick": 2_000, "full": 100_000}
DEFAULT_OUT = "results/lm/gutenberg-node-accuracy.json"
_NAMES = {"random": "Random Tree", "clustering": "Clustering Tree", "mnih-hinton": "Mnih-Hinton tree",
          "learned": "Learned Tree"}


@torch.no_grad()
def node_decisions_by_depth(output, hidden: torch.Tensor, targets: torch.Tensor,
                            batch_size: int = 256) -> list[dict[str, float]]:
    """Per depth d = 1, 2, ... of the tree of ``output`` (a :class:`hsm.HierarchicalSoftmax`): the
    share of the words ``targets`` whose node at depth d ranks the path's child first
    (``accuracy``), the mean ``-log p(child | node)`` (``nats``) and the number of words with a
    node at that depth (``words``)."""
    length = int(output.path_nodes.shape[1])
    correct, nats, words = np.zeros(length), np.zeros(length), np.zeros(length)
    for start in range(0, len(targets), batch_size):
        h, y = hidden[start:start + batch_size], targets[start:start + batch_size]
        nodes, children, mask = output.path_nodes[y], output.path_children[y], output.path_mask[y]
        log_probs = torch.log_softmax(output.node_logits(h, nodes), dim=-1)  # [B, L, M]
        picked = log_probs.gather(-1, children.unsqueeze(-1)).squeeze(-1)  # [B, L]
        hit = (log_probs.argmax(-1) == children) & mask
        correct += hit.sum(0).double().numpy()
        nats -= torch.where(mask, picked, torch.zeros_like(picked)).sum(0).double().numpy()
        words += mask.sum(0).double().numpy()
    return [{"depth": d + 1, "accuracy": correct[d] / words[d], "nats": nats[d] / words[d], "words": int(words[d])}
            for d in range(length) if words[d] > 0]


def _kept_model(name: str, corpus, cfg: LMRunConfig, files: RunFiles, sc, device) -> Path:
    """The kept model file of ``name`` (trained first when it is missing); ``cfg`` and ``files``
    are the random-tree run's (:func:`~.offset.kept_random_run`), or the learned run's when only
    ``learned`` is scored."""
    if name == "learned":
        # scoring the learned model alone, the caller already holds the learned run's files
        return files.model if cfg.output == "learned" else kept_learned_run(sc, device)[3].model
    if name == "random":
        return files.model
    folder = _run_dir(OFFSET_EXPERIMENT)
    if name == "mnih-hinton":
        kept = RunFiles.in_folder(folder, replace(cfg, output="clustering", fixed_tree="mnih-hinton:predicted"),
                                  corpus)
        if not kept.model.exists():
            model, _, _ = load_trained_model(files.model, device)
            train_mnih_hinton(corpus, cfg, model, "predicted", device)
        return kept.model
    clustering = replace(cfg, output="clustering")
    kept = RunFiles.in_folder(folder, clustering, corpus)
    if not kept.model.exists():
        train_lm(corpus, clustering, tree=table_clustering_tree(corpus, sc, cfg, device), device=device,
                 checkpoint_dir=folder, log=lambda message: print(message, flush=True), keep_model=True)
    return kept.model


@experiment("lm-gutenberg-node-accuracy", "ICML §7.2's conjecture on its clustering tree: the accuracy and the nats "
            "of the node decisions at each depth, for one-epoch Gutenberg models on a random, a clustering and a "
            "Mnih-Hinton tree", DEFAULT_OUT)
def run_lm_gutenberg_node_accuracy(scale: str = "quick", device: str = "cpu", out: Path | None = None,
                                   force: bool = False, **options: Any) -> Path:
    """See the module docstring. Options: ``models`` (a subset of :data:`NODE_ACCURACY_MODELS`),
    ``tokens`` (how many test tokens are scored, evenly spaced over the test split)."""
    from hsm_lab.experiments.lm.commands import _scale_for

    start = time.perf_counter()
    scale = check_scale(scale)
    given, options = dict(options), dict(options)
    models = option_choices("models", options.pop("models", ",".join(DEFAULT_MODELS)), NODE_ACCURACY_MODELS)
    tokens = option_int("tokens", options.pop("tokens", DEFAULT_TOKENS[scale]), minimum=1)
    if options:
        raise ValueError(f"unknown options {sorted(options)}; known: models, tokens")
    sc = _scale_for(OFFSET_EXPERIMENT, scale, {})
    device = check_device(device)
    path = _out_path(out, DEFAULT_OUT)
    check_replace(path, scale, force)
    # the learned model alone needs no random-tree run: its own run gives the corpus and context
    kept_run = kept_learned_run if set(models) == {"learned"} else kept_random_run
    corpus, run, cfg, files = kept_run(sc, device)
    contexts, targets = corpus.windows("test", cfg.context)
    # evenly spaced over the whole test split: its first tokens would all come from one or two books
    pick = torch.from_numpy(np.unique(np.linspace(0, len(targets) - 1, min(tokens, len(targets))).astype(np.int64)))
    contexts, targets = contexts[pick].to(device), targets[pick].to(device)
    records = []
    # the file describes the models scored: with the learned model alone, the kept learned run's
    # settings (two epochs, decay 1), not the one-epoch random-tree preset the run folder belongs to
    model_sc = kept_model_scale(sc, cfg, scale)
    common = dict(_common_fields(corpus, model_sc, scale), lr=cfg.lr, scored_tokens=int(len(targets)))
    model_configs = {}
    for name in models:
        model, output, model_cfg = load_trained_model(_kept_model(name, corpus, cfg, files, sc, device), device)
        model_configs[name] = asdict(model_cfg)
        with torch.no_grad():
            hidden = torch.cat([model(contexts[i:i + 4096]) for i in range(0, len(targets), 4096)])
        rows = node_decisions_by_depth(output, hidden, targets)
        perplexity = math.exp(sum(row["nats"] * row["words"] for row in rows) / len(targets))
        for row in rows:
            records.append(make_record(None, row["accuracy"], measure="node_accuracy", run=name,
                                       model=_NAMES[name], node_depth=row["depth"], nats=row["nats"], words=row["words"],
                                       perplexity_of_scored_tokens=perplexity, epochs=model_cfg.epochs,
                                       **common))
    # the training time is known for the kept run itself; the other models' runs are not read here
    training_seconds = run.seconds if set(models) == {cfg.output} else None
    return _write("lm-gutenberg-node-accuracy", out, DEFAULT_OUT, records, model_sc, scale, device,
                  time.perf_counter() - start, None, given, training_seconds,
                  extra_config={"model_of": OFFSET_EXPERIMENT, "models": list(models), "tokens": tokens,
                                "model_configs": model_configs},
                  force=force)


# ------------------------------------------------------------------------------------------- reading the results
def node_accuracy_rows(payload: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``{run: [{depth, accuracy, nats, words, perplexity}, ...]}`` from a result file of this experiment,
    depths in order; ``perplexity`` is the model's on the scored tokens."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in payload["records"]:
        out.setdefault(r["run"], []).append({"depth": r["node_depth"], "accuracy": r["value"], "nats": r["nats"],
                                             "words": r["words"], "perplexity": r["perplexity_of_scored_tokens"]})
    return {run: sorted(rows, key=lambda row: row["depth"]) for run, rows in out.items()}


def node_accuracy_markdown(rows: dict[str, list[dict[str, Any]]]) -> str:
    """One line per model: the accuracy and the nats of its node decisions at each depth, and its
    perplexity on the scored tokens."""
    depths = max(len(r) for r in rows.values())
    head = " | ".join(f"depth {d + 1}: accuracy, nats" for d in range(depths))
    lines = [f"| tree | {head} | perplexity |", "|---" * (depths + 2) + "|"]
    for run, by_depth in rows.items():
        cells = " | ".join(f"{100 * r['accuracy']:.1f} %, {r['nats']:.2f}" for r in by_depth)
        lines.append(f"| {_NAMES[run]} | {cells} | {by_depth[0]['perplexity']:.1f} |")
    return "\n".join(lines)
