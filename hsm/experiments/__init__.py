"""Experiments: one registered command per table or figure of the papers.

``python -m hsm run NAME --scale quick|full --device cpu|cuda [--out results/...]`` runs the
experiment ``NAME`` and writes its JSON result file (records + provenance, :mod:`hsm.results`).
Each topic module registers its experiments with :func:`experiment`; the CLI imports the
modules listed in :data:`MODULES` lazily, so a missing optional dependency of one topic does not
break the others.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Experiment", "MODULES", "REGISTRY", "experiment", "get"]

#: modules that register experiments (imported by :func:`load_all`)
MODULES = [
    "hsm.experiments.lm",  # language modelling: arXiv Table 1, ICML Table 2, figures
    "hsm.experiments.lm_timing",  # the same tables' ms/batch at the papers' full vocabularies
    "hsm.experiments.classification",  # ICML Tables 1 and 3 on stand-ins
    "hsm.experiments.taxonomy",  # seed 003: two-level softmax over natural taxonomies
    "hsm.experiments.sampling",  # seed 004: sampling approximations of the softmax
]


@dataclass(frozen=True)
class Experiment:
    name: str
    func: Callable[..., Any]  #: func(scale: str, device: str, out: Path | None, **options) -> Path of the result file
    summary: str
    default_out: str  #: result file, relative to the repository root, e.g. "results/lm/ptb-25.json"


REGISTRY: dict[str, Experiment] = {}


def experiment(name: str, summary: str, default_out: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``func`` as the experiment ``name``."""

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        if name in REGISTRY:
            raise ValueError(f"experiment {name!r} registered twice")
        REGISTRY[name] = Experiment(name, func, summary, default_out)
        return func

    return register


def load_all() -> list[str]:
    """Import every topic module; return the ones that failed (with why) instead of raising."""
    import importlib

    failed = []
    for module in MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue  # topic not written yet
            failed.append(f"{module}: {exc}")
        except Exception as exc:  # noqa: BLE001 - report, do not hide the other topics
            failed.append(f"{module}: {exc!r}")
    return failed


def get(name: str) -> Experiment:
    load_all()
    if name not in REGISTRY:
        known = ", ".join(sorted(REGISTRY)) or "none registered"
        raise ValueError(f"unknown experiment {name!r}; known: {known}")
    return REGISTRY[name]
