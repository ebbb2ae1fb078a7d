"""hsm_lab.experiments.lm_timing: the timing experiment's code path and result file (not its timings)."""
import json
from pathlib import Path

import pytest

from hsm_lab import config
from hsm_lab.experiments import lm_timing

MIRROR = config.data_mirror()
needs_ptb = pytest.mark.skipif(MIRROR is None or not (MIRROR / "ptb").exists(),
                               reason="PTB unavailable: set HSM_DATA_MIRROR to the data mirror")


@needs_ptb
def test_lm_timing_quick_writes_every_output_and_the_ratios(tmp_path):
    out = lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", steps="3", warmup="1", test_batches="2")
    payload = json.loads(Path(out).read_text())
    records = payload["records"]
    outputs = {(r["output"], r["measure"]) for r in records if "output" in r}
    assert outputs == {(o, m) for o in lm_timing.OUTPUTS for m in ("train_ms_per_batch", "test_ms_per_batch")}
    assert all(r["value"] > 0 for r in records)
    assert all(r["claim"] is None for r in records)  # a capped vocabulary is not the paper's data
    learned = next(r for r in records if r.get("output") == "learned" and r["measure"] == "train_ms_per_batch")
    assert learned["reassign_s"] > 0 and learned["train_ms_per_batch"] > learned["train_step_ms"]
    ratios = {r["measure"]: r["value"] for r in records if r["measure"].startswith("speedup")}
    flat = {r["measure"]: r["value"] for r in records if r.get("output") == "flat"}
    assert ratios["speedup_train"] == pytest.approx(flat["train_ms_per_batch"] / learned["train_ms_per_batch"])
    assert payload["provenance"]["config"]["steps"] == 3


def test_lm_timing_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="unknown option"):
        lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", epochs="3")
    with pytest.raises(ValueError, match="unknown tables"):
        lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", tables="nope")
    with pytest.raises(ValueError, match="scale"):
        lm_timing.run_lm_timing(scale="huge", out=tmp_path / "t.json")
    with pytest.raises(ValueError, match="capture=true replays CUDA graphs: it needs --device cuda, not cpu"):
        lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", capture="true")
    with pytest.raises(ValueError, match="capture replays a CUDA graph: it needs a GPU"):
        lm_timing.time_language_model(None, "learned", 13, 4, 50, 10_000, 1, 0, 1, capture=True)


@needs_ptb
def test_lm_timing_records_phases_cost_floor_and_the_adaptive_baseline(tmp_path):
    """Every output has the step split into PHASES (statistics only for the learned tree), its
    cost and floor; the adaptive softmax records its configuration and the learned tree's
    speed-up over it is the ratio of the two rows."""
    out = lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", steps="2", warmup="1", test_batches="1",
                                  phase_steps="2")
    payload = json.loads(Path(out).read_text())
    rows = {r["output"]: r for r in payload["records"] if r.get("measure") == "train_ms_per_batch"}
    assert set(rows) == set(lm_timing.OUTPUTS) and "adaptive" in rows
    for output, row in rows.items():
        assert set(row["phases_ms"]) == set(lm_timing.PHASES) | {"total"}
        assert all(v >= 0 for v in row["phases_ms"].values())
        assert (row["phases_ms"]["statistics"] > 0) == (output == "learned")
        assert row["floor"]["overlapped_ms"] <= row["floor"]["phases_ms"] + 1e-9
        assert row["cost"]["bytes"] > 0 and row["cost"]["flops"] > 0
    assert rows["adaptive"]["cutoffs"] == [500] and rows["adaptive"]["div_value"] == 4.0  # 2,000 words: V / 4
    assert rows["random"]["unique_nodes"] >= 1 and rows["flat"]["unique_nodes"] is None
    vs_adaptive = next(r for r in payload["records"] if r["measure"] == "speedup_train_vs_adaptive")
    assert vs_adaptive["claim"] is None
    assert vs_adaptive["value"] == pytest.approx(rows["adaptive"]["train_ms_per_batch"] / rows["learned"]["train_ms_per_batch"])
    machine = payload["provenance"]["config"]["machine"]
    assert machine["bandwidth_gbs"] > 0 and machine["matmul_gflops"] > 0


def test_step_cost_and_floor_by_hand():
    """The whole step's cost: the model's products and passes plus the bench's layer cost."""
    from hsm_lab import bench

    cost = lm_timing.step_cost("learned", 1000, 10, 8, 2, arity=10, unique_nodes=5.0, unique_words=12.0)
    assert cost["model_flops"] == 6 * 8 * 2 * 10 * 10
    assert cost["model_bytes"] == 7 * (12 * 10 + 2 * 10 * 10) * 4
    layer = bench.cost_model("tree-d3", 1000, 10, 8, 10, 5.0, 24)["train_adagrad"]
    assert cost["layer_bytes"] == layer["bytes"] and cost["layer_flops"] == layer["flops"]
    assert cost["statistics_bytes"] == 2 * 8 * 3 * 10 * 4
    assert cost["bytes"] == cost["model_bytes"] + cost["layer_bytes"] + cost["statistics_bytes"]
    floor = lm_timing.step_floor(cost, bandwidth_gbs=1.0, matmul_gflops=1.0)  # 1 byte/ns, 1 FLOP/ns
    assert floor["overlapped_ms"] == pytest.approx(max(cost["bytes"], cost["flops"]) / 1e6)
    assert floor["phases_ms"] == pytest.approx(floor["model_ms"] + floor["layer_ms"])
    assert lm_timing.step_cost("random", 1000, 10, 8, 2, 10, 5.0, 12.0)["statistics_bytes"] == 0
    with pytest.raises(ValueError, match="output"):
        lm_timing.step_cost("sampled", 1000, 10, 8, 2)


def test_adaptive_cutoffs_of_the_timing_and_the_benchmark():
    """The adaptive baseline: 2k/20k/100k below V (a tail that would get no dimension dropped);
    the first committed runs' configuration stays the function's default (bench method adaptive-x5)."""
    from hsm_lab import bench, output_layers

    assert output_layers.adaptive_cutoffs(250_000, 200, base=output_layers.ADAPTIVE_CUTOFFS) == [2_000, 20_000, 100_000]
    assert output_layers.adaptive_cutoffs(10_000, 200, base=output_layers.ADAPTIVE_CUTOFFS) == [2_000]
    assert output_layers.adaptive_cutoffs(2_000, 200, base=output_layers.ADAPTIVE_CUTOFFS) == [500]
    assert output_layers.adaptive_cutoffs(250_000, 200) == [2_000, 10_000, 50_000]
    assert "adaptive-x5" in bench.METHODS
    with pytest.raises(ValueError, match="increasing"):
        output_layers.adaptive_cutoffs(250_000, 200, base=[20_000, 2_000])
    with pytest.raises(ValueError, match="phase_steps"):
        lm_timing.run_lm_timing(scale="quick", phase_steps="-1")
