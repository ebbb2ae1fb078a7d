"""``python -m hsm run``: list or run the registered experiments."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import REGISTRY, get, load_all


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hsm run", description="Run one experiment (a table or figure).")
    parser.add_argument("name", nargs="?", help="experiment name; omit (or 'list') to list them")
    parser.add_argument("--scale", choices=["quick", "full"], default=None,
                        help="quick (CI-sized slice) or full (the paper's scale); default: $HSM_SCALE or quick")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--out", type=Path, default=None, help="result file (default: the experiment's own)")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="experiment-specific option (repeatable)")
    args = parser.parse_args(argv)
    failed = load_all()
    if args.name in (None, "list"):
        for name, exp in sorted(REGISTRY.items()):
            print(f"{name:28s} {exp.summary}  -> {exp.default_out}")
        for line in failed:
            print(f"(not available: {line})", file=sys.stderr)
        return 0
    try:
        exp = get(args.name)
    except ValueError as exc:
        print(f"hsm run: {exc}", file=sys.stderr)
        return 2
    scale = args.scale or os.environ.get("HSM_SCALE", "quick")
    options = {}
    for item in args.option:
        if "=" not in item:
            print(f"hsm run: option {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        key, value = item.split("=", 1)
        options[key] = value
    path = exp.func(scale=scale, device=args.device, out=args.out, **options)
    print(f"wrote {path}")
    return 0
