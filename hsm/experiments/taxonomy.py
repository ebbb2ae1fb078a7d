"""Seed 003 (Schuurmans & Frasincar): BiLSTM with a flat softmax against a two-level hierarchical
softmax over the natural class taxonomy, Tables 1-4 (TREC, 20NG, R8, R52), plus a learned tree.

``python -m hsm run taxonomy-tables -o data=trec|20ng|r8|r52 [--scale quick|full]`` writes
``results/taxonomy/<data>.json``: per seed and model (``flat``, ``hierarchical`` = the taxonomy,
``learned`` = a depth-2 tree learned with Algorithm 1 / Algorithm 3 from a random start), the
test macro-F1 / macro-precision / macro-recall / micro-accuracy of the epoch with the best
validation macro-F1, and for the learned tree the adjusted Rand index between its top-level split
of the classes and the taxonomy's categories.

Departures from the paper, all forced by this machine (2 shared CPU cores, no network):

* no GloVe (cannot be downloaded): embeddings are randomly initialised and trained;
* model selection on one stratified 10 % validation split carved from train, not 4-fold CV, and
  no grid over h_dim / bidirectionality: a BiLSTM, the sizes in the result file;
* documents truncated to their first ``max_tokens`` tokens; a reduced embedding size (and in
  quick mode hidden size and training slice); at most ``max_epochs`` epochs with early stopping
  on validation macro-F1 (patience ``patience``);
* the embeddings use SparseAdam (Adam for sparse gradients, same rate 1e-3): dense Adam over a
  20k x d embedding costs more than the LSTM on these CPUs; everything else is Adam, lr 1e-3,
  batch size 10, dropout 0.5, as in the paper.
"""
from __future__ import annotations

import copy
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hsm import paper
from hsm.config import seed_everything
from hsm.experiments import (check_device, check_scale, experiment, option_choices, option_float, option_int,
                             option_ints)
from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.results import check_replace, make_record, output_path, provenance, write_results
from hsm.sequence_models import LSTMTextClassifier, TextVocabulary, classification_metrics, encode_texts
from hsm.training import TreeLearner, train_epoch
from hsm.tree import Tree

__all__ = ["DATASETS", "build_output_layer", "top_level_groups", "train_one", "run_taxonomy_tables"]

#: data option -> (loader name, paper table number, paper key, hidden size the paper selected)
DATASETS = {
    "trec": ("trec-fine", 1, "trec", 150),
    "20ng": ("20ng", 2, "20ng", 150),
    "r8": ("r8", 3, "r8", 150),
    "r52": ("r52", 4, "r52", 100),
}
MODELS = ("flat", "hierarchical", "learned")


def learned_tree_start(num_labels: int, seed: int, label_names: list[str] | None = None) -> Tree:
    """Random depth-2 tree with arity ``ceil(sqrt(K))`` (the start of the learned tree)."""
    arity = max(2, math.ceil(math.sqrt(num_labels)))
    return Tree.random(num_labels, arity, depth=2, seed=seed, label_names=label_names)


def build_output_layer(kind: str, in_features: int, label_names: list[str], taxonomy: dict[str, list[str]] | None,
                       seed: int = 0) -> nn.Module:
    """``flat``: :class:`FlatSoftmax`; ``hierarchical``: :class:`HierarchicalSoftmax` over
    ``Tree.from_taxonomy`` (seed 003's two-level softmax); ``learned``: a HierarchicalSoftmax over
    a random depth-2 tree, to be learned with a :class:`TreeLearner`."""
    if kind == "flat":
        return FlatSoftmax(in_features, len(label_names))
    if kind == "hierarchical":
        if taxonomy is None:
            raise ValueError("the hierarchical model needs a taxonomy")
        return HierarchicalSoftmax(in_features, Tree.from_taxonomy(taxonomy, label_names))
    if kind == "learned":
        return HierarchicalSoftmax(in_features, learned_tree_start(len(label_names), seed, label_names))
    raise ValueError(f"unknown model {kind!r}; known: {MODELS}")


def top_level_groups(tree: Tree) -> np.ndarray:
    """For each label, the root's child its path goes through (the tree's top-level split)."""
    return np.array([tree.path(label)[0][1] for label in range(tree.num_labels)])


def category_ids(label_names: list[str], taxonomy: dict[str, list[str]]) -> np.ndarray:
    names = list(taxonomy)
    of = {label: names.index(cat) for cat, labels in taxonomy.items() for label in labels}
    return np.array([of[name] for name in label_names])


def _batches(tokens: torch.Tensor, labels: torch.Tensor, batch_size: int, gen: torch.Generator | None):
    order = torch.randperm(len(labels), generator=gen) if gen is not None else torch.arange(len(labels))
    for start in range(0, len(labels), batch_size):
        idx = order[start:start + batch_size]
        x = tokens[idx]
        width = int((x != 0).sum(1).max().clamp_min(1))  # trim the padding of this batch
        yield x[:, :width], labels[idx]


@torch.no_grad()
def _predict(model: nn.Module, layer: nn.Module, tokens: torch.Tensor, batch_size: int = 256) -> np.ndarray:
    model.eval()
    layer.eval()
    preds = [layer.log_prob(model(x)).argmax(1) for x, _ in _batches(tokens, torch.zeros(len(tokens), dtype=torch.long), batch_size, None)]
    return torch.cat(preds).numpy()


class _TwoOptimizers:
    """Adam for the dense parameters and SparseAdam for the (sparse) embedding, stepped together,
    so :func:`hsm.training.train_epoch` can drive them as one optimiser."""

    def __init__(self, dense: list[nn.Parameter], sparse: list[nn.Parameter], lr: float) -> None:
        self.optimizers = [torch.optim.Adam(dense, lr=lr), torch.optim.SparseAdam(sparse, lr=lr)]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()


def train_one(kind: str, data, valid, cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one model with early stopping on validation macro-F1; test metrics of the best epoch."""
    seed_everything(seed)
    vocab = TextVocabulary.from_texts(valid.train_texts, min_count=cfg["min_count"], max_size=cfg["max_vocab"])
    train_x = encode_texts(valid.train_texts, vocab, cfg["max_tokens"])
    train_y = torch.as_tensor(np.asarray(valid.train_labels), dtype=torch.long)
    valid_x = encode_texts(valid.test_texts, vocab, cfg["max_tokens"])
    valid_y = np.asarray(valid.test_labels)
    test_x = encode_texts(data.test_texts, vocab, cfg["max_tokens"])
    test_y = np.asarray(data.test_labels)
    if cfg["train_limit"]:
        keep = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(seed))[: cfg["train_limit"]]
        train_x, train_y = train_x[keep], train_y[keep]
    model = LSTMTextClassifier(len(vocab), cfg["embed_dim"], cfg["hidden_size"], bidirectional=True, dropout=cfg["dropout"])
    model.embedding.sparse = True
    layer = build_output_layer(kind, model.output_size, data.label_names, data.taxonomy, seed=seed)
    dense = [p for n, p in model.named_parameters() if not n.startswith("embedding")] + list(layer.parameters())
    optimizer = _TwoOptimizers(dense, [model.embedding.weight], cfg["lr"])
    steps_per_epoch = math.ceil(len(train_y) / cfg["batch_size"])
    learner = None
    initial_tree = layer.tree if kind == "learned" else None
    if kind == "learned":
        learner = TreeLearner(layer, reassign_every=max(steps_per_epoch // cfg["reassign_per_epoch"], 1), algorithm="depth")
    gen = torch.Generator().manual_seed(seed)
    best: dict[str, Any] = {"valid_f1": -1.0}
    history = []
    bad_epochs = 0
    start = time.perf_counter()
    for epoch in range(1, cfg["max_epochs"] + 1):
        if learner is not None and epoch > cfg["learn_tree_epochs"]:
            learner.freeze()
        loss = train_epoch(model, layer, _batches(train_x, train_y, cfg["batch_size"], gen), optimizer, learner=learner)
        valid_metrics = classification_metrics(valid_y, _predict(model, layer, valid_x))
        history.append({"epoch": epoch, "train_loss": loss, "valid_f1": valid_metrics["f1"]})
        print(f"[{cfg['data']}] {kind} seed {seed} epoch {epoch}: loss {loss:.3f}, valid macro-F1 {valid_metrics['f1']:.1f} "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        if valid_metrics["f1"] > best["valid_f1"]:
            best = {"valid_f1": valid_metrics["f1"], "epoch": epoch,
                    "state": (copy.deepcopy(model.state_dict()), copy.deepcopy(layer.state_dict()),
                              layer.tree if isinstance(layer, HierarchicalSoftmax) else None)}
            bad_epochs = 0
        else:
            bad_epochs += 1
            if bad_epochs >= cfg["patience"]:
                break
    model.load_state_dict(best["state"][0])
    if best["state"][2] is not None:
        layer.set_tree(best["state"][2])
    layer.load_state_dict(best["state"][1])
    test = classification_metrics(test_y, _predict(model, layer, test_x))
    out = {"test": test, "best_epoch": best["epoch"], "valid_f1": best["valid_f1"], "history": history,
           "train_seconds": time.perf_counter() - start, "vocab_size": len(vocab), "train_examples": int(len(train_y))}
    if kind == "learned" and data.taxonomy is not None:
        from sklearn.metrics import adjusted_rand_score

        cats = category_ids(data.label_names, data.taxonomy)
        out["ari_top_level"] = float(adjusted_rand_score(cats, top_level_groups(layer.tree)))
        out["ari_top_level_initial"] = float(adjusted_rand_score(cats, top_level_groups(initial_tree)))
        out["arity"] = layer.tree.arity
        out["moved_labels"] = [rec.moved_labels for rec in learner.history]
        out["top_level_split"] = {str(g): [data.label_names[i] for i in np.flatnonzero(top_level_groups(layer.tree) == g)]
                                  for g in np.unique(top_level_groups(layer.tree))}
    return out


#: how each option is parsed and range-checked (ValueError naming the option and its value)
_OPTION_CHECKS = {
    "seeds": lambda k, v: list(option_ints(k, v, minimum=0)),
    "models": lambda k, v: list(option_choices(k, v, MODELS)),
    "embed_dim": lambda k, v: option_int(k, v, minimum=1), "hidden_size": lambda k, v: option_int(k, v, minimum=1),
    "max_tokens": lambda k, v: option_int(k, v, minimum=1), "max_vocab": lambda k, v: option_int(k, v, minimum=2),
    "min_count": lambda k, v: option_int(k, v, minimum=1),
    "dropout": lambda k, v: option_float(k, v, minimum=0.0, below=1.0),
    "lr": lambda k, v: option_float(k, v, positive=True), "batch_size": lambda k, v: option_int(k, v, minimum=1),
    "max_epochs": lambda k, v: option_int(k, v, minimum=1), "patience": lambda k, v: option_int(k, v, minimum=1),
    "valid_fraction": lambda k, v: option_float(k, v, positive=True, below=1.0),
    "train_limit": lambda k, v: option_int(k, v, minimum=0),  # 0: no limit
    "test_limit": lambda k, v: option_int(k, v, minimum=0),
    "reassign_per_epoch": lambda k, v: option_int(k, v, minimum=1),
    "learn_tree_epochs": lambda k, v: option_int(k, v, minimum=0),
}


def _settings(scale: str, data: str, options: dict[str, Any]) -> dict[str, Any]:
    """The preset of ``scale`` with ``options`` applied; ValueError naming an unknown option or a
    bad value (counts >= 1, rates finite and > 0, fractions in (0, 1), known models)."""
    quick = check_scale(scale) == "quick"
    cfg: dict[str, Any] = {
        "data": data, "seeds": [0] if quick else [0, 1, 2], "models": list(MODELS),
        "embed_dim": 16 if quick else 100, "hidden_size": 16 if quick else DATASETS[data][3],
        "max_tokens": 20 if quick else 50, "max_vocab": 2000 if quick else 20000, "min_count": 1,
        "dropout": 0.5, "lr": 1e-3, "batch_size": 10, "max_epochs": 1 if quick else 6, "patience": 2,
        "valid_fraction": 0.1, "train_limit": 200 if quick else 0, "test_limit": 200 if quick else 0,
        "reassign_per_epoch": 10, "learn_tree_epochs": 1 if quick else 3,
    }
    for key, value in options.items():
        if key == "data":
            continue
        if key not in cfg:
            raise ValueError(f"unknown option {key!r}; known: {sorted(cfg)}")
        cfg[key] = _OPTION_CHECKS[key](key, value)
    for model in cfg["models"]:
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known: {MODELS}")
    return cfg


@experiment("taxonomy-tables", "Schuurmans & Frasincar Tables 1-4: BiLSTM, flat vs taxonomy HSM (+ learned tree)",
            "results/taxonomy/trec.json")
def run_taxonomy_tables(scale: str = "quick", device: str = "cpu", out: Path | str | None = None,
                        data: str = "trec", force: bool = False, **options: Any) -> Path:
    """One table of seed 003 (``data`` = trec, 20ng, r8 or r52) at the configured scale.

    ``out`` None: ``hsm-results/taxonomy/<data>.json`` (:func:`hsm.results.output_path`); a
    full-scale file at ``out`` is not replaced by a quick run unless ``force``. ValueError for a
    bad scale, data, device (CPU only) or option, before any training."""
    from hsm.data import load_text_classification

    if data not in DATASETS:
        raise ValueError(f"data must be one of {sorted(DATASETS)}, got {data!r}")
    cfg = _settings(scale, data, options)
    if torch.device(check_device(device)).type != "cpu":
        raise ValueError("taxonomy-tables runs on the CPU only (small models, batch size 10)")
    path = output_path(f"results/taxonomy/{data}.json", out)
    check_replace(path, scale, force)
    start = time.perf_counter()
    torch.set_num_threads(1)  # batch-10 LSTM steps are too small to gain from threads on a shared machine
    loader, table, key, _ = DATASETS[data]
    dataset = load_text_classification(loader)
    if cfg["test_limit"] and len(dataset.test_texts) > cfg["test_limit"]:
        from dataclasses import replace

        keep = np.arange(cfg["test_limit"])
        dataset = replace(dataset, test_texts=dataset.test_texts.subset(keep),
                          test_labels=np.asarray(dataset.test_labels)[keep])
    run_records: list[dict[str, Any]] = []
    per_model: dict[tuple[str, str], list[float]] = {}
    info = dict(device=device, loader=loader, test_examples=len(dataset.test_texts),
                note="random-init embeddings (no GloVe); 10% stratified validation split from train; truncated documents")
    for seed in cfg["seeds"]:
        valid = dataset.validation_split(cfg["valid_fraction"], seed=seed)
        for kind in cfg["models"]:
            result = train_one(kind, dataset, valid, cfg, seed)
            extra = {k: v for k, v in result.items() if k != "test"}
            run_records.append(make_record(None, result["test"]["f1"], kind_of_record="run", dataset=data, model=kind,
                                           seed=seed, scale=scale, test=result["test"], **extra))
            for measure, value in result["test"].items():
                per_model.setdefault((kind, measure), []).append(value)
            # write after every run, so a run cut short still leaves its finished part (marked incomplete)
            done = len(run_records) == len(cfg["seeds"]) * len(cfg["models"])
            records = run_records + _mean_records(per_model, table, key, data, scale, cfg["seeds"])
            path = write_results(path, records, provenance(dict(cfg, **info, complete=done), time.perf_counter() - start,
                                                           scale=scale), force=force)
    return path


def _mean_records(per_model: dict[tuple[str, str], list[float]], table: int, key: str, data: str, scale: str,
                  seeds: list[int]) -> list[dict[str, Any]]:
    """One record per (model, measure): the mean over the seeds run so far, named after the paper's number."""
    records = []
    for (kind, measure), values in per_model.items():
        claim = f"sf2020.table{table}.{key}.{kind}.{measure}"
        records.append(make_record(claim if claim in paper.NUMBERS else None, float(np.mean(values)),
                                   kind_of_record="mean_over_seeds", dataset=data, model=kind, measure=measure,
                                   std=float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                                   values=values, seeds=seeds[: len(values)], scale=scale,
                                   paper_value=paper.NUMBERS[claim].value if claim in paper.NUMBERS else None))
    return records
