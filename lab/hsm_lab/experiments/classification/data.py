"""The classification data: a stand-in by name or a YFCC100M-style fastText file, a seeded
subset of its rows, and both splits encoded in the model's ids (:class:`EncodedSplit`)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hsm.classifiers.fast_classifier import unique_label_sets
from hsm.text_models import WordVocabulary, hashed_bigrams

from hsm_lab.experiments.classification.presets import STAND_INS

__all__ = ["EncodedSplit", "encode_data", "load_classification_data"]


@dataclass
class EncodedSplit:
    """One split in model ids: ragged documents (``values``/``offsets``) and ragged labels."""

    values: np.ndarray
    offsets: np.ndarray
    label_values: np.ndarray
    label_offsets: np.ndarray
    num_labels: int
    tokens: list[list[int]] | None = field(default=None, repr=False)  #: data-set token ids per doc (peers)

    def __post_init__(self) -> None:
        # a gold set is a set: a repeated label would be drawn twice as often in training and
        # count twice among the gold labels (lower recall for the same predictions)
        self.label_values, self.label_offsets = unique_label_sets(np.asarray(self.label_values, dtype=np.int64),
                                                                  np.asarray(self.label_offsets, dtype=np.int64))

    def __len__(self) -> int:
        return self.offsets.size - 1

    def label_lengths(self) -> np.ndarray:
        return np.diff(self.label_offsets)

    def sample_labels(self, rng: np.random.Generator) -> np.ndarray:
        """One label per example, uniformly among its labels (fastText's softmax/hs training)."""
        lengths = self.label_lengths()
        pick = self.label_offsets[:-1] + np.floor(rng.random(lengths.size) * lengths).astype(np.int64)
        return self.label_values[pick].astype(np.int64)

    def gold_sets(self) -> list[np.ndarray]:
        return [self.label_values[a:b] for a, b in zip(self.label_offsets[:-1], self.label_offsets[1:])]


def _ragged_labels(labels: Any) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(labels, "offsets"):  # hsm_lab.data.Ragged (multi-label)
        return np.asarray(labels.values, dtype=np.int64), np.asarray(labels.offsets, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    return labels, np.arange(labels.size + 1, dtype=np.int64)


def _label_counts(split: EncodedSplit) -> np.ndarray:
    return np.bincount(split.label_values, minlength=split.num_labels).astype(np.float64)


def encode_data(data: Any, ngrams: int = 1, buckets: int = 2_000_000, min_count: int = 1
                ) -> tuple[WordVocabulary, EncodedSplit, EncodedSplit]:
    """Build the model vocabulary on ``data``'s training split and encode both splits.

    ``data`` is a :class:`hsm_lab.data.TextClassificationData` (its ``test_*`` is whatever split is
    evaluated: the real test split, or the validation part of ``validation_split``)."""
    train_texts, test_texts = data.train_texts, data.test_texts
    vocab = WordVocabulary(train_texts.values, len(train_texts.vocab), min_count=min_count)
    splits = []
    for texts, labels in ((train_texts, data.train_labels), (test_texts, data.test_labels)):
        values, offsets = vocab.encode(texts.values, texts.offsets)
        if ngrams == 2:
            values, offsets = hashed_bigrams(values, offsets, len(vocab), buckets)
        label_values, label_offsets = _ragged_labels(labels)
        splits.append(EncodedSplit(values, offsets, label_values, label_offsets, data.num_labels))
    return vocab, splits[0], splits[1]


def _subset_rows(data: Any, limit: int | None, split: str, seed: int) -> Any:
    """``data`` with at most ``limit`` rows of ``split`` (a seeded random subset, order kept)."""
    texts = getattr(data, f"{split}_texts")
    if limit is None or limit >= len(texts):
        return data
    rows = np.sort(np.random.default_rng(seed).permutation(len(texts))[:limit])
    labels = getattr(data, f"{split}_labels")
    new_labels = labels.subset(rows) if hasattr(labels, "subset") else np.asarray(labels)[rows]
    return replace(data, **{f"{split}_texts": texts.subset(rows), f"{split}_labels": new_labels})


def load_classification_data(data: str, test: str | None = None, max_books: int | None = None,
                             min_label_count: int = 100) -> Any:
    """A stand-in by name (``cooking``, ``gutenberg-books``) or a fastText-format file (YFCC100M).

    For a file, ``test`` names the test file (else the last 10 % of the lines are the test set),
    and labels seen fewer than ``min_label_count`` times are dropped (ICML §7.1: 100)."""
    from hsm_lab.data import load_fasttext_file, load_text_classification

    if data in STAND_INS:
        options = {"max_books": max_books} if data == "gutenberg-books" and max_books else {}
        return load_text_classification(data, **options)
    path = Path(data)
    if not path.is_file():
        raise ValueError(f"data must be one of {STAND_INS} or an existing fastText file, got {data!r}")
    if test is None:
        with _open_count(path) as count:
            lines = count
        return load_fasttext_file(path, test_last=max(1, lines // 10), min_label_count=min_label_count)
    return load_fasttext_file(path, test, min_label_count=min_label_count)


class _open_count:
    """Count the lines of a (possibly compressed) file: ``with _open_count(p) as n``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> int:
        from hsm_lab.data.fetch import open_compressed

        with open_compressed(self.path) as handle:
            return sum(1 for _ in handle)

    def __exit__(self, *exc: Any) -> None:
        return None


def _data_slug(data: str) -> str:
    """The data set's name in file names: the stand-in's, or the file's stem (``train.txt.gz`` -> ``train``)."""
    return data if data in STAND_INS else Path(data).name.split(".")[0]


def load_table_data(config: Any) -> Any:
    """The data set a table run uses: ``config.data`` loaded (:func:`load_classification_data`) and
    its train and test splits cut to ``config.train_limit`` / ``config.test_limit`` rows (seeded by
    ``config.seed``, as every table run since the first)."""
    data = load_classification_data(config.data, config.test, config.max_books, config.min_label_count)
    data = _subset_rows(data, config.train_limit, "train", config.seed)
    return _subset_rows(data, config.test_limit, "test", config.seed + 1)
