"""hsm_lab.experiments.lm: the language-modelling experiments at a tiny scale (structure, invariants)."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm_lab import config, results
from hsm_lab.experiments import lm
from toy_lm import toy_corpus

MIRROR = config.data_mirror()
needs_mirror = pytest.mark.skipif(MIRROR is None or not (MIRROR / "ptb").exists(),
                                  reason=f"PTB unavailable: set {config.MIRROR_ENV} to the data mirror")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what the experiments use on CPU (see hsm_lab.experiments.lm.run_table)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------- data helpers
def test_cap_vocabulary_keeps_unk_and_maps_the_rest_to_it() -> None:
    corpus = toy_corpus()
    capped = lm.cap_vocabulary(corpus, 10)
    assert capped.vocab_size == 10
    assert "<unk>" in capped.vocab
    unk = capped.index("<unk>")
    kept = {corpus.vocab[i] for i in range(10)}
    for old, new in zip(corpus.train.tolist(), capped.train.tolist()):
        assert capped.vocab[new] == (corpus.vocab[old] if corpus.vocab[old] in kept else "<unk>")
    assert capped.counts.sum() == corpus.counts.sum()
    assert capped.counts[unk] >= corpus.counts[corpus.index("<unk>")]
    assert lm.cap_vocabulary(corpus, 1000) is corpus
    with pytest.raises(ValueError):
        lm.cap_vocabulary(corpus, 1)


def test_the_clustering_tree_is_re_exported() -> None:
    import hsm.clustering

    assert lm.clustering_tree is hsm.clustering.clustering_tree and lm.greedy_fill is hsm.clustering.greedy_fill


# ---------------------------------------------------------------------------- training
@pytest.mark.parametrize("output", ["flat", "random", "learned", "adaptive"])
def test_train_lm_records_every_epoch(output) -> None:
    corpus = toy_corpus()
    tree = None if output in ("flat", "adaptive") else lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output=output, context=2, dim=16, arity=4, batch_size=64, lr=0.2, epochs=2, learn_epochs=1,
                         reassign_per_epoch=5)
    res = lm.train_lm(corpus, cfg, tree=tree)
    assert [e["epoch"] for e in res.epochs] == [1, 2]
    assert all(1 < e["test_perplexity"] < corpus.vocab_size for e in res.epochs)
    assert res.test_perplexity == res.epochs[-1]["test_perplexity"]
    assert res.train_ms_per_batch > 0 and res.test_ms_per_batch > 0
    if output == "learned":
        # 5 re-assignments in the first epoch, none after the freeze
        assert len(res.reassignments) == 5
        assert all(r["epoch"] <= 1 for r in res.reassignments)
        assert all(0 <= r["moved_labels"] <= 1 for r in res.reassignments)
        assert set(res.reassignments[-1]["objective_by_depth"]) <= {"0", "1", "2"}
        assert res.tree is not None and res.tree["num_labels"] == corpus.vocab_size
    else:
        assert res.reassignments == []


def test_a_captured_training_step_trains_as_the_eager_one(monkeypatch) -> None:
    """The CUDA-graph path of the training loop, run on the CPU with a stand-in for the capture that
    keeps its contract: the warm-up steps run, the capture itself runs nothing, and every replay
    copies the batch into the captured inputs and rewrites one result tensor in place."""
    from hsm_lab.experiments.lm import training

    corpus = toy_corpus()
    cfg = lm.LMRunConfig(output="learned", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=2,
                         learn_epochs=1, reassign_per_epoch=5)
    eager = lm.train_lm(corpus, cfg, tree=lm.Tree.random(corpus.vocab_size, 4, 3, seed=0))
    calls = {"captures": 0, "replays": 0}

    def capture_on_the_cpu(step, *inputs, warmup=3):
        calls["captures"] += 1
        static = [x.clone() for x in inputs]
        for _ in range(warmup):
            step(*static)
        result = torch.zeros(())

        def replay(*batch):
            calls["replays"] += 1
            for held, new in zip(static, batch):
                held.copy_(new)
            return result.copy_(step(*static))

        return replay

    monkeypatch.setattr(training, "capture_step", capture_on_the_cpu)
    monkeypatch.setattr(training, "captures_step", lambda device, output, cfg: True)
    captured = lm.train_lm(corpus, cfg, tree=lm.Tree.random(corpus.vocab_size, 4, 3, seed=0))
    windows = len(corpus.train) - cfg.context
    full_batches = windows // cfg.batch_size
    assert calls["captures"] == 1  # once per run, at the first full batch (its warm-up step is that batch's)
    assert calls["replays"] == cfg.epochs * full_batches - 1
    assert [e["train_nll"] for e in captured.epochs] == pytest.approx([e["train_nll"] for e in eager.epochs], rel=1e-6)
    assert captured.test_perplexity == pytest.approx(eager.test_perplexity, rel=1e-6)
    assert [r["moved_labels"] for r in captured.reassignments] == [r["moved_labels"] for r in eager.reassignments]


def test_a_run_captures_its_step_only_on_a_gpu_for_a_tree_without_l2() -> None:
    from hsm_lab.experiments.lm import training

    from hsm_lab.output_layers import output_layer

    tree_layer = output_layer("tree", 8, 40, tree=lm.Tree.random(40, 4, 3, seed=0))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    plain, with_l2 = lm.LMRunConfig(output="learned"), lm.LMRunConfig(output="learned", l2=5e-5)
    assert training.captures_step(cuda, tree_layer, plain)
    assert not training.captures_step(cpu, tree_layer, plain)
    assert not training.captures_step(cuda, tree_layer, with_l2)
    assert not training.captures_step(cuda, torch.nn.Linear(8, 40), lm.LMRunConfig(output="flat"))


def test_interrupted_run_resumes_to_the_same_result(tmp_path) -> None:
    corpus = toy_corpus()
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output="learned", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=3,
                         learn_epochs=2, reassign_per_epoch=4)
    straight = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "a")

    class Stop(Exception):
        pass

    def stop_after_first_epoch(message: str) -> None:
        if "epoch 1:" in message:
            raise Stop

    with pytest.raises(Stop):
        lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "b", log=stop_after_first_epoch)
    assert list((tmp_path / "b").glob("*.pt"))
    messages = []
    resumed = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "b", log=messages.append)
    assert any("resuming after epoch 1" in m for m in messages)
    assert [e["epoch"] for e in resumed.epochs] == [1, 2, 3]
    assert resumed.test_perplexity == pytest.approx(straight.test_perplexity, rel=1e-4)
    assert len(resumed.reassignments) == len(straight.reassignments)
    # a finished run is loaded, not trained again
    again = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "b", log=messages.append)
    assert again.test_perplexity == resumed.test_perplexity
    assert not list((tmp_path / "b").glob("*.pt"))


@pytest.mark.parametrize("output", ["random", "learned"])
def test_run_interrupted_within_an_epoch_resumes_at_the_next_step(tmp_path, monkeypatch, output) -> None:
    """Within-epoch checkpoints (a Gutenberg epoch outlasts a GPU call): stop right after a save in
    the middle of epoch 2, resume, and get the uninterrupted run's result."""
    corpus = toy_corpus()
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output=output, context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=3,
                         learn_epochs=2, reassign_per_epoch=4)
    straight = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "a")

    class Stop(Exception):
        pass

    save = lm.training.RunFiles.save_checkpoint  # what train_lm's checkpoints call
    steps_per_epoch = -(-len(corpus.windows("train", 2)[1]) // 64)

    def save_then_stop(files, obj):
        save(files, obj)
        if obj["step_in_epoch"] == steps_per_epoch // 2 and len(obj["result"]["epochs"]) == 1:
            raise Stop  # the process dies right after writing a within-epoch checkpoint

    monkeypatch.setattr(lm.training.RunFiles, "save_checkpoint", save_then_stop)
    with pytest.raises(Stop):
        lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "b", checkpoint_seconds=1e-9)
    monkeypatch.setattr(lm.training.RunFiles, "save_checkpoint", save)
    messages = []
    resumed = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path / "b", log=messages.append,
                          checkpoint_seconds=1e-9)
    assert any(f"resuming in epoch 2 at step {steps_per_epoch // 2}" in m for m in messages)
    assert [e["epoch"] for e in resumed.epochs] == [1, 2, 3]
    for got, want in zip(resumed.epochs, straight.epochs):
        assert got["train_nll"] == pytest.approx(want["train_nll"], rel=1e-5)
        assert got["test_perplexity"] == pytest.approx(want["test_perplexity"], rel=1e-4)
    assert len(resumed.reassignments) == len(straight.reassignments)
    with pytest.raises(ValueError, match="checkpoint_seconds"):
        lm.train_lm(corpus, cfg, tree=tree, checkpoint_seconds=0)


def test_train_lm_rejects_bad_setups() -> None:
    corpus = toy_corpus()
    with pytest.raises(ValueError, match="output"):
        lm.train_lm(corpus, lm.LMRunConfig(output="huffman"))
    with pytest.raises(ValueError, match="needs a tree"):
        lm.train_lm(corpus, lm.LMRunConfig(output="random"))
    with pytest.raises(ValueError, match="labels"):
        lm.train_lm(corpus, lm.LMRunConfig(output="random"), tree=lm.Tree.random(10, 3, 3, seed=0))


def test_diverging_learning_rate_is_reported() -> None:
    corpus = toy_corpus()
    cfg = lm.LMRunConfig(output="flat", context=2, dim=16, batch_size=64, lr=1e30, epochs=1)
    with pytest.raises(FloatingPointError, match="lr"):
        lm.train_lm(corpus, cfg)


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        lm.run_lm_ptb(scale="quick", out=None, bogus=1)


# ---------------------------------------------------------------------------- experiments (real data, tiny)
TINY = dict(train_tokens="6000", eval_tokens="1500", vocab_size="120", arity="5", epochs="2", learn_epochs="1",
            reassign_per_epoch="4")


def _check_result_file(path: Path, runs: set[str]) -> dict:
    payload = results.load_results(path)
    records = payload["records"]
    assert payload["provenance"]["config"]["experiment"]
    assert payload["provenance"]["wall_time_s"] > 0
    seen = {r["run"] for r in records if "run" in r}
    assert seen == runs
    for record in records:
        assert record["claim"] is None  # tiny runs never claim a paper number
        if record.get("measure") == "test_perplexity":
            assert 1 < record["value"] < record["vocab_size"] * 1.5
            assert len(record["per_epoch"]) == record["epochs"]
            assert record["scale_note"]
        if record.get("measure", "").endswith("ms_per_batch"):
            assert record["value"] > 0
    return payload


@needs_mirror
def test_lm_ptb_tiny(tmp_path) -> None:
    out = lm.run_lm_ptb(scale="quick", out=tmp_path / "ptb.json", **TINY)
    payload = _check_result_file(out, {"flat", "random", "learned"})
    tree, counts = lm.load_tree_file(out.with_name("ptb-learned-tree.json.gz"))
    assert tree.num_labels == 120 and len(counts) == 120
    moved = [r for r in payload["records"] if r.get("measure") == "mean_moved_labels"]
    assert moved and 0 <= moved[0]["value"] <= 1
    best = lm.best_epoch_markdown(payload, "arxiv2016.table1.ptb")
    assert best.count("\n") == 5 and "| 151 |" in best  # 3 rows, the paper's flat perplexity beside ours


@needs_mirror
def test_lm_ptb_schedules_tiny(tmp_path) -> None:
    out = lm.run_lm_ptb_schedules(scale="quick", out=tmp_path / "s.json", **dict(TINY, epochs="3", learn_epochs="2"))
    _check_result_file(out, {"flat", "random", "learned_1_2", "learned_2_1"})


@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
def test_lm_gutenberg_65_tiny(tmp_path) -> None:
    out = lm.run_lm_gutenberg_65(scale="quick", out=tmp_path / "g.json", max_books="3", **TINY)
    payload = _check_result_file(out, {"clustering", "random", "flat", "learned", "adaptive"})
    speed = [r for r in payload["records"] if r.get("measure") == "train_speedup"]
    assert speed and speed[0]["value"] > 0


def test_fractional_learn_epochs_freezes_mid_epoch() -> None:
    corpus = toy_corpus()
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output="learned", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=1,
                         learn_epochs=0.5, reassign_per_epoch=8)
    res = lm.train_lm(corpus, cfg, tree=tree)
    assert res.reassignments and all(r["epoch"] <= 0.5 for r in res.reassignments)
    assert 3 <= len(res.reassignments) <= 4
    assert lm._parse_options({"learn_epochs": "0.5", "epochs": "2"}) == {"learn_epochs": 0.5, "epochs": 2}
    assert lm._parse_options({"decay": "1", "l2": "5e-5"}) == {"decay": 1.0, "l2": 5e-5}


# ------------------------------------------------------------------ ablation (why the learned tree gains little)
def test_config_fields_at_their_defaults_leave_the_checkpoint_key_unchanged() -> None:
    """Runs checkpointed before prior/prior_mode/wrt/fixed_tree/track_objective existed are
    found again: those fields enter the key only when they differ from their defaults."""
    import hashlib

    cfg = lm.LMRunConfig(output="learned", lr=0.05, epochs=2, learn_epochs=1)
    old_fields = {k: v for k, v in asdict(cfg).items()
                  if k not in {"num_negatives", "prior", "prior_mode", "wrt", "fixed_tree", "track_objective", "l2"}}
    old_key = hashlib.sha1(json.dumps(old_fields, sort_keys=True).encode()).hexdigest()[:12]
    assert cfg.key() == old_key
    changed = {replace(cfg, **change).key() for change in (
        {"prior": 2.0}, {"prior_mode": "uniform"}, {"wrt": "p"}, {"fixed_tree": "retrained:base"},
        {"track_objective": True}, {"l2": 5e-5})}
    assert len(changed) == 6 and old_key not in changed


def test_tracking_a_fixed_tree_records_its_objective_without_moving_it() -> None:
    corpus = toy_corpus()
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output="random", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=2, learn_epochs=1,
                         reassign_per_epoch=5, track_objective=True)
    res = lm.train_lm(corpus, cfg, tree=tree)
    # tracked at the learned tree's rebuild steps, in every epoch, and the tree never moves
    assert len(res.reassignments) == 10
    assert all(r["moved_labels"] == 0 for r in res.reassignments)
    assert all(0 <= j <= 1 for r in res.reassignments for j in r["objective_by_depth"].values())
    assert lm.Tree.from_dict(res.tree).to_dict() == tree.to_dict()


@pytest.mark.parametrize("change", [{"prior_mode": "uniform"}, {"wrt": "p"}, {"decay": 0.0}])
def test_learned_tree_options_reach_the_learner(change) -> None:
    corpus = toy_corpus()
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output="learned", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=1, learn_epochs=1,
                         reassign_per_epoch=4, **change)
    res = lm.train_lm(corpus, cfg, tree=tree)
    assert len(res.reassignments) == 4 and res.config[next(iter(change))] == next(iter(change.values()))


def test_train_lm_rejects_an_unknown_ranking() -> None:
    with pytest.raises(ValueError, match="wrt"):
        lm.train_lm(toy_corpus(), lm.LMRunConfig(output="flat", wrt="q"))


def test_unknown_ablation_variant_is_rejected() -> None:
    with pytest.raises(ValueError, match="variants"):
        lm.run_lm_ptb_ablation(scale="quick", variants="base,bogus")


@needs_mirror
def test_lm_ptb_ablation_tiny(tmp_path) -> None:
    out = lm.run_lm_ptb_ablation(scale="quick", out=tmp_path / "a.json", variants="base,decay_0,lr_0.1,l2_5e-5",
                                 random_seeds="2", **{k: v for k, v in TINY.items()})
    payload = results.load_results(out)
    runs = {r["run"]: r for r in payload["records"] if r["measure"] == "test_perplexity"}
    assert set(runs) == {"random_seed0", "random_seed1", "random_lr0.1", "random_l25e-05", "base", "decay_0", "lr_0.1",
                         "l2_5e-5", "retrained"}
    assert all(r["claim"] is None for r in payload["records"])
    for name, record in runs.items():
        assert 1 < record["value"] < 1.5 * record["vocab_size"]
        reference = runs[record["reference_run"]]
        assert record["reference_run"] == ("random_lr0.1" if record["lr"] == 0.1 else "random_l25e-05"
                                           if record["config"].get("l2") else "random_seed0")
        assert record["gain_vs_random"] == pytest.approx(reference["value"] - record["value"])
    assert runs["decay_0"]["config"]["decay"] == 0.0 and runs["lr_0.1"]["config"]["lr"] == 0.1
    for name in ("base", "decay_0", "lr_0.1"):
        assert 0 <= runs[name]["moved_labels_last_epoch"] <= 1
        assert runs[name]["reassignments"] and all(r["epoch"] <= 1 for r in runs[name]["reassignments"])
    # the random tree's J_n is tracked at the same steps; the retrained tree is base's final tree
    assert all(r["moved_labels"] == 0 for r in runs["random_seed0"]["reassignments"])
    assert runs["retrained"]["config"]["fixed_tree"] == "retrained:base"
    spread = next(r for r in payload["records"] if r["measure"] == "random_seed_spread")
    assert spread["value"] == pytest.approx(np.std(spread["test_perplexities"]))
    assert set(payload["provenance"]["config"]["variants"]) == {"base", "decay_0", "lr_0.1", "l2_5e-5"}
    # the notebook's table and figure read it
    table = lm.ablation_markdown(payload)
    assert table.count("\n") == 2 + len(runs) and "random_l25e-05" in table
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3)
    lm.plot_ablation(payload, axes)
    assert axes[0].lines and axes[1].lines and len(axes[2].patches) >= 4
    plt.close(fig)


def test_l2_adds_the_penalty_gradient_on_touched_rows_only() -> None:
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(6, 3, sparse=True)
    dense = torch.nn.Linear(3, 2)
    loss = dense(embedding(torch.tensor([1, 4, 1])).sum(0)).sum()
    loss.backward()
    sparse_before = embedding.weight.grad.coalesce().to_dense().clone()
    dense_before = dense.weight.grad.clone()
    lm._add_l2([embedding.weight, dense.weight, dense.bias], 0.1)
    sparse_after = embedding.weight.grad.to_dense()
    touched = torch.tensor([1, 4])
    untouched = torch.tensor([0, 2, 3, 5])
    w = embedding.weight.detach()
    assert torch.allclose(sparse_after[touched], sparse_before[touched] + 0.1 * w[touched])
    assert (sparse_after[untouched] == 0).all()
    assert torch.allclose(dense.weight.grad, dense_before + 0.1 * dense.weight.detach())


def test_l2_changes_training_and_is_validated() -> None:
    corpus = toy_corpus()
    tree = lm.Tree.random(corpus.vocab_size, 4, 3, seed=0)
    cfg = lm.LMRunConfig(output="random", context=2, dim=8, arity=4, batch_size=64, lr=0.2, epochs=1)
    plain = lm.train_lm(corpus, cfg, tree=tree)
    penalised = lm.train_lm(corpus, replace(cfg, l2=0.05), tree=tree)
    assert penalised.epochs[0]["train_nll"] != plain.epochs[0]["train_nll"]
    with pytest.raises(ValueError, match="l2"):
        lm.train_lm(corpus, replace(cfg, l2=-1.0), tree=tree)


@needs_mirror
def test_lm_ptb_tiny_with_l2_says_so(tmp_path) -> None:
    out = lm.run_lm_ptb(scale="quick", out=tmp_path / "ptb.json", l2="1e-4", decay="1", **TINY)
    payload = _check_result_file(out, {"flat", "random", "learned"})
    assert payload["provenance"]["config"]["l2"] == 1e-4 and payload["provenance"]["config"]["decay"] == 1.0
    assert all("decay 1" in r["scale_note"] for r in payload["records"] if r.get("measure") == "test_perplexity")
    assert "l2=1e-4" in payload["provenance"]["hsm_scale"]
    notes = {r["scale_note"] for r in payload["records"] if r.get("measure") == "test_perplexity"}
    assert notes and all("L2 0.0001" in note for note in notes)


@needs_mirror
def test_a_run_described_by_an_option_records_the_description_for_its_rerun(tmp_path) -> None:
    out = lm.run_lm_ptb(scale="quick", out=tmp_path / "ptb.json", description="a tiny slice", **TINY)
    prov = json.loads(out.read_text())["provenance"]
    assert prov["config"]["description"] == "a tiny slice"
    assert prov["config"]["overrides"]["description"] == "a tiny slice"
    assert "description" not in prov["hsm_scale"]


# ---------------------------------------------------------------------------- a table in parts
@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
def test_a_table_runs_in_parts_each_saying_which(tmp_path) -> None:
    common = dict(TINY, max_books="3", lr_grid="0.05,0.1", select_steps="5", select_eval_tokens="200")
    selection = lm.run_lm_gutenberg_65(scale="quick", out=tmp_path / "sel.json", runs="selection", **common)
    payload = results.load_results(selection)
    assert payload["provenance"]["config"]["runs"] == []
    assert [r["measure"] for r in payload["records"]] == ["selection"]
    trials = payload["records"][0]["selection"]["tree_trials"]
    assert [t["lr"] for t in trials] == [0.05, 0.1]
    # the second part reuses the trials (same folder), trains seed 1 only, and says so
    part = lm.run_lm_gutenberg_65(scale="quick", out=tmp_path / "random1.json", runs="random",
                                  first_random_seed="1", **common)
    payload = _check_result_file(part, {"random"})
    chosen = [r for r in payload["records"] if r["measure"] == "selection"][0]["selection"]
    assert chosen["random_seeds"] == [1] and chosen["random_best_seed"] == 1
    assert chosen["tree_trials"] == trials
    random_record = [r for r in payload["records"] if r.get("run") == "random"][0]
    assert "first_random_seed=1" in payload["provenance"]["hsm_scale"]
    assert random_record["per_epoch"]


def test_runs_option_is_checked() -> None:
    with pytest.raises(ValueError, match="runs.*unknown bogus"):
        lm.run_lm_gutenberg_65(scale="quick", out=None, runs="bogus")
    with pytest.raises(ValueError, match="stands alone"):
        lm.run_lm_gutenberg_65(scale="quick", out=None, runs="selection,learned")
    with pytest.raises(ValueError, match="clustering_embeddings"):
        lm.run_lm_gutenberg_65(scale="quick", out=None, clustering_embeddings="glove")


def test_learning_rate_trials_scored_on_a_validation_slice_keep_their_own_folder(tmp_path) -> None:
    corpus = toy_corpus()
    sc = replace(lm.SCALES["lm-ptb"]["quick"], lr_grid=(0.05, 0.1), select_steps=5, select_eval_tokens=100)
    base = lm.LMRunConfig(output="random", context=2, arity=7, epochs=1)
    tree = lm.Tree.random(corpus.vocab_size, 7, 3, seed=0)
    lr, trials = lm._select_lr(corpus, base, tree, sc, "cpu", tmp_path, lambda message: None)
    assert lr in (0.05, 0.1) and len(trials) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["select-eval100"]
    # scored on all validation tokens, the same trials are trained again beside (not mixed up)
    lr_all, trials_all = lm._select_lr(corpus, base, tree, replace(sc, select_eval_tokens=None), "cpu", tmp_path,
                                       lambda message: None)
    assert len(list(tmp_path.glob("random-*.json"))) == 2
    assert [t["valid_perplexity"] for t in trials_all] != [t["valid_perplexity"] for t in trials]


def test_fasttext_embeddings_one_row_per_word_and_cached(monkeypatch) -> None:
    fasttext = pytest.importorskip("fasttext")
    corpus = toy_corpus(vocab=30, tokens=4000)
    vectors = lm.fasttext_embeddings(corpus, dim=8, epochs=1, threads=1)
    assert vectors.shape == (30, 8) and vectors.dtype == np.float32 and np.isfinite(vectors).all()
    # bigram structure: w -> 7w+noise; vectors differ between words
    assert np.linalg.matrix_rank(vectors) > 1

    def no_training(*args, **kwargs):
        raise AssertionError("trained again although the vectors are cached")

    monkeypatch.setattr(fasttext, "train_unsupervised", no_training)
    np.testing.assert_array_equal(lm.fasttext_embeddings(corpus, dim=8, epochs=1, threads=1), vectors)
    tree = lm.clustering_tree(vectors, 4, 3, seed=0)
    assert tree.num_labels == 30


def test_fasttext_embeddings_with_character_ngrams_are_cached_apart(monkeypatch) -> None:
    pytest.importorskip("fasttext")
    corpus = toy_corpus(vocab=30, tokens=4000)
    words = lm.fasttext_embeddings(corpus, dim=8, epochs=1, threads=1)
    ngrams = lm.fasttext_embeddings(corpus, dim=8, epochs=1, threads=1, char_ngrams=(3, 6))
    assert ngrams.shape == words.shape and not np.array_equal(ngrams, words)
    with pytest.raises(ValueError, match="char_ngrams"):
        lm.fasttext_embeddings(corpus, dim=8, epochs=1, threads=1, char_ngrams=(4, 2))


def test_fasttext_embeddings_refuse_words_fasttext_would_split() -> None:
    pytest.importorskip("fasttext")
    corpus = toy_corpus(vocab=30, tokens=500)
    corpus.vocab[5] = "two words"
    with pytest.raises(ValueError, match="white space"):
        lm.fasttext_embeddings(corpus, dim=4, epochs=1, threads=1)


def test_ranked_adaptive_softmax_is_a_distribution_over_the_original_ids() -> None:
    from hsm_lab.output_layers import AdaptiveSoftmaxBaseline

    counts = np.array([5, 40, 1, 300, 7, 0, 22, 90, 3, 11], dtype=np.int64)
    layer = AdaptiveSoftmaxBaseline(8, len(counts), counts=counts)
    # the most frequent word (id 3) is rank 0, the head of the adaptive softmax
    assert layer.rank[3] == 0 and layer.rank[1] == 2 and layer.rank[5] == 9
    hidden = torch.randn(6, 8)
    full = layer.adaptive.log_prob(hidden)  # [B, V] over ranks
    for word in range(len(counts)):
        target = torch.full((6,), word)
        out = layer(hidden, target).output
        torch.testing.assert_close(out, full[:, layer.rank[word]])
    torch.testing.assert_close(full.exp().sum(1), torch.ones(6))


def _part(rows: dict[str, tuple[float, float]], seeds: list[int] | None = None, tokens: int = 100,
          epochs: int = 2) -> dict:
    records = []
    for run, (valid, test) in rows.items():
        common = dict(run=run, model=run, vocab_size=10, train_tokens=tokens, context=4, per_epoch=[], epochs=epochs)
        records.append(dict(common, measure="test_perplexity", value=test, valid_perplexity=valid))
        records.append(dict(common, measure="train_ms_per_batch", value=1.0))
        records.append(dict(common, measure="test_ms_per_batch", value=0.5))
    if seeds is not None:
        valid, test = rows["random"]
        records.append(dict(measure="selection", value=0.05, selection={
            "random_seeds": seeds, "random_seed_valid": [valid], "random_seed_test": [test]}))
    return {"records": records, "provenance": {"hsm_scale": "full"}}


def test_combine_parts_takes_the_best_random_seed_on_validation() -> None:
    parts = [_part({"learned": (150.0, 149.0)}), _part({"random": (170.0, 160.0)}, seeds=[0]),
             _part({"random": (165.0, 168.0)}, seeds=[1]), _part({"clustering": (220.0, 212.0)})]
    table = lm.combine_parts(parts)
    runs = lm.runs_of(table)
    assert set(runs) == {"learned", "random", "clustering"}
    assert runs["random"]["test_perplexity"]["value"] == 168.0  # seed 1: better on validation, worse on test
    assert table["random_seeds"] == {0: {"valid": 170.0, "test": 160.0}, 1: {"valid": 165.0, "test": 168.0}}
    markdown = lm.table_markdown(table, "icml2017.table2", delta=True)
    assert "ours - paper" in markdown and "| +8.0 |" in markdown  # random: 168 against the paper's 160
    assert "epoch" not in markdown  # every row trained as long
    shorter = lm.table_markdown(lm.combine_parts(parts + [_part({"adaptive": (180.0, 175.0)}, epochs=1)]))
    assert "| adaptive (1 epoch only) | 175.0 |" in shorter and "| learned | 149.0 |" in shorter
    with pytest.raises(ValueError, match="row 'learned' is in parts 0 and 1"):
        lm.combine_parts([parts[0], parts[0]])
    with pytest.raises(ValueError, match="other data"):
        lm.combine_parts([parts[0], _part({"random": (1.0, 1.0)}, seeds=[0], tokens=5)])


@settings(max_examples=20, deadline=None)
@given(st.integers(20, 300), st.integers(3, 8), st.integers(0, 10_000))
def test_leaf_table_picks_the_heaviest_bottom_nodes(num_labels, arity, seed) -> None:
    if arity**3 < num_labels:
        arity = int(np.ceil(num_labels ** (1 / 3))) + 1
    tree = lm.Tree.random(num_labels, arity, 3, seed=seed, label_names=[f"w{i}" for i in range(num_labels)])
    counts = np.random.default_rng(seed).integers(1, 1000, num_labels)
    table = lm.leaf_table(tree, counts, nodes=3, words=4, min_words=2)
    # the rule by brute force: bottom nodes with >= 2 words, by their words' total count
    bottom = [n for n in range(tree.num_nodes) if tree.node_depth[n] == 2 and tree.labels_under(n).size >= 2]
    expected = sorted(((counts[tree.labels_under(n)].sum(), n) for n in bottom), reverse=True)[:3]
    assert list(table) == [f"node {n}" for _, n in expected]
    for _, n in expected:
        assert table[f"node {n}"] == tree.top_labels(n, counts, 4)
    sample = lm.leaf_table(tree, counts, nodes=3, words=4, min_words=2, sample_seed=seed)
    assert set(sample) <= {f"node {n}" for n in bottom} and len(sample) == min(3, len(bottom))
    assert sample == lm.leaf_table(tree, counts, nodes=3, words=4, min_words=2, sample_seed=seed)


# ---------------------------------------------------------------------------- the package's contracts
@pytest.mark.parametrize("cfg, key", [
    (lm.LMRunConfig(output="random"), "14842a197261"),
    (lm.LMRunConfig(output="flat"), "e63f06dddabf"),
    (lm.LMRunConfig(output="nce"), "15a987799fc1"),
    (lm.LMRunConfig(output="nce", num_negatives=7), "725a3749db86"),
    (lm.LMRunConfig(output="learned", prior_mode="uniform"), "a5ba269d81cb"),
    (lm.LMRunConfig(output="learned", wrt="p"), "9cb753d174bf"),
    (lm.LMRunConfig(output="learned", decay=1.0), "d7201ece514a"),
    (lm.LMRunConfig(output="learned", fixed_tree="retrained:base"), "21dd23c8d1a1"),
    (lm.LMRunConfig(output="learned", l2=5e-5), "6da568b50396"),
    (lm.LMRunConfig(output="learned", track_objective=True), "f8e91bb7e1a3"),
])
def test_run_keys_are_pinned(cfg, key) -> None:
    """The keys name the finished runs and checkpoints under the cache: a changed key would make
    every committed result unreachable from its runs (and restart long runs)."""
    assert cfg.key() == key


def test_the_lm_ptb_full_learned_run_key_is_pinned() -> None:
    sc = lm.SCALES["lm-ptb"]["full"]
    cfg = lm.LMRunConfig(output="learned", context=sc.context, arity=sc.arity, depth=3, batch_size=sc.batch_size,
                         epochs=sc.epochs, learn_epochs=sc.learn_epochs, reassign_per_epoch=sc.reassign_per_epoch,
                         l2=sc.l2, lr=sc.lr_grid[0], decay=sc.decay)
    assert cfg.key() == "0155a18f3317"


def test_scale_label_calls_only_smaller_runs_reductions() -> None:
    from hsm_lab.experiments.lm.presets import SCALES
    from hsm_lab.experiments.lm.report import scale_label

    full = SCALES["lm-gutenberg-65"]["full"]
    assert scale_label("full", {}, full) == "full"
    assert scale_label("full", {"decay": "1", "epochs": "2", "learn_epochs": "1"}, full) == (
        "full, reduced: epochs=2; settings: decay=1, learn_epochs=1")
    # a setting alone is not a reduction, and a grid of one rate is fewer trials than the preset's
    assert scale_label("full", {"decay": "1", "l2": "5e-5"}, full) == "full, settings: decay=1, l2=5e-5"
    assert scale_label("full", {"lr_grid": "0.05"}, full) == "full, reduced: lr_grid=0.05"
    # more epochs than the preset is a setting, not a reduction
    assert scale_label("full", {"epochs": str(full.epochs + 1)}, full) == f"full, settings: epochs={full.epochs + 1}"


def test_read_runs_picks_the_best_epoch_on_validation_only() -> None:
    epochs = [{"epoch": 1, "valid_perplexity": 200.0, "test_perplexity": 210.0},
              {"epoch": 2, "valid_perplexity": 180.0, "test_perplexity": 195.0},
              {"epoch": 3, "valid_perplexity": 185.0, "test_perplexity": 190.0}]
    records = [{"run": "random", "measure": "test_perplexity", "model": "Random Tree", "value": 190.0,
                "per_epoch": epochs, "epochs": 3},
               {"run": "random", "measure": "train_ms_per_batch", "value": 5.0},
               {"run": "random", "measure": "test_ms_per_batch", "value": 1.0}]
    row = lm.read_runs({"records": records})["random"]
    # epoch 3 has the lowest test perplexity, but early stopping may only look at validation
    assert (row.best_epoch, row.best_test) == (2, 195.0)
    assert row.final == 190.0 and row.final_valid == 185.0 and row.valid == [200.0, 180.0, 185.0]
    assert row.train_ms == 5.0 and row.rebuilds == []


def test_leaf_table_markdown_shows_tokens_literally() -> None:
    table = lm.leaf_table_markdown({"node 1": ["<eos>", "s_", "a|b"], "node 2": ["the"]})
    lines = table.splitlines()
    assert lines[0] == "| node 1 | node 2 |"
    assert lines[2] == "| &lt;eos&gt; | the |"  # not an HTML tag
    assert lines[3] == "| s\\_ |  |" and lines[4] == "| a\\|b |  |"


# ---------------------------------------------------------------------------- the Gutenberg offset runs


def test_kept_model_gives_the_recorded_perplexity(tmp_path) -> None:
    corpus = toy_corpus()
    cfg = lm.LMRunConfig(output="random", context=2, dim=16, arity=7, epochs=1)
    tree = lm.Tree.random(corpus.vocab_size, 7, 3, seed=0)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        lm.train_lm(corpus, cfg, tree=tree, keep_model=True)
    run = lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path, keep_model=True)
    files = lm.RunFiles.in_folder(tmp_path, cfg, corpus)
    model, output, kept_cfg = lm.training.load_trained_model(files.model)
    assert kept_cfg == cfg
    nll = lm.token_nll(model, output, *corpus.windows("test", cfg.context), batch_size=97)
    assert nll.shape == (corpus.test.numel(),)
    assert np.exp(nll.mean()) == pytest.approx(run.test_perplexity, rel=1e-6)
    # a finished run without its model cannot give one: it says how to get it
    files.model.unlink()
    with pytest.raises(FileNotFoundError, match="keep_model"):
        lm.train_lm(corpus, cfg, tree=tree, checkpoint_dir=tmp_path, keep_model=True)


def test_per_book_perplexity_pools_a_book_s_pieces_and_cuts_to_the_split() -> None:
    nll = np.log(np.array([2.0, 2.0, 8.0, 8.0, 4.0, 4.0]))
    unk = np.array([0, 1, 0, 0, 0, 0], dtype=bool)
    segments = [("A/a.txt", 0, 2), ("B/b\r.txt", 2, 4), ("A/a.txt", 4, 6), ("C/c.txt", 6, 9)]  # C lies beyond
    books = lm.per_book_perplexity(nll, segments, unk, {"A/a.txt": "fiction"})
    by_name = {row["book"]: row for row in books}
    assert set(by_name) == {"A/a.txt", "B/b.txt"}
    assert by_name["A/a.txt"]["perplexity"] == pytest.approx(np.sqrt(8.0)) and by_name["A/a.txt"]["tokens"] == 4
    assert by_name["A/a.txt"]["unk_share"] == 0.25 and by_name["B/b.txt"]["genre"] == "unlabelled"
    genres = lm.offset.by_genre(books)
    assert genres["fiction"]["books"] == 1 and genres["unlabelled"]["perplexity"] == pytest.approx(8.0)


def test_every_held_out_book_of_both_labelled_draws_has_a_genre() -> None:
    genres = lm.book_genres()
    assert set(genres.values()) <= {"fiction", "drama", "poetry", "non-fiction", "mixed"}
    if MIRROR is None or not (MIRROR / "gutenberg").exists():
        pytest.skip("Gutenberg unavailable")
    from hsm_lab.data import gutenberg

    books = gutenberg.select_books()
    for seed in (None, 1):
        test = gutenberg.split_pieces([1] * len(books), split_seed=seed)["test"]
        assert all(books[i].path.replace("\r", "") in genres for i, _, _ in test)


def test_split_options_are_checked() -> None:
    with pytest.raises(ValueError, match="split"):
        lm.run_lm_gutenberg_offset(scale="quick", split="pages")
    with pytest.raises(ValueError, match="only the gutenberg dataset"):
        lm.run_lm_ptb(scale="quick", min_count="3")
    with pytest.raises(ValueError, match="split_seed"):
        lm.run_lm_gutenberg_offset(scale="quick", split_seed="-1")


@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
@pytest.mark.parametrize("variant", [{}, {"split": "chunks", "chunk_tokens": "500"}])
def test_lm_gutenberg_offset_tiny(tmp_path, variant) -> None:
    out = lm.run_lm_gutenberg_offset(scale="quick", out=tmp_path / "o.json", max_books="4",
                                     **dict(TINY, epochs="1"), **variant)
    payload = json.loads(out.read_text())
    records = {r["measure"]: r for r in payload["records"]}
    books = records["test_perplexity_by_book"]["books"]
    assert sum(b["tokens"] for b in books) == records["test_perplexity"]["test_tokens"]
    pooled = np.exp(sum(np.log(b["perplexity"]) * b["tokens"] for b in books) / sum(b["tokens"] for b in books))
    assert pooled == pytest.approx(records["test_perplexity"]["value"], rel=1e-6)
    # a cut test split holds the first pieces only: one whole book, or pieces of a few books
    assert len(books) == 1 if not variant else 1 < len(books) <= records["test_perplexity"]["test_books"]
    assert ("split=chunks" in payload["provenance"]["hsm_scale"]) == bool(variant)
    assert records["test_perplexity"]["claim"] is None


@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
def test_a_clustering_tree_grouped_at_random_is_its_own_run(tmp_path) -> None:
    options = dict(TINY, max_books="3", runs="clustering")
    ours = json.loads(lm.run_lm_gutenberg_65(scale="quick", out=tmp_path / "a.json", **options).read_text())
    other = json.loads(lm.run_lm_gutenberg_65(scale="quick", out=tmp_path / "b.json", clustering_groups="random",
                                              **options).read_text())
    first = lambda payload: payload["records"][0]  # noqa: E731
    assert first(ours)["model"] == "Clustering Tree"
    assert first(other)["model"] == "Clustering Tree (random top level)"
    assert first(other)["value"] != first(ours)["value"]  # trained on its own tree, not read from the first run
    assert "clustering_groups=random" in other["provenance"]["hsm_scale"]
    with pytest.raises(ValueError, match="clustering_groups"):
        lm.run_lm_gutenberg_65(scale="quick", clustering_groups="nearest")


def test_each_clustering_tree_variant_has_its_own_run_key() -> None:
    from hsm_lab.experiments.lm.tables import clustering_variant

    sc = lm.SCALES["lm-gutenberg-65"]["full"]
    assert clustering_variant(sc) is None  # the table's own tree: the committed runs' key
    assert clustering_variant(replace(sc, clustering_groups="random")) == "clustering:groups=random"
    assert (clustering_variant(replace(sc, clustering_embeddings="fasttext-ngrams"))
            == "clustering:embeddings=fasttext-ngrams")
    assert (clustering_variant(replace(sc, clustering_groups="random", clustering_embeddings="fasttext-ngrams"))
            == "clustering:groups=random,embeddings=fasttext-ngrams")


# ---------------------------------------------------------------------------- thesis Lemma 3.1, measured


def test_mean_objective_at_the_root_is_eq6_on_the_soft_estimates() -> None:
    from hsm.objective import node_objective
    from hsm.theory import continuous_estimates

    corpus = toy_corpus()
    torch.manual_seed(0)
    model = lm.lemma31.LogBilinearLM(corpus.vocab_size, 8, 2, sparse=True)
    output = lm.lemma31.HierarchicalSoftmax(8, lm.Tree.random(corpus.vocab_size, 4, 3, seed=1), sparse=True)
    x, y = corpus.windows("valid", 2)
    by_depth = lm.mean_objective_by_depth(model, output, x, y, batch_size=37)
    with torch.no_grad():
        logits = (output.weight[0].view(4, 8) @ model(x).T).T + output.bias[0]
    # root children without words (none here: 40 words fill all four) would be masked; all are real
    root = output.tree.path_nodes[y.numpy(), 1]  # each target's child of the root, as a node id
    child = np.unique(root, return_inverse=True)[1]
    q, _, p_cond = continuous_estimates(torch.softmax(logits.double(), 1).numpy(), y.numpy(), corpus.vocab_size)
    assert by_depth[0] == pytest.approx(float(node_objective(q, p_cond)), rel=1e-6)
    assert len(set(child)) == 4 and set(by_depth) == {0, 1, 2}


@needs_mirror
def test_lm_ptb_lemma31_tiny(tmp_path) -> None:
    out = lm.run_lm_ptb_lemma31(scale="quick", out=tmp_path / "l.json", probes="3", checkpoints="0,4", etas="0.1",
                                train_tokens="5000", eval_tokens="500")
    payload = json.loads(out.read_text())
    records = payload["records"]
    assert len(records) == 2 * 3  # two points, one step size, three depths
    assert {r["adagrad_steps"] for r in records} == {0, 4} and all(len(r["changes"]) == 3 for r in records)
    assert all(r["value"] == pytest.approx(np.mean(r["changes"])) for r in records)
    assert "probes=3" in payload["provenance"]["hsm_scale"]
    with pytest.raises(ValueError, match="unknown option"):
        lm.run_lm_ptb_lemma31(scale="quick", steps="3")


# ---------------------------------------------------------------------------- the Mnih-Hinton baseline's word vectors


def test_word_vectors_average_the_predicted_vectors_of_each_word() -> None:
    torch.manual_seed(0)
    model = lm.lemma31.LogBilinearLM(12, 5, 2, sparse=True)
    contexts = torch.randint(0, 12, (50, 2))
    targets = torch.randint(0, 10, (50,))  # words 10 and 11 never follow a context
    got = lm.word_vectors(model, contexts, targets, 12, "predicted", batch_size=7)
    with torch.no_grad():
        predicted = model(contexts).double()
    for word in range(10):
        rows = predicted[targets == word]
        if len(rows):
            np.testing.assert_allclose(got[word], rows.mean(0).numpy(), rtol=1e-6, atol=1e-9)
    embedding = model.embedding.weight.detach().double().numpy()
    np.testing.assert_allclose(got[10:], embedding[10:])
    np.testing.assert_allclose(lm.word_vectors(model, contexts, targets, 12, "input"), embedding)
    with pytest.raises(ValueError, match="predicted, input"):
        lm.word_vectors(model, contexts, targets, 12, "mean")


@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
def test_lm_gutenberg_mnih_hinton_tiny(tmp_path) -> None:
    out = lm.run_lm_gutenberg_mnih_hinton(scale="quick", out=tmp_path / "m.json", word_vectors="input")
    (record,) = json.loads(out.read_text())["records"]
    assert record["model"] == "Mnih-Hinton tree" and record["word_vectors"] == "input"
    assert record["value"] > 1 and record["random_tree_test_perplexity"] > 1
    with pytest.raises(ValueError, match="unknown options"):
        lm.run_lm_gutenberg_mnih_hinton(scale="quick", rounds="2")


def test_node_decisions_by_depth_split_the_log_likelihood() -> None:
    torch.manual_seed(1)
    tree = lm.Tree.huffman(np.arange(1, 31, dtype=float), 3)  # paths of several lengths
    layer = lm.lemma31.HierarchicalSoftmax(6, tree, sparse=True).eval()
    hidden, targets = torch.randn(120, 6), torch.randint(0, 30, (120,))
    rows = lm.node_decisions_by_depth(layer, hidden, targets, batch_size=17)
    with torch.no_grad():
        nll = -layer(hidden, targets).output.double().sum()
    assert [r["depth"] for r in rows] == list(range(1, len(rows) + 1)) and rows[0]["words"] == 120
    assert sum(r["nats"] * r["words"] for r in rows) == pytest.approx(float(nll), rel=1e-5)
    # accuracy at the root: the path's first child is the root's most likely child
    with torch.no_grad():
        root = layer.node_logits(hidden, torch.zeros(120, 1, dtype=torch.long))[:, 0].argmax(-1)
    first = torch.from_numpy(tree.path_children[targets.numpy(), 0])
    assert rows[0]["accuracy"] == pytest.approx(float((root == first).double().mean()))


@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
def test_lm_gutenberg_node_accuracy_tiny(tmp_path) -> None:
    out = lm.run_lm_gutenberg_node_accuracy(scale="quick", out=tmp_path / "n.json", models="random,clustering",
                                            tokens="500")
    records = json.loads(out.read_text())["records"]
    assert {(r["run"], r["node_depth"]) for r in records} == {(m, d) for m in ("random", "clustering")
                                                               for d in (1, 2, 3)}
    assert all(0 <= r["value"] <= 1 and r["words"] == 500 for r in records)
    rows = lm.node_accuracy_rows(json.loads(out.read_text()))
    assert [r["depth"] for r in rows["clustering"]] == [1, 2, 3]
    table = lm.node_accuracy_markdown(rows).splitlines()
    assert len(table) == 4 and table[2].startswith("| Random Tree |")
    with pytest.raises(ValueError, match="must be one of|choose from|unknown"):
        lm.run_lm_gutenberg_node_accuracy(scale="quick", models="bogus")


@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
def test_the_learned_tree_model_is_kept_for_decoding_and_node_decisions(tmp_path) -> None:
    decoded = json.loads(lm.run_lm_gutenberg_decoding(scale="quick", out=tmp_path / "d.json", tokens="200",
                                                      beams="1", tree="learned").read_text())
    assert {r["model"] for r in decoded["records"]} == {"Learned Tree"}
    assert {r["epochs"] for r in decoded["records"]} == {2}
    assert decoded["provenance"]["config"]["tree"] == "learned"
    nodes = json.loads(lm.run_lm_gutenberg_node_accuracy(scale="quick", out=tmp_path / "n.json", models="learned",
                                                         tokens="200").read_text())
    learned = [r for r in nodes["records"] if r["run"] == "learned"]
    assert learned and {r["epochs"] for r in learned} == {2}
    # the same kept model: its perplexity on the scored tokens is a property of the model, not of the caller
    _, run, cfg, files = lm.offset.kept_learned_run(lm.SCALES["lm-gutenberg-offset"]["quick"], "cpu")
    assert files.model.exists() and cfg.output == "learned" and (cfg.epochs, cfg.learn_epochs) == (2, 1)
    # both files describe the kept learned model they scored, not the one-epoch random-tree preset
    for payload in (decoded, nodes):
        config = payload["provenance"]["config"]
        assert (config["epochs"], config["learn_epochs"], config["decay"]) == (cfg.epochs, cfg.learn_epochs,
                                                                               cfg.decay) == (2, 1, 1.0)
        assert config["lr_grid"] == [cfg.lr] and config["reassign_per_epoch"] == cfg.reassign_per_epoch
        assert config["description"].startswith("quick: the kept learned-tree model")
        assert config["training_seconds"] == pytest.approx(run.seconds)
        assert all("2 epochs (learned tree: 1 learning the tree)" in r["scale_note"]
                   and "statistics decay 1;" in r["scale_note"] for r in payload["records"])
    assert decoded["provenance"]["config"]["model_config"] == asdict(cfg)
    assert nodes["provenance"]["config"]["model_configs"] == {"learned": asdict(cfg)}
    with pytest.raises(ValueError, match="tree"):
        lm.run_lm_gutenberg_decoding(scale="quick", tree="huffman")


def test_the_full_ablation_is_labelled_with_what_differs_from_the_papers_setting() -> None:
    full = lm.SCALES["lm-ptb-ablation"]["full"]
    label = lm.commands.ablation_scale_label("full", full, {})
    assert label == "full, reduced: epochs=2, lr_grid=0.05, random_seeds=3, select_steps=0; settings: learn_epochs=1"
    assert results.scale_of_label(label) == "full"
    # an option is named against the paper's setting too, and a subset of the variants as a setting
    changed = lm._scale_for("lm-ptb-ablation", "full", {"random_seeds": "2", "l2": "5e-5"})
    label = lm.commands.ablation_scale_label("full", changed, {"random_seeds": "2", "l2": "5e-5",
                                                                "variants": "base,decay_0"})
    assert "random_seeds=2" in label.split(";")[0] and "l2=5e-05" in label.split(";")[1]
    assert label.endswith("variants=base,decay_0")
    assert lm.commands.ablation_scale_label("quick", lm.SCALES["lm-ptb-ablation"]["quick"], {}) is None
    # on Gutenberg the paper's setting is lm-gutenberg-65's: its data set, trees and context are no change
    gutenberg = lm._scale_for("lm-ptb-ablation", "full", {"dataset": "gutenberg", "arity": "65", "context": "4",
                                                          "reassign_per_epoch": "50"})
    label = lm.commands.ablation_scale_label("full", gutenberg, {})
    assert label == "full, reduced: epochs=2, lr_grid=0.05, random_seeds=3, select_steps=0; settings: learn_epochs=1"


def test_kept_model_scale_describes_the_run_that_was_loaded() -> None:
    preset = lm.SCALES["lm-gutenberg-offset"]["full"]
    base = lm.LMRunConfig(output="random", context=preset.context, arity=preset.arity, depth=3,
                          batch_size=preset.batch_size, lr=preset.lr_grid[0], epochs=preset.epochs,
                          learn_epochs=preset.learn_epochs, reassign_per_epoch=preset.reassign_per_epoch)
    # the random-tree model is the preset's own run: the preset describes it
    assert lm.tables.kept_model_scale(preset, base, "full") is preset
    learned = replace(base, output="learned", epochs=2, learn_epochs=1, decay=1.0)
    kept = lm.tables.kept_model_scale(preset, learned, "full")
    assert (kept.epochs, kept.learn_epochs, kept.decay, tuple(kept.lr_grid)) == (2, 1, 1.0, (0.05,))
    assert (kept.max_books, kept.vocab_size, kept.arity) == (preset.max_books, preset.vocab_size, preset.arity)
    assert kept.description == ("full: the kept learned-tree model it scored (all books, the corpus' vocabulary): "
                                "65-ary depth-3 tree learned from random tree seed 0 during the first 1 of 2 epochs "
                                "(statistics decay 1, 50 rebuilds per epoch), then fine-tuned; rate 0.05, batch 128")


# ---------------------------------------------------------------------------- decoding against the exact arg max


def test_decoder_agreement_against_brute_force() -> None:
    torch.manual_seed(0)
    layer = lm.lemma31.HierarchicalSoftmax(6, lm.Tree.random(30, 3, 4, seed=2), sparse=True).eval()
    with torch.no_grad():
        layer.weight.mul_(8.0)  # confident nodes: greedy descent then misses the arg max sometimes
    hidden = torch.randn(200, 6)
    targets = torch.randint(0, 30, (200,))
    rows = lm.decoder_agreement(layer, hidden, targets, beams=(1, 81), batch_size=64)
    logp = layer.log_prob(hidden).double().detach()
    best = logp.argmax(1)
    assert rows["exact"]["agreement"] == 1.0
    assert rows["exact"]["accuracy"] == pytest.approx(float((best == targets).double().mean()))
    # the beam's path log-probability and log_prob's are float32 sums in different orders: equal to ~1e-6
    assert rows["beam81"]["agreement"] == 1.0 and rows["beam81"]["logp_given_up"] == pytest.approx(0.0, abs=1e-6)
    greedy = layer.topk(hidden, 1, method="beam", beam=1).indices[:, 0]
    assert rows["beam1"]["agreement"] == pytest.approx(float((greedy == best).double().mean()))
    assert rows["beam1"]["logp_given_up"] == pytest.approx(
        float((logp.max(1).values - logp[torch.arange(200), greedy]).mean()), rel=1e-5)
    assert rows["sampled path"]["agreement"] == pytest.approx(float(logp.max(1).values.exp().mean()), rel=1e-5)
    assert rows["sampled path"]["accuracy"] == pytest.approx(float(logp[torch.arange(200), targets].exp().mean()),
                                                             rel=1e-5)


@needs_mirror
@pytest.mark.skipif(MIRROR is None or not (MIRROR / "gutenberg").exists(), reason="Gutenberg unavailable")
def test_lm_gutenberg_decoding_tiny(tmp_path) -> None:
    out = lm.run_lm_gutenberg_decoding(scale="quick", out=tmp_path / "d.json", tokens="300", beams="1,3")
    records = {r["decoder"]: r for r in json.loads(out.read_text())["records"]}
    assert set(records) == {"exact", "beam1", "beam3", "sampled path"} and records["exact"]["value"] == 1.0
    assert all(0 <= r["value"] <= 1 and r["scored_tokens"] == 300 for r in records.values())
    with pytest.raises(ValueError, match="unknown options"):
        lm.run_lm_gutenberg_decoding(scale="quick", width="3")


def test_run_help_names_the_lm_options_and_the_prebuilt_corpus(capsys) -> None:
    from hsm_lab.experiments import cli

    for argv in (["--help"], ["lm-gutenberg-65", "--help"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "-o checkpoint_minutes=N" in text and "-o runs=flat" in text and "HSM_PREBUILT_CORPUS=DIR" in text


def test_the_scale_note_is_made_from_the_settings_the_file_records() -> None:
    """The note of a file about a kept model (decoding, node decisions) says what that model
    trained: its epochs, learning epochs, L2 and decay, not its experiment's preset."""
    from hsm_lab.experiments.lm.report import scale_note

    learned = replace(lm.SCALES["lm-gutenberg-offset"]["full"], epochs=2, learn_epochs=1, decay=1.0, l2=5e-5,
                      description="the kept learned-tree model")
    note = scale_note(learned, 1_000, 250)
    assert note == ("gutenberg: 1,000 training tokens, vocabulary 250, 65-ary depth-3 trees, 2 epochs (learned tree: "
                    "1 learning the tree), batch 128, L2 5e-05, learned-tree statistics decay 1; the kept learned-tree "
                    "model")
    assert "L2" not in scale_note(learned, 1_000, 250, settings=False)  # the ablation's variants differ in it


def test_every_committed_language_model_note_says_what_its_configuration_says() -> None:
    from hsm_lab.experiments.lm.report import scale_note

    fields = lm.LMScale.__dataclass_fields__
    root = Path(__file__).resolve().parents[2] / "results" / "lm"
    checked = 0
    for path, payload in results.iter_results(root):
        config = payload["provenance"].get("config") or {}
        records = [r for r in payload["records"] if "scale_note" in r]
        if not records:
            continue
        sc = lm.LMScale(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in fields})
        settings = config.get("experiment") != "lm-ptb-ablation"  # its variants differ in L2 and decay
        for record in records:
            sizes = (record["train_tokens"], record["vocab_size"])
            allowed = {scale_note(sc, *sizes, settings)}
            if sc.l2 == 0 and sc.decay == 0.5:  # notes written before they named the L2 leave out its "no L2"
                allowed.add(scale_note(sc, *sizes, settings=False))
            assert record["scale_note"] in allowed, path.name
        checked += 1
    assert checked >= 40
