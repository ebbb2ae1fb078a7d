"""``python -m hsm reproduce RESULT.json``: run a result file's command again and compare.

A result file (:mod:`hsm_lab.results`) records the command that made it (``provenance.invocation``:
the experiment, its scale, device and ``-o`` options, or the benchmark's arguments) and the code
(``git_commit``, plus ``git_diff`` when that code had uncommitted changes). This command runs the
same command again into a scratch folder (training every run again there: finished runs in the
runs folder, ``HSM_RUNS``, are read only with ``--reuse-runs``), then prints every measured number of the old file beside
the new one with the difference, and exits with status 1 when a number differs by more than the
tolerance:

.. code-block:: text

    python -m hsm reproduce results/lm/ptb.json              # at the scale the file records
    python -m hsm reproduce results/lm/ptb.json --scale quick # the same command on the quick slice
    python -m hsm reproduce FILE --rtol 0.02                  # rows with a seed spread (threaded runs)

Timings (fields named like times, ``*_ms``, ``ms_per_*``, ``*_seconds``, ``*_s``, ``time``,
``speedup``, ..., and a record's ``value`` whose ``measure`` or ``kind`` is one: :func:`is_timing`)
are shown and counted as "timings, not compared": they measure the machine. A run at another
scale than the file's is shown and not checked either.

The default tolerance follows what the arithmetic can promise. Integers (counts, sizes, epochs)
must be equal. Float results must be equal too when the re-run did the same arithmetic as the
file's run: one thread, the same CPU model, vector extensions and kernels, and the same torch,
numpy and numba (:func:`hsm_lab.results.machine_arithmetic`; the provenance records them). Otherwise
float results are compared at a relative :data:`FLOAT32_RTOL`: the models train in float32, whose
rounding (a relative ``6e-8`` per operation) depends on the order of each sum, and that order
changes with the instruction set, the thread count and the libraries' kernels; a training run
carries those differences through all its steps (about ``2e-6`` between two CPUs on the quick
files), while a change of method or setting moves the numbers by the seed spread (``1e-2``).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hsm_lab import config as hsm_config
from hsm_lab.results import _CODE_AT_START, check_destination, load_results, machine_arithmetic, scale_of_label

__all__ = ["Difference", "ReproduceError", "FLOAT32_RTOL", "same_arithmetic", "invocation_of", "command_for",
           "compare_records", "is_timing", "main"]

#: relative tolerance for float results re-run with other arithmetic (another CPU, thread count or
#: library version): float32 training differs there by about 1e-6 relative, the seed spread is 1e-2
FLOAT32_RTOL = 1e-4

#: names that measure the machine, not the method (shown, never compared): times in any unit
#: (``ms_per_batch``, ``train_ms_per_batch``, ``cpu_ms``, ``reassign_s``, ``train_seconds``,
#: ``seconds_per_epoch``, ``wall_time_s``, ``phases_ms.*``), and what is made of times (``speedup_*``,
#: ``*_overhead``, ``throughput``, ratios, the benchmark's ``floor_*`` and ``steal_*``). Matched
#: against every part of a field's path (``reassignments[3].seconds``) and, for a record's
#: ``value``, against what the record says it measures (``measure``, ``kind`` or the claim's last
#: part, as :mod:`hsm_lab.results` records write it)
_TIMING_NAME = re.compile(
    r"(^|_)(ms|s|sec|secs|seconds|wall|ratio|throughput|per_s|overhead|floor|steal)(_|$)|time|speed")

#: the fields that say what a record's ``value`` is
_MEASURE_FIELDS = ("measure", "kind", "metric")


def is_timing(field: str, record: Mapping[str, Any] | None = None) -> bool:
    """Whether ``field`` (a path as :func:`compare_records` names it: ``value``,
    ``per_epoch[2].train_nll``, ``reassignments[0].seconds``) of ``record`` holds a time or a
    number made of times, which measures the machine and is reported as a timing, never compared.
    The rule: some part of the path is named like a time (``_TIMING_NAME``), or the field is the
    record's ``value`` and the record's ``measure`` / ``kind`` or its claim's last part is."""
    parts = [part for part in re.split(r"[.\[\]]", field) if part and not part.isdigit()]
    if any(_TIMING_NAME.search(part) for part in parts):
        return True
    if field == "value" and record is not None:
        said = [record.get(key) for key in _MEASURE_FIELDS] + [str(record.get("claim") or "").rsplit(".", 1)[-1]]
        return any(isinstance(name, str) and name and _TIMING_NAME.search(name) for name in said)
    return False


#: the benchmark commands, recorded as ``{"command": ..., "argv": [...]}`` and re-run with ``--json OUT``
_BENCH_COMMANDS = ("bench", "bench-decoding")


class ReproduceError(ValueError):
    """The file cannot be reproduced as asked (no recorded command, a command that failed)."""


def invocation_of(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> dict[str, Any]:
    """The command recorded in a result file's provenance (``provenance.invocation``), or for a
    file written before commands were recorded, the one its settings determine
    (:func:`_inferred_invocation`: the language models, Barber & Botev's experiments, Schuurmans &
    Frasincar's tables, ICML Tables 1 and 3, the compiled trainer's experiments and the benchmarks).
    The committed files of that age carry the inferred command in their provenance, marked
    ``"inferred": true`` with the ``inferred_from`` it was read from.

    Raises:
        ReproduceError: the file records none (it was written before result files recorded their
            command); the message gives what the provenance does say.
    """
    prov = payload.get("provenance") or {}
    invocation = prov.get("invocation")
    if isinstance(invocation, Mapping) and invocation.get("command") in ("run",) + _BENCH_COMMANDS:
        return dict(invocation)
    inferred = _inferred_invocation(prov, payload.get("records") or [])
    if inferred is not None:
        return inferred
    experiment = (prov.get("config") or {}).get("experiment") if isinstance(prov.get("config"), Mapping) else None
    hint = f" (its config names experiment {experiment!r})" if experiment else ""
    raise ReproduceError(
        f"{path} does not record the command that made it{hint}: it was written before result files "
        f"recorded their command. Run the command given in the chapter that shows it; the settings "
        f"that ran are in its provenance.config (scale {prov.get('hsm_scale')!r}, commit "
        f"{str(prov.get('git_commit'))[:12]})")


def _option_text(value: Any) -> str:
    """An option value as ``-o KEY=VALUE`` takes it (lists comma-separated)."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


#: Schuurmans & Frasincar table settings that the first result files do not record, with the
#: value those runs had (random-init embeddings came before the GloVe stand-ins were an option)
_TAXONOMY_UNRECORDED = {"embeddings": "random"}

#: ICML table settings that the compiled trainer's first result files do not record, with the value
#: those runs had (the test time of one pass)
_TABLE_UNRECORDED = {"timing_passes": 1}


def _inferred_invocation(prov: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The command of a file written before results recorded theirs, where its settings determine it.

    The language models store the experiment and the options that changed its preset
    (``config.overrides``, and the rows that ran, ``config.runs``); Barber & Botev's experiments and
    Schuurmans & Frasincar's tables store every setting, so the options are the settings that
    differ from today's preset of the file's scale, and so do ICML Tables 1 and 3 and the compiled
    trainer's experiments (:func:`hsm_lab.experiments.classification_fast.option_settings`); a
    benchmark's arguments are those of its settings that differ from the parser's defaults. Other
    files give None. The result is marked ``"inferred": True``."""
    config = prov.get("config")
    if not isinstance(config, Mapping):
        return None
    scale = scale_of_label(prov.get("hsm_scale"))
    if scale not in ("quick", "full"):
        return None
    device = str(config.get("device") or "cpu")
    experiment = config.get("experiment")
    if experiment is None and {"vocab", "methods", "metrics", "predict_scale"} <= set(config):
        return {"command": "bench", "argv": _bench_argv(config), "inferred": True}
    if isinstance(config.get("overrides"), Mapping) and isinstance(experiment, str):
        options = {k: _option_text(v) for k, v in config["overrides"].items()}
        description = config.get("description")
        if "description" not in options and isinstance(description, str):
            # files written before the overrides kept the description: pass it again where it is
            # not the preset's, or the rerun would describe another run
            from hsm_lab.experiments.lm.presets import SCALES

            preset = SCALES.get(experiment, {}).get(scale)
            if preset is not None and description != preset.description:
                options["description"] = description
        if experiment != "lm-ptb-ablation" and isinstance(config.get("runs"), list):
            # no rows trained: the run only picked the learning rate
            options["runs"] = _option_text(config["runs"]) or "selection"
    else:
        from hsm_lab.experiments.sampling.presets import FIG_SETTINGS, LM_SETTINGS

        figure = next((r.get("figure") for r in records if isinstance(r, Mapping) and r.get("figure")), None)
        if experiment is None and config.get("table") in ("table1", "table3") and "dims" in config:
            from hsm_lab.experiments.classification.config import _config_json, _parse_options

            experiment = "icml-table1" if config["table"] == "table1" else "icml-table3"
            preset = _config_json(_parse_options(scale, {}))
        elif experiment is None and config.get("loader") is not None and isinstance(config.get("data"), str):
            from hsm_lab.experiments.taxonomy import DATASETS, _settings

            if config["data"] not in DATASETS:
                return None
            experiment, preset = "taxonomy-tables", {**_settings(scale, config["data"], {}), "data": None}
            # settings older files do not record, at the value every run had before they existed
            config = {**_TAXONOMY_UNRECORDED, **config}
        elif experiment in ("icml-fast-ablation", "fast-classifier-repeats", "fast-time-split"):
            from hsm_lab.experiments.classification_fast import option_settings

            # these record every setting under its own name: compared by the option that sets each
            preset = option_settings(experiment, scale)
            config = option_settings(experiment, scale, {**_TABLE_UNRECORDED, **config})
            if set(preset) - set(config):
                return None  # a setting the file does not record: its command cannot be told
        elif experiment == "lm-ptb-sampling":
            preset = LM_SETTINGS[scale]
        elif experiment is None and figure in ("fig1", "fig2"):
            experiment, preset = f"sampling-{figure}", FIG_SETTINGS[scale]
        else:
            return None
        # a stored None is the preset's 0 ("everything") once resolved
        options = {k: _option_text(config[k]) for k, default in preset.items()
                   if k in config and config[k] != default and not (config[k] is None and default in (0, None))}
    return {"command": "run", "experiment": experiment, "scale": scale, "device": device,
            "options": options, "inferred": True}


def _bench_argv(config: Mapping[str, Any]) -> list[str]:
    """``python -m hsm bench`` arguments that give ``config`` (a benchmark file's settings: every
    argument it parsed), naming only those that differ from the parser's defaults."""
    from hsm_lab.bench import _parser, scale_defaults

    parser = _parser()
    # the sizes left unset are recorded as the scale filled them in: passing them again would
    # change the command (--algorithm1 without --vocab times V = 250k, with it the first size)
    filled = scale_defaults(bool(config.get("quick")))
    argv: list[str] = []
    for action in parser._actions:
        key = action.dest
        if key in ("help", "json", "one", "force", "allow_dirty") or key not in config:
            continue
        value, default = config[key], filled.get(action.dest, action.default)
        flag = action.option_strings[0] if action.option_strings else None
        if flag is None or value == default or (isinstance(value, list) and default is not None
                                                and list(value) == list(default)):
            continue
        if action.nargs == 0:  # store_true
            if value:
                argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def command_for(invocation: Mapping[str, Any], out: Path, scale: str | None = None,
                allow_dirty: bool = False) -> list[str]:
    """The ``python -m hsm ...`` command line that re-runs ``invocation``, writing to ``out``.

    ``scale`` (``quick``/``full``) replaces the recorded scale; ``allow_dirty`` passes
    ``--allow-dirty`` to a full-scale run from a checkout with uncommitted changes."""
    python = [sys.executable, "-m", "hsm"]
    if invocation["command"] == "run":
        run_scale = scale or str(invocation.get("scale", "quick"))
        cmd = [*python, "run", str(invocation["experiment"]), "--scale", run_scale,
               "--device", str(invocation.get("device", "cpu")), "--out", str(out)]
        for key, value in (invocation.get("options") or {}).items():
            cmd += ["-o", f"{key}={value}"]
        if allow_dirty:
            cmd.append("--allow-dirty")
        return cmd
    argv = [str(a) for a in invocation.get("argv") or []]
    if scale == "quick" and "--quick" not in argv:
        argv.append("--quick")
    elif scale == "full" and "--quick" in argv:
        argv = [a for a in argv if a != "--quick"]
    cmd = [*python, str(invocation["command"]), *argv, "--json", str(out)]
    if allow_dirty and "--allow-dirty" not in argv:
        cmd.append("--allow-dirty")
    return cmd


@dataclass(frozen=True)
class Difference:
    """One measured number, old against new."""

    record: str  #: the record's non-numeric fields, as ``key=value`` text
    field: str
    old: float | None
    new: float | None
    checked: bool  #: False for timings (and for every field when the scales differ)
    timing: bool = False  #: a time or a number made of times (:func:`is_timing`): never compared

    @property
    def delta(self) -> float | None:
        return None if self.old is None or self.new is None else self.new - self.old

    @property
    def integer(self) -> bool:
        """Both sides are JSON integers (counts, sizes): compared exactly whatever the tolerance."""
        return isinstance(self.old, int) and isinstance(self.new, int)

    def within(self, rtol: float, atol: float) -> bool:
        if self.old is None or self.new is None:
            return self.old is None and self.new is None
        if self.integer:
            return self.old == self.new
        if not (math.isfinite(self.old) and math.isfinite(self.new)):
            return self.old == self.new or (math.isnan(self.old) and math.isnan(self.new))
        return abs(self.new - self.old) <= atol + rtol * abs(self.old)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same_arithmetic(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two runs, given their provenances, did the same float operations in the same order:
    both on one thread, with equal :func:`hsm_lab.results.machine_arithmetic` (a provenance without
    those fields never qualifies). Only then are float results compared exactly by default."""
    mine = machine_arithmetic(old)
    return mine is not None and mine == machine_arithmetic(new) and old.get("threads") == 1


def _identity(record: Mapping[str, Any]) -> str:
    """What a record is about: its fields that are not numbers (claim, method, data set, ...)."""
    parts = [f"{k}={v}" for k, v in record.items() if not _is_number(v) and not isinstance(v, (list, dict))]
    return ", ".join(parts) or "(no labels)"


def compare_records(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]],
                    checked: bool = True) -> list[Difference]:
    """Every number of every record of ``old`` beside the same field of the matching ``new`` record.

    Records are matched by their non-numeric fields (:func:`_identity`), in order among equals, so
    a run that lists the same rows in another order still matches; failing that, by the first new
    record that has every non-numeric field of the old one with the same value (a newer version
    that labels its records with more fields). A row missing on either side
    appears with ``None`` on that side (and fails a check). Lists and dicts inside records (curves,
    per-epoch values) are compared element by element under ``field[i]`` / ``field.key``."""
    pending: dict[str, list[Mapping[str, Any]]] = {}
    for record in new:
        pending.setdefault(_identity(record), []).append(record)
    out: list[Difference] = []

    def numbers(value: Any, name: str) -> dict[str, float]:
        if _is_number(value):
            return {name: value}  # an int stays an int: integers are compared exactly
        if isinstance(value, list):
            return {k: v for i, item in enumerate(value) for k, v in numbers(item, f"{name}[{i}]").items()}
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in numbers(item, f"{name}.{key}").items()}
        return {}

    def flat(record: Mapping[str, Any]) -> dict[str, float]:
        return {k: v for key, value in record.items() for k, v in numbers(value, key).items()}

    def labels(record: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if not _is_number(v) and not isinstance(v, (list, dict))}

    for record in old:
        ident = _identity(record)
        match = pending.get(ident, [])
        if not match:
            # a newer version may label its records with more fields (a new "trained_on", say): the
            # first new record that carries every label of the old one, with the same values
            wanted = labels(record).items()
            match = next((records for key, records in pending.items() if records
                          and wanted <= labels(records[0]).items()), [])
        other = match.pop(0) if match else None
        old_numbers, new_numbers = flat(record), flat(other) if other is not None else {}
        for field in dict.fromkeys([*old_numbers, *new_numbers]):
            timing = is_timing(field, record)
            out.append(Difference(ident, field, old_numbers.get(field), new_numbers.get(field),
                                  checked and not timing, timing))
    for ident, records in pending.items():  # rows only the new run has
        for record in records:
            for field, value in flat(record).items():
                timing = is_timing(field, record)
                out.append(Difference(ident, field, None, value, checked and not timing, timing))
    return out


def _fmt(value: float | None) -> str:
    if value is None:
        return "missing"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.6g}"


def _report(diffs: Sequence[Difference], rtol: float, atol: float, show_all: bool = False) -> tuple[str, int]:
    """The old/new table as text, and how many checked numbers are outside the tolerance.

    Unless ``show_all``, a record shows its ``value`` and the numbers that differ beyond the
    tolerance, not every point of its curves."""
    lines, failures, current = [], 0, None
    for d in diffs:
        ok = d.within(rtol, atol)
        failures += d.checked and not ok
        if not (show_all or d.field == "value" or (d.checked and not ok)):
            continue
        if d.record != current:
            current = d.record
            lines.append(f"{d.record}")
        mark = "  " if not d.checked else ("ok" if ok else "!!")
        delta = "" if d.delta is None else f"{d.delta:+.3g}"
        note = "  (timing, not compared)" if d.timing else ("" if d.checked else "  (not checked)")
        lines.append(f"  {mark} {d.field:<32} {_fmt(d.old):>14} -> {_fmt(d.new):<14} {delta}{note}")
    return "\n".join(lines), failures


def _check_keep(keep: Path, result: Path) -> None:
    """``--keep`` must be a writable folder (or one that can be made) in which the re-run does not
    land on the result file itself; ValueError naming the problem otherwise, before anything runs."""
    if keep.exists() and not keep.is_dir():
        raise ValueError(f"--keep {keep} is a file: --keep names a folder for the new result (e.g. {keep.parent / 'rerun'})")
    out = keep / result.name
    if out.exists() and out.resolve() == result.resolve():
        raise ValueError(f"--keep {keep} is the folder of {result}: the re-run would replace the file it is compared "
                         f"with; choose another folder")
    if out.exists() or out.is_symlink():
        raise ValueError(f"--keep {keep} already holds a {result.name}: the re-run would replace it; choose an empty "
                         f"folder or move that file away")
    check_destination(out, what="the re-run's result", fix="choose another --keep folder")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hsm reproduce",
        description="Run a result file's recorded command again in a scratch folder and compare every "
                    "number, old against new; exit status 1 when one differs beyond the tolerance.")
    parser.add_argument("result", type=Path, help="a result file (e.g. results/lm/ptb.json)")
    parser.add_argument("--scale", choices=["quick", "full"], default=None,
                        help="run at this scale instead of the file's (numbers are then shown, not checked)")
    parser.add_argument("--rtol", type=float, default=None,
                        help=f"relative tolerance for float results (default: 0 when the re-run did the same "
                             f"arithmetic as the file's run, one thread on the same CPU and libraries; else "
                             f"{FLOAT32_RTOL:g}, what float32 training supports across machines); use the seed "
                             f"spread, e.g. 0.02, for threaded runs. Integers are always compared exactly")
    parser.add_argument("--atol", type=float, default=None,
                        help="absolute tolerance for float results (default 0 with the same arithmetic, else 1e-9)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the new result here instead of a temporary folder (kept)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="let a full-scale re-run go ahead from code with uncommitted changes")
    parser.add_argument("--reuse-runs", action="store_true",
                        help="read finished training runs from the runs folder (HSM_RUNS) instead of training "
                             "them again in the scratch folder (faster, but those runs may come from other code)")
    parser.add_argument("--all", action="store_true",
                        help="print every number (default: each record's value and the numbers that differ)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    prog = "hsm reproduce"
    if not all(value is None or (value >= 0 and math.isfinite(value)) for value in (args.rtol, args.atol)):
        print(f"{prog}: --rtol and --atol must be finite and >= 0", file=sys.stderr)
        return 2
    if args.result.is_dir():
        print(f"{prog}: {args.result} is a folder, not a result file: give one of its .json files "
              f"(e.g. {args.result / 'NAME.json'})", file=sys.stderr)
        return 2
    try:
        payload = load_results(args.result)
        invocation = invocation_of(args.result, payload)
        if args.keep is not None:
            _check_keep(args.keep, args.result)
    except FileNotFoundError:
        print(f"{prog}: {args.result}: no such file", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{prog}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    prov = payload["provenance"]
    recorded_scale = scale_of_label(prov.get("hsm_scale") or invocation.get("scale") or "full")
    scale = args.scale or recorded_scale
    same_scale = scale == recorded_scale

    if invocation.get("inferred"):
        print(f"{args.result}: the file predates recorded commands; this one is inferred from its settings")
    commit, dirty = _CODE_AT_START
    made_by = str(prov.get("git_commit"))[:12] + (" plus uncommitted changes" if prov.get("git_dirty") else "")
    running = f"{str(commit)[:12]}{' plus uncommitted changes' if dirty else ''}"
    print(f"{args.result}: made by commit {made_by}; re-running with {running}, scale {scale}")
    if prov.get("git_commit") != commit:
        print("  (another commit: a difference may come from a change of code)")

    scratch = args.keep if args.keep is not None else Path(tempfile.mkdtemp(prefix="hsm-reproduce-"))
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        out = scratch / args.result.name
        cmd = command_for(invocation, out, scale=scale, allow_dirty=args.allow_dirty)
        print("$ python -m hsm " + " ".join(cmd[3:]), flush=True)
        env = dict(os.environ, HSM_OUTPUT=str(scratch))
        if not args.reuse_runs:  # a run finished earlier, perhaps by other code, is not a re-run
            env[hsm_config.RUNS_ENV] = str(scratch / "runs")
        status = subprocess.run(cmd, env=env).returncode
        if status in (130, -2):  # the re-run was stopped by Ctrl-C (the signal reaches it first, at times)
            raise KeyboardInterrupt
        if status != 0 or not out.exists():
            print(f"{prog}: the command failed (exit status {status}); nothing to compare", file=sys.stderr)
            return 1
        new = load_results(out)
        exact = same_arithmetic(prov, new["provenance"])
        rtol = args.rtol if args.rtol is not None else (0.0 if exact else FLOAT32_RTOL)
        atol = args.atol if args.atol is not None else (0.0 if exact else 1e-9)
        diffs = compare_records(payload["records"], new["records"], checked=same_scale)
        table, failures = _report(diffs, rtol, atol, show_all=args.all)
        print(table)
        checked = sum(d.checked for d in diffs)
        timings = sum(d.timing for d in diffs)
        if not same_scale:
            print(f"ran at scale {scale}, the file holds {recorded_scale}: {len(diffs)} numbers shown, none checked")
            return 0
        if args.rtol is None and args.atol is None:
            rule = ("the same arithmetic as the file's run (one thread, same CPU and libraries): floats exactly"
                    if exact else "other arithmetic than the file's run (or not recorded): floats at the float32 "
                                  "tolerance")
        else:
            rule = "floats at the tolerance asked for"
        print(f"{checked} numbers checked (integers exactly; {rule}; rtol {rtol:g}, atol {atol:g}): "
              f"{checked - failures} agree, {failures} differ; {timings} timings, not compared"
              + ("" if args.keep is None else f"; new result kept in {out}"))
        return 1 if failures else 0
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
