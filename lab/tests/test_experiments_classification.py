"""Tests for hsm_lab.experiments.classification (ICML Tables 1 and 3 on the stand-ins).

The end-to-end runs use a few hundred cooking questions, d = 8 and one learning rate: they
check the result file's structure and invariants, not accuracy or timings.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

import hsm
from hsm_lab.experiments import classification as C
from hsm_lab.results import load_results

MIRROR = os.environ.get("HSM_DATA_MIRROR") or (
    str(Path(__file__).resolve().parents[3] / "shared" / "data")
    if (Path(__file__).resolve().parents[3] / "shared" / "data" / "cooking").is_dir() else None)
needs_cooking = pytest.mark.skipif(MIRROR is None, reason="no data mirror (HSM_DATA_MIRROR) with cooking")

TINY = dict(data="cooking", train_limit="400", test_limit="150", dims="8", lr_grid="0.5", vw_lr_grid="0.5",
            epochs="2", batch_size="16")


def _split(labels: list[list[int]], num_labels: int, docs: list[list[int]] | None = None) -> C.EncodedSplit:
    docs = docs or [[0]] * len(labels)
    values = np.array([t for d in docs for t in d], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    label_values = np.array([t for row in labels for t in row], dtype=np.int64)
    label_offsets = np.concatenate([[0], np.cumsum([len(r) for r in labels])]).astype(np.int64)
    return C.EncodedSplit(values, offsets, label_values, label_offsets, num_labels)


def test_precision_and_recall_definitions():
    test = _split([[0, 1], [2], [1, 2, 3], [3]], num_labels=4)
    got = C._precision_recall(np.array([1, 0, 3, 3]), test)
    assert got["p_at_1"] == pytest.approx(75.0)  # 3 of 4 top labels are right
    assert got["r_at_1"] == pytest.approx(100 * 3 / 7)  # 3 correct of 7 gold labels (fastText's recall)
    assert got["r_at_1_per_example"] == pytest.approx(100 * (1 / 2 + 0 + 1 / 3 + 1) / 4)


def test_sampled_labels_come_from_each_example_and_cover_them():
    split = _split([[0, 1, 2], [3], [4, 5]], num_labels=6)
    rng = np.random.default_rng(0)
    draws = np.stack([split.sample_labels(rng) for _ in range(300)])
    assert set(draws[:, 0]) == {0, 1, 2} and set(draws[:, 1]) == {3} and set(draws[:, 2]) == {4, 5}
    assert abs((draws[:, 2] == 4).mean() - 0.5) < 0.1  # uniform among the example's labels


def test_learned_tree_schedule_runs_assign_labels_the_set_number_of_times_and_stays_well_formed():
    rng = np.random.default_rng(1)
    labels = [[int(l)] for l in rng.integers(0, 30, 600)]
    docs = [[l[0], int(rng.integers(30, 40))] for l in labels]  # the label's own word: learnable
    split = _split(labels, 30, docs)
    trained = C.train_bow(split, "learned5", dim=8, lr=0.5, epochs=2, batch_size=8, reassigns=10, vocab_size=40)
    assert len(trained.learner.history) == 10
    assert trained.learner.frozen
    tree = trained.layer.tree
    assert tree.is_well_formed() and tree.arity == 5 and tree.num_labels == 30
    assert trained.start_tree == hsm.Tree.huffman(np.bincount(split.label_values, minlength=30) + 1.0, 5)
    result = C.evaluate_bow(trained, split)
    assert result["p_at_1"] > 50  # the label's word is in every document
    assert result["nodes_visited"] >= result["nodes_visited_greedy"] >= 1
    assert result["nodes_visited_search"] >= 1
    # the fastest of three timed passes: the same predictions and counts
    three = C.evaluate_bow(trained, split, timing_passes=3)
    assert {k: v for k, v in three.items() if k != "test_seconds"} == \
        {k: v for k, v in result.items() if k != "test_seconds"}
    with pytest.raises(ValueError, match="timing_passes"):
        C.evaluate_bow(trained, split, timing_passes=0)


def test_fixed_depth_output_keeps_every_label_at_its_depth_in_both_trainers():
    """learned20-fixed-depth: Algorithm 3 from the complete tree of the labels in frequency order."""
    rng = np.random.default_rng(2)
    labels = [[int(l)] for l in rng.integers(0, 30, 400)]
    docs = [[l[0], int(rng.integers(30, 40))] for l in labels]
    split = _split(labels, 30, docs)
    counts = np.bincount(split.label_values, minlength=30)
    for trainer in ("torch", "fast"):
        trained = C.train_bow(split, "learned20-fixed-depth", dim=8, lr=0.5, epochs=2, batch_size=8, reassigns=4,
                              vocab_size=40, trainer=trainer, threads=1)
        assert trained.start_tree == hsm.Tree.balanced(np.argsort(-counts, kind="stable"), 20), trainer
        tree = trained.layer.tree
        assert tree.depth_limit == 2 and (tree.depths[:30] == 2).all(), trainer
        assert len(trained.reassign_moved) == 4, trainer


def test_train_bow_rejects_bad_settings():
    split = _split([[0], [1]], 2)
    with pytest.raises(ValueError, match="output layer"):
        C.train_bow(split, "huffman7", 4, 0.1)
    with pytest.raises(ValueError, match="lr"):
        C.train_bow(split, "flat", 4, -1.0)


def test_author_grouping_scores_a_taxonomy_tree_above_a_scattering_tree():
    authors = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    grouped = hsm.Tree.from_nested([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], arity=4)
    scattered = hsm.Tree.from_nested([[0, 4, 8, 1], [5, 9, 2, 6], [10, 3, 7, 11]], arity=4)
    good, bad = C.author_grouping(grouped, authors), C.author_grouping(scattered, authors)
    assert good["ari_depth1"] == pytest.approx(1.0) and good["purity_depth1"] == pytest.approx(1.0)
    assert good["lca_same"] == pytest.approx(1.0) and good["lca_diff"] == pytest.approx(0.0)
    assert bad["ari_depth1"] < 0.1 < good["ari_depth1"]
    assert bad["lca_same"] < good["lca_same"]
    with pytest.raises(ValueError, match="categories"):
        C.author_grouping(grouped, authors[:5])


def test_options_are_parsed_and_checked():
    config = C._parse_options("quick", {"d": "50,200", "lr": "0.1", "outputs": "flat,learned20"})
    assert config.dims == (50, 200) and config.lr_grid == (0.1,) and config.outputs == ("flat", "learned20")
    full = C._parse_options("full", {})
    assert full.lr_grid == C.PAPER_LR_GRID and full.dims == (50, 200) and full.train_limit is None
    with pytest.raises(ValueError, match="unknown option"):
        C._parse_options("quick", {"arity": "5"})
    with pytest.raises(ValueError, match="unknown outputs"):
        C._parse_options("quick", {"outputs": "huffman3"})
    with pytest.raises(ValueError, match="reduce"):
        C._parse_options("quick", {"reduce": "max"})
    with pytest.raises(ValueError, match="data must be"):
        C.load_classification_data("/no/such/file.txt")


def test_experiments_are_registered():
    from hsm_lab.experiments import get

    assert get("icml-table1").func is C.icml_table1
    assert get("icml-table3").func is C.icml_table3


@needs_cooking
def test_table1_end_to_end_on_a_cooking_slice(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HSM_OUTPUT", raising=False)  # default output folder: ./hsm-results
    # a peer that is absent must be skipped with its reason, not fail the table
    real = C.table.peer_available
    monkeypatch.setattr(C.table, "peer_available", lambda p: "not installed (test)" if p == "vw-log_multi" else real(p))
    path = C.icml_table1(scale="quick", **TINY)
    assert path == Path("hsm-results/classification/table1-cooking-quick.json")  # not the committed results/
    payload = load_results(path)
    assert payload["provenance"]["config"]["data"] == "cooking"
    rows = {r["output"]: r for r in payload["records"]}
    assert set(C.OUTPUTS) <= set(rows)
    for output in C.OUTPUTS:
        row = rows[output]
        assert row["claim"] is None and row["stand_in"] is True  # stand-in numbers never claim a paper number
        assert 0.0 <= row["r_at_1"] <= row["p_at_1"] <= 100.0  # every example has >= 1 label
        assert row["lr"] == 0.5 and row["train_seconds"] > 0 and row["test_seconds"] > 0
        assert row["value"] == row["p_at_1"]
    assert rows["flat"]["nodes_visited"] == rows["flat"]["num_labels"] == 736
    for output in ("huffman2", "huffman5", "huffman20", "learned5", "learned20"):
        assert rows[output]["nodes_visited"] >= rows[output]["nodes_visited_greedy"]
        assert rows[output]["expected_depth"] >= 1
    assert rows["huffman2"]["paper_row"] is None  # d = 8 has no paper row
    # 400 examples, batches of 16, 2 epochs: 50 steps; AssignLabels at most once a step in the first half
    assert rows["learned5"]["reassigns"] == min(C.REASSIGNS, 50 // 2)
    tree = hsm.Tree.load(path.parent / rows["learned5"]["tree_file"])
    start = hsm.Tree.load(path.parent / rows["learned5"]["start_tree_file"])
    assert tree.is_well_formed() and tree.num_labels == start.num_labels == 736 and tree.label_names
    assert rows["vw-log_multi"]["skipped"] == "not installed (test)" and "value" not in rows["vw-log_multi"]
    for peer in ("fasttext-hs", "fasttext-softmax"):
        if C.peer_available(peer) is None:
            assert 0.0 <= rows[peer]["r_at_1"] <= rows[peer]["p_at_1"] <= 100.0
        else:
            assert rows[peer]["skipped"]
    gains = [r for r in payload["records"] if r.get("model") == "gain"]
    assert {g["arity"] for g in gains} == {5, 20}
    for g in gains:
        assert g["value"] == pytest.approx(rows[f"learned{g['arity']}"]["p_at_1"] - rows[f"huffman{g['arity']}"]["p_at_1"])
    assert not list(Path("hsm-results/classification").glob(".*partial*"))  # removed once the table is written

    # Table 3 re-issues the Table 1 rows (same options) instead of training again
    path3 = C.icml_table3(scale="quick", **TINY)
    rows3 = load_results(path3)["records"]
    assert len(rows3) == len(payload["records"]) and {r["table"] for r in rows3} == {"table3"}
    assert load_results(path3)["provenance"]["config"]["derived_from"].endswith("table1-cooking-quick.json")


@needs_cooking
def test_a_stopped_table_resumes_from_its_partial_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    options = dict(TINY, outputs="flat,huffman5", peers="")
    config = C._parse_options("quick", options)
    out = tmp_path / "t.json"
    calls = []
    original = C.table._run_ours

    def counting(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt  # stop in the middle of the second row
        return original(*args, **kwargs)

    monkeypatch.setattr(C.table, "_run_ours", counting)
    with pytest.raises(KeyboardInterrupt):
        C.run_table(config, "table1", out=out, log=lambda s: None)
    partial = json.loads((tmp_path / ".t.json.partial.json").read_text())
    assert list(partial["parts"]) == ["d8/flat"]  # hsm_lab.results.ResumableParts' file
    # a run under another config does not take the saved row (stopped at once: the file stays as it was)
    calls.clear()

    def stop_at_once(*args, **kwargs):
        calls.append(args[2])
        raise KeyboardInterrupt

    monkeypatch.setattr(C.table, "_run_ours", stop_at_once)
    with pytest.raises(KeyboardInterrupt):
        C.run_table(dataclasses.replace(config, epochs=1), "table1", out=out, log=lambda s: None)
    assert calls == ["flat"]
    assert json.loads((tmp_path / ".t.json.partial.json").read_text()) == partial
    calls.clear()
    monkeypatch.setattr(C.table, "_run_ours", lambda *a, **k: (calls.append(a[2]), original(*a, **k))[1])
    records = C.run_table(config, "table1", out=out, log=lambda s: None)
    assert calls == ["huffman5"]  # flat was not trained again
    assert [r["output"] for r in records if r.get("model") != "gain"] == ["flat", "huffman5"]
    assert not (tmp_path / ".t.json.partial.json").exists()  # removed once every row is done


def test_released_code_prior_keeps_unseen_labels_in_place_where_the_uniform_prior_scatters_them():
    """Why train_bow uses NodeStatistics(prior_mode="current_child") (tree_prior="sticky")."""
    import torch

    counts = np.arange(1, 31, dtype=float)[::-1] ** 2
    tree = hsm.Tree.huffman(counts, 5)
    results = {}
    for mode in ("current_child", "uniform"):
        stats = hsm.NodeStatistics(tree, prior_mode=mode)
        # evidence for the three most frequent labels only, each routed where the tree sends it;
        # the other 27 labels are unseen since the last rebuild
        for label in range(3):
            probs = np.zeros((1, tree.max_depth, 5), dtype=np.float32)
            probs[0, np.arange(tree.max_depth), tree.path_children[label]] = 1.0
            for _ in range(100):
                stats.accumulate(torch.tensor([label]), torch.from_numpy(probs), torch.from_numpy(tree.path_mask[[label]]))
        results[mode] = hsm.assign_labels_well_formed(tree, stats)
    sticky, uniform = results["current_child"], results["uniform"]
    # the released code's prior leaves almost every unseen label in place (a few move when the
    # well-formedness constraint needs room); the uniform prior re-places all of them by the
    # children's marginals alone
    assert sticky.moved_labels <= 0.1
    assert uniform.moved_labels >= 0.8



def test_a_fasttext_file_runs_the_real_table_and_claims_the_paper_numbers(tmp_path):
    """The YFCC100M path: any fastText-format file; its rows carry the paper's keys as claims."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(400):
        tags = sorted(set(rng.integers(0, 12, size=rng.integers(1, 3)).tolist()))
        words = [f"t{t}" for t in tags] + [f"w{w}" for w in rng.integers(0, 50, 6)]
        lines.append(" ".join(f"__label__tag{t}" for t in tags) + " " + " ".join(words))
    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    train.write_text("\n".join(lines[:320]) + "\n")
    test.write_text("\n".join(lines[320:]) + "\n")
    path = C.icml_table1(scale="quick", out=tmp_path / "table1-yfcc.json", data=str(train), test=str(test),
                         min_label_count=1, dims="50", lr_grid="0.5", epochs="2", peers="",
                         outputs="huffman2,learned5")
    rows = {r["output"]: r for r in load_results(path)["records"]}
    assert rows["learned5"]["stand_in"] is False and rows["learned5"]["num_labels"] == 12
    assert rows["learned5"]["claim"] == "icml2017.table1.d50.learned_tree.arity5.p_at_1"
    assert rows["huffman2"]["claim"] == "icml2017.table1.d50.fasttext.arity2.p_at_1"  # fastText's hs tree
    assert rows["learned5"]["p_at_1"] > 30  # each example carries its tags' own words
    with pytest.raises(ValueError, match="data must be"):
        C.icml_table1(scale="quick", out=tmp_path / "x.json", data=str(tmp_path / "missing.txt"))


def test_fast_trainer_through_train_bow_is_the_compiled_classifier():
    from hsm.classifiers.fast_classifier import FastBowClassifier

    rng = np.random.default_rng(2)
    labels = [[int(l)] for l in rng.integers(0, 30, 600)]
    docs = [[l[0], int(rng.integers(30, 40))] for l in labels]
    split = _split(labels, 30, docs)
    trained = C.train_bow(split, "learned5", dim=8, lr=0.5, epochs=2, reassigns=10, vocab_size=40, trainer="fast",
                          threads=1, seed=3)
    assert len(trained.learner.history) == 10 and len(trained.reassign_moved) == 10
    assert trained.layer.tree.is_well_formed() and trained.layer.tree.arity == 5
    result = C.evaluate_bow(trained, split)  # the torch evaluation reads the compiled trainer's modules
    assert result["p_at_1"] > 50
    direct = FastBowClassifier(dim=8, output="learned", arity=5, lr=0.5, epochs=2, rebuilds=10, threads=1, seed=3)
    direct.fit(split, [row[0] for row in labels], num_words=40, num_labels=30)
    np.testing.assert_array_equal(direct.model.embedding.weight.detach().numpy(),
                                  trained.model.embedding.weight.detach().numpy())
    huffman = C.train_bow(split, "huffman5", dim=8, lr=0.5, epochs=2, vocab_size=40, trainer="fast", threads=1)
    assert huffman.learner is None and huffman.layer.tree == huffman.start_tree


def test_fast_trainer_refuses_what_it_cannot_do():
    split = _split([[0], [1]], 2)
    with pytest.raises(ValueError, match="trainer must be"):
        C.train_bow(split, "flat", 4, 0.1, trainer="numba")
    with pytest.raises(ValueError, match="unigram"):
        C.train_bow(split, "flat", 4, 0.1, trainer="fast", ngrams=2)
    with pytest.raises(ValueError, match="option trainer"):
        C.icml_table1(scale="quick", trainer="gpu")


@pytest.mark.parametrize("trainer, threads, expected", [("torch", None, 1), ("fast", 2, 2), ("fast", 1, 1)])
def test_fasttext_peer_runs_on_the_threads_of_our_rows(tmp_path, monkeypatch, trainer, threads, expected):
    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    pytest.importorskip("fasttext")
    seen = []

    def fake_fasttext(*args, **kwargs):
        seen.append(args[-1] if len(args) == 11 else kwargs["threads"])
        return {"p_at_1": 10.0, "r_at_1": 5.0, "train_seconds": 1.0, "test_seconds": 0.1}

    monkeypatch.setattr(C.table, "run_fasttext", fake_fasttext)
    path = C.icml_table1(scale="quick", out=tmp_path / "t.json", outputs="", peers="fasttext-hs", trainer=trainer,
                         threads=threads, **TINY)
    row = next(r for r in load_results(path)["records"] if r["output"] == "fasttext-hs")
    assert set(seen) == {expected} and row["threads"] == expected


@needs_cooking
def test_a_full_scale_slice_is_labelled_reduced_with_the_whole_training_size(monkeypatch):
    from hsm_lab.experiments.classification.commands import scale_label
    from hsm_lab.experiments.classification.config import _parse_options

    monkeypatch.setenv("HSM_DATA_MIRROR", MIRROR)
    whole = _parse_options("full", {"data": "cooking"})
    assert scale_label("full", whole) == "full"
    sliced = _parse_options("full", {"data": "cooking", "train_limit": "400", "test_limit": "150"})
    assert scale_label("quick", sliced) == "quick"
    label = scale_label("full", sliced)
    n = len(C.load_classification_data("cooking").train_texts)
    assert label == f"full, reduced: train_limit=400, test_limit=150 (of {n:,} training examples)"


def test_a_table_says_what_its_threads_option_counts_beside_torchs() -> None:
    from hsm_lab.experiments.classification.commands import threads_note

    fast = threads_note(C._parse_options("quick", {"trainer": "fast", "threads": "2"}))
    assert "Hogwild" in fast and "fastText" in fast and "sets to 1" in fast
    assert "unused by the PyTorch trainer" in threads_note(C._parse_options("quick", {}))
