"""Acquisition: cache, then mirror, then canonical download; every file verified by sha256.

Order of look-up for one registry file (:class:`~hsm_lab.data.registry.DataFile`):

1. the cache, ``hsm_lab.config.cache_dir() / relpath`` (``HSM_CACHE``, default ``~/.cache/hsm``), if its sha256 is right.
   A cached copy whose sha256 is wrong (truncated, corrupted) is *not* used: a :class:`~hsm_lab.data.errors.CacheWarning`
   names it and the look-up goes on below, and the good copy replaces it. Only if no other copy can be had is
   :class:`~hsm_lab.data.errors.ChecksumMismatchError` raised, naming the cached file and why it could not be re-fetched;
2. the mirror, ``hsm_lab.config.data_mirror() / relpath`` (``HSM_DATA_MIRROR``), copied into the cache. When a mirror
   is named, it is the only remote used: a file missing from it is an error, not a silent download, so a CI run
   never reaches for the network. If the cache cannot be written (a read-only ``HSM_CACHE``, a full disk), the
   verified mirror file is read in place, with a :class:`~hsm_lab.data.errors.CacheWarning`;
3. a verified copy shipped in the package (only for this project's own small files: the Gutenberg manifest and
   the taxonomies);
4. the canonical URL, downloaded with a progress bar (an unwritable cache is then a :class:`DataError` naming the
   path and ``HSM_CACHE``).

Writes go through the package's one writer, :func:`hsm.atomic.atomic_write` (processed corpora and reports too):
a temporary name in the destination folder, unique to the process, fsynced and renamed only once complete and, for
downloads, once the checksum is right, so an interrupted copy, download or build never leaves a file that looks
complete. Every failure raises a subclass of :class:`~hsm_lab.data.errors.DataError` whose message names the file and
the fix.
"""
from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import lzma
import shutil
import socket
import tarfile
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from hsm_lab import config
from hsm.atomic import atomic_write
from hsm_lab.data.errors import (
    CacheWarning,
    ChecksumMismatchError,
    CorruptArchiveError,
    DataError,
    MirrorFileMissingError,
    NetworkError,
)
from hsm_lab.data.registry import SOURCES, DataFile, source

#: Seconds to wait for a server before giving up (a closed port fails at once; a black hole after this).
DOWNLOAD_TIMEOUT_S = 30.0
_CHUNK = 1 << 20

# What a damaged gzip / xz / bz2 / tar stream raises, depending on where the damage is.
_DECODE_ERRORS = (EOFError, lzma.LZMAError, zlib.error, gzip.BadGzipFile, tarfile.TarError, OSError, ValueError)


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _refetch_hint(relpath: str) -> str:
    top = relpath.split("/", 1)[0]
    return f"`python -m hsm data fetch {top}`"


def _check(path: Path, expected: str | None, relpath: str, origin: str) -> None:
    """Raise :class:`ChecksumMismatchError` if ``path`` does not hash to ``expected`` (None: nothing to check)."""
    if expected is None:
        return
    actual = sha256_of(path)
    if actual != expected:
        raise ChecksumMismatchError(
            f"checksum mismatch for {relpath} ({origin} {path}): sha256 {actual}, expected {expected}. "
            f"The file is corrupted, truncated or a different version. Fix: delete it and run "
            f"{_refetch_hint(relpath)} (or restore the original file in the mirror)."
        )


def is_write_error(exc: BaseException) -> bool:
    """Whether ``exc`` means "this place cannot be written" (permissions, read-only file system, disk full)."""
    return isinstance(exc, PermissionError) or (
        isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM)
    )


def _install(final: Path, write: Callable[[BinaryIO], None], expected: str | None, relpath: str,
             origin: str) -> Path:
    """Write through ``write(handle)`` to a temporary name, verify, then atomically rename onto ``final``."""
    return atomic_write(final, write, check=lambda tmp: _check(tmp, expected, relpath, origin))


def _copy_from(path: Path) -> Callable[[BinaryIO], None]:
    def write(out: BinaryIO) -> None:
        with open(path, "rb") as source:
            shutil.copyfileobj(source, out, _CHUNK)

    return write


def _download_to(url: str, relpath: str) -> Callable[[BinaryIO], None]:
    def write(out: BinaryIO) -> None:
        _download_into(url, out, label=relpath, timeout=DOWNLOAD_TIMEOUT_S)

    return write


def download(url: str, dest: Path, *, label: str | None = None, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Download ``url`` to ``dest`` with a tqdm progress bar; raise :class:`NetworkError` if it cannot be reached.

    A response shorter than its ``Content-Length`` raises :class:`CorruptArchiveError` (a truncated download).
    ``dest`` is written directly, so a failed download leaves it partial: :func:`fetch_file` downloads through
    the atomic writer instead.
    """
    with open(dest, "wb") as out:
        _download_into(url, out, label=label or Path(dest).name, timeout=timeout)
    return Path(dest)


def _download_into(url: str, out: BinaryIO, *, label: str, timeout: float) -> None:
    """Stream ``url`` into the open binary file ``out`` (the errors of :func:`download`)."""
    from tqdm.auto import tqdm

    try:
        response = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 (URLs come from the registry)
    except (urllib.error.URLError, ConnectionError, socket.timeout, OSError) as exc:
        raise NetworkError(
            f"cannot download {label} from {url}: {getattr(exc, 'reason', exc)}. "
            f"Fix: check the network, or point {config.MIRROR_ENV} at a directory holding {label} "
            f"(one folder per source, as in hsm_lab.data.registry), or put a verified copy at {config.cache_dir() / label}."
        ) from exc
    with response:
        total = response.headers.get("Content-Length")
        total_bytes = int(total) if total and total.isdigit() else None
        received = 0
        try:
            with tqdm(total=total_bytes, unit="B", unit_scale=True, desc=f"download {label}", leave=False) as bar:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
        except (socket.timeout, ConnectionError, urllib.error.URLError) as exc:
            raise NetworkError(f"download of {label} from {url} broke off after {received} bytes: {exc}. "
                               f"Fix: run {_refetch_hint(label)} again.") from exc
    if total_bytes is not None and received < total_bytes:
        raise CorruptArchiveError(
            f"truncated download of {label} from {url}: {received} of {total_bytes} bytes. "
            f"Fix: run {_refetch_hint(label)} again."
        )


def fetch_file(data_file: DataFile, *, download_missing: bool = True) -> Path:
    """Return a verified local path for ``data_file`` (cache, else mirror, else bundled copy, else download).

    A cached copy with the wrong sha256 is ignored with a :class:`CacheWarning` and replaced by a good copy from
    the next place that has one; :class:`ChecksumMismatchError` (naming the cached file) only if none has. A
    directory where the cached file should be is a :class:`DataError` naming it. With
    ``download_missing=False`` nothing is fetched from the network: :class:`DataError` if it would be needed.
    Raises ValueError if ``HSM_CACHE`` names a file or a directory that cannot be created.
    """
    cache = config.cache_dir()
    candidates = [(cache / data_file.relpath, data_file.sha256, data_file.relpath, "cached copy")]
    if data_file.download_relpath is not None:
        candidates.append((cache / data_file.download_relpath, data_file.download_sha256,
                           data_file.download_relpath, "downloaded copy"))
    bad: list[tuple[Path, ChecksumMismatchError]] = []
    for path, expected, relpath, origin in candidates:
        if not path.exists():
            continue
        if not path.is_file():  # hashing it would raise IsADirectoryError; replacing it would fail too
            raise DataError(f"the {origin} of {relpath}, {path}, is not a regular file (a directory?). Fix: remove "
                            f"it, or set {config.CACHE_ENV} to another directory.")
        try:
            _check(path, expected, relpath, origin)
        except ChecksumMismatchError as exc:
            bad.append((path, exc))
            warnings.warn(f"ignoring the {origin} {path} of {relpath}: its sha256 is wrong (truncated, corrupted "
                          f"or another version); fetching it again", CacheWarning, stacklevel=2)
            continue
        return path
    try:
        found = _fetch_uncached(data_file, cache, download_missing)
    except DataError as exc:
        if not bad:
            raise
        raise ChecksumMismatchError(f"{bad[0][1]} It could not be fetched again either: {exc}") from exc
    for path, _ in bad:
        # A bad copy at another name (a corrupt download beside the mirror copy) is never read again, but it would
        # make `hsm data verify` fail: remove it. (One at the same name was replaced by the good copy.)
        if path != found and path.exists():
            try:
                path.unlink()
            except OSError:  # a read-only cache: it stays, and is skipped with a warning each time
                pass
    return found


def _fetch_uncached(data_file: DataFile, cache: Path, download_missing: bool) -> Path:
    """Steps 2-4 of the look-up (mirror, bundled copy, download), installing into ``cache``."""
    relpath = data_file.relpath
    cached = cache / relpath
    mirror = config.data_mirror()
    bundled = data_file.bundled_path()
    if mirror is not None:
        mirrored = mirror / relpath
        if mirrored.is_file():
            _check(mirrored, data_file.sha256, relpath, "mirror file")  # name the mirror, not the temp copy
            try:
                return _install(cached, _copy_from(mirrored), data_file.sha256, relpath, "copy of mirror file")
            except OSError as exc:
                if not is_write_error(exc):
                    raise
                # Nothing is lost by reading the (verified, read-only) mirror file where it is.
                warnings.warn(f"cannot copy {relpath} into the cache {cache} ({config.CACHE_ENV}): "
                              f"{exc.strerror or exc}; reading the verified mirror file {mirrored} in place",
                              CacheWarning, stacklevel=3)
                return mirrored
        if bundled is None:
            raise MirrorFileMissingError(
                f"{relpath} is missing from the data mirror {mirror} ({config.MIRROR_ENV}); looked for {mirrored}. "
                f"Fix: copy the file there (its source: `python -m hsm data list`), or unset "
                f"{config.MIRROR_ENV} to download it from {data_file.url or 'its canonical source'}."
            )
    if bundled is not None:
        _check(bundled, data_file.sha256, relpath, "bundled copy")
        return bundled
    if data_file.url is None:
        raise DataError(f"{relpath} has no download URL and is neither cached nor mirrored. "
                        f"Fix: set {config.MIRROR_ENV} to a directory that holds it.")
    if not download_missing:
        raise DataError(f"{relpath} is not cached at {cached} and downloading was not allowed. "
                        f"Fix: run {_refetch_hint(relpath)} or set {config.MIRROR_ENV}.")
    target_rel = data_file.download_relpath or relpath
    expected = data_file.download_sha256 if data_file.download_relpath else data_file.sha256
    try:
        return _install(cache / target_rel, _download_to(data_file.url, target_rel), expected, target_rel,
                        "download of")
    except OSError as exc:
        if not is_write_error(exc):
            raise
        raise DataError(f"cannot write the download of {target_rel} to {cache / target_rel}: "
                        f"{exc.strerror or exc}. Fix: set {config.CACHE_ENV} to a writable directory, or set "
                        f"{config.MIRROR_ENV} to a directory holding {relpath}.") from exc


def fetch(name: str, *, download_missing: bool = True) -> dict[str, Path]:
    """Fetch every file of source ``name`` (or of the source of data set ``name``); map relpath -> local path."""
    return {f.relpath: fetch_file(f, download_missing=download_missing) for f in source(name).files}


@dataclass(frozen=True)
class FileStatus:
    """Result of :func:`verify` for one file: where it was found and whether its checksum is right."""

    relpath: str
    location: str  # "cache", "mirror", "bundled" or "missing"
    path: Path | None
    ok: bool
    detail: str = ""


def verify(names: list[str] | None = None) -> list[FileStatus]:
    """Check the sha256 of every registry file present in the cache or the mirror (all sources by default)."""
    cache = config.cache_dir()
    mirror = config.data_mirror()
    statuses: list[FileStatus] = []
    for name in names or list(SOURCES):
        for data_file in source(name).files:
            candidates: list[tuple[str, Path, str | None]] = [("cache", cache / data_file.relpath, data_file.sha256)]
            if data_file.download_relpath:
                candidates.append(("cache", cache / data_file.download_relpath, data_file.download_sha256))
            if mirror is not None:
                candidates.append(("mirror", mirror / data_file.relpath, data_file.sha256))
            if data_file.bundled_path() is not None:
                candidates.append(("bundled", data_file.bundled_path(), data_file.sha256))
            found = False
            for location, path, expected in candidates:
                if not path.is_file():
                    continue
                found = True
                if expected is None:
                    statuses.append(FileStatus(data_file.relpath, location, path, True, "no sha256 (checked per book)"))
                    continue
                actual = sha256_of(path)
                statuses.append(FileStatus(data_file.relpath, location, path, actual == expected,
                                           "" if actual == expected else f"sha256 {actual} != {expected}"))
            if not found:
                statuses.append(FileStatus(data_file.relpath, "missing", None, False, "not in cache or mirror"))
    return statuses


# --------------------------------------------------------------------------------------------- reading archives


def open_compressed(path: Path) -> BinaryIO:
    """Open ``path`` for binary reading, decompressing ``.xz``/``.gz``/``.bz2`` by suffix."""
    suffix = Path(path).suffix
    if suffix == ".xz":
        return lzma.open(path, "rb")
    if suffix == ".gz":
        return gzip.open(path, "rb")
    if suffix == ".bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


def _require_file(path: Path) -> None:
    # Checked up front: inside the try blocks below an OSError would read as a corrupt archive.
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist (or is not a file)")


def read_bytes(path: Path) -> bytes:
    """The whole (decompressed) content of ``path``; a damaged stream raises :class:`CorruptArchiveError`."""
    _require_file(path)
    try:
        with open_compressed(path) as handle:
            return handle.read()
    except _DECODE_ERRORS as exc:
        raise _corrupt(path, exc) from exc


def read_text(path: Path, encoding: str = "utf-8", errors: str = "strict") -> str:
    """Decompressed text of ``path`` (see :func:`read_bytes`)."""
    return read_bytes(path).decode(encoding, errors)


def _corrupt(path: Path, exc: BaseException) -> CorruptArchiveError:
    return CorruptArchiveError(
        f"{path} is truncated or corrupt ({type(exc).__name__}: {exc}). "
        f"Fix: delete it and fetch it again ({_refetch_hint(_relpath_guess(path))}), or restore it in the mirror."
    )


def _relpath_guess(path: Path) -> str:
    path = Path(path)
    return f"{path.parent.name}/{path.name}"


def iter_tar_members(path: Path) -> Iterator[tuple[str, bytes]]:
    """Stream ``(member name, content)`` for each regular file of a tar archive (any compression), in order.

    Streaming mode (``r|*``) holds one member at a time, so a 245 MB archive costs one book's memory.
    A truncated or corrupt archive raises :class:`CorruptArchiveError` naming the file, even mid-way.
    """
    _require_file(path)
    try:
        with tarfile.open(path, mode="r|*") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                yield member.name, handle.read()
    except _DECODE_ERRORS as exc:
        raise _corrupt(path, exc) from exc


def read_tar_member(path: Path, name: str) -> bytes:
    """The content of member ``name`` (exact path inside the archive) of the tar archive ``path``."""
    for member_name, content in iter_tar_members(path):
        if member_name == name or member_name.endswith("/" + name):
            return content
    raise CorruptArchiveError(f"{path} has no member {name!r}. Fix: delete it and fetch it again.")


__all__ = [
    "download",
    "fetch",
    "fetch_file",
    "FileStatus",
    "iter_tar_members",
    "open_compressed",
    "read_bytes",
    "read_tar_member",
    "read_text",
    "sha256_of",
    "verify",
]
