"""Gutenberg: 678 Project Gutenberg books as a language-modelling corpus and as passage -> book classification.

The paper's Gutenberg corpus (ICML §7.2, Table 2; arXiv §7) has "about 50M tokens" and a 250,000-word
vocabulary; which books, which tokenizer and which split it used are not said. This
module builds **our** corpus from the 678-book archive of the data mirror; every choice below is ours.

Pipeline (one streaming pass over the archive, one book in memory at a time):

1. **Read** each selected book from ``gutenberg-books.tar.xz`` (mirror layout ``gutenberg/<Author>/<Title>.txt``) or
   from the GitHub archive of ``rcdm-uga/Gutenberg_Text`` (canonical download), where each book's git blob id is
   checked against ``MANIFEST.tsv``. Bytes are decoded as UTF-8, falling back to Latin-1 for the old files that are
   not UTF-8.
2. **Strip** the Project Gutenberg header and footer (:func:`strip_boilerplate`). The header ends at the first
   ``*** START OF THE/THIS PROJECT GUTENBERG EBOOK`` line, else at the end of the old "small print"
   (``*END*THE SMALL PRINT!``, ``SMALL PRINT! FOR __ COMPLETE SHAKESPEARE``). The footer starts at the first
   ``*** END OF ...``/``End of (the) Project Gutenberg ...``/``End of this Etext ...`` line after the start. A
   book lacking a marker keeps that end (it is counted in ``stats``). The World Library copyright notices
   ``<<THIS ELECTRONIC VERSION ... >>`` scattered inside the Shakespeare files are removed.
3. **Tokenize** (:func:`tokenize`): typographic quotes to ASCII (lower-casing is an option, off for the LM corpus
   and on for passage classification), then the regular expression ``\\w+|[^\\w\\s]`` (runs of letters and
   digits, and every other non-space character on its own: ``don't`` -> ``don ' t``), the tokenizer the mirror's
   README counts with. Each paragraph (text between blank lines) ends with ``<eos>``, so the LM sees paragraph
   boundaries much as PTB's LM sees sentence ends; line breaks inside a paragraph are hard wraps and are ignored.
4. **Split by book** (:func:`book_order`, :func:`book_split`): the manifest's books are shuffled once with
   ``numpy.random.default_rng(BOOK_ORDER_SEED)``; the book at position ``p`` of that order goes to *valid* if
   ``p % 10 == 0``, *test* if ``p % 10 == 1``, else *train* (68 / 68 / 542 books: 10 % / 10 % / 80 % of the books).
   ``max_books=n`` takes the first ``n`` books of the order, so each book's split never depends on ``n`` and
   ``n >= 3`` gives at least one book per split.
   Two other splits exist to measure how much the split moves perplexity (:func:`split_pieces`): another draw of
   the book split (``split_seed``: the selected books are reshuffled with that seed and the same rule applied), and
   a split *inside* books (``split="chunks"``: every book is cut into consecutive ``chunk_tokens``-token pieces,
   the pieces of all books are shuffled and dealt by the same rule, and each split keeps its pieces in book
   order).
5. **Vocabulary**: the ``vocab_size - 1`` most frequent training types (ties alphabetically) plus ``<unk>``; every
   other token maps to ``<unk>``. Ids are sorted by decreasing training count. ``min_count=k`` also drops the
   types seen fewer than ``k`` times in training.

Processed token ids are cached as ``.npy`` under ``hsm_lab.config.cache_dir()/gutenberg/processed/<key>/`` where the key
hashes the archive checksum, the pipeline version, the book selection and the vocabulary size, so a second call
with the same configuration only loads arrays.

Processed folders are derived data, so they are checked, not trusted. A folder is built in a temporary sibling
(``stats.json`` written last, every file fsynced) and renamed into place, so it is either complete or absent. On
loading, ``stats.json`` is the metadata every other file is checked against: each ``.npy`` must load and have the
dtype and length ``stats.json`` implies, ``types.txt`` / ``vocab.txt`` the number of lines it gives, the book
offsets must be consistent, and every token id must lie in ``[0, number of types)`` (one min/max pass). A folder
that fails any check (a truncated ``.npy``, a missing ``stats.json`` or ``vocab.txt``, out-of-range ids, and
in-range damage: negative counts, counts that are not the training split's, a repeated word or type, a type
``ids.npy`` never uses, an ``<eos>`` count other than ``stats.json``'s) is
treated as absent: a :class:`~hsm_lab.data.errors.CacheWarning` names the file and the problem, and the folder is
rebuilt from the verified archive and replaced. If the cache cannot be written, the corpus is built in memory and
used, with a :class:`~hsm_lab.data.errors.CacheWarning` (it is rebuilt on the next call).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
import warnings
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hsm_lab import config
from hsm_lab.data.errors import CacheWarning, CorruptArchiveError, EmptyCorpusError
from hsm.atomic import atomic_directory, atomic_write
from hsm_lab.data.fetch import fetch_file, is_write_error, iter_tar_members
from hsm_lab.data.lm import EOS, UNK, LMCorpus
from hsm_lab.data.registry import GUTENBERG_COMMIT, GUTENBERG_GITHUB_ARCHIVE, SOURCES  # noqa: F401 (re-exported)

#: Seed of the one shuffle of the manifest that fixes book order (and so the split and the quick slices).
BOOK_ORDER_SEED = 20170806
#: Bump when stripping or tokenizing changes: it is part of every cache key.
PIPELINE_VERSION = 1
#: Books in the quick-mode slice (``HSM_SCALE=quick``): the first 10 of the book order, 8 / 1 / 1 by split.
QUICK_BOOKS = 10
#: Positions ``p % 10`` of the book order that go to valid and test (10 % each); the rest is train.
VALID_RESIDUE, TEST_RESIDUE, SPLIT_MODULUS = 0, 1, 10
#: How the held-out text is chosen: whole books (ours and, we assume, the paper's) or pieces inside books.
SPLIT_KINDS = ("books", "chunks")
#: Tokens per piece of ``split="chunks"``.
CHUNK_TOKENS = 2000

TOKEN_PATTERN = r"\w+|[^\w\s]"
_TOKEN_RE = re.compile(TOKEN_PATTERN)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
# A paragraph break becomes this character before tokenizing: [^\w\s] makes it a one-character token, which
# the type table maps to <eos> (id 0). It never occurs in the books (checked by the tokenizer).
_EOS_CHAR = "\x00"

_START_MARKERS = [
    re.compile(r"^\W*\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG", re.I | re.M),
    re.compile(r"^\W*\*?\s*END\W*THE SMALL PRINT", re.I | re.M),
    re.compile(r"^\W*\**\s*SMALL PRINT!? FOR .*COMPLETE SHAKESPEARE", re.I | re.M),
]
_END_MARKER = re.compile(
    r"^\W*(?:the\s+)?end\s+of\s+(?:(?:the|this)\s+)?(?:project\s+gutenberg|etext|e-text|ebook)", re.I | re.M
)
# Typographic quotes become ASCII ones, so that "don’t" and "don't" tokenize alike.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_WORLD_LIBRARY_NOTICE = re.compile(r"<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS.*?>>", re.S)


# ---------------------------------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class ManifestEntry:
    """One book: ``path`` is ``<Author>/<Title>.txt`` as in the repository; ``git_blob`` its git object id."""

    path: str
    git_blob: str
    size: int
    regex_tokens: int

    @property
    def author(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def title(self) -> str:
        return self.path.split("/", 1)[1].removesuffix(".txt")


def read_manifest(path: Path | None = None) -> list[ManifestEntry]:
    """Parse ``MANIFEST.tsv`` (fetched and verified unless ``path`` is given).

    Lines are split on ``\\n`` only: some titles contain a carriage return, which ``str.splitlines`` would break.
    """
    path = path or fetch_file(SOURCES["gutenberg"].file("gutenberg/MANIFEST.tsv"))
    entries = []
    for line in Path(path).read_bytes().decode("utf-8").split("\n"):
        if not line or line.startswith("#") or line.startswith("path\t"):
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise CorruptArchiveError(f"{path}: malformed manifest line {line!r}. Fix: fetch gutenberg again.")
        entries.append(ManifestEntry(fields[0], fields[1], int(fields[2]), int(fields[3])))
    if not entries:
        raise EmptyCorpusError(f"{path} lists no books. Fix: fetch gutenberg again.")
    return entries


def book_order(entries: list[ManifestEntry]) -> list[ManifestEntry]:
    """The manifest shuffled once with ``BOOK_ORDER_SEED`` (sorted by path first, so the file's order is moot)."""
    entries = sorted(entries, key=lambda entry: entry.path)
    permutation = np.random.default_rng(BOOK_ORDER_SEED).permutation(len(entries))
    return [entries[i] for i in permutation]


def book_split(position: int) -> str:
    """Split of the book at ``position`` of :func:`book_order`: valid, test or train (10 / 10 / 80 %)."""
    residue = position % SPLIT_MODULUS
    return "valid" if residue == VALID_RESIDUE else "test" if residue == TEST_RESIDUE else "train"


def split_pieces(book_lengths: list[int] | np.ndarray, split: str = "books", split_seed: int | None = None,
                 chunk_tokens: int = CHUNK_TOKENS) -> dict[str, list[tuple[int, int, int]]]:
    """The pieces ``(book index, start, end)`` (token positions inside the book) that make up each split, in the
    order the split concatenates them; books are indexed in :func:`book_order`.

    ``split="books"`` with ``split_seed`` None is the corpus' split (:func:`book_split` of each book's position);
    another ``split_seed`` reshuffles the books with ``numpy.random.default_rng(split_seed)`` before the same rule.
    ``split="chunks"`` cuts every book into consecutive ``chunk_tokens``-token pieces (the last one shorter),
    shuffles all pieces with the seed (default :data:`BOOK_ORDER_SEED`) and deals them by the same rule; each split
    keeps its pieces in book order.
    """
    if split not in SPLIT_KINDS:
        raise ValueError(f"split must be one of {SPLIT_KINDS}, got {split!r}")
    if not isinstance(chunk_tokens, int) or isinstance(chunk_tokens, bool) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
    lengths = [int(n) for n in book_lengths]
    if split == "books":
        pieces = [(i, 0, n) for i, n in enumerate(lengths)]
        seed = split_seed
    else:
        pieces = [(i, start, min(start + chunk_tokens, n)) for i, n in enumerate(lengths)
                  for start in range(0, n, chunk_tokens)]
        seed = BOOK_ORDER_SEED if split_seed is None else split_seed
    position = np.arange(len(pieces))
    if seed is not None:
        position[np.random.default_rng(seed).permutation(len(pieces))] = np.arange(len(pieces))
    out: dict[str, list[tuple[int, int, int]]] = {"train": [], "valid": [], "test": []}
    for piece, p in zip(pieces, position):
        out[book_split(int(p))].append(piece)
    return out


def books_for_scale(scale: str | None = None) -> int | None:
    """``max_books`` for a scale: :data:`QUICK_BOOKS` when quick, None (all 678) when full (default: ``HSM_SCALE``)."""
    scale = scale or config.scale()
    if scale not in ("quick", "full"):
        raise ValueError(f"scale must be 'quick' or 'full', got {scale!r}")
    return None if scale == "full" else QUICK_BOOKS


def select_books(max_books: int | None = None) -> list[ManifestEntry]:
    """The first ``max_books`` books of :func:`book_order` (all 678 for None)."""
    ordered = book_order(read_manifest())
    if max_books is None:
        return ordered
    if not isinstance(max_books, int) or isinstance(max_books, bool) or max_books < 1:
        raise ValueError(f"max_books must be a positive int or None, got {max_books!r}")
    return ordered[:max_books]


# ------------------------------------------------------------------------------------------ reading and cleaning


def git_blob_id(content: bytes) -> str:
    """Git's object id of a file: sha1 of ``b"blob <size>\\0" + content``."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def decode_book(raw: bytes) -> str:
    """UTF-8 (BOM dropped), else Latin-1; Windows line ends normalized to ``\\n``."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_boilerplate(text: str) -> tuple[str, bool, bool]:
    """The body of a Project Gutenberg file, and whether a start and an end marker were found.

    See the module docstring for the markers. Without a start marker the text starts at the top; without an end
    marker it runs to the bottom.
    """
    start = 0
    found_start = False
    for marker in _START_MARKERS:
        match = marker.search(text)
        if match:
            line_end = text.find("\n", match.end())
            start = len(text) if line_end < 0 else line_end + 1
            found_start = True
            break
    end_match = _END_MARKER.search(text, start)
    end = end_match.start() if end_match else len(text)
    body = _WORLD_LIBRARY_NOTICE.sub(" ", text[start:end])
    return body.strip(), found_start, end_match is not None


def tokenize(text: str, paragraphs: bool = True, lowercase: bool = True) -> list[str]:
    """``\\w+|[^\\w\\s]`` tokens (lower-cased by default); with ``paragraphs``, ``<eos>`` after every paragraph."""
    if lowercase:
        text = text.lower()
    text = text.replace(_EOS_CHAR, " ").translate(_QUOTES)
    if not paragraphs:
        return _TOKEN_RE.findall(text)
    tokens = _TOKEN_RE.findall(_PARAGRAPH_BREAK.sub(f" {_EOS_CHAR} ", text.strip()))
    tokens = [EOS if token == _EOS_CHAR else token for token in tokens]
    if tokens and tokens[-1] != EOS:
        tokens.append(EOS)
    return tokens


def iter_books(selection: list[ManifestEntry]) -> Iterator[tuple[ManifestEntry, bytes]]:
    """Stream ``(entry, raw bytes)`` for the selected books, in archive order, stopping once all are read.

    From the mirror's archive (sha256-verified as a whole) or from the GitHub archive (each book verified against
    its git blob id). A book missing from the archive raises :class:`CorruptArchiveError`.
    """
    archive = fetch_file(SOURCES["gutenberg"].file("gutenberg/gutenberg-books.tar.xz"))
    github_layout = archive.name.startswith("Gutenberg_Text-")
    wanted = {entry.path: entry for entry in selection}
    for member, content in iter_tar_members(archive):
        if github_layout:
            # Gutenberg_Text-<commit>/<...>/<Author>/<Title>.txt: match on the trailing <Author>/<Title>.txt
            parts = member.split("/")
            path = "/".join(parts[-2:]) if len(parts) >= 2 else member
        else:
            path = member.removeprefix("gutenberg/")
        entry = wanted.pop(path, None)
        if entry is None:
            continue
        if github_layout and git_blob_id(content) != entry.git_blob:
            raise CorruptArchiveError(
                f"{archive}: {path} does not match its git blob id {entry.git_blob} in MANIFEST.tsv. "
                f"Fix: delete {archive} and run `python -m hsm data fetch gutenberg` again."
            )
        yield entry, content
        if not wanted:
            return
    if wanted:
        missing = sorted(wanted)
        raise CorruptArchiveError(
            f"{archive} lacks {len(missing)} book(s) of the manifest, e.g. {missing[:3]}. "
            f"Fix: delete it and run `python -m hsm data fetch gutenberg` again."
        )


# ----------------------------------------------------------------------------------------------- tokenized books


@dataclass
class TokenizedBooks:
    """Every selected book as ids into one table of all types (``types[0] == '<eos>'``), books concatenated.

    ``book_offsets[i]:book_offsets[i+1]`` are the ids of ``books[i]`` (in :func:`book_order`). ``stats`` counts
    books without start/end markers and tokens.
    """

    types: list[str]
    ids: np.ndarray  # int32
    book_offsets: np.ndarray  # int64, len(books) + 1
    books: list[ManifestEntry]
    stats: dict[str, object]

    def book_ids(self, i: int) -> np.ndarray:
        return self.ids[self.book_offsets[i] : self.book_offsets[i + 1]]


def _selection_key(selection: list[ManifestEntry], *extra: object) -> str:
    archive = SOURCES["gutenberg"].file("gutenberg/gutenberg-books.tar.xz")
    digest = hashlib.sha256()
    digest.update(f"{PIPELINE_VERSION}|{archive.sha256}|{TOKEN_PATTERN}|{extra}".encode())
    for entry in selection:
        digest.update(f"\n{entry.path}\t{entry.git_blob}".encode())
    return digest.hexdigest()[:16]


def _processed_dir(kind: str, key: str) -> Path:
    return config.cache_dir() / "gutenberg" / "processed" / f"{kind}-{key}"


# ------------------------------------------------------------------------------ processed folders: save, check, load


class _BadProcessedFolder(Exception):
    """A processed folder exists but fails a check; the message names the file and the problem."""


def _save_processed(directory: Path, write, *, replace: bool) -> None:
    """Install ``directory`` atomically (``write`` fills it, ``stats.json`` last); on an unwritable cache, warn."""
    try:
        atomic_directory(directory, write, replace=replace)
    except OSError as exc:
        if not is_write_error(exc):
            raise
        warnings.warn(f"cannot save the processed corpus to {directory} ({exc.strerror or exc}): it is used from "
                      f"memory and will be rebuilt on the next call. Fix: set {config.CACHE_ENV} to a writable "
                      f"directory.", CacheWarning, stacklevel=3)


def _rebuild_warning(directory: Path, exc: _BadProcessedFolder) -> None:
    warnings.warn(f"ignoring the processed corpus {directory}: {exc}. It is derived data: rebuilding it from the "
                  f"verified archive (minutes for all 678 books).", CacheWarning, stacklevel=3)


def _read_stats(directory: Path) -> dict[str, object]:
    path = directory / "stats.json"
    if not path.is_file():
        raise _BadProcessedFolder(f"{path} is missing (an unfinished or damaged build)")
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _BadProcessedFolder(f"{path} cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(stats, dict):
        raise _BadProcessedFolder(f"{path} holds a {type(stats).__name__}, not a JSON object")
    return stats


def _stat_count(stats: dict[str, object], key: str, directory: Path) -> int:
    value = stats.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _BadProcessedFolder(f"{directory / 'stats.json'} has no valid count {key!r} (got {value!r})")
    return value


def _read_lines(path: Path, count: int) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError as exc:
        raise _BadProcessedFolder(f"{path} is missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _BadProcessedFolder(f"{path} cannot be read ({type(exc).__name__}: {exc})") from exc
    if len(lines) != count:
        raise _BadProcessedFolder(f"{path} has {len(lines)} lines but stats.json says {count}")
    return lines


def _read_array(path: Path, dtype: type, length: int, id_bound: int | None = None) -> np.ndarray:
    """``np.load(path)``, checked: 1-D, ``dtype``, ``length`` entries, and ids in ``[0, id_bound)`` if given."""
    try:
        values = np.load(path, allow_pickle=False)
    except FileNotFoundError as exc:
        raise _BadProcessedFolder(f"{path} is missing") from exc
    except (OSError, ValueError, EOFError) as exc:  # a truncated .npy: ValueError (cannot reshape) or EOFError
        raise _BadProcessedFolder(f"{path} cannot be loaded ({type(exc).__name__}: {exc})") from exc
    if not isinstance(values, np.ndarray):  # np.load returns an NpzFile for a zip archive
        raise _BadProcessedFolder(f"{path} is not a .npy array file ({type(values).__name__})")
    if values.dtype != np.dtype(dtype) or values.shape != (length,):
        raise _BadProcessedFolder(f"{path} holds {values.dtype} of shape {values.shape} but stats.json implies "
                                  f"{np.dtype(dtype)} of shape ({length},)")
    if id_bound is not None and values.size:
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= id_bound:
            raise _BadProcessedFolder(f"{path} holds token ids in [{low}, {high}], outside [0, {id_bound}) "
                                      f"(the number of entries of its vocabulary)")
    return values


def _read_tokens_folder(directory: Path, selection: list[ManifestEntry]) -> TokenizedBooks:
    """Load a ``tokens-<key>`` folder, checking every file against ``stats.json`` (raises _BadProcessedFolder)."""
    stats = _read_stats(directory)
    n_books = _stat_count(stats, "books", directory)
    n_tokens = _stat_count(stats, "tokens_with_eos", directory)
    n_types = _stat_count(stats, "types", directory)
    if n_books != len(selection):
        raise _BadProcessedFolder(f"{directory / 'stats.json'} counts {n_books} books, the selection has "
                                  f"{len(selection)}")
    types = _read_lines(directory / "types.txt", n_types)
    if not types or types[0] != EOS:
        raise _BadProcessedFolder(f"{directory / 'types.txt'} does not start with {EOS}")
    offsets = _read_array(directory / "book_offsets.npy", np.int64, n_books + 1)
    if offsets[0] != 0 or offsets[-1] != n_tokens or np.any(np.diff(offsets) < 0):
        raise _BadProcessedFolder(f"{directory / 'book_offsets.npy'} does not run from 0 to {n_tokens} "
                                  f"(tokens_with_eos in stats.json) in non-decreasing steps")
    ids = _read_array(directory / "ids.npy", np.int32, n_tokens, id_bound=n_types)
    # in-range damage the metadata still catches: every type is used (types are created when
    # seen), each once in types.txt, and <eos> as often as stats.json counts it
    if len(set(types)) != len(types):
        raise _BadProcessedFolder(f"{directory / 'types.txt'} lists a type twice")
    uses = np.bincount(ids, minlength=n_types)
    if not (uses > 0).all():
        raise _BadProcessedFolder(f"{directory / 'ids.npy'} never uses {int((uses == 0).sum())} of the types in "
                                  f"types.txt (an id was changed)")
    if "eos_tokens" in stats and int(uses[0]) != stats["eos_tokens"]:
        raise _BadProcessedFolder(f"{directory / 'ids.npy'} holds {int(uses[0])} {EOS} tokens but stats.json says "
                                  f"{stats['eos_tokens']}")
    return TokenizedBooks(types=types, ids=ids, book_offsets=offsets, books=selection, stats=stats)


def _read_lm_folder(directory: Path) -> tuple[dict[str, np.ndarray], list[str], np.ndarray, dict[str, object]]:
    """Load an ``lm-<key>`` folder, checking every file against ``stats.json`` (raises _BadProcessedFolder)."""
    stats = _read_stats(directory)
    n_vocab = _stat_count(stats, "vocab_size", directory)
    vocab = _read_lines(directory / "vocab.txt", n_vocab)
    if UNK not in vocab:
        raise _BadProcessedFolder(f"{directory / 'vocab.txt'} lacks {UNK}")
    counts = _read_array(directory / "counts.npy", np.int64, n_vocab)
    splits = {split: _read_array(directory / f"{split}.npy", np.int32,
                                 _stat_count(stats, f"{split}_tokens", directory), id_bound=n_vocab)
              for split in ("train", "valid", "test")}
    # in-range damage the metadata still catches: counts are the training split's word counts
    # (the <unk> count included), so they are non-negative, sum to train_tokens and match the ids
    if len(set(vocab)) != len(vocab):
        raise _BadProcessedFolder(f"{directory / 'vocab.txt'} lists a word twice")
    if counts.size and counts.min() < 0:
        raise _BadProcessedFolder(f"{directory / 'counts.npy'} holds a negative count ({int(counts.min())})")
    if int(counts.sum()) != splits["train"].size:
        raise _BadProcessedFolder(f"{directory / 'counts.npy'} sums to {int(counts.sum())} but stats.json counts "
                                  f"{splits['train'].size} training tokens")
    mismatch = np.flatnonzero(np.bincount(splits["train"], minlength=n_vocab) != counts)
    if mismatch.size:
        raise _BadProcessedFolder(f"{directory / 'counts.npy'} does not match train.npy for {mismatch.size} words "
                                  f"(first: {vocab[int(mismatch[0])]!r})")
    return splits, vocab, counts, stats


def tokenized_books(
    max_books: int | None = None, *, lowercase: bool = True, progress: bool = True
) -> TokenizedBooks:
    """Read, strip and tokenize the selected books (cached; see the module docstring).

    A cached folder that fails its checks is rebuilt, with a :class:`~hsm_lab.data.errors.CacheWarning` naming it.
    """
    selection = select_books(max_books)
    directory = _processed_dir("tokens", _selection_key(selection, lowercase))
    stale = directory.exists()
    if stale:
        try:
            return _read_tokens_folder(directory, selection)
        except _BadProcessedFolder as exc:
            _rebuild_warning(directory, exc)
    books = _tokenize_books(selection, lowercase=lowercase, progress=progress)

    def write(folder: Path) -> None:
        np.save(folder / "ids.npy", books.ids)
        np.save(folder / "book_offsets.npy", books.book_offsets)
        (folder / "types.txt").write_text("\n".join(books.types), encoding="utf-8")
        (folder / "stats.json").write_text(json.dumps(books.stats, indent=1))  # last: marks the folder complete

    _save_processed(directory, write, replace=stale)
    return books


def _tokenize_books(selection: list[ManifestEntry], *, lowercase: bool, progress: bool) -> TokenizedBooks:
    from tqdm.auto import tqdm

    index: dict[str, int] = {EOS: 0}
    per_book: dict[str, array] = {}
    no_start: list[str] = []
    no_end: list[str] = []
    raw_tokens = 0
    started = time.perf_counter()
    bar = tqdm(total=len(selection), desc="tokenize gutenberg", unit="book", disable=not progress, leave=False)
    for entry, raw in iter_books(selection):
        text = decode_book(raw)
        body, has_start, has_end = strip_boilerplate(text)
        if not has_start:
            no_start.append(entry.path)
        if not has_end:
            no_end.append(entry.path)
        tokens = tokenize(body, lowercase=lowercase)
        raw_tokens += entry.regex_tokens
        # New types first, then one C-level map: ~10x faster than a Python loop over 50M tokens.
        for token in set(tokens).difference(index):
            index[token] = len(index)
        per_book[entry.path] = array("i", map(index.__getitem__, tokens))
        bar.update(1)
    bar.close()
    lengths = [len(per_book[entry.path]) for entry in selection]
    empty = [entry.path for entry, length in zip(selection, lengths) if length == 0]
    if empty:
        raise EmptyCorpusError(f"no tokens left after stripping the Gutenberg boilerplate of {empty[:3]}")
    offsets = np.zeros(len(selection) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.empty(int(offsets[-1]), dtype=np.int32)
    for i, entry in enumerate(selection):
        ids[offsets[i] : offsets[i + 1]] = np.frombuffer(per_book.pop(entry.path), dtype=np.int32)
    types = [""] * len(index)
    for token, token_id in index.items():
        types[token_id] = token
    stats = {
        "books": len(selection),
        "tokens_with_eos": int(offsets[-1]),
        "eos_tokens": int(np.count_nonzero(ids == 0)),
        "types": len(types),
        "regex_tokens_before_stripping": raw_tokens,
        "books_without_start_marker": no_start,
        "books_without_end_marker": no_end,
        "seconds": round(time.perf_counter() - started, 2),
    }
    return TokenizedBooks(types=types, ids=ids, book_offsets=offsets, books=selection, stats=stats)


# ----------------------------------------------------------------------------------------------- LM corpus


def load_gutenberg(
    max_books: int | None = None,
    vocab_size: int = 250_000,
    context: int | None = None,
    *,
    lowercase: bool = False,
    progress: bool = True,
    split: str = "books",
    split_seed: int | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    min_count: int = 1,
) -> LMCorpus:
    """The Gutenberg language-modelling corpus (our construction; see the module docstring).

    ``max_books`` takes the first books of the fixed book order (quick mode: a handful; None: all 678).
    ``vocab_size`` counts ``<unk>`` (paper: 250,000). ``context`` is the default ``T`` of
    :meth:`LMCorpus.windows` (paper: 4). Case is kept by default: lower-cased, the 542 training books have only
    about 206k types, so the paper's 250k cap would not bind; cased they have about 259k, and the cap keeps the
    250k most frequent, closest to the paper's setting. ``lowercase=True`` gives the lower-cased variant.
    ``split``, ``split_seed`` and ``chunk_tokens`` choose another split (:func:`split_pieces`), ``min_count`` drops
    the training types seen fewer times; these variants add ``-draw<seed>``, ``-chunks<n>`` and ``-min<k>`` to the
    corpus name.
    ``stats`` reports books and tokens per split, the number of training
    types, the vocabulary's coverage of the training tokens and the out-of-vocabulary rate of each split.

    The processed corpus is cached and checked on loading (see the module docstring): a damaged cached folder is
    rebuilt with a :class:`~hsm_lab.data.errors.CacheWarning` naming the file at fault, never used.
    """
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2 (it counts <unk>), got {vocab_size!r}")
    if not isinstance(min_count, int) or isinstance(min_count, bool) or min_count < 1:
        raise ValueError(f"min_count must be an int >= 1, got {min_count!r}")
    if split_seed is not None and (not isinstance(split_seed, int) or isinstance(split_seed, bool)):
        raise ValueError(f"split_seed must be an int or None, got {split_seed!r}")
    split_pieces([], split, split_seed, chunk_tokens)  # checks split and chunk_tokens before any work
    selection = select_books(max_books)
    if len(selection) < 3:
        raise ValueError(f"max_books={max_books} gives {len(selection)} book(s); at least 3 are needed "
                         f"(one per split)")
    variant = _variant(split, split_seed, chunk_tokens, min_count)
    # the corpus' own split and vocabulary keep the cache key they always had
    directory = _processed_dir("lm", _selection_key(selection, lowercase, vocab_size, *variant.values()))
    stale = directory.exists()
    loaded = None
    if stale:
        try:
            loaded = _read_lm_folder(directory)
        except _BadProcessedFolder as exc:
            _rebuild_warning(directory, exc)
    if loaded is None:
        corpus_arrays, vocab, counts, stats = _build_lm(selection, max_books, vocab_size, lowercase, progress,
                                                        split, split_seed, chunk_tokens, min_count)

        def write(folder: Path) -> None:
            for split, array_ in corpus_arrays.items():
                np.save(folder / f"{split}.npy", array_)
            np.save(folder / "counts.npy", counts)
            (folder / "vocab.txt").write_text("\n".join(vocab), encoding="utf-8")
            (folder / "stats.json").write_text(json.dumps(stats, indent=1))  # last: marks the folder complete

        _save_processed(directory, write, replace=stale)
        # The arrays just built are what the folder holds; JSON round-trips the stats unchanged.
        loaded = corpus_arrays, vocab, counts, json.loads(json.dumps(stats))
    arrays, vocab, counts, stats = loaded
    splits = {split: torch.from_numpy(arrays[split].astype(np.int64)) for split in ("train", "valid", "test")}
    return LMCorpus(
        name=("gutenberg" if max_books is None else f"gutenberg-{len(selection)}books")
        + ("-lowercase" if lowercase else "") + "".join(f"-{k}{v}" for k, v in variant.items()),
        vocab=vocab,
        counts=counts,
        context=context,
        stats=stats,
        **splits,
    )


def _variant(split: str, split_seed: int | None, chunk_tokens: int, min_count: int) -> dict[str, int]:
    """What differs from the corpus' own split and vocabulary, as name parts (empty: nothing)."""
    variant: dict[str, int] = {}
    if split == "chunks":
        variant["chunks"] = chunk_tokens
    if split_seed is not None and not (split == "chunks" and split_seed == BOOK_ORDER_SEED):
        variant["draw"] = split_seed
    if min_count > 1:
        variant["min"] = min_count
    return variant


def split_segments(max_books: int | None = None, *, lowercase: bool = False, split: str = "books",
                   split_seed: int | None = None, chunk_tokens: int = CHUNK_TOKENS
                   ) -> dict[str, list[tuple[str, int, int]]]:
    """Where each book's text lies in each split of :func:`load_gutenberg` with the same arguments:
    ``(book path, start, end)`` token positions in the split's array, one entry per piece (a book may have
    many pieces with ``split="chunks"``). Reads the cached tokenized books, not the corpus."""
    books = tokenized_books(max_books, lowercase=lowercase, progress=False)
    lengths = np.diff(books.book_offsets)
    out: dict[str, list[tuple[str, int, int]]] = {}
    for name, pieces in split_pieces(lengths, split, split_seed, chunk_tokens).items():
        at, segments = 0, []
        for book, start, end in pieces:
            segments.append((books.books[book].path, at, at + end - start))
            at += end - start
        out[name] = segments
    return out


def _build_lm(selection, max_books, vocab_size, lowercase, progress, split="books", split_seed=None,
              chunk_tokens=CHUNK_TOKENS, min_count=1):
    books = tokenized_books(max_books, lowercase=lowercase, progress=progress)
    pieces = split_pieces(np.diff(books.book_offsets), split, split_seed, chunk_tokens)

    def piece_ids(book: int, start: int, end: int) -> np.ndarray:
        return books.book_ids(book)[start:end]

    n_types = len(books.types)
    train_counts = np.zeros(n_types, dtype=np.int64)
    for piece in pieces["train"]:
        train_counts += np.bincount(piece_ids(*piece), minlength=n_types)
    seen = np.flatnonzero(train_counts >= min_count)
    # Decreasing count, ties alphabetically: lexsort's last key is the primary one.
    type_strings = np.array(books.types, dtype=object)[seen]
    order = seen[np.lexsort((type_strings, -train_counts[seen]))]
    kept = order[: vocab_size - 1]
    unk_count = int(train_counts.sum() - train_counts[kept].sum())
    # Place <unk> by its training count among the kept types, so ids stay in decreasing-count order.
    kept_counts = train_counts[kept]
    unk_position = int(np.searchsorted(-kept_counts, -unk_count, side="right"))
    vocab_types = list(kept[:unk_position]) + [-1] + list(kept[unk_position:])
    vocab = [UNK if t < 0 else books.types[t] for t in vocab_types]
    counts = np.array([unk_count if t < 0 else train_counts[t] for t in vocab_types], dtype=np.int64)
    unk_id = unk_position
    lookup = np.full(n_types, unk_id, dtype=np.int32)
    lookup[np.array([t for t in vocab_types if t >= 0], dtype=np.int64)] = np.array(
        [i for i, t in enumerate(vocab_types) if t >= 0], dtype=np.int32
    )
    arrays: dict[str, np.ndarray] = {}
    stats: dict[str, object] = {
        "books": len(selection),
        "vocab_size": len(vocab),
        "train_types": int(np.count_nonzero(train_counts)),
        "book_order_seed": BOOK_ORDER_SEED,
        "split_rule": f"position p of the book order: p % {SPLIT_MODULUS} == {VALID_RESIDUE} valid, "
        f"== {TEST_RESIDUE} test, else train",
        **({} if split == "books" and split_seed is None else {
            "split": split, "split_seed": split_seed,
            **({"chunk_tokens": chunk_tokens} if split == "chunks" else {})}),
        **({"min_count": min_count, "types_below_min_count": int(np.count_nonzero(train_counts)) - int(seen.size)}
           if min_count > 1 else {}),
        "tokenizer": f"{'lower-case, ' if lowercase else ''}curly quotes to ASCII, regex {TOKEN_PATTERN}, "
        "<eos> after each paragraph",
        **{f"tokenize_{k}": v for k, v in books.stats.items()},
    }
    for part in ("train", "valid", "test"):
        ids = [lookup[piece_ids(*piece)] for piece in pieces[part]]
        arrays[part] = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
        n_tokens = int(arrays[part].size)
        n_unk = int(np.count_nonzero(arrays[part] == unk_id))
        stats[f"{part}_books"] = len({book for book, _, _ in pieces[part]})
        if split == "chunks":
            stats[f"{part}_pieces"] = len(pieces[part])
        stats[f"{part}_tokens"] = n_tokens
        stats[f"{part}_oov_rate"] = n_unk / n_tokens if n_tokens else 0.0
    stats["train_coverage"] = 1.0 - stats["train_oov_rate"]
    return arrays, vocab, counts, stats


# ------------------------------------------------------------------------------------------ prebuilt corpus

#: Environment variable naming a folder written by :func:`export_lm_corpus`: the LM experiments then load the
#: Gutenberg corpus from it (:func:`load_prebuilt_lm`) instead of building it from the archive.
PREBUILT_ENV = "HSM_PREBUILT_CORPUS"
#: Version of the prebuilt folder's layout; a loader refuses another one.
PREBUILT_FORMAT = 1
_PREBUILT_SPLITS = ("train", "valid", "test")


def _prebuilt_settings(max_books: int | None, vocab_size: int, lowercase: bool, variant: dict[str, int]
                       ) -> dict[str, object]:
    """What makes two corpora the same: the settings of :func:`load_gutenberg`, the pipeline version and the
    archive's checksum (a constant of the code, so it is checked without the archive at hand)."""
    archive = SOURCES["gutenberg"].file("gutenberg/gutenberg-books.tar.xz")
    return {"max_books": max_books, "vocab_size": vocab_size, "lowercase": lowercase, "variant": dict(variant),
            "pipeline_version": PIPELINE_VERSION, "archive_sha256": archive.sha256}


def _check_export_folder(directory: Path) -> None:
    """ValueError naming the fix when ``directory`` cannot be the export's folder: an existing file,
    a path below a file, or below a folder that cannot be written."""
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} is a file: the export writes a folder of files; give a folder's path "
                         f"(e.g. {directory.parent / (directory.stem + '-corpus')})")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{directory} cannot be created: {existing} is a file; give a folder's path elsewhere")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{directory} cannot be written: {existing} is read-only; give a folder's path elsewhere")


def export_lm_corpus(directory: Path, max_books: int | None = None, vocab_size: int = 250_000, *,
                     lowercase: bool = False, split: str = "books", split_seed: int | None = None,
                     chunk_tokens: int = CHUNK_TOKENS, min_count: int = 1, preset: int = 9,
                     progress: bool = False) -> dict[str, int]:
    """Write the corpus of :func:`load_gutenberg` (same arguments) to ``directory`` so that it can be used where
    the 61 MB archive cannot go: each split's token ids as little-endian uint32, xz-compressed
    (``train.u32.xz``, ``valid.u32.xz``, ``test.u32.xz``), the vocabulary (``vocab.txt.xz``, one word a line, in
    id order) and ``corpus.json`` (the settings, the corpus' stats and name, and the sha256 of every file before
    compression), written last. The training counts are not stored: they are the training ids' bincount.

    Each file is written atomically; returns the size in bytes of every file written. ``preset`` is the xz
    level (9: smallest, about a minute per 100 MB of ids on one core)."""
    import lzma

    directory = Path(directory)
    _check_export_folder(directory)  # before the corpus is built (minutes at full size)
    corpus = load_gutenberg(max_books, vocab_size, lowercase=lowercase, progress=progress, split=split,
                            split_seed=split_seed, chunk_tokens=chunk_tokens, min_count=min_count)
    directory.mkdir(parents=True, exist_ok=True)
    payloads = {f"{name}.u32.xz": getattr(corpus, name).numpy().astype("<u4").tobytes() for name in _PREBUILT_SPLITS}
    payloads["vocab.txt.xz"] = "\n".join(corpus.vocab).encode("utf-8")
    sizes: dict[str, int] = {}
    for name, raw in payloads.items():
        packed = lzma.compress(raw, format=lzma.FORMAT_XZ, preset=preset)
        atomic_write(directory / name, packed)
        sizes[name] = len(packed)
    meta = {"format": PREBUILT_FORMAT, "name": corpus.name,
            "settings": _prebuilt_settings(max_books, vocab_size, lowercase,
                                           _variant(split, split_seed, chunk_tokens, min_count)),
            "tokens": {name: int(getattr(corpus, name).numel()) for name in _PREBUILT_SPLITS},
            "sha256": {name: hashlib.sha256(raw).hexdigest() for name, raw in payloads.items()},
            "stats": corpus.stats}
    text = json.dumps(meta, indent=1, ensure_ascii=False)
    atomic_write(directory / "corpus.json", text)
    sizes["corpus.json"] = len(text.encode("utf-8"))
    return sizes


def load_prebuilt_lm(directory: Path, max_books: int | None = None, vocab_size: int = 250_000,
                     context: int | None = None, *, lowercase: bool = False, split: str = "books",
                     split_seed: int | None = None, chunk_tokens: int = CHUNK_TOKENS, min_count: int = 1) -> LMCorpus:
    """The corpus :func:`export_lm_corpus` wrote to ``directory``: the same :class:`LMCorpus` that
    :func:`load_gutenberg` gives with these arguments, without the archive or the manifest.

    Raises ValueError when the folder was exported with other settings (naming both), and
    :class:`~hsm_lab.data.errors.CorruptArchiveError` for a missing, undecodable or altered file (its sha256 is
    checked), each naming the fix."""
    import lzma

    directory = Path(directory)
    meta_path = directory / "corpus.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorruptArchiveError(f"{meta_path} is missing. Fix: export the corpus with `python -m hsm data export "
                                  f"gutenberg {directory}`") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptArchiveError(f"{meta_path} cannot be read ({exc}). Fix: export the corpus again") from None
    if not isinstance(meta, dict) or meta.get("format") != PREBUILT_FORMAT:
        raise CorruptArchiveError(f"{meta_path} is not a prebuilt corpus of format {PREBUILT_FORMAT}. Fix: export "
                                  f"the corpus again with this version")
    for key, kind in (("name", str), ("settings", dict), ("sha256", dict), ("stats", dict)):
        if not isinstance(meta.get(key), kind):
            found = "has no" if key not in meta else f"has a {type(meta[key]).__name__} as"
            raise CorruptArchiveError(f"{meta_path} {found} '{key}' (a {kind.__name__} in an exported corpus): it was "
                                      f"edited or cut short. Fix: export the corpus again")
    wanted = _prebuilt_settings(max_books, vocab_size, lowercase, _variant(split, split_seed, chunk_tokens, min_count))
    if meta.get("settings") != wanted:
        have = meta.get("settings") or {}
        diff = ", ".join(f"{k}={have.get(k)!r} (wanted {v!r})" for k, v in wanted.items() if have.get(k) != v)
        raise ValueError(f"prebuilt corpus {directory} differs from the requested one: {diff}. Fix: export it with "
                         f"these settings, or unset {PREBUILT_ENV}")

    def read(name: str) -> bytes:
        path = directory / name
        try:
            raw = lzma.decompress(path.read_bytes())
        except FileNotFoundError:
            raise CorruptArchiveError(f"{path} is missing. Fix: copy every file of the exported folder") from None
        except (OSError, lzma.LZMAError) as exc:
            raise CorruptArchiveError(f"{path} cannot be decompressed ({exc}). Fix: copy it again") from None
        if hashlib.sha256(raw).hexdigest() != meta["sha256"].get(name):
            raise CorruptArchiveError(f"{path} does not match the sha256 in corpus.json. Fix: copy it again")
        return raw

    vocab = read("vocab.txt.xz").decode("utf-8").split("\n")
    splits = {name: torch.from_numpy(np.frombuffer(read(f"{name}.u32.xz"), dtype="<u4").astype(np.int64))
              for name in _PREBUILT_SPLITS}
    high = max(int(ids.max()) if ids.numel() else -1 for ids in splits.values())
    if high >= len(vocab):
        raise CorruptArchiveError(f"{directory} holds token id {high} but its vocabulary has {len(vocab)} words. "
                                  f"Fix: export the corpus again")
    counts = np.bincount(splits["train"].numpy(), minlength=len(vocab)).astype(np.int64)
    return LMCorpus(name=meta["name"], vocab=vocab, counts=counts, context=context, stats=meta["stats"], **splits)


def prebuilt_directory() -> Path | None:
    """The folder named by :data:`PREBUILT_ENV`, or None when it is unset or empty."""
    value = os.environ.get(PREBUILT_ENV)
    return Path(value).expanduser() if value else None
