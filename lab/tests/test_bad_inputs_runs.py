"""Reliability of the experiment runs: an interrupted re-run never costs a finished result, a
result's side files belong to that result alone, damaged result files never reach the book, and
an unusable destination is refused before any work."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hsm_lab import report, results
from hsm_lab.experiments import classification as C
from hsm_lab.experiments import taxonomy as T

MIRROR = Path(os.environ.get("HSM_DATA_MIRROR", Path(__file__).resolve().parents[3] / "shared" / "data"))
needs_trec = pytest.mark.skipif(not (MIRROR / "trec").exists(), reason="data mirror not available")
needs_cooking = pytest.mark.skipif(not (MIRROR / "cooking").exists(), reason="data mirror not available")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    monkeypatch.delenv("HSM_OUTPUT", raising=False)
    monkeypatch.delenv("HSM_SCALE", raising=False)


def _prov(complete: bool | None = None, scale: str = "quick") -> dict:
    config = {} if complete is None else {"complete": complete}
    return {"date_utc": "2026-01-01T00:00:00Z", "git_commit": None, "hsm_scale": scale, "config": config}


# ============================================================================ an interrupted re-run keeps the result
def test_write_progress_never_replaces_a_complete_result(tmp_path):
    out = tmp_path / "r.json"
    results.write_progress(out, [{"claim": None, "value": 1.0}], _prov(False))  # none yet: progress is shown
    assert results.load_results(out)["records"] == [{"claim": None, "value": 1.0}]
    results.write_progress(out, [{"claim": None, "value": 2.0}] * 2, _prov(False))  # over progress: replaced
    assert len(results.load_results(out)["records"]) == 2
    results.write_results(out, [{"claim": None, "value": 3.0}] * 3, _prov(True))
    before = out.read_bytes()
    results.write_progress(out, [{"claim": None, "value": 4.0}], _prov(False))  # over a complete result: kept
    assert out.read_bytes() == before
    old_style = tmp_path / "old.json"  # a file without the key is complete
    results.write_results(old_style, [{"claim": None, "value": 5.0}], _prov(None))
    before = old_style.read_bytes()
    results.write_progress(old_style, [], _prov(False))
    assert old_style.read_bytes() == before
    with pytest.raises(ValueError, match="complete must be False"):
        results.write_progress(out, [], _prov(True))


TAXONOMY_TINY = dict(train_limit="60", test_limit="40", max_tokens="8", max_vocab="300", models="flat,hierarchical")


@needs_trec
def test_an_interrupted_taxonomy_rerun_keeps_the_complete_result(tmp_path, monkeypatch):
    out = tmp_path / "trec.json"
    T.run_taxonomy_tables(scale="quick", out=out, data="trec", **TAXONOMY_TINY)
    complete = out.read_bytes()
    assert results.load_results(out)["provenance"]["config"]["complete"] is True
    real = T.train_one

    def stopped_at_hierarchical(kind, *args, **kwargs):
        if kind == "hierarchical":
            raise KeyboardInterrupt  # Ctrl-C, a time limit, a crash: after the first finished run
        return real(kind, *args, **kwargs)

    monkeypatch.setattr(T, "train_one", stopped_at_hierarchical)
    with pytest.raises(KeyboardInterrupt):  # a re-run with another seed over the complete result
        T.run_taxonomy_tables(scale="quick", out=out, data="trec", seeds="1", **TAXONOMY_TINY)
    assert out.read_bytes() == complete  # the previous, complete result is intact
    assert (tmp_path / ".trec.json.partial.json").exists()  # the progress is in the hidden file
    # a first run with no result yet shows its finished part, marked incomplete
    first = tmp_path / "first.json"
    with pytest.raises(KeyboardInterrupt):
        T.run_taxonomy_tables(scale="quick", out=first, data="trec", **TAXONOMY_TINY)
    payload = results.load_results(first)
    assert payload["provenance"]["config"]["complete"] is False
    assert [r["model"] for r in payload["records"] if r["kind_of_record"] == "run"] == ["flat"]
    shown = {Path(m.file).name for runs in report.measurements(tmp_path).values() for m in runs}
    assert shown == {"trec.json"}  # the incomplete file stays off the book


def test_no_experiment_rewrites_its_result_file_mid_run():
    """Every experiment that writes during a run goes through write_progress (the pattern of the
    two that rewrite their file after every part), so none can replace a complete result early."""
    root = Path(__file__).resolve().parents[2] / "hsm" / "experiments"
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if "complete=" in text:
            assert "write_progress" in text, f"{path.name} writes partial results without write_progress"


# ============================================================================ side files belong to one result
def test_tree_prefix_is_the_result_files_own_except_table1_table3():
    assert C.tree_prefix_of(Path("table1-cooking.json")) == "cooking"
    assert C.tree_prefix_of(Path("table3-cooking.json")) == "cooking"  # shared with Table 1 on purpose
    assert C.tree_prefix_of(Path("table1-cooking-fast-seed0.json")) == "cooking-fast-seed0"
    assert C.tree_prefix_of(Path("seed0-cooking.json")) == "seed0-cooking"
    assert C.tree_prefix_of(Path("seed1-cooking.json")) == "seed1-cooking"
    assert C.tree_prefix_of(Path("table1.json")) == "table1"


def test_committed_table_results_point_at_their_own_trees():
    """The committed Table 1 / Table 3 files name the trees their prefix gives (Table 3's are
    Table 1's, the same files)."""
    folder = Path(__file__).resolve().parents[2] / "results" / "classification"
    for path in sorted(folder.glob("table*.json")):
        for record in results.load_results(path)["records"]:
            if record.get("tree_file"):
                assert Path(record["tree_file"]).name.startswith(C.tree_prefix_of(path) + "-d"), path.name


CLASSIFICATION_TINY = dict(data="cooking", train_limit="300", test_limit="100", dims="8", lr_grid="0.5",
                           epochs="1", batch_size="16", outputs="learned5", peers="")


@needs_cooking
def test_two_result_files_in_one_folder_keep_their_own_learned_trees(tmp_path, monkeypatch):
    paths = {}
    for seed in (0, 1):
        paths[seed] = C.icml_table1(scale="quick", out=tmp_path / f"seed{seed}-cooking.json", seed=str(seed),
                                    **CLASSIFICATION_TINY)
    files = {}
    for seed, path in paths.items():
        (row,) = [r for r in results.load_results(path)["records"] if r.get("output") == "learned5"]
        files[seed] = row["tree_file"]
        assert row["tree_file"] == f"trees/seed{seed}-cooking-d8-learned5.json"
        assert (tmp_path / row["tree_file"]).is_file()
    assert files[0] != files[1]
    # an interrupted re-run over seed0 leaves its trees as they were (new ones wait in a hidden folder)
    tree0 = (tmp_path / files[0]).read_bytes()
    real = C.table._run_ours

    def then_stop(*args, **kwargs):
        real(*args, **kwargs)  # the row is computed (its trees written), then the stop
        raise KeyboardInterrupt

    monkeypatch.setattr(C.table, "_run_ours", then_stop)
    with pytest.raises(KeyboardInterrupt):
        C.icml_table1(scale="quick", out=paths[0], seed="5", **CLASSIFICATION_TINY)
    assert (tmp_path / files[0]).read_bytes() == tree0


# ============================================================================ damaged result files never reach the book
CLAIM = "icml2017.table2.learned_tree.perplexity"


def _payload(**change) -> dict:
    payload = {"schema": 1, "provenance": {"date_utc": "2026-01-01T00:00:00Z", "git_commit": None,
                                           "hsm_scale": "quick", "config": {}},
               "records": [{"claim": CLAIM, "value": 150.0}]}
    payload.update(change)
    return payload


@pytest.mark.parametrize("content, message", [
    (_payload(records={"claim": CLAIM}), "damaged: 'records' is dict, not a list"),
    (_payload(records=[1.5]), r"damaged: records\[0\] is float"),
    (_payload(provenance=[]), "damaged: 'provenance' is list"),
    (_payload(provenance={"date_utc": "x"}), "provenance has no 'hsm_scale'"),
    (_payload(provenance={"hsm_scale": "quick", "config": "x"}), "'provenance.config' is str"),
    (_payload(schema="1"), "'schema' is '1'"),
    (_payload(schema=7), "schema 7"),
    (_payload(records=[{"claim": "icml2017.no.such.number", "value": 1.0}]), "unknown claim 'icml2017.no.such.number'"),
    (_payload(records=[{"claim": CLAIM, "value": "150"}]), "non-numeric value '150'"),
    (_payload(records=[{"claim": CLAIM}]), "non-numeric value None"),
    (b'{"records": [], "provenance": {"hsm_scale": "quick", "note": "caf\xe9"}}', "not UTF-8 text"),
    (b'{"records": [', "not valid JSON"),
], ids=["records-dict", "record-number", "provenance-list", "no-scale", "config-str", "schema-str", "schema-newer",
        "unknown-claim", "value-str", "value-missing", "latin1-byte", "truncated"])
def test_a_damaged_result_file_fails_the_book_naming_the_file(tmp_path, content, message):
    folder = tmp_path / "results" / "lm"
    folder.mkdir(parents=True)
    path = folder / "damaged.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    for read in (lambda: report.measurements(tmp_path / "results"),
                 lambda: list(results.iter_results(tmp_path / "results")),
                 lambda: results.load_results(path)):
        with pytest.raises(ValueError, match=message) as info:
            read()
        assert str(path) in str(info.value)


def test_json_that_is_not_a_result_file_is_skipped_by_the_book(tmp_path):
    (tmp_path / "tree.json").write_text(json.dumps({"arity": 2, "child_node": []}))
    (tmp_path / "list.json").write_text("[1, 2]")
    assert list(results.iter_results(tmp_path)) == []
    with pytest.raises(ValueError, match="not a result file"):
        results.load_results(tmp_path / "tree.json")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_value_is_kept_and_marked_not_rendered_as_nan(tmp_path, value):
    (tmp_path / "r.json").write_text(json.dumps(_payload(records=[{"claim": CLAIM, "value": value}])))
    (measured,) = report.measurements(tmp_path)[CLAIM]
    assert not np.isfinite(measured.value) and measured.file == "r.json"
    assert report.format_value(measured.value) == report.NOT_FINITE


def test_every_committed_result_file_is_sound():
    root = Path(__file__).resolve().parents[2] / "results"
    paths = [path for path, _ in results.iter_results(root)]  # raises, naming a damaged file
    assert len(paths) >= 50
    for path in paths:
        for record in results.load_results(path)["records"]:
            if record.get("claim"):
                assert np.isfinite(record["value"]), f"{path}: {record['claim']} is not finite"


# ============================================================================ destinations checked before any work
def test_check_destination_names_an_unusable_path(tmp_path, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    folder = tmp_path / "r.json"
    folder.mkdir()
    with pytest.raises(ValueError, match=rf"{a_file}/sub/r.json cannot be written: {a_file} is a file, not a folder"):
        results.check_destination(a_file / "sub" / "r.json")
    with pytest.raises(ValueError, match=rf"{folder} is an existing directory, not a file"):
        results.check_destination(folder)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = results.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # root ignores permission bits: refuse as a read-only mount would
        if Path(dir) == locked:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(results.tempfile, "mkstemp", mkstemp)
    with pytest.raises(ValueError, match=rf"{locked}/new/r.json cannot be written: {locked} is not writable"):
        results.check_destination(locked / "new" / "r.json")
    assert results.check_destination(tmp_path / "new" / "deeper" / "r.json") and not (tmp_path / "new").exists()
    assert not list(tmp_path.glob(".hsm-write-test-*"))


def _cli(capsys, *argv):
    from hsm_lab.experiments import cli

    code = cli.main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("make_out, message", [
    (lambda tmp: tmp / "file" / "r.json", "is a file, not a folder"),
    (lambda tmp: tmp / "dir.json", "is an existing directory, not a file"),
    (lambda tmp: tmp / "r.txt", "expected a .json path"),
])
def test_cli_refuses_an_unusable_out_before_any_work(tmp_path, capsys, monkeypatch, make_out, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir.json").mkdir()
    monkeypatch.setattr(T, "_prepare", lambda *a, **k: pytest.fail("work started"))
    code, err = _cli(capsys, "taxonomy-tables", "--scale", "quick", "--out", str(make_out(tmp_path)))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_an_unwritable_hsm_output_before_any_work(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("HSM_OUTPUT", str(tmp_path / "file" / "out"))
    monkeypatch.setattr(T, "_prepare", lambda *a, **k: pytest.fail("work started"))
    code, err = _cli(capsys, "taxonomy-tables", "--scale", "quick")
    assert code == 2 and "is a file, not a folder; choose another --out or HSM_OUTPUT" in err


def test_bench_json_must_be_a_writable_json_path(tmp_path, capsys):
    from hsm_lab import bench

    assert bench.main(["--quick", "--json", str(tmp_path / "x.txt")]) == 2
    assert "expected a .json path" in capsys.readouterr().err


@pytest.mark.parametrize("value, message", [("abc", "HSM_THREADS='abc' is not a number of threads"),
                                            ("0", "HSM_THREADS must be a positive integer, got 0")])
def test_bad_hsm_threads_is_named_before_any_work(capsys, monkeypatch, value, message):
    monkeypatch.setenv("HSM_THREADS", value)
    monkeypatch.setattr(T, "_prepare", lambda *a, **k: pytest.fail("work started"))
    code, err = _cli(capsys, "taxonomy-tables", "--scale", "quick")
    assert code == 2 and message in err


@pytest.mark.parametrize("value", ["0.1,,0.2", "0.1,", ",0.1"])
def test_a_list_option_with_an_empty_entry_is_refused(tmp_path, value):
    from hsm_lab.experiments import option_floats

    with pytest.raises(ValueError, match="has an empty entry"):
        option_floats("lr_grid", value, positive=True)
    with pytest.raises(ValueError, match=r"lr_grid=.*has an empty entry"):
        C.icml_table1(scale="quick", out=tmp_path / "x.json", data="cooking", lr_grid=value)
    assert option_floats("lr_grid", " 0.1 , 0.2 ") == (0.1, 0.2)


# ============================================================================ a full disk: named, the old file kept
def test_cli_reports_a_full_disk_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from hsm_lab import experiments
    from hsm.atomic import atomic_write

    def no_space(handle):
        raise OSError(errno.ENOSPC, "No space left on device")

    experiment = experiments.get("taxonomy-tables")
    monkeypatch.setitem(experiments.REGISTRY, "taxonomy-tables", experiment.__class__(
        experiment.name, lambda **kw: atomic_write(kw["out"], no_space), experiment.summary,
        experiment.default_out))
    code, err = _cli(capsys, "taxonomy-tables", "--scale", "quick", "--out", str(tmp_path / "r.json"))
    assert code == 1 and f"the disk is full (No space left on device): cannot write {tmp_path / 'r.json'}" in err
    assert len(err.strip().splitlines()) == 1


# ============================================================================ a row that diverges at every rate
@needs_cooking
def test_a_row_that_diverges_at_every_rate_is_recorded_and_the_table_goes_on(tmp_path, monkeypatch):
    real = C.table.train_bow  # what the table's rows train with

    def diverging(train, output, *args, **kwargs):
        if output == "flat":
            raise FloatingPointError("loss is nan at step 3")
        return real(train, output, *args, **kwargs)

    monkeypatch.setattr(C.table, "train_bow", diverging)
    options = dict(CLASSIFICATION_TINY, outputs="flat,huffman5", reduce="sum")
    path = C.icml_table1(scale="quick", out=tmp_path / "t.json", **options)
    rows = {r["output"]: r for r in results.load_results(path)["records"]}
    assert "diverged at every learning rate of lr_grid [0.5]" in rows["flat"]["skipped"]
    assert "reduce=mean" in rows["flat"]["skipped"] and "value" not in rows["flat"]
    assert 0 <= rows["huffman5"]["p_at_1"] <= 100


def test_cli_reports_a_diverged_run_in_one_line(tmp_path, capsys, monkeypatch):
    from hsm_lab import experiments

    experiment = experiments.get("taxonomy-tables")

    def diverging(**kwargs):
        raise FloatingPointError("loss is nan at epoch 2, step 17")

    monkeypatch.setitem(experiments.REGISTRY, "taxonomy-tables", experiment.__class__(
        experiment.name, diverging, experiment.summary, experiment.default_out))
    code, err = _cli(capsys, "taxonomy-tables", "--scale", "quick", "--out", str(tmp_path / "r.json"))
    assert code == 1 and "the run diverged (loss is nan at epoch 2, step 17); try a smaller" in err
    assert len(err.strip().splitlines()) == 1
