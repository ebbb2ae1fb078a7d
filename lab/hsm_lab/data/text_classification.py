"""Text classification data sets: tag prediction stand-ins for YFCC100M and the taxonomy benchmarks of Schuurmans & Frasincar.

Encoding (our choice, for memory): texts are a :class:`TokenizedTexts`, a read-only sequence whose item ``i`` is
the token list of document ``i`` (``texts[i] -> list[str]``), stored as one int32 array of ids into ``vocab`` plus
offsets, so 500k Gutenberg passages or 91M YFCC captions cost 4 bytes a token instead of a Python string each.
``texts.ids(i)`` gives the ids without decoding. ``vocab`` is only an encoding (every type of train and test); a
model builds its own vocabulary from the training split.

Labels: single-label sets hold an int64 array (``labels[i]`` is a label id); multi-label sets (``cooking``,
fastText/YFCC files) hold a :class:`Ragged` sequence whose item ``i`` is the list of label ids of example ``i``.
``label_names[j]`` names label id ``j``. ``taxonomy`` maps each category to its class names (two levels):
from ``cachopo/taxonomies.json`` for 20NG/R8/R52, from the ``COARSE:fine`` label prefix for TREC fine, from
the author folder for ``gutenberg-books``; ``None`` where there is none. Every label must appear in the
taxonomy and every taxonomy class must be a label: a mismatch raises :class:`UnknownLabelError`.
"""
from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hsm_lab.data.errors import CorruptArchiveError, EmptyCorpusError, UnknownLabelError
from hsm_lab.data.fetch import _DECODE_ERRORS, _corrupt, fetch_file, open_compressed, read_tar_member, read_text
from hsm_lab.data.registry import SOURCES, dataset

_WORD_RE = re.compile(r"\w+|[^\w\s]")

#: A tokenizer maps raw text to its tokens.
Tokenizer = Callable[[str], list[str]]

#: ``gutenberg-books``: tokens per passage, and every ``TEST_EVERY``-th passage of a book goes to test.
PASSAGE_TOKENS = 100
TEST_EVERY = 5


def tokenize_words(text: str) -> list[str]:
    """Lower-cased ``\\w+|[^\\w\\s]`` tokens (punctuation split off, as fastText's cooking tutorial does with sed)."""
    return _WORD_RE.findall(text.lower())


# ---------------------------------------------------------------------------------------------- ragged storage


class Ragged(Sequence):
    """A read-only sequence of int lists stored as ``values`` (int32/int64) and ``offsets`` (``len + 1``)."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        values = np.asarray(values)
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != values.size:
            raise ValueError("offsets must start at 0 and end at len(values)")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must be non-decreasing")
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_lists(cls, lists: Iterable[Iterable[int]], dtype=np.int32) -> Ragged:
        values = array("q")
        offsets = array("q", [0])
        for row in lists:
            values.extend(row)
            offsets.append(len(values))
        return cls(np.frombuffer(values, dtype=np.int64).astype(dtype), np.frombuffer(offsets, dtype=np.int64))

    def __len__(self) -> int:
        return self.offsets.size - 1

    def row(self, i: int) -> np.ndarray:
        """Item ``i`` as an array view."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} rows")
        i %= n
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self.subset(np.arange(len(self))[i])
        return self.row(int(i)).tolist()

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def subset(self, indices: Sequence[int] | np.ndarray) -> Ragged:
        """The rows at ``indices``, in that order, as a new compact object."""
        indices = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths()[indices]
        offsets = np.zeros(indices.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[indices]
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return self._like(self.values[gather], offsets)

    def _like(self, values: np.ndarray, offsets: np.ndarray) -> Ragged:
        return Ragged(values, offsets)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} rows, {self.values.size} values)"


class TokenizedTexts(Ragged):
    """Documents as token ids into ``vocab``; ``texts[i]`` decodes document ``i`` to its list of tokens."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray, vocab: list[str]):
        super().__init__(values, offsets)
        self.vocab = vocab

    def ids(self, i: int) -> np.ndarray:
        """Token ids of document ``i`` (no decoding)."""
        return self.row(i)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self.subset(np.arange(len(self))[i])
        return [self.vocab[t] for t in self.row(int(i))]

    def _like(self, values: np.ndarray, offsets: np.ndarray) -> TokenizedTexts:
        return TokenizedTexts(values, offsets, self.vocab)

    def num_tokens(self) -> int:
        return int(self.values.size)


class _Encoder:
    """Builds one shared vocabulary while several :class:`TokenizedTexts` are encoded."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.vocab: list[str] = []

    def encode(self, documents: Iterable[list[str]]) -> TokenizedTexts:
        values = array("i")
        offsets = array("q", [0])
        index, vocab = self.index, self.vocab
        for tokens in documents:
            for token in tokens:
                if token not in index:
                    index[token] = len(vocab)
                    vocab.append(token)
            values.extend(map(index.__getitem__, tokens))
            offsets.append(len(values))
        return TokenizedTexts(np.frombuffer(values, dtype=np.int32), np.frombuffer(offsets, dtype=np.int64), vocab)


# ------------------------------------------------------------------------------------------------- the data set


@dataclass
class TextClassificationData:
    """A text classification data set with train and test splits (see the module docstring for the encoding)."""

    name: str
    train_texts: TokenizedTexts
    train_labels: np.ndarray | Ragged
    test_texts: TokenizedTexts
    test_labels: np.ndarray | Ragged
    label_names: list[str]
    taxonomy: dict[str, list[str]] | None = None
    multilabel: bool = False
    description: str = ""
    stats: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            texts, labels = getattr(self, f"{split}_texts"), getattr(self, f"{split}_labels")
            if len(texts) != len(labels):
                raise ValueError(f"{self.name}: {len(texts)} {split} texts but {len(labels)} label rows")
            values = labels.values if isinstance(labels, Ragged) else np.asarray(labels)
            if values.size and (values.min() < 0 or values.max() >= len(self.label_names)):
                raise ValueError(f"{self.name}: {split} label ids outside 0..{len(self.label_names) - 1}")
        if len(self.train_texts) == 0:
            raise EmptyCorpusError(f"{self.name}: no training examples")
        if self.taxonomy is not None:
            check_taxonomy(self.label_names, self.taxonomy, self.name)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def vocab(self) -> list[str]:
        return self.train_texts.vocab

    def category_of(self) -> dict[str, str]:
        """Class name -> category name (from ``taxonomy``)."""
        if self.taxonomy is None:
            raise ValueError(f"{self.name} has no taxonomy")
        return {label: category for category, labels in self.taxonomy.items() for label in labels}

    def cross_validation_splits(self, folds: int = 4, seed: int = 0) -> list[TextClassificationData]:
        """``folds`` data sets for k-fold cross-validation on the training split: the k-th holds fold
        k out as its ``test_*`` and trains on the others. Single-label: stratified, each class's
        examples shuffled (seeded) and dealt to the folds in turn, so every fold has
        ``floor(n_c / folds)`` or one more of class ``c``. Multi-label: a seeded shuffle cut into
        ``folds`` near-equal parts. ValueError when ``folds`` is below 2 or above the number of
        training examples."""
        n = len(self.train_texts)
        if not 2 <= folds <= n:
            raise ValueError(f"folds must be between 2 and the {n} training examples, got {folds}")
        rng = np.random.default_rng(seed)
        fold_of = np.empty(n, dtype=np.int64)
        if self.multilabel:
            fold_of[rng.permutation(n)] = np.arange(n) % folds
        else:
            labels = np.asarray(self.train_labels)
            start = 0  # deal each class from where the last one stopped, so that the folds stay level
            for label in np.unique(labels):
                members = rng.permutation(np.flatnonzero(labels == label))
                fold_of[members] = (start + np.arange(members.size)) % folds
                start = (start + members.size) % folds
        return [self._holding_out(np.flatnonzero(fold_of == k), f"fold{k}",
                                  {"cv_folds": folds, "cv_fold": k, "cv_seed": seed}) for k in range(folds)]

    def _holding_out(self, held: np.ndarray, suffix: str, stats: dict[str, Any]) -> TextClassificationData:
        """This data set with the training examples ``held`` (sorted ids) as its ``test_*`` and the
        others as its training split."""
        kept = np.setdiff1d(np.arange(len(self.train_texts)), held)
        return replace(
            self,
            name=f"{self.name}-{suffix}",
            train_texts=self.train_texts.subset(kept),
            train_labels=_take_labels(self.train_labels, kept),
            test_texts=self.train_texts.subset(held),
            test_labels=_take_labels(self.train_labels, held),
            stats={**self.stats, **stats},
        )

    def validation_split(self, fraction: float = 0.1, seed: int = 0) -> TextClassificationData:
        """Carve a validation set out of train: returns a data set whose ``test_*`` is the held-out part.

        Single-label: stratified, ``floor(fraction * n_c)`` examples of each class ``c`` are held out (so a class
        with few training examples keeps them all). Multi-label: a seeded random ``round(fraction * n)``.
        """
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction must be in (0, 1), got {fraction}")
        rng = np.random.default_rng(seed)
        n = len(self.train_texts)
        if self.multilabel:
            held = rng.permutation(n)[: int(round(fraction * n))]
        else:
            labels = np.asarray(self.train_labels)
            held_parts = []
            for label in np.unique(labels):
                members = np.flatnonzero(labels == label)
                held_parts.append(rng.permutation(members)[: int(np.floor(fraction * members.size))])
            held = np.concatenate(held_parts) if held_parts else np.zeros(0, dtype=np.int64)
        return self._holding_out(np.sort(held), "valid", {"validation_fraction": fraction, "validation_seed": seed})

    def summary(self) -> dict[str, int]:
        """Counts for ``python -m hsm data info``."""
        out = {
            "train_examples": len(self.train_texts),
            "test_examples": len(self.test_texts),
            "labels": self.num_labels,
            "train_tokens": self.train_texts.num_tokens(),
            "test_tokens": self.test_texts.num_tokens(),
        }
        if self.taxonomy is not None:
            out["categories"] = len(self.taxonomy)
        if self.multilabel:
            out["label_assignments"] = int(self.train_labels.values.size + self.test_labels.values.size)
        return out


def _take_labels(labels: np.ndarray | Ragged, indices: np.ndarray) -> np.ndarray | Ragged:
    return labels.subset(indices) if isinstance(labels, Ragged) else np.asarray(labels)[indices]


def check_taxonomy(label_names: Sequence[str], taxonomy: dict[str, list[str]], name: str = "data set") -> None:
    """Raise :class:`UnknownLabelError` unless every label is in exactly one category and vice versa."""
    seen: dict[str, str] = {}
    for category, classes in taxonomy.items():
        for cls in classes:
            if cls in seen:
                raise UnknownLabelError(f"{name}: class {cls!r} is in two taxonomy categories, "
                                        f"{seen[cls]!r} and {category!r}")
            seen[cls] = category
    unknown = [label for label in label_names if label not in seen]
    if unknown:
        raise UnknownLabelError(
            f"{name}: label(s) {unknown[:5]} are not in the taxonomy (categories {sorted(taxonomy)}). "
            f"Fix: correct the label names in the data file or add them to the taxonomy (cachopo/taxonomies.json)."
        )
    absent = sorted(set(seen) - set(label_names))
    if absent:
        raise UnknownLabelError(f"{name}: taxonomy class(es) {absent[:5]} never occur as a label in the data")


def _single_label(name: str, train: list[tuple[str, list[str]]], test: list[tuple[str, list[str]]],
                  taxonomy: dict[str, list[str]] | None, description: str) -> TextClassificationData:
    label_names = sorted({label for label, _ in train} | {label for label, _ in test})
    label_id = {label: i for i, label in enumerate(label_names)}
    encoder = _Encoder()
    return TextClassificationData(
        name=name,
        train_texts=encoder.encode(tokens for _, tokens in train),
        train_labels=np.array([label_id[label] for label, _ in train], dtype=np.int64),
        test_texts=encoder.encode(tokens for _, tokens in test),
        test_labels=np.array([label_id[label] for label, _ in test], dtype=np.int64),
        label_names=label_names,
        taxonomy=taxonomy,
        description=description,
    )


# ------------------------------------------------------------------------------------------------------ loaders


def load_taxonomies() -> dict[str, object]:
    """``cachopo/taxonomies.json`` (category -> classes for ``20ng``, ``r8``, ``r52``)."""
    path = fetch_file(SOURCES["cachopo"].file("cachopo/taxonomies.json"))
    return json.loads(path.read_text(encoding="utf-8"))


def _load_cachopo(name: str) -> TextClassificationData:
    splits = {}
    for split in ("train", "test"):
        path = fetch_file(SOURCES["cachopo"].file(f"cachopo/{name}-{split}-all-terms.txt.xz"))
        rows = []
        for line_number, line in enumerate(read_text(path).split("\n"), 1):
            if not line:
                continue
            label, tab, text = line.partition("\t")
            if not tab or not label:
                raise CorruptArchiveError(f"{path}, line {line_number}: expected 'label<TAB>text', got {line[:80]!r}")
            rows.append((label, text.split()))
        if not rows:
            raise EmptyCorpusError(f"{path} holds no documents. Fix: fetch cachopo again.")
        splits[split] = rows
    taxonomy = load_taxonomies()[name]
    return _single_label(name, splits["train"], splits["test"], taxonomy, dataset(name).description)


def _load_trec(fine: bool) -> TextClassificationData:
    splits = {}
    for split, filename in (("train", "trec/train_5500.label"), ("test", "trec/TREC_10.label")):
        path = fetch_file(SOURCES["trec"].file(filename))
        rows = []
        # The files are Latin-1 (one question of the training file has a non-ASCII byte in some copies).
        for line_number, line in enumerate(read_text(path, encoding="latin-1").split("\n"), 1):
            line = line.strip()
            if not line:
                continue
            label, _, question = line.partition(" ")
            coarse, colon, _fine = label.partition(":")
            if not colon:
                raise CorruptArchiveError(f"{path}, line {line_number}: label {label!r} is not COARSE:fine")
            rows.append((label if fine else coarse, question.split()))
        if not rows:
            raise EmptyCorpusError(f"{path} holds no questions. Fix: fetch trec again.")
        splits[split] = rows
    taxonomy = None
    if fine:
        taxonomy = {}
        for label in sorted({label for label, _ in splits["train"] + splits["test"]}):
            taxonomy.setdefault(label.split(":", 1)[0], []).append(label)
    name = "trec-fine" if fine else "trec-coarse"
    return _single_label(name, splits["train"], splits["test"], taxonomy, dataset(name).description)


def parse_fasttext_line(line: str, tokenizer: Tokenizer | None = None) -> tuple[list[str], list[str]]:
    """``(labels, words)`` of one fastText line: the ``__label__`` prefixed words are labels, the rest text."""
    labels, words = [], []
    for piece in line.split():
        if piece.startswith("__label__"):
            labels.append(piece[len("__label__"):])
        else:
            words.append(piece)
    if tokenizer is not None:
        words = tokenizer(" ".join(words))
    return labels, words


def _iter_lines(path: Path) -> Iterator[str]:
    """Decoded lines of a (possibly compressed) text file, streamed; damage raises CorruptArchiveError."""
    if not path.is_file():
        raise FileNotFoundError(f"fastText file {path} does not exist")
    try:
        with open_compressed(path) as handle:
            for raw in handle:
                yield raw.decode("utf-8", errors="replace").rstrip("\n")
    except _DECODE_ERRORS as exc:
        raise _corrupt(path, exc) from exc


def _encode_fasttext(lines: Iterable[str], tokenizer: Tokenizer | None, encoder: _Encoder,
                     label_index: dict[str, int]) -> tuple[TokenizedTexts, Ragged, int]:
    """Encode fastText lines as they stream in (no per-line Python objects are kept: YFCC100M has 91M lines).

    Label ids are provisional (first-seen order, in ``label_index``); lines without a label are counted and
    skipped, as fastText's supervised mode skips them.
    """
    unlabelled = 0
    label_values, label_offsets = array("i"), array("q", [0])

    def documents() -> Iterator[list[str]]:
        nonlocal unlabelled
        for line in lines:
            if not line.strip():
                continue
            labels, words = parse_fasttext_line(line, tokenizer)
            if not labels:
                unlabelled += 1
                continue
            for label in labels:
                if label not in label_index:
                    label_index[label] = len(label_index)
            label_values.extend(label_index[label] for label in labels)
            label_offsets.append(len(label_values))
            yield words

    texts = encoder.encode(documents())
    labels = Ragged(np.frombuffer(label_values, dtype=np.int32), np.frombuffer(label_offsets, dtype=np.int64))
    return texts, labels, unlabelled


def _relabel(labels: Ragged, mapping: np.ndarray) -> tuple[Ragged, np.ndarray]:
    """Apply ``mapping`` (old id -> new id, -1 drops the label) to every row; also return which rows kept one."""
    new_values = mapping[labels.values] if labels.values.size else labels.values.astype(np.int64)
    keep = new_values >= 0
    row_of_value = np.repeat(np.arange(len(labels)), labels.lengths())
    kept_per_row = np.bincount(row_of_value[keep], minlength=len(labels))
    offsets = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(kept_per_row, out=offsets[1:])
    return Ragged(new_values[keep].astype(np.int64), offsets), kept_per_row > 0


def _multilabel_from_fasttext(
    name: str,
    train_lines: Iterable[str],
    test_lines: Iterable[str] | None,
    *,
    test_last: int | None,
    tokenizer: Tokenizer | None,
    min_label_count: int,
    description: str,
    source: str,
) -> TextClassificationData:
    encoder, label_index = _Encoder(), {}
    texts, labels, unlabelled = _encode_fasttext(train_lines, tokenizer, encoder, label_index)
    if len(texts) == 0:
        raise EmptyCorpusError(f"{source} holds no labelled lines ('__label__tag words ...'). Fix: check the file.")
    if test_lines is not None:
        test_texts, test_labels, test_unlabelled = _encode_fasttext(test_lines, tokenizer, encoder, label_index)
        unlabelled += test_unlabelled
    elif test_last is not None:
        if not 0 <= test_last < len(texts):
            raise ValueError(f"test_last={test_last} must be in [0, {len(texts)}) for {source}")
        cut = len(texts) - test_last
        train_rows, test_rows = np.arange(cut), np.arange(cut, len(texts))
        texts, labels, test_texts, test_labels = (
            texts.subset(train_rows), labels.subset(train_rows), texts.subset(test_rows), labels.subset(test_rows))
    else:
        test_texts, test_labels = texts.subset([]), labels.subset([])
    # Label ids in the order of the sorted names; labels seen fewer than min_label_count times (train and test
    # together) are dropped: ICML §7.1 keeps the YFCC100M tags with at least 100 occurrences.
    old_names = np.array(list(label_index), dtype=object)
    label_counts = np.bincount(np.concatenate([labels.values, test_labels.values]), minlength=len(old_names))
    kept_old = np.flatnonzero(label_counts >= min_label_count)
    kept_old = kept_old[np.argsort(old_names[kept_old])]
    mapping = np.full(len(old_names), -1, dtype=np.int64)
    mapping[kept_old] = np.arange(kept_old.size)
    stats: dict[str, object] = {"unlabelled_lines": unlabelled, "min_label_count": min_label_count,
                                "labels_dropped": int(len(old_names) - kept_old.size)}
    splits = {}
    for split, (split_texts, split_labels) in {"train": (texts, labels), "test": (test_texts, test_labels)}.items():
        relabelled, has_label = _relabel(split_labels, mapping)
        rows = np.flatnonzero(has_label)
        stats[f"{split}_examples_dropped"] = int(len(split_texts) - rows.size)
        splits[split] = (split_texts.subset(rows), relabelled.subset(rows))
    return TextClassificationData(
        name=name,
        train_texts=splits["train"][0],
        train_labels=splits["train"][1],
        test_texts=splits["test"][0],
        test_labels=splits["test"][1],
        label_names=[str(label) for label in old_names[kept_old]],
        multilabel=True,
        description=description,
        stats=stats,
    )


def load_fasttext_file(
    path: str | Path,
    test_path: str | Path | None = None,
    *,
    test_last: int | None = None,
    tokenizer: Tokenizer | None = None,
    min_label_count: int = 1,
    name: str | None = None,
) -> TextClassificationData:
    """A multi-label data set from fastText-format files (``__label__a __label__b words ...`` per line).

    This is the format the fastText YFCC100M scripts produce (ICML §7.1 follows that setting), so a user holding
    the real YFCC100M tag files can run the classification table on them. Files may be ``.gz``/``.xz``/``.bz2``
    and are read as a stream into the compact encoding. The test set is ``test_path`` if given, else the last
    ``test_last`` lines of ``path``, else empty (use :meth:`TextClassificationData.validation_split`). Words are
    whitespace tokens (the scripts already tokenized them) unless ``tokenizer`` is given. Lines without any label
    are skipped and counted in ``stats['unlabelled_lines']``. Labels occurring fewer than ``min_label_count`` times
    (train and test together) are dropped (paper: 100), and examples left without a label with them (counted in
    ``stats``).
    """
    path = Path(path)
    if not isinstance(min_label_count, int) or min_label_count < 1:
        raise ValueError(f"min_label_count must be a positive int, got {min_label_count!r}")
    return _multilabel_from_fasttext(
        name or path.name,
        _iter_lines(path),
        _iter_lines(Path(test_path)) if test_path is not None else None,
        test_last=test_last,
        tokenizer=tokenizer,
        min_label_count=min_label_count,
        description=f"fastText file {path}",
        source=str(path),
    )


def _load_cooking() -> TextClassificationData:
    path = fetch_file(SOURCES["cooking"].file("cooking/cooking.stackexchange.tar.gz"))
    text = read_tar_member(path, "cooking.stackexchange.txt").decode("utf-8")
    # fastText's supervised tutorial: `head -n 12404` train, `tail -n 3000` valid (our test). Titles are raw text:
    # lower-cased and punctuation split off, as the tutorial's preprocessing does.
    data = _multilabel_from_fasttext(
        "cooking", text.split("\n"), None, test_last=3000, tokenizer=tokenize_words, min_label_count=1,
        description=dataset("cooking").description, source=f"{path}: cooking.stackexchange.txt",
    )
    data.stats["examples"] = len(data.train_texts) + len(data.test_texts)
    return data


def _load_gutenberg_books(max_books: int | None = None, passage_tokens: int = PASSAGE_TOKENS,
                          test_every: int = TEST_EVERY) -> TextClassificationData:
    """Passage -> book: our construction, a stand-in for YFCC100M tag prediction (678 classes).

    Each book (boilerplate stripped, tokenized as in :mod:`hsm_lab.data.gutenberg`, ``<eos>`` removed) is cut into
    consecutive non-overlapping passages of ``passage_tokens`` tokens (a shorter tail is dropped). Passage ``j`` of
    a book goes to test if ``j % test_every == test_every - 1`` (20 % by default, spread evenly through the
    book), else to train; a book with fewer than ``test_every`` passages (one of the 678 has 3) gives its last
    passage to test, and a book with fewer than 2 passages is an error. The class is the book (``Author/Title``); the taxonomy is author -> books.
    """
    from hsm_lab.data.gutenberg import tokenized_books

    if passage_tokens < 1 or test_every < 2:
        raise ValueError("passage_tokens must be >= 1 and test_every >= 2")
    books = tokenized_books(max_books, progress=False)  # lower-cased, as the LM corpus
    order = sorted(range(len(books.books)), key=lambda i: books.books[i].path)
    label_names = [books.books[i].path.removesuffix(".txt") for i in order]
    parts: dict[str, tuple[list[np.ndarray], list[int]]] = {"train": ([], []), "test": ([], [])}
    for label, i in enumerate(order):
        ids = books.book_ids(i)
        ids = ids[ids != 0]  # drop <eos> (type id 0): a passage is a bag of words for the classifier
        n_passages = ids.size // passage_tokens
        if n_passages < 2:
            raise EmptyCorpusError(f"{books.books[i].path} gives {n_passages} passage(s) of {passage_tokens} "
                                   f"tokens: at least 2 are needed (one train, one test)")
        passages = ids[: n_passages * passage_tokens].reshape(n_passages, passage_tokens)
        is_test = (np.arange(n_passages) % test_every) == test_every - 1
        if n_passages < test_every:  # a very short book (one has 3 passages): its last passage is the test one
            is_test[-1] = True
        for split, mask in (("train", ~is_test), ("test", is_test)):
            parts[split][0].append(passages[mask].reshape(-1))
            parts[split][1].extend([label] * int(mask.sum()))
    taxonomy: dict[str, list[str]] = {}
    for label in label_names:
        taxonomy.setdefault(label.split("/", 1)[0], []).append(label)
    splits = {}
    for split, (chunks, labels) in parts.items():
        values = np.concatenate(chunks).astype(np.int32)
        offsets = np.arange(len(labels) + 1, dtype=np.int64) * passage_tokens
        splits[split] = (TokenizedTexts(values, offsets, books.types), np.array(labels, dtype=np.int64))
    return TextClassificationData(
        name="gutenberg-books" if max_books is None else f"gutenberg-books-{len(books.books)}",
        train_texts=splits["train"][0],
        train_labels=splits["train"][1],
        test_texts=splits["test"][0],
        test_labels=splits["test"][1],
        label_names=label_names,
        taxonomy=taxonomy,
        description=dataset("gutenberg-books").description,
        stats={"passage_tokens": passage_tokens, "test_every": test_every, "books": len(label_names),
               "authors": len(taxonomy)},
    )


def load_text_classification(name: str, **options) -> TextClassificationData:
    """Load classification data set ``name``: ``cooking``, ``gutenberg-books``, ``trec-coarse``, ``trec-fine``,
    ``20ng``, ``r8`` or ``r52`` (:class:`UnknownDatasetError` otherwise).

    ``gutenberg-books`` takes ``max_books`` (quick mode), ``passage_tokens`` and ``test_every``; the others take
    no options.
    """
    entry = dataset(name)
    if entry.kind != "classification":
        raise ValueError(f"{name!r} is a language-modelling corpus: use load_{name.replace('-', '_')}()")
    if name == "gutenberg-books":
        return _load_gutenberg_books(**options)
    if options:
        raise TypeError(f"{name} takes no options, got {sorted(options)}")
    if name == "cooking":
        return _load_cooking()
    if name in ("trec-coarse", "trec-fine"):
        return _load_trec(fine=name == "trec-fine")
    return _load_cachopo(name)
