"""``python -m hsm warmup``: compile the numba kernels once, ahead of the first training run.

The compiled paths (the tree layer's forward, backward and searches, the row-sparse
optimisers, Algorithm 1's statistics and label assignment, the fastText-style classifier) are
compiled by numba the first time they run, which makes a fresh installation's first training
step take seconds instead of milliseconds. numba keeps what it compiles on disk (beside the
installed package, or under ``NUMBA_CACHE_DIR`` when that is set), so this cost is paid once
per installation.

This command pays it up front, for example while a container image is built, by running each
path on a tiny problem. Run again, it only loads the cached kernels.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from hsm.cli_text import plain


def warm_up() -> None:
    """Run every compiled path once on a tiny problem, so that numba compiles and caches it."""
    import torch

    import hsm

    from hsm import kernels
    from hsm.models import LogBilinearLM

    generator = torch.Generator().manual_seed(0)
    labels, dim, batch = 60, 8, 16
    contexts = torch.randint(0, labels, (batch, 3), generator=generator)
    y = torch.randint(0, labels, (batch,), generator=generator)

    # the tree layer under the papers' log-bilinear model (so that the gradient flows back into
    # the hidden states, as in any model), with every optimiser that has a compiled step, and
    # Algorithm 1 re-assigning labels at every step
    for sparse, make_optimizer, fused in [(True, hsm.RowSparseAdagrad, True), (True, hsm.RowSparseAdagrad, False),
                                          (True, hsm.RowSparseSGD, False), (False, hsm.RowSparseAdagrad, False)]:
        torch.manual_seed(0)
        model = LogBilinearLM(labels, dim, context=3, sparse=sparse)
        layer = hsm.HierarchicalSoftmax(dim, hsm.Tree.random(labels, 4, 3, seed=0), sparse=sparse)
        optimizer = make_optimizer([*model.parameters(), *layer.parameters()], lr=0.05)
        if fused:
            optimizer.fuse(layer)
        learner = hsm.TreeLearner(layer, reassign_every=1)
        out = layer(model(contexts), y)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        learner.step()
    with torch.no_grad():
        h = model(contexts)
        layer.log_prob(h)
        layer.predict(h)
        layer.topk(h, 3)
    # the split of rows between threads, which only runs on work too large for a tiny problem
    kernels._share_bounds(np.arange(5, dtype=np.float64), 2)

    # the bag-of-words classifier (fastText's commands)
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, size=int(rng.integers(1, 6))) for _ in range(40)]
    targets = rng.integers(0, 6, size=len(docs))
    for output, schedule in [("flat", "first_half"), ("huffman", "first_half"), ("learned", "every_tokens")]:
        classifier = hsm.FastBowClassifier(dim=dim, output=output, arity=2, epochs=1, threads=1, rebuilds=1,
                                           schedule=schedule, rebuild_tokens=50)
        classifier.fit(docs, targets, num_words=50, num_labels=6)
        classifier.predict(docs, k=2)

    # the classifier on sparse features (a linear model per node)
    import scipy.sparse as sp

    from hsm.classifiers.sparse_tree import SparseTreeClassifier

    features = sp.random(40, 30, density=0.2, format="csr", random_state=0, dtype=np.float32)
    for output in ("flat", "learned"):
        sparse_classifier = SparseTreeClassifier(output=output, arity=2, epochs=1, threads=1)
        sparse_classifier.fit(features, targets, num_labels=6)
        sparse_classifier.predict(features, k=2)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hsm warmup", description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    start = time.perf_counter()
    warm_up()
    from hsm import _numba_cache

    where = _numba_cache.location
    if where == "none":
        print(f"numba kernels compiled, not cached: no folder can be written ({time.perf_counter() - start:.1f} s)")
    else:
        place = "" if where == "numba" else f" in {where} (the installation and HOME are read-only)"
        print(f"numba kernels compiled and cached{place} ({time.perf_counter() - start:.1f} s)")
    return 0
