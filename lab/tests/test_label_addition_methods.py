"""The label-addition experiment's baselines: options, the summary's shares and losses, weight imprinting, and
the multi-label protocol on cooking."""
import os

import numpy as np
import pytest

from hsm_lab.experiments.label_addition import PLACEMENTS, _imprinted, parse_options, summarise


def test_the_default_methods_are_the_placements_and_local_settings_appear_only_when_used():
    _, _, methods, _, settings = parse_options("full", {})
    assert tuple(methods) == PLACEMENTS and "local_steps" not in settings
    _, _, methods, _, settings = parse_options("full", {"methods": "objective-local,imprint", "local_steps": "5"})
    assert methods == ["objective-local", "imprint"] and settings["local_steps"] == 5
    with pytest.raises(ValueError, match="methods"):
        parse_options("full", {"methods": "finetune"})


def test_the_summary_measures_each_method_against_its_own_starting_model_and_the_kshot_retrain():
    base = {"seed": 0}
    rows = [dict(base, method="retrain", examples=None, p_at_1_old=60.0, p_at_1_new=50.0),
            dict(base, method="learned-before", examples=0, p_at_1_old=61.0),
            dict(base, method="flat-before", examples=0, p_at_1_old=58.0),
            dict(base, method="ncm-before", examples=0, p_at_1_old=40.0),
            dict(base, method="objective", examples=5, p_at_1_old=60.0, p_at_1_new=5.0, seconds_per_label=0.01),
            dict(base, method="kshot-retrain", examples=5, p_at_1_old=60.5, p_at_1_new=10.0, seconds_per_label=1.0),
            dict(base, method="imprint", examples=5, p_at_1_old=50.0, p_at_1_new=40.0, seconds_per_label=0.001),
            dict(base, method="ncm", examples=5, p_at_1_old=39.0, p_at_1_new=20.0, seconds_per_label=0.001)]
    summary = {r["method"]: r for r in summarise(rows)}
    assert summary["objective"]["old_loss_mean"] == pytest.approx(1.0)
    assert summary["imprint"]["old_loss_mean"] == pytest.approx(8.0)
    assert summary["ncm"]["old_loss_mean"] == pytest.approx(1.0)
    assert summary["objective"]["share_of_kshot_retrain_mean"] == pytest.approx(0.5)
    assert summary["imprint"]["share_of_retrain_mean"] == pytest.approx(0.8)


def test_an_imprinted_row_has_the_trained_rows_mean_norm_and_serves_its_examples():
    from hsm import FastBowClassifier

    rng = np.random.default_rng(0)
    docs = [rng.integers(10 * (i % 3), 10 * (i % 3) + 10, size=6) for i in range(300)]
    labels = np.array([i % 3 for i in range(300)])
    flat = FastBowClassifier(dim=8, output="flat", lr=0.5, epochs=5, threads=1, seed=0)
    flat.fit(docs, labels, num_words=40, num_labels=3)
    new_docs = [rng.integers(30, 40, size=6) for _ in range(5)]
    grown = _imprinted(flat, [new_docs])
    weight = grown.layer.linear.weight.detach()
    assert grown.num_labels == 4 and flat.num_labels == 3
    assert float(weight[3].norm()) == pytest.approx(float(weight[:3].norm(dim=1).mean()), rel=1e-5)
    assert (grown.predict(new_docs).labels[:, 0] == 3).mean() >= 0.8


# ---------------------------------------------------------------- multi-label data (cooking)

def _multi_label_split(num_docs: int, seed: int):
    """A multi-label split of 10 labels: a document of labels {a, b} holds words of both labels'
    own ranges (label l owns words 10 l .. 10 l + 9)."""
    from hsm_lab.experiments.classification import EncodedSplit

    rng = np.random.default_rng(seed)
    sets = [sorted({int(rng.integers(10)), int(rng.integers(10))}) for _ in range(num_docs)]
    docs = [np.concatenate([rng.integers(10 * label, 10 * label + 10, size=4) for label in labels]) for labels in sets]
    offsets = np.concatenate([[0], np.cumsum([d.size for d in docs])])
    label_offsets = np.concatenate([[0], np.cumsum([len(s) for s in sets])])
    return EncodedSplit(np.concatenate(docs), offsets, np.concatenate(sets), label_offsets, 10)


def test_cooking_options_cut_its_questions_and_refuse_the_books_option():
    _, _, _, data, _ = parse_options("quick", {"data": "cooking"})
    assert data == {"data": "cooking", "train_limit": 3000, "test_limit": 1000}
    _, _, _, data, _ = parse_options("full", {"data": "cooking"})
    assert data == {"data": "cooking", "train_limit": None, "test_limit": None}
    _, _, _, data, _ = parse_options("quick", {})  # gutenberg-books stays the default, 40 books at quick
    assert data == {"data": "gutenberg-books", "max_books": 40}
    with pytest.raises(ValueError, match="max_books do not apply to data=cooking"):
        parse_options("full", {"data": "cooking", "max_books": "40"})
    with pytest.raises(ValueError, match="train_limit do not apply to data=gutenberg-books"):
        parse_options("full", {"train_limit": "400"})
    with pytest.raises(ValueError, match="data"):
        parse_options("full", {"data": "trec"})


def test_p_at_1_counts_any_gold_label_and_the_added_score_only_new_ones():
    from hsm_lab.data import Ragged
    from hsm_lab.experiments.label_addition import _p_at_1

    gold = Ragged(np.array([0, 1, 2, 3, 4]), np.array([0, 2, 3, 5]))  # {0, 1}, {2}, {3, 4}
    predicted = np.array([1, 0, 4])
    assert _p_at_1(predicted, gold) == pytest.approx(200 / 3)
    assert _p_at_1(predicted, gold, labels_from=4) == pytest.approx(100 / 3)  # labels 4.. are the new ones
    assert np.isnan(_p_at_1(None, Ragged(np.zeros(0, dtype=np.int64), np.array([0]))))


def test_the_kshot_retrain_gives_each_example_the_new_labels_it_was_drawn_for():
    from hsm_lab.data import Ragged
    from hsm_lab.experiments.label_addition import _with_examples

    # trained label sets of four documents (labels 0, 1 trained; 2, 3 new): two keep a trained label
    trained = Ragged(np.array([0, 1, 0]), np.array([0, 1, 3, 3, 3]))
    rows, labels = _with_examples(trained, np.array([0, 1]), {2: np.array([1, 2]), 3: np.array([2, 3])})
    assert rows.tolist() == [0, 1, 2, 3]  # document 2, drawn for both new labels, comes once
    assert [labels.row(i).tolist() for i in range(len(labels))] == [[0], [1, 0, 2], [2, 3], [3]]


def test_class_means_count_a_document_towards_each_of_its_labels():
    from hsm import FastBowClassifier
    from hsm_lab.data import Ragged
    from hsm_lab.experiments.label_addition import _class_sums

    split = _multi_label_split(200, seed=0)
    docs = [split.values[a:b] for a, b in zip(split.offsets[:-1], split.offsets[1:])]
    flat = FastBowClassifier(dim=8, output="flat", lr=0.5, epochs=2, threads=1, seed=0)
    flat.fit(docs, split.gold_sets(), num_words=100, num_labels=10)
    sums = _class_sums(flat, docs[:2], Ragged(np.array([3, 5, 5]), np.array([0, 2, 3])), 10)
    h = flat.representations(docs[:2])
    h = h / h.norm(dim=1, keepdim=True)
    assert np.allclose(sums[3].numpy(), h[0].numpy()) and np.allclose(sums[5].numpy(), (h[0] + h[1]).numpy())
    assert float(sums[[0, 1, 2, 4, 6, 7, 8, 9]].abs().sum()) == 0.0


def test_a_multi_label_draw_holds_out_labels_from_the_base_models_and_scores_every_method():
    from hsm_lab.experiments.label_addition import DEFAULTS, METHODS, _seed_rows, held_out_labels

    train, test = _multi_label_split(600, seed=1), _multi_label_split(200, seed=2)
    settings = dict(DEFAULTS, dim=8, arity=4, epochs=3, held_out=0.2, reference=50, local_steps=2)
    rows = _seed_rows(train, test, 100, 0, (1, 3), list(METHODS), settings, log=lambda message: None)
    held = held_out_labels(10, 0.2, 0)
    new_docs = sum(bool(set(labels) & set(held.tolist())) for labels in map(list, test.gold_sets()))
    assert {(r["held_out"], r["trained_labels"], r["test_new"], r["test_old"]) for r in rows} == {
        (2, 8, new_docs, 200 - new_docs)}
    by = {(r["method"], r["examples"]): r for r in rows}
    # the models without the new labels score on the new documents by their trained labels only
    for before in ("learned-before", "huffman-before", "flat-before", "ncm-before"):
        assert 0 <= by[(before, 0)]["p_at_1_new"] <= 100 and "p_at_1_new_added" not in by[(before, 0)]
    for method in METHODS:
        for k in (1, 3):
            row = by[(method, k)]
            assert 0 <= row["p_at_1_new_added"] <= row["p_at_1_new"] <= 100
            assert 1 <= row["examples_mean"] <= k
    assert by[("retrain", None)]["p_at_1_new_added"] > 0  # the ceiling serves the held-out labels
    summary = {(r["method"], r["examples"]): r for r in summarise(rows)}
    assert summary[("objective", 3)]["p_at_1_new_before_mean"] == by[("learned-before", 0)]["p_at_1_new"]
    assert summary[("ncm", 1)]["p_at_1_new_added_mean"] == by[("ncm", 1)]["p_at_1_new_added"]


@pytest.mark.skipif(not os.environ.get("HSM_DATA_MIRROR"), reason="no data mirror (HSM_DATA_MIRROR) with cooking")
def test_the_experiment_runs_on_a_slice_of_cooking_and_names_it(tmp_path, monkeypatch):
    from hsm_lab.experiments.label_addition import label_addition
    from hsm_lab.results import load_results

    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    path = label_addition(scale="quick", out=tmp_path / "added.json", data="cooking", train_limit=600, test_limit=200,
                          examples="1", methods="objective,kshot-retrain,imprint,ncm")
    payload = load_results(path)
    config = payload["provenance"]["config"]
    assert (config["data"], config["train_limit"], config["test_limit"]) == ("cooking", 600, 200)
    assert "max_books" not in config and config["train_passages"] == 600 and config["test_passages"] == 200
    runs = [r for r in payload["records"] if r["kind"] == "run"]
    assert {r["test_old"] + r["test_new"] for r in runs} == {200}
    assert {r["method"] for r in payload["records"] if r["kind"] == "summary"} == {
        "objective", "kshot-retrain", "imprint", "ncm"}
