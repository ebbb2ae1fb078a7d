"""``python -m hsm bench-decoding``: decoding with the output layers side by side, ms per batch.

For every vocabulary size V, thread count and method it times, per batch of B rows ``h`` [B, d]
(standard normal, cycling through 16 batches):

* ``top1``: the most likely label (the tree's ``predict``, branch and bound; the flat layer's
  logits + ``torch.topk``; the adaptive softmax's ``predict``);
* ``top5``: the five most likely labels with their log-probabilities (the tree's ``topk(h, 5)``,
  on float32 CPU the compiled best-first search :func:`hsm.kernels.topk_search`; the flat layer's
  logits + ``torch.topk``; the adaptive softmax's ``log_prob`` + ``torch.topk``);
* ``logprob``: the log-probabilities of all V labels (the tree's compiled
  :func:`hsm.search.all_log_probs`; ``log_prob`` of the flat and adaptive layers);
* ``top5_torch`` / ``logprob_torch`` (tree only): the same through the tree layer's PyTorch code
  (``use_kernels = False``; ``log_prob`` as the layer computes it without the kernels), the
  numbers the compiled paths replace.

Methods (built as ``python -m hsm bench`` builds them): ``tree-d2`` / ``tree-d3``
(:class:`hsm.HierarchicalSoftmax` on a random fixed-depth tree, M = ceil(V**(1/D))), ``flat``
(:class:`hsm.FlatSoftmax`) and ``adaptive`` (``nn.AdaptiveLogSoftmaxWithLoss``, the bench's cutoffs).
The tree's weights are random, multiplied by ``--weight-scale`` (default 10): an untrained layer is
near uniform at every node, where any exact search must open every node, while a trained one is
confident; the scaled random weights stand in for a trained model's (the result records the
scale and the nodes the top-5 search evaluated). The flat and adaptive layers' costs do not depend
on their weights.

Times are medians (``--repeats``, fewer when a call is slow: ``--budget``), in this process, with
torch's threads (and the kernels') set to each of ``--threads`` in turn. The result file (default
``hsm-results/bench/decoding.json``, ``--json`` for another) holds one record per (V, threads,
method, metric) with provenance (:mod:`hsm_lab.results`; its ``threads`` are the counts measured, not
the process's own), as ``python -m hsm bench`` writes them, and each time's ratio to the flat and
the adaptive layer's. ``--quick`` runs tiny sizes in seconds (sizes given explicitly are honoured).
A bad option is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hsm.cli_text import plain

__all__ = ["METHODS", "METRICS", "check_sizes", "decoding_functions", "format_table", "main", "run_decoding",
           "to_records"]

METHODS = ("tree-d2", "tree-d3", "flat", "adaptive")
METRICS = ("top1", "top5", "logprob", "top5_torch", "logprob_torch")
DEFAULT_OUT = "results/bench/decoding.json"
_POOL = 16  # distinct batches cycled through by every timing loop
_FULL = dict(vocab=[10_000, 250_000], dim=200, batch=128, threads=[1, 2], repeats=15, budget=10.0)
_QUICK = dict(vocab=[500, 2_000], dim=16, batch=8, threads=[1], repeats=3, budget=1.0)


def decoding_functions(method: str, layer: torch.nn.Module) -> dict[str, Callable[[torch.Tensor], Any]]:
    """The timed function of each metric this method has (see the module doc), each taking ``h``."""
    from hsm import search

    if method.startswith("tree"):
        def without_kernels(fn: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
            def run(h: torch.Tensor) -> Any:
                layer.use_kernels = False
                try:
                    return fn(h)
                finally:
                    layer.use_kernels = True
            return run

        return {"top1": layer.predict, "top5": lambda h: layer.topk(h, 5),
                "logprob": lambda h: search.all_log_probs(layer, h),
                "top5_torch": without_kernels(lambda h: layer.topk(h, 5)),
                "logprob_torch": without_kernels(layer.log_prob)}
    if method == "flat":
        return {"top1": lambda h: torch.topk(layer.linear(h), 1), "top5": lambda h: torch.topk(layer.linear(h), 5),
                "logprob": layer.log_prob}
    return {"top1": layer.predict, "top5": lambda h: torch.topk(layer.log_prob(h), 5), "logprob": layer.log_prob}


def _measure_method(method: str, vocab: int, dim: int, batch: int, threads: int, repeats: int, budget_s: float,
                    weight_scale: float, metrics: Sequence[str], seed: int = 0) -> dict[str, Any]:
    """One row: the times of ``metrics`` for one (V, method) at ``threads`` threads."""
    from hsm_lab.bench import _build, _median_times

    torch.set_num_threads(threads)
    device = torch.device("cpu")
    layer, tree = _build(method, vocab, dim, device, seed)
    layer.eval()
    row: dict[str, Any] = {"vocab": vocab, "method": method, "dim": dim, "batch": batch, "threads": threads}
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(batch, dim, generator=generator) for _ in range(_POOL)]
    counter = [0]

    def next_input() -> torch.Tensor:
        counter[0] += 1
        return inputs[counter[0] % _POOL]

    with torch.no_grad():
        if tree is not None:
            layer.weight.mul_(weight_scale)
            row.update(arity=tree.arity, depth=tree.depth_limit, nodes=tree.num_nodes, weight_scale=weight_scale)
            row["top5_nodes_visited"] = float(np.mean([layer.topk(x, 5).nodes_visited.float().mean().item()
                                                       for x in inputs[:4]]))
        elif method == "adaptive":
            row["cutoffs"] = list(layer.cutoffs[:-1])
        ms, cpu_ms = {}, {}
        for metric, fn in decoding_functions(method, layer).items():
            if metric in metrics:
                ms[metric], cpu_ms[metric] = _median_times(lambda fn=fn: fn(next_input()), repeats, budget_s, device)
    row["ms"], row["cpu_ms"] = ms, cpu_ms
    return row


def run_decoding(vocabs: Sequence[int], methods: Sequence[str], dim: int, batch: int, threads: Sequence[int],
                 repeats: int, budget_s: float, weight_scale: float = 10.0, metrics: Sequence[str] = METRICS,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every (V, threads, method) row (:func:`_measure_method`), with each time's ratio to the
    flat and the adaptive layer's at the same V, threads and metric (``vs_flat``: flat ms / this
    method's ms, above 1 when this method is faster). torch's thread count is restored after."""
    before = torch.get_num_threads()
    rows = []
    try:
        for vocab in vocabs:
            for count in threads:
                for method in methods:
                    row = _measure_method(method, vocab, dim, batch, count, repeats, budget_s, weight_scale, metrics)
                    gc.collect()  # the previous layer's weights (hundreds of MB at V = 250k) go before the next
                    rows.append(row)
                    if progress:
                        progress(_row_line(row))
    finally:
        torch.set_num_threads(before)
    for row in rows:
        for baseline in ("flat", "adaptive"):
            base = next((r for r in rows if r["method"] == baseline and r["vocab"] == row["vocab"]
                         and r["threads"] == row["threads"]), None)
            row[f"vs_{baseline}"] = {m: base["ms"][m] / v for m, v in row["ms"].items()
                                     if base is not None and m in base["ms"] and v > 0}
    return {"dim": dim, "batch": batch, "weight_scale": weight_scale, "rows": rows}


def check_sizes(vocabs: Sequence[int], dim: int, batch: int) -> None:
    """ValueError naming ``--vocab`` when the largest layer would not fit in this machine's memory:
    about ``4 V (d + 3 B)`` bytes (the float32 weights, and the logits, log-probabilities and
    sorted copy of a batch over every label), refused above 80 % of the physical memory before
    anything is allocated, instead of the allocator's traceback (or the out-of-memory killer)."""
    from hsm.classifiers.fast_classifier import beyond_memory

    vocab = max(vocabs)
    need = 4 * vocab * (dim + 3 * batch)
    have = beyond_memory(need)
    if have is not None:
        raise ValueError(f"--vocab {vocab:,}: the layers of V = {vocab:,} (d = {dim}, B = {batch}) need about "
                         f"{need / 2**30:,.1f} GiB, more than 80 % of this machine's {have / 2**30:.1f} GiB: "
                         f"choose a smaller --vocab")


def _row_line(row: dict[str, Any]) -> str:
    times = "  ".join(f"{metric} {value:9.2f}" for metric, value in row["ms"].items())
    return f"V={row['vocab']:>9,d} threads={row['threads']} {row['method']:<9} {times}"


def format_table(result: dict[str, Any]) -> str:
    """The rows as a Markdown table: ms per batch, and the ratio to the flat layer in brackets."""
    metrics = [m for m in METRICS if any(m in row["ms"] for row in result["rows"])]
    lines = [f"Decoding, ms per batch of {result['batch']} (d = {result['dim']}; tree weights: random x "
             f"{result['weight_scale']:g}); in brackets: flat ms / this ms",
             "| V | threads | method | " + " | ".join(metrics) + " |",
             "|---:|---:|:---|" + "---:|" * len(metrics)]
    for row in result["rows"]:
        cells = []
        for metric in metrics:
            value = row["ms"].get(metric)
            ratio = row.get("vs_flat", {}).get(metric)
            cells.append("" if value is None else f"{value:.2f}" + (f" ({ratio:.2f}x)" if ratio else ""))
        lines.append(f"| {row['vocab']:,d} | {row['threads']} | {row['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (V, threads, method, metric): value = ms per batch (median)."""
    from hsm_lab.results import make_record

    records = []
    for row in result["rows"]:
        common = {k: v for k, v in row.items() if k not in ("ms", "cpu_ms", "vs_flat", "vs_adaptive")}
        for metric, value in row["ms"].items():
            records.append(make_record(None, value, kind="ms_per_batch", metric=metric, **common,
                                       cpu_ms=row["cpu_ms"].get(metric), speedup_vs_flat=row["vs_flat"].get(metric),
                                       speedup_vs_adaptive=row["vs_adaptive"].get(metric)))
    return records


def _parser() -> argparse.ArgumentParser:
    from hsm_lab.bench import _count, _positive_float

    parser = argparse.ArgumentParser(prog="python -m hsm bench-decoding", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--vocab", type=_count(2), nargs="+", default=None,
                        help=f"vocabulary sizes (default {_FULL['vocab']}; --quick: {_QUICK['vocab']})")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--metrics", nargs="+", default=list(METRICS), choices=METRICS)
    parser.add_argument("--dim", type=_count(1), default=None, help=f"d (default {_FULL['dim']})")
    parser.add_argument("--batch", type=_count(1), default=None, help=f"B (default {_FULL['batch']})")
    parser.add_argument("--threads", type=_count(1), nargs="+", default=None,
                        help=f"thread counts, each measured in turn (default {_FULL['threads']})")
    parser.add_argument("--repeats", type=_count(1), default=None, help=f"timed calls (default {_FULL['repeats']})")
    parser.add_argument("--budget", type=_positive_float, default=None,
                        help=f"seconds per timing after which fewer repeats are done (default {_FULL['budget']})")
    parser.add_argument("--weight-scale", type=_positive_float, default=10.0,
                        help="factor on the tree's random weights, standing in for a trained model's (default 10)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--json", default=None, help=f"result file (default {DEFAULT_OUT} under hsm-results/)")
    parser.add_argument("--force", action="store_true", help="let a --quick run replace a full-scale result file")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a full-scale result although the code has uncommitted changes (recorded)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from hsm_lab.bench import _without_json
    from hsm_lab.results import (check_code_committed, check_replace, output_path, provenance, recording_invocation,
                          write_results)

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    scale = "quick" if args.quick else "full"
    for name, value in (_QUICK if args.quick else _FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    path = output_path(DEFAULT_OUT, args.json)
    try:
        # before measuring: a quick run must not replace a full one
        check_replace(path, scale, args.force, option="--json")
        check_code_committed(scale, args.allow_dirty)
        check_sizes(args.vocab, args.dim, args.batch)
    except ValueError as exc:
        print(f"hsm bench-decoding: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    with recording_invocation({"command": "bench-decoding", "argv": _without_json(argv)}):
        try:
            result = run_decoding(args.vocab, args.methods, args.dim, args.batch, args.threads, args.repeats,
                                  args.budget, args.weight_scale, args.metrics,
                                  progress=lambda line: print(line, flush=True))
        except (MemoryError, RuntimeError) as exc:
            # what the size check cannot foresee (other processes holding memory): torch's allocator
            # raises RuntimeError "... can't allocate memory ...", numpy MemoryError
            if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
                raise
            print(f"hsm bench-decoding: out of memory while measuring (V up to {max(args.vocab):,}, d = {args.dim}, "
                  f"B = {args.batch}): choose a smaller --vocab", file=sys.stderr)
            return 1
        print(format_table(result))
        config = {k: v for k, v in vars(args).items() if k != "json"}
        # the measurements ran on --threads; run_decoding has given torch's own count back by now
        prov = provenance(config, time.perf_counter() - start, scale=scale, threads=args.threads)
        written = write_results(path, to_records(result), prov, force=args.force)
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
