"""Bad inputs to the data layer: a bad ``HSM_CACHE``, damaged cached downloads, damaged processed
corpora, unwritable caches and interrupted writes. Each must give a named error or the documented fallback, never
a traceback from deep inside NumPy and never a silently wrong result.

Everything runs on files made here: a temporary ``HSM_CACHE`` for every test (the real cache is never touched), a
temporary mirror, and a tiny synthetic Gutenberg (five generated books in a ``.tar.xz`` with its ``MANIFEST.tsv``)
registered in place of the real source, so the whole Gutenberg pipeline runs in well under a second. One test also
uses the real mirror (``HSM_DATA_MIRROR``), read-only, when it is set.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from hsm_lab import config
from hsm_lab.data import (
    CacheWarning,
    ChecksumMismatchError,
    DataError,
    fetch_file,
    load_gutenberg,
    load_text_classification,
)
from hsm_lab.data import cli, gutenberg, registry
from hsm_lab.data.fetch import sha256_of
from hsm_lab.data.registry import DataFile, Source

VOCAB = 20  # below the synthetic books' ~28 types, so the cap binds and <unk> occurs
BOOKS = 5
#: The real data mirror, read (never written) by one trial; captured before the fixture below unsets it.
REAL_MIRROR = config.data_mirror()


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    """A fresh empty cache per test, and no mirror unless a test names one."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv(config.MIRROR_ENV, raising=False)


def _mirror(root: Path, files: dict[str, bytes]) -> Path:
    for relpath, content in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(content)
    return root


def _no_temporaries(folder: Path) -> None:
    leftovers = [p for p in folder.rglob(".*") if ".part-" in p.name or ".stale-" in p.name]
    assert leftovers == []


@pytest.fixture
def read_only(monkeypatch):
    """Return a function making a folder unwritable: no file or folder can be created under it.

    chmod does it for an ordinary user; root ignores permission bits, so creating folders under it is also refused
    at the Python level (Path.mkdir raises PermissionError, as on a read-only mount). Every write of the data layer
    starts by creating its folder, so the tests below use caches that are empty.
    """
    locked: list[Path] = []
    real_mkdir = Path.mkdir

    def mkdir(self, mode=0o777, parents=False, exist_ok=False):
        target = Path(os.path.abspath(self))
        if any(target == root or root in target.parents for root in locked) and not target.is_dir():
            raise PermissionError(errno.EACCES, "Permission denied", str(target))
        return real_mkdir(self, mode, parents, exist_ok)

    monkeypatch.setattr(Path, "mkdir", mkdir)

    def lock(folder: Path) -> Path:
        folder = Path(os.path.abspath(folder))
        folder.mkdir(parents=True, exist_ok=True)  # an existing, empty, unwritable folder
        locked.append(folder)
        folder.chmod(0o555)
        return folder

    yield lock
    for folder in locked:
        if folder.is_dir():
            folder.chmod(0o755)  # so pytest can clean up


# -------------------------------------------------------------------------------------------------- HSM_CACHE


def test_cache_naming_a_file_is_a_named_error(tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    monkeypatch.setenv(config.CACHE_ENV, str(a_file))
    with pytest.raises(ValueError, match=rf"HSM_CACHE=.*{a_file.name}.*exists and is not a directory"):
        config.cache_dir()
    with pytest.raises(ValueError, match="HSM_CACHE"):
        fetch_file(DataFile("toy/a.txt", "0" * 64))
    assert cli.main(["fetch", "ptb"]) == 1  # one line, no traceback
    assert "HSM_CACHE" in capsys.readouterr().err


def test_cache_that_cannot_be_created_is_a_named_error(tmp_path, monkeypatch, read_only):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    monkeypatch.setenv(config.CACHE_ENV, str(a_file / "cache"))  # a parent that is a file
    with pytest.raises(ValueError, match=r"HSM_CACHE=.*cannot be created \(NotADirectoryError"):
        config.cache_dir()
    locked = read_only(tmp_path / "locked")
    monkeypatch.setenv(config.CACHE_ENV, str(locked / "cache"))
    with pytest.raises(ValueError, match=r"HSM_CACHE=.*locked/cache cannot be created \(PermissionError"):
        config.cache_dir()


def test_unwritable_cache_reads_the_mirror_in_place(tmp_path, monkeypatch, read_only):
    content = b"mirrored content\n"
    entry = DataFile("toy/a.txt", hashlib.sha256(content).hexdigest())
    mirror = _mirror(tmp_path / "mirror", {"toy/a.txt": content})
    monkeypatch.setenv(config.MIRROR_ENV, str(mirror))
    cache = read_only(tmp_path / "cache")
    monkeypatch.setenv(config.CACHE_ENV, str(cache))
    assert config.cache_dir() == cache  # an existing unwritable folder is accepted (read-only use)
    with pytest.warns(CacheWarning, match=r"cannot copy toy/a\.txt into the cache .*reading the verified mirror"):
        path = fetch_file(entry)
    assert path == mirror / "toy" / "a.txt" and path.read_bytes() == content
    assert list(cache.iterdir()) == []


def test_unwritable_cache_download_is_a_named_error(tmp_path, monkeypatch, read_only):
    served = tmp_path / "served.txt"
    served.write_bytes(b"payload\n")
    cache = read_only(tmp_path / "cache")
    monkeypatch.setenv(config.CACHE_ENV, str(cache))
    entry = DataFile("toy/served.txt", sha256_of(served), url=served.as_uri())
    with pytest.raises(DataError, match=r"cannot write the download of toy/served\.txt .*Fix: set HSM_CACHE"):
        fetch_file(entry)


# ------------------------------------------------------------------------------------ damaged cached downloads


def test_a_folder_where_a_cached_file_belongs_is_a_named_error():
    entry = DataFile("toy/a.txt", hashlib.sha256(b"x").hexdigest())
    (config.cache_dir() / "toy" / "a.txt").mkdir(parents=True)
    with pytest.raises(DataError, match=r"cached copy of toy/a\.txt, .*a\.txt, is not a regular file"):
        fetch_file(entry)



def test_truncated_cached_copy_is_refetched_from_the_mirror(tmp_path, monkeypatch):
    content = b"line one\nline two\nline three\n"
    entry = DataFile("toy/a.txt", hashlib.sha256(content).hexdigest())
    monkeypatch.setenv(config.MIRROR_ENV, str(_mirror(tmp_path / "mirror", {"toy/a.txt": content})))
    cached = config.cache_dir() / "toy" / "a.txt"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(content[:10])  # a truncated copy
    with pytest.warns(CacheWarning, match=rf"ignoring the cached copy {cached}.*sha256 is wrong"):
        path = fetch_file(entry)
    assert path == cached and cached.read_bytes() == content  # replaced by the good copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call finds a good copy: no warning
        assert fetch_file(entry).read_bytes() == content
    _no_temporaries(config.cache_dir())


def test_corrupt_download_copy_is_replaced_by_the_mirror_copy(tmp_path, monkeypatch):
    """A bad copy stored under the download name is dropped once the mirror's copy is in place."""
    packed, plain = b"packed bytes", b"plain bytes"
    entry = DataFile("toy/a.txt.xz", hashlib.sha256(packed).hexdigest(), url="http://127.0.0.1:9/a.txt",
                     download_relpath="toy/a.txt", download_sha256=hashlib.sha256(plain).hexdigest())
    monkeypatch.setenv(config.MIRROR_ENV, str(_mirror(tmp_path / "mirror", {"toy/a.txt.xz": packed})))
    bad = config.cache_dir() / "toy" / "a.txt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"plain by")
    with pytest.warns(CacheWarning, match="downloaded copy"):
        path = fetch_file(entry)
    assert path.read_bytes() == packed and not bad.exists()


def test_truncated_cached_copy_is_redownloaded(tmp_path):
    served = tmp_path / "served.txt"
    served.write_bytes(b"payload payload\n")
    entry = DataFile("toy/served.txt", sha256_of(served), url=served.as_uri())
    cached = config.cache_dir() / "toy" / "served.txt"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"pay")
    with pytest.warns(CacheWarning, match="served.txt"):
        assert fetch_file(entry).read_bytes() == b"payload payload\n"


def test_bad_cached_copy_without_another_source_names_both_problems(tmp_path, monkeypatch):
    entry = DataFile("toy/a.txt", hashlib.sha256(b"good").hexdigest())
    cached = config.cache_dir() / "toy" / "a.txt"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"goo")
    with pytest.warns(CacheWarning), pytest.raises(
        ChecksumMismatchError, match=r"(?s)cached copy .*a\.txt.*could not be fetched again.*no download URL"
    ):
        fetch_file(entry)
    monkeypatch.setenv(config.MIRROR_ENV, str(_mirror(tmp_path / "mirror", {"toy/a.txt": b"bad"})))
    with pytest.warns(CacheWarning), pytest.raises(ChecksumMismatchError, match=r"(?s)cached copy.*mirror file"):
        fetch_file(entry)
    assert cached.read_bytes() == b"goo"  # nothing was installed over it


def test_truncated_real_ptb_file_is_refetched_from_the_real_mirror(monkeypatch):
    real = REAL_MIRROR
    if real is None or not (real / "ptb" / "ptb.valid.txt").is_file():
        pytest.skip(f"no data mirror: set {config.MIRROR_ENV} (e.g. ../shared/data) to run this trial")
    monkeypatch.setenv(config.MIRROR_ENV, str(real))
    entry = registry.SOURCES["ptb"].file("ptb/ptb.valid.txt")
    cached = config.cache_dir() / entry.relpath
    cached.parent.mkdir(parents=True)
    cached.write_bytes((real / entry.relpath).read_bytes()[:1000])
    with pytest.warns(CacheWarning, match=r"ptb\.valid\.txt"):
        assert sha256_of(fetch_file(entry)) == entry.sha256


# ---------------------------------------------------------------------------------------- a synthetic Gutenberg

_WORDS = ("the sea ship man old day night river town road house king queen war field rain sun moon star green "
          "red dark light small great long").split()


def _book(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    paragraphs = [" ".join(rng.choice(_WORDS, size=40)) + "." for _ in range(20)]
    body = "\n\n".join(paragraphs)
    return (f"Title: Book {seed}\n\n*** START OF THE PROJECT GUTENBERG EBOOK {seed} ***\n\n{body}\n\n"
            f"*** END OF THE PROJECT GUTENBERG EBOOK {seed} ***\nlicence text\n").encode()


@pytest.fixture(scope="module")
def fake_gutenberg_mirror(tmp_path_factory) -> tuple[Path, Source]:
    root = tmp_path_factory.mktemp("gutenberg-mirror")
    books = {f"Author {i % 3}/Book {i}.txt": _book(i) for i in range(BOOKS)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for path, raw in books.items():
            info = tarfile.TarInfo(f"gutenberg/{path}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    manifest = "path\tgit_blob\tsize\tregex_tokens\n" + "".join(
        f"{path}\t{gutenberg.git_blob_id(raw)}\t{len(raw)}\t{len(gutenberg.tokenize(raw.decode()))}\n"
        for path, raw in books.items())
    files = {"gutenberg/gutenberg-books.tar.xz": buffer.getvalue(), "gutenberg/MANIFEST.tsv": manifest.encode()}
    _mirror(root, files)
    source = Source("gutenberg", "synthetic", "", "", "", tuple(
        DataFile(relpath, hashlib.sha256(content).hexdigest()) for relpath, content in files.items()))
    return root, source


@pytest.fixture
def fake_gutenberg(fake_gutenberg_mirror, monkeypatch):
    """The synthetic books stand in for the real source (registry entry and mirror); returns a loader."""
    root, source = fake_gutenberg_mirror
    monkeypatch.setitem(registry.SOURCES, "gutenberg", source)
    monkeypatch.setenv(config.MIRROR_ENV, str(root))

    def load() -> object:
        return load_gutenberg(max_books=BOOKS, vocab_size=VOCAB, progress=False)

    return load


def _lm_folder() -> Path:
    (folder,) = (config.cache_dir() / "gutenberg" / "processed").glob("lm-*")
    return folder


def _tokens_folder() -> Path:
    (folder,) = (config.cache_dir() / "gutenberg" / "processed").glob("tokens-*")
    return folder


def _same(a, b) -> bool:
    return a.vocab == b.vocab and all(torch.equal(getattr(a, s), getattr(b, s)) for s in ("train", "valid", "test"))


def _quiet(load):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load()


def test_synthetic_gutenberg_builds_and_reloads(fake_gutenberg):
    corpus = _quiet(fake_gutenberg)
    assert corpus.vocab_size == VOCAB and corpus.unk_id >= 0 and int((corpus.train == corpus.unk_id).sum()) > 0
    assert all(int(getattr(corpus, s).max()) < corpus.vocab_size for s in ("train", "valid", "test"))
    stats = json.loads((_lm_folder() / "stats.json").read_text())
    assert stats == corpus.stats and stats["train_tokens"] == corpus.train.numel()
    assert _same(_quiet(fake_gutenberg), corpus)
    _no_temporaries(config.cache_dir())


def _save(path: Path, values: np.ndarray) -> None:
    with open(path, "wb") as handle:  # np.save(path) would add '.npy' to a name without it
        np.save(handle, values)


def _save_npz(path: Path, values: np.ndarray) -> None:
    with open(path, "wb") as handle:  # np.savez(path) would add '.npz'
        np.savez(handle, values)


def _repeat_a_line(path: Path) -> None:
    """Overwrite the last word of a one-per-line list with the one before it (same line count)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    last = len(lines) - 1 if lines[-1] else len(lines) - 2
    lines[last] = lines[last - 1]
    path.write_text("\n".join(lines), encoding="utf-8")


LM_DAMAGE = {
    "ids beyond the vocabulary": (
        lambda f: _save(f / "train.npy", np.full(np.load(f / "train.npy").shape, VOCAB + 5, dtype=np.int32)),
        r"train\.npy holds token ids in \[\d+, \d+\], outside \[0, \d+\)"),
    "negative ids": (
        lambda f: _save(f / "valid.npy", -np.ones(np.load(f / "valid.npy").shape, dtype=np.int32)),
        r"valid\.npy holds token ids in \[-1, -1\]"),
    "truncated npy": (
        lambda f: (f / "test.npy").write_bytes((f / "test.npy").read_bytes()[:-7]),
        r"test\.npy cannot be loaded \(ValueError"),
    "npy header only": (
        lambda f: (f / "counts.npy").write_bytes((f / "counts.npy").read_bytes()[:20]),
        r"counts\.npy cannot be loaded"),
    "wrong dtype": (
        lambda f: _save(f / "train.npy", np.load(f / "train.npy").astype(np.float64)),
        r"train\.npy holds float64 of shape \(\d+,\) but stats\.json implies int32"),
    "wrong length": (
        lambda f: _save(f / "train.npy", np.load(f / "train.npy")[:-1]),
        r"train\.npy holds int32 of shape .* but stats\.json implies int32 of shape"),
    "missing stats.json": (lambda f: (f / "stats.json").unlink(), r"stats\.json is missing"),
    "stats.json not JSON": (lambda f: (f / "stats.json").write_text("{\"vocab"), r"stats\.json cannot be read"),
    "stats.json without a count": (
        lambda f: (f / "stats.json").write_text(json.dumps({"vocab_size": "many"})),
        r"stats\.json has no valid count 'vocab_size'"),
    "missing vocab.txt": (lambda f: (f / "vocab.txt").unlink(), r"vocab\.txt is missing"),
    "short vocab.txt": (
        lambda f: (f / "vocab.txt").write_text("\n".join((f / "vocab.txt").read_text().split("\n")[:-2])),
        r"vocab\.txt has \d+ lines but stats\.json says"),
    "missing npy": (lambda f: (f / "valid.npy").unlink(), r"valid\.npy is missing"),
    "text in an npy": (lambda f: (f / "valid.npy").write_text("1 2 3\n"), r"valid\.npy cannot be loaded"),
    "npz in an npy": (lambda f: _save_npz(f / "counts.npy", np.load(f / "counts.npy")),
                      r"counts\.npy is not a \.npy array file"),
    # in-range damage: every id and count within bounds, caught by the metadata all the same
    "negative counts": (
        lambda f: _save(f / "counts.npy", np.load(f / "counts.npy") * np.array([1, -1] * (VOCAB // 2)
                                                                               + [1] * (VOCAB % 2))),
        r"counts\.npy holds a negative count"),
    "counts off by one": (
        lambda f: _save(f / "counts.npy", np.load(f / "counts.npy") + np.eye(1, VOCAB, 3, dtype=np.int64)[0]),
        r"counts\.npy sums to \d+ but stats\.json counts \d+ training tokens"),
    "counts swapped": (
        lambda f: _save(f / "counts.npy", np.load(f / "counts.npy")[::-1].copy()),
        r"counts\.npy does not match train\.npy for \d+ words"),
    "train ids changed in range": (
        lambda f: _save(f / "train.npy", np.zeros_like(np.load(f / "train.npy"))),
        r"counts\.npy does not match train\.npy"),
    "vocabulary word repeated": (
        lambda f: _repeat_a_line(f / "vocab.txt"),
        r"vocab\.txt lists a word twice"),
}


@pytest.mark.parametrize("damage", list(LM_DAMAGE))
def test_damaged_lm_folder_is_named_and_rebuilt(fake_gutenberg, damage):
    good = _quiet(fake_gutenberg)
    folder = _lm_folder()
    spoil, message = LM_DAMAGE[damage]
    spoil(folder)
    with pytest.warns(CacheWarning, match=rf"ignoring the processed corpus {folder}.*{message}.*rebuilding"):
        rebuilt = fake_gutenberg()
    assert _same(rebuilt, good) and rebuilt.stats == good.stats
    assert _same(_quiet(fake_gutenberg), good)  # the folder was replaced by a good one
    _no_temporaries(config.cache_dir())


def test_cli_info_on_ids_beyond_the_vocabulary_warns_and_reports_the_rebuilt_corpus(fake_gutenberg, capsys):
    """The reported trial: a processed corpus with ids >= vocab_size was accepted by `hsm data info` (exit 0)."""
    assert cli.main(["info", "gutenberg", "--max-books", str(BOOKS), "--json"]) == 0
    good = json.loads(capsys.readouterr().out)
    folder = _lm_folder()
    _save(folder / "test.npy", np.load(folder / "test.npy") + good["vocab"])
    with pytest.warns(CacheWarning, match=r"test\.npy holds token ids in .* outside \[0, \d+\)"):
        assert cli.main(["info", "gutenberg", "--max-books", str(BOOKS), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == good
    assert int(np.load(folder / "test.npy").max()) < good["vocab"]  # the folder on disk was repaired


TOKEN_DAMAGE = {
    "ids beyond the types": (
        lambda f: _save(f / "ids.npy", np.load(f / "ids.npy") + 10_000), r"ids\.npy holds token ids in"),
    "truncated ids": (lambda f: (f / "ids.npy").write_bytes((f / "ids.npy").read_bytes()[:-3]),
                      r"ids\.npy cannot be loaded"),
    "offsets out of order": (
        lambda f: _save(f / "book_offsets.npy", np.load(f / "book_offsets.npy")[::-1].copy()),
        r"book_offsets\.npy does not run from 0"),
    "missing types.txt": (lambda f: (f / "types.txt").unlink(), r"types\.txt is missing"),
    "missing stats.json": (lambda f: (f / "stats.json").unlink(), r"stats\.json is missing"),
    "other selection": (
        lambda f: (f / "stats.json").write_text(json.dumps({**json.loads((f / "stats.json").read_text()),
                                                            "books": 2})),
        r"counts 2 books, the selection has"),
    "a type never used": (
        lambda f: _save(f / "ids.npy", np.where(np.load(f / "ids.npy") == 5, 6, np.load(f / "ids.npy"))
                        .astype(np.int32)),
        r"ids\.npy never uses 1 of the types"),
    "eos count": (
        lambda f: (f / "stats.json").write_text(json.dumps({**json.loads((f / "stats.json").read_text()),
                                                            "eos_tokens": 3})),
        r"ids\.npy holds \d+ <eos> tokens but stats\.json says 3"),
    "type repeated": (
        lambda f: _repeat_a_line(f / "types.txt"),
        r"types\.txt lists a type twice"),
}


@pytest.mark.parametrize("damage", list(TOKEN_DAMAGE))
def test_damaged_token_folder_is_named_and_rebuilt(fake_gutenberg, damage):
    """The tokenized books feed the passage classification set (and the LM build): same checks there."""
    good = _quiet(lambda: load_text_classification("gutenberg-books", max_books=BOOKS))
    spoil, message = TOKEN_DAMAGE[damage]
    spoil(_tokens_folder())
    with pytest.warns(CacheWarning, match=rf"{_tokens_folder()}.*{message}"):
        again = load_text_classification("gutenberg-books", max_books=BOOKS)
    assert again.label_names == good.label_names and np.array_equal(again.train_labels, good.train_labels)
    assert np.array_equal(again.train_texts.values, good.train_texts.values)
    assert again.train_texts.vocab == good.train_texts.vocab
    _quiet(lambda: load_text_classification("gutenberg-books", max_books=BOOKS))


def test_interrupted_build_leaves_nothing_that_looks_complete(fake_gutenberg, monkeypatch):
    """A build killed while writing (here: an error in the last write) installs no folder; the next call builds."""
    real_dumps = json.dumps

    def dying_dumps(obj, *args, **kwargs):
        if isinstance(obj, dict) and "vocab_size" in obj:
            raise KeyboardInterrupt  # as if killed while writing stats.json
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(gutenberg.json, "dumps", dying_dumps)
    with pytest.raises(KeyboardInterrupt):
        fake_gutenberg()
    monkeypatch.setattr(gutenberg.json, "dumps", real_dumps)
    assert list((config.cache_dir() / "gutenberg" / "processed").glob("lm-*")) == []
    _no_temporaries(config.cache_dir())
    # A temporary folder left by a killed process (kill -9: no clean-up at all) is never read.
    leftover = config.cache_dir() / "gutenberg" / "processed" / ".lm-0000.part-99999-dead"
    leftover.mkdir()
    (leftover / "train.npy").write_bytes(b"half")
    _quiet(fake_gutenberg)


def test_unwritable_cache_builds_the_corpus_in_memory(fake_gutenberg, tmp_path, monkeypatch, read_only):
    good = _quiet(fake_gutenberg)
    cache = read_only(tmp_path / "ro-cache")
    monkeypatch.setenv(config.CACHE_ENV, str(cache))
    with pytest.warns(CacheWarning) as caught:
        corpus = fake_gutenberg()
    messages = " | ".join(str(w.message) for w in caught)
    assert "reading the verified mirror file" in messages
    assert "cannot save the processed corpus" in messages and "used from memory" in messages
    untimed = lambda stats: {k: v for k, v in stats.items() if not k.endswith("seconds")}  # noqa: E731
    assert _same(corpus, good) and untimed(corpus.stats) == untimed(good.stats)


def test_cli_build_writes_its_report_atomically(fake_gutenberg, tmp_path, capsys):
    report = tmp_path / "reports" / "build.json"
    assert cli.main(["build", "gutenberg", "--max-books", str(BOOKS), "--vocab-size", str(VOCAB),
                     "--report", str(report)]) == 0
    assert json.loads(report.read_text())["counts"]["vocab"] <= VOCAB
    _no_temporaries(report.parent)
    capsys.readouterr()
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    assert cli.main(["build", "gutenberg", "--max-books", str(BOOKS), "--vocab-size", str(VOCAB),
                     "--report", str(blocked / "build.json")]) == 1
    assert "a-file" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["sha256", "stats", "settings", "name"])
def test_a_prebuilt_corpus_description_missing_a_field_is_a_named_error(tmp_path, missing):
    """A corpus.json cut short or edited (no sha256, no stats, ...): one line naming the file and
    the field, on every rerun, instead of a KeyError."""
    from hsm_lab.data.errors import CorruptArchiveError

    meta = {"format": gutenberg.PREBUILT_FORMAT, "name": "gutenberg", "settings": {}, "sha256": {}, "stats": {}}
    del meta[missing]
    (tmp_path / "corpus.json").write_text(json.dumps(meta))
    with pytest.raises(CorruptArchiveError) as error:
        gutenberg.load_prebuilt_lm(tmp_path, max_books=3, vocab_size=120)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / "corpus.json") in message
    assert f"has no '{missing}'" in message and "export the corpus again" in message


@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_data_export_to_a_file_is_refused_before_the_corpus_is_built(tmp_path, capsys, monkeypatch, where):
    monkeypatch.setattr(gutenberg, "load_gutenberg", lambda *a, **k: pytest.fail("the corpus was built"))
    (tmp_path / "a-file").write_text("x")
    assert cli.main(["export", "gutenberg", str(tmp_path / where)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / where) in err
    assert ("is a file: the export writes a folder" if where == "a-file" else "a-file is a file") in err
    assert (tmp_path / "a-file").read_text() == "x"
