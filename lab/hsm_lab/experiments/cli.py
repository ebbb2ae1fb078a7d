"""``python -m hsm run``: list or run the registered experiments.

Without ``--out`` a run writes under :func:`hsm_lab.results.output_root` (``HSM_OUTPUT``, default
``./hsm-results``), at the path the experiment registers below ``results/`` (``lm-ptb`` ->
``hsm-results/lm/ptb.json``): the committed ``results/`` change only when ``--out`` names a file
there, and a file recorded at full scale is not replaced by a quick run without ``--force``.

Bad input (an unknown experiment or option, an option value out of range, a scale other than
quick/full, a device torch cannot use here, a refused replacement, an unusable ``--out`` or
``HSM_OUTPUT``, a bad ``HSM_THREADS``) is one line on stderr and exit status 2, before any work is
done, and so is a full-scale run from code with uncommitted changes unless ``--allow-dirty``
(:func:`hsm_lab.results.check_code_committed`); a full disk while writing a result or checkpoint is one
line naming the file, exit status 1. Every result file records the command that made it
(``provenance.invocation``), which ``python -m hsm reproduce`` runs again.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hsm.atomic import DiskFullError
from hsm.cli_text import plain
from hsm_lab.config import env_threads
from hsm_lab.data.errors import DataError
from hsm_lab.results import check_code_committed, recording_invocation

from hsm_lab.experiments import REGISTRY, check_device, check_scale, get, load_all

#: keyword arguments the CLI passes itself; ``-o`` may not set them
_RESERVED = {"scale", "device", "out", "force", "allow_dirty"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hsm run", description=plain(__doc__.split("\n\n")[0]),
        epilog="HSM_PREBUILT_CORPUS=DIR: the Gutenberg LM experiments load the corpus that 'python -m hsm data "
               "export gutenberg DIR' wrote there, on a machine without the Gutenberg archive.")
    parser.add_argument("name", nargs="?", help="experiment name; omit (or 'list') to list them")
    parser.add_argument("--scale", choices=["quick", "full"], default=None,
                        help="quick (CI-sized slice) or full (the paper's scale); default: $HSM_SCALE or quick")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (checked before the run)")
    parser.add_argument("--out", type=Path, default=None,
                        help="result file (default: the experiment's path under $HSM_OUTPUT or ./hsm-results; "
                             "--out results/... updates a committed result)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing result file even when it was recorded at a larger scale")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="experiment-specific option (repeatable); the LM tables (lm-ptb, lm-ptb-schedules, "
                             "lm-gutenberg-65, lm-gutenberg-75) also take -o runs=flat,random (train only these rows, "
                             "e.g. a table in parts) and -o checkpoint_minutes=N (a checkpoint every N minutes of "
                             "training within an epoch; default: $HSM_CHECKPOINT_SECONDS, else 5 minutes)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run at full scale although the code has uncommitted changes (recorded in the "
                             "result; by default such a run is refused, since its result could not be traced)")
    args = parser.parse_args(argv)
    failed = load_all()
    if args.name in (None, "list"):
        from hsm_lab.results import output_path

        for name, exp in sorted(REGISTRY.items()):
            print(f"{name:28s} {exp.summary}  -> {output_path(exp.default_out)}")
        for line in failed:
            print(f"(not available: {line})", file=sys.stderr)
        return 0
    try:
        exp = get(args.name)
        if args.scale is not None:
            scale = args.scale
        else:
            from hsm_lab.config import scale as env_scale

            scale = env_scale()  # HSM_SCALE, validated (ValueError naming it)
        check_scale(scale)
        env_threads()  # HSM_THREADS=abc: named here, before any work
        device = check_device(args.device)
        options: dict[str, str] = {}
        for item in args.option:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"option {item!r} is not KEY=VALUE")
            if key in _RESERVED:
                raise ValueError(f"option {key!r} is set with --{key}, not -o")
            if key in options:
                raise ValueError(f"option {key!r} given twice ({options[key]!r} and {value!r})")
            options[key] = value
        check_code_committed(scale, args.allow_dirty)
        invocation = {"command": "run", "experiment": exp.name, "scale": scale, "device": device,
                      "options": options, **({"allow_dirty": True} if args.allow_dirty else {})}
        with recording_invocation(invocation):
            path = exp.func(scale=scale, device=device, out=args.out, force=args.force, **options)
    except (ValueError, DataError) as exc:
        # bad input: one line naming the problem, no traceback (a bug still raises everything else)
        message = " ".join(str(exc).split())
        print(f"hsm run {args.name}: {message}", file=sys.stderr)
        return 2
    except DiskFullError as exc:  # the file is named; the previous one is intact
        print(f"hsm run {args.name}: {exc.strerror}", file=sys.stderr)
        return 1
    except FloatingPointError as exc:  # a diverged run: one line saying where, not a traceback
        message = " ".join(str(exc).split())
        print(f"hsm run {args.name}: the run diverged ({message}); try a smaller learning rate", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0
