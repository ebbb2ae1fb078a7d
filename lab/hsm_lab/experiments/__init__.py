"""Experiments: one registered command per table or figure of the papers.

``python -m hsm run NAME --scale quick|full --device cpu|cuda [--out PATH] [--force]`` runs the
experiment ``NAME`` and writes its JSON result file (records + provenance, :mod:`hsm_lab.results`):
without ``--out`` under ``hsm-results/`` (``HSM_OUTPUT``; :func:`hsm_lab.results.output_path`), so
only ``--out results/...`` updates a committed result, and a full-scale file is never replaced
by a quick run without ``--force``. Scale, device and every ``-o KEY=VALUE`` option are checked
(:func:`check_scale`, :func:`check_device`, the ``option_*`` parsers) before any work starts.
Each topic module registers its experiments with :func:`experiment`; the CLI imports the
modules listed in :data:`MODULES` lazily, so a missing optional dependency of one topic does not
break the others.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hsm_lab.checks import SCALES, check_device, check_scale

__all__ = [
    "Experiment", "MODULES", "REGISTRY", "SCALES", "experiment", "get", "check_scale", "check_device",
    "option_int", "option_float", "option_floats", "option_ints", "option_choice", "option_choices", "option_bool",
]


#: modules that register experiments (imported by :func:`load_all`)
MODULES = [
    "hsm_lab.experiments.lm",  # language modelling: arXiv Table 1, ICML Table 2, figures
    "hsm_lab.experiments.lm_timing",  # the same tables' ms/batch at the papers' full vocabularies
    "hsm_lab.experiments.classification",  # ICML Tables 1 and 3 on stand-ins
    "hsm_lab.experiments.classification_fast",  # the compiled trainer: statistics/schedule ablation, threaded repeats
    "hsm_lab.experiments.taxonomy",  # Schuurmans & Frasincar: two-level softmax over natural taxonomies
    "hsm_lab.experiments.taxonomy_cv",  # their model selection: k-fold cross-validation of h_dim and direction
    "hsm_lab.experiments.sampling",  # Barber & Botev: sampling approximations of the softmax
    "hsm_lab.experiments.transformer_lm",  # the output layers under a Transformer LM at equal CPU time
    "hsm_lab.experiments.label_addition",  # labels added to a trained classifier without retraining
]


@dataclass(frozen=True)
class Experiment:
    name: str
    func: Callable[..., Any]  #: ``func(scale: str, device: str, out: Path | None, **options) -> Path`` of the result file
    summary: str
    #: the committed result file, relative to the repository root, e.g. "results/lm/ptb-25.json"; a run
    #: without ``out`` writes the same path under hsm-results/ instead (hsm_lab.results.output_path)
    default_out: str


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


# ---------------------------------------------------------------------------------------------- validation
def _fail(key: str, value: Any, what: str) -> ValueError:
    return ValueError(f"option {key}={value!r}: {what}")


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def option_int(key: str, value: Any, minimum: int | None = None, maximum: int | None = None,
               allow_none: bool = False) -> int | None:
    """An integer option (a string from ``-o KEY=VALUE`` or a Python int) in ``[minimum, maximum]``;
    ``None``/``"none"`` when ``allow_none``. Raises ValueError naming the option and its value
    otherwise (``"1.5"``, ``"-5"`` where ``minimum=1``, booleans)."""
    if allow_none and _is_none(value):
        return None
    if isinstance(value, bool):
        raise _fail(key, value, "must be an integer, not a boolean")
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, int):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            raise _fail(key, value, "must be an integer" + (" or 'none'" if allow_none else "")) from None
    elif hasattr(value, "__index__"):  # numpy integers
        number = int(value.__index__())
    else:
        raise _fail(key, value, "must be an integer")
    if minimum is not None and number < minimum:
        raise _fail(key, value, f"must be >= {minimum}")
    if maximum is not None and number > maximum:
        raise _fail(key, value, f"must be <= {maximum}")
    return number


def option_float(key: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                 positive: bool = False, below: float | None = None, allow_none: bool = False) -> float | None:
    """A finite float option in ``[minimum, maximum]`` (``> 0`` when ``positive``, ``< below``
    when given); NaN and infinities are refused. Raises ValueError naming the option and value."""
    if allow_none and _is_none(value):
        return None
    if isinstance(value, bool):
        raise _fail(key, value, "must be a number, not a boolean")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise _fail(key, value, "must be a number") from None
    if not math.isfinite(number):
        raise _fail(key, value, "must be a finite number")
    if positive and not number > 0:
        raise _fail(key, value, "must be > 0")
    if minimum is not None and number < minimum:
        raise _fail(key, value, f"must be >= {minimum:g}")
    if maximum is not None and number > maximum:
        raise _fail(key, value, f"must be <= {maximum:g}")
    if below is not None and not number < below:
        raise _fail(key, value, f"must be < {below:g}")
    return number


def _items(key: str, value: Any) -> list[Any]:
    if isinstance(value, str):
        if not value.strip():
            return []
        items = [item.strip() for item in value.split(",")]
        if not all(items):  # "0.1,,0.2" or a trailing comma: a typo, not a list with a gap
            raise _fail(key, value, "has an empty entry (two commas in a row, or one at an end)")
        return items
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Sequence) or hasattr(value, "__iter__"):
        return list(value)
    raise _fail(key, value, "must be a comma-separated list")


def _option_list(key: str, value: Any, parse: Callable[..., Any], noun: str, allow_empty: bool,
                 bounds: dict[str, Any]) -> tuple[Any, ...]:
    """A comma-separated list (or sequence), each entry checked by ``parse`` (an ``option_*``);
    an error names the list and the bad entry."""
    items = _items(key, value)
    if not items and not allow_empty:
        raise _fail(key, value, f"must hold at least one {noun}")
    out = []
    for item in items:
        try:
            out.append(parse(key, item, **bounds))
        except ValueError as exc:
            raise _fail(key, value, f"entry {item!r} {str(exc).split(': ', 1)[-1]}") from None
    return tuple(out)


def option_floats(key: str, value: Any, allow_empty: bool = False, **bounds: Any) -> tuple[float, ...]:
    """A comma-separated list (or sequence) of floats, each checked as :func:`option_float`; empty
    only when ``allow_empty``."""
    return _option_list(key, value, option_float, "number", allow_empty, bounds)


def option_ints(key: str, value: Any, allow_empty: bool = False, **bounds: Any) -> tuple[int, ...]:
    """A comma-separated list (or sequence) of integers, each checked as :func:`option_int`."""
    return _option_list(key, value, option_int, "integer", allow_empty, bounds)


def option_choice(key: str, value: Any, choices: Sequence[str]) -> str:
    """One of ``choices`` (exact); else ValueError naming the option, its value and the choices."""
    text = str(value).strip() if isinstance(value, str) else value
    if text not in choices:
        raise _fail(key, value, f"must be one of {', '.join(map(str, choices))}")
    return text


def option_choices(key: str, value: Any, choices: Sequence[str], allow_empty: bool = False) -> tuple[str, ...]:
    """A comma-separated list (or sequence) of ``choices``, without repeats."""
    items = [str(item) for item in _items(key, value)]
    if not items and not allow_empty:
        raise _fail(key, value, f"must name at least one of {', '.join(choices)}")
    unknown = [item for item in items if item not in choices]
    if unknown:
        raise _fail(key, value, f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
    if len(set(items)) != len(items):
        raise _fail(key, value, "names an entry twice")
    return tuple(items)


def option_bool(key: str, value: Any) -> bool:
    """``true/false``, ``yes/no``, ``1/0`` (or a Python bool); anything else is a ValueError (a
    typo must not silently mean false)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _fail(key, value, "must be true or false (1/0, yes/no)")
