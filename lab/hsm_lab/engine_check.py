"""The tree layer's static engine on a GPU: what the CPU tests cannot see.

    python -m hsm_lab.engine_check [--labels 250000] [--arity 65] [--dim 200] [--batch 128] [--json PATH]

Checks, each reported on its own line (and with ``--json``, in that file with its provenance):

* no host-device synchronisation in a training step and a test step (CUDA's own sync detector,
  ``torch.cuda.set_sync_debug_mode("error")``), and the op counts of :mod:`hsm.op_count`;
* the engine's values against ``forward_reference``; three steps of the fused Triton kernels
  against the engine with ``RowSparseAdagrad``; five replays of a captured step against eager steps;
* the language-model training loop with its step replayed from a CUDA graph against the same
  run eager;
* milliseconds per training step and per test step: the flat softmax (``nn.Linear`` +
  ``F.cross_entropy`` + ``torch.optim.Adagrad``), the engine eager, captured in a CUDA graph,
  fused (Triton), fused and captured.

Needs a CUDA device.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

import hsm
from hsm import fused
from hsm.atomic import atomic_write
from hsm.engine import capture_step
from hsm.op_count import OpCounter
from hsm_lab.output_layers import AdaptiveSoftmaxBaseline
from hsm_lab.results import provenance


def _time(fn, *args, warmup: int = 5) -> float:
    """Median milliseconds of ``fn(*args)``: by CUDA events on a GPU, by the wall clock on a CPU."""
    for _ in range(warmup):
        fn(*args)
    cuda = torch.cuda.is_available() and DEVICE.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn(*args)
            times.append(1000 * (time.perf_counter() - began))
    return statistics.median(times)


#: the device the checks run on (``--device``) and the timed repeats of each step (``--repeats``)
DEVICE = torch.device("cuda")
REPEATS = 50


def _tree_layer(tree, dim, fuse=False):
    torch.manual_seed(0)
    layer = hsm.HierarchicalSoftmax(dim, tree, sparse=True, engine="torch").to(DEVICE)
    optimizer = hsm.RowSparseAdagrad(layer.parameters(), lr=0.05, initial_accumulator_value=0.1, engine="torch")
    if fuse:
        optimizer.fuse(layer)
    return layer, optimizer


def _step(layer, optimizer):
    def step(h, y):
        optimizer.zero_grad(set_to_none=True)
        loss = layer(h, y).loss
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=250_000)
    parser.add_argument("--arity", type=int, default=65)
    parser.add_argument("--dim", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="cuda",
                        help="cuda (the check), or cpu: a dry run of the same steps with CPU timings, "
                             "the op counter instead of CUDA's sync detector, and no CUDA graph or Triton kernel")
    parser.add_argument("--tf32", action="store_true", help="float32 matmuls on TF32 tensor cores (GPU)")
    parser.add_argument("--repeats", type=int, default=50, help="timed repeats of each step (median)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here, with its provenance")
    args = parser.parse_args(argv)
    global DEVICE, REPEATS
    DEVICE, REPEATS = torch.device(args.device), args.repeats
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    cuda = DEVICE.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run on a GPU, or --device cpu for a dry run")
    report: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "args": vars(args),
                    "fused_available": cuda and fused.available()}
    tree = hsm.Tree.random(args.labels, args.arity, 3, seed=0)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    batches = [(torch.randn(args.batch, args.dim, device=DEVICE, generator=g),
                torch.randint(0, args.labels, (args.batch,), device=DEVICE, generator=g)) for _ in range(8)]
    h0, y0 = batches[0]

    def check(name, fn):
        try:
            report[name] = fn()
        except Exception as error:  # report and go on: one failing check must not hide the others
            report[name] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-2000:]}
        print(name, json.dumps(report[name], default=str)[:2000], flush=True)

    def syncs():
        layer, optimizer = _tree_layer(tree, args.dim)
        step = _step(layer, optimizer)
        step(h0, y0)
        out = {}
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            for kind, run in (("train", lambda: step(h0, y0)), ("test", lambda: layer(h0, y0))):
                try:
                    with torch.no_grad() if kind == "test" else torch.enable_grad():
                        run()
                    out[kind] = "no synchronisation"
                except RuntimeError as error:
                    out[kind] = f"synchronises: {error}"
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
        with OpCounter() as counter:
            step(h0, y0)
        with torch.no_grad(), OpCounter() as test:
            layer(h0, y0)
        out["ops"] = {"train": len(counter.launching), "train_syncs": len(counter.synchronising),
                      "test": len(test.launching), "test_syncs": len(test.synchronising)}
        return out

    def values():
        layer, _ = _tree_layer(tree, args.dim)
        with torch.no_grad():
            got = layer(h0, y0).output
            want = layer.forward_reference(h0, y0).output
        return {"max_abs_diff": float((got - want).abs().max())}

    def fused_equal():
        if not report["fused_available"]:
            return "needs a GPU with Triton"
        (a, oa), (b, ob) = _tree_layer(tree, args.dim, fuse=True), _tree_layer(tree, args.dim)
        for h, y in batches[:3]:
            for layer, optimizer in ((a, oa), (b, ob)):
                _step(layer, optimizer)(h, y)
        return {"weight_max_rel": float(((a.weight - b.weight).abs().max() / b.weight.abs().max())),
                "state_max_rel": float(((oa.state[a.weight]["sum"] - ob.state[b.weight]["sum"]).abs().max()
                                        / ob.state[b.weight]["sum"].abs().max()))}

    def captured_equal():
        if not cuda:
            return "needs a GPU"
        layer, optimizer = _tree_layer(tree, args.dim)
        twin = copy.deepcopy(layer)
        twin_opt = hsm.RowSparseAdagrad(twin.parameters(), lr=0.05, initial_accumulator_value=0.1, engine="torch")
        replay = capture_step(_step(layer, optimizer), h0, y0, warmup=1)  # one real step on (h0, y0)
        _step(twin, twin_opt)(h0, y0)  # ... and once more in the capture
        _step(twin, twin_opt)(h0, y0)
        losses = []
        for h, y in batches[1:6]:
            losses.append((float(replay(h, y)), float(_step(twin, twin_opt)(h, y))))
        return {"losses": losses, "weight_max_abs_diff": float((layer.weight - twin.weight).abs().max())}

    def timings():
        """Every variant in one run: the flat softmax as a careful user runs it (eager; captured in a
        CUDA graph with a capturable optimiser), the adaptive softmax, and the tree's engine (eager,
        captured, fused, fused and captured). A variant that fails is reported and the rest go on."""
        out = {}

        def optimised_step(module, optimizer, loss_of):
            def step(h, y):
                optimizer.zero_grad(set_to_none=True)
                loss = loss_of(module, h, y)
                loss.backward()
                optimizer.step()
                return loss.detach()
            return step

        def flat_loss(module, h, y):
            return F.cross_entropy(module(h), y)

        def timed(name, fn):
            try:
                out[name] = _time(fn, h0, y0)
            except Exception as error:  # e.g. a capture a variant does not support
                out[name] = f"{type(error).__name__}: {str(error)[:200]}"

        flat = torch.nn.Linear(args.dim, args.labels).to(DEVICE)
        timed("flat_train", optimised_step(flat, torch.optim.Adagrad(flat.parameters(), lr=0.05), flat_loss))
        with torch.no_grad():
            timed("flat_test", lambda h, y: F.cross_entropy(flat(h), y))
        if cuda:
            # torch's Adagrad keeps its step count on the host: a graph needs a capturable optimiser
            graphed = torch.nn.Linear(args.dim, args.labels).to(DEVICE)
            graphed_step = optimised_step(graphed, torch.optim.Adam(graphed.parameters(), lr=1e-3, capturable=True),
                                          flat_loss)
            try:
                timed("flat_train_captured_adam", capture_step(graphed_step, h0, y0))
            except Exception as error:
                out["flat_train_captured_adam"] = f"{type(error).__name__}: {str(error)[:200]}"
        adaptive = AdaptiveSoftmaxBaseline(args.dim, args.labels).to(DEVICE)
        timed("adaptive_train", optimised_step(adaptive, torch.optim.Adagrad(adaptive.parameters(), lr=0.05),
                                               lambda m, h, y: m(h, y).loss))
        with torch.no_grad():
            timed("adaptive_test", lambda h, y: adaptive(h, y).loss)
        layer, optimizer = _tree_layer(tree, args.dim)
        timed("engine_train", _step(layer, optimizer))
        with torch.no_grad():
            timed("engine_test", lambda h, y: layer(h, y).loss)
        if cuda:
            timed("engine_train_captured", capture_step(_step(layer, optimizer), h0, y0))
        if report["fused_available"]:
            layer, optimizer = _tree_layer(tree, args.dim, fuse=True)
            timed("fused_train", _step(layer, optimizer))
            timed("fused_train_captured", capture_step(_step(layer, optimizer), h0, y0))
        return {name: round(ms, 4) if isinstance(ms, float) else ms for name, ms in out.items()}

    def lm_loop_captured():
        """The language-model training loop on the GPU, its step replayed from a CUDA graph, against the
        same run eager: one epoch of a learned 16-ary tree on a synthetic corpus (the train NLL and
        the test perplexity of both, and the ms per step)."""
        if not cuda:
            return "needs a GPU"
        import numpy as np

        from hsm_lab.data.lm import LMCorpus
        from hsm_lab.experiments.lm import LMRunConfig, train_lm

        rng = np.random.default_rng(0)
        stream = torch.from_numpy(rng.zipf(1.3, 60_000) % 4_000)
        words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(3_998)]
        corpus = LMCorpus(name="synthetic", vocab=words, train=stream[:50_000], valid=stream[50_000:55_000],
                          test=stream[55_000:], counts=np.bincount(stream[:50_000].numpy(), minlength=4_000))
        cfg = LMRunConfig(output="learned", context=3, dim=args.dim, arity=16, batch_size=args.batch,
                          lr=0.05, epochs=1, learn_epochs=1, reassign_per_epoch=5)
        tree = hsm.Tree.random(4_000, 16, 3, seed=0)
        out = {}
        for name, capture in (("captured", True), ("eager", False)):
            result = train_lm(corpus, cfg, tree=tree, device=DEVICE, capture=capture)
            out[name] = {"train_nll": result.epochs[-1]["train_nll"], "test_perplexity": result.test_perplexity,
                         "train_ms_per_batch": result.train_ms_per_batch}
        return out

    check("synchronisation", syncs)
    check("values", values)
    check("fused_equal", fused_equal)
    check("captured_equal", captured_equal)
    check("timings_ms", timings)
    check("lm_loop_captured", lm_loop_captured)
    if args.json is not None:
        report["provenance"] = provenance(config={k: str(v) for k, v in vars(args).items()}, scale="full")
        atomic_write(args.json, json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
