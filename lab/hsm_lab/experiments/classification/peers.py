"""The peers of ICML Table 1, run on the same splits in the same process and timed the same way:
fastText itself (``fasttext-wheel``, losses softmax and hs) and Vowpal Wabbit ``--log_multi``
(Choromanska & Langford 2015's logarithmic-time online multiclass tree, the binary ancestor of
the method); :func:`peer_available` says why one cannot run here."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hsm.atomic import atomic_write

from hsm_lab.experiments.classification.data import EncodedSplit
from hsm_lab.experiments.classification.evaluation import _precision_recall

__all__ = ["peer_available", "run_fasttext", "run_vw"]


def _word_text(words: np.ndarray) -> str:
    """One document as the text fastText and Vowpal Wabbit read: word ids as words ``w<id>``, so they
    see exactly our tokens (no re-tokenisation of their own)."""
    return " ".join(f"w{t}" for t in words.tolist())


def _fasttext_lines(split: EncodedSplit, tokens: Sequence[np.ndarray], rng: np.random.Generator | None) -> list[str]:
    """fastText lines ``__label__<id> w<id> ...``; word ids as words so fastText reads exactly our
    tokens (no re-tokenisation). All labels of an example are written (fastText samples one).

    fastText reads its file in order, every epoch, and never shuffles; a file sorted by label (the
    Gutenberg passages come book after book) makes its SGD learn one class at a time and forget the
    others (on 18,000 Gutenberg passages we measured 1.8 % P@1 against 12.0 % shuffled). So the lines are shuffled once with
    ``rng``, as fastText's own data scripts do with ``shuf``."""
    lines = []
    gold = split.gold_sets()
    for labels, words in zip(gold, tokens):
        lines.append(" ".join(f"__label__{label}" for label in labels.tolist()) + " " + _word_text(words))
    if rng is not None:
        lines = [lines[i] for i in rng.permutation(len(lines))]
    return lines


def _doc_tokens(texts: Any) -> list[np.ndarray]:
    return [texts.values[a:b] for a, b in zip(texts.offsets[:-1], texts.offsets[1:])]


def run_fasttext(train_lines: list[str], test_texts: list[str], test: EncodedSplit, loss: str, dim: int,
                 lr: float, epochs: int, ngrams: int, seed: int, workdir: Path, threads: int = 1,
                 top_k: int = 1, model_size: bool = False) -> dict[str, Any]:
    """Train and test fastText (``fasttext-wheel``) on ``threads`` threads; times measured like ours.

    ``top_k > 1``: the test time covers the top ``top_k`` labels of each example, returned as
    ``top_labels`` (one int array per example, best first). ``model_size``: ``model_bytes``, the
    bytes of the model's float32 arrays (input embeddings of words and hashed n-gram buckets, and
    output vectors), about the size of its saved ``.bin`` file without writing it."""
    import fasttext

    path = workdir / "train.txt"
    if not path.exists():  # atomic: a half-written file here would be reused by the next learning rate
        atomic_write(path, "\n".join(train_lines) + "\n")
    start = time.perf_counter()
    model = fasttext.train_supervised(input=str(path), dim=dim, lr=lr, epoch=epochs, loss=loss, thread=threads,
                                      minCount=1, wordNgrams=ngrams, bucket=2_000_000 if ngrams > 1 else 0,
                                      seed=seed, verbose=0)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    labels, _ = model.predict(test_texts, k=top_k)  # under numpy 2 predict needs a list
    test_seconds = time.perf_counter() - start
    predictions = np.array([int(row[0][len("__label__"):]) if row else -1 for row in labels], dtype=np.int64)
    out: dict[str, Any] = _precision_recall(predictions, test)
    out.update(train_seconds=train_seconds, test_seconds=test_seconds)
    if top_k > 1:
        out["top_labels"] = [np.array([int(x[len("__label__"):]) for x in row], dtype=np.int64) for row in labels]
    if model_size:
        rows = len(model.get_words()) + (2_000_000 if ngrams > 1 else 0)
        out["model_bytes"] = 4 * model.get_dimension() * (rows + len(model.get_labels()))
    return out


def run_vw(train: EncodedSplit, train_tokens: Sequence[np.ndarray], test: EncodedSplit,
           test_tokens: Sequence[np.ndarray], lr: float, epochs: int, seed: int) -> dict[str, float]:
    """Vowpal Wabbit ``--log_multi K`` (labels 1..K), ``epochs`` online passes, one label sampled
    per example and pass as for the other models; features are the word ids."""
    import vowpalwabbit

    rng = np.random.default_rng(seed)
    feats_train = [_word_text(words) for words in train_tokens]
    feats_test = ["| " + _word_text(words) for words in test_tokens]
    workspace = vowpalwabbit.Workspace(f"--log_multi {train.num_labels} -b 24 -l {lr} --random_seed {seed} --quiet")
    start = time.perf_counter()
    for _ in range(epochs):
        targets = train.sample_labels(rng)
        for row in rng.permutation(len(train)):
            workspace.learn(f"{targets[row] + 1} | {feats_train[row]}")
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    predictions = np.array([workspace.predict(line) for line in feats_test], dtype=np.int64) - 1
    test_seconds = time.perf_counter() - start
    workspace.finish()
    out = _precision_recall(predictions, test)
    out.update(train_seconds=train_seconds, test_seconds=test_seconds)
    return out


def peer_available(peer: str) -> str | None:
    """None if ``peer`` can run here, else why not."""
    module = "fasttext" if peer.startswith("fasttext") else "vowpalwabbit"
    try:
        __import__(module)
    except ImportError as exc:
        package = "fasttext-wheel" if module == "fasttext" else "vowpalwabbit"
        return f"{module} is not installed ({exc}); pip install {package} (extra 'baselines')"
    return None


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
