"""The thesis' "simple version" of Mnih & Hinton (2009)'s paradigm (thesis §3.2: it "performs
significantly worse than our method"): learn word representations on a random tree, cluster the
words by them into a tree, and train a new model on that tree.

As Mnih & Hinton bootstrap their trees: the model is lm-gutenberg-offset's random-tree model (the
full table's 65-ary depth-3 tree and learning rate, one epoch; reused when it exists). Every word is
represented by what that model learned of it (:func:`word_vectors`):

- ``predicted`` (Mnih & Hinton's choice): the mean of the predicted vectors ``r_hat = f(x)`` over
  the training contexts the word follows, i.e. where the model places the word's contexts;
- ``input``: the model's input embedding of the word.

The vectors go through the clustering tree's own builder (:func:`hsm.clustering.clustering_tree`:
65² k-means clusters filled to 65 words, grouped 65 by 65), and a new model trains on that tree
from scratch at the table's settings for the offset run's one epoch, so that it compares with the
one-epoch random-tree and clustering-tree runs. Its model is kept in the run folder (beside the
random-tree model) for diagnostics that read the trained model.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm.clustering import clustering_tree
from hsm_lab.experiments import check_device, check_scale, experiment, option_choice
from hsm_lab.results import check_replace, make_record

from hsm_lab.data.lm import LMCorpus

from hsm_lab.experiments.lm.config import LMRunConfig, LMRunResult
from hsm_lab.experiments.lm.offset import OFFSET_EXPERIMENT, kept_random_run
from hsm_lab.experiments.lm.report import _common_fields, _out_path, _write
from hsm_lab.experiments.lm.tables import _run_dir
from hsm_lab.experiments.lm.training import load_trained_model, train_lm

__all__ = ["WORD_VECTORS", "run_lm_gutenberg_mnih_hinton", "train_mnih_hinton", "word_vectors"]

#: how a word is represented for the clustering (see the module docstring)
WORD_VECTORS = ("predicted", "input")
DEFAULT_OUT = "results/lm/gutenberg-mnih-hinton.json"


@torch.no_grad()
def word_vectors(model: torch.nn.Module, contexts: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                 kind: str = "predicted", batch_size: int = 8192) -> np.ndarray:
    """``[V, d]`` word representations from a trained log-bilinear ``model``: ``kind="predicted"``
    averages the predicted vector ``f(x)`` over the contexts ``x`` followed by each word in
    ``targets`` (Mnih & Hinton 2009); a word never seen as a target keeps its input embedding.
    ``kind="input"``: the input embeddings. ValueError for another ``kind``."""
    if kind not in WORD_VECTORS:
        raise ValueError(f"word vectors {kind!r} unknown; choose from {', '.join(WORD_VECTORS)}")
    embedding = model.embedding.weight.detach().double()
    if kind == "input":
        return embedding.cpu().numpy()
    sums = torch.zeros(vocab_size, embedding.shape[1], dtype=torch.float64, device=embedding.device)
    counts = torch.zeros(vocab_size, dtype=torch.float64, device=embedding.device)
    for start in range(0, len(targets), batch_size):
        y = targets[start:start + batch_size]
        sums.index_add_(0, y, model(contexts[start:start + batch_size]).double())
        counts.index_add_(0, y, torch.ones(len(y), dtype=torch.float64, device=y.device))
    seen = counts > 0
    sums[seen] /= counts[seen, None]
    sums[~seen] = embedding[~seen]
    return sums.cpu().numpy()


def train_mnih_hinton(corpus: LMCorpus, cfg: LMRunConfig, model: torch.nn.Module, kind: str = "predicted",
                      device: str | torch.device = "cpu") -> tuple[LMRunResult, float]:
    """The Mnih-Hinton tree of the trained random-tree ``model`` (:func:`word_vectors` of ``kind``,
    then :func:`hsm.clustering.clustering_tree`) and a new model trained on it from scratch with the
    settings ``cfg`` of the random-tree run, kept in that run's folder; resumes or reads a finished
    run. Returns the run and the seconds spent building the tree."""
    t0 = time.perf_counter()
    contexts, targets = (t.to(device) for t in corpus.windows("train", cfg.context))
    vectors = word_vectors(model, contexts, targets, corpus.vocab_size, kind)
    del contexts, targets
    tree = clustering_tree(vectors, cfg.arity, cfg.depth, seed=0, label_names=corpus.vocab)
    tree_seconds = time.perf_counter() - t0
    log = lambda message: print(message, flush=True)  # noqa: E731
    # its own run key: a clustering tree built from other vectors than the clustering row's
    run = train_lm(corpus, replace(cfg, output="clustering", fixed_tree=f"mnih-hinton:{kind}"), tree=tree,
                   device=device, checkpoint_dir=_run_dir(OFFSET_EXPERIMENT), log=log, keep_model=True)
    return run, tree_seconds


@experiment("lm-gutenberg-mnih-hinton", "The thesis' simple Mnih-Hinton baseline: cluster the words by the "
            "representations a random-tree model learned in one epoch (lm-gutenberg-offset's), then train a new "
            "model on that tree", DEFAULT_OUT)
def run_lm_gutenberg_mnih_hinton(scale: str = "quick", device: str = "cpu", out: Path | None = None,
                                 force: bool = False, **options: Any) -> Path:
    """See the module docstring. Option: ``word_vectors`` (``predicted``, the default, or ``input``)."""
    from hsm_lab.experiments.lm.commands import _scale_for

    start = time.perf_counter()
    scale = check_scale(scale)
    given, options = dict(options), dict(options)
    kind = option_choice("word_vectors", options.pop("word_vectors", "predicted"), WORD_VECTORS)
    if options:
        raise ValueError(f"unknown options {sorted(options)}; known: word_vectors")
    sc = _scale_for(OFFSET_EXPERIMENT, scale, {})
    device = check_device(device)
    path = _out_path(out, DEFAULT_OUT)
    check_replace(path, scale, force)
    corpus, run, cfg, files = kept_random_run(sc, device)
    model, _, _ = load_trained_model(files.model, device)
    new, tree_seconds = train_mnih_hinton(corpus, cfg, model, kind, device)
    common = dict(_common_fields(corpus, sc, scale), model="Mnih-Hinton tree", run="mnih-hinton",
                  word_vectors=kind, lr=new.config["lr"], epochs=new.config["epochs"], per_epoch=new.epochs,
                  wall_time_s=new.seconds, tree_seconds=tree_seconds,
                  random_tree_test_perplexity=run.test_perplexity,
                  random_tree_valid_perplexity=run.valid_perplexity)
    records = [make_record(None, new.test_perplexity, measure="test_perplexity",
                           valid_perplexity=new.valid_perplexity, **common)]
    return _write("lm-gutenberg-mnih-hinton", out, DEFAULT_OUT, records, sc, scale, device,
                  time.perf_counter() - start, None, given, run.seconds + new.seconds,
                  extra_config={"model_of": OFFSET_EXPERIMENT, "word_vectors": kind}, force=force)
