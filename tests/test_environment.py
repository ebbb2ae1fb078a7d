"""environment.yml (conda users) lists the same requirements as pyproject.toml (pip users)."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(map(_normalise, project["dependencies"]))
    for extra in project["optional-dependencies"].values():
        wanted |= set(map(_normalise, extra))
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict) and "pip" in item)
    listed = {_normalise(r) for r in pip_section if not r.startswith("-")}
    assert listed == wanted, f"only in pyproject: {sorted(wanted - listed)}; only in environment.yml: {sorted(listed - wanted)}"
    assert "-e ." in pip_section


def test_torch_is_pinned_everywhere():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()
    assert '"torch==2.13.0"' in (ROOT / "pyproject.toml").read_text()
