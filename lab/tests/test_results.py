"""hsm_lab.results: provenance, atomic result files, and the reproduction-status table."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm_lab import report, results

LEARNED = "icml2017.table2.learned_tree.perplexity"


@pytest.fixture(scope="module")
def prov() -> dict:
    return results.provenance(config={"arity": 65, "depth": 3}, wall_time_s=1.5)


def test_provenance_fields(prov: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    import torch

    for key in ("date_utc", "git_commit", "git_dirty", "hostname", "cpu_model", "cpu_count", "python",
                "torch", "cuda_device", "hsm_scale", "config", "wall_time_s"):
        assert key in prov
    assert prov["date_utc"].endswith("Z")
    assert prov["python"] == platform.python_version()
    assert prov["torch"] == torch.__version__
    assert prov["config"] == {"arity": 65, "depth": 3}
    assert prov["wall_time_s"] == 1.5
    assert prov["hsm_scale"] in ("quick", "full")
    assert (prov["cuda_device"] is None) == (not torch.cuda.is_available())
    monkeypatch.setenv("HSM_SCALE", "full")
    assert results.provenance()["hsm_scale"] == "full"


def test_provenance_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="config"):
        results.provenance(config=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wall_time_s"):
        results.provenance(wall_time_s=-1.0)
    with pytest.raises(TypeError, match="wall_time_s"):
        results.provenance(wall_time_s="3s")  # type: ignore[arg-type]


def test_write_then_load_round_trip(tmp_path: Path, prov: dict) -> None:
    records = [
        results.make_record(LEARNED, np.float64(151.25), epochs=np.int64(5), arity=65),
        {"name": "J_n at the root", "value": 0.05, "curve": np.array([0.01, 0.02])},
    ]
    path = results.write_results(tmp_path / "sub" / "run.json", records, prov)
    assert path == tmp_path / "sub" / "run.json"
    payload = results.load_results(path)
    assert payload["schema"] == results.SCHEMA_VERSION
    assert payload["provenance"] == json.loads(json.dumps(prov))
    assert payload["records"][0] == {"claim": LEARNED, "value": 151.25, "epochs": 5, "arity": 65}
    assert payload["records"][1]["curve"] == [0.01, 0.02]
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temporary file left behind


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


@settings(max_examples=40, deadline=None)
@given(records=st.lists(st.dictionaries(st.text(max_size=8).filter(lambda k: k != "claim"), json_values, max_size=5), max_size=4))
def test_any_json_records_round_trip(tmp_path_factory: pytest.TempPathFactory, records: list[dict]) -> None:
    prov = {"date_utc": "2026-01-01T00:00:00Z", "git_commit": None, "hsm_scale": "quick"}
    path = results.write_results(tmp_path_factory.mktemp("r") / "x.json", records, prov)
    assert results.load_results(path)["records"] == records


def test_write_is_atomic_when_serialisation_fails(tmp_path: Path, prov: dict) -> None:
    target = tmp_path / "run.json"
    results.write_results(target, [{"value": 1.0}], prov)
    before = target.read_text()
    with pytest.raises(ValueError, match="NaN"):
        results.write_results(target, [{"value": math.nan}], prov)
    with pytest.raises(TypeError, match="JSON cannot store"):
        results.write_results(target, [{"value": object()}], prov)
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_write_rejects_bad_arguments(tmp_path: Path, prov: dict) -> None:
    with pytest.raises(ValueError, match=".json"):
        results.write_results(tmp_path / "run.txt", [], prov)
    with pytest.raises(TypeError, match="list of dicts"):
        results.write_results(tmp_path / "run.json", {"value": 1}, prov)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"records\[0\]"):
        results.write_results(tmp_path / "run.json", [3.0], prov)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="provenance lacks"):
        results.write_results(tmp_path / "run.json", [], {"date_utc": "x"})
    with pytest.raises(KeyError, match="no paper number"):
        results.write_results(tmp_path / "run.json", [{"claim": "icml2017.nope", "value": 1}], prov)
    with pytest.raises(ValueError, match="no 'value'"):
        results.write_results(tmp_path / "run.json", [{"claim": LEARNED}], prov)


def test_make_record_checks_claim_and_value() -> None:
    assert results.make_record(None, 2)["claim"] is None
    with pytest.raises(KeyError):
        results.make_record("icml2017.table2.learned_tree.perplexty", 150.0)
    with pytest.raises(TypeError, match="number"):
        results.make_record(LEARNED, "150")  # type: ignore[arg-type]


def test_load_results_rejects_non_result_files(tmp_path: Path) -> None:
    (tmp_path / "tree.json").write_text('{"arity": 2}')
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not a result file"):
        results.load_results(tmp_path / "tree.json")
    with pytest.raises(ValueError, match="not valid JSON"):
        results.load_results(tmp_path / "broken.json")


def test_iter_results_skips_other_json_and_hidden_files(tmp_path: Path, prov: dict) -> None:
    results.write_results(tmp_path / "b" / "two.json", [{"value": 2}], prov)
    results.write_results(tmp_path / "a.json", [{"value": 1}], prov)
    (tmp_path / "tree.json").write_text('{"arity": 2}')
    (tmp_path / ".a.json.123.tmp.json").write_text("{")
    found = [path.relative_to(tmp_path).as_posix() for path, _ in results.iter_results(tmp_path)]
    assert found == ["a.json", "b/two.json"]
    assert list(results.iter_results(tmp_path / "missing")) == []
    (tmp_path / "c.json").write_text("{")
    with pytest.raises(ValueError, match="c.json"):
        list(results.iter_results(tmp_path))


def test_reading_rejects_results_with_unknown_claims(tmp_path: Path) -> None:
    prov = {"date_utc": "2026-01-01T00:00:00Z", "git_commit": None, "hsm_scale": "quick"}
    (tmp_path / "bad.json").write_text(json.dumps({"provenance": prov, "records": [{"claim": "nope", "value": 1}]}))
    with pytest.raises(ValueError, match=r"bad\.json: records\[0\] names an unknown claim 'nope'"):
        report.measurements(tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"provenance": prov, "records": [{"claim": LEARNED, "value": "x"}]}))
    with pytest.raises(ValueError, match="non-numeric"):
        report.measurements(tmp_path)


def test_default_results_root_finds_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = Path(results.__file__).resolve().parents[2]
    monkeypatch.chdir(checkout / "tests")
    assert results.default_results_root() == checkout / "results"
    monkeypatch.setenv("HSM_RESULTS", "/tmp/elsewhere")
    assert results.default_results_root() == Path("/tmp/elsewhere")


def test_hardware_summary() -> None:
    assert results.hardware_summary({"cuda_device": "NVIDIA H200"}) == "NVIDIA H200"
    assert results.hardware_summary({"cpu_model": "AMD EPYC 7B13 64-Core Processor", "cpu_count": 16}) == "AMD EPYC 7B13 64-Core, 16 cores"
    assert results.hardware_summary({}) == "unknown CPU"


def test_provenance_credits_the_code_the_process_started_with(monkeypatch):
    from hsm_lab import results as R

    monkeypatch.setattr(R, "_CODE_AT_START", ("a" * 40, False))
    monkeypatch.setattr(R, "_code_state", lambda: ("b" * 40, False))  # HEAD moved while the run went on
    prov = R.provenance(config={}, scale="quick")
    assert prov["git_commit"] == "a" * 40 and prov["git_dirty"] is False
    assert prov["git_commit_at_write"] == "b" * 40
    monkeypatch.setattr(R, "_code_state", lambda: ("a" * 40, False))
    assert "git_commit_at_write" not in R.provenance(config={}, scale="quick")


def test_code_state_reads_commit_and_dirtiness_of_the_checkout(monkeypatch, tmp_path: Path) -> None:
    import subprocess

    from hsm_lab import results as R

    monkeypatch.setattr(R, "_PACKAGE_DIR", tmp_path)
    assert R._code_state() == (None, None)  # not a checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    assert R._code_state() == (None, None)  # a checkout without a commit
    (tmp_path / "hsm").mkdir()
    (tmp_path / "hsm" / "f.py").write_text("a = 1\n")
    subprocess.run([*git, "add", "hsm/f.py"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("ignored: untracked files do not make the code dirty")
    assert R._code_state() == (head, False)
    (tmp_path / "hsm" / "f.py").write_text("a = 2\n")
    assert R._code_state() == (head, True)


def test_resumable_parts_skip_finished_parts_and_ignore_another_config(tmp_path: Path) -> None:
    from hsm_lab.results import ResumableParts

    out = tmp_path / "table.json"
    calls: list[str] = []

    def compute(key: str):
        return lambda: calls.append(key) or {"key": key, "values": (1, 2)}

    parts = ResumableParts(out, {"lr": 0.5, "seeds": (0, 1)}, log=None)
    assert parts.run("a", compute("a")) == {"key": "a", "values": (1, 2)}
    assert parts.path == tmp_path / ".table.json.partial.json" and parts.path.exists()
    # a new process with the same config (a tuple read back as a list) resumes: "a" is not recomputed
    again = ResumableParts(out, {"seeds": [0, 1], "lr": 0.5}, log=None)
    assert "a" in again and len(again) == 1
    assert again.run("a", compute("a")) == {"key": "a", "values": [1, 2]}
    again.run("b", compute("b"))
    assert calls == ["a", "b"]
    # another config starts afresh
    other = ResumableParts(out, {"lr": 0.25, "seeds": [0, 1]}, log=None)
    assert len(other) == 0
    again.finish()
    assert not again.path.exists()
    again.finish()  # twice is harmless


def test_resumable_parts_warn_about_an_unreadable_file(tmp_path: Path) -> None:
    from hsm_lab.results import ResumableParts

    (tmp_path / ".t.json.partial.json").write_text('{"config": ', encoding="utf-8")
    with pytest.warns(UserWarning, match="partial-run file"):
        parts = ResumableParts(tmp_path / "t.json", {}, log=None)
    assert len(parts) == 0


def test_provenance_records_a_qualified_scale_and_rejects_an_unknown_one() -> None:
    assert results.provenance(scale="full, 300-d random-init embeddings")["hsm_scale"] == \
        "full, 300-d random-init embeddings"
    with pytest.raises(ValueError, match="scale"):
        results.provenance(scale="huge, everything")


def test_measurements_leave_out_a_run_until_it_is_complete(tmp_path: Path) -> None:
    root = tmp_path / "results"
    prov = {"date_utc": "2026-01-01T00:00:00Z", "git_commit": "abc", "hsm_scale": "full", "cpu_model": "x",
            "cpu_count": 2, "cuda_device": None}
    claim = "sf2020.table3.r8.flat.f1"
    results.write_results(root / "going.json", [results.make_record(claim, 88.0)],
                          dict(prov, config={"complete": False}))
    assert claim not in report.measurements(root)
    results.write_results(root / "done.json", [results.make_record(claim, 87.0)], dict(prov, config={"complete": True}))
    assert [m.value for m in report.measurements(root)[claim]] == [87.0]


def _scratch_repo(tmp_path: Path) -> list[str]:
    import subprocess

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "hsm").mkdir()
    (tmp_path / "hsm" / "f.py").write_text("a = 1\n")
    (tmp_path / "README.md").write_text("text\n")
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], cwd=tmp_path, check=True)
    return git


def test_only_changes_to_the_code_make_a_result_dirty(monkeypatch, tmp_path: Path) -> None:
    from hsm_lab import results as R

    _scratch_repo(tmp_path)
    monkeypatch.setattr(R, "_PACKAGE_DIR", tmp_path / "hsm")
    (tmp_path / "README.md").write_text("edited prose is not code\n")
    (tmp_path / "scratch.py").write_text("untracked")
    assert R._code_state()[1] is False and R._code_diff() is None
    (tmp_path / "hsm" / "f.py").write_text("a = 2\nb = 3\n")
    assert R._code_state()[1] is True
    diff = R._code_diff()
    assert diff["files"] == ["hsm/f.py"] and (diff["insertions"], diff["deletions"]) == (2, 1)
    assert len(diff["sha256"]) == 64
    (tmp_path / "hsm" / "f.py").write_text("a = 2\nb = 4\n")
    assert R._code_diff()["sha256"] != diff["sha256"]  # another change, another hash


def test_a_dirty_result_records_the_diff_and_a_full_run_is_refused(monkeypatch) -> None:
    from hsm_lab import results as R

    diff = {"sha256": "f" * 64, "files": ["hsm/layers.py"], "insertions": 3, "deletions": 1}
    monkeypatch.setattr(R, "_CODE_AT_START", ("a" * 40, True))
    monkeypatch.setattr(R, "_DIFF_AT_START", diff)
    monkeypatch.setattr(R, "_code_state", lambda: ("a" * 40, True))
    assert R.provenance(config={}, scale="quick")["git_diff"] == diff
    R.check_code_committed("quick")  # quick runs are never refused
    R.check_code_committed("full", allow_dirty=True)
    with pytest.raises(ValueError, match=r"uncommitted changes \(hsm/layers.py\).*--allow-dirty"):
        R.check_code_committed("full, reduced: epochs=2")
    monkeypatch.setattr(R, "_CODE_AT_START", ("a" * 40, False))
    R.check_code_committed("full")
    assert "git_diff" not in R.provenance(config={}, scale="quick")


def test_the_command_line_refuses_a_dirty_full_run_before_any_work(monkeypatch, capsys) -> None:
    from hsm_lab import results as R
    from hsm_lab.experiments import cli

    monkeypatch.setattr(R, "_CODE_AT_START", ("a" * 40, True))
    monkeypatch.setattr(R, "_DIFF_AT_START", {"sha256": "f" * 64, "files": ["hsm/x.py"], "insertions": 1,
                                              "deletions": 0})
    assert cli.main(["sampling-fig2", "--scale", "full"]) == 2
    assert "uncommitted changes (hsm/x.py)" in capsys.readouterr().err


def test_provenance_records_the_invocation_within_its_block() -> None:
    from hsm_lab import results as R

    with R.recording_invocation({"command": "run", "experiment": "lm-ptb", "options": {"epochs": "2"}}):
        assert R.provenance(config={}, scale="quick")["invocation"]["options"] == {"epochs": "2"}
    assert "invocation" not in R.provenance(config={}, scale="quick")


def test_committed_result_labels_say_what_ran() -> None:
    """A label never calls a run plain ``full`` when it departs from the paper's protocol."""
    from hsm_lab.experiments.lm.presets import SCALES
    from hsm_lab.experiments.lm.presets import LMScale
    from hsm_lab.experiments.lm.report import scale_label as lm_label

    lm_fields = LMScale.__dataclass_fields__

    root = Path(__file__).resolve().parents[2] / "results"
    for path in sorted(root.rglob("*.json")):
        payload = json.loads(path.read_text())
        prov = payload.get("provenance")
        if not isinstance(prov, dict):
            continue
        label, config = str(prov.get("hsm_scale")), prov.get("config") or {}
        where = path.relative_to(root)
        if path.parent.name == "taxonomy":
            embeddings = config.get("embeddings", "random")
            assert label != "full", where
            assert ("GloVe stand-ins" in label) == (embeddings == "fasttext"), where
            assert "random-init" in label or embeddings == "fasttext", where
            assert f"at most {config['max_epochs']} epochs" in label, where
            # one validation split, or the cross-validation that taxonomy-cv runs
            assert ("no 4-fold CV" in label) != (f"{config.get('folds')}-fold cross-validation" in label), where
        if isinstance(config.get("overrides"), dict) and config.get("experiment") in SCALES:
            base = label.split(",", 1)[0]
            expected = lm_label(base, config["overrides"], SCALES[config["experiment"]].get(base))
            if config["experiment"] == "lm-ptb-ablation" and base == "full":
                # its full preset is itself reduced from the paper's setting, which the label names
                from hsm_lab.experiments.lm.commands import _scale_for, ablation_scale_label

                fields = {k: v for k, v in config["overrides"].items() if k in lm_fields}
                expected = ablation_scale_label(base, _scale_for("lm-ptb-ablation", base, fields),
                                                config["overrides"])
            assert label == expected, where
        if config.get("train_limit") or config.get("test_limit"):
            assert "reduced" in label and "396,249" in label, where
        assert "846k" not in label, where


def test_a_run_that_sets_its_own_threads_records_that_setting() -> None:
    """``provenance.threads`` is what the run computed on: the setting a run gives (a benchmark that
    measured at its own counts and gave torch's back before writing), else torch's count; a run whose
    configuration counts other threads (a compiled trainer's) says why the two differ."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        prov = results.provenance(config={"threads": [1]}, scale="quick", threads=[1])
        assert prov["threads"] == 1 and "threads_note" not in prov
        assert results.provenance(config={"threads": [1, 2]}, scale="quick", threads=(1, 2))["threads"] == [1, 2]
        assert "threads_note" not in results.provenance(config={"threads": 2}, scale="quick")
        prov = results.provenance(config={"threads": 1}, scale="quick", threads_note="the trainer's threads")
        assert prov["threads"] == 2 and prov["threads_note"] == "the trainer's threads"
        assert "config.threads" in results.provenance(config={"threads": 1}, scale="quick")["threads_note"]
    finally:
        torch.set_num_threads(before)


def test_a_benchmark_measured_on_one_thread_records_one_thread(tmp_path: Path) -> None:
    import torch

    from hsm_lab.bench_decoding import main

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["--quick", "--vocab", "500", "--methods", "tree-d2", "flat", "--metrics", "top1",
                     "--threads", "1", "--json", str(tmp_path / "d.json")]) == 0
        assert torch.get_num_threads() == 2  # the caller's count is given back
    finally:
        torch.set_num_threads(before)
    payload = results.load_results(tmp_path / "d.json")
    assert payload["provenance"]["threads"] == 1 and payload["provenance"]["config"]["threads"] == [1]
    assert {r["threads"] for r in payload["records"]} == {1} and "threads_note" not in payload["provenance"]


def test_committed_results_say_why_their_two_thread_counts_differ() -> None:
    """Where a run's own ``config.threads`` (a compiled trainer's, a library's) is not torch's
    ``provenance.threads``, the file says what each counts."""
    root = Path(__file__).resolve().parents[2] / "results"
    differ = []
    for path, payload in results.iter_results(root):
        prov = payload["provenance"]
        config = prov.get("config") or {}
        if "threads" not in prov or "threads" not in config:
            continue  # older files record one count, or none
        if results._thread_count(config["threads"]) != prov["threads"]:
            differ.append(path.name)
            assert "config.threads" in str(prov.get("threads_note")), path.relative_to(root)
    assert "decoding.json" not in differ  # its measurements ran on the one thread it records
