"""hsm_lab.experiments.lm.new_words: held-out words added to a trained LM's tree, at a tiny scale."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hsm_lab.experiments.lm import new_words
from hsm_lab.experiments.lm.config import LMRunConfig
from toy_lm import toy_corpus


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HSM_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_held_out_words_are_frequent_ordinary_words_and_vanish_from_the_reduced_corpus() -> None:
    corpus = toy_corpus(tokens=6000, eval_tokens=800)
    words = new_words.held_out_words(corpus, 0.1, seed=3, min_count=20)
    assert len(words) == 4 and corpus.unk_id not in words and corpus.eos_id not in words
    assert (corpus.counts[words] >= 20).all()
    reduced, mapping = new_words.without_words(corpus, words)
    assert reduced.vocab_size == corpus.vocab_size - 4
    assert not set(corpus.vocab[w] for w in words) & set(reduced.vocab)
    unk = reduced.unk_id
    assert int((reduced.train == unk).sum()) == int(np.isin(corpus.train.numpy(), np.append(words, corpus.unk_id)).sum())
    kept = ~np.isin(corpus.train.numpy(), words)
    assert [reduced.vocab[i] for i in reduced.train.numpy()[kept]] == [corpus.vocab[i] for i in corpus.train.numpy()[kept]]
    assert reduced.counts.sum() == corpus.counts.sum()
    first = new_words.first_occurrences_only(corpus, words, 3)
    assert [int((first.train == w).sum()) for w in words] == [3] * 4
    assert torch.equal(first.test, corpus.test) and first.vocab == corpus.vocab


def test_unk_shares_give_each_word_k_of_the_unknown_tokens() -> None:
    corpus = toy_corpus(tokens=6000, eval_tokens=800)
    words = new_words.held_out_words(corpus, 0.1, seed=3, min_count=20)
    reduced, _ = new_words.without_words(corpus, words)
    unknown = int(np.isin(corpus.train.numpy(), np.append(words, corpus.unk_id)).sum())
    assert new_words._unk_share(reduced, 2) == 2 / unknown


def test_one_seed_adds_the_words_and_every_method_gives_finite_perplexities(tmp_path) -> None:
    corpus = toy_corpus(tokens=6000, eval_tokens=800)
    cfg = LMRunConfig(output="learned", context=2, dim=16, arity=4, depth=3, batch_size=64, lr=0.2, epochs=1,
                      learn_epochs=1, reassign_per_epoch=4)
    settings = {"held_out": 0.1, "min_count": 20, "reference": 200, "local_steps": 3, "local_lr": 0.1}
    rows = new_words._seed_rows(corpus, cfg, 0, (1, 5), list(new_words.METHODS), settings, tmp_path, lambda m: None)
    rows += new_words._retrain_row(corpus, cfg, {0: new_words.held_out_words(corpus, 0.1, 0, 20)}, tmp_path,
                                   lambda m: None)
    assert [r["method"] for r in rows] == ["before"] + list(new_words.METHODS) * 2 + ["retrain"]
    for r in rows:
        assert all(math.isfinite(r[key]) and r[key] > 1 for key in r if key.startswith("perplexity"))
        if r["method"] != "before":  # the new words' perplexity: reaching the node, times the slot there
            assert r["perplexity_new"] == pytest.approx(r["perplexity_new_path"] * r["perplexity_new_slot"], rel=1e-6)
    for r in rows:
        if r["method"] in ("objective", "random", "objective-local"):
            assert 0 <= r["below_threshold"] <= 1
    before = rows[0]
    # unk-share leaves every trained word's probability as it was, bar <unk>'s own (which gives the shares)
    unk_share = next(r for r in rows if r["method"] == "unk-share")
    assert unk_share["perplexity_trained"] >= before["perplexity_trained"]
    summary = new_words.summarise(rows)
    assert {(s["method"], s["examples"]) for s in summary} == {(m, k) for m in new_words.METHODS for k in (1, 5)}
    for s in summary:
        assert s["new_over_kshot_mean"] > 0 and s["new_over_retrain_mean"] > 0


def test_options_are_checked_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="min_count"):
        new_words.parse_options("full", {"examples": "1,30"})
    with pytest.raises(ValueError, match="unknown option"):
        new_words.parse_options("quick", {"arity": "4"})
    seeds, examples, methods, settings = new_words.parse_options("quick", {})
    assert (seeds, examples, methods) == ((0,), (1, 5), list(new_words.METHODS))
