"""``python -m hsm reproduce``: matching records, tolerances, commands, and whole re-runs of the
small committed result files in tests/data/results (made by ``python -m hsm run NAME --scale quick``
from a clean commit)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hsm_lab import reproduce as R

FIXTURES = Path(__file__).parent / "data" / "results"


def test_records_match_by_their_labels_not_their_order() -> None:
    old = [{"method": "flat", "value": 1.0, "ms": 3.0}, {"method": "tree", "value": 2.0, "ms": 1.0}]
    new = [{"method": "tree", "value": 2.0, "ms": 9.0}, {"method": "flat", "value": 1.0, "ms": 7.0}]
    diffs = R.compare_records(old, new)
    assert all(d.within(0, 0) for d in diffs if d.checked)
    assert {d.field for d in diffs if not d.checked} == {"ms"}  # timings are shown, never checked


def test_a_changed_number_and_a_missing_row_fail_the_check() -> None:
    old = [{"method": "flat", "value": 1.0}, {"method": "tree", "value": 2.0}]
    new = [{"method": "flat", "value": 1.001}]
    diffs = R.compare_records(old, new)
    flat = next(d for d in diffs if d.record == "method=flat")
    assert not flat.within(1e-6, 0) and flat.within(0.01, 0)
    tree = next(d for d in diffs if d.record == "method=tree")
    assert tree.new is None and not tree.within(1.0, 1.0)


def test_curves_inside_records_are_compared_point_by_point() -> None:
    diffs = R.compare_records([{"m": "a", "curve": [1.0, 2.0]}], [{"m": "a", "curve": [1.0, 2.5]}])
    assert [(d.field, d.within(0, 0)) for d in diffs] == [("curve[0]", True), ("curve[1]", False)]


def test_a_file_without_a_command_or_the_settings_to_rebuild_it_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema": 1, "records": [],
                                "provenance": {"hsm_scale": "full", "git_commit": "a" * 40,
                                               "config": {"experiment": "lm-ptb"}}}))
    assert R.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "does not record the command" in err and "lm-ptb" in err


def test_commands_for_an_experiment_and_a_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    run = {"command": "run", "experiment": "lm-ptb", "scale": "full", "device": "cpu",
           "options": {"epochs": "2", "decay": "1"}}
    cmd = R.command_for(run, out)
    assert cmd[:3] == [sys.executable, "-m", "hsm"]
    assert cmd[3:] == ["run", "lm-ptb", "--scale", "full", "--device", "cpu", "--out", str(out),
                       "-o", "epochs=2", "-o", "decay=1"]
    assert R.command_for(run, out, scale="quick")[6] == "quick"
    bench = {"command": "bench", "argv": ["--vocab", "1000", "--quick"]}
    assert R.command_for(bench, out)[3:] == ["bench", "--vocab", "1000", "--quick", "--json", str(out)]
    decoding = {"command": "bench-decoding", "argv": ["--threads", "1"]}
    assert R.command_for(decoding, out)[3:] == ["bench-decoding", "--threads", "1", "--json", str(out)]
    assert "--quick" not in R.command_for(bench, out, scale="full")


def test_bad_tolerances_and_missing_files_are_one_line_errors(tmp_path: Path, capsys) -> None:
    assert R.main([str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert R.main([str(tmp_path / "none.json"), "--rtol", "-1"]) == 2
    assert "--rtol" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["sampling-fig2-quick.json", "sampling-fig1-quick.json"])
def test_a_committed_quick_result_reproduces_on_any_machine_of_our_kind(name: str, capsys) -> None:
    """The committed files were made on another machine (their provenance predates the arithmetic
    fields): floats are checked at the float32 tolerance, integers exactly."""
    path = FIXTURES / name
    recorded = json.loads(path.read_text())["provenance"]
    assert recorded["git_dirty"] is False and recorded["invocation"]["scale"] == "quick"
    assert R.main([str(path)]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    assert " 0 differ" in out and "float32 tolerance" in out and f"rtol {R.FLOAT32_RTOL:g}" in out


def test_a_file_re_run_with_the_same_arithmetic_is_checked_exactly(tmp_path: Path, monkeypatch, capsys) -> None:
    """The same machine re-running its own one-thread file: every float must come back equal."""
    monkeypatch.setenv("HSM_THREADS", "1")
    first = tmp_path / "first"
    assert R.main([str(FIXTURES / "sampling-fig1-quick.json"), "--keep", str(first)]) == 0
    capsys.readouterr()
    own = first / "sampling-fig1-quick.json"
    assert json.loads(own.read_text())["provenance"]["threads"] == 1
    assert R.main([str(own)]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    assert " 0 differ" in out and "floats exactly" in out and "rtol 0, atol 0" in out


def test_a_re_run_trains_its_runs_again_unless_told_to_reuse_them(tmp_path: Path, monkeypatch, capsys) -> None:
    """Finished runs in the runs folder may come from other code: reproduce trains in its scratch
    folder (HSM_RUNS) unless --reuse-runs."""
    seen = []

    def fake_run(cmd, env):
        seen.append(env.get("HSM_RUNS"))
        return type("Done", (), {"returncode": 3})()

    monkeypatch.setattr(R.subprocess, "run", fake_run)
    monkeypatch.setenv("HSM_RUNS", str(tmp_path / "shared-runs"))
    result = str(FIXTURES / "sampling-fig1-quick.json")
    assert R.main([result, "--keep", str(tmp_path / "a")]) == 1
    assert R.main([result, "--keep", str(tmp_path / "b"), "--reuse-runs"]) == 1
    capsys.readouterr()
    assert seen == [str(tmp_path / "a" / "runs"), str(tmp_path / "shared-runs")]


def test_a_benchmark_re_run_leaves_unset_sizes_unset() -> None:
    """A benchmark file records the sizes it filled in; passing them back would change the command
    (``--algorithm1`` without ``--vocab`` times V = 250k, with it the first size given)."""
    from hsm_lab.bench import scale_defaults

    config = {"vocab": scale_defaults(False)["vocab"], "dim": 200, "batch": [128], "methods": ["flat"],
              "metrics": ["train"], "predict_scale": 10.0, "algorithm1": True, "quick": False}
    argv = R._bench_argv(config)
    assert "--vocab" not in argv and "--dim" not in argv and "--algorithm1" in argv
    assert R._bench_argv({**config, "vocab": [250_000]})[:2] == ["--vocab", "250000"]


def _arithmetic(**changes) -> dict:
    prov = {"cpu_model": "CPU X", "cpu_vector_extensions": ["avx", "avx2", "fma"], "cpu_capability": "AVX2",
            "threads": 1, "torch": "2.13.0+cpu", "numpy": "2.0", "numba": "0.60", "cuda_device": None}
    prov.update(changes)
    return prov


def test_the_same_arithmetic_needs_one_thread_and_every_recorded_field_equal() -> None:
    assert R.same_arithmetic(_arithmetic(), _arithmetic())
    assert not R.same_arithmetic(_arithmetic(threads=2), _arithmetic(threads=2))  # thread scheduling varies
    assert not R.same_arithmetic(_arithmetic(), _arithmetic(cpu_vector_extensions=["avx", "avx2", "fma", "avx512f"]))
    assert not R.same_arithmetic(_arithmetic(), _arithmetic(cpu_capability="AVX512"))
    assert not R.same_arithmetic(_arithmetic(), _arithmetic(torch="2.14.0+cpu"))
    old = _arithmetic()
    del old["threads"]  # a file from before these fields were recorded
    assert not R.same_arithmetic(old, old)


def test_integers_are_compared_exactly_at_any_tolerance() -> None:
    diffs = R.compare_records([{"m": "a", "n_test": 1000, "p1": 0.5}], [{"m": "a", "n_test": 1001, "p1": 0.50001}])
    by_field = {d.field: d for d in diffs}
    assert not by_field["n_test"].within(0.1, 1.0) and by_field["n_test"].integer
    assert by_field["p1"].within(1e-4, 0) and not by_field["p1"].integer


def test_provenance_records_the_arithmetic() -> None:
    from hsm_lab.results import machine_arithmetic, provenance

    prov = provenance(scale="quick")
    assert isinstance(prov["threads"], int) and prov["threads"] >= 1
    assert isinstance(prov["cpu_vector_extensions"], list) and prov["cpu_capability"]
    assert machine_arithmetic(prov) is not None


def test_keep_never_replaces_the_file_it_re_runs(tmp_path: Path, capsys) -> None:
    source = tmp_path / "sampling-fig1-quick.json"
    source.write_bytes((FIXTURES / "sampling-fig1-quick.json").read_bytes())
    before = source.read_bytes()
    assert R.main([str(source), "--keep", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "would replace the file it is compared with" in err and err.count("\n") == 1
    assert source.read_bytes() == before
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert R.main([str(source), "--keep", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err and a_file.read_text() == "x"
    assert R.main([str(source), "--keep", str(a_file / "below")]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_a_folder_given_as_the_result_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    assert R.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder, not a result file" in err and err.count("\n") == 1


def _check_options(invocation: dict) -> None:
    """The experiment's own option checks (ValueError), without running it."""
    if invocation["command"] == "bench":
        from hsm_lab.bench import _parser

        _parser().parse_args(invocation["argv"])
        return
    if invocation["command"] == "bench-decoding":
        from hsm_lab.bench_decoding import _parser as decoding_parser

        decoding_parser().parse_args(invocation["argv"])
        return
    name, scale, options = invocation["experiment"], invocation["scale"], dict(invocation["options"])
    if name == "lm-ptb-lemma31":
        from hsm_lab.experiments.lm.lemma31 import _options

        _options(scale, options)
    elif name == "lm-gutenberg-decoding":
        assert set(options) <= {"tokens", "beams", "tree"}, options
    elif name == "lm-gutenberg-mnih-hinton":
        assert set(options) <= {"word_vectors"}, options
    elif name == "lm-timing":
        assert set(options) <= {"tables", "steps", "warmup", "test_batches", "phase_steps", "train_tokens",
                                "eval_tokens"}, options
    elif name == "lm-gutenberg-node-accuracy":
        assert set(options) <= {"models", "tokens"}, options
    elif name == "lm-new-words":
        from hsm_lab.experiments.lm.new_words import parse_options

        parse_options(scale, options)
    elif name.startswith("lm-") and name != "lm-ptb-sampling":
        from hsm_lab.experiments.lm.commands import _scale_for

        options.pop("runs", None), options.pop("variants", None), options.pop("checkpoint_minutes", None)
        _scale_for(name, scale, options)
    elif name == "lm-ptb-sampling":
        from hsm_lab.experiments.sampling.config import _lm_settings

        _lm_settings(scale, options)
    elif name.startswith("sampling-"):
        from hsm_lab.experiments.sampling.config import _settings

        _settings(scale, options)
    elif name == "taxonomy-tables":
        from hsm_lab.experiments.taxonomy import _settings

        _settings(scale, options.pop("data"), options)
    elif name == "taxonomy-cv":
        from hsm_lab.experiments.taxonomy import _settings

        for key in ("folds", "hidden_sizes", "directions"):
            options.pop(key, None)
        _settings(scale, options.pop("data", "trec"), options)
    elif name.startswith("icml-table"):
        from hsm_lab.experiments.classification.config import _parse_options

        _parse_options(scale, options)
    elif name == "label-addition":
        from hsm_lab.experiments.label_addition import parse_options

        parse_options(scale, options)
    elif name == "icml-fast-ablation":
        from hsm_lab.experiments.classification_fast import _ablation_config

        _ablation_config(scale, options)
    elif name == "fast-classifier-repeats":
        from hsm_lab.experiments.classification_fast import _repeats_settings

        _repeats_settings(scale, options)
    elif name == "fast-time-split":
        from hsm_lab.experiments.classification_fast import _time_split_settings

        _time_split_settings(scale, options)
    elif name == "transformer-ptb":
        from hsm_lab.experiments.transformer_lm import parse_options as transformer_options

        transformer_options(scale, options)
    elif name == "today-tools":
        from hsm_lab.experiments.classification.today import _parse_today

        _parse_today(scale, options)
    else:
        raise AssertionError(f"no check for {name}")


def test_every_committed_result_names_a_command_its_experiment_accepts() -> None:
    root = Path(__file__).resolve().parents[2] / "results"
    seen = 0
    for path in sorted(root.rglob("*.json")):
        payload = json.loads(path.read_text())
        if "provenance" not in payload:
            continue  # a tree or a data summary, not a result file
        invocation = R.invocation_of(path, payload)
        _check_options(invocation)
        # a file older than recorded commands carries the one its settings give, marked as such
        assert payload["provenance"].get("invocation") == invocation, path.relative_to(root)
        assert not invocation.get("inferred") or invocation["inferred_from"].startswith("provenance.config")
        seen += 1
    assert seen >= 60


def test_the_compiled_trainers_experiments_are_re_run_from_their_settings() -> None:
    root = Path(__file__).resolve().parents[2] / "results" / "classification"
    for name, experiment in (("fast-ablation-cooking", "icml-fast-ablation"),
                             ("fast-repeats-cooking", "fast-classifier-repeats"),
                             ("fast-time-split-gutenberg-books", "fast-time-split")):
        prov = json.loads((root / f"{name}.json").read_text())["provenance"]
        prov = {**prov, "invocation": None}
        invocation = R.invocation_of(root / f"{name}.json", {"provenance": prov, "records": []})
        assert (invocation["experiment"], invocation["options"]) == (experiment, {}), name
        # a setting that differs from today's default is passed as its option
        config = dict(prov["config"], threads=3, **({"seed_base": 4} if "seed_base" in prov["config"] else {}))
        options = R._inferred_invocation({**prov, "config": config}, [])["options"]
        assert options == {"threads": "3", **({"seed": "4"} if "seed_base" in config else {})}, name
    # a file that does not record every setting is not given a command
    assert R._inferred_invocation({"hsm_scale": "full", "config": {"experiment": "fast-time-split"}}, []) is None


def test_an_inferred_command_changes_only_what_the_file_changed() -> None:
    root = Path(__file__).resolve().parents[2] / "results"
    path = root / "lm" / "gutenberg-678books-250k-75ary-2ep-learned.json"
    invocation = R.invocation_of(path, json.loads(path.read_text()))
    assert invocation["inferred"] and invocation["experiment"] == "lm-gutenberg-75"
    assert invocation["options"] == {"epochs": "2", "learn_epochs": "1", "decay": "1", "runs": "learned"}
    path = root / "sampling" / "fig2-scale10.json"
    assert R.invocation_of(path, json.loads(path.read_text()))["options"] == {"score_scale": "10.0"}
    # the first Schuurmans & Frasincar runs predate the embeddings option: they ran random-init vectors
    path = root / "taxonomy" / "r8-learned.json"
    assert R.invocation_of(path, json.loads(path.read_text()))["options"]["embeddings"] == "random"


def test_a_language_model_run_with_its_own_description_is_re_run_with_it() -> None:
    """A run described by ``-o description=...`` keeps its description when re-run, whether the
    file recorded it among its overrides or (older files) only in its configuration."""
    from hsm_lab.experiments.lm.presets import SCALES

    preset = SCALES["lm-ptb-ablation"]["full"]
    config = {"experiment": "lm-ptb-ablation", "device": "cpu", "description": "a 4M-token slice",
              "overrides": {"epochs": "1"}}
    prov = {"hsm_scale": "full, reduced: epochs=1", "config": config}
    assert R._inferred_invocation(prov, [])["options"] == {"epochs": "1", "description": "a 4M-token slice"}
    config["description"] = preset.description
    assert "description" not in R._inferred_invocation(prov, [])["options"]


def test_records_that_gained_a_label_still_match_their_old_rows() -> None:
    old = [{"run": "flat", "value": 1.0}, {"run": "tree", "value": 2.0}]
    new = [{"run": "tree", "value": 2.0, "trained_on": "train"}, {"run": "flat", "value": 1.0, "trained_on": "train"}]
    diffs = R.compare_records(old, new)
    assert all(d.within(0, 0) for d in diffs), [d for d in diffs if not d.within(0, 0)]
    assert {d.record for d in diffs} == {"run=flat", "run=tree"}


def test_timings_are_recognised_by_name_and_by_what_a_value_measures() -> None:
    """A re-run on the same machine gives other timings: the language models' ``value`` of a
    ``train_ms_per_batch`` record, the decoding benchmark's ``kind=ms_per_batch`` rows and the
    re-assignments' seconds are timings, reported apart and never compared."""
    lm = {"claim": "arxiv2016.table1.ptb.flat_soft_max.ms_per_batch", "measure": "train_ms_per_batch",
          "run": "flat", "value": 23.7, "reassignments": [{"step": 10, "seconds": 0.4, "moved_labels": 3.0}],
          "per_epoch": [{"epoch": 1, "train_nll": 5.3}]}
    decoding = {"kind": "ms_per_batch", "metric": "top1", "method": "tree", "value": 0.5, "cpu_ms": 0.5,
                "top5_nodes_visited": 4.25, "speedup_vs_flat": 43.6}
    perplexity = {"claim": "arxiv2016.table1.ptb.flat_soft_max.perplexity", "measure": "test_perplexity",
                  "run": "flat", "value": 160.6}
    later = lambda r, **c: {**r, **c}  # noqa: E731
    new = [later(lm, value=25.1, reassignments=[{"step": 10, "seconds": 0.9, "moved_labels": 3.0}]),
           later(decoding, value=0.7, cpu_ms=0.8, speedup_vs_flat=40.0), dict(perplexity)]
    diffs = R.compare_records([lm, decoding, perplexity], new)
    timings = {(d.record.split(",")[0], d.field) for d in diffs if d.timing}
    assert timings == {("claim=arxiv2016.table1.ptb.flat_soft_max.ms_per_batch", "value"),
                       ("claim=arxiv2016.table1.ptb.flat_soft_max.ms_per_batch", "reassignments[0].seconds"),
                       ("kind=ms_per_batch", "value"), ("kind=ms_per_batch", "cpu_ms"),
                       ("kind=ms_per_batch", "speedup_vs_flat")}
    assert not any(d.checked for d in diffs if d.timing)
    assert all(d.within(0, 0) for d in diffs if d.checked)  # every result, nothing timed, agrees
    checked = {d.field for d in diffs if d.checked}
    assert {"reassignments[0].moved_labels", "per_epoch[0].train_nll", "top5_nodes_visited"} <= checked
    for name in ("ms_per_example", "train_seconds", "seconds_per_epoch", "wall_time_s", "reassign_s",
                 "phases_ms.learner", "time", "reassign_overhead"):
        assert R.is_timing(name), name
    for name in ("value", "p_at_1", "steps", "seeds", "moved_labels", "test_perplexity", "nodes_visited"):
        assert not R.is_timing(name), name


def test_a_re_run_whose_timings_alone_changed_agrees_and_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """Only the timings differ: exit 0, the summary counts them as "timings, not compared"."""
    source = json.loads((FIXTURES / "sampling-fig1-quick.json").read_text())
    source["records"] = [{"kind": "ms_per_batch", "method": "tree", "value": 1.0, "nodes": 7},
                         {"measure": "test_perplexity", "method": "tree", "value": 150.0, "wall_time_s": 3.0}]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(source))

    def fake_run(cmd, env):
        out = Path(cmd[cmd.index("--out") + 1])
        rerun = {**source, "records": [{**source["records"][0], "value": 2.0},
                                       {**source["records"][1], "wall_time_s": 9.0}]}
        out.write_text(json.dumps(rerun))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(R.subprocess, "run", fake_run)
    assert R.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 differ; 2 timings, not compared" in out and "(timing, not compared)" in out


def test_keep_never_replaces_another_file_of_the_same_name(tmp_path: Path, capsys) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    other = keep / "sampling-fig1-quick.json"
    other.write_text("an earlier re-run")
    assert R.main([str(FIXTURES / "sampling-fig1-quick.json"), "--keep", str(keep)]) == 2
    err = capsys.readouterr().err
    assert "already holds a sampling-fig1-quick.json" in err and err.count("\n") == 1
    assert other.read_text() == "an earlier re-run"


def test_a_re_run_stopped_by_ctrl_c_is_reported_as_interrupted(tmp_path: Path, monkeypatch, capsys) -> None:
    """The signal reaches the re-run too: its status 130 is Ctrl-C, not a failed command."""
    from hsm.__main__ import main

    monkeypatch.setattr(R.subprocess, "run", lambda cmd, env: type("Done", (), {"returncode": 130})())
    assert main(["reproduce", str(FIXTURES / "sampling-fig1-quick.json")]) == 130
    err = capsys.readouterr().err
    assert err == "hsm reproduce: interrupted\n"
