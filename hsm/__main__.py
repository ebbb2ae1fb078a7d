"""Command line: ``python -m hsm <command> ...`` (also installed as ``hsm``); ``python -m hsm
<command> --help`` describes each command.

``supervised``, ``test``, ``predict`` and ``predict-prob`` are fastText's commands, on hsm's
classifier, and ``add-labels`` adds labels to a trained model (:mod:`hsm.fasttext_cli`)."""
from __future__ import annotations

import argparse
import importlib
import sys

from hsm._help import plain
from hsm._optional import DISTRIBUTION

# sub-command -> module exposing ``main(argv: list[str]) -> int`` ("module:function" for another name)
_COMMANDS = {
    "data": ("hsm.data.cli", "list, fetch, verify and describe the data sets"),
    "run": ("hsm.experiments.cli", "run an experiment (a table or figure of the papers)"),
    "bench": ("hsm.bench", "benchmark the output layers side by side"),
    "bench-decoding": ("hsm.bench_decoding", "time top-k decoding and all log-probabilities: tree, flat and adaptive"),
    "reproduce": ("hsm.reproduce", "run a result file's recorded command again and compare its numbers"),
    "supervised": ("hsm.fasttext_cli:supervised", "train a classifier on a fastText file (__label__ format)"),
    "test": ("hsm.fasttext_cli:test", "print N, P@k, R@k of a model on a fastText file"),
    "predict": ("hsm.fasttext_cli:predict", "print the k most likely labels of every line of a file"),
    "predict-prob": ("hsm.fasttext_cli:predict_prob", "predict, with the labels' probabilities"),
    "add-labels": ("hsm.fasttext_cli:add_labels", "add labels a tree model never saw, from a few lines each"),
    "warmup": ("hsm._warmup", "compile and cache the numba kernels now instead of in the first training step"),
}


#: third-party packages the lab's commands import that the library does not require
_LAB_PACKAGES = ("tqdm", "matplotlib", "sklearn")


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
        if exc.name == module_name:
            print(f"hsm {args.command}: not available in this version ({module_name} is missing)", file=sys.stderr)
            return 2
        package = (exc.name or "").split(".")[0]
        if package in _LAB_PACKAGES:
            # the book's lab (experiments, data sets, benchmarks) needs the `experiments` extra
            print(f"hsm {args.command} needs {package}, installed with the lab's extra: "
                  f"pip install '{DISTRIBUTION}[experiments]'", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
