"""The library without the book's lab: what `pip install hsm-learned-trees` (no extras) gives.

The library needs torch, numpy, numba and scipy. These tests check that it never imports the lab
(experiments, data sets, result files, reports, benchmarks) and that its everyday uses work where
the extras' packages (matplotlib, scikit-learn, tqdm) are missing, with a one-line error naming the
extra where a function does need one."""
import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the lab: what the book needs and a practitioner does not
LAB = ("hsm.data", "hsm.experiments", "hsm.results", "hsm.report", "hsm.reproduce", "hsm.paper", "hsm.bench",
       "hsm.bench_decoding", "hsm.config")


def _module_file(name: str) -> Path | None:
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _imports(name: str, path: Path) -> set[str]:
    """Every hsm module ``path`` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("hsm")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                module = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("hsm"):
                found.add(module)
                found |= {f"{module}.{alias.name}" for alias in node.names if _module_file(f"{module}.{alias.name}")}
    parents = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 2)}
    return {m for m in parents if _module_file(m)}


#: what a practitioner imports: the package, the classifiers it loads on first use, the command line
LIBRARY_ROOTS = ("hsm", "hsm.fast_classifier", "hsm.sparse_tree", "hsm.fasttext_cli")


def library_closure(roots: tuple[str, ...] = LIBRARY_ROOTS) -> dict[str, int]:
    """Module -> lines, for every module ``roots`` can reach through any import statement."""
    seen: dict[str, int] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen[name] = len(path.read_text().splitlines())
        todo += sorted(_imports(name, path))
    return seen


def test_the_library_never_imports_the_lab():
    closure = library_closure()
    lab = sorted(m for m in closure if m.startswith(LAB))
    assert not lab, f"import hsm reaches the lab: {lab}"
    assert {"hsm.layers", "hsm.training", "hsm.fast_classifier", "hsm.fasttext_format"} <= set(closure)


def test_import_hsm_reaches_at_most_8000_lines():
    """``import hsm`` loads the layers, the tree, Algorithm 1 and its statistics; the classifiers
    (``hsm.FastBowClassifier``, ``hsm.SparseTreeClassifier``) are imported on first use."""
    closure = library_closure(("hsm",))
    assert sum(closure.values()) <= 8000, sorted(closure.items(), key=lambda item: -item[1])[:8]
    assert "hsm.fast_classifier" not in closure and "hsm.sparse_tree" not in closure
    script = ("import sys, hsm; assert 'hsm.fast_classifier' not in sys.modules; "
              "from hsm import FastBowClassifier, SparseTreeClassifier; "
              "assert FastBowClassifier.__module__ == 'hsm.fast_classifier'")
    assert subprocess.run([sys.executable, "-c", script], cwd=ROOT).returncode == 0


# a package set to None in sys.modules cannot be imported (ModuleNotFoundError naming it), and
# importlib.util.find_spec reports it absent, as for a package that is not installed
BLOCK_EXTRAS = """
import sys
for name in ("matplotlib", "sklearn", "tqdm"):
    sys.modules[name] = None
"""


def _run_without_extras(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    code = BLOCK_EXTRAS + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_a_training_step_and_the_fasttext_command_work_without_the_extras(tmp_path):
    (tmp_path / "train.txt").write_text("".join(f"__label__{i % 3} word{i % 3} other{i % 5}\n" for i in range(60)))
    result = _run_without_extras("""
        import sys
        import torch
        import hsm
        from hsm.__main__ import main

        lab = sorted(m for m in sys.modules if m.startswith(("hsm.data", "hsm.experiments", "hsm.results",
                                                             "hsm.report", "hsm.bench")))
        assert not lab, lab
        torch.manual_seed(0)
        layer = hsm.HierarchicalSoftmax(8, hsm.Tree.random(20, 3, 3, seed=0))
        learner = hsm.TreeLearner(layer, reassign_every=1)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        out = layer(torch.randn(16, 8), torch.randint(0, 20, (16,)))
        out.loss.backward()
        optimizer.step()
        learner.step()
        assert len(learner.history) == 1 and torch.isfinite(out.loss)
        assert main(["supervised", "-input", "train.txt", "-output", "model", "-dim", "4", "-epoch", "2"]) == 0
        assert main(["test", "model.bin", "train.txt"]) == 0
        try:
            hsm.Tree.random(20, 3, 3, seed=0).draw()
        except ImportError as exc:
            print("DRAW:", exc)
        print("RUN:", main(["run", "list"]))  # listing the experiments needs none of the extras
    """, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if line.startswith(("DRAW", "RUN")))
    assert lines["DRAW"] == ("drawing a tree needs matplotlib, which hsm installs only with an extra: "
                             "pip install 'hsm-learned-trees[plot]'")
    assert lines["RUN"] == "0"


def test_a_lab_command_without_its_extra_says_which_extra_in_one_line(monkeypatch, capsys):
    from hsm import __main__ as cli

    def needs_tqdm(argv):
        raise ModuleNotFoundError("No module named 'tqdm'", name="tqdm")

    monkeypatch.setitem(cli._COMMANDS, "data", ("hsm.tree:Tree", "data sets"))
    monkeypatch.setattr("hsm.tree.Tree", needs_tqdm)
    assert cli.main(["data", "list"]) == 2
    assert capsys.readouterr().err == ("hsm data needs tqdm, installed with the lab's extra: "
                                       "pip install 'hsm-learned-trees[experiments]'\n")
