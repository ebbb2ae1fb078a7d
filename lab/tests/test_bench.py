"""hsm_lab.bench: the benchmark's table structure and cost model (no timings are checked)."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hsm_lab import bench, output_layers


def test_quick_benchmark_writes_a_complete_table(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--quick", "--vocab", "300", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "speed-up over flat" in printed and "floor ms" in printed
    data = json.loads(out.read_text())
    assert data["provenance"]["config"]["quick"] is True
    timed = [r for r in data["records"] if r.get("kind") == "ms_per_batch"]
    methods = {r["method"] for r in timed}
    assert methods == set(bench.METHODS)
    for record in timed:
        assert record["vocab"] == 300 and record["value"] > 0 and record["floor_ms"] > 0
        assert math.isclose(record["floor_fraction"], record["floor_ms"] / record["value"], rel_tol=1e-9)
        assert record["metric"] in bench.METRICS + ("train_sgd_torch", "train_adagrad_torch")
    flat = {r["metric"]: r for r in timed if r["method"] == "flat"}
    assert all(r["speedup_vs_flat"] == pytest.approx(1.0) for r in flat.values())
    trees = [r for r in timed if r["method"].startswith("tree")]
    assert {r["metric"] for r in trees} == set(bench.METRICS) | {"train_sgd_torch", "train_adagrad_torch"}
    assert all(r["arity"] ** r["depth"] >= 300 and r["unique_nodes"] >= 1 for r in trees)
    if Path("/proc/stat").exists():  # CPU time the hypervisor gave to others, a share of the wall time
        assert all(0.0 <= r["steal_fraction"] <= 1.0 for r in timed)
    assert any(r["kind"] == "bandwidth_gbs" and r["value"] > 0 for r in data["records"])


def test_tree_arity_and_cutoffs():
    assert bench.tree_arity(250_000, 3) == 63 and bench.tree_arity(250_000, 2) == 500
    assert bench.tree_arity(1_000_000, 3) == 100
    with pytest.raises(ValueError):
        bench.tree_arity(1, 3)
    assert output_layers.adaptive_cutoffs(250_000, 512) == [2_000, 10_000, 50_000, 200_000]
    assert output_layers.adaptive_cutoffs(250_000, 200) == [2_000, 10_000, 50_000]  # a 4th tail would get 200 // 256 = 0 dims
    assert output_layers.adaptive_cutoffs(500) == [125]
    for vocab, dim in ((250_000, 200), (1_000_000, 200), (250_000, 512), (10_000, 16)):
        layer = torch.nn.AdaptiveLogSoftmaxWithLoss(dim, vocab, output_layers.adaptive_cutoffs(vocab, dim), div_value=4.0)
        assert all(tail[0].out_features >= 1 for tail in layer.tail)


def test_zipf_targets_are_skewed_and_in_range():
    batches = bench.zipf_targets(1000, 4000, 2, seed=1)
    y = torch.cat(batches)
    assert int(y.min()) >= 0 and int(y.max()) < 1000
    # p(rank 0) = 1 / H_1000 ~ 0.13; the top label is far above uniform
    assert 0.09 < float((y == 0).float().mean()) < 0.17


def test_cost_model_tree_is_cheaper_than_flat():
    tree = bench.cost_model("tree-d3", 250_000, 200, 128, 63, unique_nodes=180, pairs=384)
    flat = bench.cost_model("flat", 250_000, 200, 128, None, 0, 0)
    adaptive = bench.cost_model("adaptive", 250_000, 200, 128, None, 0, 0, parameters=3_000_000)
    assert adaptive["logprob"]["bytes"] < flat["logprob"]["bytes"]
    for metric in bench.METRICS:
        assert tree[metric]["bytes"] < flat[metric]["bytes"] / 10
    assert tree["train"]["bytes"] == 2 * 180 * 63 * 200 * 4


def test_run_one_rejects_unknown_method():
    with pytest.raises(ValueError, match="unknown method"):
        bench.run_one({"method": "nope", "vocab": 10, "dim": 4, "batch": 2})


def test_algorithm1_overhead_and_profile_report_their_parts(tmp_path):
    result = bench.algorithm1_overhead(vocab=600, arity=9, depth=3, dim=8, batch=16, steps=3, repeats=1,
                                       well_formed_vocab=300, well_formed_arity=4)
    assert result["step_fixed_ms"] > 0 and result["step_with_statistics_ms"] > 0
    assert result["reassign_total_s"] > 0 and result["assign_s"] > 0 and result["well_formed_assign_s"] > 0
    assert [s["reassign_per_epoch"] for s in result["schedules"]] == [20, 50]
    for sched in result["schedules"]:
        assert sched["total_overhead"] == pytest.approx(result["statistics_overhead"] + sched["reassign_overhead"])
    assert "Algorithm 2" in bench.format_algorithm1(result)
    rows = bench.profile_train_step(vocab=500, dim=8, batch=8, steps=2, top=5)
    assert rows[-1]["op"] == "total" and len(rows) <= 6
    assert sum(r["share"] for r in rows[:-1]) <= 1.0 + 1e-9
    assert {"hsm.forward", "hsm.backward", "hsm.optimizer"} <= set(rows[-1]["phases_ms"])


def test_trials_take_the_median_of_the_processes_medians(monkeypatch):
    """--trials N: every measurement N times, round after round; the row holds the median and
    each trial's value."""
    values = iter([3.0, 1.0, 10.0, 30.0, 2.0, 20.0])  # trial 1: flat, tree; trial 2; trial 3
    calls = []

    def fake_run_one(config):
        calls.append(config["method"])
        ms = next(values)
        row = {"vocab": config["vocab"], "method": config["method"], "ms": {"train": ms}, "cpu_ms": {"train": ms},
               "peak_mb": ms, "parameters": 10}
        if config["method"] != "flat":
            row.update(arity=4, depth=2, unique_nodes=3.0, pairs=16.0)
        return row

    monkeypatch.setattr(bench, "run_one", fake_run_one)
    result = bench.run_benchmark([16], ["flat", "tree-d2"], dim=4, batch=8, repeats=1, budget_s=0.1,
                                 isolate=False, trials=3, metrics=["train"])
    assert calls == ["flat", "tree-d2"] * 3  # round after round
    flat, tree = result["rows"]
    assert flat["ms"]["train"] == 3.0 and flat["ms_trials"]["train"] == [3.0, 10.0, 2.0]
    assert tree["ms"]["train"] == 20.0 and tree["peak_mb"] == 30.0
    assert tree["speedup_vs_flat"]["train"] == pytest.approx(3.0 / 20.0)
    with pytest.raises(ValueError, match="trials"):
        bench.run_benchmark([16], ["flat"], dim=4, batch=8, repeats=1, budget_s=0.1, isolate=False, trials=0)


def test_one_factory_builds_every_output_layer():
    """hsm_lab.output_layers.output_layer: the experiments' and the benchmark's layers, zero-initialised on
    request, the adaptive baseline's cutoffs a setting; bad kinds are one-line errors."""
    import hsm

    tree = hsm.Tree.huffman(np.arange(1, 31), 3)
    flat = output_layers.output_layer("flat", 6, 30, zero=True)
    assert isinstance(flat, hsm.FlatSoftmax) and not flat.linear.weight.any() and not flat.linear.bias.any()
    layer = output_layers.output_layer("tree", 6, 30, tree=tree, sparse=True, zero=True)
    assert isinstance(layer, hsm.HierarchicalSoftmax) and layer.sparse and not layer.weight.any()
    adaptive = output_layers.output_layer("adaptive", 32, 30, cutoffs=(10, 20))
    assert adaptive.adaptive.cutoffs == [10, 20, 30] and adaptive.rank is None
    with pytest.raises(ValueError, match="needs its tree"):
        output_layers.output_layer("tree", 6, 30)
    with pytest.raises(ValueError, match="unknown output layer 'huffman'"):
        output_layers.output_layer("huffman", 6, 30)
    with pytest.raises(ValueError, match="zero initialisation is for the flat and tree layers"):
        output_layers.output_layer("adaptive", 32, 30, zero=True)
    with pytest.raises(ValueError, match="one count per label"):
        output_layers.AdaptiveSoftmaxBaseline(8, 30, counts=np.ones(5))


def test_decoding_benchmark_rows_and_result_file(tmp_path, capsys):
    from hsm_lab import bench_decoding
    from hsm_lab.results import load_results

    result = bench_decoding.run_decoding([60], bench_decoding.METHODS, dim=4, batch=3, threads=[1], repeats=1,
                                         budget_s=0.01)
    rows = {row["method"]: row for row in result["rows"]}
    assert set(rows) == set(bench_decoding.METHODS)
    assert set(rows["tree-d2"]["ms"]) == set(bench_decoding.METRICS)
    assert set(rows["flat"]["ms"]) == {"top1", "top5", "logprob"}
    assert rows["flat"]["vs_flat"] == pytest.approx({"top1": 1.0, "top5": 1.0, "logprob": 1.0})
    assert rows["tree-d3"]["weight_scale"] == 10.0 and rows["tree-d3"]["top5_nodes_visited"] >= 1
    assert "| 60 | 1 | tree-d2 |" in bench_decoding.format_table(result)

    out = tmp_path / "decoding.json"
    assert bench_decoding.main(["--quick", "--vocab", "40", "--dim", "4", "--batch", "2", "--repeats", "1",
                                "--methods", "tree-d2", "flat", "--json", str(out)]) == 0
    payload = load_results(out)
    assert payload["provenance"]["invocation"]["command"] == "bench-decoding"
    assert "--json" not in payload["provenance"]["invocation"]["argv"]
    assert {(r["method"], r["metric"]) for r in payload["records"]} >= {("tree-d2", "top5"), ("flat", "top5")}
    assert all(r["kind"] == "ms_per_batch" and r["value"] > 0 for r in payload["records"])


def test_decoding_benchmark_refuses_bad_options(capsys):
    from hsm_lab import bench_decoding

    with pytest.raises(SystemExit) as exit_info:
        bench_decoding.main(["--vocab", "1"])
    assert exit_info.value.code == 2
    assert "--vocab" in capsys.readouterr().err


def test_the_engine_check_dry_runs_on_the_cpu(tmp_path, capsys):
    """``python -m hsm_lab.engine_check --device cpu``: the GPU check's steps on a CPU, tiny sizes."""
    from hsm_lab import engine_check

    out = tmp_path / "check.json"
    assert engine_check.main(["--device", "cpu", "--labels", "300", "--arity", "7", "--dim", "8", "--batch", "16",
                              "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["synchronisation"]["ops"]["train_syncs"] == 0 and report["synchronisation"]["ops"]["test_syncs"] == 0
    assert report["values"]["max_abs_diff"] < 1e-4
    assert {"flat_train", "adaptive_train", "engine_train", "engine_test"} <= set(report["timings_ms"])
    assert report["provenance"]["config"]["device"] == "cpu"
    assert report["lm_loop_captured"] == "needs a GPU"  # a CUDA graph: the dry run names what it skips


def test_a_result_file_that_cannot_be_written_names_json_not_out(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert bench.main(["--quick", "--json", str(blocker / "b.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "choose another --json" in err and "--out" not in err
