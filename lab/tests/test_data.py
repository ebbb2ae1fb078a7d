"""Tests of ``hsm_lab.data``: counts on the real data (through the mirror), the Gutenberg pipeline on a slice, the
encodings, the CLI and every error path of acquisition and parsing (on files made here in ``tmp_path``).

The mirror tests need ``HSM_DATA_MIRROR`` (the Makefile sets ``../shared/data``) or a cache that already holds the
files; otherwise they are skipped with that reason. Every test runs with ``HSM_CACHE`` in a temporary folder.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import socket
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm_lab import config
from hsm_lab.data import (
    CacheWarning,
    ChecksumMismatchError,
    CorruptArchiveError,
    EmptyCorpusError,
    MirrorFileMissingError,
    NetworkError,
    UnknownDatasetError,
    UnknownLabelError,
    check_taxonomy,
    context_windows,
    fetch,
    fetch_file,
    load_fasttext_file,
    load_gutenberg,
    load_ptb,
    load_text_classification,
)
from hsm_lab.data import cli, gutenberg
from hsm_lab.data.fetch import iter_tar_members, read_text, sha256_of
from hsm_lab.data.ptb import read_sentences
from hsm_lab.data.registry import DataFile
from hsm_lab.data.text_classification import Ragged, TextClassificationData, TokenizedTexts

QUICK_BOOKS = 4


def _find_mirror() -> Path | None:
    mirror = config.data_mirror()
    if mirror is not None:
        return mirror
    # No mirror named: a cache that already holds the files has the mirror's layout, so it can serve as one.
    cache = config.cache_dir()
    return cache if (cache / "ptb" / "ptb.train.txt").is_file() else None


MIRROR = _find_mirror()
needs_mirror = pytest.mark.skipif(
    MIRROR is None,
    reason=f"real data unavailable: set {config.MIRROR_ENV} to the data mirror (e.g. ../shared/data) "
    f"or fill the cache with `python -m hsm data fetch NAME`",
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test gets its own empty cache, and the mirror (if any) is named explicitly."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
    if MIRROR is not None:
        monkeypatch.setenv(config.MIRROR_ENV, str(MIRROR))
    else:
        monkeypatch.delenv(config.MIRROR_ENV, raising=False)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache for the tests that load the same real files (so the mirror is copied once per module)."""
    return tmp_path_factory.mktemp("shared-cache")


@pytest.fixture
def use_shared_cache(shared_cache, monkeypatch):
    monkeypatch.setenv(config.CACHE_ENV, str(shared_cache))
    return shared_cache


# --------------------------------------------------------------------------------------------- real data counts


@needs_mirror
def test_ptb_counts_match_mikolov_split(use_shared_cache):
    corpus = load_ptb(context=3)
    assert corpus.summary() == {"train_tokens": 929_589, "valid_tokens": 73_760, "test_tokens": 82_430,
                                "vocab": 10_000}
    assert corpus.vocab[corpus.eos_id] == "<eos>" and corpus.vocab[corpus.unk_id] == "<unk>"
    assert int((corpus.train == corpus.eos_id).sum()) == 42_068  # one <eos> per training line
    assert int(corpus.counts.sum()) == corpus.train.numel()
    assert np.all(np.diff(corpus.counts) <= 0)  # ids in decreasing-count order
    assert np.array_equal(np.bincount(corpus.train.numpy(), minlength=10_000), corpus.counts)
    assert corpus.stats["oov_valid"] == corpus.stats["oov_test"] == 0
    contexts, targets = corpus.windows("test")
    assert contexts.shape == (82_430, 3) and torch.equal(targets, corpus.test)


@needs_mirror
def test_cooking_counts(use_shared_cache):
    data = load_text_classification("cooking")
    assert data.multilabel
    assert (len(data.train_texts), len(data.test_texts)) == (12_404, 3_000)
    assert len(data.train_texts) + len(data.test_texts) == 15_404
    assert data.num_labels == 736
    assignments = data.train_labels.values.size + data.test_labels.values.size
    assert assignments / 15_404 == pytest.approx(2.31, abs=0.005)
    first = [data.label_names[i] for i in data.train_labels[0]]
    assert first == ["sauce", "cheese"] and data.train_texts[0][:3] == ["how", "much", "does"]


@needs_mirror
def test_trec_counts_and_taxonomy(use_shared_cache):
    coarse = load_text_classification("trec-coarse")
    fine = load_text_classification("trec-fine")
    for data in (coarse, fine):
        assert (len(data.train_texts), len(data.test_texts)) == (5_452, 500)
    assert coarse.label_names == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"] and coarse.taxonomy is None
    assert fine.num_labels == 50 and sorted(fine.taxonomy) == coarse.label_names
    category = fine.category_of()
    for i in range(len(fine.train_texts)):  # coarse label == category of the fine label, example by example
        assert coarse.label_names[coarse.train_labels[i]] == category[fine.label_names[fine.train_labels[i]]]


@needs_mirror
@pytest.mark.parametrize(
    "name, n_train, n_test, n_labels, n_categories",
    [("20ng", 11_293, 7_528, 20, 6), ("r8", 5_485, 2_189, 8, 4), ("r52", 6_532, 2_568, 52, 4)],
)
def test_cachopo_counts_and_taxonomy(use_shared_cache, name, n_train, n_test, n_labels, n_categories):
    data = load_text_classification(name)
    assert data.summary()["train_examples"] == n_train and data.summary()["test_examples"] == n_test
    assert data.num_labels == n_labels and len(data.taxonomy) == n_categories
    assert sorted(data.category_of()) == sorted(data.label_names)
    assert np.bincount(data.train_labels, minlength=n_labels).min() >= 1


@needs_mirror
def test_validation_split_is_stratified_and_disjoint(use_shared_cache):
    data = load_text_classification("r52")
    carved = data.validation_split(fraction=0.2, seed=3)
    assert len(carved.train_texts) + len(carved.test_texts) == len(data.train_texts)
    train_counts = np.bincount(data.train_labels, minlength=52)
    held_counts = np.bincount(carved.test_labels, minlength=52)
    assert np.array_equal(held_counts, np.floor(0.2 * train_counts).astype(int))
    assert np.all(np.bincount(carved.train_labels, minlength=52) >= 1)  # no class loses all its examples
    again = carved.validation_split(0.2, seed=3)  # composable: carves from the already-reduced train part
    assert len(again.train_texts) + len(again.test_texts) == len(carved.train_texts)
    assert carved.train_texts.num_tokens() + carved.test_texts.num_tokens() == data.train_texts.num_tokens()
    with pytest.raises(ValueError):
        data.validation_split(fraction=1.5)


@given(st.lists(st.integers(0, 4), min_size=8, max_size=60), st.integers(2, 5), st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_cross_validation_folds_partition_train_and_are_stratified(labels, folds, seed):
    labels = np.array(labels)
    n = len(labels)
    texts = TokenizedTexts(np.arange(n, dtype=np.int32), np.arange(n + 1), [f"w{i}" for i in range(n)])
    data = TextClassificationData("toy", texts, labels, texts, labels, [f"c{i}" for i in range(5)])
    splits = data.cross_validation_splits(folds, seed=seed)
    assert len(splits) == folds
    held = [np.asarray(s.test_texts.values) for s in splits]  # the token ids are the example ids
    assert np.array_equal(np.sort(np.concatenate(held)), np.arange(n))  # every example held out once
    for split, out in zip(splits, held):
        kept = np.asarray(split.train_texts.values)
        assert np.intersect1d(kept, out).size == 0 and kept.size + out.size == n
        assert np.array_equal(np.asarray(split.test_labels), labels[out])
    sizes = [len(out) for out in held]
    assert max(sizes) - min(sizes) <= 1  # the folds are level
    for c in np.unique(labels):
        per_fold = [int((labels[out] == c).sum()) for out in held]
        assert max(per_fold) - min(per_fold) <= 1  # stratified
    again = data.cross_validation_splits(folds, seed=seed)
    assert all(np.array_equal(a.test_texts.values, b.test_texts.values) for a, b in zip(splits, again))
    with pytest.raises(ValueError, match="folds"):
        data.cross_validation_splits(1)
    with pytest.raises(ValueError, match="folds"):
        data.cross_validation_splits(n + 1)


# ------------------------------------------------------------------------------------------- Gutenberg pipeline


@needs_mirror
def test_gutenberg_slice_pipeline_and_cache(use_shared_cache, monkeypatch):
    corpus = load_gutenberg(max_books=QUICK_BOOKS, vocab_size=5_000, context=4, progress=False)
    stats = corpus.stats
    assert (stats["train_books"], stats["valid_books"], stats["test_books"]) == (2, 1, 1)
    assert corpus.vocab_size == 5_000 and "<unk>" in corpus.vocab and "<eos>" in corpus.vocab
    assert int(corpus.counts.sum()) == corpus.train.numel()
    assert np.all(np.diff(corpus.counts) <= 0)
    assert all(split.numel() > 0 and int(split.max()) < corpus.vocab_size
               for split in (corpus.train, corpus.valid, corpus.test))
    unk_rate = float((corpus.train == corpus.unk_id).float().mean())
    assert unk_rate == pytest.approx(stats["train_oov_rate"]) and 0 < unk_rate < 0.1
    # No boilerplate survives: the licence's vocabulary never appears in the stream.
    for word in ("Gutenberg", "gutenberg", "GUTENBERG", "EBOOK", "eBook", "Etext"):
        assert corpus.index(word) == corpus.unk_id
    # A second call with the same configuration reads the cache and never touches the archive.
    monkeypatch.setattr(gutenberg, "iter_books", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-read")))
    again = load_gutenberg(max_books=QUICK_BOOKS, vocab_size=5_000, progress=False)
    assert again.vocab == corpus.vocab and torch.equal(again.test, corpus.test)


@needs_mirror
def test_gutenberg_from_github_archive_checks_blob_ids(tmp_path, monkeypatch):
    """The canonical-download layout: books inside the repository archive, each checked by its git blob id."""
    selection = gutenberg.select_books(3)
    books = dict((entry.path, raw) for entry, raw in gutenberg.iter_books(selection))  # from the mirror
    from_mirror = load_gutenberg(max_books=3, vocab_size=1_000, progress=False)

    def write_github_archive(cache: Path, corrupt: bool) -> None:
        target = cache / gutenberg.GUTENBERG_GITHUB_ARCHIVE
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(target, "w:gz") as tar:
            for path, raw in books.items():
                if corrupt:
                    raw = raw[:-1] + bytes([raw[-1] ^ 1])
                info = tarfile.TarInfo(f"Gutenberg_Text-{gutenberg.GUTENBERG_COMMIT}/{path}")
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))

    monkeypatch.delenv(config.MIRROR_ENV, raising=False)  # no mirror: the manifest comes from the package
    for corrupt in (False, True):
        cache = tmp_path / f"cache-{corrupt}"
        monkeypatch.setenv(config.CACHE_ENV, str(cache))
        write_github_archive(cache, corrupt)
        if corrupt:
            with pytest.raises(CorruptArchiveError, match="git blob id"):
                load_gutenberg(max_books=3, vocab_size=1_000, progress=False)
        else:
            from_github = load_gutenberg(max_books=3, vocab_size=1_000, progress=False)
            assert from_github.vocab == from_mirror.vocab and torch.equal(from_github.train, from_mirror.train)


def test_book_split_is_fixed_and_prefix_stable():
    assert gutenberg.books_for_scale("full") is None and gutenberg.books_for_scale("quick") == 10
    splits = [gutenberg.book_split(p) for p in range(678)]
    assert (splits.count("train"), splits.count("valid"), splits.count("test")) == (542, 68, 68)
    assert splits[:3] == ["valid", "test", "train"]  # three books suffice for one of each


@needs_mirror
def test_gutenberg_book_order_is_deterministic_prefix():
    full = gutenberg.select_books()
    assert len(full) == 678 and len({entry.path for entry in full}) == 678
    assert gutenberg.select_books(QUICK_BOOKS) == full[:QUICK_BOOKS]
    assert any("\r" in entry.path for entry in full)  # titles with a carriage return survive parsing
    with pytest.raises(ValueError, match="at least 3"):
        load_gutenberg(max_books=2)


@needs_mirror
def test_gutenberg_books_classification_slice(use_shared_cache):
    data = load_text_classification("gutenberg-books", max_books=QUICK_BOOKS)
    assert data.num_labels == QUICK_BOOKS
    assert set(data.taxonomy) == {name.split("/")[0] for name in data.label_names}
    assert set(np.unique(data.train_labels)) == set(np.unique(data.test_labels)) == set(range(QUICK_BOOKS))
    assert np.all(data.train_texts.lengths() == 100) and "<eos>" not in data.train_texts[0]
    assert len(data.test_texts) / (len(data.train_texts) + len(data.test_texts)) == pytest.approx(0.2, abs=0.01)


def test_gutenberg_books_passages_and_short_books(monkeypatch):
    """Passages of 100 tokens without <eos>; every 5th to test; a book shorter than 5 passages gives its last."""
    entries = [gutenberg.ManifestEntry(f"Author {a}/Book {a}.txt", "0" * 40, 0, 0) for a in "AB"]

    def fake_books(lengths):
        ids = [np.where(np.arange(n) % 7 == 6, 0, 1 + np.arange(n) % 50) for n in lengths]  # id 0 is <eos>
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return gutenberg.TokenizedBooks(["<eos>", *map(str, range(1, 51))], np.concatenate(ids).astype(np.int32),
                                        offsets, entries, {})

    # 1,400 tokens -> 1,200 without <eos> -> 12 passages (test: 4 and 9); 350 -> 300 -> 3 passages (test: 2)
    monkeypatch.setattr(gutenberg, "tokenized_books", lambda *a, **k: fake_books([1_400, 350]))
    data = load_text_classification("gutenberg-books", max_books=2)
    assert np.bincount(data.train_labels).tolist() == [10, 2] and np.bincount(data.test_labels).tolist() == [2, 1]
    assert data.taxonomy == {"Author A": ["Author A/Book A"], "Author B": ["Author B/Book B"]}
    assert "<eos>" not in {token for i in range(len(data.train_texts)) for token in data.train_texts[i]}
    monkeypatch.setattr(gutenberg, "tokenized_books", lambda *a, **k: fake_books([1_400, 150]))
    with pytest.raises(EmptyCorpusError, match="Book B"):
        load_text_classification("gutenberg-books", max_books=2)


def test_strip_boilerplate_markers():
    modern = ("Title page\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\nCall me Ishmael.\n\n"
              "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nlicence text")
    assert gutenberg.strip_boilerplate(modern) == ("Call me Ishmael.", True, True)
    old = ("header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\nBody here.\n"
           "End of Project Gutenberg Etext of Something\n")
    assert gutenberg.strip_boilerplate(old) == ("Body here.", True, True)
    world = ("*** SMALL PRINT! FOR __ COMPLETE SHAKESPEARE ***\nAct I.\n<<THIS ELECTRONIC VERSION OF THE "
             "COMPLETE WORKS OF WILLIAM\nSHAKESPEARE IS COPYRIGHT>>\nAct II.\n")
    body, start, end = gutenberg.strip_boilerplate(world)
    assert "ELECTRONIC" not in body and "Act I." in body and "Act II." in body and start and not end
    assert gutenberg.strip_boilerplate("No markers at all.\n") == ("No markers at all.", False, False)


def test_tokenizer_paragraphs_and_quotes():
    text = "Don\u2019t  stop,\nnow.\n\n  \n\u201cYes\u201d 42"
    assert gutenberg.tokenize(text) == ["don", "'", "t", "stop", ",", "now", ".", "<eos>",
                                        '"', "yes", '"', "42", "<eos>"]
    assert gutenberg.tokenize(text, paragraphs=False)[-1] == "42"
    assert gutenberg.tokenize("A b", lowercase=False) == ["A", "b", "<eos>"]
    assert gutenberg.git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"  # `git hash-object`


# ------------------------------------------------------------------------------------------ windows and storage


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=40), st.integers(1, 6), st.booleans())
def test_context_windows_hold_the_previous_words(stream, T, pad):
    tokens = torch.tensor(stream, dtype=torch.int64)
    if not pad and len(stream) <= T:
        with pytest.raises(ValueError):
            context_windows(tokens, T)
        return
    contexts, targets = context_windows(tokens, T, pad_id=99 if pad else None)
    padded = [99] * T + stream if pad else stream
    assert targets.tolist() == padded[T:]
    for i in range(len(targets)):
        assert contexts[i].tolist() == padded[i : i + T]


def test_context_windows_reject_bad_input():
    with pytest.raises(TypeError):
        context_windows([1, 2, 3], 1)
    with pytest.raises(TypeError):
        context_windows(torch.zeros(5), 1)
    with pytest.raises(ValueError):
        context_windows(torch.zeros(2, 2, dtype=torch.int64), 1)
    with pytest.raises(ValueError):
        context_windows(torch.zeros(5, dtype=torch.int64), 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), max_size=6), min_size=1, max_size=12), st.data())
def test_ragged_subset_matches_python_lists(rows, data):
    ragged = Ragged.from_lists(rows)
    assert [ragged[i] for i in range(len(ragged))] == rows
    indices = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=15))
    assert [list(r) for r in ragged.subset(indices)] == [rows[i] for i in indices]
    vocab = [f"w{i}" for i in range(10)]
    texts = TokenizedTexts(ragged.values, ragged.offsets, vocab)
    assert texts[0] == [vocab[t] for t in rows[0]] and texts.ids(0).tolist() == rows[0]


# ---------------------------------------------------------------------------------------------- fastText files


FASTTEXT_LINES = [
    "__label__beach __label__sea sunny day at the beach",
    "__label__cat a cat on a mat",
    "no label on this line",
    "__label__sea __label__boat sailing boat",
    "__label__cat another cat",
]


def test_fasttext_file_multilabel(tmp_path):
    path = tmp_path / "yfcc.train"
    path.write_text("\n".join(FASTTEXT_LINES) + "\n")
    data = load_fasttext_file(path, test_last=1)
    assert data.multilabel and data.label_names == ["beach", "boat", "cat", "sea"]
    assert [[data.label_names[j] for j in data.train_labels[i]] for i in range(3)] == [
        ["beach", "sea"], ["cat"], ["sea", "boat"]]
    assert data.train_texts[1] == ["a", "cat", "on", "a", "mat"] and data.test_texts[0] == ["another", "cat"]
    assert data.stats["unlabelled_lines"] == 1
    packed = tmp_path / "yfcc.train.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    test_file = tmp_path / "yfcc.test"
    test_file.write_text("__label__boat boat\n")
    both = load_fasttext_file(packed, test_path=test_file)
    assert len(both.train_texts) == 4 and both.test_texts[0] == ["boat"]
    # min_label_count counts train and test together: beach occurs once and goes; boat (train + test) stays.
    frequent = load_fasttext_file(path, test_path=test_file, min_label_count=2)
    assert frequent.label_names == ["boat", "cat", "sea"] and frequent.stats["labels_dropped"] == 1
    assert [frequent.train_labels[i] for i in range(4)] == [[2], [1], [2, 0], [1]]
    lonely = tmp_path / "lonely.txt"
    lonely.write_text("__label__x lonely\n__label__y a\n__label__y b\n")
    pruned = load_fasttext_file(lonely, min_label_count=2)  # the only example of x loses its only label
    assert pruned.label_names == ["y"] and pruned.stats["train_examples_dropped"] == 1
    assert [pruned.train_texts[i] for i in range(2)] == [["a"], ["b"]]
    with pytest.raises(EmptyCorpusError):
        load_fasttext_file(path, min_label_count=3)  # no tag occurs 3 times


# ----------------------------------------------------------------------------------------------- error paths


def _fake_mirror(tmp_path: Path, files: dict[str, bytes]) -> Path:
    root = tmp_path / "mirror"
    for relpath, content in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(content)
    return root


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_mirror
def test_flipped_byte_in_mirror_is_a_checksum_mismatch(tmp_path, monkeypatch):
    content = bytearray((MIRROR / "ptb" / "ptb.valid.txt").read_bytes())
    content[1000] ^= 0x01
    monkeypatch.setenv(config.MIRROR_ENV, str(_fake_mirror(tmp_path, {"ptb/ptb.valid.txt": bytes(content)})))
    with pytest.raises(ChecksumMismatchError, match=r"ptb/ptb\.valid\.txt.*fetch ptb"):
        fetch_file(load_ptb.__globals__["SOURCES"]["ptb"].file("ptb/ptb.valid.txt"))
    assert not (config.cache_dir() / "ptb" / "ptb.valid.txt").exists()  # nothing half-good was installed


def test_flipped_byte_in_cache_is_a_checksum_mismatch(tmp_path):
    good = b"some content\n"
    entry = DataFile("toy/file.txt", hashlib.sha256(good).hexdigest())
    cached = config.cache_dir() / "toy" / "file.txt"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"some cOntent\n")
    # the bad copy is ignored with a warning naming it, then no other source can supply the file
    with pytest.warns(CacheWarning, match="its sha256 is wrong"), \
            pytest.raises(ChecksumMismatchError, match="cached copy"):
        fetch_file(entry)


def test_missing_mirror_file(tmp_path, monkeypatch):
    empty_mirror = tmp_path / "empty-mirror"
    empty_mirror.mkdir()
    monkeypatch.setenv(config.MIRROR_ENV, str(empty_mirror))
    with pytest.raises(MirrorFileMissingError, match=r"ptb/ptb\.train\.txt is missing from the data mirror"):
        fetch("ptb")


def test_no_network(monkeypatch):
    monkeypatch.delenv(config.MIRROR_ENV, raising=False)
    entry = DataFile("toy/remote.txt", "0" * 64, url=f"http://127.0.0.1:{_closed_port()}/remote.txt")
    with pytest.raises(NetworkError, match=f"{config.MIRROR_ENV}"):
        fetch_file(entry)
    assert not (config.cache_dir() / "toy" / "remote.txt").exists()


def test_download_is_verified_then_renamed(tmp_path, monkeypatch):
    monkeypatch.delenv(config.MIRROR_ENV, raising=False)
    served = tmp_path / "served.txt"
    served.write_bytes(b"payload\n")
    good = DataFile("toy/served.txt", sha256_of(served), url=served.as_uri())
    assert fetch_file(good).read_bytes() == b"payload\n"
    bad = DataFile("toy/other.txt", "f" * 64, url=served.as_uri())
    with pytest.raises(ChecksumMismatchError, match="toy/other.txt"):
        fetch_file(bad)
    assert sorted(p.name for p in (config.cache_dir() / "toy").iterdir()) == ["served.txt"]  # no temp left


def test_truncated_archive(tmp_path):
    archive = tmp_path / "books.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for i in range(3):
            payload = os.urandom(50_000)  # incompressible, so truncation hits the members
            info = tarfile.TarInfo(f"gutenberg/A/book{i}.txt")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(CorruptArchiveError, match=r"books\.tar\.xz is truncated or corrupt"):
        list(iter_tar_members(archive))
    packed = tmp_path / "tags.txt.xz"
    packed.write_bytes(lzma.compress(("\n".join(FASTTEXT_LINES * 200)).encode())[:-40])
    with pytest.raises(CorruptArchiveError, match="tags.txt.xz"):
        load_fasttext_file(packed)
    with pytest.raises(CorruptArchiveError):
        read_text(packed)


def test_empty_files(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(EmptyCorpusError, match="empty.txt"):
        load_fasttext_file(empty)
    with pytest.raises(EmptyCorpusError, match="no tokens"):
        read_sentences(empty)
    unlabelled = tmp_path / "unlabelled.txt"
    unlabelled.write_text("words but no label\n")
    with pytest.raises(EmptyCorpusError):
        load_fasttext_file(unlabelled)


def test_unknown_name():
    with pytest.raises(UnknownDatasetError, match="known data sets: ptb"):
        load_text_classification("yfcc100m")
    with pytest.raises(ValueError):  # UnknownDatasetError is a ValueError too
        fetch("nope")
    assert cli.main(["info", "nope", "--json"]) == 1


def test_unknown_label():
    taxonomy = {"sport": ["hockey", "baseball"], "science": ["space"]}
    check_taxonomy(["baseball", "hockey", "space"], taxonomy)
    with pytest.raises(UnknownLabelError, match="curling"):
        check_taxonomy(["baseball", "curling", "hockey", "space"], taxonomy)
    with pytest.raises(UnknownLabelError, match="never occur"):
        check_taxonomy(["baseball", "hockey"], taxonomy)
    with pytest.raises(UnknownLabelError, match="two taxonomy categories"):
        check_taxonomy(["space"], {"a": ["space"], "b": ["space"]})
    texts = TokenizedTexts(np.array([0, 1], dtype=np.int32), np.array([0, 1, 2]), ["x", "y"])
    with pytest.raises(UnknownLabelError):
        TextClassificationData("toy", texts, np.array([0, 1]), texts, np.array([1, 0]), ["hockey", "curling"],
                               taxonomy=taxonomy)


# -------------------------------------------------------------------------------------------------------- CLI


@needs_mirror
def test_cli_info_list_verify(use_shared_cache, capsys):
    assert cli.main(["info", "ptb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"train_tokens": 929_589, "valid_tokens": 73_760,
                                                   "test_tokens": 82_430, "vocab": 10_000}
    assert cli.main(["info", "trec-coarse", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["train_examples"], info["test_examples"], info["labels"]) == (5_452, 500, 6)
    assert cli.main(["list"]) == 0 and "gutenberg-books" in capsys.readouterr().out
    assert cli.main(["verify", "ptb", "trec"]) == 0
    assert "BAD" not in capsys.readouterr().out


def test_cli_verify_reports_a_bad_cached_file(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(config.MIRROR_ENV, raising=False)
    bad = config.cache_dir() / "trec" / "TREC_10.label"
    bad.parent.mkdir(parents=True)
    bad.write_text("NUM:date When ?\n")
    assert cli.main(["verify", "trec"]) == 1
    assert "BAD trec/TREC_10.label" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ Gutenberg split variants


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 7_000), min_size=1, max_size=30), chunk=st.integers(1, 3_000),
       seed=st.one_of(st.none(), st.integers(0, 2**31)), split=st.sampled_from(gutenberg.SPLIT_KINDS))
def test_split_pieces_cover_every_token_once(lengths, chunk, seed, split):
    pieces = gutenberg.split_pieces(lengths, split, seed, chunk)
    covered = [np.zeros(n, dtype=int) for n in lengths]
    for part in pieces.values():
        for book, start, end in part:
            assert 0 <= start < end <= lengths[book]
            assert split == "chunks" or (start, end) == (0, lengths[book])
            assert end - start <= (chunk if split == "chunks" else lengths[book])
            covered[book][start:end] += 1
        assert part == sorted(part)  # each split keeps its text in book order
    assert all(np.all(c == 1) for c in covered)


def test_split_pieces_deal_one_in_ten_to_each_held_out_split():
    own = gutenberg.split_pieces([5] * 678)
    assert [book for book, _, _ in own["test"]] == [p for p in range(678) if gutenberg.book_split(p) == "test"]
    draw = gutenberg.split_pieces([5] * 678, split_seed=1)
    assert {k: len(v) for k, v in draw.items()} == {"train": 542, "valid": 68, "test": 68}
    assert draw["test"] != own["test"]
    chunks = gutenberg.split_pieces([4_500] * 100, "chunks", chunk_tokens=2_000)  # 3 pieces a book
    assert {k: len(v) for k, v in chunks.items()} == {"train": 240, "valid": 30, "test": 30}
    with pytest.raises(ValueError, match="split must be one of"):
        gutenberg.split_pieces([5], "pages")
    with pytest.raises(ValueError, match="chunk_tokens"):
        gutenberg.split_pieces([5], "chunks", chunk_tokens=0)


@needs_mirror
def test_gutenberg_variants_are_named_and_keep_the_corpus_own_split(use_shared_cache):
    own = load_gutenberg(max_books=QUICK_BOOKS, vocab_size=5_000, progress=False)
    assert own.name == f"gutenberg-{QUICK_BOOKS}books" and "split" not in own.stats
    chunks = load_gutenberg(max_books=QUICK_BOOKS, vocab_size=5_000, progress=False, split="chunks")
    assert chunks.name == f"gutenberg-{QUICK_BOOKS}books-chunks2000"
    total = lambda c: sum(s.numel() for s in (c.train, c.valid, c.test))  # noqa: E731
    assert total(chunks) == total(own) and chunks.stats["test_books"] > own.stats["test_books"]
    segments = gutenberg.split_segments(QUICK_BOOKS, split="chunks")
    assert segments["test"][-1][2] == chunks.test.numel()
    assert gutenberg.split_segments(QUICK_BOOKS)["test"] == [(gutenberg.select_books(QUICK_BOOKS)[1].path, 0,
                                                              own.test.numel())]
    rare = load_gutenberg(max_books=QUICK_BOOKS, vocab_size=50_000, progress=False, min_count=3)
    assert rare.name == f"gutenberg-{QUICK_BOOKS}books-min3"
    assert np.delete(rare.counts, rare.vocab.index("<unk>")).min() >= 3  # every kept word seen 3 times or more
    assert rare.stats["types_below_min_count"] > 0
    draw = load_gutenberg(max_books=QUICK_BOOKS, vocab_size=5_000, progress=False, split_seed=1)
    assert draw.name == f"gutenberg-{QUICK_BOOKS}books-draw1"
    with pytest.raises(ValueError, match="min_count"):
        load_gutenberg(max_books=QUICK_BOOKS, min_count=0)
