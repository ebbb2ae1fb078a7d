"""fastText's command line, on :class:`hsm.FastBowClassifier`::

    python -m hsm supervised -input train.txt -output model [-dim 100 -lr 0.1 -epoch 5 -wordNgrams 1
                             -thread N -loss {softmax,hs,huffman,learned} -arity 5
                             -lrSchedule {linear,constant-then-linear} -seed 0 ...]
    python -m hsm test model.bin test.txt [k] [th]
    python -m hsm predict model.bin test.txt [k] [th]
    python -m hsm predict-prob model.bin test.txt [k] [th]
    python -m hsm add-labels model.bin new.txt -output model2 [-reference train.txt -placement objective
                             -localSteps 0 -localLr 0.1 -seed 0]

The files are in fastText's format (``__label__`` labels, :mod:`hsm.classifiers.fasttext_format`); ``-``
reads the test file from standard input. ``supervised`` writes ``<output>.bin`` (hsm's model
file, :meth:`hsm.FastBowClassifier.save`, not readable by fastText); ``test`` prints ``N``,
``P@k``, ``R@k`` as fastText prints them; ``predict`` prints the labels of each line, and
``predict-prob`` each with its probability; ``add-labels`` adds every label of a file that the
model does not know, from the lines that carry it, without retraining
(:meth:`hsm.FastBowClassifier.add_labels_file`), and writes ``<output>.bin``. The options and their defaults are fastText's
supervised ones where fastText has the option; ``-loss`` adds the tree outputs (``hs`` is
fastText's binary Huffman tree, ``huffman`` the M-ary one, ``learned`` the tree learned by
Algorithm 1 from it), with ``-arity`` M. Every loss trains as fastText does at the same options:
the rate decays linearly from ``-lr`` to 0 over all updates (``-lrSchedule linear``) and the
output layer has no bias; ``-lrSchedule constant-then-linear`` is the paper's schedule for
learning a tree (ICML §11.1: the rate stays at ``-lr`` for the first half of training, while
Algorithm 1 rebuilds the tree, then decays linearly to 0), which :class:`hsm.FastBowClassifier`
uses by default for ``output="learned"``. A bad option or value is one line on standard error
and exit status 2, said before training where it can be known then (the ``-output`` folder
must be writable); a model file that cannot be written (a full disk) is one line and exit
status 1, the previous file left as it was; Ctrl-C is one line and exit status 130.

On purpose unlike fastText (the README lists all): every word vector is drawn uniformly in
[-1/dim, 1/dim] whatever ``-thread`` (fastText draws only ``-thread``/10 of its input matrix
below 10 threads and leaves the rest at zero, so it learns slower with fewer threads); the rate's
progress is counted in examples (fastText's in tokens); a UTF-8 byte-order mark opening a file
is skipped; ``test`` counts a gold label written twice on a line once (a line's labels are a
set); ``predict`` writes labels back byte for byte as the file had them, whatever the
terminal's encoding.
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["add_labels", "predict", "predict_prob", "supervised", "test"]

#: -loss -> (FastBowClassifier output, arity or None for -arity's)
_LOSSES = {"softmax": ("flat", None), "hs": ("huffman", 2), "huffman": ("huffman", None),
           "learned": ("learned", None)}

#: -lrSchedule -> FastBowClassifier's lr_schedule
_SCHEDULES = {"linear": "linear", "constant-then-linear": "constant_then_linear"}


class _UsageError(Exception):
    """A bad option or value: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (`{self.prog} -h` lists the options)")


def _fail(command: str, message: str, status: int = 2) -> int:
    print(f"python -m hsm {command}: {message}", file=sys.stderr)
    return status


#: the classifier's setting names -> supervised's options, for the classifier's one-line errors
_OPTIONS = {"dim": "-dim", "lr": "-lr", "epochs": "-epoch", "threads": "-thread", "arity M": "-arity",
            "seed": "-seed", "min_count": "-minCount", "word_ngrams": "-wordNgrams", "bucket": "-bucket"}


def _as_option(error: Exception) -> str:
    """The classifier's message with its setting named as the command line names it."""
    from hsm.classifiers.fast_classifier import SettingError

    if isinstance(error, SettingError) and error.setting in _OPTIONS:
        return error.named(_OPTIONS[error.setting])
    message = str(error)
    for name, option in _OPTIONS.items():
        if message.startswith(name + " "):
            return option + message[len(name):]
    return message


def _check_output(option: str, target: Path) -> None:
    """_UsageError unless ``target`` can be written: not a folder, in a folder that exists and
    takes a new file (tried with a temporary file: permissions, a read-only file system and the
    like all show). Checked before training, which may take hours, not after it."""
    if target.is_dir():
        raise _UsageError(f"-output {option}: {target} is a folder; give a file prefix (e.g. -output "
                          f"{Path(option) / 'model'})")
    folder = target.parent
    if not folder.is_dir():
        raise _UsageError(f"-output {option}: directory {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{target.name}.", suffix=".check"):
            pass
    except OSError as error:
        raise _UsageError(f"-output {option}: cannot write in {folder} ({error.strerror or error}); "
                          "choose a writable folder") from None


def _supervised_parser() -> _Parser:
    parser = _Parser(prog="python -m hsm supervised", allow_abbrev=False,
                     description="Train a classifier on a fastText file (__label__ format), as fastText's "
                                 "supervised does, with a flat softmax or a (learned) tree output. Writes "
                                 "<output>.bin. Defaults are fastText's where fastText has the option.")
    add = parser.add_argument
    add("-input", required=True, metavar="FILE", help="training file, one '__label__a words ...' per line")
    add("-output", required=True, metavar="PREFIX", help="writes PREFIX.bin")
    add("-dim", type=int, default=100, help="size of the word vectors (100)")
    add("-lr", type=float, default=0.1, help="learning rate (0.1)")
    add("-epoch", type=int, default=5, help="passes over the data (5)")
    add("-wordNgrams", type=int, default=1, help="max length of word n-grams (1)")
    add("-minCount", type=int, default=1, help="minimal number of word occurrences (1)")
    add("-bucket", type=int, default=2_000_000, help="number of hash buckets for n-grams (2000000)")
    add("-thread", type=int, default=None, help="Hogwild threads (torch.get_num_threads()); 1 is deterministic")
    add("-loss", choices=sorted(_LOSSES), default="softmax",
        help="output: softmax (flat), hs (binary Huffman tree, fastText's), huffman (M-ary Huffman "
             "tree), learned (tree learned by Algorithm 1 from the Huffman tree) (softmax)")
    add("-arity", type=int, default=5, help="children per node M for -loss huffman and learned (5)")
    add("-lrSchedule", choices=list(_SCHEDULES), default="linear",
        help="learning rate over training: linear (fastText's: from -lr down to 0 over all updates) or "
             "constant-then-linear (the paper's for -loss learned: -lr for the first half, while the tree "
             "is learned, then down to 0; what FastBowClassifier does for output='learned') (linear)")
    add("-label", default="__label__", help="labels prefix (__label__)")
    add("-seed", type=int, default=0, help="seed of the initialisation and the example order (0)")
    add("-verbose", type=int, default=2, help="0: print nothing on stderr (2)")
    return parser


def _interruptible(command: str, run: Any, argv: list[str]) -> int:
    """``run(argv)``, with Ctrl-C one line on stderr and exit status 130 (128 + SIGINT, what a
    shell reports for a command stopped by Ctrl-C) instead of a traceback."""
    try:
        return run(argv)
    except KeyboardInterrupt:
        written = "; no model file was written" if command == "supervised" else ""
        return _fail(command, f"interrupted{written}", status=130)


def _save(command: str, classifier: Any, target: Path) -> int | None:
    """Write ``classifier`` to ``target`` (atomically: a failure leaves any previous file as it
    was); None when written, else the exit status after one line on stderr (130 for Ctrl-C, 1 for
    a file that cannot be written, a full disk named as such)."""
    try:
        classifier.save(target)
    except KeyboardInterrupt:
        return _fail(command, f"interrupted; {target} was not written", status=130)
    except (OSError, RuntimeError) as error:  # RuntimeError: torch's zip writer on a file system that filled up
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            detail = "the disk is full: free some space"
        else:
            detail = (getattr(error, "strerror", None) or str(error) or type(error).__name__).splitlines()[0]
        return _fail(command, f"cannot write {target} ({detail}); any previous {target.name} is unchanged", status=1)
    return None


def supervised(argv: list[str]) -> int:
    """``python -m hsm supervised -input FILE -output PREFIX [options]``: train, write PREFIX.bin.
    Ctrl-C stops training within a fraction of a second (exit status 130); the model file is
    written only once training is done, atomically, so a previous one stays as it was."""
    return _interruptible("supervised", _supervised, argv)


def _supervised(argv: list[str]) -> int:
    from hsm.classifiers.fast_classifier import FastBowClassifier

    parser = _supervised_parser()
    if any(arg in ("-h", "--help", "-help") for arg in argv):
        parser.print_help()
        return 0
    try:
        args = parser.parse_args(argv)
        output, arity = _LOSSES[args.loss]
        if arity is not None and "-arity" in argv and args.arity != arity:
            raise _UsageError(f"-loss {args.loss} is the binary tree (M = 2); for -arity {args.arity} use "
                              "-loss huffman or -loss learned")
        for name in ("wordNgrams", "minCount", "bucket"):
            if getattr(args, name) < 1:
                raise _UsageError(f"-{name} must be >= 1, got {getattr(args, name)}")
        if args.seed < 0:
            raise _UsageError(f"-seed must be >= 0, got {args.seed}")
        # the classifier checks the other values (a ValueError naming the setting). fastText's
        # output matrix has no bias: with one, a small -lr learns the label frequencies long
        # before the words, and on balanced labels the bias follows the last few examples' labels
        classifier = FastBowClassifier(dim=args.dim, output=output, arity=arity or args.arity, lr=args.lr,
                                       epochs=args.epoch, threads=args.thread, seed=args.seed, bias=False,
                                       lr_schedule=_SCHEDULES[args.lrSchedule])
        if args.input != "-" and not Path(args.input).is_file():
            raise _UsageError(f"-input {args.input}: no such file")
        target = Path(args.output + ".bin")
        _check_output(args.output, target)
    except _UsageError as error:
        return _fail("supervised", str(error))
    except (ValueError, TypeError) as error:
        return _fail("supervised", _as_option(error))
    from hsm.classifiers.fast_classifier import SettingError

    start = time.perf_counter()
    try:
        classifier.fit_file(args.input, word_ngrams=args.wordNgrams, min_count=args.minCount, bucket=args.bucket,
                            label=args.label)
    except KeyboardInterrupt:
        return _fail("supervised", f"interrupted; {target} was not written", status=130)
    except SettingError as error:
        return _fail("supervised", f"{args.input}: {_as_option(error)}")
    except (ValueError, FileNotFoundError) as error:
        return _fail("supervised", f"{args.input}: {error}")
    except FloatingPointError as error:
        return _fail("supervised", f"{error} (lower -lr)", status=1)
    seconds = time.perf_counter() - start
    failed = _save("supervised", classifier, target)
    if failed is not None:
        return failed
    if args.verbose > 0:
        dictionary = classifier.dictionary
        # fastText's Dictionary::readFromFile lines, then what was trained and written
        print(f"Read {dictionary.tokens // 1_000_000}M words", file=sys.stderr)
        print(f"Number of words:  {dictionary.num_words}", file=sys.stderr)
        print(f"Number of labels: {dictionary.num_labels}", file=sys.stderr)
        print(f"Trained in {seconds:.1f} s; wrote {target}", file=sys.stderr)
    return 0


def _add_labels_parser() -> _Parser:
    parser = _Parser(prog="python -m hsm add-labels", allow_abbrev=False,
                     description="Add the labels of a fastText file that a trained tree model does not know, "
                                 "from the lines that carry them, without retraining: each new label is placed "
                                 "in the tree by the node objective (Algorithm 2's pair score) and its slot "
                                 "initialised from its lines. Trained labels keep their paths and parameters. "
                                 "Writes <output>.bin; the model file given is not changed.")
    add = parser.add_argument
    add("model", help="model file (what supervised -output PREFIX wrote: PREFIX.bin), with a tree output")
    add("input", help="file in fastText's format whose unknown labels are added (if -, read from stdin)")
    add("-output", required=True, metavar="PREFIX", help="writes PREFIX.bin")
    add("-reference", metavar="FILE", default=None,
        help="a file the model already serves (its training file): its first 2000 lines calibrate the new "
             "labels' slots, so that few of its lines move to a new label (recommended)")
    add("-placement", choices=("objective", "random"), default="objective",
        help="objective: the node objective's best child at each node; random: a random child (objective)")
    add("-localSteps", type=int, default=0,
        help="gradient steps on the new labels' lines after placing them, moving only the parameters on "
             "their paths: the new slots and the slots above them, which trained labels share (0)")
    add("-localLr", type=float, default=0.1, help="rate of those steps (0.1)")
    add("-seed", type=int, default=0, help="seed of -placement random (0)")
    add("-verbose", type=int, default=2, help="0: print nothing on stderr (2)")
    return parser


def add_labels(argv: list[str]) -> int:
    """``python -m hsm add-labels <model> <new-data> -output PREFIX [options]``: add the unknown
    labels of a file to a trained tree model and write PREFIX.bin (atomically)."""
    return _interruptible("add-labels", _add_labels, argv)


def _add_labels(argv: list[str]) -> int:
    from hsm.classifiers.fast_classifier import FastBowClassifier

    parser = _add_labels_parser()
    if any(arg in ("-h", "--help", "-help") for arg in argv):
        parser.print_help()
        return 0
    try:
        args = parser.parse_args(argv)
        if args.localSteps < 0:
            raise _UsageError(f"-localSteps must be >= 0, got {args.localSteps}")
        if args.seed < 0:
            raise _UsageError(f"-seed must be >= 0, got {args.seed}")
        if not (math.isfinite(args.localLr) and args.localLr > 0):
            raise _UsageError(f"-localLr must be a finite number > 0, got {args.localLr}")
        for option, name in (("input", args.input), ("reference", args.reference)):
            if name is not None and name != "-" and not Path(name).is_file():
                raise _UsageError(f"{'-reference ' if option == 'reference' else ''}{name}: no such file")
        path = Path(args.model)
        if not path.is_file():
            raise _UsageError(f"{args.model}: no such model file")
        target = Path(args.output + ".bin")
        if target.exists() and target.resolve() == path.resolve():
            raise _UsageError(f"-output {args.output} would replace the model {args.model}, which add-labels leaves "
                              f"as it is: give another prefix (e.g. -output {args.output}-grown)")
        _check_output(args.output, target)
        classifier = FastBowClassifier.load(path)
        if classifier.dictionary is None:
            raise _UsageError(f"{args.model} was trained on arrays, not on a file: it has no dictionary to read "
                              "labels with")
    except _UsageError as error:
        return _fail("add-labels", str(error))
    except ValueError as error:
        return _fail("add-labels", f"{args.model}: {error}")
    start = time.perf_counter()
    try:
        result, counts = classifier.add_labels_file(args.input, placement=args.placement, seed=args.seed,
                                                    local_steps=args.localSteps, local_lr=args.localLr,
                                                    reference_path=args.reference)
    except (ValueError, FileNotFoundError) as error:
        return _fail("add-labels", str(error))
    seconds = time.perf_counter() - start
    failed = _save("add-labels", classifier, target)
    if failed is not None:
        return failed
    if counts["no_known_word"]:
        print(f"warning: {counts['no_known_word']} of the {counts['lines']} lines hold no word the model knows "
              "(it reads them as an empty line): they say nothing of their labels", file=sys.stderr)
    if args.verbose > 0:
        print(f"Added {counts['labels']} labels from {counts['lines']} lines ({counts['skipped']} lines with known "
              f"labels only skipped); {classifier.num_labels} labels now", file=sys.stderr)
        print(f"Placed in {seconds:.2f} s ({1000 * result.seconds / counts['labels']:.1f} ms per label); "
              f"wrote {target}", file=sys.stderr)
    return 0


def _model_and_data(command: str, argv: list[str]) -> tuple[Any, str, int, float]:
    """``<model> <test-data> [<k>] [<th>]``, as fastText's test and predict take them."""
    from hsm.classifiers.fast_classifier import FastBowClassifier

    usage = f"usage: python -m hsm {command} <model> <test-data> [<k>] [<th>]"
    if not 2 <= len(argv) <= 4:
        raise _UsageError(f"expected a model, a test file and optionally k and a threshold ({usage})")
    model, data = argv[0], argv[1]
    try:
        k = int(argv[2]) if len(argv) > 2 else 1
    except ValueError:
        raise _UsageError(f"k must be a positive integer, got {argv[2]!r}") from None
    try:
        threshold = float(argv[3]) if len(argv) > 3 else 0.0
    except ValueError:
        raise _UsageError(f"the threshold must be a probability, got {argv[3]!r}") from None
    if k < 1:
        raise _UsageError(f"k must be >= 1, got {k}")
    if not (0.0 <= threshold <= 1.0):
        raise _UsageError(f"the threshold must lie in [0, 1], got {threshold}")
    if data != "-" and not Path(data).is_file():
        raise _UsageError(f"{data}: no such test file")
    path = Path(model)
    if not path.is_file():
        hint = f" (supervised -output {model[:-4] if model.endswith('.bin') else model} writes " \
               f"{model if model.endswith('.bin') else model + '.bin'})"
        raise _UsageError(f"{model}: no such model file{hint}")
    try:
        classifier = FastBowClassifier.load(path)
    except ValueError as error:
        raise _UsageError(str(error)) from None
    if classifier.dictionary is None:
        raise _UsageError(f"{model} was trained on arrays, not on a file: it has no dictionary to read text with")
    return classifier, data, k, threshold


def _help(command: str, argv: list[str]) -> bool:
    if argv and argv[0] in ("-h", "--help", "-help"):
        print(f"usage: python -m hsm {command} <model> <test-data> [<k>] [<th>]\n\n"
              "  <model>      model file (what supervised -output PREFIX wrote: PREFIX.bin)\n"
              "  <test-data>  test data file in fastText's format (if -, read from stdin)\n"
              "  <k>          (optional; 1 by default) predict top k labels\n"
              "  <th>         (optional; 0.0 by default) probability threshold"
              + ("\n\nA line's labels are a set: a label written twice on a line counts once in R@k."
                 if command == "test" else ""))
        return True
    return False


def test(argv: list[str]) -> int:
    """``python -m hsm test <model> <test-data> [<k>] [<th>]``: N, P@k and R@k, as fastText prints
    them; a line's gold labels are a set (one written twice counts once)."""
    return _interruptible("test", _test, argv)


def _test(argv: list[str]) -> int:
    if _help("test", argv):
        return 0
    try:
        classifier, data, k, threshold = _model_and_data("test", argv)
        result = classifier.test_file(data, k, threshold)
    except (_UsageError, ValueError) as error:
        return _fail("test", str(error))
    # fastText's Meter::writeGeneralMetrics: N, then P@k and R@k at 3 significant digits
    print(f"N\t{result['examples']}")
    print(f"P@{k}\t{_cpp_float(result[f'precision_at_{k}'], 3)}")
    print(f"R@{k}\t{_cpp_float(result[f'recall_at_{k}'], 3)}")
    return 0


def _cpp_float(value: float, digits: int) -> str:
    """``value`` as C++'s ``std::cout << std::setprecision(digits)`` prints it (``%g``)."""
    if math.isnan(value):
        return "nan"
    return f"{value:.{digits}g}"


def _predict(command: str, argv: list[str], probabilities: bool) -> int:
    if _help(command, argv):
        return 0
    try:
        classifier, data, k, threshold = _model_and_data(command, argv)
        rows = classifier.predict_file(data, k, threshold)
    except (_UsageError, ValueError) as error:
        return _fail(command, str(error))
    # fastText's printPredictions: one line per input line; probabilities as C++ prints a float
    if probabilities:
        text = "".join(" ".join(f"{label} {_cpp_float(p, 6)}" for label, p in row) + "\n" for row in rows)
    else:
        text = "".join(" ".join(label for label, _ in row) + "\n" for row in rows)
    try:
        _write_bytes_as_read(text)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so that the interpreter's final flush is quiet
    return 0


def _write_bytes_as_read(text: str) -> None:
    """``text`` on standard output as the bytes it was read from: the files are decoded as UTF-8
    with ``surrogateescape`` (:func:`hsm.classifiers.fasttext_format.read_lines`), so encoding the same way
    gives every label back byte for byte (fastText prints its bytes as they are); the terminal's
    own encoding, strict UTF-8 or another, would fail on a label that is not valid UTF-8."""
    data = text.encode("utf-8", "surrogateescape")
    binary = getattr(sys.stdout, "buffer", None)
    if binary is None:  # a text-only stream (a StringIO): the text as it is
        sys.stdout.write(text)
    else:
        sys.stdout.flush()  # whatever was written as text first stays first
        binary.write(data)
        binary.flush()
    sys.stdout.flush()


def predict(argv: list[str]) -> int:
    """``python -m hsm predict <model> <test-data> [<k>] [<th>]``: the top k labels of every line."""
    return _interruptible("predict", lambda args: _predict("predict", args, probabilities=False), argv)


def predict_prob(argv: list[str]) -> int:
    """``python -m hsm predict-prob <model> <test-data> [<k>] [<th>]``: the labels with their probabilities."""
    return _interruptible("predict-prob", lambda args: _predict("predict-prob", args, probabilities=True), argv)
