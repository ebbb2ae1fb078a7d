"""The transformer-ptb experiment: its options, the runs they make, and one short run of each recipe on a toy corpus."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hsm_lab.experiments.transformer_lm import LAYERS, _run, _run_keys, _windows, parse_options


def test_rates_cross_the_recipe_layers_and_shares_the_learned_ones():
    layers, settings = parse_options("full", {"layer_lr": "0.05,0.2", "learn_share": "0.25,0.5"})
    assert layers == LAYERS and settings["cpu_seconds"] == 400.0
    keys = _run_keys(layers, settings)
    assert [k for k in keys if k[0] == "flat"] == [("flat", 0.05, 0.25)]
    assert len([k for k in keys if k[0] == "huffman"]) == 2
    assert len([k for k in keys if k[0] == "learned"]) == 4
    assert [k for k in keys if k[0] == "learned-dense"] == [("learned-dense", 0.05, 0.25)]


@pytest.mark.parametrize("options, match", [({"layers": "tree"}, "layers"), ({"dim": "130"}, "multiple of heads"),
                                            ({"learn_share": "1.5"}, "learn_share"), ({"probe_steps": "1"}, "probe_steps"),
                                            ({"colour": "red"}, "unknown option")])
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        parse_options("quick", options)


@pytest.mark.parametrize("kind", ["adaptive", "learned", "learned-dense"])
def test_a_short_run_learns_and_reports_its_schedule(kind):
    torch.manual_seed(0)
    vocab = 300
    counts = np.sort(np.random.default_rng(0).integers(1, 100, vocab))[::-1].astype(np.int64)
    stream = torch.randint(0, vocab, (20_000,))
    corpus = SimpleNamespace(vocab_size=vocab, counts=counts, train=stream)
    _, settings = parse_options("quick", {"dim": "16", "heads": "2", "blocks": "1", "context": "8", "batch": "4",
                                          "cpu_seconds": "0.3", "evals": "2", "rebuilds": "3"})
    if kind == "adaptive":
        settings["dim"] = 16  # the adaptive softmax's cut-offs need K > 4,000: a larger toy vocabulary
        vocab = 5_000
        corpus = SimpleNamespace(vocab_size=vocab, counts=np.arange(vocab, 0, -1), train=torch.randint(0, vocab, (20_000,)))
    data = _windows(corpus.train[:2_000], settings["context"])
    row = _run(kind, 0.1, 0.5, corpus, data, data, settings, log=lambda message: None)
    assert row["steps"] > settings["probe_steps"] and len(row["curve"]) == 2
    assert row["cpu_seconds"] >= 0.3 and np.isfinite(row["test_perplexity"])
    if kind.startswith("learned"):
        assert row["rebuilds"] >= 1 and row["freeze_after"] > settings["probe_steps"]
