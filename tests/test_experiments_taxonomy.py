"""Seed 003 pieces (hsm.sequence_models, hsm.experiments.taxonomy) and the experiment at a tiny scale."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hsm
from hsm.results import load_results
from hsm.experiments import taxonomy as E
from hsm.sequence_models import LSTMTextClassifier, TextVocabulary, classification_metrics, encode_texts

MIRROR = Path(os.environ.get("HSM_DATA_MIRROR", Path(__file__).resolve().parents[2] / "shared" / "data"))
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
    from hsm.data.text_classification import _Encoder

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


def test_taxonomy_tables_refuses_unknown_data_and_options(tmp_path):
    with pytest.raises(ValueError, match="data must be"):
        E.run_taxonomy_tables(out=tmp_path / "x.json", data="imdb")
    with pytest.raises(ValueError, match="unknown option"):
        E.run_taxonomy_tables(out=tmp_path / "x.json", data="trec", hidden="3")
