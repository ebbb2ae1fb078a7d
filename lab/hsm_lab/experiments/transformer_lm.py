"""``transformer-ptb``: the output layers under a small Transformer language model, at equal CPU time.

The practitioner's question: with a modern body and its optimiser (a 2-layer causal Transformer,
AdamW, warm-up then cosine decay, gradient clipping), which output layer gives the best perplexity
for the CPU time spent, and which recipe trains the tree layer? Every run gets the same budget of
CPU seconds of training on one thread (evaluation not counted) and the same body initialisation:

* ``flat``: :class:`hsm.FlatSoftmax`, AdamW over everything;
* ``adaptive``: ``torch.nn.AdaptiveLogSoftmaxWithLoss`` (head 1,000 words, tails to 4,000 and 10,000), AdamW over everything;
* ``random``, ``huffman``, ``learned``: :class:`hsm.HierarchicalSoftmax` on a random 22-ary depth-3 tree
  (fixed), a 22-ary Huffman tree (fixed), and the random tree learned by Algorithm 1
  (:meth:`hsm.TreeLearner.for_planned_steps`), each with ``sparse=True`` and
  :class:`hsm.TreeModelOptimizer` (AdamW on the body, the layer's fused row-sparse Adagrad);
* ``learned-dense``: the learned tree with one dense AdamW over everything (the pattern of a model
  written without the recipe).

A run trains on batches of random windows of the training stream (``batch`` windows of ``context``
tokens) and measures validation perplexity at ``evals`` evenly spaced points of its budget, over
non-overlapping windows of ``context`` tokens (no context carried across windows), and test
perplexity at the end. The first step's CPU time (compilation) is not counted. The number of steps a budget buys is estimated from the first ``probe_steps``
steps' CPU time; the body's schedule and the tree's schedule are set from that estimate, as a user
training for a given time would.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hsm
from hsm_lab.experiments import (check_device, check_scale, experiment, option_bool, option_choices, option_float,
                                 option_floats, option_int)
from hsm_lab.output_layers import output_layer
from hsm_lab.results import ResumableParts, check_replace, output_path, provenance, write_results

__all__ = ["LAYERS", "TransformerLM", "parse_options", "transformer_ptb"]

#: the output layers a run can use (module docstring)
LAYERS = ("flat", "adaptive", "random", "huffman", "learned", "learned-dense")
#: the tree layers trained with hsm.TreeModelOptimizer (the others: one AdamW over everything)
RECIPE_LAYERS = ("random", "huffman", "learned")
DEFAULTS: dict[str, Any] = {
    "dim": 128, "heads": 4, "blocks": 2, "context": 64, "batch": 32, "dropout": 0.1, "body_lr": 1e-3,
    "weight_decay": 0.01, "warmup_steps": 100, "final_lr_share": 0.1, "clip": 1.0, "depth": 3,
    "layer_lr": (hsm.optim.LAYER_LR,), "learn_share": (hsm.training.LEARN_SHARE,), "rebuilds": hsm.training.REBUILDS,
    "schedule_layer": False, "probe_steps": 20, "seed": 0,
}
FULL = {"cpu_seconds": 400.0, "evals": 8, "eval_tokens": None, "train_tokens": None}
QUICK = {"cpu_seconds": 6.0, "evals": 2, "eval_tokens": 4_096, "train_tokens": 60_000, "probe_steps": 5,
         "warmup_steps": 10}
CUTOFFS = [1_000, 4_000]


class TransformerLM(nn.Module):
    """Token and position embeddings, ``blocks`` pre-norm causal Transformer blocks, a final layer
    norm: one vector per position, ``[B, T] -> [B, T, dim]``."""

    def __init__(self, vocab_size: int, dim: int, heads: int, blocks: int, context: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.position = nn.Embedding(context, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embedding(tokens) + self.position(torch.arange(length, device=tokens.device))
        return self.norm(self.blocks(x, mask=self.causal[:length, :length], is_causal=True))


def _output_layer(kind: str, corpus: Any, settings: dict[str, Any]) -> nn.Module:
    """The run's output layer from the lab's one factory (the adaptive softmax with this run's cut-offs);
    the trees: Huffman's of the training counts, or a random depth-``depth`` tree."""
    dim, vocab = settings["dim"], corpus.vocab_size
    if kind in ("flat", "adaptive"):
        return output_layer(kind, dim, vocab, counts=corpus.counts, cutoffs=CUTOFFS)
    arity = math.ceil(vocab ** (1 / settings["depth"]))
    if kind == "huffman":
        tree = hsm.Tree.huffman(corpus.counts, arity=arity)
    else:
        tree = hsm.Tree.random(vocab, arity, settings["depth"], seed=settings["seed"])
    return output_layer("tree", dim, vocab, tree=tree, sparse=kind in RECIPE_LAYERS)


def _windows(stream: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (input, target) windows of ``context`` tokens: [n, context] each."""
    count = (stream.numel() - 1) // context
    x = stream[: count * context].view(count, context)
    y = stream[1: count * context + 1].view(count, context)
    return x, y


@torch.no_grad()
def _perplexity(model: nn.Module, layer: nn.Module, data: tuple[torch.Tensor, torch.Tensor], dim: int) -> float:
    model.eval(), layer.eval()
    nll, count = 0.0, 0
    x, y = data
    for start in range(0, x.shape[0], 64):
        h = model(x[start:start + 64])
        target = y[start:start + 64].reshape(-1)
        nll -= float(layer(h.reshape(-1, dim), target).output.double().sum())
        count += target.numel()
    model.train(), layer.train()
    return math.exp(nll / count)


def _run(kind: str, layer_lr: float, learn_share: float, corpus: Any, valid: Any, test: Any,
         settings: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """One output layer trained for ``cpu_seconds`` of CPU time; its curve and final perplexities."""
    torch.manual_seed(settings["seed"])  # the same body initialisation for every output layer
    dim, context, batch = settings["dim"], settings["context"], settings["batch"]
    model = TransformerLM(corpus.vocab_size, dim, settings["heads"], settings["blocks"], context, settings["dropout"])
    layer = _output_layer(kind, corpus, settings)
    adamw = dict(lr=settings["body_lr"], weight_decay=settings["weight_decay"])
    if kind in RECIPE_LAYERS:
        optimizer: torch.optim.Optimizer = hsm.TreeModelOptimizer(
            torch.optim.AdamW(model.parameters(), **adamw), layer, lr=layer_lr,
            schedule_layer=settings["schedule_layer"])
        clipped = optimizer.body_parameters()
    else:
        clipped = list(model.parameters()) + list(layer.parameters())
        optimizer = torch.optim.AdamW(clipped, **adamw)
    plan: dict[str, Any] = {"steps": None}
    name = kind + (f", layer lr {layer_lr}" if kind in RECIPE_LAYERS else "") + (
        f", learning the tree for {learn_share:.0%} of the steps" if kind.startswith("learned") else "")

    def rate(step: int) -> float:
        """Linear warm-up, then cosine decay to ``final_lr_share`` at the planned step."""
        if step < settings["warmup_steps"]:
            return (step + 1) / settings["warmup_steps"]
        if plan["steps"] is None:
            return 1.0
        done = min(1.0, (step - settings["warmup_steps"]) / max(1, plan["steps"] - settings["warmup_steps"]))
        low = settings["final_lr_share"]
        return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    learner: hsm.TreeLearner | None = None
    train = corpus.train if settings["train_tokens"] is None else corpus.train[: settings["train_tokens"]]
    draw = torch.Generator().manual_seed(settings["seed"])
    budget = settings["cpu_seconds"]
    marks = [budget * (i + 1) / settings["evals"] for i in range(settings["evals"])]
    curve: list[dict[str, float]] = []
    cpu, step, probe_cpu = 0.0, 0, 0.0
    while cpu < budget:
        started = time.process_time()
        offsets = torch.randint(0, train.numel() - context - 1, (batch,), generator=draw)
        window = train[offsets[:, None] + torch.arange(context + 1)]
        h = model(window[:, :-1])
        loss = layer(h.reshape(-1, dim), window[:, 1:].reshape(-1)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(clipped, settings["clip"])
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        step += 1
        if learner is not None:
            learner.step()
        if step > 1:  # the first step compiles (or loads) the kernels: not part of the budget
            cpu += time.process_time() - started
        if step == settings["probe_steps"]:
            probe_cpu = cpu
            plan["steps"] = max(step + 1, int(budget / (cpu / (step - 1))))
            if kind in ("learned", "learned-dense"):
                learner = hsm.TreeLearner.for_planned_steps(layer, plan["steps"] - step, learn_share=learn_share,
                                                            rebuilds=settings["rebuilds"], record_objective=False)
        if marks and cpu >= marks[0]:
            marks.pop(0)
            curve.append({"cpu_seconds": cpu, "step": step, "valid_perplexity": _perplexity(model, layer, valid, dim)})
            log(f"{name}: {cpu:.0f} CPU-s, step {step}, validation perplexity {curve[-1]['valid_perplexity']:.1f}")
    row = {"layer": kind, "recipe": "TreeModelOptimizer" if kind in RECIPE_LAYERS else "AdamW over everything",
           "layer_lr": layer_lr if kind in RECIPE_LAYERS else None,
           "learn_share": learn_share if kind.startswith("learned") else None,
           "steps": step, "planned_steps": plan["steps"], "cpu_seconds": cpu, "probe_cpu_seconds": probe_cpu,
           "tokens_per_cpu_second": (step - 1) * batch * context / cpu, "curve": curve,
           "valid_perplexity": curve[-1]["valid_perplexity"] if curve else _perplexity(model, layer, valid, dim),
           "test_perplexity": _perplexity(model, layer, test, dim),
           "layer_parameters": sum(p.numel() for p in layer.parameters())}
    if learner is not None:
        row.update(reassign_every=learner.reassign_every, freeze_after=learner.freeze_after + settings["probe_steps"],
                   rebuilds=len(learner.history), moved_share=[r.moved_labels for r in learner.history])
    return row


def parse_options(scale: str, options: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(layers, settings) from ``-o KEY=VALUE`` options at ``scale``; ValueError naming a bad or unknown option."""
    quick = check_scale(scale) == "quick"
    options = dict(options)
    base = {**DEFAULTS, **FULL, **(QUICK if quick else {})}
    layers = option_choices("layers", options.pop("layers", ",".join(LAYERS)), LAYERS)
    settings: dict[str, Any] = {}
    for key in ("dim", "heads", "blocks", "context", "batch", "warmup_steps", "depth", "rebuilds", "probe_steps",
                "seed", "evals"):
        settings[key] = option_int(key, options.pop(key, base[key]), minimum={"seed": 0, "probe_steps": 2}.get(key, 1))
    for key in ("train_tokens", "eval_tokens"):
        settings[key] = option_int(key, options.pop(key, base[key]), minimum=1_000, allow_none=True)
    for key in ("dropout", "weight_decay", "final_lr_share"):
        settings[key] = option_float(key, options.pop(key, base[key]), minimum=0.0, maximum=1.0)
    for key in ("body_lr", "clip", "cpu_seconds"):
        settings[key] = option_float(key, options.pop(key, base[key]), minimum=1e-9)
    settings["layer_lr"] = option_floats("layer_lr", options.pop("layer_lr", base["layer_lr"]), minimum=1e-9)
    settings["learn_share"] = option_floats("learn_share", options.pop("learn_share", base["learn_share"]),
                                            minimum=1e-9, maximum=1.0)
    settings["schedule_layer"] = option_bool("schedule_layer", options.pop("schedule_layer", base["schedule_layer"]))
    if options:
        raise ValueError(f"unknown option(s) for transformer-ptb: {', '.join(sorted(options))}")
    if settings["dim"] % settings["heads"]:
        raise ValueError(f"dim={settings['dim']} must be a multiple of heads={settings['heads']}")
    return layers, settings


def _run_keys(layers: tuple[str, ...], settings: dict[str, Any]) -> list[tuple[str, float, float]]:
    """Every (layer, layer_lr, learn_share) to run: the rates cross the recipe's tree layers, the shares
    the recipe's learned tree; the other layers run once (at the first rate and share)."""
    keys = []
    for kind in layers:
        rates = settings["layer_lr"] if kind in RECIPE_LAYERS else (settings["layer_lr"][0],)
        shares = settings["learn_share"] if kind == "learned" else (settings["learn_share"][0],)
        keys += [(kind, lr, share) for lr in rates for share in shares]
    return keys


@experiment("transformer-ptb", "Output layers under a 2-layer Transformer LM on PTB at equal CPU time (flat, "
            "adaptive, random / Huffman / learned trees; the TreeModelOptimizer recipe)",
            "results/lm/transformer-ptb-400cpus.json")
def transformer_ptb(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                    **options: Any) -> Path:
    """The equal-CPU-time comparison of the module docstring. Options: ``layers`` (default all of
    :data:`LAYERS`), ``cpu_seconds`` per run (400; quick 6), ``evals`` (curve points, 8), ``layer_lr`` and
    ``learn_share`` (comma-separated lists: one run per value), ``schedule_layer``, ``rebuilds``, the body's
    ``dim``, ``heads``, ``blocks``, ``context``, ``batch``, ``dropout``, ``body_lr``, ``weight_decay``,
    ``warmup_steps``, ``final_lr_share``, ``clip``, and ``train_tokens`` / ``eval_tokens`` (quick: slices).
    One thread; a stopped run resumes from its finished runs."""
    from hsm_lab.data import load_ptb

    quick = check_scale(scale) == "quick"
    check_device(device)
    if device != "cpu":
        raise ValueError(f"transformer-ptb budgets CPU seconds and runs on the CPU, got device={device!r}")
    layers, settings = parse_options(scale, options)
    out = Path(out) if out is not None else output_path(
        f"results/lm/transformer-ptb-{settings['cpu_seconds']:.0f}cpus{'-quick' if quick else ''}.json")
    check_replace(out, scale, force)
    log = lambda message: print(message, flush=True)  # noqa: E731
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_all(layers, settings, out, scale, force, log, start, load_ptb())
    finally:
        torch.set_num_threads(threads)  # the caller's setting (a notebook's) is left as it was


def _run_all(layers: tuple[str, ...], settings: dict[str, Any], out: Path, scale: str, force: bool,
             log: Callable[[str], None], start: float, corpus: Any) -> Path:
    """Every (layer, rate, share) run, each saved as it finishes, then the result file."""
    tokens = settings["eval_tokens"]
    valid = _windows(corpus.valid if tokens is None else corpus.valid[:tokens], settings["context"])
    test = _windows(corpus.test if tokens is None else corpus.test[:tokens], settings["context"])
    config = {"experiment": "transformer-ptb", "data": "ptb", "layers": list(layers), **settings, "threads": 1,
              "vocabulary": corpus.vocab_size, "cutoffs": CUTOFFS}
    parts = ResumableParts(out, config, "partial transformer-ptb file", log=log)
    rows = [parts.run(f"{kind}-lr{lr}-share{share}", lambda kind=kind, lr=lr, share=share: _run(
        kind, lr, share, corpus, valid, test, settings, log)) for kind, lr, share in _run_keys(layers, settings)]
    records = [dict(r, kind="run") for r in rows]
    prov = provenance(config=config, wall_time_s=time.perf_counter() - start, scale=scale)
    path = write_results(out, records, prov, force=force)
    parts.finish()
    return path
