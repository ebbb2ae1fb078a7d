"""Data layer: registry, verified acquisition and loaders for every data set of the reproduction.

Language modelling: :func:`load_ptb`, :func:`load_gutenberg` return an :class:`LMCorpus`.
Classification: :func:`load_text_classification` (``cooking``, ``gutenberg-books``, ``trec-coarse``,
``trec-fine``, ``20ng``, ``r8``, ``r52``) and :func:`load_fasttext_file` return a
:class:`TextClassificationData`. Acquisition (cache -> mirror -> download, sha256-verified) is in
:mod:`hsm_lab.data.fetch`; the command line is ``python -m hsm data {list,fetch,verify,info,build}``.

Reliability: every file the layer writes goes through one atomic writer (:func:`hsm.atomic.atomic_write`); a
cached download with a wrong sha256 is fetched again, and a damaged processed corpus rebuilt, each with a
:class:`CacheWarning` naming the file; see :mod:`hsm_lab.data.fetch` and :mod:`hsm_lab.data.gutenberg`.
"""
from __future__ import annotations

from hsm_lab.data.errors import (
    CacheWarning,
    ChecksumMismatchError,
    CorruptArchiveError,
    DataError,
    EmptyCorpusError,
    MirrorFileMissingError,
    NetworkError,
    UnknownDatasetError,
    UnknownLabelError,
)
from hsm_lab.data.fetch import fetch, fetch_file, verify
from hsm_lab.data.lm import EOS, UNK, LMCorpus, context_windows
from hsm_lab.data.gutenberg import books_for_scale, load_gutenberg
from hsm_lab.data.ptb import load_ptb
from hsm_lab.data.registry import DATASETS, SOURCES, dataset
from hsm_lab.data.text_classification import (
    Ragged,
    TextClassificationData,
    TokenizedTexts,
    check_taxonomy,
    load_fasttext_file,
    load_text_classification,
)

__all__ = [
    "CacheWarning",
    "ChecksumMismatchError",
    "CorruptArchiveError",
    "DataError",
    "EmptyCorpusError",
    "MirrorFileMissingError",
    "NetworkError",
    "UnknownDatasetError",
    "UnknownLabelError",
    "DATASETS",
    "books_for_scale",
    "SOURCES",
    "EOS",
    "UNK",
    "LMCorpus",
    "Ragged",
    "TextClassificationData",
    "TokenizedTexts",
    "check_taxonomy",
    "load_fasttext_file",
    "load_gutenberg",
    "load_text_classification",
    "context_windows",
    "dataset",
    "fetch",
    "fetch_file",
    "load_ptb",
    "verify",
]
