"""Nothing on the book's pages, in the package or in the result files speaks of how the work was
organised: no issue numbers, work queues, private notes, machine-local paths, commit-hash
narratives, cache chatter or raw reprs. A reader cannot resolve any of them.

Each test scans one part of the repository (the package, the chapters, the book pages and
README, the result files' labels, the command-line help, and the built HTML when present) and
fails naming ``file:line`` and the rule for every hit. A legitimate use is allowed in
:data:`ALLOWED`, with the reason, line by line.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: (name, pattern): what a reader cannot resolve. Case-insensitive.
RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
    ("issue number", r"\bissues? #?\d+|\bissue's\b|(?<![\w&/#])#[1-9]\d?\b(?![\w-])"),
    ("work queue", r"\bGPU queue\b|\bqueue item\b|\bitem \d+ of the (?:project's )?(?:GPU )?queue\b"),
    ("private notes", r"\binventory\b|\bproject's reading\b|\bseeds-inventory\b|\.team/"),
    ("machine-local path", r"\.\./shared\b|(?<![\w.])/work/|(?<![\w.])/tmp/hsm"),
    ("seed-file label", r"\bseeds? 00[0-4]\b|\bbeyond seed\b|\bseed 00[0-4]_"),
    ("working session", r"\bsessions?\b(?!\s*(?:storage|id)\b)|\bhelper agent\b|\bhelpers? (?:session|wrote|ran)\b"
                        r"|\bintegrator\b|\bworktrees?\b"),
    ("GPU loan", r"\bGPU (?:was |were |is )?(?:lent|leased?)\b|\bGPU lease\b|\bno GPU was (?:lent|available to)\b|\blent to this\b"),
    ("shared-machine note", r"\bthis machine was shared\b|\bmachine (?:is|was) shared\b"),
    ("commit narrative", r"\b(?:is|was|at|since|before|after|until|by|in|from) commits? [0-9a-f]{7,40}\b"
                         r"|\((?:commit )?(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\)"),
    ("cache chatter", r"\bfinished earlier, loading\b|\bloaded from (?:the )?cache\b"),
))

#: Rules for what a page *prints* (cell outputs of the built HTML): raw reprs of our objects and
#: absolute paths of the build machine (library warnings with a virtual environment's path).
OUTPUT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(pattern)) for name, pattern in (
    ("raw repr", r"\b(?:RunCurves|Measurement|NumberRow|Verdict|PaperNumber)\("
                 r"|<hsm\.[\w.]+ object at 0x"),
    ("absolute path", r"(?<![\w.:/])/(?:work|home|root|tmp|usr|opt|srv)/[\w.+-]+/"),
    ("virtual-environment path", r"[\w/.-]*/\.?venv/lib/python|site-packages/"),
))

#: Legitimate matches: (path relative to the repository, a regex the line must match, why).
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("tests/test_process_words.py", r".", "this file holds the patterns"),
)


def _allowed(rel: str, line: str) -> bool:
    return any(rel == path and re.search(pattern, line) for path, pattern, _ in ALLOWED)


def _hits(rel: str, lines: Iterable[tuple[int, str]], rules=RULES) -> Iterator[str]:
    for number, line in lines:
        for name, pattern in rules:
            match = pattern.search(line)
            if match and not _allowed(rel, line):
                yield f"{rel}:{number}: {name}: {line.strip()[:160]!s}"


def _text_lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1))


def _files(*patterns: str, exclude: tuple[str, ...] = ()) -> list[Path]:
    found = set()
    for pattern in patterns:
        for path in ROOT.glob(pattern):
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and "__pycache__" not in rel and not rel.startswith(exclude):
                found.add(path)
    return sorted(found)


def _report(hits: list[str], what: str) -> None:
    assert not hits, f"{len(hits)} line(s) in {what} speak of how the work was organised:\n" + "\n".join(hits)


def _scan(paths: Iterable[Path]) -> list[str]:
    hits: list[str] = []
    for path in paths:
        hits += _hits(path.relative_to(ROOT).as_posix(), _text_lines(path))
    return hits


def test_package_sources() -> None:
    """Docstrings, comments, messages and data files of ``hsm/``."""
    _report(_scan(_files("hsm/**/*.py", "hsm/**/*.json", "hsm/**/*.txt", "hsm/**/*.md")), "hsm/")


def test_book_pages_and_readme() -> None:
    """The landing, reading and appendix pages, the bibliography, the toc, the configuration, README."""
    paths = _files("book/**/*.md", "book/**/*.bib", "README.md", "_toc.yml", "_config.yml",
                   exclude=("book/vendor",))
    _report(_scan(paths), "the book pages and README")


def test_chapters() -> None:
    """The chapters' prose and code (notebooks/)."""
    _report(_scan(_files("notebooks/**/*.md", "notebooks/**/*.py")), "notebooks/")


def _json_strings(value, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _json_strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _json_strings(item, f"{where}[{index}]")


def test_result_file_labels() -> None:
    """Every string in the committed result files (labels, notes, settings; never the numbers)."""
    hits: list[str] = []
    for path in _files("results/**/*.json"):
        rel = path.relative_to(ROOT).as_posix()
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue  # not ours to judge here: tests/test_results.py checks the files parse
        # the line of a string in the file, for the message
        lines = path.read_text(encoding="utf-8").splitlines()
        seen: set[str] = set()
        for where, text in _json_strings(payload, "$"):
            # one-word strings are data (the vocabulary's words, e.g. PTB's "session"), not labels
            if text in seen or not re.search(r"[\s/#]", text):
                continue
            seen.add(text)
            for name, pattern in RULES:
                if pattern.search(text) and not _allowed(rel, text):
                    number = next((i for i, line in enumerate(lines, 1) if json.dumps(text)[1:-1][:60] in line), 0)
                    hits.append(f"{rel}:{number}: {name}: {where} = {text[:160]!r}")
    _report(hits, "the result files")


@pytest.mark.parametrize("args", [["--help"], ["run", "list"], ["run", "--help"], ["data", "--help"],
                                  ["bench", "--help"]], ids=" ".join)
def test_command_line_help(args: list[str]) -> None:
    """What ``python -m hsm`` prints for help and for the list of experiments."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "hsm", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    hits = list(_hits(f"python -m hsm {' '.join(args)}", enumerate(text.splitlines(), 1), RULES + OUTPUT_RULES))
    _report(hits, f"`python -m hsm {' '.join(args)}`")


class _PageText(HTMLParser):
    """The text of a built page, line by line, and separately the text of its cell outputs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[tuple[int, str]] = []
        self.outputs: list[tuple[int, str]] = []
        self._skip = 0
        self._stack: list[bool] = []  # per open div: inside a cell output
        self._in_output = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "div":
            classes = (dict(attrs).get("class") or "").split()
            is_output = "cell_output" in classes or "output" in classes
            self._stack.append(is_output)
            self._in_output += is_output

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        if tag == "div" and self._stack:
            self._in_output -= self._stack.pop()

    def handle_data(self, data: str) -> None:
        if self._skip or not data.strip():
            return
        first = self.getpos()[0]
        for offset, text in enumerate(data.splitlines()):
            if text.strip():
                self.lines.append((first + offset, text))
                if self._in_output:
                    self.outputs.append((first + offset, text))


def _built_pages() -> list[Path]:
    # HSM_BOOK_HTML: a book built elsewhere (``jupyter-book build --path-output``)
    html = _html_root()
    return sorted(p for p in html.rglob("*.html")
                  if not p.relative_to(html).as_posix().startswith(("_static", "_sources", "reports"))
                  and p.name not in ("genindex.html", "search.html", "py-modindex.html"))


def _html_root() -> Path:
    return Path(os.environ.get("HSM_BOOK_HTML") or ROOT / "_build" / "html")


def test_built_html() -> None:
    """The built book (``_build/html``), when it has been built: prose, code and printed outputs."""
    pages = _built_pages()
    if not pages:
        pytest.skip("no built book in _build/html (make book builds it)")
    hits: list[str] = []
    for page in pages:
        parser = _PageText()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        rel = "_build/html/" + page.relative_to(_html_root()).as_posix()
        hits += _hits(rel, parser.lines)
        hits += _hits(rel, parser.outputs, OUTPUT_RULES)
    _report(hits, "the built HTML")


def test_rules_catch_what_they_should_and_spare_the_rest() -> None:
    """The patterns flag the phrases they are for and leave ordinary prose alone."""
    flagged = [
        "the configuration used before issue 18", "Issue 8 set targets", "see #12 for details",
        "item 2 of the GPU queue", "not said (inventory §3.1)", "the project's reading of the five papers",
        "a mirror in ../shared/data", "committed results in /work/main/results",
        "Schuurmans & Frasincar (seed 003)", "Beyond seed 004: PTB", "a session's time limit",
        "no GPU was lent to this work", "a GPU lease", "this machine was shared",
        "before is commit 2b9327e", "the quiet rerun (fcb2626) replaced it",
        "lm: finished earlier, loading x.json",
    ]
    spared = [
        "random seed 0 and seed 1", "seeds 0-4", "torch.nn.AdaptiveLogSoftmaxWithLoss", "color='#1f77b4'",
        "&#39;quoted&#39;", "## 1. Eq. 10", "the commit field of the provenance", "commit 2b9327e1, 2026-11-23",
        "an issue with the data", "sessionStorage.getItem", "a helper function", "queue.Queue()",
        "the 2-core CPU was shared by two runs", "shared by the minibatch", "(1234567)",
    ]
    for text in flagged:
        assert any(p.search(text) for _, p in RULES), f"not flagged: {text!r}"
    for text in spared:
        assert not any(p.search(text) for _, p in RULES), f"flagged: {text!r} ({[n for n, p in RULES if p.search(text)]})"
    assert any(p.search("RunCurves(final=1.0)") for _, p in OUTPUT_RULES)
    assert any(p.search("/work/main/.venv/lib/python3.11/site-packages/x.py:3: UserWarning") for _, p in OUTPUT_RULES)
    assert not any(p.search("results/lm/ptb.json") for _, p in OUTPUT_RULES)
