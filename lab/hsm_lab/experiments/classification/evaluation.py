"""Testing a trained classifier: P@1 and R@1 of the exact top-1 search, its time and the nodes it
visits (ICML Table 1 and supplement Table 3's columns)."""
from __future__ import annotations

import time

import numpy as np
import torch

from hsm.text_models import make_bags

from hsm_lab.experiments.classification.data import EncodedSplit
from hsm_lab.experiments.classification.training import TrainedBow

__all__ = ["evaluate_bow"]


@torch.no_grad()
def evaluate_bow(trained: TrainedBow, test: EncodedSplit, batch_size: int = 512, device: str = "cpu",
                 timing_passes: int = 1) -> dict[str, float]:
    """P@1, R@1 (micro and per example), test seconds, nodes visited, expected depth.

    Timed: building the bags, the representation and the exact top-1 search. Not timed: a
    second, greedy (beam 1) pass that counts the nodes of the greedy descent, so that the
    branch-and-bound part of the search (what fastText's depth-first search does) can be told
    apart from the greedy descent that gives it its first bound. ``timing_passes``: the timed pass
    runs this many times and the test time is the fastest (a pass slowed by another process on the
    machine then does not count); the predictions are the same in every pass.
    """
    model, layer = trained.model, trained.layer
    model.eval()
    layer.eval()
    n = len(test)
    if n == 0:
        raise ValueError("no test examples")
    if timing_passes < 1:
        raise ValueError(f"timing_passes must be >= 1, got {timing_passes}")
    predictions = np.empty(n, dtype=np.int64)
    visited = np.empty(n, dtype=np.int64)
    seconds = float("inf")
    for _ in range(timing_passes):
        start = time.perf_counter()
        for first in range(0, n, batch_size):
            rows = np.arange(first, min(first + batch_size, n))
            ids, offsets = make_bags(test.values, test.offsets, rows)
            h = model(ids.to(device), offsets.to(device))
            top = layer.topk(h, 1)
            predictions[rows] = top.indices[:, 0].cpu().numpy()
            visited[rows] = top.nodes_visited.cpu().numpy()
        seconds = min(seconds, time.perf_counter() - start)
    out = _precision_recall(predictions, test)
    out.update(test_seconds=seconds, nodes_visited=float(visited.mean()))
    tree = getattr(layer, "tree", None)
    if tree is not None:
        greedy = np.empty(n, dtype=np.int64)
        for first in range(0, n, batch_size):
            rows = np.arange(first, min(first + batch_size, n))
            ids, offsets = make_bags(test.values, test.offsets, rows)
            greedy[rows] = layer.topk(model(ids.to(device), offsets.to(device)), 1, method="beam").nodes_visited.cpu().numpy()
        out["nodes_visited_greedy"] = float(greedy.mean())
        out["nodes_visited_search"] = float((visited - greedy).mean())
        # mean path length of the test examples' gold labels (every label of every example)
        out["expected_depth"] = float(tree.depths[test.label_values].mean())
    return out


def _precision_recall(predictions: np.ndarray, test: EncodedSplit) -> dict[str, float]:
    gold = test.gold_sets()
    hits = np.fromiter((p in g for p, g in zip(predictions, gold)), dtype=bool, count=len(gold))
    lengths = test.label_lengths()
    return {
        "p_at_1": 100.0 * float(hits.mean()),
        # fastText's `test` recall: correct top-1 labels / all gold labels (micro)
        "r_at_1": 100.0 * float(hits.sum() / lengths.sum()),
        # the per-example average of |top1 ∩ Y| / |Y| (macro over examples), for reference
        "r_at_1_per_example": 100.0 * float((hits / lengths).mean()),
    }
