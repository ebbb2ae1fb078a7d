"""The commands meant for a GPU, run on the CPU at tiny sizes so that they cannot rot: the
benchmark with several batch sizes and precisions, the Gutenberg flat row trained from an exported
corpus without the archive (checkpointed within an epoch and resumed), and the export itself."""
from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest
import torch

from hsm_lab import bench, config, results
from hsm_lab.data import gutenberg
from hsm_lab.data.errors import CorruptArchiveError
from hsm_lab.experiments import lm
from hsm_lab.experiments.cli import main as run_main

MIRROR = config.data_mirror()
needs_gutenberg = pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(),
                                     reason=f"Gutenberg unavailable: set {config.MIRROR_ENV} to the data mirror")
#: a 3-book slice with a 120-word vocabulary: the smallest corpus with every split
SLICE = dict(max_books=3, vocab_size=120)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(gutenberg.PREBUILT_ENV, raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------- the benchmark
def test_bench_dry_run_times_every_batch_precision_and_layer(tmp_path) -> None:
    out = tmp_path / "gpu.json"
    before = torch.get_float32_matmul_precision()
    argv = ["--device", "cpu", "--quick", "--vocab", "300", "--batch", "8", "16", "--repeats", "2",
            "--methods", "flat", "adaptive", "tree-d3", "learned-d3", "--metrics", "train", "logprob", "predict",
            "--precision", "float32", "tf32", "bf16", "--json", str(out)]
    assert bench.main(argv) == 0
    assert torch.get_float32_matmul_precision() == before  # tf32 is set per measurement only
    payload = results.load_results(out)
    assert payload["provenance"]["config"]["device"] == "cpu"
    assert "cuda_device" in payload["provenance"]
    rows = {}
    for record in payload["records"]:
        if record["kind"] in ("ms_per_batch", "skipped"):
            rows.setdefault((record["batch"], record["precision"], record["method"]), []).append(record)
    assert set(rows) == {(b, p, m) for b in (8, 16) for p in ("float32", "tf32", "bf16")
                         for m in ("flat", "adaptive", "tree-d3", "learned-d3")}
    for (batch, precision, method), records in rows.items():
        if records[0]["kind"] == "skipped":  # a layer that cannot run in this precision says why
            assert precision != "float32" and records[0]["skipped"]
            continue
        assert {r["metric"] for r in records} == {"train", "logprob", "predict"}
        assert all(r["value"] > 0 for r in records)
        if method != "flat":  # compared with the flat row of the same V, B and precision
            assert all(r["speedup_vs_flat"] > 0 for r in records)


def test_bench_runs_every_tree_layer_in_bf16_on_the_path_a_gpu_takes(tmp_path) -> None:
    # torch-d3 is the PyTorch path a GPU runs; its node search for the visited count once failed
    # under autocast (a bf16 product written into float32 logits) and the row was skipped
    out = tmp_path / "bf16.json"
    argv = ["--device", "cpu", "--quick", "--vocab", "300", "--batch", "8", "--repeats", "2",
            "--methods", "tree-d3", "learned-d3", "torch-d3", "--metrics", "train_adagrad", "logprob", "predict",
            "--precision", "bf16", "--json", str(out)]
    assert bench.main(argv) == 0
    records = results.load_results(out)["records"]
    assert [r["skipped"] for r in records if r["kind"] == "skipped"] == []
    assert {r["method"] for r in records if r["kind"] == "ms_per_batch"} == {"tree-d3", "learned-d3", "torch-d3"}


def test_gpu_timing_waits_for_the_device_once_per_block(monkeypatch) -> None:
    """On CUDA a timed repeat is a block of calls between two synchronisations, not one per call."""
    syncs, calls = [], []
    monkeypatch.setattr(bench, "_sync", lambda device: syncs.append(device))
    times = bench._median_times(lambda: calls.append(1), repeats=4, budget_s=60.0,
                                device=torch.device("cuda"), warmup=2)
    assert len(calls) == 2 + 4 * bench._GPU_BLOCK
    assert len(syncs) == 1 + 4
    assert times.wall_ms >= 0


def test_bench_refuses_a_bad_precision(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--quick", "--precision", "fp8"])
    assert exc.value.code == 2
    with pytest.raises(ValueError, match="precisions"):
        bench.run_benchmark([16], ["flat"], dim=4, batch=[8], repeats=1, budget_s=0.1, isolate=False,
                            precisions=["fp8"])


# ---------------------------------------------------------------------------- the exported corpus
@pytest.fixture(scope="module")
def slice_cache(tmp_path_factory) -> Path:
    """A cache shared by this module's tests: the slice is tokenized once."""
    return tmp_path_factory.mktemp("slice-cache")


@pytest.fixture(scope="module")
def _export(tmp_path_factory, slice_cache) -> Path:
    if MIRROR is None or not (MIRROR / "gutenberg").exists():
        pytest.skip("Gutenberg unavailable")
    directory = tmp_path_factory.mktemp("export") / "corpus"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HSM_CACHE", str(slice_cache))
        gutenberg.export_lm_corpus(directory, **SLICE, preset=1)
    return directory


@pytest.fixture
def exported(_export, tmp_path, slice_cache, monkeypatch) -> Path:
    """A copy of the exported slice (a test may damage it), with the shared cache."""
    monkeypatch.setenv("HSM_CACHE", str(slice_cache))
    copy = tmp_path / "corpus"
    shutil.copytree(_export, copy)
    return copy


@needs_gutenberg
def test_exported_corpus_loads_identical_to_the_archive_build(exported) -> None:
    built = gutenberg.load_gutenberg(progress=False, **SLICE)
    loaded = gutenberg.load_prebuilt_lm(exported, **SLICE)
    assert loaded.name == built.name and loaded.vocab == built.vocab and loaded.stats == built.stats
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(loaded, split), getattr(built, split))
    assert (loaded.counts == built.counts).all()
    # the stored ids are little-endian uint32
    raw = lzma.decompress((exported / "valid.u32.xz").read_bytes())
    assert len(raw) == 4 * built.valid.numel()
    assert int.from_bytes(raw[:4], "little") == int(built.valid[0])


@needs_gutenberg
def test_exported_corpus_refuses_other_settings_and_damage(exported) -> None:
    with pytest.raises(ValueError, match="vocab_size=120 .wanted 200"):
        gutenberg.load_prebuilt_lm(exported, max_books=3, vocab_size=200)
    packed = bytearray((exported / "test.u32.xz").read_bytes())
    (exported / "test.u32.xz").write_bytes(lzma.compress(b"\x00" * 8))
    with pytest.raises(CorruptArchiveError, match="sha256"):
        gutenberg.load_prebuilt_lm(exported, **SLICE)
    (exported / "test.u32.xz").write_bytes(bytes(packed[:-10]))
    with pytest.raises(CorruptArchiveError, match="decompressed"):
        gutenberg.load_prebuilt_lm(exported, **SLICE)
    (exported / "corpus.json").unlink()
    with pytest.raises(CorruptArchiveError, match="export"):
        gutenberg.load_prebuilt_lm(exported, **SLICE)


@needs_gutenberg
def test_data_export_command(tmp_path, capsys, slice_cache, monkeypatch) -> None:
    from hsm_lab.data.cli import main as data_main

    monkeypatch.setenv("HSM_CACHE", str(slice_cache))
    assert data_main(["export", "gutenberg", str(tmp_path / "c"), "--max-books", "3", "--vocab-size", "120",
                      "--preset", "0"]) == 0
    assert "train.u32.xz" in capsys.readouterr().out
    meta = json.loads((tmp_path / "c" / "corpus.json").read_text())
    assert meta["settings"]["vocab_size"] == 120 and meta["tokens"]["train"] > 0


# ---------------------------------------------------------------------------- the flat row
@needs_gutenberg
def test_flat_row_trains_from_the_export_without_the_archive_and_resumes(exported, tmp_path, monkeypatch,
                                                                          capsys) -> None:
    monkeypatch.delenv(config.MIRROR_ENV)  # as on the GPU machine: no archive, no manifest
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "device-cache"))
    monkeypatch.setenv(gutenberg.PREBUILT_ENV, str(exported))
    out = tmp_path / "flat.json"
    argv = ["lm-gutenberg-65", "--scale", "quick", "--device", "cpu", "--out", str(out),
            "-o", "runs=flat", "-o", "checkpoint_minutes=0.000001", "-o", "max_books=3", "-o", "vocab_size=120",
            "-o", "train_tokens=6000", "-o", "eval_tokens=1500", "-o", "arity=5", "-o", "epochs=2"]

    class Stop(Exception):
        pass

    save = lm.training.RunFiles.save_checkpoint
    saved = []

    def save_then_stop(files, obj):
        save(files, obj)
        saved.append(obj.get("step_in_epoch"))
        if obj.get("step_in_epoch") == 10 and len(obj["result"]["epochs"]) == 1:
            raise Stop  # killed right after a checkpoint within the second epoch

    monkeypatch.setattr(lm.training.RunFiles, "save_checkpoint", save_then_stop)
    with pytest.raises(Stop):
        run_main(argv)
    assert 1 in saved  # a checkpoint after every step: the time-based interval within the epoch
    monkeypatch.setattr(lm.training.RunFiles, "save_checkpoint", save)
    assert run_main(argv) == 0
    assert "flat: resuming in epoch 2 at step 10" in capsys.readouterr().out
    payload = results.load_results(out)
    assert payload["provenance"]["config"]["runs"] == ["flat"]
    recorded = payload["provenance"]["config"]["prebuilt_corpus"]  # the export's identity, not its folder
    meta = json.loads((exported / "corpus.json").read_text())
    assert recorded["sha256"] == meta["sha256"] and recorded["settings"] == meta["settings"]
    assert str(exported) not in json.dumps(payload)
    flat = [r for r in payload["records"] if r.get("run") == "flat"]
    assert flat
    per_epoch = flat[0]["per_epoch"]
    assert [e["epoch"] for e in per_epoch] == [1, 2]
    assert all(e["valid_perplexity"] > 1 and e["test_perplexity"] > 1 for e in per_epoch)
    selection = [r for r in payload["records"] if r.get("measure") == "selection"][0]["selection"]
    assert "tree_trials" not in selection  # the flat row alone searches no tree learning rate


def test_checkpoint_minutes_is_checked() -> None:
    with pytest.raises(ValueError, match="checkpoint_minutes"):
        lm.run_lm_gutenberg_65(scale="quick", out=None, runs="flat", checkpoint_minutes="0")


def test_a_failing_layer_is_recorded_and_the_other_rows_go_on(tmp_path, monkeypatch, capsys) -> None:
    """On a device with minutes to spend, one layer's error must not lose the rows measured so far."""
    time_one = bench._time_one

    def fail_adaptive(config, device):
        if config["method"] == "adaptive":
            raise RuntimeError("no kernel image for this device")
        return time_one(config, device)

    monkeypatch.setattr(bench, "_time_one", fail_adaptive)
    out = tmp_path / "b.json"
    assert bench.main(["--quick", "--vocab", "300", "--methods", "flat", "adaptive", "--metrics", "train",
                       "--json", str(out)]) == 1
    assert "adaptive failed at V=300 B=8 in float32" in capsys.readouterr().err
    records = results.load_results(out)["records"]
    skipped = [r["skipped"] for r in records if r["kind"] == "skipped"]
    assert skipped == ["RuntimeError: no kernel image for this device"]
    assert [r["method"] for r in records if r["kind"] == "ms_per_batch"] == ["flat"]
