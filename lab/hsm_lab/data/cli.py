"""``python -m hsm data {list,fetch,verify,info,build,export}``: the data sets from the command line.

* ``list``: every data set with its kind, source, licence and description.
* ``fetch NAME``: acquire and verify the files of a data set or source (cache -> mirror -> download).
* ``verify``: check the sha256 of every file present in the cache or the mirror; exit 1 on any mismatch.
* ``info NAME [--json] [--max-books N]``: load a data set and print its counts (for ``ptb``: ``train_tokens``,
  ``valid_tokens``, ``test_tokens``, ``vocab``; for classification sets: ``train_examples``, ``test_examples``,
  ``labels``, ...).
* ``build gutenberg [--max-books N] [--vocab-size V] [--report PATH]``: (re)build the processed Gutenberg corpus
  from the archive, timing it and recording its peak memory, optionally into a JSON report with provenance.
* ``export gutenberg DIR [--max-books N] [--vocab-size V]``: write the processed Gutenberg LM corpus as
  xz-compressed little-endian uint32 token ids, vocabulary and stats (a few tens of MB where the archive is 61 MB),
  for a machine without the archive: set ``HSM_PREBUILT_CORPUS=DIR`` there and the LM experiments load it.
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hsm.cli_text import plain
from hsm_lab.data.errors import DataError
from hsm_lab.data.registry import DATASETS, SOURCES


def _load(name: str, max_books: int | None):
    from hsm_lab.data import load_gutenberg, load_ptb
    from hsm_lab.data.registry import dataset
    from hsm_lab.data.text_classification import load_text_classification

    entry = dataset(name)
    if name == "ptb":
        return load_ptb()
    if name == "gutenberg":
        return load_gutenberg(max_books=max_books)
    if name == "gutenberg-books":
        return load_text_classification(name, max_books=max_books)
    if max_books is not None:
        raise ValueError(f"--max-books applies to gutenberg and gutenberg-books, not {entry.name}")
    return load_text_classification(name)


def _cmd_list(args: argparse.Namespace) -> int:
    rows = [
        {"name": d.name, "kind": d.kind, "source": d.source, "licence": d.licence, "description": d.description}
        for d in DATASETS.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        print(f"{row['name']:<{width}}  {row['kind']:<14}  {row['description']}")
    print(f"\nsources (fetch units): {', '.join(SOURCES)}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from hsm_lab.data.fetch import fetch

    for relpath, path in fetch(args.name).items():
        print(f"ok  {relpath}  ->  {path}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from hsm_lab.data.fetch import verify

    statuses = verify(args.names or None)
    bad = 0
    for status in statuses:
        if status.location == "missing":
            mark = "--"
        elif status.ok:
            mark = "ok"
        else:
            mark, bad = "BAD", bad + 1
        where = f"{status.location}: {status.path}" if status.path else status.location
        print(f"{mark:<3} {status.relpath}  ({where}) {status.detail}".rstrip())
    if bad:
        print(f"{bad} file(s) fail their checksum: delete them and run `python -m hsm data fetch NAME`",
              file=sys.stderr)
    return 1 if bad else 0


def _cmd_info(args: argparse.Namespace) -> int:
    data = _load(args.name, args.max_books)
    summary = data.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0


def _git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[3]
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "lab/hsm_lab/data"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _machine() -> dict[str, object]:
    import os

    memory_gb = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    memory_gb = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "memory_gb": memory_gb, "processor": platform.processor() or platform.machine()}


def _cmd_build(args: argparse.Namespace) -> int:
    from hsm_lab.data import gutenberg

    if args.name != "gutenberg":
        raise ValueError("only `build gutenberg` is supported (the other data sets need no build step)")
    selection = gutenberg.select_books(args.max_books)
    lowercase = args.lowercase
    for kind, key in (("tokens", gutenberg._selection_key(selection, lowercase)),
                      ("lm", gutenberg._selection_key(selection, lowercase, args.vocab_size))):
        shutil.rmtree(gutenberg._processed_dir(kind, key), ignore_errors=True)  # measure a real build
    started = time.perf_counter()
    corpus = gutenberg.load_gutenberg(max_books=args.max_books, vocab_size=args.vocab_size, lowercase=lowercase)
    build_seconds = time.perf_counter() - started
    started = time.perf_counter()
    gutenberg.load_gutenberg(max_books=args.max_books, vocab_size=args.vocab_size, lowercase=lowercase)
    reload_seconds = time.perf_counter() - started
    # ru_maxrss is in KiB on Linux: the peak resident memory of this whole process (interpreter and torch included).
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    report = {
        "what": "full build of the Gutenberg LM corpus from the mirror's archive (hsm_lab.data.load_gutenberg)"
        if args.max_books is None else f"build of the first {args.max_books} books (hsm_lab.data.load_gutenberg)",
        "command": f"python -m hsm data build gutenberg --vocab-size {args.vocab_size}"
        + (f" --max-books {args.max_books}" if args.max_books else "") + (" --lowercase" if args.lowercase else ""),
        "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _git_commit(),
        "machine": _machine(),
        "build_wall_seconds": round(build_seconds, 1),
        "cached_reload_seconds": round(reload_seconds, 2),
        "peak_memory_gb": round(peak_gb, 2),
        "counts": corpus.summary(),
        "stats": corpus.stats,
    }
    text = json.dumps(report, indent=1, ensure_ascii=False)
    if args.report:
        from hsm.atomic import atomic_write

        atomic_write(args.report, text + "\n")  # a killed run never leaves half a report
    print(text)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from hsm_lab.data import gutenberg

    started = time.perf_counter()
    sizes = gutenberg.export_lm_corpus(Path(args.directory), args.max_books, args.vocab_size,
                                       lowercase=args.lowercase, preset=args.preset)
    seconds = time.perf_counter() - started
    for name, size in sizes.items():
        print(f"{name:<14} {size / 1e6:9.2f} MB")
    print(f"total          {sum(sizes.values()) / 1e6:9.2f} MB in {args.directory} ({seconds:.1f} s); load it with "
          f"{gutenberg.PREBUILT_ENV}={args.directory}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hsm data", description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list the data sets")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=_cmd_list)
    fetching = commands.add_parser("fetch", help="acquire and verify a data set's files")
    fetching.add_argument("name", help=f"a data set ({', '.join(DATASETS)}) or source ({', '.join(SOURCES)})")
    fetching.set_defaults(run=_cmd_fetch)
    verifying = commands.add_parser("verify", help="check the sha256 of cached and mirrored files")
    verifying.add_argument("names", nargs="*", help="sources to check (default: all)")
    verifying.set_defaults(run=_cmd_verify)
    info = commands.add_parser("info", help="load a data set and print its counts")
    info.add_argument("name", help=", ".join(DATASETS))
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--max-books", type=int, default=None, help="gutenberg / gutenberg-books: first N books")
    info.set_defaults(run=_cmd_info)
    build = commands.add_parser("build", help="rebuild the processed Gutenberg corpus and measure it")
    build.add_argument("name", choices=["gutenberg"])
    build.add_argument("--max-books", type=int, default=None)
    build.add_argument("--vocab-size", type=int, default=250_000)
    build.add_argument("--lowercase", action="store_true", help="lower-case the text (default: keep case)")
    build.add_argument("--report", default=None, help="write the measurements as JSON to this path")
    build.set_defaults(run=_cmd_build)
    export = commands.add_parser("export", help="write the processed Gutenberg LM corpus as compressed token ids")
    export.add_argument("name", choices=["gutenberg"])
    export.add_argument("directory", help="folder to write (created if missing; its files are replaced)")
    export.add_argument("--max-books", type=int, default=None, help="first N books of the book order (default: all)")
    export.add_argument("--vocab-size", type=int, default=250_000, help="vocabulary size, <unk> included")
    export.add_argument("--lowercase", action="store_true", help="lower-case the text (default: keep case)")
    export.add_argument("--preset", type=int, default=9, choices=range(10), metavar="0-9",
                        help="xz compression level (default 9: smallest, slowest)")
    export.set_defaults(run=_cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hsm data``; returns the exit status (errors: message on stderr, status 1).

    Data errors, bad arguments and file-system errors (an unwritable ``--report`` path, say) are reported as one
    line naming the error, not a traceback.
    """
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.run(args) or 0)
    except (DataError, ValueError, TypeError, OSError) as exc:
        print(f"hsm data {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
