"""Result files with provenance: how experiments write them and how the book reads them back.

Every experiment writes its measured numbers to a JSON file under ``results/`` (committed), as

.. code-block:: text

    {"schema": 1,
     "provenance": {"date_utc": "...", "git_commit": "...", "git_dirty": false, "hostname": "...",
                    "cpu_model": "...", "cpu_count": 2, "python": "3.11.2", "torch": "2.13.0+cpu",
                    "cuda_device": null, "hsm_scale": "quick", "config": {...}, "wall_time_s": 12.3},
     "records": [{"claim": "icml2017.table2.learned_tree.perplexity", "value": 151.2, ...}, ...]}

A record is a flat dict of JSON values. Two keys have a meaning here:

* ``claim`` (optional): the key of the paper number it reproduces (:data:`hsm_lab.paper.NUMBERS`);
  records with a claim appear in the book's table of measured numbers next to the paper's number
  (:mod:`hsm_lab.report`).
* ``value``: the measured number, in the paper number's unit, when ``claim`` is set.

Anything else (data set, arity, seed, epoch, ...) is free-form and kept as is.
The book reads the files at build time (:mod:`hsm_lab.report` builds its verdicts and its table of
measured numbers from them), so its tables never go stale.

Usage::

    prov = provenance(config={"arity": 65}, wall_time_s=elapsed, scale="full")
    write_results("results/gutenberg/learned_tree.json",
                  [make_record("icml2017.table2.learned_tree.perplexity", 151.2, epochs=5)], prov)

Where runs write. ``results/`` holds the committed results the book renders; a run started with
``python -m hsm run NAME`` (or an experiment function called with ``out=None``) does **not** write
there but under :func:`output_root` (``HSM_OUTPUT``, default ``./hsm-results`` in the working
directory), at the same relative path (``hsm-results/lm/ptb.json`` for ``results/lm/ptb.json``).
Only an explicit ``--out results/lm/ptb.json`` updates a committed file, and even then
:func:`write_results` refuses to replace a result of a larger scale (``full``) with a smaller one
(``quick``) unless ``force=True`` (``--force``). Every file goes through the package's atomic writer,
:func:`hsm.atomic.atomic_write`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import socket
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from hsm_lab import paper
from hsm.atomic import nearest_existing, atomic_write
from hsm_lab.config import scale as _scale

__all__ = [
    "SCHEMA_VERSION",
    "CODE_PATHSPECS",
    "provenance",
    "recording_invocation",
    "check_code_committed",
    "checkpoint_interval",
    "RESTORE_ERRORS",
    "restore_error",
    "scale_of_label",
    "make_record",
    "write_results",
    "write_progress",
    "read_json_or_none",
    "ResumableParts",
    "output_root",
    "output_path",
    "recorded_scale",
    "check_replace",
    "check_destination",
    "OUTPUT_ENV",
    "load_results",
    "check_result_payload",
    "iter_results",
    "default_results_root",
    "hardware_summary",
    "machine_arithmetic",
]

#: Version of the result-file layout written by :func:`write_results`.
SCHEMA_VERSION = 1

_PACKAGE_DIR = Path(__file__).resolve().parent


#: what counts as "the code" in a result's provenance: the library, the lab and their pins. A change
#: anywhere else (the book, notes, result files, untracked scratch files) leaves the code that made a
#: result known, so it does not make the result dirty.
CODE_PATHSPECS = (":(top)hsm", ":(top)lab/hsm_lab", ":(top)pyproject.toml", ":(top)lab/pyproject.toml",
                  ":(top)constraints.txt")


def _git(*args: str, strip: bool = True) -> str | None:
    """Output of a git command run in this package's checkout, or None outside a checkout."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=_PACKAGE_DIR, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if strip else out.stdout


def _code_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of this package's checkout now; (None, None) outside a checkout.

    ``dirty`` is True when a tracked file of the code (:data:`CODE_PATHSPECS`) differs from the
    commit; untracked files and changes outside the code do not count."""
    # one git call, not two (rev-parse + status): this runs at every import of the package
    status = _git("status", "--porcelain=v2", "--branch", "--untracked-files=no", "--", *CODE_PATHSPECS)
    if status is None:
        return None, None
    lines = status.splitlines()
    oid = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if oid is None or oid == "(initial)":  # a repository without commits
        return None, None
    return oid, any(not line.startswith("#") for line in lines)


def _code_diff() -> dict[str, Any] | None:
    """The uncommitted change to the code (:data:`CODE_PATHSPECS`) against HEAD: the sha256 of
    ``git diff HEAD --binary``, the files it touches and its line counts; None when there is none
    or outside a checkout. With the commit, the hash identifies the exact code that ran: that
    commit plus a diff with this hash."""
    diff = _git("diff", "HEAD", "--binary", "--", *CODE_PATHSPECS, strip=False)
    if not diff:
        return None
    numstat = _git("diff", "HEAD", "--numstat", "--", *CODE_PATHSPECS) or ""
    files, insertions, deletions = [], 0, 0
    for line in numstat.splitlines():
        added, removed, name = line.split("\t", 2)
        files.append(name)
        insertions += int(added) if added.isdigit() else 0  # "-" for binary files
        deletions += int(removed) if removed.isdigit() else 0
    return {"sha256": hashlib.sha256(diff.encode("utf-8", "surrogateescape")).hexdigest(),
            "files": files, "insertions": insertions, "deletions": deletions}


#: the code this process runs: the checkout's state when the package was imported. A run of hours
#: must not be credited to a commit made while it ran (the provenance records both when they differ).
_CODE_AT_START = _code_state()
#: and, when that code had uncommitted changes, what they were (:func:`_code_diff`)
_DIFF_AT_START = _code_diff() if _CODE_AT_START[1] else None


#: the command now running, set by the command line (:func:`recording_invocation`): every result
#: file it writes records it, so that ``python -m hsm reproduce FILE`` can run it again
_INVOCATION: dict[str, Any] | None = None


@contextlib.contextmanager
def recording_invocation(invocation: Mapping[str, Any]) -> Iterator[None]:
    """Within the block, :func:`provenance` records ``invocation`` (a JSON-able dict such as
    ``{"command": "run", "experiment": "lm-ptb", "scale": "quick", "device": "cpu",
    "options": {"epochs": "2"}}``) as the command that made the result."""
    global _INVOCATION
    previous, _INVOCATION = _INVOCATION, _to_json_value(dict(invocation), "invocation")
    try:
        yield
    finally:
        _INVOCATION = previous


def scale_of_label(label: Any) -> str:
    """The scale word of a scale label: ``"full, reduced: epochs=2"`` -> ``"full"`` (what precedes
    the first comma; the label as given when it has none)."""
    return str(label or "").split(",", 1)[0].strip()


def check_code_committed(scale: str, allow_dirty: bool = False) -> None:
    """Refuse a full-scale run from code with uncommitted changes, unless ``allow_dirty``.

    A full-scale result is meant to be committed and cited; made from uncommitted code, nobody can
    tell what made it (its provenance then records the diff's hash, :func:`_code_diff`, but not the
    diff). Quick runs, and runs outside a git checkout, are never refused.

    Raises:
        ValueError: ``scale`` is ``full`` (its first word), the code differs from its commit and
            ``allow_dirty`` is False; the message names the changed files and both ways out.
    """
    if scale_of_label(scale) != "full" or allow_dirty:
        return
    _, dirty = _CODE_AT_START
    if not dirty:
        return
    files = (_DIFF_AT_START or {}).get("files") or ["(unknown files)"]
    shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
    raise ValueError(f"the code has uncommitted changes ({shown}): commit them first so that the result "
                     f"names the code that made it, or pass --allow-dirty (recorded in the result)")


def _cpu_model() -> str:
    """The CPU model name (Linux /proc/cpuinfo; platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


#: the CPU's vector extensions that decide which kernels numpy, torch and numba run (and so the
#: order of float32 sums): recorded so that a re-run elsewhere knows whether it ran the same arithmetic
_VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
                      "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "neon", "asimd", "sve")


def _cpu_vector_extensions() -> list[str]:
    """The CPU's vector extensions among :data:`_VECTOR_EXTENSIONS` (Linux /proc/cpuinfo flags;
    an empty list where the file is not there)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    flags = set(line.split(":", 1)[1].split())
                    return [name for name in _VECTOR_EXTENSIONS if name in flags]
    except OSError:
        pass
    return []


def _numba_version() -> str | None:
    try:
        import numba
    except ImportError:
        return None
    return str(numba.__version__)


def machine_arithmetic(prov: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What decides a run's float arithmetic, from a provenance: the CPU model, its vector
    extensions, the kernels torch picked for them, the thread count and the numeric libraries'
    versions. Two runs with equal tuples on one thread ran the same operations in the same order;
    None when the provenance predates these fields (nothing can be said)."""
    if "threads" not in prov or "cpu_vector_extensions" not in prov:
        return None
    return (prov.get("cpu_model"), tuple(prov.get("cpu_vector_extensions") or ()), prov.get("cpu_capability"),
            prov.get("threads"), prov.get("torch"), prov.get("numpy"), prov.get("numba"), prov.get("cuda_device"))


#: what ``provenance.threads_note`` says when a run's own ``config.threads`` differs from torch's
#: threads and its writer gave no note of its own
_THREADS_NOTE = ("config.threads is the run's own thread setting (a compiled trainer's or a library's threads); "
                 "threads is torch's intra-op threads when the file was written")


def _thread_count(value: Any) -> Any:
    """A thread setting as ``provenance.threads`` records it: a list of one count is that count."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if len(value) == 1 else [int(v) for v in value]
    return value


def provenance(config: Mapping[str, Any] | None = None, wall_time_s: float | None = None,
               scale: str | None = None, *, threads: int | Sequence[int] | None = None,
               threads_note: str | None = None) -> dict[str, Any]:
    """Where, when and with what a result was produced.

    Args:
        config: the experiment's settings (JSON-serialisable), stored as given.
        wall_time_s: how long the run took, in seconds.
        scale: the scale that actually ran (``quick`` or ``full``), recorded as ``hsm_scale``.
            Experiments always pass it: the ``--scale`` of a run can differ from ``HSM_SCALE``.
            None: ``HSM_SCALE`` (:func:`hsm_lab.config.scale`), for callers with no scale of their own.
            A label that qualifies the scale, ``"full, <what differs>"``, is recorded as given (its
            first word is the scale): the reproduction table lists it apart from the plain ``full`` rows.
        threads: the torch threads the run computed on, for a run that set its own and gave the
            caller's back before writing (a benchmark measured at each of several counts gives the
            list; a list of one count is recorded as that count). None: ``torch.get_num_threads()``
            now, the threads of a run that is still in its own setting.
        threads_note: what ``config["threads"]`` counts when it is not torch's threads (a compiled
            trainer's Hogwild threads, a library's), recorded as ``threads_note`` when the two
            differ; a generic sentence stands in when it is None, so that no file holds two thread
            counts without saying why.

    Returns:
        A dict with ``date_utc`` (ISO 8601), ``git_commit`` and ``git_dirty`` (the checkout's state
        when this process imported ``hsm``, i.e. the code that ran; tracked files modified; None
        outside a git checkout; ``git_commit_at_write`` too when HEAD moved while it ran), ``hostname``, ``cpu_model``, ``cpu_count``,
        ``cpu_vector_extensions`` (e.g. ``["sse4_2", "avx", "avx2", "fma"]``), ``cpu_capability``
        (the kernels torch dispatches to, e.g. ``"AVX2"``), ``threads`` (torch's intra-op threads,
        which the compiled kernels use too; ``threads`` when given), ``threads_note`` (only when
        ``config["threads"]`` differs from ``threads``), ``platform``, ``python``, ``torch``, ``numpy``,
        ``numba``, ``cuda_device`` (name of CUDA device 0, or None), ``hsm_scale`` (``scale``, else ``HSM_SCALE``: quick or full), ``config`` and
        ``wall_time_s``.

    Raises:
        ValueError: ``scale`` (its first word) is not ``quick`` or ``full``; ``wall_time_s`` negative or not finite.
    """
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (or None), got {type(config).__name__}")
    if wall_time_s is not None:
        if isinstance(wall_time_s, bool) or not isinstance(wall_time_s, (int, float)):
            raise TypeError(f"wall_time_s must be a number of seconds, got {type(wall_time_s).__name__}")
        if not math.isfinite(wall_time_s) or wall_time_s < 0:
            raise ValueError(f"wall_time_s must be a finite, non-negative number of seconds, got {wall_time_s}")
    if scale is not None:
        from hsm_lab.checks import check_scale

        check_scale(scale_of_label(scale))
    recorded = scale if scale is not None else _scale()

    import numpy
    import torch

    commit, dirty = _CODE_AT_START
    now = _code_state()
    cuda_device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    ran_on = _thread_count(threads) if threads is not None else torch.get_num_threads()
    own = _thread_count(config.get("threads")) if config is not None and "threads" in config else ran_on
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "git_commit": commit,
        "git_dirty": dirty,
        # the code that ran is the commit plus this change (its hash, files and line counts)
        **({"git_diff": _DIFF_AT_START} if dirty and _DIFF_AT_START else {}),
        **({"git_commit_at_write": now[0]} if now[0] != commit else {}),
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_vector_extensions": _cpu_vector_extensions(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": ran_on,
        **({"threads_note": threads_note or _THREADS_NOTE} if own != ran_on else {}),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "numba": _numba_version(),
        "cuda_device": cuda_device,
        "hsm_scale": recorded,
        "config": _to_json_value(dict(config), "config") if config is not None else None,
        "wall_time_s": None if wall_time_s is None else float(wall_time_s),
        **({"invocation": _INVOCATION} if _INVOCATION is not None else {}),
    }


def _to_json_value(value: Any, where: str) -> Any:
    """Convert numpy/torch scalars and arrays, tuples and paths to plain JSON values; reject
    NaN/inf (not JSON) and anything else that JSON cannot hold, naming where it was found."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value}: JSON has no NaN/inf; record None or a string instead")
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has a non-string key {key!r}; JSON object keys are strings")
            out[key] = _to_json_value(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_to_json_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    # numpy scalars / arrays and torch tensors expose .item() / .tolist()
    if hasattr(value, "tolist") and callable(value.tolist):
        return _to_json_value(value.tolist(), where)
    if hasattr(value, "item") and callable(value.item):
        return _to_json_value(value.item(), where)
    raise TypeError(f"{where} has type {type(value).__name__}, which JSON cannot store")


def make_record(claim: str | None, value: float, **fields: Any) -> dict[str, Any]:
    """A result record for :func:`write_results`, checking that ``claim`` names a paper number.

    Args:
        claim: key of the paper number this value reproduces (see :data:`hsm_lab.paper.NUMBERS`),
            or None for a measurement with no counterpart in the papers.
        value: the measured number, in the paper number's unit.
        **fields: anything else worth keeping (data set, arity, seed, epoch, ...).
    """
    if claim is not None:
        paper.get(claim)  # KeyError naming close keys when the claim does not exist
    if isinstance(value, bool) or (not isinstance(value, (int, float)) and not hasattr(value, "item")):
        raise TypeError(f"value must be a number, got {type(value).__name__}")
    record: dict[str, Any] = {"claim": claim, "value": value, **fields}
    return _to_json_value(record, "record")


def write_results(path: str | os.PathLike[str], records: Sequence[Mapping[str, Any]], provenance: Mapping[str, Any],
                  force: bool = False) -> Path:
    """Write ``{"schema", "provenance", "records"}`` to ``path`` as JSON, atomically
    (:func:`~hsm.atomic.atomic_write`: a reader, a crash or a full disk never leaves a half-written file, and
    the previous file survives a failed write). Parent directories are created. Returns the path.

    Raises:
        ValueError: ``path`` already holds a result of a larger scale than ``provenance`` records
            (``full`` replaced by ``quick``) and ``force`` is False (:func:`check_replace`); or the
            records/provenance are malformed.
    """
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"result files are JSON: expected a .json path, got {path}")
    if isinstance(records, Mapping) or not isinstance(records, Sequence):
        raise TypeError("records must be a list of dicts")
    if not isinstance(provenance, Mapping):
        raise TypeError(f"provenance must be a dict (from hsm_lab.results.provenance), got {type(provenance).__name__}")
    missing = {"date_utc", "git_commit", "hsm_scale"} - set(provenance)
    if missing:
        raise ValueError(f"provenance lacks {sorted(missing)}: build it with hsm_lab.results.provenance()")
    clean_records = []
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TypeError(f"records[{index}] must be a dict, got {type(record).__name__}")
        claim = record.get("claim")
        if claim is not None:
            paper.get(claim)
            if "value" not in record:
                raise ValueError(f"records[{index}] names claim {claim!r} but has no 'value'")
        clean_records.append(_to_json_value(record, f"records[{index}]"))
    payload = {
        "schema": SCHEMA_VERSION,
        "provenance": _to_json_value(provenance, "provenance"),
        "records": clean_records,
    }
    text = json.dumps(payload, indent=2, sort_keys=False, allow_nan=False) + "\n"
    check_replace(path, str(provenance.get("hsm_scale")), force=force)
    return atomic_write(path, text)


def is_complete_result(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a readable result file that is not marked incomplete
    (``provenance.config.complete`` is not False; files without the key are complete)."""
    payload = read_json_or_none(path, "result file")
    if not _is_result_payload(payload):
        return False
    config = payload["provenance"].get("config")
    return not (isinstance(config, Mapping) and config.get("complete") is False)


def write_progress(path: str | os.PathLike[str], records: Sequence[Mapping[str, Any]], provenance: Mapping[str, Any],
                   force: bool = False) -> Path:
    """Write an incomplete result (``provenance.config.complete`` False: the parts finished so far)
    to ``path``, unless ``path`` already holds a complete result: a re-run that is interrupted must
    never replace a finished table with its first few parts (its progress is in the hidden partial
    file, :class:`ResumableParts`; the complete result replaces the old one at the end, through
    :func:`write_results`). Where no result or only an incomplete one exists, the progress is
    written, so that a long first run shows its finished parts. Returns ``path``."""
    path = Path(path)
    config = provenance.get("config") if isinstance(provenance, Mapping) else None
    if not (isinstance(config, Mapping) and config.get("complete") is False):
        raise ValueError("write_progress writes incomplete results: provenance.config.complete must be False "
                         "(write a complete result with write_results)")
    if is_complete_result(path):
        return path
    return write_results(path, records, provenance, force=force)


def check_destination(path: str | os.PathLike[str], what: str = "result file", fix: str | None = None) -> Path:
    """Check, before any work, that the file ``path`` can be written: not an existing directory,
    its folder creatable (no file in the way) and writable (a probe file is created and removed
    in the nearest existing folder). ValueError naming the path and the fix otherwise (``fix``:
    what the user should change, default the result's ``--out``)."""
    path = Path(path)
    hint = fix or ("choose another --out" + (f" or {OUTPUT_ENV}" if os.environ.get(OUTPUT_ENV) else ""))
    if path.is_dir():
        raise ValueError(f"{what} {path} is an existing directory, not a file: {hint} (e.g. {path / 'result.json'})")
    existing = nearest_existing(path.parent)
    if not existing.is_dir():
        raise ValueError(f"{what} {path} cannot be written: {existing} is a file, not a folder; {hint}")
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".hsm-write-test-", dir=existing)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{what} {path} cannot be written: {existing} is not writable ({exc.strerror}); {hint}") \
            from None
    return path


def read_json_or_none(path: str | os.PathLike[str], what: str = "file") -> Any | None:
    """The JSON in ``path``, or None when it is missing; a file that exists but cannot be read or
    parsed (0 bytes after a full disk, truncated, not UTF-8) also gives None, with a
    :class:`UserWarning` naming it, so the caller recomputes it instead of failing on every rerun.
    ``what`` says what the file is in the warning (e.g. ``"finished-run file"``)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        warnings.warn(f"ignoring unreadable {what} {path} ({type(exc).__name__}: {exc}); it will be recomputed",
                      stacklevel=2)
        return None


def checkpoint_interval(checkpoint_seconds: float | None = None) -> float:
    """Seconds of training between two checkpoints within an epoch: ``checkpoint_seconds``, else
    the environment variable ``HSM_CHECKPOINT_SECONDS``, else 300 (ValueError if not > 0)."""
    if checkpoint_seconds is None:
        raw = os.environ.get("HSM_CHECKPOINT_SECONDS", "300")
        try:
            checkpoint_seconds = float(raw)
        except ValueError:
            raise ValueError(f"HSM_CHECKPOINT_SECONDS must be a number of seconds, got {raw!r}") from None
    if not checkpoint_seconds > 0:
        raise ValueError(f"checkpoint_seconds must be > 0, got {checkpoint_seconds}")
    return checkpoint_seconds


def save_checkpoint(state: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(state)`` to ``path`` through :func:`~hsm.atomic.atomic_write` (unique temporary, fsync,
    rename): a run killed while it saves leaves the previous checkpoint whole."""
    import torch

    return atomic_write(path, lambda handle: torch.save(state, handle))


#: what restoring a checkpoint that reads but does not fit its run raises: an entry missing, a
#: tensor of another shape (torch's RuntimeError), NaN statistics (ValueError), a wrong type
RESTORE_ERRORS = (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError)


def restore_error(exc: BaseException) -> str:
    """``ErrorType: detail``, the detail on one line and at most 300 characters: how a run says why
    it could not restore a checkpoint (:data:`RESTORE_ERRORS`)."""
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    return f"{type(exc).__name__}: {detail}"


def load_checkpoint(path: str | os.PathLike[str], required: str = "model") -> dict[str, Any] | None:
    """The checkpoint dict in ``path``, or None when it is missing; a file that cannot be read
    (truncated by a full disk, say) or is not a dict holding ``required`` also gives None, with a
    :class:`UserWarning` naming it, and the run starts over instead of failing on every rerun."""
    import torch

    path = Path(path)
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=False)  # our own file: trees and records are plain objects
    except Exception as exc:  # noqa: BLE001 - torch/pickle raise many types for a bad file
        warnings.warn(f"ignoring unreadable checkpoint {path} ({type(exc).__name__}: {exc}); "
                      "the run starts over", stacklevel=2)
        return None
    if not isinstance(state, dict) or required not in state:
        warnings.warn(f"ignoring checkpoint {path}: not a training checkpoint; the run starts over", stacklevel=2)
        return None
    return state


class ResumableParts:
    """The finished parts of a long run, kept in ``.<out name>.partial.json`` beside its result
    file so that a stopped run resumes where it was.

    ``config`` is what the parts depend on (anything JSON can hold): a saved file written under
    another config is ignored, so changing a setting never mixes old parts into a new table. Each
    part is saved atomically the moment it finishes (:meth:`run`); :meth:`finish` removes the file
    once the caller has written the result. An unreadable partial file (truncated by a full disk)
    is warned about by name and ignored (:func:`read_json_or_none`)::

        parts = ResumableParts(out, config)
        for seed in seeds:
            row = parts.run(f"seed{seed}", lambda: train(seed))   # skipped when already done
        write_results(out, ...); parts.finish()
    """

    def __init__(self, out: str | os.PathLike[str], config: Any, what: str = "partial-run file",
                 log: Callable[[str], None] | None = print) -> None:
        out = Path(out)
        self.path = out.with_name(f".{out.name}.partial.json")
        # normalised through JSON, so that a tuple and the list it is read back as compare equal
        self.config = json.loads(json.dumps(config, default=list, sort_keys=True))
        self.parts: dict[str, Any] = {}
        saved = read_json_or_none(self.path, what)
        if isinstance(saved, dict) and saved.get("config") == self.config and isinstance(saved.get("parts"), dict):
            self.parts = saved["parts"]
            if log is not None and self.parts:
                log(f"resuming from {self.path.name}: {len(self.parts)} parts already done")

    def __contains__(self, key: str) -> bool:
        return key in self.parts

    def __getitem__(self, key: str) -> Any:
        return self.parts[key]

    def __len__(self) -> int:
        return len(self.parts)

    def run(self, key: str, compute: Callable[[], Any]) -> Any:
        """The saved part ``key``, or ``compute()`` saved under ``key`` before it is returned."""
        if key not in self.parts:
            self.parts[key] = compute()
            self.save()
        return self.parts[key]

    def save(self) -> None:
        atomic_write(self.path, json.dumps({"config": self.config, "parts": self.parts}))

    def finish(self) -> None:
        """Remove the partial file (call after the complete result is written)."""
        self.path.unlink(missing_ok=True)


#: Environment variable naming the folder that runs write to when no output path is given.
OUTPUT_ENV = "HSM_OUTPUT"

_SCALE_RANK = {"quick": 0, "full": 1}


def output_root() -> Path:
    """Where experiment runs write when no output path is given: ``HSM_OUTPUT`` if set, else
    ``hsm-results`` in the current directory.

    Not ``results/``: those are the committed results the book renders, and a quick run must not
    replace hours of full-scale compute by accident (only an explicit ``--out results/...`` does).
    Not the cache either: the cache holds files that can be fetched or rebuilt and may be deleted
    at will, while a result is the product of a run; the working directory is where the user
    looks for it (the command prints the path). ``HSM_RESULTS`` is not reused: it names the
    results the book *reads* (:func:`default_results_root`).
    """
    value = os.environ.get(OUTPUT_ENV)
    return Path(value).expanduser() if value else Path("hsm-results")


def output_path(default: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """``out`` when given; else ``default`` (a path under ``results/``, as an experiment registers
    it) moved under :func:`output_root`: ``results/lm/ptb.json`` -> ``hsm-results/lm/ptb.json``."""
    if out is not None:
        return Path(out)
    default = Path(default)
    parts = default.parts
    relative = Path(*parts[1:]) if parts and parts[0] == "results" and len(parts) > 1 else default
    return output_root() / relative


def recorded_scale(path: str | os.PathLike[str]) -> str | None:
    """The scale (``quick`` or ``full``) a result file says it ran at (the start of its
    ``provenance.hsm_scale``, e.g. ``"full, reduced: ..."`` is full), or None when the file is
    missing, unreadable, not a result file or has no recognisable scale."""
    payload = read_json_or_none(path, "result file")
    if not _is_result_payload(payload):
        return None
    match = re.match(r"\s*(quick|full)\b", str(payload["provenance"].get("hsm_scale") or ""))
    return match.group(1) if match else None


def check_replace(path: str | os.PathLike[str], scale: str, force: bool = False, option: str = "--out") -> None:
    """Refuse to replace the result file ``path`` by a run of a smaller ``scale``.

    Raises ValueError naming the file and both scales when ``path`` holds a result recorded at
    ``full`` and ``scale`` is ``quick`` (``scale`` may be a label such as ``"full, reduced: ..."``:
    its first word counts), unless ``force``; and ValueError when ``path`` cannot be written at all
    (:func:`check_destination`: a directory, a folder under a file, a read-only folder) or is not
    ``.json``. Experiments call it before they start, so the refusal costs nothing;
    :func:`write_results` calls it again before writing. ``option``: the command's option that
    names the file (the benchmarks' ``--json``), which the messages name as the fix."""
    check_destination(path, fix=None if option == "--out" else f"choose another {option}")
    if Path(path).suffix != ".json":
        raise ValueError(f"result files are JSON: expected a .json path, got {path}")
    if force:
        return
    existing = recorded_scale(path)
    match = re.match(r"\s*(quick|full)\b", str(scale))
    new = match.group(1) if match else None
    if existing is None or new is None:
        return
    if _SCALE_RANK[new] < _SCALE_RANK[existing]:
        raise ValueError(f"{path} holds a {existing}-scale result; refusing to replace it with a {new}-scale run "
                         f"(write elsewhere with {option} PATH, or pass --force / force=True to replace it)")


def _is_result_payload(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get("provenance"), dict) and isinstance(payload.get("records"), list)


#: the keys of a result file; a JSON object with any of them is meant as one (and checked as one)
_RESULT_KEYS = ("schema", "provenance", "records")


def _read_json(path: Path) -> Any:
    """The JSON in ``path``; ValueError naming the file when its bytes are not UTF-8 or not JSON."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); restore it from git "
                         f"or re-run its experiment") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}; restore it from git or re-run its experiment") from None


def check_result_payload(path: str | os.PathLike[str], payload: Any) -> dict[str, Any]:
    """``payload`` (the JSON read from the result file ``path``) after checking it is a sound
    result file; ValueError naming ``path`` and the damage otherwise: ``provenance`` not an object
    (or lacking ``hsm_scale``), ``records`` not a list of objects, a schema newer than this code,
    a record whose ``claim`` is not a paper number (:data:`hsm_lab.paper.NUMBERS`), or a claimed
    record without a numeric ``value``. A non-finite ``value`` (``NaN`` / ``Infinity``, which
    :func:`write_results` never writes) is kept: the book's tables mark it (:data:`hsm_lab.report.NOT_FINITE`)."""
    where = f"result file {path}"
    if not isinstance(payload, dict):
        raise ValueError(f"{where} is not a result file: expected an object with 'provenance' and 'records', "
                         f"got {type(payload).__name__}")
    if not any(key in payload for key in _RESULT_KEYS):
        raise ValueError(f"{path} is not a result file: expected an object with 'provenance' and 'records'")
    schema = payload.get("schema", SCHEMA_VERSION)
    if isinstance(schema, bool) or not isinstance(schema, int):
        raise ValueError(f"{where} is damaged: 'schema' is {schema!r}, not an integer")
    if schema > SCHEMA_VERSION:
        raise ValueError(f"{where} has schema {schema}; this hsm reads up to {SCHEMA_VERSION}")
    prov, records = payload.get("provenance"), payload.get("records")
    if not isinstance(prov, dict):
        raise ValueError(f"{where} is damaged: 'provenance' is {type(prov).__name__}, not an object")
    if "hsm_scale" not in prov:
        raise ValueError(f"{where} is damaged: its provenance has no 'hsm_scale'")
    if prov.get("config") is not None and not isinstance(prov["config"], dict):
        raise ValueError(f"{where} is damaged: 'provenance.config' is {type(prov['config']).__name__}, not an object")
    if not isinstance(records, list):
        raise ValueError(f"{where} is damaged: 'records' is {type(records).__name__}, not a list")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{where} is damaged: records[{index}] is {type(record).__name__}, not an object")
        claim = record.get("claim")
        if claim is None:
            continue
        if not isinstance(claim, str) or claim not in paper.NUMBERS:
            try:
                paper.get(str(claim))  # its message names the close keys
                hint = ""
            except KeyError as exc:
                hint = f" ({exc.args[0]})"
            raise ValueError(f"{where}: records[{index}] names an unknown claim {claim!r}{hint}; fix the record "
                             f"or add the paper number to hsm_lab.paper")
        value = record.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: records[{index}] (claim {claim!r}) has a non-numeric value {value!r}")
    return payload


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a result file written by :func:`write_results`, checked by :func:`check_result_payload`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not UTF-8, not valid JSON, not a result file, or damaged.
    """
    path = Path(path)
    return check_result_payload(path, _read_json(path))


def default_results_root() -> Path:
    """``results/`` of the checkout: ``HSM_RESULTS`` if set, else the first ``results`` folder
    beside a ``pyproject.toml`` found walking up from the working directory (notebooks run in
    ``notebooks/`` or ``book/``), else the one beside this package."""
    env = os.environ.get("HSM_RESULTS")
    if env:
        return Path(env).expanduser().resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "hsm").is_dir():
            return folder / "results"
    return _PACKAGE_DIR.parent / "results"


def iter_results(root: str | os.PathLike[str] | None = None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every result file under ``root`` (default :func:`default_results_root`), in path order,
    as ``(path, payload)``. JSON objects with none of a result file's keys (a saved tree, say) are
    skipped; a file that is not UTF-8 or not JSON, or an object with ``schema``, ``provenance`` or
    ``records`` that is damaged (:func:`check_result_payload`), raises ValueError naming the file,
    so a broken committed result fails the book's build instead of losing its rows silently."""
    root = default_results_root() if root is None else Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise NotADirectoryError(f"results root {root} is not a directory")
    for path in sorted(root.rglob("*.json")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # temporary files of an in-progress write, hidden folders
        payload = _read_json(path)
        if isinstance(payload, dict) and any(key in payload for key in _RESULT_KEYS):
            yield path, check_result_payload(path, payload)


def hardware_summary(prov: Mapping[str, Any]) -> str:
    """Short description of the machine in a provenance dict: the CUDA device if one was used,
    else the CPU model and core count."""
    if prov.get("cuda_device"):
        return str(prov["cuda_device"])
    cpu = str(prov.get("cpu_model") or "")
    for noise in ("(R)", "(TM)", " CPU", " Processor"):
        cpu = cpu.replace(noise, "")
    cpu = " ".join(cpu.split()) or "unknown CPU"
    cores = prov.get("cpu_count")
    return f"{cpu}, {cores} cores" if cores else cpu
