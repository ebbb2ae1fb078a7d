"""Result files with provenance, and the reproduction-status table built from them.

Every experiment writes its measured numbers to a JSON file under ``results/`` (committed), as

.. code-block:: text

    {"schema": 1,
     "provenance": {"date_utc": "...", "git_commit": "...", "git_dirty": false, "hostname": "...",
                    "cpu_model": "...", "cpu_count": 2, "python": "3.11.2", "torch": "2.13.0+cpu",
                    "cuda_device": null, "hsm_scale": "quick", "config": {...}, "wall_time_s": 12.3},
     "records": [{"claim": "icml2017.table2.learned_tree.perplexity", "value": 151.2, ...}, ...]}

A record is a flat dict of JSON values. Two keys have a meaning here:

* ``claim`` (optional): the key of the paper number it reproduces (:data:`hsm.paper.NUMBERS`);
  records with a claim appear on the landing page of the book next to the paper's number.
* ``value``: the measured number, in the paper number's unit, when ``claim`` is set.

Anything else (data set, arity, seed, epoch, ...) is free-form and kept as is.
The book's landing page calls :func:`reproduction_rows` at build time, so the table never goes
stale: a claim with no result file says so.

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
(``quick``) unless ``force=True`` (``--force``). Every file goes through :func:`atomic_write`.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import socket
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Sequence

from hsm import paper
from hsm.config import scale as _scale

__all__ = [
    "SCHEMA_VERSION",
    "provenance",
    "make_record",
    "write_results",
    "atomic_write",
    "read_json_or_none",
    "ResumableParts",
    "output_root",
    "output_path",
    "recorded_scale",
    "check_replace",
    "OUTPUT_ENV",
    "load_results",
    "iter_results",
    "default_results_root",
    "hardware_summary",
    "ReproductionRow",
    "reproduction_rows",
    "reproduction_table_markdown",
]

#: Version of the result-file layout written by :func:`write_results`.
SCHEMA_VERSION = 1

_PACKAGE_DIR = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    """Output of a git command run in this package's checkout, or None outside a checkout."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=_PACKAGE_DIR, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _code_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of this package's checkout now; (None, None) outside a checkout."""
    # one git call, not two (rev-parse + status): this runs at every import of the package
    status = _git("status", "--porcelain=v2", "--branch", "--untracked-files=no")
    if status is None:
        return None, None
    lines = status.splitlines()
    oid = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if oid is None or oid == "(initial)":  # a repository without commits
        return None, None
    return oid, any(not line.startswith("#") for line in lines)


#: the code this process runs: the checkout's state when the package was imported. A run of hours
#: must not be credited to a commit made while it ran (the provenance records both when they differ).
_CODE_AT_START = _code_state()


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


def provenance(config: Mapping[str, Any] | None = None, wall_time_s: float | None = None,
               scale: str | None = None) -> dict[str, Any]:
    """Where, when and with what a result was produced.

    Args:
        config: the experiment's settings (JSON-serialisable), stored as given.
        wall_time_s: how long the run took, in seconds.
        scale: the scale that actually ran (``quick`` or ``full``), recorded as ``hsm_scale``.
            Experiments always pass it: the ``--scale`` of a run can differ from ``HSM_SCALE``.
            None: ``HSM_SCALE`` (:func:`hsm.config.scale`), for callers with no scale of their own.
            A label that qualifies the scale, ``"full, <what differs>"``, is recorded as given (its
            first word is the scale): the landing page lists it apart from the plain ``full`` rows.

    Returns:
        A dict with ``date_utc`` (ISO 8601), ``git_commit`` and ``git_dirty`` (the checkout's state
        when this process imported ``hsm``, i.e. the code that ran; tracked files modified; None
        outside a git checkout; ``git_commit_at_write`` too when HEAD moved while it ran), ``hostname``, ``cpu_model``, ``cpu_count``,
        ``platform``, ``python``, ``torch``, ``numpy``, ``cuda_device`` (name of CUDA device 0,
        or None), ``hsm_scale`` (``scale``, else ``HSM_SCALE``: quick or full), ``config`` and
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
        from hsm.experiments import check_scale

        check_scale(str(scale).split(",", 1)[0].strip())
    recorded = scale if scale is not None else _scale()

    import numpy
    import torch

    commit, dirty = _CODE_AT_START
    now = _code_state()
    cuda_device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "git_commit": commit,
        "git_dirty": dirty,
        **({"git_commit_at_write": now[0]} if now[0] != commit else {}),
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "cuda_device": cuda_device,
        "hsm_scale": recorded,
        "config": _to_json_value(dict(config), "config") if config is not None else None,
        "wall_time_s": None if wall_time_s is None else float(wall_time_s),
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
        claim: key of the paper number this value reproduces (see :data:`hsm.paper.NUMBERS`),
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
    (:func:`atomic_write`: a reader, a crash or a full disk never leaves a half-written file, and
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
        raise TypeError(f"provenance must be a dict (from hsm.results.provenance), got {type(provenance).__name__}")
    missing = {"date_utc", "git_commit", "hsm_scale"} - set(provenance)
    if missing:
        raise ValueError(f"provenance lacks {sorted(missing)}: build it with hsm.results.provenance()")
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


def atomic_write(path: str | os.PathLike[str], content: str | bytes | Callable[[IO[bytes]], Any]) -> Path:
    """Write ``content`` (text as UTF-8, bytes, or a function given the open binary file, e.g.
    ``lambda f: torch.save(obj, f)``) to ``path`` atomically and return ``path``.

    Goes through the data layer's writer (:func:`hsm.data.fetch.atomic_write`: one implementation
    for the package): the data go to a hidden temporary in the same folder whose name is unique
    to the process and call (two runs writing the same checkpoint never share one), are fsynced,
    and are renamed onto ``path`` with :func:`os.replace`. A failure at any point (a full disk, an
    exception in ``content``) removes the temporary and leaves any previous ``path`` untouched;
    readers see the old file or the complete new one. Parent folders are created.
    """
    from hsm.data.fetch import atomic_write as _atomic_write

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            if callable(content):
                content(handle)
            else:
                handle.write(content.encode("utf-8") if isinstance(content, str) else bytes(content))

    return _atomic_write(Path(path), write)


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


def save_checkpoint(state: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(state)`` to ``path`` through :func:`atomic_write` (unique temporary, fsync,
    rename): a run killed while it saves leaves the previous checkpoint whole."""
    import torch

    return atomic_write(path, lambda handle: torch.save(state, handle))


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


def check_replace(path: str | os.PathLike[str], scale: str, force: bool = False) -> None:
    """Refuse to replace the result file ``path`` by a run of a smaller ``scale``.

    Raises ValueError naming the file and both scales when ``path`` holds a result recorded at
    ``full`` and ``scale`` is ``quick`` (``scale`` may be a label such as ``"full, reduced: ..."``:
    its first word counts), unless ``force``. Experiments call it before they start, so the
    refusal costs nothing; :func:`write_results` calls it again before writing."""
    if force:
        return
    existing = recorded_scale(path)
    match = re.match(r"\s*(quick|full)\b", str(scale))
    new = match.group(1) if match else None
    if existing is None or new is None:
        return
    if _SCALE_RANK[new] < _SCALE_RANK[existing]:
        raise ValueError(f"{path} holds a {existing}-scale result; refusing to replace it with a {new}-scale run "
                         f"(write elsewhere with --out PATH, or pass --force / force=True to replace it)")


def _is_result_payload(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get("provenance"), dict) and isinstance(payload.get("records"), list)


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a result file written by :func:`write_results`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not valid JSON or not a result file (no provenance/records).
    """
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not _is_result_payload(payload):
        raise ValueError(f"{path} is not a result file: expected an object with 'provenance' and 'records'")
    if payload.get("schema", SCHEMA_VERSION) > SCHEMA_VERSION:
        raise ValueError(f"{path} has schema {payload['schema']}; this hsm reads up to {SCHEMA_VERSION}")
    return payload


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
    as ``(path, payload)``. JSON files that are not result files (a saved tree, say) are skipped;
    a result file that does not parse raises, so a broken committed file cannot go unnoticed."""
    root = default_results_root() if root is None else Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise NotADirectoryError(f"results root {root} is not a directory")
    for path in sorted(root.rglob("*.json")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # temporary files of an in-progress write, hidden folders
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        if _is_result_payload(payload):
            yield path, payload


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


@dataclass(frozen=True)
class ReproductionRow:
    """One row of the reproduction-status table: a paper number and (if measured) ours."""

    claim: str
    description: str
    source: str
    unit: str
    paper_value: float
    paper_printed: str
    ours: float | None = None
    scale: str | None = None
    hardware: str | None = None
    date_utc: str | None = None
    result_file: str | None = None

    @property
    def delta(self) -> float | None:
        """ours - paper, in the paper's unit (None when not measured)."""
        return None if self.ours is None else self.ours - self.paper_value

    @property
    def reproduced(self) -> bool:
        return self.ours is not None


def reproduction_rows(
    root: str | os.PathLike[str] | None = None, claims: Iterable[str] | None = None
) -> list[ReproductionRow]:
    """The rows of the landing page's table: every claim in ``claims`` (default
    :data:`hsm.paper.HEADLINE`) plus every other claim that a result file reports.

    A claim measured at several scales gets one row per scale (full first), each from the most
    recent result (by ``provenance.date_utc``); a claim with no result gets one row with
    ``ours=None``. A file whose ``provenance.config.complete`` is False (a run still going, which
    rewrites its file after every part) is left out until it is complete.
    """
    root_path = default_results_root() if root is None else Path(root)
    order = list(paper.HEADLINE if claims is None else claims)
    for key in order:
        paper.get(key)
    latest: dict[tuple[str, str], tuple[str, float, Mapping[str, Any], Path]] = {}
    for path, payload in iter_results(root_path):
        prov = payload["provenance"]
        config = prov.get("config")
        if isinstance(config, Mapping) and config.get("complete") is False:
            continue  # a run still going (or cut short) writes its partial means: not a measurement of the claim yet
        for index, record in enumerate(payload["records"]):
            claim = record.get("claim") if isinstance(record, dict) else None
            if claim is None:
                continue
            paper.get(claim)  # a result naming an unknown claim is an error in that result file
            value = record.get("value")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{path}: records[{index}] (claim {claim!r}) has a non-numeric value {value!r}")
            scale = str(prov.get("hsm_scale") or "unknown")
            date = str(prov.get("date_utc") or "")
            previous = latest.get((claim, scale))
            if previous is None or date >= previous[0]:
                latest[(claim, scale)] = (date, float(value), prov, path)
            if claim not in order:
                order.append(claim)

    rows: list[ReproductionRow] = []
    scale_rank = {"full": 0, "quick": 1}
    for claim in order:
        number = paper.get(claim)
        common = dict(
            claim=claim, description=number.label(), source=number.source, unit=number.unit,
            paper_value=number.value, paper_printed=number.printed,
        )
        measured = sorted(
            ((scale, entry) for (c, scale), entry in latest.items() if c == claim),
            key=lambda item: (scale_rank.get(item[0], 2), item[0]),
        )
        if not measured:
            rows.append(ReproductionRow(**common))
            continue
        for scale, (date, value, prov, path) in measured:
            try:
                shown_path = str(path.relative_to(root_path.parent))
            except ValueError:
                shown_path = str(path)
            rows.append(ReproductionRow(
                **common, ours=value, scale=scale, hardware=hardware_summary(prov),
                date_utc=date or None, result_file=shown_path,
            ))
    return rows


def _format_number(value: float, unit: str) -> str:
    text = f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    if unit in ("x", "%"):
        return f"{text}{unit}"
    if unit == "":
        return text
    return f"{text} {unit}"


def reproduction_table_markdown(rows: Sequence[ReproductionRow]) -> str:
    """The rows as a Markdown table: claim, source, paper's number, ours, delta, scale, hardware."""
    header = "| Claim | Source | Paper | Ours | Delta | Scale | Hardware |\n|---|---|---|---|---|---|---|\n"
    lines = []
    for row in rows:
        paper_text = _format_number(row.paper_value, row.unit)
        if row.ours is None:
            ours, delta, scale, hardware = "not yet reproduced", "", "", ""
        else:
            ours = _format_number(row.ours, row.unit)
            delta = f"{row.delta:+.3g}"
            scale, hardware = row.scale or "", row.hardware or ""
        cells = [row.description, row.source, paper_text, ours, delta, scale, hardware]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return header + "\n".join(lines) + "\n"
