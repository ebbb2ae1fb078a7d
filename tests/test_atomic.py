"""hsm.atomic: the package's one atomic writer. A failed write (an exception in the content, a rejected
check, a full disk, a failed rename) leaves the previous file as it was and no temporary behind; each write
has its own temporary; temporaries of killed processes are removed by the next write."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm import atomic as _atomic
from hsm.atomic import _HOST, DiskFullError, atomic_directory, atomic_write, remove_dead_temporaries


@settings(max_examples=30, deadline=None)
@given(content=st.one_of(st.text(), st.binary()))
def test_text_and_bytes_are_written_as_given(tmp_path_factory, content):
    folder = tmp_path_factory.mktemp("w")
    path = atomic_write(folder / "sub" / "f", content)  # parent folders are created
    assert path == folder / "sub" / "f"
    expected = content.encode("utf-8") if isinstance(content, str) else content
    assert path.read_bytes() == expected
    assert os.listdir(path.parent) == ["f"]


def test_a_callable_writes_to_the_open_binary_file(tmp_path):
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    atomic_write(tmp_path / "a.npy", lambda handle: np.save(handle, array))
    np.testing.assert_allclose(np.load(tmp_path / "a.npy"), array)
    atomic_write(tmp_path / "s.pt", lambda handle: torch.save({"x": torch.ones(2)}, handle))
    assert torch.load(tmp_path / "s.pt")["x"].tolist() == [1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "s.pt"]


def test_a_failed_write_or_a_rejected_check_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write(target, "old\n")

    def failing(handle) -> None:
        handle.write(b"half of the ne")
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        atomic_write(target, failing)
    assert target.read_text() == "old\n"
    seen = []

    def reject(tmp: Path) -> None:
        seen.append(tmp.read_text())  # the check sees the complete temporary
        raise ValueError("rejected")

    with pytest.raises(ValueError, match="rejected"):
        atomic_write(target, "new\n", check=reject)
    assert seen == ["new\n"] and target.read_text() == "old\n"
    assert atomic_write(target, "new\n").read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_failed_rename_keeps_the_old_file(tmp_path, monkeypatch):
    target = atomic_write(tmp_path / "r.json", '{"good": true}')

    def fail(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_atomic.os, "replace", fail)
    with pytest.raises(OSError, match="Input/output"):
        atomic_write(target, '{"new": true}')
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"good": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_each_write_has_its_own_temporary(tmp_path, monkeypatch):
    # two concurrent runs writing the same checkpoint once shared ".<name>.tmp" and overwrote each other's
    seen = []
    real = os.replace
    monkeypatch.setattr(_atomic.os, "replace", lambda src, dst: (seen.append(Path(src).name), real(src, dst)))
    atomic_write(tmp_path / "a.pt", b"one")
    atomic_write(tmp_path / "a.pt", b"two")
    assert len(seen) == 2 and seen[0] != seen[1] and all(name.startswith(".a.pt.") for name in seen)
    assert (tmp_path / "a.pt").read_bytes() == b"two"


def test_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    out = atomic_write(tmp_path / "r.json", "{}")

    def no_space(handle):
        handle.write(b"{")
        raise OSError(errno.ENOSPC, "No space left on device")

    full = r"the disk is full \(No space left on device\): cannot write"
    with pytest.raises(DiskFullError, match=rf"{full} {out} .*kept") as caught:
        atomic_write(out, no_space)
    assert caught.value.errno == errno.ENOSPC
    assert out.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    # torch.save on a full disk says "unexpected pos ..." (its zip writer): also named as a full disk
    monkeypatch.setattr(_atomic.shutil, "disk_usage", lambda p: type("U", (), {"free": 4096})())

    def torch_full(handle):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4160 vs 4054")

    checkpoint = tmp_path / "ckpt.pt"
    with pytest.raises(DiskFullError, match=rf"cannot write {checkpoint}"):
        atomic_write(checkpoint, torch_full)
    monkeypatch.setattr(_atomic.shutil, "disk_usage", lambda p: type("U", (), {"free": 10 * 2**30})())
    with pytest.raises(RuntimeError, match="unexpected pos"):  # another cause: not called a full disk
        atomic_write(checkpoint, torch_full)
    assert not checkpoint.exists()


def test_atomic_directory_keeps_or_replaces(tmp_path):
    target = tmp_path / "folder"
    assert atomic_directory(target, lambda f: (f / "a").write_text("first"))
    assert not atomic_directory(target, lambda f: (f / "a").write_text("second"))  # another process won: keep
    assert (target / "a").read_text() == "first"
    assert atomic_directory(target, lambda f: (f / "a").write_text("third"), replace=True)
    assert (target / "a").read_text() == "third"
    with pytest.raises(RuntimeError, match="boom"):
        atomic_directory(target, lambda f: (_ for _ in ()).throw(RuntimeError("boom")), replace=True)
    assert (target / "a").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_temporaries_of_killed_processes_are_removed(tmp_path):
    """kill -9 skips every clean-up: the next write of the same file removes what a dead process left."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(child.stdout)  # that process has exited
    target = tmp_path / "big.tar.xz"
    dead_file = tmp_path / f".big.tar.xz.part-{_HOST}-{dead}-0a1b2c3d"
    dead_file.write_bytes(b"half a download")
    live_file = tmp_path / f".big.tar.xz.part-{_HOST}-{os.getpid()}-0a1b2c3d"  # this process: maybe writing
    live_file.write_bytes(b"in progress")
    other_host = tmp_path / f".big.tar.xz.part-elsewhere.example-{dead}-0a1b2c3d"  # a shared cache's neighbour
    other_host.write_bytes(b"theirs")
    dead_folder = tmp_path / f".corpus.part-{_HOST}-{dead}-0a1b2c3d"
    dead_folder.mkdir()
    (dead_folder / "train.npy").write_bytes(b"half")
    atomic_write(target, "whole\n")
    assert not dead_file.exists() and live_file.exists() and other_host.exists()
    assert atomic_directory(tmp_path / "corpus", lambda f: (f / "stats.json").write_text("{}"))
    assert not dead_folder.exists()
    assert remove_dead_temporaries(target) == []  # idempotent
