"""hsm.experiments._package: a split experiment package forwards names set on it to its submodules."""
from __future__ import annotations

import sys
import types

import pytest

from hsm.experiments._package import patches_reach_submodules

NAME = "_hsm_demo_package"


def _module(name: str, **names: object) -> types.ModuleType:
    module = types.ModuleType(name)
    vars(module).update(names)
    sys.modules[name] = module
    return module


@pytest.fixture
def demo():
    """A package that was one module: ``calls.caller`` looks ``helper`` up in ``calls``; the package
    re-exports both; ``other`` binds ``helper`` to something else; ``sibling`` (a different package
    whose name starts the same) holds the same object."""

    def helper() -> str:
        return "real"

    calls = _module(f"{NAME}.calls", helper=helper)
    exec("def caller():\n    return helper()", vars(calls))
    other = _module(f"{NAME}.other", helper=lambda: "other's own", calls=calls)
    sibling = _module(f"{NAME}_sibling", helper=helper)
    package = _module(NAME, calls=calls, other=other, helper=helper, caller=calls.caller)
    patches_reach_submodules(NAME)
    yield types.SimpleNamespace(package=package, calls=calls, other=other, sibling=sibling, helper=helper)
    for name in (NAME, f"{NAME}.calls", f"{NAME}.other", f"{NAME}_sibling"):
        sys.modules.pop(name, None)


def test_a_name_set_on_the_package_reaches_the_code_that_calls_it_and_undo_restores_it(demo, monkeypatch):
    monkeypatch.setattr(demo.package, "helper", lambda: "fake")
    assert demo.package.caller() == "fake" and demo.calls.helper is demo.package.helper
    monkeypatch.undo()
    assert demo.package.caller() == "real"
    assert demo.package.helper is demo.helper and demo.calls.helper is demo.helper


def test_only_submodules_holding_the_same_object_change(demo, monkeypatch):
    own = demo.other.helper
    monkeypatch.setattr(demo.package, "helper", lambda: "fake")
    assert demo.other.helper is own  # a submodule's own binding of the name is left alone
    assert demo.sibling.helper is demo.helper  # NAME_sibling is not a submodule of NAME


def test_submodules_and_new_names_are_set_on_the_package_only(demo):
    replacement = types.ModuleType("replacement")
    demo.package.calls = replacement
    assert demo.other.calls is sys.modules[f"{NAME}.calls"]  # a module attribute is not forwarded
    demo.package.brand_new = 1
    assert not hasattr(demo.calls, "brand_new") and not hasattr(demo.other, "brand_new")


def test_applying_it_twice_changes_nothing(demo, monkeypatch):
    assert patches_reach_submodules(demo.package) is demo.package
    monkeypatch.setattr(demo.package, "helper", lambda: "fake")
    assert demo.package.caller() == "fake"


def test_bad_package_is_refused():
    with pytest.raises(ValueError, match="not imported"):
        patches_reach_submodules("_hsm_no_such_package")
    with pytest.raises(TypeError, match="module"):
        patches_reach_submodules(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("package", ["hsm.experiments.lm", "hsm.experiments.classification",
                                     "hsm.experiments.sampling"])
def test_every_split_experiment_package_forwards_what_is_set_on_it(package, monkeypatch):
    """Each package sets a name its submodules share: the copy in every submodule that holds it follows."""
    import importlib

    module = importlib.import_module(package)
    name = {"hsm.experiments.lm": "atomic_write", "hsm.experiments.classification": "train_bow",
            "hsm.experiments.sampling": "train_softmax_regression"}[package]
    real = getattr(module, name)
    holders = [m for key, m in sys.modules.items() if key.startswith(package + ".") and vars(m).get(name) is real]
    assert holders  # the name is really used by a submodule

    def fake(*args, **kwargs):
        raise AssertionError("not called")

    monkeypatch.setattr(module, name, fake)
    assert all(vars(m)[name] is fake for m in holders)
    monkeypatch.undo()
    assert getattr(module, name) is real and all(vars(m)[name] is real for m in holders)
