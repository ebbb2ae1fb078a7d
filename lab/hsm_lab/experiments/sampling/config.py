"""The settings of one run of each experiment: the preset of its scale
(:mod:`hsm_lab.experiments.sampling.presets`) with the ``-o key=value`` options applied, each parsed
and range-checked before any work starts (ValueError naming the option and its value)."""
from __future__ import annotations

import copy
from typing import Any

from hsm_lab.experiments import check_scale, option_choice, option_float, option_floats, option_int, option_ints

from hsm_lab.experiments.sampling.presets import FIG_SETTINGS, LM_SETTINGS

__all__: list[str] = []

#: how each Fig. 1 / Fig. 2 option is parsed and range-checked (ValueError naming it and its value)
_FIG_CHECKS = {
    "num_points": lambda k, v: option_int(k, v, minimum=1), "dim": lambda k, v: option_int(k, v, minimum=1),
    "num_classes": lambda k, v: option_int(k, v, minimum=2), "batch_size": lambda k, v: option_int(k, v, minimum=1),
    "num_negatives": lambda k, v: option_int(k, v, minimum=1),
    "momentum": lambda k, v: option_float(k, v, minimum=0.0, below=1.0),
    "score_scale": lambda k, v: option_float(k, v, positive=True),
    "iterations": lambda k, v: option_int(k, v, minimum=1), "eval_every": lambda k, v: option_int(k, v, minimum=1),
    "lr_exact": lambda k, v: option_float(k, v, positive=True),
    "seeds": lambda k, v: list(option_ints(k, v, minimum=0)),
    "explicit": lambda k, v: option_choice(k, v, ("minibatch", "target")),
    "blackout_power": lambda k, v: option_float(k, v, minimum=0.0),
    "lr_grid": lambda k, v: list(option_floats(k, v, positive=True)),
    "lr_pick_iterations": lambda k, v: option_int(k, v, minimum=1),
    "pick_lr": lambda k, v: option_int(k, v, minimum=0, maximum=1),
}

#: lm-ptb-sampling integer options whose minimum is not 1 (0 has a meaning for them)
_LM_MINIMUM = {"vocab_size": 0, "train_tokens": 0, "eval_tokens": 0, "select_steps": 0, "lr_extend": 0, "arity": 0,
               "seed": 0}


def _settings(scale: str, options: dict[str, Any]) -> dict[str, Any]:
    """The Fig. 1 / Fig. 2 preset of ``scale`` with ``options`` applied; ValueError naming an unknown
    option or a bad value (counts >= 1, rates finite and > 0, momentum in [0, 1), ...)."""
    cfg = copy.deepcopy(FIG_SETTINGS[check_scale(scale)])  # the presets' lists stay untouched
    for key, value in options.items():
        if key not in cfg:
            raise ValueError(f"unknown option {key!r}; known: {sorted(cfg)}")
        cfg[key] = _FIG_CHECKS[key](key, value)
    if cfg["batch_size"] > cfg["num_points"]:
        raise ValueError(f"option batch_size={cfg['batch_size']}: more than the {cfg['num_points']} points (num_points)")
    if cfg["num_negatives"] >= cfg["num_classes"]:
        raise ValueError(f"option num_negatives={cfg['num_negatives']}: must be < num_classes={cfg['num_classes']}")
    return cfg


def _lm_settings(scale: str, options: dict[str, Any]) -> dict[str, Any]:
    """Settings of ``lm-ptb-sampling``; ``options`` (strings from the CLI) override them."""
    cfg = copy.deepcopy(LM_SETTINGS[check_scale(scale)])  # the presets' lists stay untouched
    for key, value in options.items():
        if key not in cfg:
            raise ValueError(f"unknown option {key!r}; known: {sorted(cfg)}")
        if key == "lr_grid":
            cfg[key] = list(option_floats(key, value, positive=True))
        elif isinstance(cfg[key], list):
            items = [v for v in str(value).split(",") if v] if isinstance(value, str) else list(value)
            cfg[key] = [str(v).strip() for v in items]
        else:
            # 0 means "the whole split / vocabulary" (vocab_size, train_tokens, eval_tokens) or "choose" (arity)
            cfg[key] = option_int(key, value, minimum=_LM_MINIMUM.get(key, 1))
            if key in ("vocab_size", "arity") and cfg[key] == 1:
                raise ValueError(f"option {key}=1: must be 0 (automatic) or >= 2")
    from hsm_lab.experiments.lm import SAMPLED_KINDS

    for item in cfg["more_negatives"]:
        method, _, k = item.partition(":")
        if method not in cfg["methods"] or not k.isdigit() or int(k) < 1:
            raise ValueError(f"more_negatives entries are 'method:K' with a method of 'methods' and K >= 1, got {item!r}")
    for method in cfg["methods"]:
        if method not in SAMPLED_KINDS:
            raise ValueError(f"unknown sampled output {method!r}; known: {SAMPLED_KINDS}")
    for ref in cfg["reference"]:
        if ref not in ("flat", "random"):
            raise ValueError(f"reference runs are 'flat' and/or 'random', got {ref!r}")
    if not cfg["lr_grid"] or min(cfg["lr_grid"]) <= 0:
        raise ValueError("lr_grid must hold positive learning rates")
    return cfg
