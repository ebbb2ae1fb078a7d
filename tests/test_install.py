"""What a user installing the package meets first: its metadata (distribution name, SPDX
licence), the README's install lines, the warmup command and plain-text ``--help``."""
import os
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

from hsm import __main__ as cli
from hsm.cli_text import plain

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LAB_PROJECT = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()


def test_distribution_name_is_not_the_unrelated_pypi_package():
    """``hsm`` on PyPI is another project: pip would fetch it for ``pip install hsm``."""
    name = PROJECT["project"]["name"]
    assert name != "hsm" and name.startswith("hsm-")
    assert name in README


def test_licence_is_an_spdx_expression_with_its_file():
    project = PROJECT["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "the hsm authors" in text
    (setuptools,) = [Requirement(r) for r in PROJECT["build-system"]["requires"] if Requirement(r).name == "setuptools"]
    assert not setuptools.specifier.contains("76.9"), "SPDX license strings need setuptools >= 77"


def test_readme_install_lines_name_existing_extras_and_the_cpu_torch():
    section = README[README.index("## Use it in your own project"):]
    section = section[: section.index("\n## ", 1)]
    pin = next(line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("torch=="))
    assert f"pip install {pin} --index-url https://download.pytorch.org/whl/cpu" in section
    extras = set(re.findall(r"\[(\w+)\]", section))
    extras_known = set(PROJECT["project"]["optional-dependencies"]) | set(LAB_PROJECT["project"]["optional-dependencies"])
    assert extras and extras <= extras_known
    assert "python -m hsm warmup" in section


def _help_of(command: list[str], capsys) -> str:
    """argparse's commands exit after the help; fastText's print it and return 0."""
    try:
        status = cli.main([*command, "--help"])
    except SystemExit as exit_:
        status = exit_.code
    assert status in (0, None)
    return capsys.readouterr().out


MARKUP = re.compile(r"``|:(func|class|mod|meth|attr|data|exc|obj|ref|doc):`|^\s*\.\. |::$", re.M)


@pytest.mark.parametrize("command", sorted(cli._COMMANDS))
def test_every_command_help_is_plain_text(command, capsys):
    text = _help_of([command], capsys)
    assert "usage:" in text
    assert not MARKUP.search(text), MARKUP.search(text)


def test_top_level_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert not MARKUP.search(text)
    for command, (_, summary) in cli._COMMANDS.items():
        assert re.search(rf"^  {re.escape(command)} +{re.escape(summary)}$", text, flags=re.M), command


@pytest.mark.parametrize("source, shown", [
    ("``python -m hsm run``: list", "python -m hsm run: list"),
    ("see :func:`hsm_lab.results.output_root`.", "see hsm_lab.results.output_root."),
    ("a :class:`~hsm.tree.Tree`", "a Tree"),
    ("the :func:`writer <hsm.tree_io.save_tree>` and :py:meth:`x.y`", "the writer and x.y"),
    ("Quick start::\n\n    import hsm", "Quick start:\n\n    import hsm"),
    ("Before.\n\n.. code-block:: bash\n   :linenos:\n\n   make test", "Before.\n\n\n   make test"),
    ("the `default` role and ``two\nlines``", "the default role and two\nlines"),
    (None, ""),
])
def test_plain_removes_the_markup(source, shown):
    assert plain(source) == shown


@given(st.text(alphabet=st.characters(blacklist_characters="`:.", blacklist_categories=("Cs",))))
def test_plain_leaves_text_without_markup_alone(text):
    assert plain(text) == text.strip("\n")


def test_warmup_runs_every_compiled_path(capsys):
    assert cli.main(["warmup"]) == 0
    assert "numba kernels compiled and cached" in capsys.readouterr().out


_READ_ONLY_SCRIPT = """
import torch, hsm
from hsm import _numba_cache
torch.manual_seed(0)
layer = hsm.HierarchicalSoftmax(8, hsm.Tree.random(60, 4, 3, seed=0))
optimizer = hsm.RowSparseAdagrad(layer.parameters(), lr=0.1)
learner = hsm.TreeLearner(layer, reassign_every=1)
out = layer(torch.randn(16, 8), torch.randint(0, 60, (16,)))
out.loss.backward(); optimizer.step(); learner.step()
print("step", _numba_cache.location)
from hsm._warmup import main
main([])
"""


def _read_only_copy(tmp_path):
    """A read-only copy of the package whose ``__pycache__`` folders are files (no user, root
    included, can create a folder there), and the environment of a user whose HOME lies under
    /proc (where nobody can create one)."""
    import shutil
    import stat

    site = tmp_path / "site"
    shutil.copytree(ROOT / "hsm", site / "hsm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for folder in [site / "hsm", *(p for p in (site / "hsm").rglob("*") if p.is_dir())]:
        (folder / "__pycache__").write_text("")
    for path in [*site.rglob("*"), site]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "PYTHONPATH")}
    env.update(HOME="/proc/no-such-home", PYTHONPATH=str(site), TMPDIR=str(temp), PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", HSM_THREADS="1")
    return site, temp, env


def _writable_again(site):
    import stat

    for path in [site, *site.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_without_any_writable_folder_the_kernels_run_uncached_with_one_warning(tmp_path):
    import subprocess
    import sys

    site, _, env = _read_only_copy(tmp_path)
    script = ("import tempfile; tempfile.gettempdir = lambda: '/proc/no-such-tmp'\n"
              "import warnings; warnings.simplefilter('always')\n"
              "import torch, hsm\n"
              "from hsm import _numba_cache\n"
              "layer = hsm.HierarchicalSoftmax(4, hsm.Tree.random(20, 3, 3, seed=0))\n"
              "layer(torch.randn(5, 4), torch.randint(0, 20, (5,))).loss.backward()\n"
              "print('trained', _numba_cache.location)\n")
    try:
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=1200)
    finally:
        _writable_again(site)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained none" in done.stdout
    assert done.stderr.count("numba finds no folder it can write its compiled kernels to") == 1
    assert "set NUMBA_CACHE_DIR" in done.stderr


def test_a_read_only_install_with_an_unwritable_home_imports_trains_and_warms_up(tmp_path):
    """A container running as a user who can write neither the installed package nor HOME
    (:func:`_read_only_copy`): numba finds no cache folder of its own, and the kernels are cached
    under the temporary folder."""
    import subprocess
    import sys

    site, temp, env = _read_only_copy(tmp_path)
    try:
        done = subprocess.run([sys.executable, "-c", _READ_ONLY_SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=1200)
    finally:
        _writable_again(site)
    assert done.returncode == 0, done.stderr[-3000:]
    cache = temp / f"hsm-numba-cache-{os.getuid()}"
    assert f"step {cache}" in done.stdout
    assert f"numba kernels compiled and cached in {cache}" in done.stdout
    assert any(cache.rglob("*.nbi"))  # the kernels were cached there
    assert not any(p.is_dir() for p in site.rglob("__pycache__"))  # and nothing written in the install


@pytest.mark.parametrize("command", sorted(cli._COMMANDS))
def test_ctrl_c_in_any_command_is_one_line_and_status_130(command, monkeypatch, capsys):
    """Ctrl-C while a command runs (a training run, a benchmark, a download): exit status 130, as a
    shell reports for a command it stopped, and one line instead of a traceback."""
    import importlib

    module_name, _, function = cli._COMMANDS[command][0].partition(":")
    module = importlib.import_module(module_name)

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, function or "main", interrupted)
    assert cli.main([command, "x"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"hsm {command}: interrupted\n"
