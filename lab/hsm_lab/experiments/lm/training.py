"""The training of one run: the log-bilinear LM with one output layer, trained with Adagrad and
resumable from its run folder (:func:`train_lm`), and the learning-rate search of a table
(:func:`_select_lr`).

A run's files in its run folder (:class:`RunFiles`): ``<stem>.pt``, the checkpoint written
after every epoch and every ``checkpoint_seconds`` within one, ``<stem>.json``, the finished
run, and (when asked for) ``<stem>.model.pt``, the trained model; ``<stem>`` holds
:meth:`LMRunConfig.key`, so a changed configuration never reuses a file.
"""
from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm_lab import config as hsm_config
from hsm_lab import results
from hsm.atomic import atomic_write
from hsm.engine import capture_step
from hsm_lab.output_layers import output_layer
from hsm_lab.data.lm import LMCorpus
from hsm_lab.experiments import check_device
from hsm.layers import HierarchicalSoftmax, NonFiniteInputError
from hsm.optim import RowSparseAdagrad
from hsm.models import LogBilinearLM
from hsm_lab.results import read_json_or_none
from hsm.sampling import SampledSoftmax
from hsm.training import TreeLearner
from hsm.tree import Tree

from hsm_lab.experiments.lm.config import OUTPUT_KINDS, RANKING_SCORE, SAMPLED_KINDS, LMRunConfig, LMRunResult
from hsm_lab.experiments.lm.data import _slice
from hsm_lab.experiments.lm.presets import LMScale

__all__ = ["RunFiles", "load_trained_model", "train_lm"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _add_l2(parameters: Sequence[torch.nn.Parameter], l2: float) -> None:
    """Add ``l2 * w`` to every gradient (L2 regularisation, arXiv §7: 5e-5 on PTB).

    torch's Adagrad refuses ``weight_decay`` with sparse gradients, so we add the term ourselves;
    for a sparse gradient only on the rows it touches ("lazy" L2: a word's embedding, or a node's
    vectors, shrink when they are used, not at every step), which keeps the step sparse. The
    paper does not say which form its Torch code used."""
    for param in parameters:
        grad = param.grad
        if grad is None:
            continue
        if grad.is_sparse:
            grad = grad.coalesce()
            rows = grad.indices()[0]
            param.grad = torch.sparse_coo_tensor(grad.indices(), grad.values() + l2 * param[rows], grad.shape,
                                                 check_invariants=False, is_coalesced=True)
        else:
            grad.add_(param, alpha=l2)


def _make_output(cfg: LMRunConfig, vocab_size: int, tree: Tree | None,
                 counts: np.ndarray | None = None) -> torch.nn.Module:
    if cfg.output == "flat":
        return output_layer("flat", cfg.dim, vocab_size)
    if cfg.output == "adaptive":
        if counts is None:
            raise ValueError("output 'adaptive' needs the training counts (its cutoffs follow frequency ranks)")
        return output_layer("adaptive", cfg.dim, vocab_size, counts=counts)
    if cfg.output in SAMPLED_KINDS:
        if counts is None:
            raise ValueError(f"output {cfg.output!r} needs the training counts (its proposal distribution)")
        # add-one smoothing keeps every word reachable by the sampler (hsm.sampling.class_frequencies)
        freq = torch.as_tensor(np.asarray(counts, dtype=np.float64) + 1.0)
        return SampledSoftmax(cfg.dim, vocab_size, freq, method=cfg.output,
                              num_negatives=cfg.num_negatives, seed=cfg.seed, sparse=True)
    if tree is None:
        raise ValueError(f"output {cfg.output!r} needs a tree")
    return output_layer("tree", cfg.dim, vocab_size, tree=tree, sparse=True)


@torch.no_grad()
def _evaluate(model: torch.nn.Module, output: torch.nn.Module, contexts: torch.Tensor, targets: torch.Tensor,
              batch_size: int, device: torch.device, timed: bool = False) -> tuple[float, float]:
    """(perplexity, ms per batch) of a split: exp of the mean NLL per token.

    The log-likelihoods are summed on the device and read once at the end; timed, the batches
    after the first five (warm-up) run as one block between two waits for the device, so the ms
    per batch is that block's wall time over its batches, not a sum of per-batch waits."""
    model.eval()
    output.eval()
    starts = range(0, len(targets), batch_size)
    warm = min(5, len(starts) - 1)
    nll = torch.zeros((), dtype=torch.float64, device=device)
    t0 = None
    for i, start in enumerate(starts):
        if timed and i == warm:
            _sync(device)
            t0 = time.perf_counter()
        x = contexts[start:start + batch_size]
        y = targets[start:start + batch_size]
        nll -= output(model(x), y).output.detach().sum()
    _sync(device)
    ms = 1000 * (time.perf_counter() - t0) / (len(starts) - warm) if t0 is not None else math.nan
    return math.exp(float(nll) / len(targets)), ms


def _load_finished(done_path: Path) -> LMRunResult | None:
    """The finished run stored in ``done_path``, or None (missing; unreadable or not a run record:
    warned about by name, and recomputed)."""
    data = read_json_or_none(done_path, "finished-run file")
    if data is None:
        return None
    try:
        return LMRunResult(**data)
    except TypeError as exc:
        warnings.warn(f"ignoring finished-run file {done_path}: not a run record ({exc}); it will be recomputed",
                      stacklevel=2)
        return None


def _check_run(corpus: LMCorpus, cfg: LMRunConfig, tree: Tree | None) -> None:
    """ValueError for a run :func:`train_lm` cannot train, before anything is built."""
    if cfg.output not in OUTPUT_KINDS + SAMPLED_KINDS:
        raise ValueError(f"output must be one of {OUTPUT_KINDS + SAMPLED_KINDS}, got {cfg.output!r}")
    if cfg.output in ("random", "clustering", "learned") and tree is None:
        raise ValueError(f"output {cfg.output!r} needs a tree")
    if tree is not None and tree.num_labels != corpus.vocab_size:
        raise ValueError(f"the tree has {tree.num_labels} labels, the vocabulary {corpus.vocab_size} words")
    if cfg.epochs < 1 or cfg.batch_size < 1 or not cfg.lr > 0:
        raise ValueError(f"epochs, batch_size and lr must be positive: {cfg}")
    if cfg.l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {cfg.l2}")
    if cfg.wrt not in ("logp", "p"):
        raise ValueError(f"wrt must be 'logp' (eq. 12) or 'p' (eq. 10), got {cfg.wrt!r}")


@dataclass(frozen=True)
class RunFiles:
    """The files of one run in its run folder, all named by ``<output>-<key>-<corpus>-<tokens>``:
    the checkpoint (``.pt``, deleted once the run is finished), the finished run (``.json``) and,
    kept only when asked for, the trained model (``.model.pt``: :func:`load_trained_model`)."""

    checkpoint: Path
    finished: Path
    model: Path | None = None

    @classmethod
    def in_folder(cls, folder: Path, cfg: LMRunConfig, corpus: LMCorpus) -> RunFiles:
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{cfg.output}-{cfg.key()}-{corpus.name}-{corpus.train.numel()}"
        return cls(checkpoint=folder / f"{stem}.pt", finished=folder / f"{stem}.json",
                   model=folder / f"{stem}.model.pt")

    def load_finished(self) -> LMRunResult | None:
        return _load_finished(self.finished)

    def load_checkpoint(self) -> dict[str, Any] | None:
        return results.load_checkpoint(self.checkpoint)

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        results.save_checkpoint(state, self.checkpoint)

    def save_model(self, run: _Training) -> None:
        """Keep the trained model: its LM, output layer, tree and configuration."""
        if self.model is None:
            raise ValueError("this run has no model file name: make its files with RunFiles.in_folder")
        output = run.output
        results.save_checkpoint({"config": asdict(run.cfg), "vocab_size": run.model.vocab_size,
                          "model": run.model.state_dict(), "output": output.state_dict(),
                          "tree": output.tree.to_dict() if isinstance(output, HierarchicalSoftmax) else None},
                         self.model)

    def finish(self, result: LMRunResult) -> None:
        """Store the finished run and drop its checkpoint."""
        # atomic: a failed write (full disk) raises here and leaves the checkpoint for the rerun
        atomic_write(self.finished, json.dumps(asdict(result)))
        if self.checkpoint.exists():
            self.checkpoint.unlink()


#: training steps between two reads of the summed loss (see :meth:`_Training.train_epoch`)
SYNC_STEPS = 200


class _LossBlock:
    """The losses of consecutive training steps, summed on their device (float64) and read back
    at once, with the wall time of the block."""

    def __init__(self, device: torch.device, first: int) -> None:
        self.device = device
        self.sum = torch.zeros((), dtype=torch.float64, device=device)
        self.restart(first)

    def restart(self, first: int | None = None) -> None:
        """Start a new block (at step ``first``; None: where the last one stopped)."""
        if first is not None:
            self.first = first
        self.steps = 0
        self.sum.zero_()
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        self.sum += loss
        self.steps += 1

    def read(self) -> tuple[float, float]:
        """(wall seconds since the block started, loss sum): waits for the device."""
        value = float(self.sum)  # waits for every kernel queued so far
        _sync(self.device)
        return time.perf_counter() - self.t0, value


def captures_step(device: torch.device, output: torch.nn.Module, cfg: LMRunConfig) -> bool:
    """Whether a training run replays its step from a CUDA graph (:func:`hsm.engine.capture_step`): on a
    GPU, for a tree output without the L2 term."""
    return device.type == "cuda" and isinstance(output, HierarchicalSoftmax) and cfg.l2 == 0


class _Training:
    """One run while it trains: the model, its output layer, the optimiser, the tree learner (a
    learned tree, or a fixed tree whose J_n is tracked), the example-order generator and the result
    so far; everything a checkpoint saves (:meth:`state_dict`) and restores (:meth:`restore`)."""

    def __init__(self, corpus: LMCorpus, cfg: LMRunConfig, tree: Tree | None, device: torch.device,
                 warmup: int = 20, capture: bool = True) -> None:
        self.cfg, self.device, self.warmup = cfg, device, warmup
        hsm_config.seed_everything(cfg.seed)
        self.model = LogBilinearLM(corpus.vocab_size, cfg.dim, cfg.context, sparse=True).to(device)
        self.output = _make_output(cfg, corpus.vocab_size, tree, corpus.counts).to(device)
        # compiled model kernels beside the tree's; torch's products beside outputs that run on
        # torch's OpenMP threads (mixing the two pools loses time to OpenMP's spinning)
        self.model.use_kernels = isinstance(self.output, HierarchicalSoftmax)
        self.parameters = list(self.model.parameters()) + list(self.output.parameters())
        # torch.optim.Adagrad's update, one pass over touched rows
        self.optimizer = RowSparseAdagrad(self.parameters, lr=cfg.lr)
        if isinstance(self.output, HierarchicalSoftmax) and cfg.l2 == 0:
            # the tree's update inside its compiled backward, bit for bit the same (with an L2 term the
            # gradients are changed between backward and step, so the update stays in step())
            self.optimizer.fuse(self.output)
        self.x_train, self.y_train = (t.to(device) for t in corpus.windows("train", cfg.context))
        self.x_valid, self.y_valid = (t.contiguous().to(device) for t in corpus.windows("valid", cfg.context))
        self.x_test, self.y_test = (t.contiguous().to(device) for t in corpus.windows("test", cfg.context))
        self.n_train = len(self.y_train)
        self.steps_per_epoch = math.ceil(self.n_train / cfg.batch_size)
        if cfg.max_steps_per_epoch is not None:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.max_steps_per_epoch)
        self.learner: TreeLearner | None = None
        self.reassign_every = max(1, self.steps_per_epoch // cfg.reassign_per_epoch)
        self.tracking = cfg.track_objective and cfg.output in ("random", "clustering")
        if cfg.output == "learned" or self.tracking:
            # tracking a fixed tree: the same statistics, read at the same steps, never rebuilt
            self.learner = TreeLearner(self.output, reassign_every=self.reassign_every, score=RANKING_SCORE[cfg.wrt],
                                       algorithm="depth", decay=cfg.decay, prior=cfg.prior, prior_mode=cfg.prior_mode)
        self.tracked: list[dict[str, Any]] = []
        self.result = LMRunResult(config=asdict(cfg))
        self.step_times: list[float] = []
        self.start_epoch = 0
        self.resume_step, self.resume_total, self.resume_order_state = 0, 0.0, None
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.earlier_reassignments: list[dict[str, Any]] = []
        self.t_start = 0.0
        # On a GPU a tree output's whole step (model, layer on the static engine, Adagrad, Algorithm 1's
        # statistics) is captured once in a CUDA graph and replayed per full batch: one launch instead
        # of one per op. The L2 term coalesces sparse gradients (output sizes read from the device),
        # so runs with it stay eager; so do the flat, adaptive and sampled outputs.
        self.capture = capture and captures_step(device, self.output, cfg)
        self._replay: Callable[[torch.Tensor], torch.Tensor] | None = None

    def restore(self, state: dict[str, Any], log: Callable[[str], None]) -> None:
        """Continue from a checkpoint: after its epoch, or at the step after it within an epoch."""
        learner = self.learner
        self.model.load_state_dict(state["model"])
        if learner is not None:
            tree = Tree.from_dict(state["tree"])
            learner.statistics.checked_state(state["statistics"], tree)  # damaged: refused before anything changes
            self.output.set_tree(tree)
            learner.statistics.load_state_dict(state["statistics"], tree)
            learner.steps = state["learner_steps"]
            if state["frozen"]:
                learner.freeze()
        self.output.load_state_dict(state["output"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.result = LMRunResult(**state["result"])
        self.step_times = state["step_times"]
        self.start_epoch = len(self.result.epochs)
        # (checkpoints written before within-epoch saving existed kept the tracked records in the result)
        self.tracked = (list(state["tracked"]) if "tracked" in state else
                        (list(self.result.reassignments) if self.tracking else []))
        if state.get("step_in_epoch"):  # a checkpoint taken within an epoch
            self.resume_step, self.resume_total = state["step_in_epoch"], state["epoch_loss_total"]
            self.resume_order_state = state["order_generator"]
            log(f"{self.cfg.output}: resuming in epoch {self.start_epoch + 1} at step {self.resume_step}")
        else:
            log(f"{self.cfg.output}: resuming after epoch {self.start_epoch}")

    def start(self) -> None:
        """Start the clock (a resumed run counts its earlier seconds) and record where this part trains."""
        result = self.result
        # the learner's history restarts on resume: keep what the checkpoint recorded
        self.earlier_reassignments = list(result.reassignments) if not self.tracking else []
        self.t_start = time.perf_counter() - result.seconds
        # where this part trains (a resumed run may have started on another device): kept in the checkpoints
        # (a checkpoint written before devices were recorded: "unknown+cuda")
        if result.device is None:
            result.device = f"unknown+{self.device}" if (result.epochs or self.resume_step) else str(self.device)
        elif result.device.split("+")[-1] != str(self.device):
            result.device = f"{result.device}+{self.device}"

    def reassignment_history(self) -> list[dict[str, Any]]:
        if self.tracking:
            return list(self.tracked)
        if self.learner is None:
            return []
        return self.earlier_reassignments + [
            {"step": h.step, "epoch": h.step / self.steps_per_epoch, "moved_labels": h.moved_labels,
             "seconds": h.seconds, "objective_by_depth": {str(k): v for k, v in h.objective_by_depth.items()}}
            for h in self.learner.history
        ]

    def state_dict(self, step_in_epoch: int = 0, epoch_loss_total: float = 0.0, order_state=None) -> dict[str, Any]:
        """The checkpoint: after an epoch (``step_in_epoch`` 0), or within one (the order generator's
        state at the epoch's start, so that a resumed run redraws the same order)."""
        learner, output = self.learner, self.output
        return {
            "model": self.model.state_dict(), "output": output.state_dict(), "optimizer": self.optimizer.state_dict(),
            "tree": output.tree.to_dict() if isinstance(output, HierarchicalSoftmax) else None,
            "statistics": learner.statistics.state_dict() if learner is not None else None,
            "learner_steps": learner.steps if learner is not None else 0,
            "frozen": learner.frozen if learner is not None else False,
            "generator": self.generator.get_state(), "result": asdict(self.result), "step_times": self.step_times,
            "tracked": self.tracked, "step_in_epoch": step_in_epoch, "epoch_loss_total": epoch_loss_total,
            "order_generator": order_state,
        }

    def train_epoch(self, epoch: int, files: RunFiles | None, checkpoint_seconds: float,
                    log: Callable[[str], None]) -> float:
        """One epoch over the shuffled training windows (from the resumed step, if any); the sum of
        the step losses. Checkpoints every ``checkpoint_seconds`` of training within the epoch.

        The steps run without waiting for the device: the losses are summed where they are computed
        and read back (the divergence check, the step times) only every :data:`SYNC_STEPS` steps, at
        the end of the warm-up, before a checkpoint and at the epoch's end. On a GPU a per-step read
        would stall the queue of kernels every step; the step time recorded is each block's wall time
        spread evenly over its steps."""
        cfg, learner = self.cfg, self.learner
        if learner is not None and not self.tracking and epoch >= cfg.learn_epochs and not learner.frozen:
            learner.freeze()
        self.model.train()
        self.output.train()
        first_step, total = 0, 0.0
        if self.resume_order_state is not None:  # redraw the interrupted epoch's order, go on after its last step
            self.generator.set_state(self.resume_order_state)
            first_step, total, self.resume_order_state = self.resume_step, self.resume_total, None
        order_state = self.generator.get_state()
        order = torch.randperm(self.n_train, generator=self.generator).to(self.device)
        block = _LossBlock(self.device, first_step)
        last_save = time.perf_counter()
        for step in range(first_step, self.steps_per_epoch):
            block.add(self._step(epoch, step, order[step * cfg.batch_size:(step + 1) * cfg.batch_size]))
            save = (files is not None and step + 1 < self.steps_per_epoch
                    and time.perf_counter() - last_save >= checkpoint_seconds)
            if (save or step + 1 == self.steps_per_epoch or block.steps >= SYNC_STEPS
                    or len(self.step_times) + block.steps == self.warmup):
                total += self._read_block(block, epoch, step + 1)
            if save:
                self.result.reassignments = self.reassignment_history()
                self.result.seconds = time.perf_counter() - self.t_start
                files.save_checkpoint(self.state_dict(step + 1, total, order_state))
                last_save = time.perf_counter()
                block.restart()  # the checkpoint's time is not a step's
                done = step + 1 - first_step
                ms = 1000 * float(np.mean(self.step_times[-done:]))
                log(f"{cfg.output} lr={cfg.lr} epoch {epoch + 1}: step {step + 1:,}/{self.steps_per_epoch:,}, "
                    f"train nll {total / (step + 1):.4f}, {ms:.2f} ms/step, "
                    f"epoch ends in {(self.steps_per_epoch - step - 1) * ms / 60000:.0f} min (checkpoint saved)")
        return total

    def _read_block(self, block: _LossBlock, epoch: int, end: int) -> float:
        """Wait for the device, record the block's step times, and return its loss sum;
        FloatingPointError when a loss in it was not finite."""
        seconds, value = block.read()
        self.step_times.extend([seconds / block.steps] * block.steps)
        if not math.isfinite(value):
            raise FloatingPointError(f"{self.cfg.output}: loss {value} at epoch {epoch} within steps "
                                     f"{block.first}-{end - 1} (lr {self.cfg.lr} too large?)")
        block.restart(end)
        return value

    def _step(self, epoch: int, step: int, index: torch.Tensor) -> torch.Tensor:
        """One optimiser step on the examples ``index`` (the tree learner's statistics and
        re-assignments included); its loss, detached and left on the device (read in blocks by
        :meth:`train_epoch`). FloatingPointError when the representation diverged, or the loss
        before a re-assignment (which must not rebuild the tree from non-finite statistics)."""
        cfg, learner = self.cfg, self.learner
        try:
            loss = self._train_on(index)
        except NonFiniteInputError as exc:  # the representation diverged: the same report as a NaN loss
            raise FloatingPointError(f"{cfg.output}: non-finite representation at epoch {epoch} step {step} "
                                     f"(lr {cfg.lr} too large?): {exc}") from exc
        global_step = epoch * self.steps_per_epoch + step + 1
        if learner is not None and not self.tracking:
            if not learner.frozen and (learner.steps + 1) % learner.reassign_every == 0:
                value = float(loss.detach())  # a re-assignment waits for the device anyway
                if not math.isfinite(value):
                    raise FloatingPointError(f"{cfg.output}: loss {value} at epoch {epoch} step {step} (lr {cfg.lr} "
                                             "too large?)")
            learner.step()
            if not learner.frozen and global_step >= cfg.learn_epochs * self.steps_per_epoch:
                learner.freeze()  # a fractional learn_epochs ends the tree learning mid-epoch
        elif self.tracking and global_step % self.reassign_every == 0:
            self.tracked.append({"step": global_step, "epoch": global_step / self.steps_per_epoch, "moved_labels": 0.0,
                                 "seconds": 0.0, "objective_by_depth": {
                                     str(k): v for k, v in learner.objective_by_depth().items()}})
            learner.statistics.on_reassign(self.output.tree)  # the same decay as a learned tree's statistics
        return loss

    def _optimiser_step(self, index: torch.Tensor) -> torch.Tensor:
        """Forward, backward and the optimiser's update on the training windows ``index`` [B]; the
        detached loss."""
        x, y = self.x_train[index], self.y_train[index]
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.output(self.model(x), y).loss
        loss.backward()
        if self.cfg.l2 > 0:
            _add_l2(self.parameters, self.cfg.l2)
        self.optimizer.step()
        return loss.detach()

    def _train_on(self, index: torch.Tensor) -> torch.Tensor:
        """:meth:`_optimiser_step` on ``index``, replayed from a CUDA graph where :attr:`capture` holds
        and the batch is full (an epoch's short last batch runs eagerly). The graph is captured at the
        first full batch, whose one warm-up step is that batch's training step: no step runs twice."""
        if not self.capture or index.numel() != self.cfg.batch_size:
            return self._optimiser_step(index)
        if self._replay is None:
            eager_losses: list[torch.Tensor] = []

            def step(rows: torch.Tensor) -> torch.Tensor:
                loss = self._optimiser_step(rows)
                eager_losses.append(loss)
                return loss

            self._replay = capture_step(step, index, warmup=1)
            return eager_losses[0]  # the warm-up step: this batch's update (the capture itself runs nothing)
        return self._replay(index)

    def end_epoch(self, epoch: int, total: float, files: RunFiles | None, log: Callable[[str], None]) -> None:
        """Record the epoch (train NLL; valid and test perplexity, the test pass timed after the last
        epoch) and checkpoint it."""
        cfg, result = self.cfg, self.result
        record: dict[str, float] = {"epoch": epoch + 1, "train_nll": total / self.steps_per_epoch}
        last = epoch == cfg.epochs - 1
        if cfg.eval_per_epoch or last:
            try:
                record["valid_perplexity"], _ = _evaluate(self.model, self.output, self.x_valid, self.y_valid,
                                                          cfg.batch_size, self.device)
                record["test_perplexity"], test_ms = _evaluate(self.model, self.output, self.x_test, self.y_test,
                                                               cfg.batch_size, self.device, timed=last)
            except NonFiniteInputError as exc:  # the epoch's last steps diverged
                raise FloatingPointError(f"{cfg.output}: non-finite representation after epoch {epoch + 1} "
                                         f"(lr {cfg.lr} too large?): {exc}") from exc
            if last:
                result.test_ms_per_batch = test_ms
        result.epochs.append(record)
        if self.tracking or self.learner is not None:
            result.reassignments = self.reassignment_history()
        result.seconds = time.perf_counter() - self.t_start
        if files is not None and not last:
            files.save_checkpoint(self.state_dict())
        # logged after the checkpoint: an interrupted run resumes after the last epoch it printed
        log(f"{cfg.output} lr={cfg.lr} epoch {epoch + 1}: " + ", ".join(
            f"{k}={v:.4g}" for k, v in record.items() if k != "epoch"))

    def finish(self, warmup: int) -> LMRunResult:
        """The result: ms per step after ``warmup`` steps, the last epoch's perplexities, the final tree."""
        result = self.result
        result.train_ms_per_batch = 1000 * float(np.mean(self.step_times[min(warmup, len(self.step_times) - 1):]))
        final = result.epochs[-1]
        result.valid_perplexity = final["valid_perplexity"]
        result.test_perplexity = final["test_perplexity"]
        if isinstance(self.output, HierarchicalSoftmax):
            result.tree = self.output.tree.to_dict()
        return result


def train_lm(
    corpus: LMCorpus,
    cfg: LMRunConfig,
    tree: Tree | None = None,
    device: str | torch.device = "cpu",
    checkpoint_dir: Path | None = None,
    warmup: int = 20,
    log: Callable[[str], None] | None = None,
    checkpoint_seconds: float | None = None,
    keep_model: bool = False,
    capture: bool = True,
) -> LMRunResult:
    """Train the log-bilinear LM with Adagrad and the output layer ``cfg.output``.

    ``tree`` is the fixed tree (random, clustering) or the initial tree (learned). The learned
    tree re-assigns ``cfg.reassign_per_epoch`` times per epoch for ``cfg.learn_epochs`` epochs
    (:class:`hsm.TreeLearner`, Algorithm 3, eq. 12), then stays fixed. Valid and test
    perplexity are recorded after every epoch (the papers' Figs. 2 and 3 show test perplexity
    per epoch). With ``checkpoint_dir`` the run resumes from its last checkpoint and, once done,
    returns its stored result without training again. A checkpoint is written after every epoch
    and, within an epoch, every ``checkpoint_seconds`` of training (default: the environment
    variable ``HSM_CHECKPOINT_SECONDS``, else 300), so that a Gutenberg epoch (318k steps) can be
    trained across runs that are each cut off after a few minutes (a job scheduler's time limit,
    say): a resumed run redraws the same example order and continues at the next step.
    ``keep_model`` (needs ``checkpoint_dir``) keeps the trained model beside the finished run, for
    diagnostics that need more than the perplexities (:func:`load_trained_model`). ``capture``: on a
    GPU a tree output's step is replayed from a CUDA graph (:func:`captures_step` says when);
    False keeps every step eager (the same updates, one launch per op).
    """
    if keep_model and checkpoint_dir is None:
        raise ValueError("keep_model needs a checkpoint_dir: the model is kept in the run folder")
    _check_run(corpus, cfg, tree)
    device = torch.device(check_device(device))
    log = log or (lambda message: None)
    checkpoint_seconds = results.checkpoint_interval(checkpoint_seconds)
    files = None
    if checkpoint_dir is not None:
        files = RunFiles.in_folder(checkpoint_dir, cfg, corpus)
        finished = files.load_finished()
        if finished is not None and keep_model and not files.model.exists():
            raise FileNotFoundError(f"{files.finished} is a finished run without its model ({files.model.name}). "
                                    f"Fix: delete {files.finished.name} to train it again with keep_model")
        if finished is not None:
            log(f"{cfg.output}: already trained, reading {files.finished.name}")
            if finished.device is not None and finished.device != str(device):
                warnings.warn(f"finished run {files.finished} trained on {finished.device}, not {device}: its "
                              f"ms/batch are {finished.device}'s (recorded per run as trained_on)", stacklevel=2)
            return finished
    run = _Training(corpus, cfg, tree, device, warmup, capture)
    state = files.load_checkpoint() if files is not None else None
    if state is not None:
        try:
            run.restore(state, log)
        except results.RESTORE_ERRORS as exc:
            # as an unreadable checkpoint (results.load_checkpoint), warned about by name and
            # dropped, or every rerun would stop on it; the fresh run is seeded as the first was
            warnings.warn(f"ignoring damaged checkpoint {files.checkpoint} ({results.restore_error(exc)}); "
                          "the run starts over", stacklevel=2)
            run = _Training(corpus, cfg, tree, device, warmup, capture)
    run.start()
    for epoch in range(run.start_epoch, cfg.epochs):
        total = run.train_epoch(epoch, files, checkpoint_seconds, log)
        run.end_epoch(epoch, total, files, log)
    result = run.finish(warmup)
    if files is not None:
        if keep_model:
            files.save_model(run)  # before the finished file: a run is finished only with its model
        files.finish(result)
    return result


def load_trained_model(path: Path, device: str | torch.device = "cpu"
                       ) -> tuple[LogBilinearLM, torch.nn.Module, LMRunConfig]:
    """The (LM, output layer, configuration) a run kept with ``keep_model``, in evaluation mode."""
    state = results.load_checkpoint(Path(path))
    if state is None:
        raise FileNotFoundError(f"no trained model at {path}. Fix: train the run with keep_model=True")
    cfg = LMRunConfig(**state["config"])
    tree = Tree.from_dict(state["tree"]) if state["tree"] is not None else None
    model = LogBilinearLM(state["vocab_size"], cfg.dim, cfg.context, sparse=True)
    output = _make_output(cfg, state["vocab_size"], tree, None)
    model.load_state_dict(state["model"])
    output.load_state_dict(state["output"])
    model.use_kernels = isinstance(output, HierarchicalSoftmax)
    return model.to(device).eval(), output.to(device).eval(), cfg


def _select_lr(corpus: LMCorpus, base: LMRunConfig, tree: Tree | None, sc: LMScale, device, run_dir: Path,
               log) -> tuple[float, list[dict[str, Any]]]:
    """The learning rate of ``sc.lr_grid`` with the best validation perplexity after
    ``sc.select_steps`` steps (one grid per output family)."""
    if len(sc.lr_grid) == 1:
        return sc.lr_grid[0], []
    if sc.select_eval_tokens is not None:
        corpus = _slice(corpus, None, sc.select_eval_tokens)
        # their own folder: a trial scored on a slice must not be taken for one scored on all of it
        run_dir = run_dir / f"select-eval{sc.select_eval_tokens}"
    trials = []
    for lr in sc.lr_grid:
        cfg = replace(base, lr=lr, epochs=1, learn_epochs=0, max_steps_per_epoch=sc.select_steps,
                      output=base.output if base.output in ("flat", "adaptive") else "random")
        try:
            res = train_lm(corpus, cfg, tree=tree, device=device, checkpoint_dir=run_dir, log=log)
            ppl, seconds = res.valid_perplexity, res.seconds
        except FloatingPointError:
            ppl, seconds = math.inf, 0.0
        trials.append({"lr": lr, "valid_perplexity": ppl if math.isfinite(ppl) else None, "seconds": seconds})
    best = min(trials, key=lambda t: t["valid_perplexity"] if t["valid_perplexity"] is not None else math.inf)
    return best["lr"], trials
