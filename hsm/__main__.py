"""Command line: ``python -m hsm <command> ...`` (also installed as ``hsm``); ``python -m hsm
<command> --help`` describes each command.

``supervised``, ``test``, ``predict`` and ``predict-prob`` are fastText's commands, on hsm's
classifier, and ``add-labels`` adds labels to a trained model (:mod:`hsm.classifiers.fasttext_cli`).
``data``, ``run``, ``bench``, ``bench-decoding`` and ``reproduce`` belong to the book's lab, a
distribution of its own (``hsm-lab``, the repository's ``lab/`` folder): they run where it is
installed."""
from __future__ import annotations

import argparse
import importlib
import sys

from hsm.cli_text import plain

#: the lab's package: the one place the library names it, to forward the lab's commands
LAB_PACKAGE = "hsm_lab"

# sub-command -> module exposing ``main(argv: list[str]) -> int`` ("module:function" for another name)
_COMMANDS = {
    "data": (f"{LAB_PACKAGE}.data.cli", "list, fetch, verify and describe the data sets"),
    "run": (f"{LAB_PACKAGE}.experiments.cli", "run an experiment (a table or figure of the papers)"),
    "bench": (f"{LAB_PACKAGE}.bench", "benchmark the output layers side by side"),
    "bench-decoding": (f"{LAB_PACKAGE}.bench_decoding", "time top-k decoding and all log-probabilities: tree, flat and adaptive"),
    "reproduce": (f"{LAB_PACKAGE}.reproduce", "run a result file's recorded command again and compare its numbers"),
    "supervised": ("hsm.classifiers.fasttext_cli:supervised", "train a classifier on a fastText file (__label__ format)"),
    "test": ("hsm.classifiers.fasttext_cli:test", "print N, P@k, R@k of a model on a fastText file"),
    "predict": ("hsm.classifiers.fasttext_cli:predict", "print the k most likely labels of every line of a file"),
    "predict-prob": ("hsm.classifiers.fasttext_cli:predict_prob", "predict, with the labels' probabilities"),
    "add-labels": ("hsm.classifiers.fasttext_cli:add_labels", "add labels a tree model never saw, from a few lines each"),
    "warmup": ("hsm._warmup", "compile and cache the numba kernels now instead of in the first training step"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    width = max(map(len, _COMMANDS))
    commands = "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in _COMMANDS.items())
    parser = argparse.ArgumentParser(prog="python -m hsm", description=plain(__doc__), epilog=f"commands:\n{commands}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(_COMMANDS), metavar="command", help="one of the commands below")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args, rest = parser.parse_known_args(argv[:1])
    module_name, _, function = _COMMANDS[args.command][0].partition(":")
    try:
        module = importlib.import_module(module_name)
        return int(getattr(module, function or "main")(argv[1:]) or 0)
    except KeyboardInterrupt:
        # Ctrl-C: one line and 128 + SIGINT, what a shell reports for a command it stopped, for
        # every command (fastText's own say what they did not write); result files are written
        # atomically, so an interrupted command leaves none half written
        print(f"hsm {args.command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        if module_name.startswith(LAB_PACKAGE) and (exc.name or "").split(".")[0] == LAB_PACKAGE:
            print(f"hsm {args.command} is a command of the book's lab, which is not installed: "
                  f"pip install ./lab from a clone of the repository", file=sys.stderr)
            return 2
        if exc.name == module_name:
            print(f"hsm {args.command}: not available in this version ({module_name} is missing)", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
