"""Issue 14 (reliability), experiments side: the CLI, the experiment functions, result files and the
bench refuse bad input with a message naming it, label what actually ran, write atomically, and do
not replace committed results by accident. Every check here fails before any training starts
(except the tiny softmax-regression runs and the toy LM runs), so the file stays fast."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hsm_lab import bench, results
from hsm_lab.experiments import check_device, check_scale, cli, lm
from hsm_lab.experiments import classification as C
from hsm_lab.experiments import lm_timing
from toy_lm import toy_corpus
from hsm_lab.experiments import sampling as S
from hsm_lab.experiments import taxonomy as T

REPO = Path(__file__).resolve().parents[2]
#: softmax-regression settings small enough for a second-long run of sampling-fig1/fig2
TINY_FIG = ["num_points=120", "dim=8", "num_classes=30", "batch_size=10", "num_negatives=5", "iterations=20",
            "eval_every=10", "seeds=0", "lr_pick_iterations=10", "pick_lr=0"]
CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Every test runs in its own directory, cache and output folder, with HSM_SCALE unset."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HSM_OUTPUT", raising=False)
    monkeypatch.delenv("HSM_SCALE", raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _fig_args(*extra: str) -> list[str]:
    args = list(extra)
    for option in TINY_FIG:
        args += ["-o", option]
    return args


def _result(path: Path, scale: str) -> Path:
    prov = {"date_utc": "2026-01-01T00:00:00Z", "git_commit": None, "hsm_scale": scale, "config": {}}
    return results.write_results(path, [{"claim": None, "value": 1.0}], prov, force=True)


# ============================================================================ 2. scale: validated, recorded as run
@pytest.mark.parametrize("bad", ["Quick", "huge", "", None, 1])
def test_check_scale_accepts_only_quick_and_full(bad) -> None:
    assert check_scale("quick") == "quick" and check_scale("full") == "full"
    with pytest.raises(ValueError, match="scale must be 'quick' or 'full'"):
        check_scale(bad)


@pytest.mark.parametrize("func", [lm.run_lm_ptb, lm.run_lm_ptb_schedules, lm.run_lm_gutenberg_65,
                                  lm.run_lm_gutenberg_75, lm.run_lm_ptb_ablation, C.icml_table1, C.icml_table3,
                                  T.run_taxonomy_tables, S.run_fig1, S.run_fig2, S.run_lm_ptb_sampling,
                                  lm_timing.run_lm_timing])
def test_every_experiment_rejects_an_unknown_scale(func, tmp_path) -> None:
    # before this, "huge" (or "Quick") ran the full configuration and was labelled "huge"
    with pytest.raises(ValueError, match="scale must be 'quick' or 'full', got 'huge'"):
        func(scale="huge", out=tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_cli_rejects_a_bad_hsm_scale(capsys, monkeypatch) -> None:
    monkeypatch.setenv("HSM_SCALE", "huge")
    code, out, err = _run(capsys, "sampling-fig1", *_fig_args())
    assert code == 2 and "HSM_SCALE" in err and "'huge'" in err and "Traceback" not in err
    assert not Path("hsm-results").exists()


def test_provenance_records_the_scale_passed_not_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("HSM_SCALE", "full")
    assert results.provenance({}, 1.0, scale="quick")["hsm_scale"] == "quick"
    assert results.provenance({}, 1.0)["hsm_scale"] == "full"  # no scale of its own: the environment
    with pytest.raises(ValueError, match="scale"):
        results.provenance({}, 1.0, scale="huge")


@pytest.mark.parametrize("env, flag", [("full", "quick"), ("quick", "full")])
def test_cli_label_is_the_scale_that_ran(capsys, monkeypatch, env, flag) -> None:
    monkeypatch.setenv("HSM_SCALE", env)
    # a committed checkout: the full run must not be refused for a developer's uncommitted edits
    monkeypatch.setattr(results, "_CODE_AT_START", (results._CODE_AT_START[0], False))
    code, out, err = _run(capsys, "sampling-fig1", "--scale", flag, "--out", "f.json", *_fig_args())
    assert code == 0, err
    payload = results.load_results("f.json")
    assert payload["provenance"]["hsm_scale"] == flag
    alphas = payload["provenance"]["config"]["alphas"]
    # the preset of that scale is what ran: 0, 1, 3, ln 499, ln 999, log(C - 1), 9 and 12 at full
    assert len(alphas) == (3 if flag == "quick" else 8)


def _expected_scale(path: Path, config: dict) -> str | None:
    """The preset a committed result file's config shows (None: a family without a rule here)."""
    family = path.relative_to(REPO / "results").parts[0]
    if "scale" in config:  # lm, lm timing: the experiment wrote its scale into the config
        return config["scale"]
    if family == "bench":
        return "quick" if config["quick"] else "full"
    if config.get("experiment") == "label-addition":  # quick: a slice of the books, or of cooking's questions
        return "quick" if config.get("max_books") or config.get("train_limit") else "full"
    if family == "classification" and "vw_lr_grid" not in config:  # fast-classifier-repeats: quick = a slice
        return "quick" if config["train_limit"] else "full"
    if family == "classification":  # quick preset: vw_lr_grid (0.5,), 40 books
        return "quick" if config["vw_lr_grid"] == [0.5] else "full"
    if family == "sampling" and "iterations" in config:  # quick: 200 iterations, one seed, no LR search
        return "quick" if config["pick_lr"] == 0 and len(config["seeds"]) == 1 else "full"
    if family == "sampling":  # lm-ptb-sampling: quick caps the vocabulary at 2,000
        return "quick" if config["vocab_size"] else "full"
    if family == "taxonomy":  # quick: 16-dimensional embeddings, 200 examples
        return "quick" if config["embed_dim"] == 16 else "full"
    return None


def test_committed_results_are_labelled_with_the_scale_that_ran() -> None:
    checked = 0
    for path, payload in results.iter_results(REPO / "results"):
        prov = payload["provenance"]
        expected = _expected_scale(path, prov.get("config") or {})
        if expected is None:
            continue
        label = str(prov["hsm_scale"])
        assert label.split(",")[0].split()[0] == expected, f"{path}: labelled {label!r}, config shows {expected}"
        checked += 1
    assert checked >= 20


# ============================================================================ 3. devices
def test_check_device_names_bad_and_unavailable_devices() -> None:
    assert check_device("cpu") == "cpu" and check_device(torch.device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="'gpu0' is not a torch device"):
        check_device("gpu0")
    with pytest.raises(ValueError, match="device must be a string"):
        check_device(3)
    with pytest.raises(ValueError, match="'cuda:99'"):
        check_device("cuda:99")
    with pytest.raises(ValueError, match="only cpu, cuda and mps"):
        check_device("meta")
    if not CUDA:
        with pytest.raises(ValueError, match="CUDA is not available"):
            check_device("cuda")


@pytest.mark.parametrize("argv", [["lm-ptb", "--device", "gpu0"], ["sampling-fig1", "--device", "cuda:99"]]
                         + ([] if CUDA else [["lm-ptb", "--device", "cuda"], ["icml-table1", "--device", "cuda"]]))
def test_cli_refuses_an_unusable_device_in_one_line(capsys, argv) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and "device" in err and "Traceback" not in err
    assert not Path("hsm-results").exists()


@pytest.mark.skipif(CUDA, reason="needs a machine without CUDA")
@pytest.mark.parametrize("func", [lm.run_lm_ptb, lm.run_lm_ptb_ablation, C.icml_table1, C.icml_table3,
                                  T.run_taxonomy_tables, S.run_fig1, S.run_fig2, S.run_lm_ptb_sampling,
                                  lm_timing.run_lm_timing])
def test_experiment_functions_refuse_cuda_without_a_gpu(func, tmp_path) -> None:
    # cached LM runs used to load and be written with device "cuda" although nothing ran there
    with pytest.raises(ValueError, match="CUDA is not available"):
        func(scale="quick", device="cuda", out=tmp_path / "x.json")


@pytest.mark.skipif(CUDA, reason="needs a machine without CUDA")
def test_train_lm_and_bench_refuse_cuda_without_a_gpu(capsys) -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        lm.train_lm(toy_corpus(vocab=30, tokens=1500, eval_tokens=200), lm.LMRunConfig(output="flat", context=2, dim=4), device="cuda")
    assert bench.main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and err.count("\n") == 1
    with pytest.raises(ValueError, match="CUDA is not available"):
        bench.run_benchmark([300], ["flat"], 4, 2, 1, 1.0, device="cuda", isolate=False)


def test_python_m_hsm_fails_cleanly_without_a_traceback(tmp_path) -> None:
    """The real entry point (``python -m hsm``), as the issue ran it."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "hsm", "run", "lm-ptb", "-o", "iterations=-5"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == proc.stderr.strip().splitlines()[0] and "'iterations'" in proc.stderr


# ============================================================================ 4. options
LM_BAD = [("epochs", "-5", "must be >= 1"), ("epochs", "1.5", "must be an integer"), ("epochs", "none", "integer"),
          ("lr_grid", "nan", "finite"), ("lr_grid", "", "at least one"), ("lr_grid", "0.1,0", "must be > 0"),
          ("arity", "1", ">= 2"), ("decay", "2", "<= 1"), ("l2", "-1", ">= 0"), ("l2", "inf", "finite"),
          ("vocab_size", "1", ">= 2"), ("dataset", "wiki", "ptb, gutenberg"), ("max_books", "0", ">= 1"),
          ("learn_epochs", "-1", ">= 0"), ("batch_size", "0", ">= 1"), ("random_seeds", "0", ">= 1"),
          ("select_steps", "-1", ">= 0"), ("max_books", "5", "gutenberg")]


@pytest.mark.parametrize("key, value, message", LM_BAD)
def test_lm_options_are_range_checked(key, value, message, tmp_path) -> None:
    with pytest.raises(ValueError, match=f"{key}.*{message}"):
        lm.run_lm_ptb(scale="quick", out=tmp_path / "x.json", **{key: value})


CLASSIFICATION_BAD = [("dims", "0", ">= 1"), ("dims", "", "at least one"), ("lr_grid", "nan", "finite"),
                      ("lr", "-0.1", "> 0"), ("epochs", "0", ">= 1"), ("batch_size", "-3", ">= 1"),
                      ("ngrams", "3", "<= 2"), ("validation_fraction", "1.5", "< 1"), ("train_limit", "0", ">= 1"),
                      ("save_trees", "maybe", "true or false"), ("tree_decay", "nan", "finite"),
                      ("reassigns", "0", ">= 1"), ("seed", "-1", ">= 0"), ("vw_lr_grid", "x", "number"),
                      ("tree_prior", "sticky2", "sticky, uniform")]


@pytest.mark.parametrize("key, value, message", CLASSIFICATION_BAD)
def test_classification_options_are_range_checked(key, value, message, tmp_path) -> None:
    with pytest.raises(ValueError, match=message):
        C.icml_table1(scale="quick", out=tmp_path / "x.json", **{key: value})
    with pytest.raises(ValueError, match="nothing to run"):
        C.icml_table1(scale="quick", out=tmp_path / "x.json", outputs="", peers="")


TAXONOMY_BAD = [("seeds", "-1", ">= 0"), ("seeds", "", "at least one"), ("models", "cnn", "unknown cnn"),
                ("lr", "nan", "finite"), ("dropout", "1", "< 1"), ("max_epochs", "0", ">= 1"),
                ("embed_dim", "abc", "integer"), ("valid_fraction", "0", "> 0"), ("train_limit", "-1", ">= 0")]


@pytest.mark.parametrize("key, value, message", TAXONOMY_BAD)
def test_taxonomy_options_are_range_checked(key, value, message, tmp_path) -> None:
    with pytest.raises(ValueError, match=f"option {key}=.*{message}"):
        T.run_taxonomy_tables(scale="quick", out=tmp_path / "x.json", data="trec", **{key: value})


FIG_BAD = [("iterations", "-5", ">= 1"), ("lr_grid", "nan", "finite"), ("momentum", "1", "< 1"),
           ("num_classes", "1", ">= 2"), ("batch_size", "0", ">= 1"), ("explicit", "all", "minibatch, target"),
           ("seeds", "", "at least one"), ("pick_lr", "2", "<= 1"), ("score_scale", "-3", "> 0"),
           ("lr_exact", "inf", "finite"), ("batch_size", "500", "num_points"), ("num_negatives", "30", "num_classes")]


@pytest.mark.parametrize("key, value, message", FIG_BAD)
def test_sampling_figure_options_are_range_checked(key, value, message, tmp_path) -> None:
    options = dict(item.split("=", 1) for item in TINY_FIG)
    options[key] = value
    for func in (S.run_fig1, S.run_fig2):
        with pytest.raises(ValueError, match=message):
            func(scale="quick", out=tmp_path / "x.json", **options)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("key, value, message", [("epochs", "0", ">= 1"), ("lr_grid", "nan", "finite"),
                                                 ("vocab_size", "1", ">= 2"), ("bench_steps", "0", ">= 1"),
                                                 ("num_negatives", "-3", ">= 1"), ("select_steps", "x", "integer")])
def test_lm_sampling_options_are_range_checked(key, value, message, tmp_path) -> None:
    with pytest.raises(ValueError, match=f"{key}.*{message}"):
        S.run_lm_ptb_sampling(scale="quick", out=tmp_path / "x.json", **{key: value})


@pytest.mark.parametrize("key, value, message", [("steps", "0", ">= 1"), ("warmup", "-1", ">= 0"),
                                                 ("tables", "", "at least one"), ("test_batches", "two", "integer")])
def test_lm_timing_options_are_range_checked(key, value, message, tmp_path) -> None:
    with pytest.raises(ValueError, match=f"{key}.*{message}"):
        lm_timing.run_lm_timing(scale="quick", out=tmp_path / "x.json", **{key: value})


@pytest.mark.parametrize("argv, message", [
    (["sampling-fig1", "-o", "iterations=-5"], "option iterations='-5': must be >= 1"),
    (["lm-ptb", "-o", "lr_grid=nan"], "option lr_grid='nan'"),
    (["icml-table1", "-o", "dims=0"], "option dims='0'"),
    (["taxonomy-tables", "-o", "lr=0"], "option lr='0': must be > 0"),
    (["lm-timing", "-o", "steps=0"], "option steps='0'"),
    (["lm-ptb-sampling", "-o", "epochs=-1"], "option epochs='-1'"),
    (["lm-ptb", "-o", "bogus=1"], "unknown option 'bogus'"),
    (["sampling-fig2", "-o", "nonsense"], "not KEY=VALUE"),
    (["sampling-fig2", "-o", "iterations=5", "-o", "iterations=6"], "given twice"),
    (["sampling-fig2", "-o", "force=1"], "--force"),
    (["no-such-experiment"], "unknown experiment"),
])
def test_cli_turns_bad_options_into_one_line_and_exit_2(capsys, argv, message) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not Path("hsm-results").exists()


@pytest.mark.parametrize("argv, option", [(["--batch", "0"], "--batch"), (["--repeats", "0"], "--repeats"),
                                          (["--trials", "0"], "--trials"), (["--vocab", "1"], "--vocab"),
                                          (["--budget", "nan"], "--budget"), (["--dim", "-1"], "--dim"),
                                          (["--threads", "0"], "--threads"), (["--batch", "x"], "--batch"),
                                          (["--predict-scale", "inf"], "--predict-scale")])
def test_bench_options_are_checked(capsys, argv, option) -> None:
    # --batch 0 used to end in IndexError, --repeats 0 in StatisticsError
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--quick", *argv])
    assert exit_info.value.code == 2 and f"argument {option}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        bench.run_benchmark([300], ["flat"], 4, 0, 1, 1.0, isolate=False)
    with pytest.raises(ValueError, match="repeats"):
        bench.run_benchmark([300], ["flat"], 4, 2, 0, 1.0, isolate=False)


def test_bench_quick_keeps_explicit_sizes(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    assert bench.main(["--quick", "--vocab", "300", "--batch", "4", "--repeats", "2", "--dim", "6", "--methods", "flat",
                       "--metrics", "train", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    config = payload["provenance"]["config"]
    assert (config["batch"], config["repeats"], config["dim"], config["vocab"]) == ([4], 2, 6, [300])
    timed = [r for r in payload["records"] if r.get("kind") == "ms_per_batch"]
    assert timed and all(r["batch"] == 4 and r["dim"] == 6 for r in timed)
    assert payload["provenance"]["hsm_scale"] == "quick"


# ============================================================================ 7. atomic writes, unreadable files
def test_write_results_keeps_the_previous_file_when_the_rename_fails(tmp_path, monkeypatch) -> None:
    path = _result(tmp_path / "r.json", "full")
    before = path.read_bytes()

    def fail(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "replace", fail)
    with pytest.raises(OSError):
        _result(path, "full")
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_read_json_or_none_warns_about_an_unreadable_file(tmp_path) -> None:
    path = tmp_path / ".table1.json.partial.json"
    assert results.read_json_or_none(path) is None  # missing: silently absent
    path.write_bytes(b"")
    with pytest.warns(UserWarning, match=r"\.table1\.json\.partial\.json"):
        assert results.read_json_or_none(path, "partial-table file") is None
    path.write_bytes(b'{"rows": {"d50/flat"')
    with pytest.warns(UserWarning, match="partial"):
        assert results.read_json_or_none(path, "partial-table file") is None


def _toy_run():
    torch.set_num_threads(1)
    corpus = toy_corpus(vocab=30, tokens=1500, eval_tokens=200)
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output="random", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=2)
    return corpus, tree, cfg


@pytest.mark.parametrize("damage", [b"", b'{"config": {"output": "ran'])
def test_a_truncated_finished_run_file_is_recomputed_with_a_warning(tmp_path, damage) -> None:
    corpus, tree, cfg = _toy_run()
    first = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "runs")
    (done,) = (tmp_path / "runs").glob("*.json")
    done.write_bytes(damage)  # what a full disk left behind before writes were atomic
    with pytest.warns(UserWarning, match=done.name):
        again = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "runs")
    assert again.test_perplexity == pytest.approx(first.test_perplexity, rel=1e-5)
    assert json.loads(done.read_text())["test_perplexity"] == again.test_perplexity  # rewritten, readable


def test_a_failed_final_write_keeps_the_checkpoint_and_the_rerun_resumes(tmp_path, monkeypatch) -> None:
    corpus, tree, cfg = _toy_run()
    real = lm.training.atomic_write  # what RunFiles.finish writes the finished-run file with

    def disk_full_for_json(path, content):
        if Path(path).suffix == ".json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, content)

    monkeypatch.setattr(lm.training, "atomic_write", disk_full_for_json)
    with pytest.raises(OSError, match="No space"):
        lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "runs")
    monkeypatch.setattr(lm.training, "atomic_write", real)
    assert not list((tmp_path / "runs").glob("*.json")) and list((tmp_path / "runs").glob("*.pt"))
    messages: list[str] = []
    resumed = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "runs", log=messages.append)
    assert any("resuming after epoch 1" in m for m in messages)
    assert [e["epoch"] for e in resumed.epochs] == [1, 2] and list((tmp_path / "runs").glob("*.json"))


def test_an_unreadable_checkpoint_is_ignored_with_a_warning(tmp_path) -> None:
    corpus, tree, cfg = _toy_run()
    straight = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "a")
    stem = next((tmp_path / "a").glob("*.json")).stem
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / f"{stem}.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.warns(UserWarning, match=f"{stem}.pt"):
        again = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "b")
    assert again.test_perplexity == pytest.approx(straight.test_perplexity, rel=1e-5)


# ============================================================================ 8. where runs write; no downgrades
def test_output_path_defaults_to_a_user_folder(tmp_path, monkeypatch) -> None:
    assert results.output_path("results/lm/ptb.json") == Path("hsm-results/lm/ptb.json")
    assert results.output_path("results/lm/ptb.json", "results/lm/ptb.json") == Path("results/lm/ptb.json")
    monkeypatch.setenv("HSM_OUTPUT", str(tmp_path / "mine"))
    assert results.output_path("results/sampling/fig1.json") == tmp_path / "mine" / "sampling" / "fig1.json"


def test_cli_without_out_writes_under_hsm_results_and_leaves_results_alone(capsys) -> None:
    committed = (REPO / "results/sampling/fig1.json").read_bytes()
    code, out, err = _run(capsys, "sampling-fig1", *_fig_args())
    assert code == 0, err
    assert out.strip() == "wrote hsm-results/sampling/fig1.json"
    assert results.load_results("hsm-results/sampling/fig1.json")["provenance"]["hsm_scale"] == "quick"
    assert (REPO / "results/sampling/fig1.json").read_bytes() == committed
    code, out, err = _run(capsys, "list")
    assert code == 0 and "-> hsm-results/lm/ptb.json" in out


def test_a_full_result_is_not_replaced_by_a_quick_run(capsys) -> None:
    target = _result(Path("kept") / "fig1.json", "full, reduced: seeds=0,1")
    before = target.read_bytes()
    code, out, err = _run(capsys, "sampling-fig1", "--out", str(target), *_fig_args())
    assert code == 2 and str(target) in err and "full-scale" in err and "quick-scale" in err
    assert err.count("\n") == 1 and target.read_bytes() == before
    code, out, err = _run(capsys, "sampling-fig1", "--out", str(target), "--force", *_fig_args())
    assert code == 0 and results.load_results(target)["provenance"]["hsm_scale"] == "quick"


def test_write_results_refuses_a_downgrade_unless_forced(tmp_path) -> None:
    path = _result(tmp_path / "r.json", "full")
    with pytest.raises(ValueError, match=r"r\.json holds a full-scale result.*quick-scale"):
        _result_unforced(path, "quick")
    _result_unforced(path, "full")  # same scale: fine
    _result_unforced(tmp_path / "new.json", "quick")  # nothing there: fine
    _result_unforced(tmp_path / "new.json", "full")  # upgrade: fine
    results.write_results(path, [], {"date_utc": "x", "git_commit": None, "hsm_scale": "quick"}, force=True)
    assert results.recorded_scale(path) == "quick"
    for func in (lambda out: S.run_fig1(scale="quick", out=out), lambda out: lm.run_lm_ptb(scale="quick", out=out),
                 lambda out: C.icml_table1(scale="quick", out=out),
                 lambda out: lm_timing.run_lm_timing(scale="quick", out=out)):
        _result(path, "full")
        with pytest.raises(ValueError, match="refusing to replace"):  # refused before any work
            func(path)


def _result_unforced(path: Path, scale: str) -> Path:
    prov = {"date_utc": "2026-01-01T00:00:00Z", "git_commit": None, "hsm_scale": scale}
    return results.write_results(path, [{"claim": None, "value": 2.0}], prov)


def test_bench_refuses_to_replace_a_full_result_with_a_quick_one(tmp_path, capsys) -> None:
    path = _result(tmp_path / "cpu.json", "full")
    assert bench.main(["--quick", "--json", str(path)]) == 2
    assert "refusing to replace" in capsys.readouterr().err and results.recorded_scale(path) == "full"


def test_a_finished_run_says_which_device_it_trained_on(tmp_path) -> None:
    # a run finished on one device and loaded by a command on another keeps that device's timings: say so
    corpus, tree, cfg = _toy_run()
    run = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "runs")
    assert run.device == "cpu"
    (done,) = (tmp_path / "runs").glob("*.json")
    stored = json.loads(done.read_text())
    assert stored["device"] == "cpu"
    done.write_text(json.dumps(dict(stored, device="cuda")))  # as if it had finished on a GPU machine
    with pytest.warns(UserWarning, match="trained on cuda, not cpu"):
        loaded = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "runs")
    assert loaded.device == "cuda" and loaded.test_perplexity == run.test_perplexity


RNG = np.random.default_rng(0)
DOCS = [RNG.integers(0, 60, size=RNG.integers(3, 9)) for _ in range(120)]
SETS = [[i % 7, (i * 3) % 7] if i % 2 else [i % 7] for i in range(120)]
REPEATED = [s + s[:1] for s in SETS]  # every set with its first label again


def test_repeated_gold_labels_count_once_on_the_pytorch_path():
    """The classification tables' PyTorch trainer reads label sets through EncodedSplit: repeated
    labels are dropped there, so sampling and recall see sets."""
    def split(sets):
        values = np.concatenate([np.asarray(s) for s in sets])
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in sets])])
        doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in DOCS])])
        return C.EncodedSplit(np.concatenate(DOCS), doc_offsets, values, offsets, num_labels=7)

    plain, repeated = split(SETS), split(REPEATED)
    assert np.array_equal(plain.label_values, repeated.label_values)
    assert np.array_equal(plain.label_offsets, repeated.label_offsets)
    predictions = np.array([s[-1] for s in SETS])
    assert C._precision_recall(predictions, repeated) == C._precision_recall(predictions, plain)
    rng0, rng1 = np.random.default_rng(3), np.random.default_rng(3)
    assert np.array_equal(plain.sample_labels(rng0), repeated.sample_labels(rng1))
    trained = [C.train_bow(s, "huffman2", 4, 0.2, epochs=1, batch_size=16, vocab_size=60, seed=0)
               for s in (plain, repeated)]
    assert torch.equal(trained[0].layer.weight, trained[1].layer.weight)


def test_lm_experiment_refuses_a_huge_arity_in_one_line(tmp_path, monkeypatch, capsys):
    from hsm_lab.experiments import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    if not (Path(os.environ.get("HSM_DATA_MIRROR", "/nonexistent")) / "ptb").exists():
        pytest.skip("data mirror not available")
    code = cli.main(["lm-ptb", "--scale", "quick", "-o", "arity=1000000", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and "a complete 1000000-ary tree of depth 3" in err and len(err.strip().splitlines()) == 1


def _damage_missing_entry(state):
    del state["optimizer"]


def _damage_wrong_shape(state):
    key = next(iter(state["model"]))
    state["model"][key] = state["model"][key][:1]


def _damage_nan_statistics(state):
    state["statistics"]["sum_probas"][0, 0] = float("nan")


@pytest.mark.parametrize("damage", [_damage_missing_entry, _damage_wrong_shape, _damage_nan_statistics],
                         ids=["missing-entry", "wrong-shape", "nan-statistics"])
def test_a_damaged_checkpoint_is_ignored_with_a_warning_naming_it(tmp_path, damage) -> None:
    """A checkpoint that reads but does not fit the run (an entry missing, another shape, NaN
    statistics) is dropped with a warning naming the file, as an unreadable one: the run starts
    over instead of failing with a traceback on every rerun."""
    import torch

    corpus = toy_corpus(vocab=30, tokens=1500, eval_tokens=200)
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output="learned", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=2)
    straight = lm.train_lm(corpus, cfg, tree=tree)
    folder = tmp_path / "runs"
    files = lm.training.RunFiles.in_folder(folder, cfg, corpus)
    run = lm.training._Training(corpus, cfg, tree, torch.device("cpu"))
    run.start()
    total = run.train_epoch(0, None, 1e9, lambda message: None)
    run.end_epoch(0, total, files, lambda message: None)  # writes the checkpoint after epoch 1
    state = torch.load(files.checkpoint, weights_only=False)
    damage(state)
    torch.save(state, files.checkpoint)
    with pytest.warns(UserWarning, match=f"ignoring damaged checkpoint {files.checkpoint}"):
        again = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=folder)
    assert again.test_perplexity == pytest.approx(straight.test_perplexity, rel=1e-5)
