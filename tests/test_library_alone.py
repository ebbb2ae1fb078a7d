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

#: the book's lab, a package of its own beside the library (lab/hsm_lab)
LAB_PACKAGE = "hsm_lab"
LIBRARY = ROOT / "hsm"


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


def library_closure(roots: tuple[str, ...] = ("hsm",)) -> dict[str, int]:
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


def lab_mentions(folder: Path = LIBRARY) -> list[str]:
    """``file:line`` of every place under ``folder`` that names the lab's package, as an import or in
    any string or comment, except the command line's one forwarding constant."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if LAB_PACKAGE in line and line.strip() != f'LAB_PACKAGE = "{LAB_PACKAGE}"':
                found.append(f"{path.relative_to(folder.parent)}:{number}")
    return found


def test_no_library_file_names_the_lab():
    """The boundary is the folder: nothing under hsm/ imports or names hsm_lab, except the one
    constant through which ``python -m hsm run / data / bench / ...`` forward to the lab."""
    assert lab_mentions() == []
    assert f'LAB_PACKAGE = "{LAB_PACKAGE}"' in (LIBRARY / "__main__.py").read_text()


def test_the_folder_rule_catches_a_library_file_that_imports_the_lab(tmp_path):
    library = tmp_path / "hsm"
    library.mkdir()
    (library / "clean.py").write_text("import torch\n")
    assert lab_mentions(library) == []
    (library / "leaky.py").write_text("from hsm_lab.results import provenance\n")
    (library / "lazy.py").write_text("import importlib\nresults = importlib.import_module('hsm_lab.results')\n")
    assert len(lab_mentions(library)) == 2


def test_import_hsm_reaches_at_most_8300_lines():
    """``import hsm`` loads the layers, the tree, Algorithm 1 and its statistics; the classifiers
    (``hsm.FastBowClassifier``, ``hsm.SparseTreeClassifier``) are imported on first use."""
    closure = library_closure(("hsm",))
    assert sum(closure.values()) <= 8300, sorted(closure.items(), key=lambda item: -item[1])[:8]
    assert "hsm.classifiers.fast_classifier" not in closure and "hsm.classifiers.sparse_tree" not in closure
    script = ("import sys, hsm; assert 'hsm.classifiers.fast_classifier' not in sys.modules; "
              "from hsm import FastBowClassifier, SparseTreeClassifier; "
              "assert FastBowClassifier.__module__ == 'hsm.classifiers.fast_classifier'")
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

        lab = sorted(m for m in sys.modules if m.startswith(("hsm_lab.data", "hsm_lab.experiments", "hsm_lab.results",
                                                             "hsm_lab.report", "hsm_lab.bench")))
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
        sys.modules["hsm_lab"] = None  # the library installed without the lab
        print("RUN:", main(["run", "list"]))
    """, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if line.startswith(("DRAW", "RUN")))
    assert lines["DRAW"] == ("drawing a tree needs matplotlib, which hsm installs only with an extra: "
                             "pip install 'hsm-learned-trees[plot]'")
    assert lines["RUN"] == "2"
    assert result.stderr.strip().splitlines()[-1] == (
        "hsm run is a command of the book's lab, which is not installed: pip install ./lab from a clone of the "
        "repository")


def test_a_wheel_of_the_library_holds_the_library_alone(tmp_path):
    """``pip wheel .`` (the library's project file) packs hsm/ and nothing of the lab, tests or book."""
    import zipfile

    pytest = __import__("pytest")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    if built.returncode != 0 and "No module named" in built.stderr:
        pytest.skip(f"cannot build a wheel here: {built.stderr.strip().splitlines()[-1]}")
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("hsm_learned_trees-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"hsm"}, packages
    assert "hsm/classifiers/fasttext_cli.py" in names and not any("hsm_lab" in name for name in names)
