"""environment.yml (conda users) lists the same requirements as the library's and the lab's project files
(pip users); torch is
pinned where an environment is installed (constraints.txt, environment.yml) and a range in the package."""
import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower().replace("_", "-")


def _pip_section() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(item["pip"] for item in env["dependencies"] if isinstance(item, dict) and "pip" in item)


def _not_torch(requirements) -> set[str]:
    return {r for r in map(_normalise, requirements) if not r.startswith("torch")}


def test_environment_yml_matches_pyproject():
    wanted: set[str] = set()
    for file in ("pyproject.toml", "lab/pyproject.toml"):
        project = tomllib.loads((ROOT / file).read_text())["project"]
        wanted |= _not_torch(project["dependencies"])
        for extra in project["optional-dependencies"].values():
            wanted |= _not_torch(extra)
    wanted.discard("hsm-learned-trees")  # the lab's dependency on the library: the first `-e .`
    pip_section = _pip_section()
    listed = _not_torch(r for r in pip_section if not r.startswith("-"))
    assert listed == wanted, f"only in pyproject: {sorted(wanted - listed)}; only in environment.yml: {sorted(listed - wanted)}"
    assert "-e ." in pip_section and "-e ./lab" in pip_section


PIN = "2.13.0"  # the torch the tests run on


def test_torch_is_pinned_where_installed_and_a_range_in_the_package():
    assert f"torch=={PIN}" in (ROOT / "constraints.txt").read_text().splitlines()
    assert f"torch=={PIN}" in _pip_section()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch"]
    operators = {spec.operator for spec in torch.specifier}
    assert operators == {">=", "<"}, f"pyproject.toml should give torch a range, not {torch}"
    assert torch.specifier.contains(PIN), f"{torch} excludes the version the tests run on ({PIN})"


def test_fasttext_is_in_the_test_extra():
    """`make test` installs the test extra: the tests that compare with fastText run there."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(Requirement(r).name == "fasttext-wheel" for r in project["optional-dependencies"]["test"])
