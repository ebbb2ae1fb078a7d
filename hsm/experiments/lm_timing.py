"""Milliseconds per batch of the language models at the papers' full sizes (ICML Table 2 and
arXiv Table 1, the timing columns), measured side by side in one run.

Training the log-bilinear model with a flat softmax over Gutenberg's 250,000 words for epochs is
out of reach of this project's 2-core CPU (about a third of a second per batch of 128: some
30 hours per epoch), so the perplexity columns of ICML Table 2 come from a reduced corpus
(:mod:`hsm.experiments.lm`). Its *speed* columns do not need training to convergence: a few
hundred steps of the real model on real batches, at the real vocabulary, give the milliseconds
per batch. This experiment measures, for each output layer,

* ``train_ms_per_batch``: the median wall time of a full training step (log-bilinear
  representation, output layer, backward, Adagrad on all parameters: the papers' optimiser, as
  :class:`hsm.RowSparseAdagrad`), and for the learned tree also Algorithm 1's statistics in
  every step plus one re-assignment (timed) amortised over the papers' schedule (50 per epoch
  in ICML, 20 in arXiv);
* ``test_ms_per_batch``: the median wall time of ``log p(target)`` for a batch of test windows
  (representation and output layer, no gradient).

Outputs: flat softmax, random tree, learned tree. The clustering tree is a fixed tree of the
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

import torch

from hsm import config as hsm_config
from hsm.experiments import check_device, check_scale, experiment, option_choices, option_int
from hsm.experiments.lm import _slice, _sync, load_lm_corpus
from hsm.layers import FlatSoftmax, HierarchicalSoftmax, RowSparseAdagrad
from hsm.models import LogBilinearLM
from hsm.results import check_replace, make_record, output_path, provenance, write_results
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
OUTPUTS = ("flat", "random", "learned")
_SLUG = {"flat": "flat_soft_max", "random": "random_tree", "learned": "learned_tree"}

SCALES: dict[str, dict[str, Any]] = {
    # quick: PTB capped to 2,000 words, a handful of steps (CI: the code path and the file)
    "quick": dict(tables=("arxiv-ptb",), vocab_size=2_000, train_tokens=20_000, eval_tokens=5_000,
                  steps=12, warmup=3, test_batches=8),
    # full: the papers' vocabularies (PTB 10k, Gutenberg 250k), a few hundred steps each
    "full": dict(tables=("icml-gutenberg", "arxiv-gutenberg", "arxiv-ptb"), vocab_size=None,
                 train_tokens=2_000_000, eval_tokens=200_000, steps=200, warmup=20, test_batches=100),
}


def time_language_model(corpus, output: str, arity: int, context: int, reassign_per_epoch: int,
                        epoch_tokens: int, steps: int, warmup: int, test_batches: int, batch_size: int = 128,
                        dim: int = 200, lr: float = 0.05, device: str | torch.device = "cpu",
                        seed: int = 0) -> dict[str, Any]:
    """Median ms per training step and per test batch of the log-bilinear LM with one output
    layer (see the module docstring). ``epoch_tokens``: the full training split's size, which
    sets how many steps a re-assignment is amortised over."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if steps < 1 or warmup < 0 or test_batches < 1:
        raise ValueError(f"steps and test_batches must be >= 1 and warmup >= 0 (got {steps}, {test_batches}, {warmup})")
    device = torch.device(check_device(device))
    hsm_config.seed_everything(seed)
    vocab = corpus.vocab_size
    depth = 3
    if output == "flat":
        layer = FlatSoftmax(dim, vocab)
        tree = None
    else:
        if arity ** depth < vocab:
            raise ValueError(f"a depth-3 {arity}-ary tree has {arity ** depth} leaves, fewer than {vocab} words")
        tree = Tree.random(vocab, arity, depth, seed=seed)
        layer = HierarchicalSoftmax(dim, tree, sparse=True)
    model = LogBilinearLM(vocab, dim, context, sparse=True).to(device)
    layer = layer.to(device)
    optimizer = RowSparseAdagrad(list(model.parameters()) + list(layer.parameters()), lr=lr)
    steps_per_epoch = max(1, epoch_tokens // batch_size)
    reassign_every = max(1, steps_per_epoch // reassign_per_epoch)
    learner = TreeLearner(layer, reassign_every=10**15, wrt="logp", algorithm="depth",
                          record_objective=False) if output == "learned" else None

    x_train, y_train = (t.to(device) for t in corpus.windows("train", context))
    x_test, y_test = (t.to(device) for t in corpus.windows("test", context))
    needed = (warmup + steps) * batch_size
    if len(y_train) < needed or len(y_test) < test_batches * batch_size:
        raise ValueError(f"{corpus.name}: {len(y_train):,d} training / {len(y_test):,d} test windows; the timing "
                         f"needs {needed:,d} / {test_batches * batch_size:,d}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(y_train), generator=generator)[:needed].to(device)

    model.train()
    layer.train()
    times = []
    for step in range(warmup + steps):
        rows = order[step * batch_size:(step + 1) * batch_size]
        _sync(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = layer(model(x_train[rows]), y_train[rows]).loss
        loss.backward()
        optimizer.step()
        if learner is not None:
            learner.step()
        _sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(f"{output}: the loss became {float(loss)} at step {step}")
    train_ms = 1e3 * statistics.median(times)
    result: dict[str, Any] = {"output": output, "train_step_ms": train_ms}
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
                  test_batches=test_batches, threads=torch.get_num_threads(), device=str(device))
    return result


@experiment("lm-timing", "ICML Table 2 / arXiv Table 1 timing columns at the papers' full vocabularies "
            "(ms per training and test batch; flat, random, learned)", DEFAULT_OUT)
def run_lm_timing(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                  **options: Any) -> Path:
    """Time every table of :data:`TIMING_SETTINGS` in the scale's list; options override the
    scale's settings (``steps``, ``warmup``, ``test_batches``, ``train_tokens``, ``eval_tokens``,
    ``tables`` as a comma list). ``out`` None: ``hsm-results/lm/timing.json``; a full-scale file is
    not replaced by a quick run unless ``force``. ValueError for a bad scale, device or option
    (counts >= 1, ``warmup`` >= 0, known tables), before any work."""
    settings = dict(SCALES[check_scale(scale)])
    for key, value in options.items():
        if key == "tables":
            tables = [str(t).strip() for t in (str(value).split(",") if isinstance(value, str) else value)]
            unknown = [t for t in tables if t and t not in TIMING_SETTINGS]
            if unknown:
                raise ValueError(f"unknown tables {unknown}; choose from {sorted(TIMING_SETTINGS)}")
            settings["tables"] = option_choices(key, ",".join(tables), tuple(TIMING_SETTINGS))
        elif key in ("steps", "warmup", "test_batches", "train_tokens", "eval_tokens"):
            settings[key] = option_int(key, value, minimum=0 if key == "warmup" else 1)
        else:
            raise ValueError(f"unknown option {key!r} (steps, warmup, test_batches, train_tokens, eval_tokens, tables)")
    device = check_device(device)
    path = output_path(DEFAULT_OUT, out)
    check_replace(path, scale, force)
    hsm_config.configure_threads()  # HSM_THREADS, else torch's default (all cores: time on an idle machine)
    begin = time.perf_counter()
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
                                      settings["warmup"], settings["test_batches"], device=device)
            rows[output] = row
            fields = dict(row, table=table, dataset=dataset, reassign_per_epoch=setting["reassign_per_epoch"],
                          epoch_tokens=epoch_tokens)
            slug = _SLUG[output]
            for measure in ("train_ms_per_batch", "test_ms_per_batch"):
                if setting["kind"] == "icml":
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
    wall = time.perf_counter() - begin
    config = dict(experiment="lm-timing", scale=scale, device=device, **{k: list(v) if isinstance(v, tuple) else v
                                                                          for k, v in settings.items()},
                  optimizer="Adagrad (hsm.RowSparseAdagrad), lr 0.05", batch_size=128, dim=200,
                  timing="median wall time per step / test batch after warm-up, one process, all outputs in one run")
    prov = provenance(config, wall, scale=scale)
    prov["hsm_scale"] = ("full vocabulary, timing only" if scale == "full"
                         else f"{scale}: PTB capped to {settings['vocab_size']} words")
    return write_results(path, records, prov, force=force)
