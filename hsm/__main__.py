"""Command line: ``python -m hsm {data,run,bench,reproduce,supervised,test,predict,predict-prob} ...``.

``supervised``, ``test``, ``predict`` and ``predict-prob`` are fastText's commands, on hsm's
classifier (:mod:`hsm.fasttext_cli`)."""
from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> module exposing ``main(argv: list[str]) -> int`` ("module:function" for another name)
_COMMANDS = {
    "data": ("hsm.data.cli", "list, fetch, verify and describe the data sets"),
    "run": ("hsm.experiments.cli", "run an experiment (a table or figure of the papers)"),
    "bench": ("hsm.bench", "benchmark the output layers side by side"),
    "reproduce": ("hsm.reproduce", "run a result file's recorded command again and compare its numbers"),
    "supervised": ("hsm.fasttext_cli:supervised", "train a classifier on a fastText file (__label__ format)"),
    "test": ("hsm.fasttext_cli:test", "print N, P@k, R@k of a model on a fastText file"),
    "predict": ("hsm.fasttext_cli:predict", "print the k most likely labels of every line of a file"),
    "predict-prob": ("hsm.fasttext_cli:predict_prob", "predict, with the labels' probabilities"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m hsm", description=__doc__)
    parser.add_argument("command", choices=sorted(_COMMANDS), help="; ".join(f"{k}: {v[1]}" for k, v in _COMMANDS.items()))
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args, rest = parser.parse_known_args(argv[:1])
    module_name, _, function = _COMMANDS[args.command][0].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            print(f"hsm {args.command}: not available in this version ({module_name} is missing)", file=sys.stderr)
            return 2
        raise
    return int(getattr(module, function or "main")(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
