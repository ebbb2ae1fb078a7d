"""hsm.classifiers.fast_trainer: the rebuild plans of the compiled bag-of-words trainer, and its kernel steps
(the same numbers in steps as in one call; an interrupt between two steps stops training). The
training itself is checked against PyTorch in tests/test_fast_classifier.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.classifiers.fast_classifier import FastBowClassifier
from hsm.classifiers.fast_trainer import FitHistory, first_half_plan, output_arrays, statistics_arrays, token_plan
from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.tree import Tree


@settings(max_examples=60, deadline=None)
@given(total=st.integers(2, 5000), rebuilds=st.integers(1, 80))
def test_first_half_plan_rebuilds_evenly_in_the_first_half(total: int, rebuilds: int) -> None:
    points, frozen = first_half_plan(total, rebuilds)
    half = total // 2
    assert len(points) <= rebuilds
    if points:
        assert 0 < points[0] and points[-1] <= half
        assert len(set(np.diff([0, *points]).tolist())) == 1  # evenly spaced, increasing
    assert frozen == (points[-1] if len(points) == rebuilds else half)
    assert frozen <= half


def test_first_half_plan_example() -> None:
    assert first_half_plan(100, 5) == ([10, 20, 30, 40, 50], 50)
    assert first_half_plan(10, 8) == ([1, 2, 3, 4, 5], 5)  # more rebuilds than examples in the half


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=200), rate=st.integers(1, 60),
       epochs=st.integers(1, 4), rebuilds=st.integers(1, 10))
def test_token_plan_checks_at_most_once_per_check(lengths: list[int], rate: int, epochs: int, rebuilds: int) -> None:
    lengths_array = np.asarray(lengths, dtype=np.int64)
    samples = int(epochs * lengths_array.sum())
    state = {"samples": samples, "period": samples // 2 // rebuilds, "local": 0, "tokens": 0}
    state["next"] = state["period"]
    points: list[int] = []
    for epoch in range(epochs):
        points += token_plan(lengths_array, state, epoch * len(lengths), rate)
    assert points == sorted(set(points))  # increasing: at most one rebuild per check
    assert all(0 < p <= epochs * len(lengths) for p in points)
    assert state["tokens"] <= samples


def test_operands_views_of_the_layer() -> None:
    tree = Tree.huffman([5, 1, 1, 3, 2], 3)
    layer = HierarchicalSoftmax(4, tree)
    weight, bias, penalty, nodes, children, mask = output_arrays(layer, 4)
    weight[0, 0] = 7.0  # a view: the kernel trains the layer's tensor in place
    assert float(layer.weight.detach()[0, 0]) == 7.0
    np.testing.assert_array_equal(nodes, tree.path_nodes)
    flat = output_arrays(FlatSoftmax(4, 5), 4)
    assert flat[0].shape == (1, 20) and flat[3].shape == (5, 1)
    assert [a.size for a in statistics_arrays(None)] == [0, 0, 0]
    assert FitHistory().rebuilds == []


# ---------------------------------------------------------------------------------------------- kernel steps
RNG = np.random.default_rng(4)
DOCS = [RNG.integers(0, 80, size=RNG.integers(1, 12)) for _ in range(300)]
LABELS = [[int(d[0]) % 9] if i % 4 else [int(d[0]) % 9, int(d[-1]) % 9] for i, d in enumerate(DOCS)]


@pytest.mark.parametrize("settings", [
    {"output": "flat"},
    {"output": "huffman", "arity": 2},
    {"output": "learned", "arity": 3, "rebuilds": 7},
    {"output": "learned", "arity": 3, "rebuilds": 4, "schedule": "every_tokens", "rebuild_tokens": 90,
     "statistics": "released"},
])
def test_kernel_steps_change_nothing(settings, monkeypatch) -> None:
    """Cutting every thread's share into steps (so that Ctrl-C is seen) gives, on one thread, the
    very numbers of one call per share: same updates, same order, same rates, same rebuilds."""
    from hsm.classifiers import fast_trainer

    fits = []
    for step_work in (10**18, 1, 2_000):  # one call per chunk; one example per step; a few per step
        monkeypatch.setattr(fast_trainer, "STEP_WORK", step_work)
        clf = FastBowClassifier(dim=6, lr=0.4, epochs=3, threads=1, seed=2, **settings)
        fits.append(clf.fit(DOCS, LABELS, record_losses=True))
    reference = fits[0]
    for clf in fits[1:]:
        assert torch.equal(clf.model.embedding.weight, reference.model.embedding.weight)
        for mine, theirs in zip(clf.layer.state_dict().values(), reference.layer.state_dict().values()):
            assert torch.equal(mine, theirs) if isinstance(mine, torch.Tensor) else mine == theirs
        for mine, theirs in zip(clf.history.example_losses, reference.history.example_losses):
            np.testing.assert_array_equal(mine, theirs)
        assert [r.step for r in clf.history.rebuilds] == [r.step for r in reference.history.rebuilds]


def test_kernel_steps_on_two_threads_train_as_well(monkeypatch) -> None:
    """Hogwild on two threads is not deterministic; in steps it still learns the same task."""
    from hsm.classifiers import fast_trainer

    labels = [int(d[0]) % 9 for d in DOCS]
    scores = []
    for step_work in (10**18, 1):
        monkeypatch.setattr(fast_trainer, "STEP_WORK", step_work)
        clf = FastBowClassifier(dim=16, output="flat", lr=0.5, epochs=10, threads=2, seed=1).fit(DOCS, labels)
        scores.append(clf.test(DOCS, labels)["precision_at_1"])
    assert min(scores) > 0.9 and abs(scores[0] - scores[1]) < 0.05


def test_an_interrupt_between_steps_stops_fit_and_keeps_the_saved_model(tmp_path, monkeypatch) -> None:
    """A KeyboardInterrupt raised between two kernel steps ends fit there (not at the end of the
    epoch); a model saved earlier is untouched."""
    from hsm.classifiers import fast_trainer

    saved = FastBowClassifier(dim=6, output="huffman", arity=3, epochs=1, threads=1).fit(DOCS, LABELS)
    saved.save(tmp_path / "m.bin")
    before = (tmp_path / "m.bin").read_bytes()
    kernel, calls = fast_trainer._sgd_examples, []

    def interrupt_at_the_fourth_step(*args):
        calls.append(args[2].size)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return kernel(*args)

    monkeypatch.setattr(fast_trainer, "_sgd_examples", interrupt_at_the_fourth_step)
    monkeypatch.setattr(fast_trainer, "STEP_WORK", 1)
    with pytest.raises(KeyboardInterrupt):
        FastBowClassifier(dim=6, output="huffman", arity=3, epochs=5, threads=1).fit(DOCS, LABELS)
    assert calls == [1, 1, 1, 1]  # 1,500 examples to go: it stopped at the fourth
    assert (tmp_path / "m.bin").read_bytes() == before
    assert torch.equal(FastBowClassifier.load(tmp_path / "m.bin").model.embedding.weight, saved.model.embedding.weight)


def test_an_interrupt_while_waiting_for_a_thread_leaves_the_pool_idle(monkeypatch) -> None:
    """Ctrl-C while the calling thread waits for the other Hogwild thread: the wait goes on until
    that thread's step is done, then the interrupt is raised, so no worker is left running (a
    worker still running would hand its end to the next fit's wait, which would then return early)."""
    import signal
    import sys
    import threading
    import time

    from hsm import kernels
    from hsm.classifiers import fast_trainer

    kernel, fired, seen_waiting = fast_trainer._sgd_examples, [], []
    main = threading.main_thread().ident

    def main_thread_function() -> str:
        frame = sys._current_frames().get(main)
        return frame.f_code.co_name if frame is not None else ""

    def slow_step_on_the_worker(*args):
        result = kernel(*args)
        if threading.current_thread() is not threading.main_thread() and not fired:
            fired.append(True)
            # the interrupt must reach the calling thread inside its wait for this step: wait for
            # it to get there (it may still be running its own share, or be slowed by a busy machine)
            deadline = time.monotonic() + 60
            while main_thread_function() != "wait" and time.monotonic() < deadline:
                time.sleep(0.005)
            seen_waiting.append(main_thread_function())
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.3)  # and is interrupted while this step still runs
        return result

    # Python's own Ctrl-C handler, which a job started in the background (SIGINT ignored) lacks
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(fast_trainer, "_sgd_examples", slow_step_on_the_worker)
    labels = [int(d[0]) % 9 for d in DOCS]
    interrupted = False
    try:
        FastBowClassifier(dim=16, output="flat", lr=0.5, epochs=10, threads=2, seed=1).fit(DOCS, labels)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, previous)
    busy = kernels._WORKERS_BUSY.locked()
    assert fired, f"no step ran on the pool's worker thread (pool busy now: {busy})"
    assert seen_waiting == ["wait"], f"the calling thread was in {seen_waiting} when interrupted"
    assert interrupted, "the fit ended without raising KeyboardInterrupt"
    assert all(worker.job is None for worker in kernels._WORKERS)
    monkeypatch.undo()
    clf = FastBowClassifier(dim=16, output="flat", lr=0.5, epochs=10, threads=2, seed=1).fit(DOCS, labels)
    assert clf.test(DOCS, labels)["precision_at_1"] > 0.9
