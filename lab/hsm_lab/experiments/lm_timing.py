"""Milliseconds per batch of the language models at the papers' full sizes (ICML Table 2 and
arXiv Table 1, the timing columns), measured side by side in one run.

Training the log-bilinear model with a flat softmax over Gutenberg's 250,000 words for epochs is
out of reach of a 2-core CPU (this experiment's time per training batch, times the batches of an
epoch, gives the hours: :func:`hsm_lab.report.flat_epoch_hours`), so the trees' perplexity columns
of ICML Table 2 are trained on all 678 books and the flat row only on a slice of an epoch, on a
GPU (:mod:`hsm_lab.experiments.lm`). Its *speed* columns do not need training to convergence: a few
hundred steps of the real model on real batches, at the real vocabulary, give the milliseconds
per batch. This experiment measures, for each output layer,

* ``train_ms_per_batch``: the median wall time of a full training step (log-bilinear
  representation, output layer, backward, Adagrad on all parameters: the papers' optimiser, as
  :class:`hsm.RowSparseAdagrad`, for the trees fused into the layer's backward as
  :func:`hsm_lab.experiments.lm.train_lm` runs it, :meth:`hsm.RowSparseAdagrad.fuse`), and for the learned tree also Algorithm 1's statistics in
  every step plus one re-assignment (timed) amortised over the papers' schedule (50 per epoch
  in ICML, 20 in arXiv);
* ``test_ms_per_batch``: the median wall time of ``log p(target)`` for a batch of test windows
  (representation and output layer, no gradient).

and, in a separate pass of ``phase_steps`` steps, where that time goes (``phases_ms``: model
forward, output layer forward, Algorithm 1's statistics (inside the layer's forward, timed on
their own), output layer backward, model backward, the optimiser on the model's and on the
layer's parameters, the learner's step; the backward is split by detaching the representation,
the same arithmetic as one ``backward()`` plus one more autograd call).

Outputs: flat softmax, random tree, learned tree, and :class:`torch.nn.AdaptiveLogSoftmaxWithLoss`
(``adaptive``, not in the papers: the strongest common baseline, on the same log-bilinear model,
with the benchmark's cutoffs, :data:`hsm_lab.output_layers.ADAPTIVE_CUTOFFS` below V (2k/20k/100k, ``div_value=4``); word ids are frequency ranks in both
corpora, as its cutoffs need). The clustering tree is a fixed tree of the
same shape as the random one (its cost differs only through which nodes a batch shares); it is
not timed here because building it needs the clustering embeddings of the full corpus.
Tokens come from the start of each split (the vocabulary is the full one, built on all
training tokens). Timings depend on the machine: the provenance says which, and the threads.
"""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm_lab import config as hsm_config
from hsm_lab.bench import cost_model, machine_limits
from hsm_lab.output_layers import output_layer
from hsm_lab.experiments import check_device, check_scale, experiment, option_bool, option_choices, option_int
from hsm_lab.experiments.lm import _slice, _sync, load_lm_corpus
from hsm.engine import capture_step
from hsm.optim import RowSparseAdagrad
from hsm.models import LogBilinearLM
from hsm_lab.results import check_replace, make_record, output_path, provenance, write_results
from hsm.training import TreeLearner
from hsm.tree import Tree

__all__ = ["TIMING_SETTINGS", "time_language_model", "run_lm_timing"]

DEFAULT_OUT = "results/lm/timing.json"

#: (dataset, arity, context, reassignments per epoch, claim prefix, claim kind) per table
TIMING_SETTINGS = {
    "icml-gutenberg": dict(dataset="gutenberg", arity=65, context=4, reassign_per_epoch=50,
                           prefix="icml2017.table2", kind="icml"),
    "arxiv-gutenberg": dict(dataset="gutenberg", arity=75, context=4, reassign_per_epoch=20,
                            prefix="arxiv2016.table1.gutenberg", kind="arxiv"),
    "arxiv-ptb": dict(dataset="ptb", arity=25, context=3, reassign_per_epoch=20,
                      prefix="arxiv2016.table1.ptb", kind="arxiv"),
}
OUTPUTS = ("flat", "random", "learned", "adaptive")
#: the papers' names of the outputs they time (the adaptive softmax is not in the papers: no claim)
_SLUG = {"flat": "flat_soft_max", "random": "random_tree", "learned": "learned_tree"}
#: the parts of a training step ``phases_ms`` reports, in the order they run
PHASES = ("zero_grad", "model_forward", "layer_forward", "statistics", "layer_backward", "model_backward", "optimizer_model",
          "optimizer_layer", "learner")

SCALES: dict[str, dict[str, Any]] = {
    # quick: PTB capped to 2,000 words, a handful of steps (CI: the code path and the file)
    "quick": dict(tables=("arxiv-ptb",), vocab_size=2_000, train_tokens=20_000, eval_tokens=5_000,
                  steps=12, warmup=3, test_batches=8, phase_steps=4),
    # full: the papers' vocabularies (PTB 10k, Gutenberg 250k), a few hundred steps each
    "full": dict(tables=("icml-gutenberg", "arxiv-gutenberg", "arxiv-ptb"), vocab_size=None,
                 train_tokens=2_000_000, eval_tokens=200_000, steps=200, warmup=20, test_batches=100,
                 phase_steps=50),
}


class _Clock:
    """Seconds spent in a wrapped callable, summed over calls (timing the parts of a step that
    run inside another call: the statistics inside the layer's forward, the optimiser's update of
    each parameter inside ``step``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def wrap(self, function, name: str | Any):
        def timed(*args, **kwargs):
            _sync(self.device)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                _sync(self.device)
                key = name(*args) if callable(name) else name
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start
        return timed


def _make_output(output: str, vocab: int, dim: int, arity: int, depth: int, seed: int) -> tuple[torch.nn.Module, Any]:
    """The output layer ``output`` (one of :data:`OUTPUTS`) and its tree (None for flat and adaptive)."""
    if output == "flat":
        return output_layer("flat", dim, vocab), None
    if output == "adaptive":  # the word ids are frequency ranks already
        return output_layer("adaptive", dim, vocab).adaptive, None
    if arity ** depth < vocab:
        raise ValueError(f"a depth-3 {arity}-ary tree has {arity ** depth} leaves, fewer than {vocab} words")
    tree = Tree.random(vocab, arity, depth, seed=seed)
    return output_layer("tree", dim, vocab, tree=tree, sparse=True), tree


def step_cost(output: str, vocab: int, dim: int, batch: int, context: int, arity: int | None = None,
              unique_nodes: float = 0.0, unique_words: float = 0.0, parameters: int = 0) -> dict[str, float]:
    """Minimal bytes and FLOPs of one training step of the log-bilinear LM with ``output``
    (float32), split into the model and the output layer with its optimiser, in the convention of
    :func:`hsm_lab.bench.cost_model` (every parameter-sized array a step must touch counted once per
    pass, at memory speed).

    Model: ``6 B T d^2`` FLOPs (the forward's T products and the backward's 2T); bytes: seven
    passes over the touched embedding rows (``unique_words`` per batch) and over the ``R_k`` (read
    forward; gradient written and read; Adagrad reads parameter and state and writes both).
    Output layer: :func:`hsm_lab.bench.cost_model`'s ``train_adagrad`` (a tree: ``unique_nodes``
    [M, d] blocks, seven passes, ``6 B D M d`` FLOPs), plus for the learned tree Algorithm 1's
    statistics (each pair's M sums read and written). ValueError for an unknown ``output``."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    f32 = 4.0
    model_flops = 6.0 * batch * context * dim * dim
    model_bytes = 7.0 * (unique_words * dim + context * dim * dim) * f32
    depth = 3
    if output in ("random", "learned"):
        layer = cost_model("tree-d3", vocab, dim, batch, arity, unique_nodes, batch * depth)["train_adagrad"]
    else:
        layer = cost_model(output, vocab, dim, batch, None, 0, 0, parameters)["train_adagrad"]
    statistics_bytes = 2.0 * batch * depth * (arity or 0) * f32 if output == "learned" else 0.0
    return {"model_bytes": model_bytes, "model_flops": model_flops, "layer_bytes": layer["bytes"],
            "layer_flops": layer["flops"], "statistics_bytes": statistics_bytes,
            "bytes": model_bytes + layer["bytes"] + statistics_bytes, "flops": model_flops + layer["flops"]}


def step_floor(cost: dict[str, float], bandwidth_gbs: float, matmul_gflops: float) -> dict[str, float]:
    """Floors (ms) of a step of cost :func:`step_cost` on a machine with this copy bandwidth and
    matmul throughput: ``overlapped`` = max(all bytes / bandwidth, all FLOPs / throughput) (what
    no implementation can beat), ``phases`` = the model's and the layer's floors added (each
    phase at its own bound, the model's products FLOP-bound and the layer's and optimiser's
    passes byte-bound, one after the other as a step runs them)."""
    def floor(nbytes: float, flops: float) -> float:
        return 1e3 * max(nbytes / (bandwidth_gbs * 1e9), flops / (matmul_gflops * 1e9))

    return {"overlapped_ms": floor(cost["bytes"], cost["flops"]),
            "phases_ms": (floor(cost["model_bytes"], cost["model_flops"])
                          + floor(cost["layer_bytes"] + cost["statistics_bytes"], cost["layer_flops"])),
            "model_ms": floor(cost["model_bytes"], cost["model_flops"]),
            "layer_ms": floor(cost["layer_bytes"] + cost["statistics_bytes"], cost["layer_flops"])}


def time_language_model(corpus, output: str, arity: int, context: int, reassign_per_epoch: int,
                        epoch_tokens: int, steps: int, warmup: int, test_batches: int, batch_size: int = 128,
                        dim: int = 200, lr: float = 0.05, device: str | torch.device = "cpu",
                        seed: int = 0, phase_steps: int = 0, capture: bool = False) -> dict[str, Any]:
    """Median ms per training step and per test batch of the log-bilinear LM with one output
    layer (see the module docstring). ``epoch_tokens``: the full training split's size, which
    sets how many steps a re-assignment is amortised over. ``phase_steps`` > 0: that many more
    steps, split into :data:`PHASES`, give ``phases_ms`` (medians per phase; the whole step is
    timed without the split). ``capture`` (a GPU only): the whole training step of the tree outputs
    (model, layer on the static engine, optimiser, Algorithm 1's statistics) is captured once in a
    CUDA graph (:func:`hsm.engine.capture_step`) and replayed per batch; the flat and adaptive
    outputs run eagerly. Raises ValueError for an unknown ``output``, counts below 1 (``warmup``,
    ``phase_steps``: below 0), a corpus too small for the steps asked, or ``capture`` off a GPU."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if steps < 1 or warmup < 0 or test_batches < 1 or phase_steps < 0:
        raise ValueError(f"steps and test_batches must be >= 1, warmup and phase_steps >= 0 (got {steps}, "
                         f"{test_batches}, {warmup}, {phase_steps})")
    device = torch.device(check_device(device))
    if capture and device.type != "cuda":
        raise ValueError(f"capture replays a CUDA graph: it needs a GPU (--device cuda), not {device}")
    hsm_config.seed_everything(seed)
    vocab = corpus.vocab_size
    depth = 3
    layer, tree = _make_output(output, vocab, dim, arity, depth, seed)
    model = LogBilinearLM(vocab, dim, context, sparse=True).to(device)
    # the model's compiled kernels next to the tree's (one thread pool, torch's OpenMP never woken);
    # torch's products next to the flat and adaptive softmax, which run on torch's OpenMP threads
    # themselves (compiled kernels after their parallel regions would lose time to the spinning)
    model.use_kernels = tree is not None
    layer = layer.to(device)
    optimizer = RowSparseAdagrad(list(model.parameters()) + list(layer.parameters()), lr=lr)
    if tree is not None:  # the tree's Adagrad inside its compiled backward: the same update, fewer passes
        optimizer.fuse(layer)
    steps_per_epoch = max(1, epoch_tokens // batch_size)
    reassign_every = max(1, steps_per_epoch // reassign_per_epoch)
    learner = TreeLearner(layer, reassign_every=10**15, score="eq12", algorithm="depth",
                          record_objective=False) if output == "learned" else None

    x_train, y_train = (t.to(device) for t in corpus.windows("train", context))
    x_test, y_test = (t.to(device) for t in corpus.windows("test", context))
    needed = (warmup + steps + phase_steps) * batch_size
    if len(y_train) < needed or len(y_test) < test_batches * batch_size:
        raise ValueError(f"{corpus.name}: {len(y_train):,d} training / {len(y_test):,d} test windows; the timing "
                         f"needs {needed:,d} / {test_batches * batch_size:,d}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(y_train), generator=generator)[:needed].to(device)

    model.train()
    layer.train()

    def train_step(contexts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        step_loss = layer(model(contexts), targets).loss
        step_loss.backward()
        optimizer.step()
        return step_loss.detach()

    if capture and tree is not None:  # one launch per step; the batch is copied into the graph's inputs
        first = order[:batch_size]
        train_step = capture_step(train_step, x_train[first], y_train[first], warmup=3)
    times = []
    for step in range(warmup + steps):
        rows = order[step * batch_size:(step + 1) * batch_size]
        _sync(device)
        start = time.perf_counter()
        loss = train_step(x_train[rows], y_train[rows])
        if learner is not None:
            learner.step()
        _sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(f"{output}: the loss became {float(loss)} at step {step}")
    train_ms = 1e3 * statistics.median(times)
    result: dict[str, Any] = {"output": output, "train_step_ms": train_ms}
    timed = [order[step * batch_size:(step + 1) * batch_size] for step in range(warmup, warmup + steps)]
    unique_words = float(statistics.mean(torch.unique(x_train[rows]).numel() for rows in timed))
    unique_nodes = 0.0
    if tree is not None:  # the nodes of the initial tree (a learned tree's batches touch as many)
        unique_nodes = float(statistics.mean(np.unique(tree.path_nodes[y_train[rows].cpu().numpy()]).size
                                             for rows in timed))
    result.update(unique_words=unique_words, unique_nodes=unique_nodes or None,
                  parameters=sum(p.numel() for p in layer.parameters()))
    result["cost"] = step_cost(output, vocab, dim, batch_size, context, arity if tree is not None else None,
                               unique_nodes, unique_words, result["parameters"])
    if phase_steps:
        result["phases_ms"] = _time_phases(model, layer, optimizer, learner, x_train, y_train,
                                           order[(warmup + steps) * batch_size:], batch_size, phase_steps, device)
    if learner is not None:
        start = time.perf_counter()
        learner.reassign()
        reassign_s = time.perf_counter() - start
        result.update(reassign_s=reassign_s, reassign_every=reassign_every,
                      reassign_ms_per_step=1e3 * reassign_s / reassign_every)
        train_ms += result["reassign_ms_per_step"]
    result["train_ms_per_batch"] = train_ms

    model.eval()
    layer.eval()
    test_times = []
    with torch.no_grad():
        for index in range(test_batches + 2):
            rows = slice(index * batch_size, (index + 1) * batch_size)
            _sync(device)
            start = time.perf_counter()
            logp = layer(model(x_test[rows]), y_test[rows]).output
            _sync(device)
            if index >= 2:  # the first batches pay for first-touch allocations
                test_times.append(time.perf_counter() - start)
            if not torch.isfinite(logp).all():
                raise FloatingPointError(f"{output}: non-finite test log-probabilities")
    result["test_ms_per_batch"] = 1e3 * statistics.median(test_times)
    result.update(vocab_size=vocab, arity=None if tree is None else arity, depth=None if tree is None else depth,
                  context=context, batch_size=batch_size, dim=dim, steps=steps, warmup=warmup,
                  test_batches=test_batches, threads=torch.get_num_threads(), device=str(device),
                  captured=bool(capture and tree is not None))
    if output == "adaptive":
        result.update(cutoffs=list(layer.cutoffs[:-1]), div_value=layer.div_value)
    return result


def _time_phases(model, layer, optimizer, learner, x_train, y_train, order, batch_size: int, steps: int,
                 device: torch.device) -> dict[str, float]:
    """Median ms of each of :data:`PHASES` over ``steps`` training steps (the same update as the
    timed steps: the backward is split at the representation, the optimiser's and the
    statistics' calls are timed where they run). Phases an output does not have are 0."""
    clock = _Clock(device)
    model_params = {id(p) for p in model.parameters()}
    update = optimizer._update
    optimizer._update = clock.wrap(update, lambda param, *rest: "optimizer_model" if id(param) in model_params
                                   else "optimizer_layer")
    stats = getattr(layer, "statistics", None)
    if stats is not None:  # the compiled CPU path calls accumulate_pairs, other devices accumulate
        stats.accumulate_pairs = clock.wrap(stats.accumulate_pairs, "statistics")
        stats.accumulate = clock.wrap(stats.accumulate, "statistics")
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES + ("total",)}
    try:
        for step in range(steps):
            rows = order[step * batch_size:(step + 1) * batch_size]
            x, y = x_train[rows], y_train[rows]
            clock.seconds = {}
            marks = []

            def mark() -> None:
                _sync(device)
                marks.append(time.perf_counter())

            mark()
            optimizer.zero_grad(set_to_none=True)
            mark()
            h = model(x)
            mark()
            leaf = h.detach().requires_grad_()
            loss = layer(leaf, y).loss
            mark()
            loss.backward()
            mark()
            h.backward(leaf.grad)
            mark()
            optimizer.step()
            mark()
            if learner is not None:
                learner.step()
            mark()
            spans = [b - a for a, b in zip(marks[:-1], marks[1:])]
            statistics_s = clock.seconds.get("statistics", 0.0)
            parts = {"zero_grad": spans[0], "model_forward": spans[1], "layer_forward": spans[2] - statistics_s,
                     "statistics": statistics_s, "layer_backward": spans[3], "model_backward": spans[4],
                     "optimizer_model": clock.seconds.get("optimizer_model", 0.0),
                     "optimizer_layer": clock.seconds.get("optimizer_layer", 0.0), "learner": spans[6],
                     "total": marks[-1] - marks[0]}
            for phase, seconds in parts.items():
                samples[phase].append(seconds)
    finally:
        del optimizer._update  # back to the class's method
        if stats is not None:
            del stats.accumulate_pairs, stats.accumulate
    return {phase: 1e3 * statistics.median(values) for phase, values in samples.items()}


@experiment("lm-timing", "ICML Table 2 / arXiv Table 1 timing columns at the papers' full vocabularies "
            "(ms per training and test batch; flat, random, learned)", DEFAULT_OUT)
def run_lm_timing(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                  **options: Any) -> Path:
    """Time every table of :data:`TIMING_SETTINGS` in the scale's list; options override the
    scale's settings (``steps``, ``warmup``, ``test_batches``, ``train_tokens``, ``eval_tokens``,
    ``phase_steps``, ``tables`` as a comma list). ``out`` None: ``hsm-results/lm/timing.json``; a full-scale file is
    not replaced by a quick run unless ``force``. ValueError for a bad scale, device or option
    (counts >= 1, ``warmup`` and ``phase_steps`` >= 0, known tables), before any work."""
    settings = dict(SCALES[check_scale(scale)])
    for key, value in options.items():
        if key == "tables":
            tables = [str(t).strip() for t in (str(value).split(",") if isinstance(value, str) else value)]
            unknown = [t for t in tables if t and t not in TIMING_SETTINGS]
            if unknown:
                raise ValueError(f"unknown tables {unknown}; choose from {sorted(TIMING_SETTINGS)}")
            settings["tables"] = option_choices(key, ",".join(tables), tuple(TIMING_SETTINGS))
        elif key in ("steps", "warmup", "test_batches", "train_tokens", "eval_tokens", "phase_steps"):
            settings[key] = option_int(key, value, minimum=0 if key in ("warmup", "phase_steps") else 1)
        elif key == "capture":
            settings[key] = option_bool(key, value)
        else:
            raise ValueError(f"unknown option {key!r} (steps, warmup, test_batches, phase_steps, train_tokens, "
                             "eval_tokens, tables, capture)")
    device = check_device(device)
    if settings.get("capture") and not device.startswith("cuda"):
        raise ValueError(f"option capture=true replays CUDA graphs: it needs --device cuda, not {device}")
    path = output_path(DEFAULT_OUT, out)
    check_replace(path, scale, force)
    hsm_config.configure_threads()  # HSM_THREADS, else torch's default (all cores: time on an idle machine)
    begin = time.perf_counter()
    limits = machine_limits(device)  # for the floors of the steps (copy bandwidth, matmul throughput)
    records = []
    corpora: dict[str, Any] = {}
    for table in settings["tables"]:
        setting = TIMING_SETTINGS[table]
        dataset = setting["dataset"]
        if dataset not in corpora:
            if dataset == "gutenberg" and settings["vocab_size"] is not None:
                raise ValueError("the Gutenberg timing runs at the full vocabulary only")
            whole = load_lm_corpus(dataset, vocab_size=settings["vocab_size"])
            # a re-assignment is amortised over the steps of a whole epoch of the full split
            corpora[dataset] = (_slice(whole, settings["train_tokens"], settings["eval_tokens"]), len(whole.train))
            del whole
        corpus, epoch_tokens = corpora[dataset]
        paper_data = settings["vocab_size"] is None
        rows = {}
        for output in OUTPUTS:
            row = time_language_model(corpus, output, setting["arity"], setting["context"],
                                      setting["reassign_per_epoch"], epoch_tokens, settings["steps"],
                                      settings["warmup"], settings["test_batches"], device=device,
                                      phase_steps=settings["phase_steps"], capture=settings.get("capture", False))
            row["floor"] = step_floor(row["cost"], limits["bandwidth_gbs"], limits["matmul_gflops"])
            rows[output] = row
            fields = dict(row, table=table, dataset=dataset, reassign_per_epoch=setting["reassign_per_epoch"],
                          epoch_tokens=epoch_tokens)
            slug = _SLUG.get(output)
            for measure in ("train_ms_per_batch", "test_ms_per_batch"):
                if slug is None:  # not in the papers
                    claim = None
                elif setting["kind"] == "icml":
                    claim = f"{setting['prefix']}.{slug}.{measure}" if paper_data else None
                else:  # arXiv Table 1 has one ms/batch column: the training step
                    claim = f"{setting['prefix']}.{slug}.ms_per_batch" if paper_data and measure == "train_ms_per_batch" else None
                records.append(make_record(claim, row[measure], measure=measure, **fields))
        for measure, what in (("train_ms_per_batch", "train"), ("test_ms_per_batch", "test")):
            ratio = rows["flat"][measure] / rows["learned"][measure]
            claim = None
            if paper_data and table == "icml-gutenberg":
                claim = f"icml2017.speedup.{what}"
            elif paper_data and table == "arxiv-gutenberg" and what == "train":
                claim = "arxiv2016.speedup.gutenberg"
            records.append(make_record(claim, ratio, measure=f"speedup_{what}", table=table, dataset=dataset,
                                       vocab_size=corpus.vocab_size))
            records.append(make_record(None, rows["adaptive"][measure] / rows["learned"][measure],
                                       measure=f"speedup_{what}_vs_adaptive", table=table, dataset=dataset,
                                       vocab_size=corpus.vocab_size))
    wall = time.perf_counter() - begin
    config = dict(experiment="lm-timing", scale=scale, device=device, **{k: list(v) if isinstance(v, tuple) else v
                                                                          for k, v in settings.items()},
                  optimizer="Adagrad (hsm.RowSparseAdagrad), lr 0.05", batch_size=128, dim=200, machine=limits,
                  timing="median wall time per step / test batch after warm-up, one process, all outputs in one run")
    prov = provenance(config, wall, scale=scale)
    prov["hsm_scale"] = ("full vocabulary, timing only" if scale == "full"
                         else f"{scale}: PTB capped to {settings['vocab_size']} words")
    return write_results(path, records, prov, force=force)
