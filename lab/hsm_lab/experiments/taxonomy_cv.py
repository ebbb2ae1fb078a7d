"""Schuurmans & Frasincar's model selection: k-fold cross-validation of the hidden size and the
direction of the LSTM.

The paper picks its models by 4-fold cross-validation on the training set, with macro-F1 as the
criterion, over a grid of bidirectionality and h_dim that it does not give; it reports h_dim 150
(R52: 100). The tables (:mod:`hsm_lab.experiments.taxonomy`) use those sizes with one validation split
instead. Here every setting of the grid is trained on k - 1 folds of the training split with early
stopping on the remaining fold, once per fold; the mean of the k best fold macro-F1s scores the
setting, and the best score picks one setting per model (flat, hierarchical). The test split plays
no part in the choice; each run's test macro-F1 at its best epoch is kept beside it, so that one can
see what the choice is worth on test.

A stopped run resumes from its finished (model, setting, fold) runs and, within the run that was
going, from its last epoch (the tables' mechanism).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm_lab.experiments import check_device, check_scale, experiment, option_choices, option_int, option_ints
from hsm_lab.results import ResumableParts, check_replace, make_record, output_path, provenance, write_progress, write_results

from hsm_lab.experiments import taxonomy as T

__all__ = ["DIRECTIONS", "cv_summary", "run_taxonomy_cv"]

#: the LSTM's direction: option word -> ``bidirectional``
DIRECTIONS = {"uni": False, "bi": True}
#: the grid of each scale: (hidden sizes, directions)
DEFAULT_GRID = {"quick": ((8, 16), ("bi",)), "full": ((100, 150, 200), ("uni", "bi"))}
DEFAULT_OUT = "results/taxonomy/trec-cv.json"


def cv_summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, hidden size, direction) from the fold records of :func:`run_taxonomy_cv`:
    the mean and standard deviation of the fold macro-F1s, the mean test macro-F1 of the same runs,
    the number of folds done, and ``selected`` on the best mean of each model (among the settings
    with every fold done)."""
    groups: dict[tuple[str, int, bool], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind_of_record") == "cv_fold":
            groups.setdefault((r["model"], r["hidden_size"], r["bidirectional"]), []).append(r)
    folds = max((r["folds"] for rows in groups.values() for r in rows), default=0)
    rows = []
    for (model, hidden, bidirectional), runs in groups.items():
        values = np.array([r["value"] for r in runs])
        rows.append({"model": model, "hidden_size": hidden, "bidirectional": bidirectional,
                     "cv_f1": float(values.mean()), "cv_f1_std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                     "test_f1": float(np.mean([r["test_f1"] for r in runs])), "folds_done": len(runs),
                     "selected": False})
    for model in {row["model"] for row in rows}:
        complete = [row for row in rows if row["model"] == model and row["folds_done"] == folds]
        if complete:
            max(complete, key=lambda row: row["cv_f1"])["selected"] = True
    return sorted(rows, key=lambda row: (row["model"], row["bidirectional"], row["hidden_size"]))


@experiment("taxonomy-cv", "Schuurmans & Frasincar's model selection: k-fold cross-validation of h_dim and "
            "bidirectionality on the training split", DEFAULT_OUT)
def run_taxonomy_cv(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, data: str = "trec",
                    force: bool = False, **options: Any) -> Path:
    """See the module docstring. Options: ``folds`` (default 4), ``hidden_sizes`` and ``directions``
    (``uni``, ``bi``) span the grid (full: 100, 150, 200 and both directions); ``models`` (default
    flat and hierarchical) and every option of ``taxonomy-tables`` but ``hidden_size`` and
    ``bidirectional``, which the grid sets. The first of ``seeds`` (default 0) draws the folds and
    initialises every run."""
    scale = check_scale(scale)
    options = dict(options)
    folds = option_int("folds", options.pop("folds", 4), minimum=2)
    hidden_default, direction_default = DEFAULT_GRID[scale]
    hidden_sizes = option_ints("hidden_sizes", options.pop("hidden_sizes", ",".join(map(str, hidden_default))),
                               minimum=1)
    directions = option_choices("directions", options.pop("directions", ",".join(direction_default)),
                                tuple(DIRECTIONS))
    for key in ("hidden_size", "bidirectional"):
        if key in options:
            raise ValueError(f"option {key!r} is what the cross-validation varies; give hidden_sizes=... and "
                             "directions=uni,bi instead")
    options.setdefault("models", "flat,hierarchical")
    options.setdefault("seeds", "0")
    if data not in T.DATASETS:
        raise ValueError(f"data must be one of {sorted(T.DATASETS)}, got {data!r}")
    T._settings(scale, data, options)  # bad options fail here, before any data is read
    device = torch.device(check_device(device))
    path = output_path(f"results/taxonomy/{data}-cv.json", out)
    check_replace(path, scale, force)
    start = time.perf_counter()
    T.configure_threads(default=1)
    cfg, dataset, pretrained = T._prepare(scale, data, options)
    seed = cfg["seeds"][0]
    grid = {"folds": folds, "hidden_sizes": list(hidden_sizes), "directions": list(directions)}
    selection = (f"{folds}-fold cross-validation of h_dim over {', '.join(map(str, hidden_sizes))} and "
                 + " and ".join({"uni": "one-directional", "bi": "bidirectional"}[d] for d in directions)
                 + " LSTMs")
    label = T.scale_label(scale, dict(cfg, seeds=[seed]), selection=selection)
    splits = dataset.cross_validation_splits(folds, seed=seed)
    parts = ResumableParts(path, T._run_settings(cfg) | grid | {"device": str(device)},
                           what="partial cross-validation file", log=lambda m: print(m, file=sys.stderr, flush=True))
    checkpoints = path.parent / f".{path.name}.checkpoints"
    info = dict(device=str(device), threads=torch.get_num_threads(), test_examples=len(dataset.test_texts),
                paper_hidden_size=T.DATASETS[data][3], selection=selection, **grid)
    records: list[dict[str, Any]] = []
    total = len(cfg["models"]) * len(hidden_sizes) * len(directions) * folds
    for kind in cfg["models"]:
        for direction in directions:
            for hidden in hidden_sizes:
                run_cfg = dict(cfg, hidden_size=hidden, bidirectional=DIRECTIONS[direction])
                for k, split in enumerate(splits):
                    name = f"{kind}/h{hidden}/{direction}/fold{k}"
                    result = parts.run(name, lambda: T.train_one(
                        kind, dataset, split, run_cfg, seed, pretrained=pretrained, device=device,
                        checkpoint=checkpoints / f"{kind}-h{hidden}-{direction}-fold{k}.pt"))
                    records.append(make_record(None, result["valid_f1"], kind_of_record="cv_fold", measure="cv_f1",
                                               dataset=data, model=kind, hidden_size=hidden,
                                               bidirectional=DIRECTIONS[direction], fold=k, folds=folds, seed=seed,
                                               best_epoch=result["best_epoch"], test_f1=result["test"]["f1"],
                                               test_accuracy=result["test"]["accuracy"],
                                               epochs_run=len(result["history"]), scale=label,
                                               train_examples=result["train_examples"],
                                               train_seconds=result["train_seconds"]))
                    done = len(records) == total
                    summary = [make_record(None, row["cv_f1"], kind_of_record="cv_setting", measure="cv_f1",
                                           dataset=data, scale=label,
                                           **{key: value for key, value in row.items() if key != "cv_f1"})
                               for row in cv_summary(records)]
                    prov = provenance(dict(cfg, **info, complete=done), time.perf_counter() - start, scale=label)
                    path = (write_results if done else write_progress)(path, records + summary, prov, force=force)
    parts.finish()
    if checkpoints.is_dir() and not any(checkpoints.iterdir()):
        checkpoints.rmdir()
    return path
