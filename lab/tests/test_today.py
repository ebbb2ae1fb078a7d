"""Tests for hsm_lab.experiments.classification.today (experiment ``today-tools``): today's label-tree
libraries and fastText with bigrams side by side.

The end-to-end run uses a few hundred cooking questions and one fastText setting: it checks the
result file's structure, not accuracy or timings. A library that is not installed is skipped.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hsm_lab.experiments import classification as C
from hsm_lab.experiments.classification import today as T
from hsm_lab.results import load_results, provenance, write_results

MIRROR = os.environ.get("HSM_DATA_MIRROR") or (
    str(Path(__file__).resolve().parents[3] / "shared" / "data")
    if (Path(__file__).resolve().parents[3] / "shared" / "data" / "cooking").is_dir() else None)
needs_cooking = pytest.mark.skipif(MIRROR is None, reason="no data mirror (HSM_DATA_MIRROR) with cooking")

TINY_DATA = dict(data="cooking", train_limit="300", test_limit="100")
TINY = dict(TINY_DATA, lr_grid="0.5", epoch_grid="5")


def _gold(labels: list[list[int]], num_labels: int) -> C.EncodedSplit:
    values = np.array([t for row in labels for t in row], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in labels])]).astype(np.int64)
    return C.EncodedSplit(np.zeros(0, np.int64), np.zeros(len(labels) + 1, np.int64), values, offsets, num_labels)


def test_precision_at_k_by_hand():
    test = _gold([[0, 1], [2], [1, 2, 3]], num_labels=6)
    top = [[1, 4, 0, 5, 3], [5, 2, 0, 1, 3], [0]]  # the last method returned a single label
    assert T.precision_at_k(top, test, 1) == pytest.approx(100 * 1 / 3)  # only the first top label is right
    # hits among the top 5: 2 (labels 1 and 0), 1 (label 2), 0 -> (2 + 1 + 0) / 5 / 3
    assert T.precision_at_k(top, test, 5) == pytest.approx(100 * 3 / 15)
    # P@1 is the chapter's P@1
    assert T.precision_at_k(top, test, 1) == pytest.approx(C._precision_recall(np.array([1, 5, 0]), test)["p_at_1"])


def test_precision_at_k_refuses_a_bad_k_or_missing_predictions():
    test = _gold([[0], [1]], num_labels=2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        T.precision_at_k([[0], [1]], test, 0)
    with pytest.raises(ValueError, match="1 predictions for 2 test examples"):
        T.precision_at_k([[0]], test, 1)


def test_xc_file_of_a_document_without_features_is_read_by_omikuji(tmp_path):
    import scipy.sparse as sp

    x = sp.csr_matrix(np.array([[0.6, 0.0, 0.8], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32))
    labels = _gold([[0, 2], [1], [1]], num_labels=3)
    path = tmp_path / "train.txt"
    T._write_xc_file(path, x, labels)
    assert path.read_text().splitlines() == ["3 3 3", "0,2 0:0.6 2:0.8", "1", "1 1:1"]
    omikuji = pytest.importorskip("omikuji")
    with T._library_output_to(tmp_path / "log.txt"):
        model = omikuji.Model.train_on_data(str(path), omikuji.Model.default_hyper_param(), n_threads=1)
    assert model.n_features == 3


@pytest.mark.parametrize("options, message", [
    ({"data": "yfcc"}, "option data='yfcc': must be one of cooking, gutenberg-books"),
    ({"methods": "omikuji-parabel,liblinear"}, "unknown liblinear"),
    ({"methods": ""}, "must name at least one"),
    ({"seeds": "0,-1"}, "option seeds"),
    ({"seeds": "1,1"}, "names a seed twice"),
    ({"threads": "0"}, "must be >= 1"),
    ({"lr_grid": "0.5,-1"}, "option lr_grid"),
    ({"train_limit": "1.5"}, "must be an integer"),
    ({"epochs": "5"}, "unknown option 'epochs'"),
    ({"single_seed": "omikuji-bonsia"}, "unknown omikuji-bonsia"),
    # a known method that does not run must not be reported as run with one seed
    ({"methods": "hsm-sparse-flat", "single_seed": "hsm-sparse-kmeans"}, "hsm-sparse-kmeans not in methods"),
    ({"single_seed": "hsm-sparse-ovr"}, "hsm-sparse-ovr not in methods"),  # an ablation, not run by default
])
def test_options_are_checked_before_any_work(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        T.today_tools("quick", out=tmp_path / "x.json", **options)
    assert not (tmp_path / "x.json").exists()


def test_a_bad_scale_or_a_gpu_is_refused(tmp_path):
    with pytest.raises(ValueError, match="scale must be"):
        T.today_tools("Quick", out=tmp_path / "x.json")
    with pytest.raises(ValueError, match="device"):
        T.today_tools("quick", device="cuda", out=tmp_path / "x.json")


def test_the_experiment_is_registered():
    from hsm_lab.experiments import get

    assert get("today-tools").func is T.today_tools


@needs_cooking
def test_quick_run_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("fasttext")
    pytest.importorskip("omikuji")
    pytest.importorskip("napkinxc")
    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    out = T.today_tools("quick", out=tmp_path / "today.json", seeds="0,1", **TINY)
    payload = load_results(out)
    records = payload["records"]
    runs = {}
    for record in records:
        runs.setdefault(record["method"], []).append(record["seed"])
        assert 0.0 <= record["p_at_5"] <= 100.0 and 0.0 <= record["p_at_1"] <= 100.0
        assert record["train_seconds"] > 0 and record["predict_ms_per_example"] > 0 and record["model_bytes"] > 0
        assert record["train_examples"] == 300 and record["test_examples"] == 100 and record["threads"] == 2
    # every method at every seed, but the deterministic one-vs-rest once
    assert runs == {m: [0] if m == "napkinxc-ovr" else [0, 1] for m in T.DEFAULT_METHODS}
    fasttext = [r for r in records if r["method"] == "fasttext-bigrams"][0]
    assert fasttext["settings"]["wordNgrams"] == 2 and set(fasttext["valid_p_at_1"]) == {"lr=0.5,epoch=5"}
    assert "picked on validation" in fasttext["settings_chosen"]
    assert all("not tuned" in r["settings_chosen"] for r in records
               if not r["method"].startswith(("fasttext", "hsm")))
    ours = [r for r in records if r["method"].startswith("hsm-sparse")]
    assert ours and all(set(r["valid_p_at_1"]) == {f"lr={lr:g}" for lr in T.TodayConfig.sparse_lr_grid} for r in ours)
    learned = [r for r in ours if r["method"] == "hsm-sparse-learned-kmeans"][0]
    assert learned["settings"]["rebuilds"] == 50 and learned["start_mean_depth"] == 2.0
    summary = payload["provenance"]["data_summary"]
    assert summary["num_features"] > 0 and summary["feature_seconds"] > 0


@needs_cooking
def test_our_rate_is_picked_once_when_shared_and_single_seed_methods_run_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    out = T.today_tools("quick", out=tmp_path / "t.json", seeds="0,1", methods="hsm-sparse-kmeans,hsm-sparse-flat",
                        sparse_pick="first", single_seed="hsm-sparse-flat", **TINY)
    records = load_results(out)["records"]
    assert [(r["method"], r["seed"]) for r in records] == [("hsm-sparse-kmeans", 0), ("hsm-sparse-kmeans", 1),
                                                           ("hsm-sparse-flat", 0)]
    assert records[2]["valid_p_at_1"] == records[0]["valid_p_at_1"]  # picked on the k-means tree, shared
    assert records[2]["seeds_note"].startswith("run with the first seed only")


def _missing(*methods: str):
    """A stand-in for :func:`~T.method_available`: ``methods`` are not installed."""
    return lambda m: f"{m.split('-')[0]} is not installed; pip install {m.split('-')[0]}" if m in methods else None


def _no_data(name: str):
    raise AssertionError("the data were loaded")


def test_when_no_method_asked_for_can_run_nothing_is_loaded_or_written(tmp_path, monkeypatch, capsys):
    from hsm_lab.experiments.cli import main

    monkeypatch.setattr(T, "method_available", _missing("napkinxc-plt", "omikuji-bonsai"))
    monkeypatch.setattr(T, "load_classification_data", _no_data)
    with pytest.raises(ValueError, match="none of them can run here: napkinxc is not installed; pip install "
                                         "napkinxc; omikuji is not installed; pip install omikuji"):
        T.today_tools("quick", out=tmp_path / "today.json", methods="napkinxc-plt,omikuji-bonsai", **TINY_DATA)
    assert main(["today-tools", "--out", str(tmp_path / "today.json"), "-o", "methods=napkinxc-plt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hsm run today-tools: ") and "pip install napkinxc" in err and err.count("\n") == 1
    assert not (tmp_path / "today.json").exists()


def _finished_file(path: Path, methods: tuple[str, ...]) -> bytes:
    records = [{"method": m, "data": "cooking", "seed": 0, "p_at_1": 50.0} for m in methods]
    write_results(path, records, provenance(config={}, scale="quick"))
    return path.read_bytes()


def test_a_file_with_finished_methods_this_run_would_drop_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "method_available", _missing("napkinxc-plt"))
    monkeypatch.setattr(T, "load_classification_data", _no_data)
    out = tmp_path / "today.json"
    before = _finished_file(out, ("hsm-sparse-flat", "napkinxc-plt", "hsm-sparse-kmeans"))
    # napkinxc-plt is asked for but not installed here, hsm-sparse-kmeans not asked for
    with pytest.raises(ValueError, match=r"holds finished results of napkinxc-plt, hsm-sparse-kmeans, which this "
                                         r"run would not write \(napkinxc is not installed; pip install "
                                         r"napkinxc\); .*--force"):
        T.today_tools("quick", out=out, methods="hsm-sparse-flat,napkinxc-plt", **TINY_DATA)
    with pytest.raises(ValueError, match=r"hsm-sparse-kmeans, which this run would not write \(not in methods\)"):
        T.today_tools("quick", out=out, methods="hsm-sparse-flat,hsm-sparse-huffman", **TINY_DATA)
    assert out.read_bytes() == before


@needs_cooking
def test_a_missing_library_is_skipped_and_the_rest_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    monkeypatch.setattr(T, "method_available", _missing("napkinxc-plt"))
    out = tmp_path / "today.json"
    _finished_file(out, ("hsm-sparse-flat", "napkinxc-plt"))
    # replacing the finished napkinxc-plt results is asked for explicitly
    out = T.today_tools("quick", out=out, force=True, methods="napkinxc-plt,hsm-sparse-flat", seeds="0,1",
                        single_seed="napkinxc-plt,hsm-sparse-flat", sparse_lr_grid="1", sparse_epochs="1", **TINY_DATA)
    payload = load_results(out)
    records = payload["records"]
    assert [(r["method"], r.get("seed")) for r in records] == [("napkinxc-plt", None), ("hsm-sparse-flat", 0)]
    assert records[0]["skipped"] == "napkinxc is not installed; pip install napkinxc"
    assert payload["provenance"]["skipped_methods"] == {"napkinxc-plt": records[0]["skipped"]}
    # the label names the method that ran with one seed, not the one that did not run
    label = payload["provenance"]["hsm_scale"]
    assert "one seed for hsm-sparse-flat" in label and "napkinxc" not in label


@needs_cooking
def test_a_limit_above_the_split_is_no_reduction(tmp_path, monkeypatch):
    from hsm_lab.experiments.classification.data import _subset_rows

    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    real = T.load_classification_data
    # a 300/100 split, so that limits above it run every row
    monkeypatch.setattr(T, "load_classification_data",
                        lambda name: _subset_rows(_subset_rows(real(name), 300, "train", 0), 100, "test", 1))
    out = T.today_tools("full", out=tmp_path / "today.json", methods="hsm-sparse-flat", train_limit="1000000",
                        test_limit="100", sparse_lr_grid="1", sparse_epochs="1", data="cooking")
    payload = load_results(out)
    assert payload["provenance"]["hsm_scale"] == "full"
    assert [(r["train_examples"], r["test_examples"]) for r in payload["records"]] == [(300, 100)] * 3
    out = T.today_tools("full", out=tmp_path / "cut.json", methods="hsm-sparse-flat", train_limit="1000000",
                        test_limit="50", seeds="0,1,2", sparse_lr_grid="1", sparse_epochs="1", data="cooking")
    assert load_results(out)["provenance"]["hsm_scale"] == (
        "full, reduced: all 300 training examples; test_limit=50 of 100 test examples (a seeded subset)")


def test_the_scale_label_names_every_reduction():
    full = T.TodayConfig()
    assert T.today_scale_label("full", full) == "full"
    cut = T.TodayConfig(data="gutenberg-books", test_limit=20000, single_seed=("omikuji-bonsai",), lr_grid=(1.0,),
                        epoch_grid=(5,))
    label = T.today_scale_label("full", cut, 396249, 98734)
    assert label.startswith("full, reduced: all 396,249 training examples; test_limit=20000 of 98,734 test")
    assert "one seed for omikuji-bonsai" in label and "fastText grid lr=1 x epoch=5" in label
    # limits at or above a split's size cut nothing
    whole = T.TodayConfig(train_limit=396249, test_limit=10**9)
    assert T.today_scale_label("full", whole, 396249, 98734) == "full"
    assert T.today_scale_label("full", replace(whole, train_limit=1000), 396249, 98734) == (
        "full, reduced: train_limit=1000 of 396,249 training examples")
    # a method that did not run is named nowhere
    assert T.today_scale_label("full", cut, 396249, 98734, ran=("hsm-sparse-flat",)) == (
        "full, reduced: all 396,249 training examples; test_limit=20000 of 98,734 test examples (a seeded subset)")


@needs_cooking
def test_the_ablations_of_ours_run_and_say_what_they_changed(tmp_path: Path) -> None:
    methods = ("hsm-sparse-kmeans", "hsm-sparse-refit-kmeans", "hsm-sparse-learned-kmeans-fixed-depth",
               "hsm-sparse-learned-kmeans-fresh-steps", "hsm-sparse-plt-kmeans", "hsm-sparse-ovr")
    out = T.today_tools("quick", out=tmp_path / "ablations.json", methods=",".join(methods), threads="1",
                        sparse_lr_grid="1", **{k: v for k, v in TINY.items() if k not in ("lr_grid", "epoch_grid")})
    runs = {r["method"]: r for r in load_results(out)["records"]}
    assert set(runs) == set(methods) and all(m in T.ABLATIONS and m not in T.DEFAULT_METHODS for m in methods[1:])
    assert runs["hsm-sparse-kmeans"]["labels_moved_from_start"] is None
    assert 0 <= runs["hsm-sparse-refit-kmeans"]["labels_moved_from_start"] <= 1
    fixed = runs["hsm-sparse-learned-kmeans-fixed-depth"]
    assert fixed["mean_depth"] == fixed["start_mean_depth"] == 2.0 and fixed["settings"]["depth"] == "fixed"
    assert runs["hsm-sparse-learned-kmeans-fresh-steps"]["settings"]["changed_nodes"] == "fresh_steps"
    assert runs["hsm-sparse-plt-kmeans"]["settings"]["node_loss"] == "binary"
    assert runs["hsm-sparse-ovr"]["mean_depth"] is None and runs["hsm-sparse-ovr"]["valid_p_at_1"] == {}
