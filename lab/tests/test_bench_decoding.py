"""``python -m hsm bench-decoding``'s refusals: sizes beyond this machine's memory, an unwritable
result file, a run out of memory; each one line naming the option to change."""
from __future__ import annotations

import os

import pytest

from hsm_lab import bench_decoding
from hsm.__main__ import main


def _one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    return err


def test_a_vocabulary_too_large_for_memory_is_refused_before_anything_is_allocated(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_decoding, "run_decoding", lambda *a, **k: pytest.fail("measured"))
    code = main(["bench-decoding", "--vocab", "1000000000000", "--quick", "--json", str(tmp_path / "d.json")])
    err = _one_line(capsys.readouterr().err)
    assert code == 2 and "--vocab 1,000,000,000,000: the layers of V = 1,000,000,000,000" in err
    assert "choose a smaller --vocab" in err and not (tmp_path / "d.json").exists()


def test_running_out_of_memory_while_measuring_is_one_line(tmp_path, capsys, monkeypatch):
    def allocator(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 4000000000000 bytes.")

    monkeypatch.setattr(bench_decoding, "run_decoding", allocator)
    code = main(["bench-decoding", "--quick", "--json", str(tmp_path / "d.json")])
    err = _one_line(capsys.readouterr().err)
    assert code == 1 and "out of memory while measuring" in err and "--vocab" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_result_file_names_json_not_out(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        code = main(["bench-decoding", "--quick", "--json", str(folder / "d.json")])
    finally:
        folder.chmod(0o700)
    err = _one_line(capsys.readouterr().err)
    assert code == 2 and "choose another --json" in err and "--out" not in err


def test_a_result_file_under_a_file_names_json_not_out(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code = main(["bench-decoding", "--quick", "--json", str(blocker / "d.json")])
    err = _one_line(capsys.readouterr().err)
    assert code == 2 and "choose another --json" in err and "--out" not in err
