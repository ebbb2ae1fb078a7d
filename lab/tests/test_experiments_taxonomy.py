"""Seed 003 pieces (hsm.sequence_models, hsm_lab.experiments.taxonomy) and the experiment at a tiny scale."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hsm
from hsm_lab.results import load_results
from hsm_lab.experiments import taxonomy as E
from hsm.sequence_models import LSTMTextClassifier, TextVocabulary, classification_metrics, encode_texts

MIRROR = Path(os.environ.get("HSM_DATA_MIRROR", Path(__file__).resolve().parents[3] / "shared" / "data"))
needs_data = pytest.mark.skipif(not (MIRROR / "trec").exists(), reason="data mirror not available")


@given(st.lists(st.integers(1, 6), min_size=2, max_size=7), st.integers(0, 1000))
@settings(max_examples=25, deadline=None)
def test_taxonomy_softmax_is_a_distribution_over_all_classes(sizes, seed):
    """The taxonomy tree is unbalanced (categories of different sizes, some with one class):
    the masked slots must leave p(class | h) summing to one, with every class reachable."""
    names, taxonomy, start = [], {}, 0
    for c, size in enumerate(sizes):
        taxonomy[f"cat{c}"] = [f"l{start + i}" for i in range(size)]
        names += taxonomy[f"cat{c}"]
        start += size
    rng = np.random.default_rng(seed)
    names = list(rng.permutation(names))
    torch.manual_seed(seed)
    layer = E.build_output_layer("hierarchical", 5, names, taxonomy)
    with torch.no_grad():
        layer.bias.normal_()
    h = torch.randn(4, 5)
    logp = layer.log_prob(h)
    assert logp.shape == (4, len(names))
    assert torch.allclose(logp.exp().sum(1), torch.ones(4), atol=1e-5)
    assert bool(torch.isfinite(logp).all())
    # forward(h, y) agrees with log_prob, and it is Eq. 1-2: P(category) * P(class | category)
    y = torch.randint(0, len(names), (4,))
    assert torch.allclose(layer(h, y).output, logp.gather(1, y[:, None]).squeeze(1), atol=1e-5)


def test_hierarchical_gradient_wrt_h_is_eq_9_with_the_sign_of_eq_9_not_33():
    """dE/dh = sum over the path of sum_j (P(j|q) - delta) w_qj (Eq. 9); Eq. 33 as printed has the opposite sign."""
    taxonomy = {"a": ["x", "y"], "b": ["z", "u", "v"]}
    names = ["x", "y", "z", "u", "v"]
    torch.manual_seed(0)
    layer = E.build_output_layer("hierarchical", 3, names, taxonomy)
    h = torch.randn(1, 3, requires_grad=True)
    target = torch.tensor([3])  # "u": root -> b (child 1) -> u (child 1)
    layer(h, target).loss.backward()
    expected = torch.zeros(3)
    weight = layer.weight.detach().view(layer.num_nodes, layer.arity, 3)
    bias = layer.bias.detach()
    for node, child in layer.tree.path(3):
        logits = weight[node] @ h.detach()[0] + bias[node]
        logits = logits.masked_fill(~layer.slot_mask[node], -float("inf"))
        p = torch.softmax(logits, 0)
        delta = torch.nn.functional.one_hot(torch.tensor(child), layer.arity).double()
        expected += ((p - delta)[:, None] * weight[node]).nan_to_num().sum(0)
    assert torch.allclose(h.grad[0], expected.float(), atol=1e-5)


def test_top_level_groups_and_category_ids_give_ari_one_on_the_taxonomy_itself():
    from sklearn.metrics import adjusted_rand_score

    taxonomy = {"a": ["x", "y"], "b": ["z", "u", "v"], "c": ["w"]}
    names = ["u", "x", "w", "z", "y", "v"]
    tree = hsm.Tree.from_taxonomy(taxonomy, names)
    assert adjusted_rand_score(E.category_ids(names, taxonomy), E.top_level_groups(tree)) == pytest.approx(1.0)


def test_learned_tree_start_has_depth_two():
    tree = E.learned_tree_start(50, seed=0)
    assert tree.arity == 8 and tree.depth_limit == 2


def test_classification_metrics_macro_f1_is_mean_of_per_class_f1():
    y_true = [0, 0, 0, 1, 1, 2]
    y_pred = [0, 0, 1, 1, 2, 2]
    # per class: F1_0 = 2*1*(2/3)/(1+2/3) = 0.8; F1_1 = 0.5; F1_2 = 2*0.5*1/1.5 = 2/3
    metrics = classification_metrics(y_true, y_pred)
    assert metrics["f1"] == pytest.approx(100 * (0.8 + 0.5 + 2 / 3) / 3)
    assert metrics["accuracy"] == pytest.approx(100 * 4 / 6)
    p, r = metrics["precision"], metrics["recall"]
    assert metrics["f1"] != pytest.approx(2 * p * r / (p + r))  # not the harmonic mean of macro-P and macro-R
    with pytest.raises(ValueError):
        classification_metrics([0, 1], [0])


def test_encode_texts_truncates_and_pads():
    from hsm_lab.data.text_classification import _Encoder

    texts = _Encoder().encode([["a", "b", "c", "d"], ["b"], []])
    vocab = TextVocabulary.from_texts(texts)
    ids = encode_texts(texts, vocab, max_tokens=3)
    assert ids.shape == (3, 3)
    assert ids[1, 1:].tolist() == [0, 0] and ids[2, 0] == 1  # padding; empty doc -> <unk>
    assert (ids[0] >= 2).all()


def test_bilstm_output_size_and_padding_invariance():
    torch.manual_seed(0)
    model = LSTMTextClassifier(20, embed_dim=4, hidden_size=3, dropout=0.0).eval()
    x = torch.tensor([[5, 6, 7]])
    padded = torch.tensor([[5, 6, 7, 0, 0]])
    assert model(x).shape == (1, 6)
    assert torch.allclose(model(x), model(padded), atol=1e-6)  # packed: padding does not change h
    with pytest.raises(ValueError):
        model(torch.zeros(2, 3))


@needs_data
def test_taxonomy_tables_result_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    path = E.run_taxonomy_tables(scale="quick", out=tmp_path / "trec.json", data="trec",
                                 train_limit="60", test_limit="40", max_tokens="8", max_vocab="300")
    records = load_results(path)["records"]
    runs = [r for r in records if r["kind_of_record"] == "run"]
    assert {r["model"] for r in runs} == {"flat", "hierarchical", "learned"}
    for run in runs:
        for value in run["test"].values():
            assert 0.0 <= value <= 100.0
    learned = next(r for r in runs if r["model"] == "learned")
    assert -1.0 <= learned["ari_top_level"] <= 1.0
    means = [r for r in records if r["kind_of_record"] == "mean_over_seeds"]
    assert {r["claim"] for r in means if r["model"] == "hierarchical"} == {
        "sf2020.table1.trec.hierarchical." + m for m in ("f1", "precision", "recall", "accuracy")}
    assert all(r["claim"] is None for r in means if r["model"] == "learned")


@needs_data
def test_taxonomy_tables_resume_a_stopped_run_from_its_finished_parts(tmp_path, monkeypatch):
    """A run cut short (here: the second model raises) keeps its finished (seed, model) runs in the
    partial file; the rerun trains only what is missing and removes the partial file."""
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    options = dict(train_limit="60", test_limit="40", max_tokens="8", max_vocab="300", models="flat,hierarchical")
    trained: list[str] = []
    real_train_one = E.train_one

    def stopped_at_hierarchical(kind, *args, **kwargs):
        if kind == "hierarchical":
            raise KeyboardInterrupt
        trained.append(kind)
        return real_train_one(kind, *args, **kwargs)

    monkeypatch.setattr(E, "train_one", stopped_at_hierarchical)
    with pytest.raises(KeyboardInterrupt):
        E.run_taxonomy_tables(scale="quick", out=tmp_path / "trec.json", data="trec", **options)
    partial = tmp_path / ".trec.json.partial.json"
    assert partial.exists() and trained == ["flat"]

    def counted(kind, *args, **kwargs):
        trained.append(kind)
        return real_train_one(kind, *args, **kwargs)

    monkeypatch.setattr(E, "train_one", counted)
    path = E.run_taxonomy_tables(scale="quick", out=tmp_path / "trec.json", data="trec", **options)
    assert trained == ["flat", "hierarchical"]
    assert not partial.exists()
    assert not (tmp_path / ".trec.json.checkpoints").exists()  # each run's epoch checkpoint went with it
    runs = [r for r in load_results(path)["records"] if r["kind_of_record"] == "run"]
    assert [r["model"] for r in runs] == ["flat", "hierarchical"]


def test_taxonomy_tables_refuses_unknown_data_and_options(tmp_path):
    with pytest.raises(ValueError, match="data must be"):
        E.run_taxonomy_tables(out=tmp_path / "x.json", data="imdb")
    with pytest.raises(ValueError, match="unknown option"):
        E.run_taxonomy_tables(out=tmp_path / "x.json", data="trec", hidden="3")


# ---- the full-scale path: document cap, GloVe stand-ins, presets, sizing ----

@given(st.lists(st.integers(0, 400), min_size=1, max_size=60).filter(lambda xs: sum(xs) > 0),
       st.floats(0.05, 1.0))
@settings(max_examples=200, deadline=None)
def test_token_cap_keeps_the_share_and_is_the_smallest_that_does(lengths, share):
    lengths = np.array(lengths)
    cap = E.token_cap_for_share(lengths, share)
    assert 1 <= cap <= max(lengths.max(), 1)
    assert E.kept_token_share(lengths, cap) >= share - 1e-12
    if cap > 1:  # one token less would keep too little
        assert E.kept_token_share(lengths, cap - 1) < share


def test_token_cap_examples_and_bad_input():
    assert E.token_cap_for_share(np.array([10, 10]), 0.95) == 10  # 9 of 10 keeps 90 %
    assert E.token_cap_for_share(np.array([1, 100]), 0.5) == 50  # kept: 1 + 50 >= 50.5
    assert E.kept_token_share(np.array([0, 0]), 3) == 1.0
    for bad in (np.array([]), np.array([-1, 3]), np.array([[1, 2]])):
        with pytest.raises(ValueError, match="lengths"):
            E.token_cap_for_share(bad)
    with pytest.raises(ValueError, match="share"):
        E.token_cap_for_share(np.array([3]), 0.0)
    with pytest.raises(ValueError, match="cap"):
        E.kept_token_share(np.array([3]), 0)
    assert E.resolve_max_tokens("all", np.array([3, 17, 5]), 0.95) == 17
    assert E.resolve_max_tokens("auto", np.array([10, 10]), 0.95) == 10
    assert E.resolve_max_tokens(7, np.array([10, 10]), 0.95) == 7


def test_full_preset_is_the_papers_setting():
    for data, h_dim in (("trec", 150), ("20ng", 150), ("r8", 150), ("r52", 100)):
        cfg = E._settings("full", data, {})
        assert (cfg["embed_dim"], cfg["hidden_size"], cfg["dropout"], cfg["lr"], cfg["batch_size"]) == (300, h_dim, 0.5, 1e-3, 10)
        assert len(cfg["seeds"]) >= 3 and cfg["embeddings"] == "fasttext" and cfg["max_vocab"] == 0
        assert cfg["max_tokens"] == ("all" if data == "trec" else "auto") and cfg["token_share"] == 0.95
    quick = E._settings("quick", "r8", {"max_tokens": "auto", "embeddings": "fasttext", "gutenberg_tokens": "0"})
    assert quick["max_tokens"] == "auto" and quick["embeddings"] == "fasttext" and quick["gutenberg_tokens"] == 0
    for bad in ({"embeddings": "glove"}, {"embeddings": "random,fasttext"}, {"max_tokens": "some"},
                {"max_tokens": "0"}, {"token_share": "1.5"}, {"gutenberg_tokens": "-1"}):
        with pytest.raises(ValueError):
            E._settings("full", "r8", bad)


def test_pretrained_rows_copy_the_vectors_of_known_words():
    from hsm_lab.data.text_classification import _Encoder

    texts = _Encoder().encode([["a", "b", "a"], ["c"]])
    vocab = TextVocabulary.from_texts(texts)
    vectors = np.arange(6, dtype=np.float32).reshape(3, 2)
    rows, coverage = E.pretrained_rows(vocab, ["b", "a", "zzz"], vectors, seed=0)
    assert rows.shape == (len(vocab), 2) and coverage == pytest.approx(2 / 3)
    assert rows[0].abs().sum() == 0  # padding
    assert rows[vocab.words.index("a")].tolist() == [2.0, 3.0] and rows[vocab.words.index("b")].tolist() == [0.0, 1.0]
    model = LSTMTextClassifier(len(vocab), 2, 3, pretrained=rows)
    assert torch.equal(model.embedding.weight.detach(), rows)


def test_glove_standin_vectors_are_cached_and_cover_the_training_types(tmp_path, monkeypatch):
    pytest.importorskip("fasttext")
    from hsm_lab.data.text_classification import _Encoder

    monkeypatch.setenv("HSM_CACHE", str(tmp_path))
    docs = [["the", "cat", "sat"], ["a", "dog", "ran", "far"]] * 30
    data = type("D", (), {"train_texts": _Encoder().encode(docs)})()
    words, vectors = E.glove_standin_vectors("toy", data, dim=8, gutenberg_tokens=0, epochs=1)
    assert sorted(words) == sorted({w for d in docs for w in d}) and vectors.shape == (len(words), 8)
    assert np.isfinite(vectors).all() and np.abs(vectors).sum() > 0
    cached = list((tmp_path / "derived" / "fasttext").glob("taxonomy-toy-g0-*.npy"))
    assert len(cached) == 1
    again_words, again = E.glove_standin_vectors("toy", data, dim=8, gutenberg_tokens=0, epochs=1)
    assert again_words == words and np.array_equal(again, vectors)  # read back, not retrained (fastText is unseeded)
    with pytest.raises(ValueError, match="gutenberg_tokens"):
        E.glove_standin_vectors("toy", data, gutenberg_tokens=-1)


@needs_data
def test_taxonomy_tables_with_standin_vectors_and_token_cap(tmp_path, monkeypatch):
    pytest.importorskip("fasttext")
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    path = E.run_taxonomy_tables(scale="quick", out=tmp_path / "r8.json", data="r8", models="flat,hierarchical",
                                 train_limit="40", test_limit="30", max_tokens="auto", embeddings="fasttext",
                                 gutenberg_tokens="0", embed_dim="8", hidden_size="4", seeds="0,1")
    payload = load_results(path)
    cfg = payload["provenance"]["config"]
    assert cfg["kept_token_share_train"] >= 0.95 and cfg["max_tokens"] == "auto"
    assert "stand-ins" in cfg["embeddings_note"] and cfg["complete"]
    runs = [r for r in payload["records"] if r["kind_of_record"] == "run"]
    assert len(runs) == 4 and all(0 < r["pretrained_coverage"] <= 1 for r in runs)
    for mean in (r for r in payload["records"] if r["kind_of_record"] == "mean_over_seeds"):
        assert len(mean["values"]) == 2 and mean["min"] <= mean["value"] <= mean["max"]


@needs_data
def test_estimate_epoch_seconds_extrapolates_from_the_timed_steps(monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    est = E.estimate_epoch_seconds("trec", model="hierarchical", batches=2, scale="quick", train_limit="45")
    assert est["steps_timed"] == 2 and est["steps_per_epoch"] == 5  # ceil(45 / 10)
    assert est["epoch_wall_seconds"] >= 0 and est["epoch_cpu_seconds"] >= 0
    assert 0 < est["tokens_timed"] < est["tokens_per_epoch"]
    whole = E.estimate_epoch_seconds("trec", batches=99, scale="quick", train_limit="45")
    assert whole["steps_timed"] == 5 and whole["tokens_timed"] == whole["tokens_per_epoch"]  # the whole epoch timed
    with pytest.raises(ValueError, match="batches"):
        E.estimate_epoch_seconds("trec", batches=0, scale="quick")


@given(st.lists(st.integers(1, 30), min_size=1, max_size=80), st.integers(1, 7), st.integers(0, 5), st.integers(0, 99))
@settings(max_examples=60, deadline=None)
def test_length_bucketed_batches_show_every_document_once(lengths, batch_size, bucket, seed):
    """With or without length buckets an epoch holds every document exactly once, its tokens intact."""
    n = len(lengths)
    tokens = torch.zeros(n, max(lengths), dtype=torch.long)
    for i, length in enumerate(lengths):
        tokens[i, :length] = i + 2
    batches = list(E._batches(tokens, torch.arange(n), batch_size, torch.Generator().manual_seed(seed), bucket))
    seen = torch.cat([y for _, y in batches])
    assert sorted(seen.tolist()) == list(range(n))
    for x, y in batches:
        assert len(y) <= batch_size and x.shape[1] == max(lengths[i] for i in y.tolist())
        for row, i in zip(x, y.tolist()):
            assert int((row != 0).sum()) == lengths[i] and bool((row[: lengths[i]] == i + 2).all())
    if bucket > 0 and n <= bucket * batch_size:  # one pool: the batches cut a length-sorted order
        spans = sorted((min(lengths[i] for i in y.tolist()), max(lengths[i] for i in y.tolist())) for _, y in batches)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@needs_data
def test_full_scale_random_reference_is_labelled_apart_from_the_papers_setting(tmp_path, monkeypatch):
    """A full-scale run with random embeddings is the lower reference: its scale label keeps it out
    of the landing page's "full" rows, while a quick run keeps the plain label."""
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    small = dict(train_limit="60", test_limit="40", max_tokens="8", max_vocab="300", models="flat", seeds="0",
                 max_epochs="1", embed_dim="8", hidden_size="4")
    path = E.run_taxonomy_tables(scale="full", out=tmp_path / "trec.json", data="trec", embeddings="random", **small)
    label = load_results(path)["provenance"]["hsm_scale"]
    assert label.startswith("full, ") and "8-d random-init embeddings, not the paper's GloVe" in label
    assert "first 60 training documents" in label and "models: flat" in label
    from hsm_lab.report import measurements

    assert [m.scale for m in measurements(tmp_path)["sf2020.table1.trec.flat.f1"]] == [label]


def _small_trec_run(monkeypatch, kind: str, epochs: int):
    """A TREC slice small enough to train ``epochs`` epochs in seconds (the tree learned in all but
    the last), and the run of ``kind`` on it never stopped: (cfg, data, validation split, vectors, result)."""
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    cfg, dataset, pretrained = E._prepare("quick", "trec", dict(
        train_limit="80", test_limit="40", max_tokens="8", max_vocab="300", max_epochs=str(epochs),
        patience=str(epochs), learn_tree_epochs=str(epochs - 1), reassign_per_epoch="4"))
    valid = dataset.validation_split(cfg["valid_fraction"], seed=3)
    return cfg, dataset, valid, pretrained, E.train_one(kind, dataset, valid, cfg, seed=3, pretrained=pretrained)


@needs_data
@pytest.mark.parametrize("kind", ["hierarchical", "learned"])
def test_train_one_resumed_from_its_epoch_checkpoint_matches_a_run_never_stopped(tmp_path, monkeypatch, capsys, kind):
    """Stopped after its 2nd of 4 epochs (while Algorithm 1 still moves the learned tree) and run
    again, a model ends exactly as the run that was never stopped: weights, optimiser moments, tree,
    learner statistics, example order and dropout masks all come back from the checkpoint."""
    cfg, dataset, valid, pretrained, never_stopped = _small_trec_run(monkeypatch, kind, epochs=4)
    ckpt = tmp_path / "run.pt"
    save = E.save_checkpoint

    def save_then_stop(state, path):
        save(state, path)
        if state["epoch"] == 2:
            raise KeyboardInterrupt  # a session cut at its time limit

    monkeypatch.setattr(E, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        E.train_one(kind, dataset, valid, cfg, seed=3, pretrained=pretrained, checkpoint=ckpt)
    assert ckpt.exists()
    capsys.readouterr()
    resumed = E.train_one(kind, dataset, valid, cfg, seed=3, pretrained=pretrained, checkpoint=ckpt)
    assert "resuming after epoch 2" in capsys.readouterr().err
    assert not ckpt.exists()  # removed once the run finished
    assert resumed["test"] == never_stopped["test"]
    assert resumed["best_epoch"] == never_stopped["best_epoch"]
    assert [h["train_loss"] for h in resumed["history"]] == [h["train_loss"] for h in never_stopped["history"]]
    if kind == "learned":
        assert resumed["moved_labels"] == never_stopped["moved_labels"]
        assert resumed["top_level_split"] == never_stopped["top_level_split"]
        assert resumed["ari_top_level_initial"] == never_stopped["ari_top_level_initial"]


@needs_data
@pytest.mark.parametrize("kind", ["flat", "learned"])
def test_train_one_resumed_within_an_epoch_matches_a_run_never_stopped(tmp_path, monkeypatch, capsys, kind):
    """Stopped after the 3rd batch of its 2nd epoch (checkpoints after every batch) and run again, a
    model redraws that epoch's order, goes on at the 4th batch and ends as the run never stopped."""
    cfg, dataset, valid, pretrained, never_stopped = _small_trec_run(monkeypatch, kind, epochs=3)
    ckpt = tmp_path / "run.pt"
    save = E.save_checkpoint

    def save_then_stop(state, path):
        save(state, path)
        if state["epoch"] == 1 and state.get("step_in_epoch") == 3:
            raise KeyboardInterrupt  # a session cut at its time limit, mid-epoch

    monkeypatch.setattr(E, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        E.train_one(kind, dataset, valid, cfg, seed=3, pretrained=pretrained, checkpoint=ckpt, checkpoint_seconds=1e-9)
    capsys.readouterr()
    resumed = E.train_one(kind, dataset, valid, cfg, seed=3, pretrained=pretrained, checkpoint=ckpt,
                          checkpoint_seconds=1e-9)
    assert "resuming in epoch 2 after 3 batches" in capsys.readouterr().err
    assert not ckpt.exists()
    assert resumed["test"] == never_stopped["test"] and resumed["best_epoch"] == never_stopped["best_epoch"]
    # the interrupted epoch's mean loss is put together from its two sittings: equal to rounding
    assert [h["train_loss"] for h in resumed["history"]] == pytest.approx(
        [h["train_loss"] for h in never_stopped["history"]], rel=1e-12)
    if kind == "learned":
        assert resumed["moved_labels"] == never_stopped["moved_labels"]


@needs_data
def test_train_one_ignores_a_checkpoint_of_another_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    cfg, dataset, pretrained = E._prepare("quick", "trec", dict(
        train_limit="60", test_limit="30", max_tokens="8", max_vocab="300", max_epochs="2", patience="2"))
    valid = dataset.validation_split(cfg["valid_fraction"], seed=0)
    ckpt = tmp_path / "run.pt"
    save = E.save_checkpoint
    monkeypatch.setattr(E, "save_checkpoint", lambda state, path: save(state, path) and (_ for _ in ()).throw(
        KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        E.train_one("flat", dataset, valid, cfg, seed=0, pretrained=pretrained, checkpoint=ckpt)
    monkeypatch.setattr(E, "save_checkpoint", save)
    with pytest.warns(UserWarning, match="saved by another run"):
        other = E.train_one("flat", dataset, valid, cfg, seed=1, pretrained=pretrained, checkpoint=ckpt)
    assert [h["epoch"] for h in other["history"]] == [1, 2]  # trained from the start
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        E.train_one("flat", dataset, valid, cfg, seed=0, pretrained=pretrained, checkpoint=ckpt)


def test_headline_file_is_the_complete_standin_run_with_the_largest_budget(tmp_path):
    from hsm_lab.results import write_results

    folder = tmp_path / "taxonomy"

    def result(name: str, max_epochs: int, complete: bool = True) -> None:
        write_results(folder / name, [], {"date_utc": "2026-01-01T00:00:00Z", "git_commit": None, "hsm_scale": "full",
                                          "config": {"max_epochs": max_epochs, "complete": complete}})

    assert E.headline_file("r8", tmp_path) is None
    result("r8-full-ft300-5ep.json", 5)
    result("r8-full-random300-40ep.json", 40)      # the lower reference never stands for the table
    result("r8.json", 99)                           # nor a reduced run
    assert E.headline_file("r8", tmp_path).name == "r8-full-ft300-5ep.json"
    result("r8-full-ft300-40ep.json", 40, complete=False)  # still running
    assert E.headline_file("r8", tmp_path).name == "r8-full-ft300-5ep.json"
    result("r8-full-ft300-40ep.json", 40)
    assert E.headline_file("r8", tmp_path).name == "r8-full-ft300-40ep.json"
    assert E.headline_file("r8", tmp_path, embeddings="random").name == "r8-full-random300-40ep.json"
    with pytest.raises(ValueError, match="data must be one of"):
        E.headline_file("imdb", tmp_path)
    with pytest.raises(ValueError, match="embeddings must be one of"):
        E.headline_file("r8", tmp_path, embeddings="glove")


# ------------------------------------------------------------------------- model selection by cross-validation
@needs_data
def test_taxonomy_cv_scores_every_setting_on_every_fold_and_resumes(tmp_path, monkeypatch):
    from hsm_lab.experiments import taxonomy_cv as CV

    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    options = dict(train_limit="60", test_limit="40", max_tokens="8", max_vocab="300", folds="3",
                   hidden_sizes="4,8", directions="uni,bi", models="flat")
    trained: list[tuple[int, bool]] = []
    real_train_one = E.train_one

    def stopped_after_five(kind, data, valid, cfg, *args, **kwargs):
        if len(trained) == 5:
            raise KeyboardInterrupt
        trained.append((cfg["hidden_size"], cfg["bidirectional"]))
        return real_train_one(kind, data, valid, cfg, *args, **kwargs)

    monkeypatch.setattr(E, "train_one", stopped_after_five)
    with pytest.raises(KeyboardInterrupt):
        CV.run_taxonomy_cv(scale="quick", out=tmp_path / "cv.json", data="trec", **options)
    assert load_results(tmp_path / "cv.json")["provenance"]["config"]["complete"] is False
    monkeypatch.setattr(E, "train_one", lambda *a, **k: (trained.append("again"), real_train_one(*a, **k))[1])
    path = CV.run_taxonomy_cv(scale="quick", out=tmp_path / "cv.json", data="trec", **options)
    assert trained.count("again") == 2 * 2 * 3 - 5  # only the runs not finished before the stop
    payload = load_results(path)
    folds = [r for r in payload["records"] if r["kind_of_record"] == "cv_fold"]
    assert len(folds) == 12 and {(r["hidden_size"], r["bidirectional"]) for r in folds} == {
        (h, b) for h in (4, 8) for b in (False, True)}
    settings_ = [r for r in payload["records"] if r["kind_of_record"] == "cv_setting"]
    assert len(settings_) == 4 and all(r["folds_done"] == 3 for r in settings_)
    chosen = [r for r in settings_ if r["selected"]]
    assert len(chosen) == 1 and chosen[0]["value"] == max(r["value"] for r in settings_)
    one = [r["value"] for r in folds if (r["hidden_size"], r["bidirectional"]) == (4, True)]
    assert next(r for r in settings_ if (r["hidden_size"], r["bidirectional"]) == (4, True))["value"] == \
        pytest.approx(np.mean(one))
    assert payload["provenance"]["config"]["complete"] is True
    assert not (tmp_path / ".cv.json.partial.json").exists()


def test_taxonomy_cv_refuses_the_options_it_varies(tmp_path):
    from hsm_lab.experiments import taxonomy_cv as CV

    with pytest.raises(ValueError, match="hidden_sizes"):
        CV.run_taxonomy_cv(out=tmp_path / "x.json", hidden_size="100")
    with pytest.raises(ValueError, match="directions"):
        CV.run_taxonomy_cv(out=tmp_path / "x.json", directions="both")
    with pytest.raises(ValueError, match="folds"):
        CV.run_taxonomy_cv(out=tmp_path / "x.json", folds="1")


def test_scale_label_names_the_selection_and_a_one_directional_lstm():
    cfg = dict(embed_dim=300, embeddings="fasttext", gutenberg_tokens=2_000_000, valid_fraction=0.1, max_epochs=40,
               patience=5, max_tokens="all", seeds=[0], models=["flat", "hierarchical"], bidirectional=False)
    label = E.scale_label("full", cfg, selection="4-fold cross-validation of h_dim")
    assert "4-fold cross-validation of h_dim" in label and "no 4-fold CV" not in label
    assert "one-directional" in label and "1 seed" in label
    assert "one-directional" not in E.scale_label("full", dict(cfg, bidirectional=True))
    assert "buckets" not in label
    assert "batches drawn from 50 buckets of similar length" in E.scale_label("full", dict(cfg, length_buckets=50))


@needs_data
def test_a_resumed_taxonomy_run_records_the_training_time_of_every_part(tmp_path, monkeypatch):
    """wall_time_s is the last invocation's; training_seconds adds the parts trained before it."""
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    options = dict(train_limit="60", test_limit="40", max_tokens="8", max_vocab="300", models="flat,hierarchical")
    seconds = {"flat": 3600.0, "hierarchical": 5400.0}

    def hours_of_training(kind, *args, **kwargs):
        if kind == "hierarchical" and not stopped:
            stopped.append(kind)
            raise KeyboardInterrupt
        test = {"f1": 50.0, "precision": 50.0, "recall": 50.0, "accuracy": 50.0}
        return {"test": test, "best_epoch": 1, "valid_f1": 50.0, "history": [], "train_seconds": seconds[kind],
                "vocab_size": 10, "train_examples": 60}

    stopped: list[str] = []
    monkeypatch.setattr(E, "train_one", hours_of_training)
    with pytest.raises(KeyboardInterrupt):
        E.run_taxonomy_tables(scale="quick", out=tmp_path / "trec.json", data="trec", **options)
    progress = load_results(tmp_path / "trec.json")["provenance"]["config"]
    assert progress["training_seconds"] == 3600.0 and not progress["complete"]
    prov = load_results(E.run_taxonomy_tables(scale="quick", out=tmp_path / "trec.json", data="trec",
                                              **options))["provenance"]
    assert prov["config"]["training_seconds"] == pytest.approx(9000.0)


def test_token_cap_uses_the_share_as_kept_token_share_rounds_it() -> None:
    # 0.07 * 100 rounds above 7, while 7 / 100 == 0.07: the cap is 7, not 8
    assert E.token_cap_for_share(np.array([100]), 0.07) == 7


def test_balanced_class_weights_are_n_over_c_n_c():
    labels = torch.tensor([0, 0, 0, 1, 2, 2])
    weights = E.balanced_class_weights(labels, 4)
    torch.testing.assert_close(weights, torch.tensor([6 / (4 * 3), 6 / 4, 6 / (4 * 2), 0.0]))


@pytest.mark.parametrize("kind", ["flat", "hierarchical"])
def test_class_weighted_loss_is_cross_entropy_with_class_weights(kind):
    # the flat layer's weighted loss is nn.CrossEntropyLoss(weight=...); the tree's is the same
    # weighted mean of its per-example negative log-likelihoods
    names = [f"c{i}" for i in range(6)]
    taxonomy = {"a": names[:2], "b": names[2:]}
    torch.manual_seed(0)
    layer = E.build_output_layer(kind, 5, names, taxonomy).double()
    h, y = torch.randn(9, 5, dtype=torch.double), torch.tensor([0, 1, 1, 2, 3, 3, 3, 4, 5])
    weights = E.balanced_class_weights(y, 6).double()
    loss = E._ClassWeightedLoss(layer, weights)(h, y).loss
    log_p = layer.log_prob(h)
    expected = torch.nn.functional.nll_loss(log_p, y, weight=weights)
    torch.testing.assert_close(loss, expected)
    ones = E._ClassWeightedLoss(layer, torch.ones(6, dtype=torch.double))(h, y).loss
    torch.testing.assert_close(ones, layer(h, y).loss)  # equal weights: the plain loss


def test_paper_protocol_and_the_variants_label():
    cfg = E._settings("full", "r52", {})
    assert E.paper_protocol(cfg)
    for option in ({"class_weights": "balanced"}, {"optimizer": "adam"}):
        variant = E._settings("full", "r52", option)
        assert not E.paper_protocol(variant)
        label = E.scale_label("full", dict(variant, max_tokens_used=30, kept_token_share_train=0.95))
        assert ("class-balanced loss" in label) == ("class_weights" in option)
        assert ("one Adam over every parameter" in label) == ("optimizer" in option)
    with pytest.raises(ValueError, match="class_weights"):
        E._settings("full", "r52", {"class_weights": "inverse"})


@needs_data
def test_a_variant_run_names_no_paper_number_and_records_per_class_f1(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    path = E.run_taxonomy_tables(scale="quick", out=tmp_path / "trec.json", data="trec", train_limit="60",
                                 test_limit="40", max_tokens="8", max_vocab="300", models="flat,hierarchical",
                                 class_weights="balanced", optimizer="adam")
    records = load_results(path)["records"]
    assert all(r["claim"] is None for r in records)
    run = next(r for r in records if r["kind_of_record"] == "run")
    per_class = [f for f in run["test_f1_per_class"] if f is not None]
    assert run["test"]["f1"] == pytest.approx(np.mean(per_class))
    assert sum(run["train_class_counts"]) == run["train_examples"]


@pytest.mark.skipif(not (MIRROR / "trec").exists(), reason="data mirror not available")
def test_taxonomy_experiment_keeps_the_decay_of_its_committed_runs(monkeypatch):
    # its committed results were made with the statistics decay of 0.5, TreeLearner's old default
    from hsm_lab.experiments import taxonomy

    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    cfg, dataset, pretrained = taxonomy._prepare("quick", "trec", dict(
        train_limit="60", test_limit="40", max_tokens="8", max_vocab="300"))
    valid = dataset.validation_split(cfg["valid_fraction"], seed=0)
    learner = taxonomy._build("learned", dataset, valid, cfg, 0, pretrained, torch.device("cpu"))[-2]
    assert isinstance(learner, hsm.TreeLearner) and learner.statistics.decay == 0.5


@needs_data
def test_train_one_names_a_damaged_checkpoint_and_the_fix(tmp_path, monkeypatch):
    """A checkpoint of this run whose learner statistics hold a NaN: one line naming the file."""
    import torch

    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    cfg, dataset, pretrained = E._prepare("quick", "trec", dict(
        train_limit="60", test_limit="30", max_tokens="8", max_vocab="300", max_epochs="2", patience="2",
        learn_tree_epochs="2"))
    valid = dataset.validation_split(cfg["valid_fraction"], seed=0)
    ckpt = tmp_path / "run.pt"
    save = E.save_checkpoint
    monkeypatch.setattr(E, "save_checkpoint", lambda state, path: save(state, path) and (_ for _ in ()).throw(
        KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        E.train_one("learned", dataset, valid, cfg, seed=0, pretrained=pretrained, checkpoint=ckpt)
    monkeypatch.setattr(E, "save_checkpoint", save)
    state = torch.load(ckpt, weights_only=False)
    state["learner"]["statistics"]["sum_probas"].view(-1)[0] = float("nan")
    torch.save(state, ckpt)
    with pytest.raises(ValueError) as error:
        E.train_one("learned", dataset, valid, cfg, seed=0, pretrained=pretrained, checkpoint=ckpt)
    message = str(error.value)
    assert "\n" not in message and f"checkpoint {ckpt} cannot be resumed" in message and "delete it" in message
