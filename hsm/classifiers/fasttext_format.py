"""fastText's text format, read as fastText reads it, for :class:`hsm.FastBowClassifier`'s file
methods (``fit_file``, ``test_file``, ``predict_file``) and the ``python -m hsm supervised / test
/ predict`` command line.

A line is one example: whitespace-separated tokens, those starting with the label prefix
(``__label__``) its labels, the others its words::

    __label__baking __label__bread How do I get a crispier crust?

As in fastText (``src/dictionary.cc``): tokens are split on ASCII whitespace only and never
lower-cased; every line ends with the end-of-sentence word ``</s>``, which is part of the
document; the dictionary keeps the words seen at least ``min_count`` times in the training file
(unknown words are dropped when reading a test file, unknown labels too); with ``word_ngrams`` n
> 1 each run of 2..n consecutive words (unknown ones included) adds the id of a hash bucket,
fastText's own hash (32-bit FNV-1a of the bytes, then ``h = h * 116049371 + h_next``) modulo
``bucket``. Lines without a (known) label are skipped for training and testing and predicted
like the others.

Two differences from fastText. A UTF-8 byte-order mark at the very start of a file (Windows
editors write one) is skipped, as Python's ``utf-8-sig`` does: fastText reads it as part of the
first token, so the first line's label becomes the unknown word ``\ufeff__label__x``. And, for
memory: fastText allocates all ``bucket`` rows (2 million by default, 800 MB
at d = 100) and leaves the ones no training n-gram hashes to at their random initialisation; here
only the buckets that occur in the training file get a row, so a test n-gram whose bucket never
occurred in training is dropped instead of adding its untrained random row.
"""
from __future__ import annotations

import functools
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = ["EOS", "EncodedLines", "FastTextDictionary", "SettingError", "fasttext_hash", "read_lines"]


class SettingError(ValueError):
    """A setting whose value cannot work with these data (``min_count`` that keeps no word, a
    ``dim`` too large for the memory). The message names the setting; :meth:`named` gives it
    with another name, so that the command line can name its own option (``-minCount``)."""

    def __init__(self, setting: str, template: str) -> None:
        self.setting, self.template = setting, template
        super().__init__(template.format(name=setting))

    def named(self, name: str) -> str:
        """The message with the setting called ``name``."""
        return self.template.format(name=name)


EOS = "</s>"  #: fastText's end-of-sentence word, the last word of every line
_SPLIT = re.compile(r"[ \t\n\v\f\r\0]+")  # fastText's readWord: these six characters and NUL
_NGRAM_HASH = 116049371  # fastText's Dictionary::addWordNgrams
_MASK64 = (1 << 64) - 1


@functools.lru_cache(maxsize=1 << 18)
def fasttext_hash(token: str) -> int:
    """fastText's ``Dictionary::hash``: 32-bit FNV-1a over the UTF-8 bytes, each byte read as a
    *signed* char (so bytes above 127 are sign-extended, as fastText's ``int8_t`` cast does)."""
    h = 2166136261
    for byte in token.encode("utf-8", "surrogateescape"):
        h = ((h ^ ((byte - 256) & 0xFFFFFFFF if byte > 127 else byte)) * 16777619) & 0xFFFFFFFF
    return h


def read_lines(path: str | Path) -> list[str]:
    """The lines of a text file (``"-"``: standard input), without their newlines; a last line
    without a newline counts, the empty string after a final newline does not. A leading UTF-8
    byte-order mark is dropped (``utf-8-sig``): it is a marker of the encoding, not text, and
    left in place it would glue itself to the first token. Undecodable bytes are kept
    (``surrogateescape``), so labels print back as they were written."""
    if str(path) == "-":
        data = sys.stdin.buffer.read()
    else:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        data = file.read_bytes()
    lines = data.decode("utf-8-sig", "surrogateescape").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _tokens(line: str) -> list[str]:
    return [token for token in _SPLIT.split(line) if token]


class EncodedLines(NamedTuple):
    """Lines as ragged id arrays: document ``i``'s ids are ``values[offsets[i]:offsets[i+1]]``
    (word ids, then n-gram ids), its labels ``label_values[label_offsets[i]:label_offsets[i+1]]``."""

    values: np.ndarray
    offsets: np.ndarray
    label_values: np.ndarray
    label_offsets: np.ndarray

    @property
    def labelled(self) -> np.ndarray:
        """Rows with at least one (known) label: those fastText trains and tests on."""
        return np.flatnonzero(np.diff(self.label_offsets) > 0)

    def subset(self, rows: np.ndarray) -> "EncodedLines":
        values, offsets = _ragged_rows(self.values, self.offsets, rows)
        label_values, label_offsets = _ragged_rows(self.label_values, self.label_offsets, rows)
        return EncodedLines(values, offsets, label_values, label_offsets)

    @property
    def docs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets)``, what :meth:`hsm.FastBowClassifier.fit` and ``predict`` take."""
        return self.values, self.offsets

    @property
    def labels(self) -> "_Ragged":
        """The label sets, in the form :meth:`hsm.FastBowClassifier.fit` and ``test`` take."""
        return _Ragged(self.label_values, self.label_offsets)


class _Ragged(NamedTuple):
    values: np.ndarray
    offsets: np.ndarray


def _ragged_rows(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows, dtype=np.int64)
    lengths = offsets[rows + 1] - offsets[rows]
    new_offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    take = np.repeat(offsets[rows] - new_offsets[:-1], lengths) + np.arange(int(new_offsets[-1]))
    return np.ascontiguousarray(values[take], dtype=np.int64), new_offsets


class FastTextDictionary:
    """fastText's dictionary of a training file: the words (count >= ``min_count``, most frequent
    first, ``</s>`` among them), the labels (as written, prefix included, most frequent first), and
    the hash buckets of the word n-grams that occur (``word_ngrams`` > 1).

    Model ids: word ``i`` is id ``i``; the ``j``-th occurring bucket is id ``len(words) + j``.
    Build one with :meth:`build`; :meth:`encode` turns lines into :class:`EncodedLines`."""

    def __init__(self, words: Sequence[str], labels: Sequence[str], label_counts: Sequence[int], *,
                 word_ngrams: int = 1, bucket: int = 2_000_000, min_count: int = 1, label_prefix: str = "__label__",
                 buckets: Sequence[int] = (), tokens: int = 0) -> None:
        self.words = list(words)
        self.labels = list(labels)
        self.label_counts = np.asarray(label_counts, dtype=np.int64)
        self.word_ngrams, self.bucket, self.min_count = int(word_ngrams), int(bucket), int(min_count)
        self.label_prefix = str(label_prefix)
        self.buckets = np.asarray(buckets, dtype=np.int64)  # sorted raw bucket ids that got a row
        self.tokens = int(tokens)  #: tokens read from the training file (fastText's "Read ... words")
        self._word_index = {word: i for i, word in enumerate(self.words)}
        self._label_index = {label: i for i, label in enumerate(self.labels)}

    def check_new_labels(self, labels: Sequence[str]) -> None:
        """Refuse, in one line, new label names (prefix included) that a fastText file cannot hold
        or that clash: TypeError for a name that is not a string; ValueError for a name with
        whitespace or NUL (a file would split it into several tokens, so it would print broken and
        never read back), a name that is the prefix alone, the same name given twice, or a name
        already in the dictionary."""
        seen: set[str] = set()
        for label in labels:
            if not isinstance(label, str):
                raise TypeError(f"label names must be strings, got {type(label).__name__} {label!r}")
            if _SPLIT.search(label):
                raise ValueError(f"label name {label!r} holds whitespace or NUL, which a fastText file splits a "
                                 f"line on: write it without (e.g. {'_'.join(_tokens(label))!r})")
            if label == self.label_prefix:
                raise ValueError(f"label name {label!r} is the prefix alone: give the label a name after it")
            if label in seen:
                raise ValueError(f"label {label} is given twice: each new label needs its own name")
            if label in self._label_index:
                raise ValueError(f"label {label} is already in the model: new labels need new names")
            seen.add(label)

    def add_labels(self, labels: Sequence[str], counts: Sequence[int]) -> None:
        """Append labels (prefix included) with their example counts: ids ``num_labels, ...``
        (:meth:`hsm.FastBowClassifier.add_labels`). Raises as :meth:`check_new_labels`, before
        any change."""
        self.check_new_labels(labels)
        for label in labels:
            self._label_index[label] = len(self.labels)
            self.labels.append(label)
        self.label_counts = np.concatenate([self.label_counts, np.asarray(counts, dtype=np.int64)])

    def unknown_labels(self, lines: Sequence[str]) -> dict[str, list[int]]:
        """The labels of ``lines`` this dictionary does not know, each with the rows of the lines
        that carry it (in order of first appearance; a label written twice on a line counts once)."""
        prefix, known = self.label_prefix, self._label_index
        rows_of: dict[str, list[int]] = {}
        for row, line in enumerate(lines):
            for token in dict.fromkeys(t for t in _tokens(line) if t.startswith(prefix) and t not in known):
                rows_of.setdefault(token, []).append(row)
        return rows_of

    @property
    def num_words(self) -> int:
        return len(self.words)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def num_ids(self) -> int:
        """Rows of the embedding table: the words, then the n-gram buckets."""
        return len(self.words) + int(self.buckets.size)

    @classmethod
    def build(cls, lines: Sequence[str], word_ngrams: int = 1, bucket: int = 2_000_000, min_count: int = 1,
              label_prefix: str = "__label__") -> "FastTextDictionary":
        """The dictionary of a training file's ``lines`` (fastText's ``Dictionary::readFromFile``);
        ValueError when no line has a label or fewer than 2 labels occur, and
        :class:`hsm.classifiers.fast_classifier.SettingError` when ``min_count`` leaves no word."""
        words, labels, tokens = Counter(), Counter(), 0
        for line in lines:
            pieces = _tokens(line)
            tokens += len(pieces) + 1
            for token in pieces:
                (labels if token.startswith(label_prefix) else words)[token] += 1
            words[EOS] += 1
        if not labels:
            raise ValueError(f"no line has a label (a token starting with {label_prefix!r}, e.g. "
                             f"'{label_prefix}baking How do I ...'): is this a fastText file?")
        if len(labels) < 2:
            raise ValueError(f"the file has one label ({next(iter(labels))}); a classifier needs at least 2")
        # most frequent first, ties in order of first appearance (Counter keeps it; sorted is stable)
        kept_words = [w for w, c in sorted(words.items(), key=lambda item: -item[1]) if c >= min_count]
        if not kept_words:  # even </s>, on every line, is rarer: no example would have an input

            raise SettingError("min_count", f"{{name}} {min_count} leaves no word (the most frequent, {EOS}, "
                                            f"occurs {words[EOS]} times); lower {{name}}")
        kept_labels = sorted(labels.items(), key=lambda item: -item[1])
        dictionary = cls(kept_words, [label for label, _ in kept_labels], [c for _, c in kept_labels],
                         word_ngrams=word_ngrams, bucket=bucket, min_count=min_count, label_prefix=label_prefix,
                         tokens=tokens)
        if word_ngrams > 1:
            seen: set[int] = set()
            for line in lines:
                seen.update(dictionary._line_buckets(_tokens(line)))
            dictionary.buckets = np.array(sorted(seen), dtype=np.int64)
        return dictionary

    def _line_buckets(self, tokens: list[str]) -> list[int]:
        """Raw bucket ids of the line's word n-grams (fastText's ``addWordNgrams``: the hashes are
        int32 values widened to uint64, so negative ones are sign-extended)."""
        hashes = []
        for token in tokens:
            if not token.startswith(self.label_prefix):
                h = fasttext_hash(token)
                hashes.append((h - (1 << 32) if h >= 1 << 31 else h) & _MASK64)
        hashes.append(self._eos_hash)
        out = []
        for i in range(len(hashes)):
            h = hashes[i]
            for j in range(i + 1, min(len(hashes), i + self.word_ngrams)):
                h = (h * _NGRAM_HASH + hashes[j]) & _MASK64
                out.append(h % self.bucket)
        return out

    @property
    def _eos_hash(self) -> int:
        h = fasttext_hash(EOS)
        return (h - (1 << 32) if h >= 1 << 31 else h) & _MASK64

    def encode(self, lines: Sequence[str]) -> EncodedLines:
        """Every line's word ids (known words, then ``</s>``), n-gram ids (buckets with a row)
        and known labels (fastText's ``Dictionary::getLine``)."""
        values: list[int] = []
        offsets = [0]
        label_values: list[int] = []
        label_offsets = [0]
        words, labels, prefix = self._word_index, self._label_index, self.label_prefix
        first_bucket = len(self.words)
        for line in lines:
            tokens = _tokens(line)
            for token in tokens:
                if token.startswith(prefix):
                    if token in labels:
                        label_values.append(labels[token])
                elif token in words:
                    values.append(words[token])
            if EOS in words:
                values.append(words[EOS])
            if self.word_ngrams > 1 and self.buckets.size:
                raw = np.asarray(self._line_buckets(tokens), dtype=np.int64)
                where = np.searchsorted(self.buckets, raw)
                found = (where < self.buckets.size) & (self.buckets[np.minimum(where, self.buckets.size - 1)] == raw)
                values.extend((first_bucket + where[found]).tolist())
            offsets.append(len(values))
            label_offsets.append(len(label_values))
        return EncodedLines(np.asarray(values, dtype=np.int64), np.asarray(offsets, dtype=np.int64),
                            np.asarray(label_values, dtype=np.int64), np.asarray(label_offsets, dtype=np.int64))

    def state_dict(self) -> dict[str, Any]:
        """Plain lists, numbers and tensors (``torch.load(weights_only=True)`` reads them back)."""
        return {"words": self.words, "labels": self.labels, "label_counts": torch.from_numpy(self.label_counts),
                "word_ngrams": self.word_ngrams, "bucket": self.bucket, "min_count": self.min_count,
                "label_prefix": self.label_prefix, "buckets": torch.from_numpy(self.buckets), "tokens": self.tokens}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "FastTextDictionary":
        return cls(state["words"], state["labels"], state["label_counts"].numpy(), word_ngrams=state["word_ngrams"],
                   bucket=state["bucket"], min_count=state["min_count"], label_prefix=state["label_prefix"],
                   buckets=state["buckets"].numpy(), tokens=state["tokens"])
