"""The registered language-model experiments (``python -m hsm run lm-ptb ...``) and their
``-o key=value`` options: each checks its scale, device and options before training, trains its
table (:mod:`~hsm_lab.experiments.lm.tables`) and writes its result file
(:mod:`~hsm_lab.experiments.lm.report`)."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hsm_lab.experiments import (check_device, check_scale, experiment, option_choice, option_choices, option_float,
                             option_floats, option_int)
from hsm_lab.results import check_replace

from hsm_lab.experiments.lm.presets import ABLATION_VARIANTS, DEFAULT_OUT, SCALES, LMScale, _ablation_changes
from hsm_lab.experiments.lm.report import _ablation_records, _out_path, _records, _write, scale_label
from hsm_lab.experiments.lm.tables import run_ablation, run_table

__all__ = ["ablation_scale_label", "run_lm_gutenberg_65", "run_lm_gutenberg_75", "run_lm_ptb", "run_lm_ptb_ablation", "run_lm_ptb_schedules"]


def _parse_options(options: dict[str, Any]) -> dict[str, Any]:
    """``-o key=value`` options (strings from the CLI, or Python values) to checked LMScale fields.

    Raises ValueError naming the option and its value for an unknown key, a value that does not
    parse, or one out of range (counts >= 1, arity >= 2, learning rates finite and > 0, a
    non-empty ``lr_grid``, ``decay`` in [0, 1], ``l2`` >= 0, ...)."""
    known = {f for f in LMScale.__dataclass_fields__}
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            raise ValueError(f"unknown option {key!r}; known: {sorted(known)}")
        if key == "lr_grid":
            out[key] = option_floats(key, value, positive=True)
        elif key == "dataset":
            out[key] = option_choice(key, value, ("ptb", "gutenberg"))
        elif key == "description":
            out[key] = str(value)
        elif key == "clustering_embeddings":
            out[key] = option_choice(key, value, ("fasttext", "fasttext-ngrams", "lbl"))
        elif key == "clustering_groups":
            out[key] = option_choice(key, value, ("kmeans", "random"))
        elif key == "split":
            out[key] = option_choice(key, value, ("books", "chunks"))
        elif key == "l2":
            out[key] = option_float(key, value, minimum=0.0)
        elif key == "decay":
            out[key] = option_float(key, value, minimum=0.0, maximum=1.0)
        elif key == "learn_epochs":
            number = option_float(key, value, minimum=0.0)
            out[key] = int(number) if number.is_integer() else number
        elif key in _OPTIONAL_COUNTS:
            out[key] = option_int(key, value, minimum=_OPTIONAL_COUNTS[key], allow_none=True)
        else:
            out[key] = option_int(key, value, minimum=_COUNT_MINIMUM.get(key, 1))
    return out


#: LMScale fields that may be None ("none": the whole corpus / vocabulary), with their minimum
_OPTIONAL_COUNTS = {"max_books": 1, "vocab_size": 2, "train_tokens": 1, "eval_tokens": 1, "select_eval_tokens": 1,
                   "split_seed": 0}
#: integer LMScale fields whose minimum is not 1
_COUNT_MINIMUM = {"arity": 2, "select_steps": 0, "first_random_seed": 0, "learned_tree_seed": 0}


def _scale_for(name: str, scale: str, options: dict[str, Any]) -> LMScale:
    """The preset of ``name`` at ``scale`` with ``options`` applied (all checked: ValueError)."""
    presets = SCALES[name]
    sc = replace(presets[check_scale(scale)], **_parse_options(options))
    if sc.max_books is not None and sc.dataset != "gutenberg":
        raise ValueError(f"option max_books={sc.max_books}: only the gutenberg dataset has books")
    if sc.dataset != "gutenberg" and (sc.split, sc.split_seed, sc.min_count) != ("books", None, 1):
        raise ValueError("options split, split_seed and min_count: only the gutenberg dataset has a book split "
                         "to vary")
    return sc


def _run_experiment(name: str, scale: str, device: str, out: Path | None, options: dict[str, Any],
                    outputs: Sequence[str], claim_prefix: str, claim_kind: str,
                    schedules: Callable[[LMScale], list[tuple[str, int]]] | None = None,
                    force: bool = False) -> Path:
    """Run one registered experiment: train its output layers, write its records (claims only
    when the data are the paper's: full vocabulary, all tokens), save its learned trees.

    Besides the :class:`LMScale` fields, ``runs`` picks the rows to train and
    ``checkpoint_minutes`` the training time between two checkpoints within an epoch (default:
    ``HSM_CHECKPOINT_SECONDS``, else 5 minutes), so that an epoch longer than one sitting resumes
    where it stopped. Everything is checked before training starts (ValueError): the scale, the
    device, the options, and that ``out`` does not hold a larger-scale result (unless ``force``)."""
    start = time.perf_counter()
    options = dict(options)
    runs = options.pop("runs", None)
    minutes = options.pop("checkpoint_minutes", None)
    checkpoint_seconds = None if minutes is None else 60 * option_float("checkpoint_minutes", minutes, positive=True)
    if runs is not None:
        # a table too long for one sitting, split into parts (each its own result file, --out);
        # "selection" alone picks the learning rate and trains nothing
        chosen = option_choices("runs", runs, tuple(outputs) + ("selection",))
        if "selection" in chosen and len(chosen) > 1:
            raise ValueError(f"option runs={runs!r}: 'selection' trains nothing, so it stands alone")
        outputs = tuple(kind for kind in outputs if kind in chosen)
        if schedules is not None and "learned" not in chosen:
            schedules = None
    sc = _scale_for(name, scale, options)
    device = check_device(device)
    check_replace(_out_path(out, DEFAULT_OUT[name]), scale, force)
    table = run_table(name, sc, outputs, device, schedules=schedules(sc) if schedules else None,
                      checkpoint_seconds=checkpoint_seconds)
    if sc.dataset == "ptb":
        paper_data = sc.vocab_size is None and sc.train_tokens is None
    else:
        paper_data = (sc.max_books is None and sc.vocab_size in (None, 250_000) and sc.train_tokens is None
                      and (sc.split, sc.split_seed, sc.min_count) == ("books", None, 1)
                      and sc.clustering_groups == "kmeans" and sc.clustering_embeddings == "fasttext")
    selection = table["selection"]
    # training time of every run this result rests on (runs finished earlier are loaded from the
    # run folder, so this invocation's wall time can be much shorter)
    training_seconds = (sum(run.seconds for kind, run in table["runs"].items() if kind != "random")
                        + sum(selection.get("random_seed_seconds", []))
                        + sum(t["seconds"] for key in ("tree_trials", "flat_trials", "adaptive_trials")
                              for t in selection.get(key, [])))
    trees: dict[str, Any] = {}
    records = _records(table, sc, claim_prefix if scale == "full" and paper_data else None, claim_kind, scale,
                       trees, _out_path(out, DEFAULT_OUT[name]).stem)
    return _write(name, out, DEFAULT_OUT[name], records, sc, scale, device, time.perf_counter() - start, trees,
                  options, training_seconds, extra_config={"runs": list(outputs), **_corpus_source(sc)}, force=force)


def _corpus_source(sc: LMScale) -> dict[str, Any]:
    """What a Gutenberg table's corpus was when not built from the archive (for the provenance):
    the exported corpus's identity (its settings and the sha256 of every part), not the folder it
    was read from, which names only the machine."""
    from hsm_lab.data.gutenberg import prebuilt_directory

    prebuilt = prebuilt_directory() if sc.dataset == "gutenberg" else None
    if prebuilt is None:
        return {}
    meta = json.loads((prebuilt / "corpus.json").read_text())
    return {"prebuilt_corpus": {"export": "python -m hsm data export gutenberg DIR",
                                "settings": meta["settings"], "sha256": meta["sha256"]}}


def _ptb_schedules(sc: LMScale) -> list[tuple[str, int]]:
    """arXiv Fig. 3: learn the tree for 1 epoch then fine-tune, and learn for all but the last."""
    last = max(sc.epochs - 1, 1)
    return [(f"learned_1_{sc.epochs - 1}", 1), (f"learned_{last}_{sc.epochs - last}", last)]


@experiment("lm-ptb", "arXiv Table 1 (PTB): flat, random, learned tree; 25-ary depth 3, T=3", DEFAULT_OUT["lm-ptb"])
def run_lm_ptb(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
               **options: Any) -> Path:
    """arXiv Table 1, PTB columns. ``out`` None: ``hsm-results/lm/ptb.json`` (see the module
    docstring); ValueError for a bad scale, device or option, or a refused replacement."""
    return _run_experiment("lm-ptb", scale, device, out, options, ("flat", "random", "learned"),
                           "arxiv2016.table1.ptb", "arxiv", force=force)


@experiment("lm-ptb-schedules", "arXiv Fig. 3 (PTB): perplexity per epoch, learn 1+fine-tune 3, learn 3+1, "
            "random, flat", DEFAULT_OUT["lm-ptb-schedules"])
def run_lm_ptb_schedules(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                         **options: Any) -> Path:
    """arXiv Fig. 3 (PTB): the two tree-learning schedules against the random tree and flat."""
    return _run_experiment("lm-ptb-schedules", scale, device, out, options, ("flat", "random"), "", "arxiv",
                           schedules=_ptb_schedules, force=force)


@experiment("lm-gutenberg-65", "ICML Table 2 + Fig. 2 (Gutenberg): clustering, random, flat, learned; 65-ary "
            "depth 3, T=4", DEFAULT_OUT["lm-gutenberg-65"])
def run_lm_gutenberg_65(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                        **options: Any) -> Path:
    """ICML Table 2 and Fig. 2."""
    return _run_experiment("lm-gutenberg-65", scale, device, out, options,
                           ("clustering", "random", "flat", "learned", "adaptive"), "icml2017.table2", "icml",
                           force=force)


@experiment("lm-gutenberg-75", "arXiv Table 1 (Gutenberg columns): flat, random, learned; 75-ary depth 3, T=4",
            DEFAULT_OUT["lm-gutenberg-75"])
def run_lm_gutenberg_75(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                        **options: Any) -> Path:
    """arXiv Table 1, Gutenberg columns."""
    return _run_experiment("lm-gutenberg-75", scale, device, out, options, ("flat", "random", "learned"),
                           "arxiv2016.table1.gutenberg", "arxiv", force=force)


@experiment("lm-ptb-ablation", "Why the learned tree gains little over the random tree (PTB, reduced): one "
            "change at a time (rebuild rate, statistics decay and prior, ranking, learning rate, schedule)",
            DEFAULT_OUT["lm-ptb-ablation"])
def run_lm_ptb_ablation(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                        **options: Any) -> Path:
    """Ablation of the learned tree's setting on a reduced PTB (``-o variants=base,decay_0,...``
    picks a subset of :data:`ABLATION_VARIANTS`; the other options are LMScale fields)."""
    start = time.perf_counter()
    options = dict(options)
    variants = options.pop("variants", None)
    variants = (list(ABLATION_VARIANTS) if variants is None else
                [v for v in (variants.split(",") if isinstance(variants, str) else variants) if v])
    sc = _scale_for("lm-ptb-ablation", scale, options)
    unknown = [v for v in variants if v not in ABLATION_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"option variants: unknown or no ablation variants {unknown}; known: {list(ABLATION_VARIANTS)}")
    device = check_device(device)
    check_replace(_out_path(out, DEFAULT_OUT["lm-ptb-ablation"]), scale, force)
    table = run_ablation(sc, variants, device)
    records = _ablation_records(table, sc, scale)
    training_seconds = sum(run.seconds for run in table["runs"].values())
    options = dict(options, **({"variants": ",".join(variants)} if variants != list(ABLATION_VARIANTS) else {}))
    return _write("lm-ptb-ablation", out, DEFAULT_OUT["lm-ptb-ablation"], records, sc, scale, device,
                  time.perf_counter() - start, None, options,
                  training_seconds, extra_config={
                      "variants": {v: _ablation_changes(v, sc.epochs) for v in variants},
                      "initial_learned_tree": "random (seed 0), the random_seed0 run's tree"}, force=force,
                  label=ablation_scale_label(scale, sc, options))


#: the paper's setting of each data set (a full preset), which an ablation's label is read against
_PAPER_SETTING = {"ptb": "lm-ptb", "gutenberg": "lm-gutenberg-65"}


def ablation_scale_label(scale: str, sc: LMScale, options: dict[str, Any]) -> str | None:
    """The scale label of an ablation run at ``sc``: at full scale, what differs from the paper's
    setting of its data set (lm-ptb's full preset, or lm-gutenberg-65's), named as the LM
    report's ``scale_label`` names overrides, e.g. ``"full, reduced: epochs=2, lr_grid=0.05,
    random_seeds=3, select_steps=0; settings: learn_epochs=1"``; None (the label of the options
    against the ablation's preset) at quick scale.

    The ablation's full preset is itself reduced (2 of the paper's 4 epochs, one rate without a
    search, 3 random trees), so the label the preset's overrides give ("full") would claim the
    paper's setting; the other options (``variants``) are named as settings."""
    if scale != "full":
        return None
    paper = SCALES[_PAPER_SETTING[sc.dataset]]["full"]
    fields = LMScale.__dataclass_fields__
    differs: dict[str, Any] = {}
    for key in fields:
        value = getattr(sc, key)
        # without a rate search (select_steps=0) the search's validation slice means nothing
        unused = key == "select_eval_tokens" and sc.select_steps == 0
        if key != "description" and not unused and value != getattr(paper, key):
            differs[key] = ",".join(f"{rate:g}" for rate in value) if key == "lr_grid" else value
    others = {key: value for key, value in options.items() if key not in fields}
    return scale_label(scale, {**differs, **others}, paper)
