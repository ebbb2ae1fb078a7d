"""The compiled trainer's experiments: the statistics/schedule ablation and the threaded repeats."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hsm_lab.experiments import classification_fast as CF
from hsm_lab.results import load_results

pytest.importorskip("numba")
TINY = {"train_limit": 400, "test_limit": 150, "epochs": 2}


def _rows(**fields):
    base = {"d": 50, "arity": 5}
    return dict(base, **fields)


def test_summary_pairs_each_learned_run_with_the_huffman_run_of_its_seed():
    rows = [_rows(variant="huffman", seed=0, p_at_1=50.0), _rows(variant="huffman", seed=1, p_at_1=40.0),
            _rows(variant="ours/first_half", seed=0, p_at_1=52.0), _rows(variant="ours/first_half", seed=1, p_at_1=39.0)]
    summary = {s["variant"]: s for s in CF.summarise_ablation(rows)}
    learned = summary["ours/first_half"]
    # paired by seed: +2 and -1, not the difference of the means alone
    assert learned["gain_mean"] == pytest.approx(0.5)
    assert learned["gain_sd"] == pytest.approx(math.sqrt(4.5))
    assert (learned["gain_min"], learned["gain_max"], learned["seeds_learned_above"]) == (-1.0, 2.0, 1)
    assert summary["huffman"]["p_at_1_mean"] == pytest.approx(45.0)
    assert "gain_mean" not in summary["huffman"]


def test_ablation_runs_every_seed_and_variant(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_THREADS", "1")
    out = CF.fast_ablation("quick", out=tmp_path / "ablation.json", seeds="0,1",
                           variants="ours/first_half,released/every_tokens", arities="5", **TINY)
    payload = load_results(out)
    runs = [r for r in payload["records"] if r["kind"] == "run"]
    assert sorted((r["seed"], r["variant"]) for r in runs) == sorted(
        (seed, v) for seed in (0, 1) for v in ("huffman", "ours/first_half", "released/every_tokens"))
    for r in runs:
        assert 0 <= r["p_at_1"] <= 100 and r["arity"] == 5
        if r["variant"] == "ours/first_half":  # 50 rebuilds in the first half whatever the data size
            assert r["reassigns"] == 50
        if r["variant"] != "huffman":
            assert (r["statistics"], r["schedule"]) == tuple(r["variant"].split("/")[:2])
    summaries = {s["variant"]: s for s in payload["records"] if s["kind"] == "summary"}
    huffman = {r["seed"]: r["p_at_1"] for r in runs if r["variant"] == "huffman"}
    learned = [r["p_at_1"] - huffman[r["seed"]] for r in runs if r["variant"] == "released/every_tokens"]
    assert summaries["released/every_tokens"]["gain_mean"] == pytest.approx(sum(learned) / 2)
    assert payload["provenance"]["config"]["seeds"] == [0, 1]
    assert not (tmp_path / ".ablation.json.partial.json").exists()


def test_a_stopped_ablation_resumes_from_its_finished_parts(tmp_path, monkeypatch):
    """Each (seed, variant) is a part of hsm_lab.results.ResumableParts: a run stopped in its third part
    keeps the first two, a run under other options ignores them, and the next run trains only the rest."""
    calls = []

    def fake_rows(config, seed, variant, arities, log, stop_at=None):
        calls.append((seed, variant))
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return [{"output": f"{'learned' if variant else 'huffman'}5", "arity": 5, "d": 50, "seed": seed,
                 "variant": variant or "huffman", "p_at_1": 40.0 + seed + (2.0 if variant else 0.0)}]

    options = dict(out=tmp_path / "ablation.json", seeds="0,1", variants="ours/first_half", arities="5", **TINY)
    partial = tmp_path / ".ablation.json.partial.json"
    monkeypatch.setattr(CF, "_ablation_rows", lambda *a: fake_rows(*a, stop_at=3))
    with pytest.raises(KeyboardInterrupt):
        CF.fast_ablation("quick", **options)
    assert list(json.loads(partial.read_text())["parts"]) == ["seed0/huffman", "seed0/ours/first_half"]
    saved = partial.read_text()

    calls.clear()  # other options (one more epoch): the saved parts are not taken
    monkeypatch.setattr(CF, "_ablation_rows", lambda *a: fake_rows(*a, stop_at=1))
    with pytest.raises(KeyboardInterrupt):
        CF.fast_ablation("quick", **dict(options, epochs=3))
    assert calls == [(0, None)] and partial.read_text() == saved

    calls.clear()
    monkeypatch.setattr(CF, "_ablation_rows", fake_rows)
    payload = load_results(CF.fast_ablation("quick", **options))
    assert calls == [(1, None), (1, "ours/first_half")]  # only the parts not done before
    runs = [r for r in payload["records"] if r["kind"] == "run"]
    assert [(r["seed"], r["variant"]) for r in runs] == [(0, "huffman"), (0, "ours/first_half"), (1, "huffman"),
                                                        (1, "ours/first_half")]
    learned = next(s for s in payload["records"] if s["kind"] == "summary" and s["variant"] == "ours/first_half")
    assert learned["gain_mean"] == pytest.approx(2.0)
    assert not partial.exists()  # removed once the result file is written


@pytest.mark.parametrize("options, message", [
    ({"seeds": "-1"}, "seeds"), ({"variants": "ours/sometimes"}, "variants"), ({"arities": "3"}, "arities"),
    ({"outputs": "flat"}, "set by the ablation"), ({"statistics": "released"}, "set by the ablation"),
    ({"lr_grid": "0"}, "lr_grid"),
])
def test_ablation_options_are_checked(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        CF.fast_ablation("quick", out=tmp_path / "a.json", **options)


def test_ablation_refuses_a_gpu(tmp_path):
    # without CUDA check_device says so; with it, the compiled trainer says it runs on the CPU
    with pytest.raises(ValueError, match="CPU|CUDA is not available"):
        CF.fast_ablation("quick", device="cuda", out=tmp_path / "a.json")


def test_repeats_records_a_crash_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_REPEATS_FAULT", "crash:1")
    out = CF.fast_repeats("quick", out=tmp_path / "r.json", configs="huffman20", repeats=3, threads=2, **TINY)
    records = load_results(out)["records"]
    assert [(r["run"], r["status"]) for r in records if r["kind"] == "run"] == [(0, "ok"), (1, "crash"), (2, "ok")]
    summary = next(r for r in records if r["kind"] == "summary")
    assert (summary["runs"], summary["ok"], summary["crash"], summary["failures"]) == (3, 2, 1, 1)
    assert 0 < summary["p_at_1_mean"] <= 100


def test_repeats_kills_a_hanging_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_REPEATS_FAULT", "hang:0")
    out = CF.fast_repeats("quick", out=tmp_path / "r.json", configs="huffman20", repeats=1, timeout_s=1,
                          startup_s=0, **TINY)
    records = load_results(out)["records"]
    assert [r["status"] for r in records if r["kind"] == "run"] == ["hang"]
    assert next(r for r in records if r["kind"] == "summary")["hang"] == 1


@pytest.mark.parametrize("options, message", [
    ({"configs": "learned7"}, "configs"), ({"repeats": "0"}, "repeats"), ({"threads": "0"}, "threads"),
    ({"timeout_s": "nan"}, "timeout_s"), ({"bogus": 1}, "unknown option"), ({"data": " "}, "data"),
])
def test_repeats_options_are_checked(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        CF.fast_repeats("quick", out=tmp_path / "r.json", **options)


@given(st.floats(0.0, 100.0), st.floats(0.0, 100.0), st.integers(2, 50))
def test_split_time_is_the_line_through_the_two_runs(fixed, per_epoch, epochs):
    one, many = fixed + per_epoch, fixed + epochs * per_epoch
    got_fixed, got_per_epoch = CF.split_time(one, many, epochs)
    assert got_fixed == pytest.approx(fixed, abs=1e-9) and got_per_epoch == pytest.approx(per_epoch, abs=1e-9)


def test_split_time_needs_two_epoch_counts():
    with pytest.raises(ValueError, match="epochs must be >= 2"):
        CF.split_time(1.0, 2.0, 1)


def test_time_split_times_every_row_at_one_and_e_epochs(tmp_path):
    out = CF.fast_time_split("quick", out=tmp_path / "split.json", threads="1", outputs="huffman5", peers="",
                             train_limit=400, test_limit=150, epochs=3)
    records = load_results(out)["records"]
    runs = [(r["output"], r["epochs"]) for r in records if r["kind"] == "run"]
    assert runs == [("huffman5", 1), ("huffman5", 3)]
    split = next(r for r in records if r["kind"] == "split")
    times = {e: r["train_seconds"] for r in records if r["kind"] == "run" for e in [r["epochs"]]}
    assert split["fixed_seconds"] + split["seconds_per_epoch"] == pytest.approx(times[1])
    assert split["fixed_seconds"] + 3 * split["seconds_per_epoch"] == pytest.approx(times[3])
    with pytest.raises(ValueError, match="epochs must be >= 2"):
        CF.fast_time_split("quick", out=tmp_path / "x.json", epochs=1)


def test_depth_limit_runs_stay_out_of_the_main_tables():
    """The single-thread depth-limit runs repeat the Huffman and learned 20-ary rows: the main
    tables (fast_runs) must keep their own two-thread runs, and the depth-limit table shows every row."""
    from hsm_lab.experiments import classification as C

    main, depth = C.fast_runs("cooking", 50), C.depth_limit_runs("cooking")
    assert "learned20-fixed-depth" not in main and set(depth) == set(C.DEPTH_LIMIT_OUTPUTS)
    assert main["learned20"][1]["p_at_1"] != depth["learned20"][1]["p_at_1"]
    table = C.depth_limit_markdown({"cooking": depth}).splitlines()
    assert len(table) == 2 + len(C.DEPTH_LIMIT_OUTPUTS) and table[2].endswith("| 1.00 - 1.00 |")
    assert all(row["expected_depth"] == 3.0 for row in depth["learned20-fixed-depth"].values())
