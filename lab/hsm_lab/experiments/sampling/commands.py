"""The registered experiments ``sampling-fig2``, ``sampling-fig1`` and ``lm-ptb-sampling``
(``python -m hsm run sampling-fig2 --scale quick -o iterations=500 ...``): each checks its scale,
device and options before any work (ValueError naming the bad one), runs, and writes its result
file (:func:`hsm_lab.results.write_results`: records plus provenance)."""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hsm import sampling as S
from hsm_lab.experiments import check_device, experiment
from hsm_lab.results import check_replace, provenance, write_progress, write_results

from hsm_lab.experiments.sampling.config import _lm_settings, _settings
from hsm_lab.experiments.sampling.lm_training import (_bench_contestants, _benchmark_steps, _sampling_plan, _select_sampling_lr,
                          _SparseSampledOutputs, _tree_arity)
from hsm_lab.experiments.sampling.presets import DEFAULT_OUT
from hsm_lab.experiments.sampling.report import _bench_records, _default_path, _diverged_record, _lm_common, _sampling_run_records
from hsm_lab.experiments.sampling.training import _run_methods

__all__ = ["run_fig1", "run_fig2", "run_lm_ptb_sampling"]


def _fig2_methods(scale: str, log_c: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Fig. 2's methods (label -> how to train it) and nothing more for the provenance."""
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
    return methods, {}


def _fig1_methods(scale: str, log_c: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Fig. 1's methods: the exact gradient and ranking at each offset alpha (the quick scale: three
    of them), and the alphas for the provenance."""
    # log(C - 1) for this C, and ln 499 and ln 999: the paper prints 6.2126 = ln 499 as log(C - 1)
    # for C = 1000, so both candidates are in every sweep (each offset once, in increasing order)
    alphas = (sorted({0.0, 1.0, 3.0, math.log(499), math.log(999), log_c, 9.0, 12.0}) if scale != "quick"
              else [1.0, log_c, 12.0])
    methods: dict[str, dict[str, Any]] = {"exact": {"method": "exact"}}
    for a in alphas:
        methods[f"ranking_alpha{a:.4f}"] = {"method": "ranking", "alpha": a}
    return methods, {"alphas": alphas}


def _run_figure(figure: str, methods_of: Callable[[str, float], tuple[dict[str, dict[str, Any]], dict[str, Any]]],
                scale: str, device: str, out: Path | str | None, force: bool, options: dict[str, Any]) -> Path:
    """Check the settings, device and ``out`` (ValueError before any work), train every method of
    ``methods_of(scale, log(C - 1))`` for every seed, and write the result file."""
    start = time.perf_counter()
    cfg = _settings(scale, options)
    check_device(device)
    path = _default_path(out, DEFAULT_OUT[f"sampling-{figure}"])
    check_replace(path, scale, force)
    torch.set_num_threads(1)  # small matrices: one thread, no oversubscription on a shared machine
    log_c = S.ranking_offset(cfg["num_classes"])
    methods, described = methods_of(scale, log_c)
    records, rates = _run_methods(cfg, methods, figure)
    cfg = dict(cfg, device=device, learning_rates=rates, **described, log_C_minus_1=log_c)
    return write_results(path, records, provenance(cfg, time.perf_counter() - start, scale=scale), force=force)


@experiment("sampling-fig2", "Barber & Botev Fig. 2: exact LL and bias of likelihood approximations, softmax regression",
            DEFAULT_OUT["sampling-fig2"])
def run_fig2(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
             **options: Any) -> Path:
    """Fig. 2 (plus NCE and negative sampling, which the paper leaves out as 'very poor'). ``out``
    None: ``hsm-results/sampling/fig2.json``; a full-scale file is not replaced by a quick run
    unless ``force``. ValueError for a bad scale, device or option, before any work."""
    return _run_figure("fig2", _fig2_methods, scale, device, out, force, options)


@experiment("sampling-fig1", "Barber & Botev Fig. 1: ranking objective, sweep of the offset alpha (log(C-1) suggested)",
            DEFAULT_OUT["sampling-fig1"])
def run_fig1(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
             **options: Any) -> Path:
    """Fig. 1: ranking with several alpha, including 1, log(499) = 6.2126 (the paper's printed
    value) and log(C - 1) = 6.9068 for C = 1000; the exact gradient beside them. ``out``, ``force``
    and the checks as :func:`run_fig2`."""
    return _run_figure("fig1", _fig1_methods, scale, device, out, force, options)


@experiment("lm-ptb-sampling", "Beyond Barber & Botev: PTB log-bilinear LM trained with sampled softmax approximations "
            "(importance, Bernoulli, BlackOut, negative sampling, ranking, NCE), exact perplexity and ms/step",
            DEFAULT_OUT["lm-ptb-sampling"])
def run_lm_ptb_sampling(scale: str = "quick", device: str = "cpu", out: Path | str | None = None,
                        force: bool = False, **options: Any) -> Path:
    """"Tree or sampling?": the log-bilinear LM of ``lm-ptb`` (arXiv Table 1's PTB setting) with its
    output layer trained by each approximation of Barber & Botev, evaluated exactly.

    Every sampled run is :func:`hsm_lab.experiments.lm.train_lm` with ``output`` one of
    :data:`hsm_lab.experiments.lm.SAMPLED_KINDS` (add-one-smoothed training counts as proposal; the
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
    finished) unless it holds a complete result, which only the complete new one replaces
    (:func:`hsm_lab.results.write_progress`); finished runs are kept under the cache
    (``hsm_lab.config.cache_dir()``) at full scale, so an interrupted command resumes.
    """
    from dataclasses import replace

    from hsm_lab import config as hsm_config
    from hsm_lab.experiments.lm import LMRunConfig, load_lm_corpus, train_lm
    from hsm.tree import Tree

    start = time.perf_counter()
    cfg = _lm_settings(scale, options)
    device = check_device(device)
    path = _default_path(out, DEFAULT_OUT["lm-ptb-sampling"])
    check_replace(path, scale, force)  # before any training: the result file is rewritten after every run
    hsm_config.configure_threads(default=1)  # HSM_THREADS (checked), else 1: a shared machine, see hsm_lab.experiments.lm
    corpus = load_lm_corpus("ptb", vocab_size=cfg["vocab_size"] or None, train_tokens=cfg["train_tokens"] or None,
                            eval_tokens=cfg["eval_tokens"] or None)
    arity = cfg["arity"] or _tree_arity(corpus.vocab_size)
    if arity**3 < corpus.vocab_size:
        raise ValueError(f"a {arity}-ary depth-3 tree holds {arity**3} words < vocabulary {corpus.vocab_size}")
    run_dir = None
    if scale == "full":
        run_dir = hsm_config.runs_dir("lm-ptb-sampling")  # created by runs_dir
    base = LMRunConfig(output="flat", context=cfg["context"], dim=cfg["dim"], arity=arity, depth=3,
                       batch_size=cfg["batch_size"], epochs=cfg["epochs"], seed=cfg["seed"],
                       num_negatives=cfg["num_negatives"])
    log = lambda message: print(f"[lm-ptb-sampling] {message}", file=sys.stderr, flush=True)  # noqa: E731
    common = _lm_common(corpus, cfg, scale)
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
        # an incomplete result never replaces a complete one (an interrupted re-run keeps the old file)
        return (write_results if complete else write_progress)(path, records + _bench_records(bench, common), prov,
                                                               force=force)

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
                records.append(_diverged_record(label, kind, k, run_cfg.lr, cfg, common, str(exc)))
                write(False)
                continue
            records.extend(_sampling_run_records(run, label, kind, k, run_cfg.lr, arity, cfg, common))
            log(f"{label}: test perplexity {run.test_perplexity:.1f}, {run.train_ms_per_batch:.1f} ms/step")
            write(False)
        log("round-robin step benchmark")
        bench = _benchmark_steps(corpus, cfg, _bench_contestants(cfg, plan, arity))
    return write(True, bench)


