"""``python -m hsm bench``: the output layers side by side (speed and scale; the book's performance chapter).

For every vocabulary size V and method it times, per batch of B examples with Zipf-distributed
targets (rank r drawn with probability proportional to 1/r, label id = rank, so the adaptive
softmax's frequency-sorted cutoffs are meaningful):

* ``train``: forward + backward (``loss.backward()``), gradients zeroed with ``set_to_none``;
* ``train_sgd`` / ``train_adagrad``: the same plus the optimiser step (sparse gradients for the
  tree's node parameters, dense for the baselines): :class:`hsm.optim.RowSparseSGD` and
  :class:`hsm.optim.RowSparseAdagrad` (``torch.optim.SGD``'s and ``torch.optim.Adagrad``'s
  updates, one pass over the touched rows of a sparse gradient); for the tree,
  ``train_sgd_torch`` and ``train_adagrad_torch`` also time ``torch.optim.SGD`` / ``Adagrad`` themselves;
* ``logprob``: ``log p(target | h)`` without gradient (``layer(h, y).output`` under ``no_grad``);
* ``predict``: the exact arg max (``layer.predict``; branch and bound for the tree).

Methods: ``flat`` (:class:`hsm.FlatSoftmax`: ``nn.Linear`` + log-softmax, the O(V d) baseline),
``adaptive`` (:class:`torch.nn.AdaptiveLogSoftmaxWithLoss`, cutoffs 2k/20k/100k below V,
``div_value=4``, at most as many tail clusters as keep every tail projection >= 1 dimension: among
the fastest configurations of Grave et al.'s shape we measured, :data:`hsm_lab.output_layers.ADAPTIVE_CUTOFFS`; ``adaptive-x5``
is the same with the smaller tail clusters 2k/10k/50k/200k of the first committed runs), ``tree-d2`` / ``tree-d3``
(:class:`hsm.HierarchicalSoftmax` on a random
fixed-depth tree, M = ceil(V**(1/D)), ``sparse=True``; on CPU in float32 the compiled kernels
of :mod:`hsm.kernels`), ``learned-d3`` (the same layer with a :class:`hsm.TreeLearner` attached: a
learned tree's step, Algorithm 1's statistics included, the re-assignments not: see ``--algorithm1``),
``torch-d3`` (the same layer with ``use_kernels = False``: pairs grouped
by node in PyTorch ops, the path a GPU takes), and ``naive-d3`` (the same tree through
:meth:`HierarchicalSoftmax.forward_reference` with a dense gradient: per-example weight copies,
what a straightforward PyTorch tree does).

Every time is the median of repeated runs (``--repeats``, fewer when one run is slow:
``--budget``), cycling through 16 different batches so the node blocks are not all cached. On a
GPU each run is a block of calls timed between two ``torch.cuda.synchronize`` (never one per
call: that would time the launch latency), and the measurements run in this process (the peak
memory of each is ``torch.cuda.max_memory_allocated`` after a reset), since a fresh process per
measurement would spend seconds starting CUDA. ``--batch`` and ``--precision`` take several
values: every (V, B, precision, method) is a row, compared with the flat row of the same V, B and
precision. A precision a layer cannot run in (an error in its first call) is recorded as
``skipped`` with the reason, and the other rows go on.
Each measurement runs in a fresh process with ``THP_MEM_ALLOC_ENABLE=1`` (torch backs CPU
tensors of 2 MB or more with transparent huge pages; ``--no-thp`` turns it off): every method
allocates multi-MB temporaries per batch, and without it each costs thousands of page faults.
Memory is the peak resident set of a fresh process per (V, method) minus its size after
``import torch`` (CPU), or ``torch.cuda.max_memory_allocated`` (GPU). The *floor* of each
measurement is ``max(bytes / bandwidth, flops / peak)`` with this machine's copy bandwidth and
matmul throughput measured at start-up; ``floor_fraction = floor / measured``.

``--json PATH`` writes the table with provenance (:mod:`hsm_lab.results`; scale ``quick`` with
``--quick``, else ``full``). ``--quick`` runs tiny sizes in-process in a few seconds (what CI
checks: the table's structure, not the timings); sizes given explicitly (``--vocab``, ``--dim``,
``--batch``, ``--repeats``, ``--budget``) are honoured with it. Every count must be >= 1 (vocabularies
>= 2) and the device usable here (``--device cuda`` without a GPU is refused): a bad option is
one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from hsm.cli_text import plain
from hsm_lab.output_layers import ADAPTIVE_CUTOFFS, ADAPTIVE_CUTOFFS_X5, output_layer

__all__ = ["METHODS", "PRECISIONS", "BenchConfig", "machine_limits", "scale_defaults", "main", "run_benchmark", "run_one",
           "tree_arity", "format_table"]

METHODS = ("flat", "adaptive", "tree-d2", "tree-d3", "learned-d3", "torch-d3", "naive-d3", "adaptive-x5")
#: how the layers compute: ``float32``; ``tf32`` (``torch.set_float32_matmul_precision("high")``: float32
#: matmuls on TF32 tensor cores on a GPU, no change on a CPU); ``bf16`` (``torch.autocast`` to bfloat16)
PRECISIONS = ("float32", "tf32", "bf16")
METRICS = ("train", "train_sgd", "train_adagrad", "logprob", "predict")
_POOL = 16  # distinct batches cycled through by every timing loop


class BenchConfig(dict):
    """One measurement's settings (a dict, so it travels to a child process as JSON)."""


def tree_arity(num_labels: int, depth: int) -> int:
    """The smallest M with M**depth >= V (V = 250k: M = 500 at depth 2, 63 at depth 3)."""
    if num_labels < 2 or depth < 1:
        raise ValueError(f"need V >= 2 and depth >= 1, got V={num_labels}, depth={depth}")
    arity = max(2, math.ceil(num_labels ** (1.0 / depth)) - 1)
    while arity**depth < num_labels:
        arity += 1
    return arity


def zipf_targets(num_labels: int, batch: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` batches of labels drawn with p(rank r) proportional to 1 / r (label id = rank)."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, num_labels + 1))
    cdf /= cdf[-1]
    return [torch.from_numpy(np.minimum(np.searchsorted(cdf, rng.random(batch)), num_labels - 1).astype(np.int64))
            for _ in range(count)]


# ---------------------------------------------------------------------------- machine limits
def machine_limits(device: str = "cpu", size_mb: int = 256) -> dict[str, float]:
    """Memory bandwidth (GB/s, a ``copy_`` of two ``size_mb`` buffers: read + write counted, best of
    5) and matmul throughput (GFLOP/s, best of 3) of this machine with the current thread count."""
    dev = torch.device(device)
    source = torch.ones(size_mb * 2**20 // 4, device=dev)
    target = torch.empty_like(source)
    best = math.inf
    for _ in range(5):
        _sync(dev)
        start = time.perf_counter()
        target.copy_(source)
        _sync(dev)
        best = min(best, time.perf_counter() - start)
    bandwidth = 2 * source.numel() * 4 / best / 1e9
    del source, target
    a = torch.randn(1024, 1024, device=dev)
    b = torch.randn(1024, 1024, device=dev)
    best = math.inf
    for _ in range(3):
        _sync(dev)
        start = time.perf_counter()
        a @ b
        _sync(dev)
        best = min(best, time.perf_counter() - start)
    return {"bandwidth_gbs": bandwidth, "matmul_gflops": 2 * 1024**3 / best / 1e9}


_FAULT_PROBE = """
import resource, time, torch
torch.set_num_threads(1)
def fill():
    x = torch.empty(22_000_000)
    x.fill_(1.0)
fill()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
for _ in range(5):
    fill()
print((time.perf_counter() - t0) / 5 * 1e3, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 5)
"""


def page_fault_probe() -> dict[str, float]:
    """Allocate and fill a fresh 88 MB tensor, in a process without and one with
    ``THP_MEM_ALLOC_ENABLE=1``: ms and page faults per allocation (what a per-batch temporary
    costs before it holds any data)."""
    out = {}
    for name, flag in (("default", None), ("thp", "1")):
        env = dict(os.environ)
        env.pop("THP_MEM_ALLOC_ENABLE", None)
        if flag:
            env["THP_MEM_ALLOC_ENABLE"] = flag
        proc = subprocess.run([sys.executable, "-c", _FAULT_PROBE], capture_output=True, text=True, env=env, check=True)
        ms, faults = (float(v) for v in proc.stdout.split())
        out[f"fresh_88mb_{name}_ms"], out[f"fresh_88mb_{name}_faults"] = ms, faults
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- cost model
def cost_model(method: str, num_labels: int, dim: int, batch: int, arity: int | None, unique_nodes: float,
               pairs: float, parameters: int = 0) -> dict[str, dict[str, float]]:
    """Minimal bytes moved and FLOPs per batch (fp32) for each metric: what no implementation of
    the same computation can go below.

    Tree: the forward reads each unique path node's [M, d] block once (``unique_nodes`` per batch,
    measured); the backward writes one gradient block per unique node; FLOPs are 2 M d per
    (example, node) pair forward and twice that backward. Flat: the [V, d] weight is read, the
    [B, V] logits written and read; the backward reads the weight again and writes its [V, d]
    gradient. Adaptive: every parameter read once forward (with Zipf targets every cluster is
    reached), read again and its gradient written backward; FLOPs 2 B (parameters) forward, an
    upper estimate (an example only reaches its own cluster), so only the bytes set its floor.
    Optimiser steps add a read and write of every updated parameter (and of Adagrad's state)."""
    f32 = 4.0
    out: dict[str, dict[str, float]] = {}
    if method.startswith(("tree", "learned", "torch", "naive")):
        block = arity * dim * f32
        fwd_bytes = unique_nodes * block
        fwd_flops = 2.0 * pairs * arity * dim
        train_bytes = 2 * fwd_bytes
        opt_rows = unique_nodes * block
        out["logprob"] = {"bytes": fwd_bytes, "flops": fwd_flops}
        out["train"] = {"bytes": train_bytes, "flops": 3 * fwd_flops}
        out["train_sgd"] = {"bytes": train_bytes + 3 * opt_rows, "flops": 3 * fwd_flops}
        out["train_adagrad"] = {"bytes": train_bytes + 5 * opt_rows, "flops": 3 * fwd_flops}
        out["predict"] = {"bytes": fwd_bytes, "flops": fwd_flops}
    elif method.startswith("adaptive"):
        weight = parameters * f32
        logits = batch * (num_labels // 50) * f32  # head-sized logits; small next to the weights
        out["logprob"] = {"bytes": weight + 2 * logits, "flops": 0.0}
        out["predict"] = {"bytes": weight + 2 * logits, "flops": 0.0}
        out["train"] = {"bytes": 3 * weight + 4 * logits, "flops": 0.0}
        out["train_sgd"] = {"bytes": 6 * weight + 4 * logits, "flops": 0.0}
        out["train_adagrad"] = {"bytes": 8 * weight + 4 * logits, "flops": 0.0}
    else:
        weight = num_labels * dim * f32
        logits = batch * num_labels * f32
        fwd_flops = 2.0 * batch * num_labels * dim
        out["logprob"] = {"bytes": weight + 2 * logits, "flops": fwd_flops}
        out["predict"] = {"bytes": weight + 2 * logits, "flops": fwd_flops}
        out["train"] = {"bytes": 3 * weight + 4 * logits, "flops": 3 * fwd_flops}
        out["train_sgd"] = {"bytes": 6 * weight + 4 * logits, "flops": 3 * fwd_flops}
        out["train_adagrad"] = {"bytes": 8 * weight + 4 * logits, "flops": 3 * fwd_flops}
    out["train_sgd_torch"] = out["train_sgd"]
    out["train_adagrad_torch"] = out["train_adagrad"]
    return out


# ---------------------------------------------------------------------------- one measurement
class MedianTimes(NamedTuple):
    """The medians of one timed function, in ms."""

    #: wall-clock time: the number the tables report
    wall_ms: float
    #: process CPU time (all threads): a second opinion on a busy machine, where time spent
    #: waiting for a core counts as wall time but not as CPU time
    cpu_ms: float


#: calls per timed block on a GPU (one synchronisation per block, not per call)
_GPU_BLOCK = 10


def _median_times(fn: Callable[[], Any], repeats: int, budget_s: float, device: torch.device,
                  warmup: int = 2) -> MedianTimes:
    """Median wall and process CPU time of ``fn`` in ms; fewer repeats (at least 3) when one call
    is slow. On a GPU each repeat is a block of :data:`_GPU_BLOCK` calls between two
    synchronisations (the kernels of consecutive calls queue as they would in training), divided
    by the block's length."""
    block = _GPU_BLOCK if device.type == "cuda" else 1
    for _ in range(warmup):
        fn()
    _sync(device)
    times, cpu_times = [], []
    spent = 0.0
    while len(times) < repeats and (len(times) < 3 or spent < budget_s):
        cpu_start = time.process_time()
        start = time.perf_counter()
        for _ in range(block):
            fn()
        _sync(device)
        elapsed = time.perf_counter() - start
        cpu_times.append((time.process_time() - cpu_start) / block)
        times.append(elapsed / block)
        spent += elapsed
    return MedianTimes(wall_ms=statistics.median(times) * 1e3, cpu_ms=statistics.median(cpu_times) * 1e3)


def _build(method: str, num_labels: int, dim: int, device: torch.device, seed: int):
    from hsm.tree import Tree

    torch.manual_seed(seed)
    if method == "flat":
        return output_layer("flat", dim, num_labels).to(device), None
    if method.startswith("adaptive"):
        cutoffs = ADAPTIVE_CUTOFFS_X5 if method == "adaptive-x5" else ADAPTIVE_CUTOFFS
        # the benchmark times torch's module itself: its Zipf targets are ranks already
        return output_layer("adaptive", dim, num_labels, cutoffs=cutoffs).adaptive.to(device), None
    depth = int(method.rsplit("-d", 1)[1])
    arity = tree_arity(num_labels, depth)
    tree = Tree.random(num_labels, arity, depth, seed=seed)
    layer = output_layer("tree", dim, num_labels, tree=tree,
                         sparse=method.startswith(("tree", "torch", "learned"))).to(device)
    layer.use_kernels = not method.startswith("torch")
    if method.startswith("learned"):
        from hsm.training import TreeLearner

        # attached, the learner's statistics are collected in every training forward; it never
        # re-assigns here (the re-assignment's cost is --algorithm1's)
        layer._bench_learner = TreeLearner(layer, reassign_every=10**12)
    return layer, tree


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    """Time one (V, B, precision, method) in this process; returns the row of the table (see
    module doc). A layer that fails to run (a precision it does not support, or an error on a
    device) gives a row with ``skipped`` (the reason) and no times, so that one failing row does
    not lose the others of a long run; ``main`` exits 1 when a float32 row failed."""
    method, num_labels, dim, batch = config["method"], config["vocab"], config["dim"], config["batch"]
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
    precision = config.get("precision", "float32")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {PRECISIONS}")
    device = torch.device(config.get("device", "cpu"))
    matmul_precision = torch.get_float32_matmul_precision()
    if precision == "tf32":
        torch.set_float32_matmul_precision("high")
    try:
        if precision == "bf16":
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                return _time_one(config, device)
        return _time_one(config, device)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return {"vocab": num_labels, "method": method, "dim": dim, "batch": batch, "precision": precision,
                "device": str(device), "threads": torch.get_num_threads(), "skipped": reason,
                "ms": {}, "cpu_ms": {}, "peak_mb": None}
    finally:
        torch.set_float32_matmul_precision(matmul_precision)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _time_one(config: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """:func:`run_one`'s measurement, in the precision the caller set up."""
    method, num_labels, dim, batch = config["method"], config["vocab"], config["dim"], config["batch"]
    rss_start = _rss_mb()
    steal_start, wall_start = _stolen_seconds(), time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    layer, tree = _build(method, num_labels, dim, device, config.get("seed", 0))
    targets = [y.to(device) for y in zipf_targets(num_labels, batch, _POOL, seed=config.get("seed", 0))]
    inputs = [torch.randn(batch, dim, device=device, requires_grad=True) for _ in range(4)]
    counter = [0]

    def next_batch():
        counter[0] += 1
        return inputs[counter[0] % len(inputs)], targets[counter[0] % len(targets)]

    naive = method.startswith("naive")

    def loss_of(h, y):
        return layer.forward_reference(h, y).loss if naive else layer(h, y).loss

    def train():
        h, y = next_batch()
        layer.zero_grad(set_to_none=True)
        h.grad = None
        loss_of(h, y).backward()

    repeats, budget = config.get("repeats", 20), config.get("budget_s", 20.0)
    metrics = [m for m in config.get("metrics", METRICS) if m in METRICS]
    row: dict[str, Any] = {"vocab": num_labels, "method": method, "dim": dim, "batch": batch,
                           "precision": config.get("precision", "float32"),
                           "threads": torch.get_num_threads(), "device": str(device)}
    if tree is not None:
        row.update(arity=tree.arity, depth=tree.depth_limit, nodes=tree.num_nodes)
        unique = [np.unique(tree.path_nodes[y.cpu().numpy()]).size for y in targets]
        row["unique_nodes"] = float(np.mean(unique))
        row["pairs"] = float(batch * tree.max_depth)
    elif method.startswith("adaptive"):
        row["cutoffs"] = list(layer.cutoffs[:-1])
    params = sum(p.numel() for p in layer.parameters())
    row["parameters"] = params
    ms: dict[str, float] = {}
    cpu_ms: dict[str, float] = {}
    if "train" in metrics:
        ms["train"], cpu_ms["train"] = _median_times(train, repeats, budget, device)
    from hsm import search
    from hsm.optim import RowSparseAdagrad, RowSparseSGD

    optimizers = [("train_sgd", RowSparseSGD), ("train_adagrad", RowSparseAdagrad)]
    if tree is not None:  # torch's own sparse paths, for reference
        optimizers += [("train_sgd_torch", torch.optim.SGD), ("train_adagrad_torch", torch.optim.Adagrad)]
    for name, optimizer_class in optimizers:
        if name.replace("_torch", "") not in metrics or naive:
            continue
        optimizer = optimizer_class(layer.parameters(), lr=0.01)

        def step(optimizer=optimizer):
            train()
            optimizer.step()

        ms[name], cpu_ms[name] = _median_times(step, repeats, budget, device)
        del optimizer
        layer.zero_grad(set_to_none=True)
    with torch.no_grad():
        if "logprob" in metrics:
            def logprob():
                h, y = next_batch()
                return (layer.forward_reference(h, y) if naive else layer(h, y)).output

            ms["logprob"], cpu_ms["logprob"] = _median_times(logprob, repeats, budget, device)
        if "predict" in metrics and not naive:
            if tree is not None:
                # an untrained layer is near uniform at every node, and an exact search must then
                # visit every node; scale the weights to a confident model (what a trained one is),
                # and report how many nodes the search visited
                layer.weight.mul_(config.get("predict_scale", 10.0))
                visited = [float(search.top1(layer, next_batch()[0])[1].float().mean()) for _ in range(3)]
                row["predict_nodes_visited"] = float(np.mean(visited))
            ms["predict"], cpu_ms["predict"] = _median_times(lambda: layer.predict(next_batch()[0]), repeats,
                                                             budget, device)
    row["ms"] = ms
    row["cpu_ms"] = cpu_ms
    if device.type == "cuda":
        row["peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        row["peak_mb"] = max(_peak_rss_mb() - rss_start, 0.0)
    row["parameter_mb"] = params * 4 / 2**20
    stolen = _stolen_seconds()
    if stolen is not None and steal_start is not None:
        row["steal_fraction"] = (stolen - steal_start) / ((time.perf_counter() - wall_start) * (os.cpu_count() or 1))
    return row


def _stolen_seconds() -> float | None:
    """CPU time the hypervisor gave to other guests since boot, all CPUs (``steal`` in
    ``/proc/stat``; None where there is no such file). On a shared virtual machine this is the
    part of a slow measurement that no code change can win back."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return _peak_rss_mb()


def _peak_rss_mb() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage / 2**20 if sys.platform == "darwin" else usage / 2**10


def _run_isolated(config: dict[str, Any]) -> dict[str, Any]:
    """``run_one`` in a fresh interpreter, so its peak memory is its own."""
    env = dict(os.environ)
    if config.get("thp"):
        # torch's CPU allocator then backs tensors >= 2 MB with transparent huge pages: a fresh
        # multi-MB temporary costs a few page faults instead of thousands (read once at start-up)
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    proc = subprocess.run([sys.executable, "-m", "hsm_lab.bench", "--one", json.dumps(config)],
                          capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark {config['method']} V={config['vocab']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- the table
def _median_of_trials(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the same measurement repeated in several processes: per metric the median of
    the processes' medians (the spread between processes, kept in ``ms_trials``, is this
    machine's: memory placement differs from one process to the next)."""
    row = dict(trials[0])
    for key in ("ms", "cpu_ms"):
        row[key] = {m: statistics.median(t[key][m] for t in trials) for m in trials[0][key]}
    row["ms_trials"] = {m: [t["ms"][m] for t in trials] for m in trials[0]["ms"]}
    peaks = [t["peak_mb"] for t in trials if t["peak_mb"] is not None]
    row["peak_mb"] = max(peaks) if peaks else None
    if all("steal_fraction" in t for t in trials):
        row["steal_trials"] = [t["steal_fraction"] for t in trials]
        row["steal_fraction"] = statistics.median(row["steal_trials"])
    return row


def run_benchmark(vocabs: Sequence[int], methods: Sequence[str], dim: int, batch: int | Sequence[int], repeats: int,
                  budget_s: float, device: str = "cpu", isolate: bool = True, predict_scale: float = 10.0,
                  thp: bool = True, trials: int = 1,
                  metrics: Sequence[str] = METRICS, progress: Callable[[str], None] | None = None,
                  precisions: Sequence[str] = ("float32",)) -> dict[str, Any]:
    """All (V, B, precision, method) rows plus the machine limits, floors and ratios against
    ``flat`` (and ``adaptive``) at the same V, B and precision.

    ``batch`` is one size or several. ``trials`` > 1 repeats every measurement in that many
    processes, round after round (so a slow spell of the machine hits every method alike), and
    keeps the median."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    batches = [batch] if isinstance(batch, int) else list(batch)
    for name, value in (("dim", dim), ("repeats", repeats), *(("batch", b) for b in batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not batches:
        raise ValueError("batch must be one or more sizes >= 1, got none")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or not precisions:
        raise ValueError(f"precisions must be one or more of {PRECISIONS}, got {list(precisions)}")
    if not vocabs or any(int(v) < 2 for v in vocabs):
        raise ValueError(f"vocabs must be one or more sizes >= 2, got {list(vocabs)}")
    if not (isinstance(budget_s, (int, float)) and math.isfinite(budget_s) and budget_s > 0):
        raise ValueError(f"budget_s must be a finite number of seconds > 0, got {budget_s!r}")
    from hsm_lab.checks import check_device

    device = check_device(device)
    limits = machine_limits(device)
    if device == "cpu" and isolate:
        limits.update(page_fault_probe())
    configs = [{"method": method, "vocab": int(vocab), "dim": dim, "batch": b, "repeats": repeats,
                "budget_s": budget_s, "device": device, "threads": torch.get_num_threads(),
                "predict_scale": predict_scale, "metrics": list(metrics), "thp": thp, "precision": precision}
               for vocab in vocabs for b in batches for precision in precisions for method in methods]
    measured: list[list[dict[str, Any]]] = [[] for _ in configs]
    for trial in range(trials):
        for config, runs in zip(configs, measured):
            runs.append(_run_isolated(config) if isolate else run_one(config))
            if progress is not None:  # as each is measured: a run cut short still shows what it measured
                progress((f"trial {trial + 1}/{trials}: " if trials > 1 else "") + _row_line(runs[-1]))
    rows = []
    for config, runs in zip(configs, measured):
        method, vocab = config["method"], config["vocab"]
        row = _median_of_trials(runs) if len(runs) > 1 else runs[0]
        row.setdefault("batch", config["batch"])
        row.setdefault("precision", config["precision"])
        if row.get("skipped"):
            row.update(floor_ms={}, floor_fraction={}, bytes={}, flops={})
            rows.append(row)
            continue
        costs = cost_model(method, vocab, dim, config["batch"], row.get("arity"), row.get("unique_nodes", 0.0),
                           row.get("pairs", 0.0), row.get("parameters", 0))
        row["floor_ms"], row["floor_fraction"], row["bytes"], row["flops"] = {}, {}, {}, {}
        for metric, value in row["ms"].items():
            cost = costs[metric]
            floor = 1e3 * max(cost["bytes"] / (limits["bandwidth_gbs"] * 1e9),
                              cost["flops"] / (limits["matmul_gflops"] * 1e9))
            row["floor_ms"][metric] = floor
            row["floor_fraction"][metric] = floor / value if value > 0 else float("nan")
            row["bytes"][metric], row["flops"][metric] = cost["bytes"], cost["flops"]
        rows.append(row)
    for row in rows:
        same = [r for r in rows if (r["vocab"], r["batch"], r.get("precision")) == (row["vocab"], row["batch"],
                                                                                  row.get("precision"))]
        flat = next((r for r in same if r["method"] == "flat"), None)
        adaptive = next((r for r in same if r["method"] == "adaptive"), None)
        # train_sgd_torch / train_adagrad_torch (tree only) are compared with the baselines' steps
        base = lambda m: m.replace("_torch", "")  # noqa: E731
        row["speedup_vs_flat"] = {m: flat["ms"][base(m)] / v for m, v in row["ms"].items()
                                  if flat is not None and base(m) in flat["ms"] and v > 0}
        row["speedup_vs_adaptive"] = {m: adaptive["ms"][base(m)] / v for m, v in row["ms"].items()
                                      if adaptive is not None and base(m) in adaptive["ms"] and v > 0}
    return {"limits": limits, "rows": rows}


def _row_key(row: dict[str, Any]) -> list[str]:
    """The first cells of a table line: V, B, precision, method."""
    return [f"{row['vocab']:>9,d}", f"{row.get('batch', 0):>5d}", f"{row.get('precision', 'float32'):<7}",
            f"{row['method']:<10}"]


def _row_line(row: dict[str, Any]) -> str:
    cells = _row_key(row)
    if row.get("skipped"):
        return " ".join(cells + [f"skipped: {row['skipped']}"])
    for metric in METRICS:
        value = row["ms"].get(metric)
        cells.append(f"{value:10.3f}" if value is not None else f"{'-':>10}")
    cells.append(f"{row['peak_mb']:8.0f}" if row["peak_mb"] is not None else f"{'-':>8}")
    if row.get("steal_fraction") is not None:
        cells.append(f"(steal {row['steal_fraction']:.0%})")
    return " ".join(cells)


def format_table(result: dict[str, Any]) -> str:
    """The benchmark as a plain-text table: ms per batch, peak MB, speed-ups over flat, floors."""
    limits = result["limits"]
    lines = [f"machine: copy bandwidth {limits['bandwidth_gbs']:.1f} GB/s, matmul {limits['matmul_gflops']:.0f} GFLOP/s, "
             f"{torch.get_num_threads()} threads",
             "ms per batch (median)",
             f"{'V':>9} {'B':>5} {'prec.':<7} {'method':<10} " + " ".join(f"{m:>10}" for m in METRICS)
             + f" {'peak MB':>8}"]
    lines += [_row_line(row) for row in result["rows"]]
    lines.append("speed-up over flat (x)  [over adaptive]")
    for row in result["rows"]:
        cells = _row_key(row)
        for metric in METRICS:
            ratio = row["speedup_vs_flat"].get(metric)
            cells.append(f"{ratio:10.1f}" if ratio is not None else f"{'-':>10}")
        train_vs_adaptive = row["speedup_vs_adaptive"].get("train")
        if train_vs_adaptive is not None:
            cells.append(f"[{train_vs_adaptive:.1f}]")
        lines.append(" ".join(cells))
    lines.append("floor ms (bytes / bandwidth or flops / peak) and achieved fraction of it")
    for row in result["rows"]:
        cells = _row_key(row)
        for metric in METRICS:
            floor, frac = row["floor_ms"].get(metric), row["floor_fraction"].get(metric)
            cells.append(f"{floor:6.2f}/{frac:4.0%}" if floor is not None else f"{'-':>11}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def to_records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (V, B, precision, method, metric): value = ms per batch (median), with the
    rest beside it; a row that was skipped is one record of kind ``skipped`` (value 0) with its
    reason."""
    from hsm_lab.results import make_record

    records = []
    for row in result["rows"]:
        if row.get("skipped"):
            records.append(make_record(None, 0, kind="skipped", **{k: v for k, v in row.items()
                                                                  if k not in ("ms", "cpu_ms", "peak_mb")}))
            continue
        common = {k: v for k, v in row.items() if k not in ("ms", "cpu_ms", "floor_ms", "floor_fraction", "bytes",
                                                          "flops", "speedup_vs_flat", "speedup_vs_adaptive",
                                                          "ms_trials")}
        for metric, value in row["ms"].items():
            if "ms_trials" in row:
                common["ms_trials"] = row["ms_trials"][metric]  # each process's median, when --trials > 1
            records.append(make_record(None, value, kind="ms_per_batch", metric=metric, **common,
                                       cpu_ms=row.get("cpu_ms", {}).get(metric),
                                       floor_ms=row["floor_ms"][metric], floor_fraction=row["floor_fraction"][metric],
                                       bytes=row["bytes"][metric], flops=row["flops"][metric],
                                       speedup_vs_flat=row["speedup_vs_flat"].get(metric),
                                       speedup_vs_adaptive=row["speedup_vs_adaptive"].get(metric)))
    for key, value in result["limits"].items():
        records.append(make_record(None, value, kind=key))
    return records


# ---------------------------------------------------------------------------- Algorithm 1's extra work
def algorithm1_overhead(vocab: int = 250_000, arity: int = 65, depth: int = 3, dim: int = 200, batch: int = 128,
                        steps: int = 50, repeats: int = 3, well_formed_vocab: int = 312_000,
                        well_formed_arity: int = 20, epoch_tokens: int = 40_750_865,
                        reassign_per_epoch: Sequence[int] = (20, 50), seed: int = 0) -> dict[str, Any]:
    """What learning the tree costs on top of training with a fixed one (the performance chapter's budget:
    20 % over a fixed tree).

    Two parts: (1) collecting the node statistics in every forward pass (a training step with
    sparse Adagrad, timed with and without a :class:`hsm.TreeLearner` attached, medians of
    ``steps``); (2) one re-assignment at K = ``vocab`` (Algorithm 3, fixed depth) split into the
    J_n diagnostic :class:`TreeLearner` records before each rebuild, the assignment itself
    (:func:`hsm.assign.assign_labels_depth_constrained`) and the rest (new tree, statistics), and
    one Algorithm 2 assignment at K = ``well_formed_vocab`` on a Huffman tree
    (:func:`hsm.assign.assign_labels_well_formed`). The amortised overhead is given for the
    papers' schedule: ``reassign_per_epoch`` re-assignments per epoch of ``epoch_tokens`` targets
    (the Gutenberg training set of this project: 40.75M tokens)."""
    from hsm.assign import assign_labels_depth_constrained, assign_labels_well_formed
    from hsm.layers import HierarchicalSoftmax
    from hsm.optim import RowSparseAdagrad
    from hsm.training import TreeLearner
    from hsm.tree import Tree

    torch.manual_seed(seed)
    tree = Tree.random(vocab, arity, depth, seed=seed)
    layer = HierarchicalSoftmax(dim, tree, sparse=True)
    optimizer = RowSparseAdagrad(layer.parameters(), lr=0.01)
    targets = zipf_targets(vocab, batch, _POOL, seed=seed)
    inputs = [torch.randn(batch, dim) for _ in range(4)]
    counter = [0]

    def step() -> None:
        counter[0] += 1
        optimizer.zero_grad(set_to_none=True)
        layer(inputs[counter[0] % 4], targets[counter[0] % _POOL]).loss.backward()
        optimizer.step()

    learner = TreeLearner(layer, reassign_every=10**12, decay=0.5)  # the statistics of the committed timings
    # interleave steps without and with the statistics (the learner detached / attached), so that
    # a change in the machine's load hits both alike
    fixed, with_stats = [], []
    for index in range(2 * steps + 4):
        layer.statistics = learner.statistics if index % 2 else None
        start = time.perf_counter()
        step()
        if index >= 4:
            (with_stats if index % 2 else fixed).append(time.perf_counter() - start)
    layer.statistics = learner.statistics
    fixed_ms, with_stats_ms = statistics.median(fixed) * 1e3, statistics.median(with_stats) * 1e3
    parts: dict[str, list[float]] = {"objective_diagnostic_s": [], "assign_s": [], "reassign_total_s": []}
    for _ in range(repeats):
        start = time.perf_counter()
        learner.objective_by_depth()
        parts["objective_diagnostic_s"].append(time.perf_counter() - start)
        start = time.perf_counter()
        assign_labels_depth_constrained(layer.tree, learner.statistics, score=learner.score)
        parts["assign_s"].append(time.perf_counter() - start)
        start = time.perf_counter()
        learner.reassign()
        parts["reassign_total_s"].append(time.perf_counter() - start)
        for _ in range(5):
            step()
    result: dict[str, Any] = {"vocab": vocab, "arity": arity, "depth": depth, "dim": dim, "batch": batch,
                              "threads": torch.get_num_threads(), "step_fixed_ms": fixed_ms,
                              "step_with_statistics_ms": with_stats_ms,
                              "statistics_overhead": with_stats_ms / fixed_ms - 1.0}
    result.update({name: statistics.median(values) for name, values in parts.items()})
    steps_per_epoch = epoch_tokens // batch
    result["schedules"] = []
    for per_epoch in reassign_per_epoch:
        every = max(1, steps_per_epoch // per_epoch)
        amortised = result["reassign_total_s"] * 1e3 / (every * fixed_ms)
        result["schedules"].append({"reassign_per_epoch": per_epoch, "reassign_every": every,
                                    "reassign_overhead": amortised,
                                    "total_overhead": result["statistics_overhead"] + amortised})
    # Algorithm 2 (well-formed trees) at K = well_formed_vocab
    counts = np.bincount(torch.cat(zipf_targets(well_formed_vocab, 4096, 8, seed=seed)).numpy(),
                         minlength=well_formed_vocab) + 1
    huffman = Tree.huffman(counts, well_formed_arity)
    wf_layer = HierarchicalSoftmax(16, huffman, sparse=True)
    wf_learner = TreeLearner(wf_layer, reassign_every=10**12)
    for y in zipf_targets(well_formed_vocab, 512, 8, seed=seed + 1):
        wf_layer(torch.randn(len(y), 16), y)
    times = []
    for _ in range(max(1, repeats - 1)):
        start = time.perf_counter()
        assign_labels_well_formed(wf_layer.tree, wf_learner.statistics, score=wf_learner.score)
        times.append(time.perf_counter() - start)
    result.update(well_formed_vocab=well_formed_vocab, well_formed_arity=well_formed_arity,
                  well_formed_nodes=huffman.num_nodes, well_formed_assign_s=statistics.median(times))
    return result


def format_algorithm1(result: dict[str, Any]) -> str:
    lines = [f"Algorithm 1 overhead at K={result['vocab']:,d}, M={result['arity']}, D={result['depth']}, "
             f"d={result['dim']}, B={result['batch']}, {result['threads']} threads",
             f"  training step (RowSparseAdagrad), fixed tree: {result['step_fixed_ms']:.3f} ms; with statistics: "
             f"{result['step_with_statistics_ms']:.3f} ms ({result['statistics_overhead']:+.1%})",
             f"  one re-assignment: {result['reassign_total_s']:.2f} s = Algorithm 3 {result['assign_s']:.2f} s "
             f"+ J_n diagnostic {result['objective_diagnostic_s']:.2f} s + rest",
             f"  Algorithm 2 at K={result['well_formed_vocab']:,d}, M={result['well_formed_arity']} "
             f"({result['well_formed_nodes']:,d} nodes): {result['well_formed_assign_s']:.2f} s"]
    for sched in result["schedules"]:
        lines.append(f"  {sched['reassign_per_epoch']} re-assignments per epoch (every {sched['reassign_every']:,d} "
                     f"steps): re-assignment {sched['reassign_overhead']:.1%}, total {sched['total_overhead']:.1%}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- where the time goes
def profile_train_step(vocab: int = 250_000, depth: int = 3, dim: int = 200, batch: int = 128, steps: int = 20,
                       top: int = 12, seed: int = 0, device: str = "cpu", engine: str = "auto") -> list[dict[str, Any]]:
    """torch.profiler over ``steps`` training steps (forward, backward, RowSparseAdagrad) of the
    tree softmax on ``device`` with the layer's ``engine``; the ``top`` operators by self time on
    that device (CPU time on a CPU, CUDA kernel time on a GPU), in ms per step and share of the
    total, with the number of calls per step (kernel launches, on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    from hsm.layers import HierarchicalSoftmax
    from hsm.optim import RowSparseAdagrad
    from hsm.tree import Tree

    torch.manual_seed(seed)
    target_device = torch.device(device)
    on_gpu = target_device.type == "cuda"
    tree = Tree.random(vocab, tree_arity(vocab, depth), depth, seed=seed)
    layer = HierarchicalSoftmax(dim, tree, sparse=True, engine=engine).to(target_device)
    optimizer = RowSparseAdagrad(layer.parameters(), lr=0.01)
    targets = [t.to(target_device) for t in zipf_targets(vocab, batch, _POOL, seed=seed)]
    h = torch.randn(batch, dim, device=target_device, requires_grad=True)

    def step(i: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.profiler.record_function("hsm.forward"):
            loss = layer(h, targets[i % _POOL]).loss
        with torch.profiler.record_function("hsm.backward"):
            loss.backward()
        with torch.profiler.record_function("hsm.optimizer"):
            optimizer.step()

    for i in range(3):
        step(i)
    _sync(target_device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            step(i)
        _sync(target_device)
    events = prof.key_averages()

    def self_time(event: Any) -> float:  # microseconds on the profiled device
        return getattr(event, "self_device_time_total", 0.0) if on_gpu else event.self_cpu_time_total

    measured = [e for e in events if self_time(e) > 0]
    total = sum(self_time(e) for e in measured)
    rows = []
    for event in sorted(measured, key=self_time, reverse=True)[:top]:
        rows.append({"op": event.key, "self_ms_per_step": self_time(event) / 1e3 / steps,
                     "share": self_time(event) / total, "calls_per_step": event.count / steps})
    phases = {e.key: e.cpu_time_total / 1e3 / steps for e in events if e.key.startswith("hsm.")}
    rows.append({"op": "total", "self_ms_per_step": total / 1e3 / steps, "share": 1.0, "phases_ms": phases,
                 "device": str(target_device), "engine": engine,
                 "calls_per_step": sum(e.count for e in measured) / steps})
    return rows


def _count(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum`` (argparse names the option in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def _positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


#: sizes of a full run, and of ``--quick`` (each used only where the option is not given)
_FULL = dict(vocab=[10_000, 100_000, 250_000, 1_000_000], dim=200, batch=[128], repeats=20, budget=20.0)
_QUICK = dict(vocab=[500, 2_000], dim=16, batch=[8], repeats=3, budget=1.0)


def scale_defaults(quick: bool) -> dict[str, Any]:
    """The values an unset ``--vocab``, ``--dim``, ``--batch``, ``--repeats`` and ``--budget``
    take, at the quick or the full scale (a result file records them filled in)."""
    return dict(_QUICK if quick else _FULL)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hsm bench", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--vocab", type=_count(2), nargs="+", default=None,
                        help=f"vocabulary sizes (default {_FULL['vocab']}; --quick: {_QUICK['vocab']})")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--metrics", nargs="+", default=list(METRICS), choices=METRICS)
    parser.add_argument("--dim", type=_count(1), default=None, help="input dimension (default 200; --quick: 16)")
    parser.add_argument("--batch", type=_count(1), nargs="+", default=None,
                        help="batch sizes (default 128; --quick: 8); --algorithm1 and --profile use the first")
    parser.add_argument("--precision", nargs="+", default=["float32"], choices=PRECISIONS,
                        help="float32; tf32 (float32 matmuls on TF32 tensor cores, GPU only); bf16 (autocast); "
                             "a precision a layer cannot run in is recorded as skipped (default float32)")
    parser.add_argument("--repeats", type=_count(1), default=None,
                        help="timed runs per measurement (median; default 20, --quick: 3)")
    parser.add_argument("--trials", type=_count(1), default=1,
                        help="repeat every measurement in this many fresh processes, round after round; "
                             "report the median (process-to-process spread is large on a shared machine)")
    parser.add_argument("--budget", type=_positive_float, default=None,
                        help="seconds per measurement before stopping early (default 20; --quick: 1)")
    parser.add_argument("--threads", type=_count(1), default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...), checked before any work")
    parser.add_argument("--predict-scale", type=_positive_float, default=10.0,
                        help="multiply the tree's weights by this before timing predict (a confident model)")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run every measurement in this process (always so on a GPU and with --quick)")
    parser.add_argument("--no-thp", action="store_true",
                        help="do not set THP_MEM_ALLOC_ENABLE=1 (huge pages for CPU tensors) in the measuring processes")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, in-process (CI); sizes given explicitly are kept")
    parser.add_argument("--json", default=None, help="write the result file here (hsm_lab.results format)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write --json at full scale although the code has uncommitted changes (recorded)")
    parser.add_argument("--force", action="store_true",
                        help="let a --quick run replace a full-scale result file given with --json")
    parser.add_argument("--algorithm1", action="store_true",
                        help="measure Algorithm 1's extra work (statistics, re-assignment) instead of the table")
    parser.add_argument("--profile", action="store_true",
                        help="profile the tree's training step (torch.profiler) at the first --vocab instead, on "
                             "--device (CUDA kernel time on a GPU)")
    parser.add_argument("--engine", choices=("auto", "torch"), default="auto",
                        help="the tree layer's engine for --profile (auto: compiled kernels on a CPU, the static "
                             "torch engine on a GPU)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.one is not None:  # child process of an isolated run
        config = json.loads(args.one)
        if config.get("threads"):
            torch.set_num_threads(int(config["threads"]))
        print(json.dumps(run_one(config)))
        return 0
    from hsm_lab.checks import check_device
    from hsm_lab.results import check_code_committed, check_replace, recording_invocation

    scale = "quick" if args.quick else "full"
    try:
        args.device = check_device(args.device)
        if args.json:  # a quick run must not replace a full-scale file by accident: refuse before measuring
            check_replace(args.json, scale, args.force, option="--json")
            check_code_committed(scale, args.allow_dirty)
    except ValueError as exc:
        print(f"hsm bench: {exc}", file=sys.stderr)
        return 2
    # the result file records the command (less where it was written) for `python -m hsm reproduce`
    invocation = {"command": "bench", "argv": _without_json(argv)}
    with recording_invocation(invocation):
        return _measure(args, scale)


def _without_json(argv: list[str]) -> list[str]:
    """``argv`` less ``--json PATH`` / ``--json=PATH`` (where a run writes is not what it measures)."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--json":
            skip = True
        elif not item.startswith("--json="):
            out.append(item)
    return out


def _measure(args: argparse.Namespace, scale: str) -> int:
    """The measurement ``main`` asked for, after its checks; writes ``args.json`` when given."""
    # explicit sizes win; --quick only changes the defaults (it used to overwrite them silently)
    given = {name for name in _FULL if getattr(args, name) is not None}
    if args.threads:
        torch.set_num_threads(args.threads)
    for name, value in (_QUICK if args.quick else _FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick or args.device != "cpu":
        args.no_isolate = True  # a GPU's peak memory is reset per measurement; a process would spend seconds on CUDA
    start = time.perf_counter()
    if args.profile:
        sizes = dict(vocab=2_000, dim=16, batch=16, steps=3) if args.quick else dict(
            vocab=args.vocab[0], dim=args.dim, batch=args.batch[0])
        sizes.update({name: getattr(args, name)[0] if name in ("vocab", "batch") else getattr(args, name)
                      for name in given & {"vocab", "dim", "batch"}})
        sizes.update(device=args.device, engine=args.engine)
        rows = profile_train_step(**sizes)
        for row in rows:
            print(f"{row['op']:<40} {row['self_ms_per_step']:9.3f} ms {row['share']:6.1%}")
        if args.json:
            from hsm_lab.results import make_record, provenance, write_results

            records = [make_record(None, row["self_ms_per_step"], kind="profile", **sizes, **row) for row in rows]
            config = {k: v for k, v in vars(args).items() if k not in ("json", "one")}
            path = write_results(args.json, records, provenance(config, time.perf_counter() - start,
                                                                scale=scale), force=args.force)
            print(f"wrote {path}")
        return 0
    if args.algorithm1:
        sizes = dict(vocab=3_000, arity=15, depth=3, dim=16, batch=32, steps=5, repeats=1, well_formed_vocab=2_000,
                     well_formed_arity=5) if args.quick else dict(dim=args.dim, batch=args.batch[0], steps=200)
        sizes.update({name: getattr(args, name)[0] if name == "batch" else getattr(args, name)
                      for name in given & {"dim", "batch", "repeats"}})
        if "vocab" in given:
            sizes.update(vocab=args.vocab[0], arity=tree_arity(args.vocab[0], sizes.get("depth", 3)))
        result = algorithm1_overhead(**sizes)
        print(format_algorithm1(result))
        if args.json:
            from hsm_lab.results import make_record, provenance, write_results

            records = [make_record(None, result["reassign_total_s"], kind="algorithm1", **result)]
            config = {k: v for k, v in vars(args).items() if k not in ("json", "one")}
            path = write_results(args.json, records, provenance(config, time.perf_counter() - start,
                                                                scale=scale), force=args.force)
            print(f"wrote {path}")
        return 0
    result = run_benchmark(args.vocab, args.methods, args.dim, args.batch, args.repeats, args.budget,
                           device=args.device, isolate=not args.no_isolate, predict_scale=args.predict_scale,
                           thp=not args.no_thp, trials=args.trials, precisions=args.precision,
                           metrics=args.metrics, progress=lambda line: print(line, flush=True))
    print(format_table(result))
    if args.json:
        from hsm_lab.results import provenance, write_results

        config = {k: v for k, v in vars(args).items() if k not in ("json", "one")}
        config["threads"] = torch.get_num_threads()
        path = write_results(args.json, to_records(result), provenance(config, time.perf_counter() - start,
                                                                       scale=scale), force=args.force)
        print(f"wrote {path}")
    failed = [row for row in result["rows"] if row.get("skipped") and row.get("precision") == "float32"]
    for row in failed:
        print(f"hsm bench: {row['method']} failed at V={row['vocab']} B={row['batch']} in float32: {row['skipped']}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
