"""Reliability of the classifiers: gold label sets are sets, and sizes are checked before
anything is allocated (FastBowClassifier, the compiled trainer, and the trees)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hsm.classifiers.fast_classifier import FastBowClassifier, SettingError, unique_label_sets
from hsm.tree import Tree

RNG = np.random.default_rng(0)
DOCS = [RNG.integers(0, 60, size=RNG.integers(3, 9)) for _ in range(120)]
SETS = [[i % 7, (i * 3) % 7] if i % 2 else [i % 7] for i in range(120)]
REPEATED = [s + s[:1] for s in SETS]  # every set with its first label again


# ============================================================================ a gold set is a set
def test_unique_label_sets_keeps_the_first_of_each_label_in_order():
    values, offsets = unique_label_sets(np.array([3, 3, 5, 1, 2, 2, 2]), np.array([0, 3, 4, 7]))
    assert values.tolist() == [3, 5, 1, 2] and offsets.tolist() == [0, 2, 3, 4]
    same = np.array([4, 1, 0]), np.array([0, 2, 3])
    assert unique_label_sets(*same)[0] is same[0]  # nothing repeated: the arrays as given


@pytest.mark.parametrize("output", ["flat", "huffman", "learned"])
def test_repeated_gold_labels_count_once_in_fit_and_test(output):
    """Compiled path: training on repeated labels is training on the sets, and test() scores the
    same predictions the same."""
    fits = []
    for labels in (SETS, REPEATED):
        clf = FastBowClassifier(dim=8, output=output, arity=3, lr=0.3, epochs=2, threads=1, seed=0)
        fits.append(clf.fit(DOCS, labels))
    assert torch.equal(fits[0].model.embedding.weight, fits[1].model.embedding.weight)
    clf = fits[0]
    assert clf.test(DOCS, REPEATED, k=2) == clf.test(DOCS, SETS, k=2)
    assert clf.test(DOCS, [[s[0], s[0]] for s in SETS]) == clf.test(DOCS, [s[0] for s in SETS])


# ============================================================================ sizes checked before allocating
@pytest.mark.parametrize("docs, labels, message", [
    (DOCS, [s[0] for s in SETS[:-1]] + [10**6], r"largest label id 1000000 .* only 8 distinct label ids.*num_labels="),
    (DOCS, [s[0] for s in SETS[:-1]] + [10**9], r"largest label id 1000000000"),
    (DOCS[:-1] + [np.array([10**9])], [s[0] for s in SETS], r"largest word id 1000000000 .*num_words="),
])
def test_a_stray_id_is_refused_before_the_model_is_sized(docs, labels, message):
    with pytest.raises(ValueError, match=message):
        FastBowClassifier(dim=8, output="flat", epochs=1, threads=1).fit(docs, labels)


def test_sizes_given_explicitly_are_taken_unless_they_cannot_fit_in_memory():
    labels = [s[0] for s in SETS]
    clf = FastBowClassifier(dim=4, output="flat", epochs=1, threads=1).fit(DOCS, labels, num_words=5000,
                                                                             num_labels=3000)
    assert clf.num_words == 5000 and clf.num_labels == 3000
    with pytest.raises(SettingError, match=r"needs about .* GiB to train, more than the .* GiB of memory available: "
                                           r"lower dim, or check the number of words and labels"):
        FastBowClassifier(dim=64, output="flat", epochs=1).fit(DOCS, labels, num_words=10**12)


@pytest.mark.parametrize("output", ["huffman", "learned"])
def test_arity_above_the_number_of_labels_is_an_error(output):
    with pytest.raises(ValueError, match=r"arity M = 1000000 exceeds the K = 7 labels"):
        FastBowClassifier(dim=8, output=output, arity=10**6, epochs=1).fit(DOCS, [s[0] for s in SETS])


@pytest.mark.parametrize("args", [(10, 10**6, 3), (10_000, 10**6, 3), (10_000, 1000, 3)])
def test_fixed_depth_trees_refuse_an_arity_that_would_not_fit_in_memory(args):
    """A complete M-ary tree of depth D has about M**D slots whatever K is: refused by name before
    any allocation (an LM run with -o arity=1000000 once died in a 7 TiB numpy allocation)."""
    with pytest.raises(ValueError, match=rf"a complete {args[1]}-ary tree of depth 3 has .* GiB\) for K = {args[0]} "):
        Tree.random(*args)
    assert Tree.random(args[0], 100, 3).num_labels == args[0]  # a sensible arity is unaffected


_PEAK_SCRIPT = """
import json, sys
import numpy as np
from hsm import FastBowClassifier
from hsm.classifiers.fast_classifier import model_bytes

def status(field):
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith(field + ":"))

rng = np.random.default_rng(0)
docs = [rng.integers(0, 3000, size=rng.integers(3, 20)) for _ in range(2000)]
labels = [[int(d[0]) % 40] for d in docs]
dim, output, arity, threads = json.loads(sys.argv[1])
FastBowClassifier(dim=4, output=output, arity=arity, epochs=1, threads=threads).fit(docs, labels)  # compiled
try:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # the peak (VmHWM) restarts from the resident memory now: the warm-up's is forgotten
except OSError:
    print("null")
    sys.exit(0)
base = status("VmRSS")
FastBowClassifier(dim=dim, output=output, arity=arity, epochs=2, rebuilds=5, threads=threads).fit(docs, labels)
peak = status("VmHWM")
print(json.dumps([peak - base, model_bytes(3000, 40, dim, arity, output, threads)]))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads the peak memory from /proc (Linux)")
@pytest.mark.parametrize("dim, output, arity, threads", [(3000, "flat", 5, 1), (6000, "learned", 3, 2),
                                                         (6000, "huffman", 2, 1)])
def test_the_memory_estimate_covers_the_peak_of_a_real_fit(dim, output, arity, threads):
    """model_bytes, the estimate fit refuses a too large model with, is above the peak memory a
    fit takes (measured in a fresh process: its peak resident memory, reset after a warm-up fit
    that compiles the kernels, over what it held before the fit)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, json.dumps([dim, output, arity, threads])],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HSM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    if measured is None:
        pytest.skip("this kernel does not let a process reset its peak memory (/proc/self/clear_refs)")
    peak, estimate = measured
    assert peak > 4 * 3000 * dim  # the embeddings alone: the measurement sees the model
    assert estimate >= peak, (estimate, peak)
