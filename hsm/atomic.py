"""Atomic writes: a reader sees the previous file (or folder) or the complete new one, never a part of it.

The package's one writer of files (trees, models, checkpoints, result files, downloads, processed corpora):
:func:`atomic_write` writes to a hidden temporary in the destination's folder, fsyncs it and renames it onto the
destination with :func:`os.replace`, so a killed process, a full disk or a failing ``write`` leaves the previous
file as it was. The temporary's name is unique to the host, process and call, so two runs writing the same file
never share one, and temporaries left by killed processes are removed by the next write
(:func:`remove_dead_temporaries`). :func:`atomic_directory` does the same for a folder.
"""
from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["DiskFullError", "atomic_directory", "atomic_write", "nearest_existing", "remove_dead_temporaries"]

_HOST = socket.gethostname().replace("/", "_")


class DiskFullError(OSError):
    """No space left to write a file (an OSError with errno ENOSPC whose message names the file); the previous
    file is intact (:func:`atomic_write`)."""


def _temporary_name(final: Path, kind: str = "part") -> Path:
    # Same folder as ``final`` (so os.replace is a rename, atomic), hidden, and unique to this process and call
    # (host + pid + random), so two processes or threads writing the same file never share a temporary.
    return final.with_name(f".{final.name}.{kind}-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        return True
    return True


def remove_dead_temporaries(final: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of ``final`` left by killed processes (``kill -9`` skips every clean-up); return them.

    Only those made on this host by a process that no longer runs: a cache shared between machines keeps the
    temporaries of the others, which may still be writing. Best effort: what cannot be removed stays.
    """
    final = Path(final)
    removed = []
    for kind in ("part", "stale"):
        prefix = f".{final.name}.{kind}-{_HOST}"
        for path in final.parent.glob(f".{final.name}.{kind}-*"):
            head, _, rest = path.name.rpartition("-")  # rest: the random token
            head, _, pid = head.rpartition("-")
            if head != prefix or not pid.isdigit() or _pid_alive(int(pid)):
                continue
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError:
                continue
            removed.append(path)
    return removed


def _fsync_file(path: Path) -> None:
    # Flushes the content to the disk, so that a rename after it never exposes a file that is still empty.
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable. Best effort: some file systems refuse to open or fsync a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def nearest_existing(folder: Path) -> Path:
    """``folder``, or its closest ancestor that exists (where a file in ``folder`` would land)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _disk_full(exc: BaseException, path: Path) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or quota: ENOSPC / EDQUOT, or torch's zip writer failing
    ("unexpected pos", "failed writing") on a file system with almost no room."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return True
        if isinstance(seen, RuntimeError) and ("unexpected pos" in str(seen) or "failed writing" in str(seen)):
            try:
                return shutil.disk_usage(nearest_existing(path.parent)).free < 64 * 2**20
            except OSError:
                return False
        seen = seen.__cause__ or seen.__context__
    return False


def atomic_write(path: str | os.PathLike[str], content: str | bytes | Callable[[IO[bytes]], Any], *,
                 check: Callable[[Path], None] | None = None) -> Path:
    """Create or replace the file ``path`` atomically with ``content``; return ``path`` as a :class:`Path`.

    ``content`` is text (written as UTF-8), bytes, or a function given the open binary file that writes the
    content to it (``lambda f: torch.save(state, f)``, ``lambda f: np.save(f, array)``). ``check(tmp)``, if
    given, is called with the complete temporary file's path and may raise to reject it (a download whose
    sha256 is wrong). Parent folders are created. On any error the temporary is removed and ``path`` is left as
    it was; a full disk (or quota) is raised as :class:`DiskFullError` naming ``path``.
    """
    final = Path(path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temporaries(final)
        tmp = _temporary_name(final)
        try:
            with open(tmp, "wb") as handle:
                if callable(content):
                    content(handle)
                else:
                    handle.write(content.encode("utf-8") if isinstance(content, str) else bytes(content))
                handle.flush()
                os.fsync(handle.fileno())
            if check is not None:
                check(tmp)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                tmp.unlink()
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a full disk
        if _disk_full(exc, final):
            raise DiskFullError(errno.ENOSPC, f"the disk is full (No space left on device): cannot write {final} "
                                              "(the previous file, if any, is kept unchanged); free some space and "
                                              "run the command again") from exc
        raise
    _fsync_directory(final.parent)
    return final


def atomic_directory(directory: str | os.PathLike[str], write: Callable[[Path], None], *,
                     replace: bool = False) -> bool:
    """Create the folder ``directory`` atomically: fill a temporary sibling with ``write(folder)``, fsync every
    file in it, then rename it onto ``directory``. Return True if this call installed it.

    If ``directory`` exists by then (another process finished first), theirs is kept unless ``replace`` is True
    (the caller found the existing folder bad): then the old folder is renamed aside and removed after ours is in
    place. ``write`` should write its completion marker last; with the rename a folder is complete or absent.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temporaries(directory)
    tmp = _temporary_name(directory)
    tmp.mkdir()
    try:
        write(tmp)
        for path in tmp.iterdir():
            if path.is_file():
                _fsync_file(path)
        _fsync_directory(tmp)
        if directory.exists():
            if not replace:  # another process won the race: keep theirs
                return False
            stale = _temporary_name(directory, "stale")
            os.replace(directory, stale)
            os.replace(tmp, directory)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.replace(tmp, directory)
        _fsync_directory(directory.parent)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
