"""SparseTreeClassifier refuses bad input before any kernel runs, in one line naming the problem:
non-finite or huge feature values, a stray label id, and a batch size below 1."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm import NonFiniteInputError
from hsm.classifiers.sparse_tree import LARGEST_FEATURE, SparseTreeClassifier


def _toy(n: int = 60, k: int = 6, f: int = 30, seed: int = 0) -> tuple[sp.csr_matrix, np.ndarray]:
    """Rows of unit length whose first features name their label, plus one noise feature."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    labels[:k] = np.arange(k)  # every label appears
    rows = np.repeat(np.arange(n), 2)
    cols = np.stack([labels, rng.integers(k, f, n)], axis=1).ravel()
    x = sp.csr_matrix((np.full(2 * n, np.sqrt(0.5), np.float32), (rows, cols)), shape=(n, f))
    return x, labels


X, Y = _toy()


@pytest.fixture(scope="module")
def fitted() -> SparseTreeClassifier:
    return SparseTreeClassifier(output="tree", arity=3, lr=0.5, epochs=1, threads=1).fit(X, Y)


def _with_value(x: sp.csr_matrix, row: int, value: float) -> sp.csr_matrix:
    x = x.astype(np.float64) if abs(value) > float(np.finfo(np.float32).max) else x.copy()
    x.data[x.indptr[row]] = value
    return x


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# ============================================================================ NaN / inf in prediction
@settings(max_examples=15, deadline=None)
@given(row=st.integers(0, 19), value=st.sampled_from([np.nan, np.inf, -np.inf]),
       method=st.sampled_from(["predict", "log_prob"]))
def test_prediction_refuses_nan_or_inf_naming_the_first_row(fitted, row, value, method):
    x = _with_value(X[:20], row, value)
    x.data[x.indptr[19]] = np.nan  # a later bad row: the first one is named
    with pytest.raises(NonFiniteInputError, match=rf"first: row {row}\)") as error:
        getattr(fitted, method)(x)
    assert "NaN or infinite" in _one_line(error)


def test_prediction_refuses_logits_that_overflow_float32(fitted):
    with pytest.raises(NonFiniteInputError, match="row 2 overflow float32.*scale") as error:
        fitted.predict(_with_value(X[:5], 2, 3e38), batch=2)  # the bad row lies in the second block
    _one_line(error)
    with pytest.raises(ValueError, match="in row 1, beyond 3.4e\\+38.*scale the features"):
        fitted.log_prob(_with_value(X[:5], 1, 1e300))  # float64 beyond float32: not silently inf


def test_prediction_of_finite_rows_is_unchanged(fitted):
    """The checks do not alter a normal prediction: log_prob's top label is predict's."""
    labels, log_probs = fitted.predict(X, k=1, batch=7)
    full = fitted.log_prob(X)
    assert np.isfinite(full).all()
    np.testing.assert_allclose(log_probs[:, 0], full.max(axis=1), rtol=1e-5, atol=1e-6)


# ============================================================================ a stray label id
def test_a_stray_label_id_is_refused_before_anything_is_allocated():
    labels = Y.copy()
    labels[7] = 10**6
    clf = SparseTreeClassifier(epochs=1, threads=1)
    with pytest.raises(ValueError, match=r"label id 1000000 .* 1,000,001 labels.*renumber them 0\.\.6.*"
                                         r"num_labels=1000001") as error:
        clf.fit(X, labels)
    _one_line(error)
    assert clf.weight is None  # refused before the weights were allocated


@pytest.mark.parametrize("sets", [False, True])
def test_a_label_beyond_num_labels_is_refused_naming_it_and_its_row(sets):
    labels = [[int(y)] for y in Y] if sets else Y.copy()
    if sets:
        labels[9] = [1, 40]
    else:
        labels[9] = 40
    clf = SparseTreeClassifier(epochs=1, threads=1)
    refused = r"unknown label 40 in labels\[9\]: num_labels=10 gives labels 0\.\.9"
    with pytest.raises(ValueError, match=refused) as error:
        clf.fit(X, labels, num_labels=10)
    _one_line(error)
    assert clf.weight is None


def test_a_sparse_but_intended_label_range_trains_when_num_labels_is_given():
    labels = Y.copy()
    labels[7] = 2000  # beyond 10 x distinct + 1000: refused when inferred, trained when declared
    with pytest.raises(ValueError, match="renumber"):
        SparseTreeClassifier(output="flat", epochs=1, threads=1).fit(X, labels)
    clf = SparseTreeClassifier(output="flat", epochs=1, threads=1).fit(X, labels, num_labels=2001)
    assert clf.num_labels == 2001


# ============================================================================ feature values in fit
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_fit_refuses_non_finite_features_naming_the_row(value):
    clf = SparseTreeClassifier(epochs=1, threads=1)
    with pytest.raises(NonFiniteInputError, match=r"1 of 60 rows \(first: row 13\)") as error:
        clf.fit(_with_value(X, 13, value), Y)
    assert "lr" not in _one_line(error)  # not blamed on the learning rate
    assert clf.weight is None


@pytest.mark.parametrize("value", [1e30, -1e19, 1e300])
def test_fit_refuses_huge_features_asking_to_scale_them(value):
    clf = SparseTreeClassifier(epochs=1, threads=1, optimizer="adagrad")
    with pytest.raises(ValueError, match=r"in row 21, beyond 1e\+18 in magnitude.*scale the features") as error:
        clf.fit(_with_value(X, 21, value), Y)
    assert "lr" not in _one_line(error)
    assert clf.weight is None


def test_fit_accepts_large_features_within_the_bound():
    x = _with_value(X, 21, LARGEST_FEATURE / 10)
    clf = SparseTreeClassifier(output="flat", lr=1e-3, epochs=1, threads=1).fit(x, Y)
    assert clf.weight is not None


# ============================================================================ predict's batch
@pytest.mark.parametrize("batch", [0, -1])
def test_predict_refuses_a_batch_below_one(fitted, batch):
    with pytest.raises(ValueError, match=rf"batch must be >= 1, got {batch}") as error:
        fitted.predict(X, batch=batch)
    _one_line(error)


def test_predict_refuses_a_non_integer_batch(fitted):
    with pytest.raises(TypeError, match="batch must be an integer"):
        fitted.predict(X, batch=2.5)


def test_add_labels_refuses_grown_weights_larger_than_memory_before_allocating(monkeypatch) -> None:
    """As fit does: the grown weights are sized before numpy is asked for them."""
    import hsm.classifiers.fast_classifier

    clf = SparseTreeClassifier(output="tree", arity=3, lr=0.5, epochs=1, threads=1).fit(X, Y)
    weight, tree = clf.weight.copy(), clf.tree
    monkeypatch.setattr(hsm.classifiers.fast_classifier, "physical_memory", lambda: int(clf.weight.nbytes / 0.79))
    with pytest.raises(ValueError) as error:
        clf.add_labels([X[:3], X[3:6]])
    message = _one_line(error)
    assert "the grown weights of 30 features" in message and "add fewer than 2 labels at once" in message
    assert np.array_equal(clf.weight, weight) and clf.tree is tree and clf.num_labels == 6
