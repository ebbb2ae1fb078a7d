"""Tests for hsm.text_models: vocabulary, hashed bigrams, bag batching, the bag-of-words model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.text_models import BagOfWordsClassifier, WordVocabulary, hashed_bigrams, make_bags

docs_strategy = st.lists(st.lists(st.integers(0, 19), min_size=0, max_size=8), min_size=1, max_size=12)


def _ragged(docs):
    values = np.array([t for d in docs for t in d], dtype=np.int64)
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    return values, offsets


def test_vocabulary_orders_by_frequency_and_drops_unknown_words():
    train = np.array([3, 3, 3, 1, 1, 4])
    vocab = WordVocabulary(train, num_types=6)
    assert len(vocab) == 3
    assert vocab.to_model[[3, 1, 4]].tolist() == [0, 1, 2]  # most frequent first
    assert vocab.to_model[[0, 2, 5]].tolist() == [-1, -1, -1]
    values, offsets = vocab.encode(np.array([3, 5, 4, 0, 2]), np.array([0, 2, 2, 5]))
    assert values.tolist() == [0, 2]
    assert offsets.tolist() == [0, 1, 1, 2]  # the empty document stays, with no words


def test_vocabulary_min_count_and_errors():
    vocab = WordVocabulary(np.array([0, 0, 1]), num_types=2, min_count=2)
    assert len(vocab) == 1
    with pytest.raises(ValueError, match="min_count"):
        WordVocabulary(np.array([0]), num_types=1, min_count=0)
    with pytest.raises(ValueError, match="token ids"):
        WordVocabulary(np.array([0, 7]), num_types=3)
    with pytest.raises(ValueError, match="no word"):
        WordVocabulary(np.array([0]), num_types=2, min_count=5)
    with pytest.raises(ValueError, match="offsets"):
        vocab.encode(np.array([0, 1]), np.array([0, 1]))


@settings(max_examples=50, deadline=None)
@given(docs_strategy, st.integers(1, 50))
def test_hashed_bigrams_keep_words_and_add_one_bigram_per_adjacent_pair(docs, buckets):
    values, offsets = _ragged(docs)
    new_values, new_offsets = hashed_bigrams(values, offsets, first_id=20, buckets=buckets)
    for i, doc in enumerate(docs):
        row = new_values[new_offsets[i]:new_offsets[i + 1]]
        assert row[: len(doc)].tolist() == doc  # the words first, in order
        bigrams = row[len(doc):]
        assert len(bigrams) == max(len(doc) - 1, 0)
        assert ((bigrams >= 20) & (bigrams < 20 + buckets)).all()
        expected = [20 + (a * 116_049_371 + b) % buckets for a, b in zip(doc, doc[1:])]
        assert bigrams.tolist() == expected


@settings(max_examples=50, deadline=None)
@given(docs_strategy, st.data())
def test_make_bags_matches_a_per_document_sum(docs, data):
    values, offsets = _ragged(docs)
    rows = data.draw(st.lists(st.integers(0, len(docs) - 1), min_size=1, max_size=6))
    ids, bag_offsets = make_bags(values, offsets, rows)
    table = torch.randn(20, 3, dtype=torch.float64)
    got = torch.nn.functional.embedding_bag(ids, table, bag_offsets, mode="sum")
    for k, r in enumerate(rows):
        want = table[docs[r]].sum(0) if docs[r] else torch.zeros(3, dtype=torch.float64)
        assert torch.allclose(got[k], want)


def test_sum_is_mean_times_length_and_empty_documents_give_zero():
    torch.manual_seed(0)
    mean = BagOfWordsClassifier(10, 4, reduce="mean")
    total = BagOfWordsClassifier(10, 4, reduce="sum")
    total.load_state_dict(mean.state_dict())
    ids, offsets = make_bags(np.array([1, 2, 3, 4, 5]), np.array([0, 3, 3, 5]), [0, 1, 2])
    h_mean, h_sum = mean(ids, offsets), total(ids, offsets)
    assert torch.allclose(h_sum[0], 3 * h_mean[0])
    assert torch.allclose(h_sum[2], 2 * h_mean[2])
    assert torch.equal(h_mean[1], torch.zeros(4)) and torch.equal(h_sum[1], torch.zeros(4))


def test_fasttext_initialisation_and_sparse_gradients():
    model = BagOfWordsClassifier(50, 8)
    assert model.embedding.weight.abs().max() <= 1 / 8
    ids, offsets = make_bags(np.array([1, 2, 7]), np.array([0, 3]), [0])
    model(ids, offsets).sum().backward()
    grad = model.embedding.weight.grad
    assert grad.is_sparse
    assert sorted(grad.coalesce().indices()[0].tolist()) == [1, 2, 7]  # only the words of the batch


def test_bigram_rows_are_allocated():
    model = BagOfWordsClassifier(10, 4, ngrams=2, buckets=7)
    assert model.num_ids == 17
    values, offsets = hashed_bigrams(np.array([1, 2, 3]), np.array([0, 3]), first_id=10, buckets=7)
    ids, bag_offsets = make_bags(values, offsets, [0])
    assert model(ids, bag_offsets).shape == (1, 4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="reduce"):
        BagOfWordsClassifier(10, 4, reduce="max")
    with pytest.raises(ValueError, match="ngrams"):
        BagOfWordsClassifier(10, 4, ngrams=3)
    with pytest.raises(ValueError, match="dim"):
        BagOfWordsClassifier(10, 0)
    model = BagOfWordsClassifier(10, 4)
    with pytest.raises(ValueError, match="word ids"):
        model(torch.tensor([3, 10]), torch.tensor([0]))
    with pytest.raises(ValueError, match="offsets"):
        model(torch.tensor([3, 4]), torch.tensor([1]))
    with pytest.raises(TypeError, match="tensors"):
        model([3, 4], torch.tensor([0]))
    with pytest.raises(TypeError, match="integer"):
        model(torch.tensor([1.0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="buckets"):
        hashed_bigrams(np.array([1]), np.array([0, 1]), 5, 0)
