"""Two experiments of the compiled bag-of-words trainer (:class:`hsm.classifiers.fast_classifier.FastBowClassifier`).

``icml-fast-ablation`` asks which of the tree-learning choices the paper leaves open decides
whether a learned tree beats the M-ary Huffman tree it starts from (ICML §7.1 claims up to +3.3
P@1): the node-statistics policy (ours, :class:`hsm.NodeStatistics`, or the released fastText fork's,
:class:`hsm.statistics.ReleasedStatistics`) crossed with the rebuild schedule (Algorithm 1's
AssignLabels 50 times in the first half of training, ICML §11.1, or the fork's check every
``lrUpdateRate`` tokens to the end of training), plus two variants of our statistics (the thesis'
uniform prior; statistics halved at every rebuild with moved nodes re-initialised). Every variant
runs for several seeds, each with its own learning-rate choice on a validation split carved from
train (as ICML Table 1), and is compared with the Huffman tree of the same seed: the seed spread
says how large a difference has to be to mean something.

``fast-classifier-repeats`` runs each threaded (Hogwild) configuration many times in a worker
process watched by a time limit, and counts crashes, hangs and non-finite results: the released
C++ code fails often when run like this, a lock-free trainer must not.
"""
from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from hsm_lab.experiments import (check_device, check_scale, experiment, option_choices, option_float, option_int,
                             option_ints)
from hsm_lab.experiments.classification import (OUTPUTS, TableConfig, _default_out, _parse_options, _subset_rows,
                                            encode_data, evaluate_bow, load_classification_data, load_table_data,
                                            run_table, train_bow)
from hsm_lab.experiments.classification.commands import threads_note
from hsm_lab.experiments.classification.config import _config_json
from hsm_lab.results import ResumableParts, check_replace, provenance, write_results

__all__ = ["ABLATION_VARIANTS", "REPEAT_CONFIGS", "fast_ablation", "fast_repeats", "fast_time_split", "option_settings",
           "split_time", "summarise_ablation"]

#: the tree-learning variants of the ablation, in the order they run: (statistics, schedule) crossed,
#: then two changes to our statistics (TableConfig fields)
ABLATION_VARIANTS: dict[str, dict[str, Any]] = {
    "ours/first_half": {"statistics": "ours", "schedule": "first_half"},
    "released/first_half": {"statistics": "released", "schedule": "first_half"},
    "ours/every_tokens": {"statistics": "ours", "schedule": "every_tokens"},
    "released/every_tokens": {"statistics": "released", "schedule": "every_tokens"},
    "ours/first_half/uniform_prior": {"statistics": "ours", "schedule": "first_half", "tree_prior": "uniform"},
    "ours/first_half/decay0.5_reset": {"statistics": "ours", "schedule": "first_half", "tree_decay": 0.5,
                                       "reset_moved_nodes": True},
}
#: the threaded configurations of the repeats experiment: name -> (output, statistics)
REPEAT_CONFIGS: dict[str, tuple[str, str]] = {
    "flat": ("flat", "ours"), "huffman20": ("huffman20", "ours"),
    "learned20/ours": ("learned20", "ours"), "learned20/released": ("learned20", "released"),
}
_VARIANT_FIELDS = ("statistics", "schedule", "tree_prior", "tree_decay", "reset_moved_nodes")


# ====================================================================================== ablation
def _ablation_config(scale: str, options: dict[str, Any]) -> tuple[TableConfig, tuple[int, ...], list[str],
                                                                    tuple[int, ...]]:
    """(table config, seeds, variants, arities) from the experiment's options; ValueError naming a bad one."""
    options = dict(options)
    quick = check_scale(scale) == "quick"
    seeds = option_ints("seeds", options.pop("seeds", "0" if quick else "0,1,2"), minimum=0)
    variants = option_choices("variants", options.pop("variants", ",".join(ABLATION_VARIANTS)),
                              tuple(ABLATION_VARIANTS))
    arities = option_ints("arities", options.pop("arities", "5,20"), minimum=2)
    for m in arities:
        if f"learned{m}" not in OUTPUTS or f"huffman{m}" not in OUTPUTS:
            raise ValueError(f"option arities: no learned/Huffman output of arity {m}; choose from 5, 20")
    for key in ("outputs", "peers", "trainer", "seed", *_VARIANT_FIELDS):
        if key in options:
            raise ValueError(f"option {key} is set by the ablation itself")
    defaults = {"dims": "50", "threads": "1"}
    config = _parse_options(scale, {**defaults, **options, "trainer": "fast", "peers": ""})
    if quick and "lr_grid" not in options:
        config = replace(config, lr_grid=(0.5,))
    return config, seeds, list(variants), arities


def _ablation_rows(config: TableConfig, seed: int, variant: str | None, arities: Sequence[int],
                   log: Callable[[str], None]) -> list[dict[str, Any]]:
    """One table run: the Huffman rows (``variant`` None) or the learned rows of one variant."""
    kind = "huffman" if variant is None else "learned"
    settings = {} if variant is None else ABLATION_VARIANTS[variant]
    cfg = replace(config, seed=seed, outputs=tuple(f"{kind}{m}" for m in arities), save_trees=False, **settings)
    rows = []
    for record in run_table(cfg, "table1", log=log):
        if record.get("model") == "gain":
            continue
        row = {key: record.get(key) for key in ("output", "arity", "d", "p_at_1", "r_at_1", "lr", "train_seconds",
                                                "test_seconds", "nodes_visited", "expected_depth", "reassigns",
                                                "moved_labels_first", "moved_labels_last", "valid_p_at_1")
               if key in record}
        row.update(seed=seed, variant=variant or "huffman",
                   **({f: getattr(cfg, f) for f in _VARIANT_FIELDS} if variant else {}))
        rows.append(row)
    return rows


def summarise_ablation(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, d, arity): P@1 over seeds (mean, sd, min, max) and the paired gain over the
    Huffman tree of the same seed and arity (mean, sd, min, max, and how many seeds it is > 0)."""
    huffman = {(r["seed"], r["d"], r["arity"]): r["p_at_1"] for r in rows if r["variant"] == "huffman"}
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["d"], r["arity"]), []).append(r)
    out = []
    for (variant, d, arity), members in groups.items():
        p = np.array([r["p_at_1"] for r in members])
        summary = {"kind": "summary", "variant": variant, "d": d, "arity": arity, "seeds": len(members),
                   "p_at_1_mean": float(p.mean()), "p_at_1_sd": float(p.std(ddof=1)) if len(p) > 1 else None,
                   "p_at_1_min": float(p.min()), "p_at_1_max": float(p.max())}
        if variant != "huffman":
            gains = np.array([r["p_at_1"] - huffman[(r["seed"], d, arity)] for r in members
                              if (r["seed"], d, arity) in huffman])
            if gains.size:
                summary.update(gain_mean=float(gains.mean()),
                               gain_sd=float(gains.std(ddof=1)) if gains.size > 1 else None,
                               gain_min=float(gains.min()), gain_max=float(gains.max()),
                               seeds_learned_above=int((gains > 0).sum()))
        out.append(summary)
    order = ["huffman", *ABLATION_VARIANTS]
    out.sort(key=lambda s: (s["d"], s["arity"], order.index(s["variant"])))
    return out


@experiment("icml-fast-ablation", "Learned vs Huffman trees with the compiled trainer: statistics policy x "
            "rebuild schedule (+ prior, decay/reset), several seeds; data=cooking|gutenberg-books",
            "results/classification/fast-ablation-cooking.json")
def fast_ablation(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                  **options: Any) -> Path:
    """The statistics/schedule ablation (module docstring). Options: those of ``icml-table1``
    (``data``, ``dims`` (default 50), ``lr_grid``, ``epochs``, ``threads`` (default 1, so that a seed
    fixes the run), ``train_limit``...) plus ``seeds`` (default 0,1,2; quick: 0), ``variants`` (names
    of :data:`ABLATION_VARIANTS`, default all) and ``arities`` (default 5,20). Quick: a 3,000-question
    slice of cooking at the rate 0.5. A stopped run resumes from ``.<out name>.partial.json``."""
    config, seeds, variants, arities = _ablation_config(scale, options)
    check_device(device)
    if device != "cpu":
        raise ValueError(f"the compiled trainer runs on the CPU, got device={device!r}")
    out = Path(out) if out is not None else _default_out("fast-ablation", scale, config.data)
    check_replace(out, scale, force)
    log = lambda message: print(message, flush=True)  # noqa: E731
    # each (seed, variant) is one part: the parts depend on the table config and the arities
    parts = ResumableParts(out, {"config": config.__dict__, "arities": list(arities)}, "partial ablation file",
                           log=log)
    start = time.perf_counter()

    def part(seed: int, variant: str | None) -> list[dict[str, Any]]:
        key = f"seed{seed}/{variant or 'huffman'}"
        if key not in parts:
            log(f"== {key}")
        return parts.run(key, lambda: _ablation_rows(config, seed, variant, arities, log))

    rows = [dict(r, kind="run") for seed in seeds for variant in [None, *variants] for r in part(seed, variant)]
    records = rows + summarise_ablation(rows)
    prov = provenance(config={**json.loads(json.dumps(config.__dict__, default=list)), "seeds": list(seeds),
                              "variants": {v: ABLATION_VARIANTS[v] for v in variants}, "arities": list(arities),
                              "experiment": "icml-fast-ablation"},
                      wall_time_s=time.perf_counter() - start, scale=scale, threads_note=threads_note(config))
    path = write_results(out, records, prov, force=force)
    parts.finish()
    return path


# ====================================================================================== repeats
def _repeat_worker(spec: dict[str, Any]) -> None:
    """Worker process: train and test ``spec['output']`` repeatedly, one JSON line per finished run
    on stdout (``{"run": i, "p_at_1": ..., "train_seconds": ..., "finite": ...}``).

    ``HSM_REPEATS_FAULT=crash:I`` or ``hang:I`` makes run I exit abruptly or sleep forever: the
    test of the watchdog's bookkeeping (never set it otherwise)."""
    import torch

    fault = os.environ.get("HSM_REPEATS_FAULT", "")
    data = load_classification_data(spec["data"], None, spec.get("max_books"), 100)
    data = _subset_rows(data, spec.get("train_limit"), "train", 0)
    data = _subset_rows(data, spec.get("test_limit"), "test", 1)
    vocab, train_split, test_split = encode_data(data)
    torch.set_num_threads(1)
    for run in range(spec["first"], spec["repeats"]):
        if fault == f"crash:{run}":
            os._exit(3)
        if fault == f"hang:{run}":
            time.sleep(10 ** 6)
        trained = train_bow(train_split, spec["output"], spec["dim"], spec["lr"], epochs=spec["epochs"],
                            vocab_size=len(vocab), trainer="fast", statistics=spec["statistics"],
                            threads=spec["threads"], seed=spec["seed_base"] + run)
        result = evaluate_bow(trained, test_split)
        finite = bool(math.isfinite(result["p_at_1"]) and math.isfinite(trained.final_loss)
                      and all(bool(torch.isfinite(p).all()) for p in trained.model.parameters())
                      and all(bool(torch.isfinite(p).all()) for p in trained.layer.parameters()))
        print(json.dumps({"run": run, "p_at_1": result["p_at_1"], "train_seconds": trained.train_seconds,
                          "final_loss": trained.final_loss, "finite": finite}), flush=True)


def _watch(spec: dict[str, Any], timeout_s: float, log: Callable[[str], None], startup_s: float = 120.0
           ) -> list[dict[str, Any]]:
    """Run the worker over runs 0..repeats-1. A run that ends the worker is a crash, one without a
    result within ``timeout_s`` (plus ``startup_s`` for a worker's first, which also loads the
    data and compiles the kernels) a hang: either
    is recorded and a new worker goes on with the next run."""
    outcomes: list[dict[str, Any]] = []
    first = 0
    while first < spec["repeats"]:
        proc = subprocess.Popen([sys.executable, "-m", "hsm_lab.experiments.classification_fast", "--worker",
                                 json.dumps(dict(spec, first=first))], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=os.environ.copy())
        lines: queue.Queue[str | None] = queue.Queue()
        stderr: list[str] = []

        def read_stdout() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.put(line)
            lines.put(None)  # end of the worker's output

        threading.Thread(target=read_stdout, daemon=True).start()
        stderr_reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
        stderr_reader.start()
        limit = timeout_s + startup_s
        while True:
            try:
                line = lines.get(timeout=limit)
            except queue.Empty:
                proc.kill()
                proc.wait()
                outcomes.append({"run": first, "status": "hang", "timeout_s": limit})
                log(f"  {spec['name']} run {first}: HANG (no result in {limit:.0f} s), killed")
                first += 1
                break
            if line is None:
                proc.wait()
                if first < spec["repeats"]:  # the worker ended before its last run: run `first` crashed it
                    stderr_reader.join(timeout=5)
                    outcomes.append({"run": first, "status": "crash", "returncode": proc.returncode,
                                     "stderr_tail": "".join(stderr)[-2000:]})
                    log(f"  {spec['name']} run {first}: CRASH (exit {proc.returncode})")
                    first += 1
                break
            outcome = json.loads(line)
            outcome["status"] = "ok" if outcome.pop("finite") else "non-finite"
            outcomes.append(outcome)
            log(f"  {spec['name']} run {outcome['run']}: {outcome['status']}, P@1 {outcome['p_at_1']:.2f}, "
                f"{outcome['train_seconds']:.1f} s")
            first = outcome["run"] + 1
            limit = timeout_s
    return outcomes


#: the options of ``fast-classifier-repeats``
_REPEATS_OPTIONS = {"configs", "repeats", "threads", "data", "dim", "lr", "epochs", "timeout_s", "train_limit",
                    "test_limit", "max_books", "seed", "startup_s"}


def _repeats_settings(scale: str, options: dict[str, Any]) -> tuple[list[str], dict[str, Any], float, float]:
    """(configurations, the workers' settings, timeout_s, startup_s) of ``fast-classifier-repeats``
    from its options (:func:`fast_repeats`); ValueError naming an unknown or bad one."""
    quick = check_scale(scale) == "quick"
    unknown = sorted(set(options) - _REPEATS_OPTIONS)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; known: {sorted(_REPEATS_OPTIONS)}")
    configs = option_choices("configs", options.get("configs", ",".join(REPEAT_CONFIGS)), tuple(REPEAT_CONFIGS))
    data = str(options.get("data", "cooking")).strip()
    if not data:
        raise ValueError("option data='': name a stand-in (cooking, gutenberg-books) or a fastText file")
    spec_base = {
        "data": data,
        "repeats": option_int("repeats", options.get("repeats", 3 if quick else 20), minimum=1),
        "threads": option_int("threads", options.get("threads", 2), minimum=1),
        "dim": option_int("dim", options.get("dim", 50), minimum=1),
        "lr": option_float("lr", options.get("lr", 0.5), positive=True),
        "epochs": option_int("epochs", options.get("epochs", 5), minimum=1),
        "train_limit": option_int("train_limit", options.get("train_limit", 3000 if quick else None), minimum=1,
                                  allow_none=True),
        "test_limit": option_int("test_limit", options.get("test_limit", 1000 if quick else None), minimum=1,
                                 allow_none=True),
        "max_books": option_int("max_books", options.get("max_books", 40 if quick else None), minimum=1,
                                allow_none=True),
        "seed_base": option_int("seed", options.get("seed", 0), minimum=0),
    }
    timeout_s = option_float("timeout_s", options.get("timeout_s", 300), positive=True)
    startup_s = option_float("startup_s", options.get("startup_s", 120), minimum=0.0)
    return list(configs), spec_base, timeout_s, startup_s


@experiment("fast-classifier-repeats", "The compiled trainer's threaded configurations run many times: "
            "crashes, hangs, non-finite results and the P@1 spread", "results/classification/fast-repeats-cooking.json")
def fast_repeats(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                 **options: Any) -> Path:
    """Run each of :data:`REPEAT_CONFIGS` (``configs``, default all) ``repeats`` times (default 20;
    quick 3) on ``threads`` Hogwild threads (default 2) in a watched worker process, on ``data``
    (default cooking; quick: a 3,000-question slice), d = ``dim`` (50), rate ``lr`` (0.5, the
    rate every tree row chose on cooking), ``epochs`` (5); a run without a result within
    ``timeout_s`` (default 300; ``startup_s``, default 120, more for a worker's first run) is a hang. Records: one per run and one summary per configuration."""
    check_scale(scale)
    check_device(device)
    if device != "cpu":
        raise ValueError(f"the compiled trainer runs on the CPU, got device={device!r}")
    configs, spec_base, timeout_s, startup_s = _repeats_settings(scale, options)
    data = spec_base["data"]
    out = Path(out) if out is not None else _default_out("fast-repeats", scale, data)
    check_replace(out, scale, force)
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    for name in configs:
        output, statistics = REPEAT_CONFIGS[name]
        spec = dict(spec_base, name=name, output=output, statistics=statistics)
        print(f"== {name}: {spec['repeats']} runs on {spec['threads']} threads", flush=True)
        outcomes = _watch(spec, timeout_s, print, startup_s)
        runs = [dict(o, kind="run", config=name, output=output, statistics=statistics) for o in outcomes]
        ok = [o for o in outcomes if o["status"] == "ok"]
        p = np.array([o["p_at_1"] for o in ok])
        seconds = np.array([o["train_seconds"] for o in ok])
        counts = {status: sum(o["status"] == status for o in outcomes) for status in ("ok", "non-finite", "crash",
                                                                                        "hang")}
        spread = {"p_at_1_mean": float(p.mean()), "p_at_1_sd": float(p.std(ddof=1)) if p.size > 1 else None,
                  "p_at_1_min": float(p.min()), "p_at_1_max": float(p.max()),
                  "train_seconds_median": float(np.median(seconds))} if ok else {}
        records += runs + [{"kind": "summary", "config": name, "output": output, "statistics": statistics,
                            "threads": spec["threads"], "runs": len(outcomes), **counts,
                            "failures": len(outcomes) - counts["ok"], **spread}]
    prov = provenance(config={**spec_base, "scale": scale, "configs": {n: REPEAT_CONFIGS[n] for n in configs},
                              "timeout_s": timeout_s,
                              "startup_s": startup_s, "experiment": "fast-classifier-repeats"},
                      wall_time_s=time.perf_counter() - start, scale=scale,
                      threads_note="config.threads is the compiled trainer's Hogwild threads in the worker processes; "
                                   "threads is torch's intra-op threads of the process that watched them")
    return write_results(out, records, prov, force=force)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    _repeat_worker(json.loads(sys.argv[2]))


# ====================================================================================== time split
def split_time(one_epoch_s: float, many_epochs_s: float, epochs: int) -> tuple[float, float]:
    """(fixed seconds, seconds per epoch) of the line through (1, ``one_epoch_s``) and (``epochs``,
    ``many_epochs_s``): what a run costs before its first example, and what each pass adds."""
    if epochs < 2:
        raise ValueError(f"epochs must be >= 2 to separate the two parts, got {epochs}")
    per_epoch = (many_epochs_s - one_epoch_s) / (epochs - 1)
    return one_epoch_s - per_epoch, per_epoch


def _time_split_settings(scale: str, options: dict[str, Any]) -> tuple[TableConfig, float]:
    """(table config, rate) of ``fast-time-split`` from its options (:func:`fast_time_split`);
    ValueError naming a bad one."""
    options = dict(options)
    lr = option_float("lr", options.pop("lr", 0.5), positive=True)
    defaults = {"data": "gutenberg-books" if check_scale(scale) == "full" else "cooking", "dims": "50",
                "threads": "2", "outputs": "huffman20,learned20", "peers": "fasttext-hs"}
    config = _parse_options(scale, {**defaults, **options, "trainer": "fast"})
    if config.epochs < 2:
        raise ValueError(f"option epochs must be >= 2 to split the time, got {config.epochs}")
    return config, lr


@experiment("fast-time-split", "Where the training time goes: the compiled trainer and fastText at 1 and E "
            "epochs on the same threads", "results/classification/fast-time-split-gutenberg-books.json")
def fast_time_split(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                    **options: Any) -> Path:
    """Each row trained at 1 and at ``epochs`` epochs (default 5) at one rate (``lr``, default 0.5:
    the rate every tree row and fastText's ``-loss hs`` pick on both stand-ins) on ``threads``
    (default 2) threads, and its time split into a fixed part and a per-epoch part
    (:func:`split_time`). Rows: ``outputs`` (default huffman20, learned20; the compiled trainer) and
    ``peers`` (default fasttext-hs). fastText's fixed part is reading its text file and building its
    dictionary, which its ``train_supervised`` time includes; ours takes the encoded data, whose
    encoding time is recorded beside it (``encode_seconds``). Options as ``icml-table1`` (``data``,
    default gutenberg-books; quick: a slice of cooking); ``dims`` gives the d (first value)."""
    from hsm_lab.experiments.classification.peers import (_doc_tokens, _fasttext_lines, _word_text, peer_available,
                                                      run_fasttext)

    check_device(device)
    if device != "cpu":
        raise ValueError(f"the compiled trainer runs on the CPU, got device={device!r}")
    config, lr = _time_split_settings(scale, options)
    out = Path(out) if out is not None else _default_out("fast-time-split", scale, config.data)
    check_replace(out, scale, force)
    start = time.perf_counter()
    data = load_table_data(config)
    clock = time.perf_counter()
    vocab, train_split, test_split = encode_data(data, ngrams=config.ngrams)
    encode_seconds = time.perf_counter() - clock
    dim = config.dims[0]
    records: list[dict[str, Any]] = []
    timed: dict[str, dict[int, float]] = {}

    def record(output: str, epochs: int, seconds: float, p_at_1: float) -> None:
        timed.setdefault(output, {})[epochs] = seconds
        records.append({"kind": "run", "output": output, "epochs": epochs, "train_seconds": seconds, "p_at_1": p_at_1,
                        "d": dim, "lr": lr, "threads": config.threads, "data": config.data,
                        "train_examples": len(train_split), "num_labels": data.num_labels})
        print(f"{output} {epochs} epoch(s): train {seconds:.1f} s, P@1 {p_at_1:.2f}", flush=True)

    warm_up = _subset_rows(data, min(len(data.train_texts), 500), "train", config.seed)
    _, warm_split, _ = encode_data(warm_up, ngrams=config.ngrams)
    ours = dict(vocab_size=len(vocab), trainer="fast", threads=config.threads, seed=config.seed, reduce=config.reduce,
                reassigns=config.reassigns, statistics=config.statistics, schedule=config.schedule)
    for output in config.outputs:
        # compile the kernels first (numba caches them on disk, but the first call still loads them)
        train_bow(warm_split, output, dim, lr, epochs=1, **ours)
        for epochs in (1, config.epochs):
            trained = train_bow(train_split, output, dim, lr, epochs=epochs, **ours)
            record(output, epochs, trained.train_seconds, evaluate_bow(trained, test_split)["p_at_1"])
    import tempfile

    for peer in config.peers:
        why = peer_available(peer) if peer.startswith("fasttext") else f"{peer}: only fastText peers are timed here"
        if why:
            records.append({"kind": "run", "output": peer, "skipped": why})
            continue
        lines = _fasttext_lines(train_split, _doc_tokens(data.train_texts), np.random.default_rng(config.seed))
        test_texts = [_word_text(words) for words in _doc_tokens(data.test_texts)]
        with tempfile.TemporaryDirectory() as tmp:
            for epochs in (1, config.epochs):
                got = run_fasttext(lines, test_texts, test_split, peer.split("-", 1)[1], dim, lr, epochs,
                                   config.ngrams, config.seed, Path(tmp), config.threads)
                record(peer, epochs, got["train_seconds"], got["p_at_1"])
    for output, by_epochs in timed.items():
        fixed, per_epoch = split_time(by_epochs[1], by_epochs[config.epochs], config.epochs)
        records.append({"kind": "split", "output": output, "fixed_seconds": fixed, "seconds_per_epoch": per_epoch,
                        "epochs": config.epochs, "threads": config.threads, "data": config.data, "d": dim,
                        "encode_seconds": None if output.startswith("fasttext") else encode_seconds})
    prov = provenance(config={**json.loads(json.dumps(config.__dict__, default=list)), "lr": lr,
                              "experiment": "fast-time-split", "encode_seconds": encode_seconds},
                      wall_time_s=time.perf_counter() - start, scale=scale,
                      threads_note="config.threads is the Hogwild threads of the compiled trainer and fastText's "
                                   "-thread; threads is torch's intra-op threads, on which the test passes ran")
    return write_results(out, records, prov, force=force)


# ====================================================================================== the settings as options
#: the table settings each experiment sets itself, which its options may not change
_FIXED = {"icml-fast-ablation": {"outputs", "peers", "trainer", "seed", *_VARIANT_FIELDS},
          "fast-time-split": {"trainer"}, "fast-classifier-repeats": set()}


def option_settings(name: str, scale: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings of a run of ``name`` (``icml-fast-ablation``, ``fast-classifier-repeats`` or
    ``fast-time-split``) at ``scale``, keyed by the ``-o`` option that sets each, as JSON values:
    those a result file's ``provenance.config`` records (``config``), or with None the experiment's
    defaults at ``scale``. What the experiment sets itself (the ablation's outputs), and what a
    file records beside its settings (times, the experiment's name), are left out: the options that
    re-run a file are its settings that differ from the defaults (:mod:`hsm_lab.reproduce`).

    Raises:
        ValueError: ``name`` is not one of these experiments.
    """
    if name not in _FIXED:
        raise ValueError(f"{name!r} is not an experiment of the compiled trainer; choose from {sorted(_FIXED)}")
    if config is None:
        if name == "icml-fast-ablation":
            table, seeds, variants, arities = _ablation_config(scale, {})
            config = {**_config_json(table), "seeds": list(seeds), "variants": variants, "arities": list(arities)}
        elif name == "fast-classifier-repeats":
            configs, spec, timeout_s, startup_s = _repeats_settings(scale, {})
            config = {**spec, "configs": configs, "timeout_s": timeout_s, "startup_s": startup_s}
        else:
            table, lr = _time_split_settings(scale, {})
            config = {**_config_json(table), "lr": lr}
    settings = json.loads(json.dumps(dict(config), default=list))
    if "seed_base" in settings:  # the repeats' first seed, set by the option seed
        settings["seed"] = settings.pop("seed_base")
    for key in ("variants", "configs"):  # recorded with what each name stands for; the option names them
        if isinstance(settings.get(key), dict):
            settings[key] = list(settings[key])
    if name == "fast-classifier-repeats":
        known = _REPEATS_OPTIONS
    else:
        known = set(TableConfig.__dataclass_fields__) | (
            {"seeds", "variants", "arities"} if name == "icml-fast-ablation" else {"lr"})
    return {key: value for key, value in settings.items() if key in known - _FIXED[name]}

