"""One table's configuration (:class:`TableConfig`), its JSON form (what a result file's
provenance and a resumed run's partial file compare), and the ``-o key=value`` options that set it."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from hsm_lab.experiments import (check_scale, option_bool, option_choice, option_float, option_floats, option_int,
                             option_ints)

from hsm_lab.experiments.classification.presets import OUTPUTS, PAPER_LR_GRID, PEERS, QUICK, REASSIGNS, VW_LR_GRID

__all__ = ["TableConfig"]


@dataclass
class TableConfig:
    data: str = "cooking"
    test: str | None = None
    dims: tuple[int, ...] = (50, 200)
    outputs: tuple[str, ...] = tuple(OUTPUTS)
    peers: tuple[str, ...] = PEERS
    lr_grid: tuple[float, ...] = PAPER_LR_GRID
    vw_lr_grid: tuple[float, ...] = VW_LR_GRID
    epochs: int = 5
    batch_size: int = 32
    reduce: str = "mean"
    ngrams: int = 1
    validation_fraction: float = 0.1
    train_limit: int | None = None
    test_limit: int | None = None
    max_books: int | None = None
    min_label_count: int = 100
    seed: int = 0
    save_trees: bool = True
    reassigns: int = REASSIGNS
    tree_prior: str = "sticky"
    tree_decay: float = 1.0
    reset_moved_nodes: bool = False
    #: "torch" (mini-batches of batch_size) or "fast" (compiled per-example Hogwild SGD,
    #: :class:`hsm.classifiers.fast_classifier.FastBowClassifier`)
    trainer: str = "torch"
    statistics: str = "ours"  #: trainer="fast": "ours" or "released" (the authors' fork's policy)
    schedule: str = "first_half"  #: trainer="fast": "first_half" or "every_tokens" (the fork's)
    threads: int | None = None  #: trainer="fast": Hogwild threads (None: torch.get_num_threads())
    #: the test time of a row is the fastest of this many passes over the test set (evaluate_bow)
    timing_passes: int = 1


def _config_json(config: TableConfig) -> dict[str, Any]:
    return json.loads(json.dumps(config.__dict__, default=list))


def _as_tuple(value: Any, cast: Callable[[str], Any]) -> tuple:
    if isinstance(value, str):
        return tuple(cast(v) for v in value.split(",") if v.strip())
    return tuple(cast(v) for v in value)


def _optional_str(value: Any) -> str | None:
    return None if value in (None, "", "none", "None") else str(value)


#: every option's parser and range check (a bad value is a ValueError naming the option)
_CASTS: dict[str, Callable[[str, Any], Any]] = {
    "data": lambda k, v: str(v).strip(),  # a stand-in or a file: checked when loaded
    "test": lambda k, v: _optional_str(v),
    "dims": lambda k, v: option_ints(k, v, minimum=1),
    "outputs": lambda k, v: _as_tuple(v, str), "peers": lambda k, v: _as_tuple(v, str),
    "lr_grid": lambda k, v: option_floats(k, v, positive=True),
    "vw_lr_grid": lambda k, v: option_floats(k, v, positive=True),
    "epochs": lambda k, v: option_int(k, v, minimum=1), "batch_size": lambda k, v: option_int(k, v, minimum=1),
    "reduce": lambda k, v: option_choice(k, v, ("mean", "sum")),
    "ngrams": lambda k, v: option_int(k, v, minimum=1, maximum=2),
    "validation_fraction": lambda k, v: option_float(k, v, positive=True, below=1.0),
    "train_limit": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
    "test_limit": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
    "max_books": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
    "min_label_count": lambda k, v: option_int(k, v, minimum=1),
    "seed": lambda k, v: option_int(k, v, minimum=0), "save_trees": option_bool,
    "reassigns": lambda k, v: option_int(k, v, minimum=1),
    "tree_prior": lambda k, v: option_choice(k, v, ("sticky", "uniform")),
    "tree_decay": lambda k, v: option_float(k, v, minimum=0.0, maximum=1.0),
    "reset_moved_nodes": option_bool,
    "trainer": lambda k, v: option_choice(k, v, ("torch", "fast")),
    "statistics": lambda k, v: option_choice(k, v, ("ours", "released")),
    "schedule": lambda k, v: option_choice(k, v, ("first_half", "every_tokens")),
    "threads": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
    "timing_passes": lambda k, v: option_int(k, v, minimum=1),
}
_ALIASES = {"d": "dims", "lr": "lr_grid", "lrs": "lr_grid"}


def _parse_options(scale: str, options: dict[str, Any]) -> TableConfig:
    """Experiment options (strings from the command line, or Python values) -> a config.

    Quick scale (CI, notebooks): :data:`~.presets.QUICK` (a slice of ``cooking`` or 40 Gutenberg
    books, ``d = 50``, LR grid {0.1, 0.5}). Full scale: the whole stand-in, d in {50, 200}, the
    paper's grid."""
    config = TableConfig()
    if check_scale(scale) == "quick":
        config = replace(config, **QUICK)
    updates = {}
    for key, value in options.items():
        key = _ALIASES.get(key, key)
        if key not in _CASTS:
            raise ValueError(f"unknown option {key!r}; known: {sorted(_CASTS)}")
        try:
            updates[key] = _CASTS[key](key, value)
        except ValueError as exc:
            message = str(exc)
            raise ValueError(message if message.startswith("option ") else f"option {key}={value!r}: {exc}") from None
        except TypeError as exc:
            raise ValueError(f"option {key}={value!r}: {exc}") from None
    if "data" in updates and not updates["data"]:
        raise ValueError("option data='': data must be one of cooking, gutenberg-books or a fastText file")
    config = replace(config, **updates)
    _check(config)
    return config


def _check(config: TableConfig) -> None:
    """ValueError naming what is wrong in a config built from options."""
    unknown = [o for o in config.outputs if o not in OUTPUTS]
    if unknown:
        raise ValueError(f"unknown outputs {unknown}; choose from {list(OUTPUTS)}")
    unknown = [p for p in config.peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; choose from {list(PEERS)}")
    if not config.outputs and not config.peers:
        raise ValueError("options outputs and peers are both empty: nothing to run")
    if config.reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {config.reduce!r}")
    if config.tree_prior not in ("sticky", "uniform"):
        raise ValueError(f"tree_prior must be 'sticky' or 'uniform', got {config.tree_prior!r}")
    if not 0.0 <= config.tree_decay <= 1.0 or config.reassigns < 1:
        raise ValueError("tree_decay must lie in [0, 1] and reassigns be >= 1")
    if not config.lr_grid or any(not (math.isfinite(lr) and lr > 0) for lr in config.lr_grid):
        raise ValueError(f"lr_grid must hold positive rates, got {config.lr_grid}")
    if "vw-log_multi" in config.peers and not config.vw_lr_grid:
        raise ValueError("option vw_lr_grid is empty but the vw-log_multi peer runs")
