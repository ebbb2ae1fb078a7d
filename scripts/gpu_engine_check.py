"""The tree layer's static engine on a GPU: what the CPU tests cannot see.

    python scripts/gpu_engine_check.py [--labels 250000] [--arity 65] [--dim 200] [--batch 128]

Checks, each reported on its own line (and, when $OUT is set, in $OUT/gpu_engine_check.json):

* no host-device synchronisation in a training step and a test step (CUDA's own sync detector,
  ``torch.cuda.set_sync_debug_mode("error")``), and the op counts of :mod:`hsm._op_count`;
* the engine's values against ``forward_reference``; three steps of the fused Triton kernels
  against the engine with ``RowSparseAdagrad``; five replays of a captured step against eager steps;
* milliseconds per training step and per test step: the flat softmax (``nn.Linear`` +
  ``F.cross_entropy`` + ``torch.optim.Adagrad``), the engine eager, captured in a CUDA graph,
  fused (Triton), fused and captured.

Imports only torch and hsm; needs a CUDA device.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import traceback

import torch
import torch.nn.functional as F

import hsm
from hsm import fused
from hsm._op_count import OpCounter
from hsm.engine import capture_step


def _time(fn, *args, warmup: int = 5, repeats: int = 50) -> float:
    """Median milliseconds of ``fn(*args)``, by CUDA events."""
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _tree_layer(tree, dim, fuse=False):
    torch.manual_seed(0)
    layer = hsm.HierarchicalSoftmax(dim, tree, sparse=True, engine="torch").cuda()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=250_000)
    parser.add_argument("--arity", type=int, default=65)
    parser.add_argument("--dim", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script checks the engine on a GPU")
    report: dict = {"device": torch.cuda.get_device_name(), "args": vars(args),
                    "fused_available": fused.available()}
    tree = hsm.Tree.random(args.labels, args.arity, 3, seed=0)
    g = torch.Generator(device="cuda").manual_seed(0)
    batches = [(torch.randn(args.batch, args.dim, device="cuda", generator=g),
                torch.randint(0, args.labels, (args.batch,), device="cuda", generator=g)) for _ in range(8)]
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
        torch.cuda.synchronize()
        out = {}
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
        got = layer(h0, y0).output
        want = layer.forward_reference(h0, y0).output
        return {"max_abs_diff": float((got - want).abs().max())}

    def fused_equal():
        if not fused.available():
            return "triton not installed"
        (a, oa), (b, ob) = _tree_layer(tree, args.dim, fuse=True), _tree_layer(tree, args.dim)
        for h, y in batches[:3]:
            for layer, optimizer in ((a, oa), (b, ob)):
                _step(layer, optimizer)(h, y)
        return {"weight_max_rel": float(((a.weight - b.weight).abs().max() / b.weight.abs().max())),
                "state_max_rel": float(((oa.state[a.weight]["sum"] - ob.state[b.weight]["sum"]).abs().max()
                                        / ob.state[b.weight]["sum"].abs().max()))}

    def captured_equal():
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
        out = {}
        flat = torch.nn.Linear(args.dim, args.labels).cuda()
        flat_opt = torch.optim.Adagrad(flat.parameters(), lr=0.05, capturable=True)

        def flat_step(h, y):
            flat_opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(flat(h), y)
            loss.backward()
            flat_opt.step()
            return loss.detach()
        out["flat_train"] = _time(flat_step, h0, y0)
        with torch.no_grad():
            out["flat_test"] = _time(lambda h, y: F.cross_entropy(flat(h), y), h0, y0)
        layer, optimizer = _tree_layer(tree, args.dim)
        out["engine_train"] = _time(_step(layer, optimizer), h0, y0)
        with torch.no_grad():
            out["engine_test"] = _time(lambda h, y: layer(h, y).loss, h0, y0)
        out["engine_train_captured"] = _time(capture_step(_step(layer, optimizer), h0, y0), h0, y0)
        if fused.available():
            layer, optimizer = _tree_layer(tree, args.dim, fuse=True)
            out["fused_train"] = _time(_step(layer, optimizer), h0, y0)
            out["fused_train_captured"] = _time(capture_step(_step(layer, optimizer), h0, y0), h0, y0)
        return {name: round(ms, 4) for name, ms in out.items()}

    check("synchronisation", syncs)
    check("values", values)
    check("fused_equal", fused_equal)
    check("captured_equal", captured_equal)
    check("timings_ms", timings)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_engine_check.json"), "w") as handle:
            json.dump(report, handle, indent=1, default=str)


if __name__ == "__main__":
    main()
