"""Exceptions of the data layer. Every message names the file (or name) at fault and how to fix it.

All derive from :class:`DataError` (a :class:`RuntimeError`); the ones caused by a bad argument also derive
from :class:`ValueError` so that callers checking for bad input catch them. :class:`CacheWarning` is the one
warning: the cache held something unusable that was replaced, or could not be written.
"""
from __future__ import annotations


class DataError(RuntimeError):
    """Base class: a data file could not be obtained, verified or parsed."""


class ChecksumMismatchError(DataError):
    """A file's sha256 differs from the registry's (wrong version, corrupted or half-written copy)."""


class CorruptArchiveError(DataError):
    """An archive or compressed file is truncated or unreadable."""


class MirrorFileMissingError(DataError):
    """``HSM_DATA_MIRROR`` is set but the file is not in it."""


class NetworkError(DataError):
    """The canonical URL could not be reached (no network, refused connection, HTTP error)."""


class UnknownDatasetError(DataError, ValueError):
    """A data set name that is not in the registry."""


class EmptyCorpusError(DataError, ValueError):
    """A file or a selection produced no tokens or no examples."""


class UnknownLabelError(DataError, ValueError):
    """A label is missing from the taxonomy it is checked against."""


class CacheWarning(UserWarning):
    """The cache held a bad file (re-fetched) or a bad processed corpus (rebuilt), or could not be written to."""
