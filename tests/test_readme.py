"""Every ```python block of README.md runs as written, on its own (each in a fresh namespace, in
an empty working directory)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        blocks.append((text.count("\n", 0, match.start(1)) + 1, match.group(1)))
    return blocks


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 4


@pytest.mark.parametrize("line, source", python_blocks(), ids=[f"README.md:{line}" for line, _ in python_blocks()])
def test_readme_block_runs(line, source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files (checkpoints, models) write them here
    exec(compile(source, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
