"""Sparse TF-IDF document features: the input representation of today's label-tree classifiers
(Parabel, Bonsai, PLT) and of :class:`hsm.classifiers.sparse_tree.SparseTreeClassifier`.

A document is its model ids (words, and hashed bigrams from :func:`hsm.text_models.hashed_bigrams`);
its feature vector counts each id, weighs the count by ``1 + log tf`` and the inverse document
frequency ``1 + log((1 + n) / (1 + df))`` of the training split (scikit-learn's smoothed idf), and
is scaled to unit length. Columns seen in fewer than ``min_df`` training documents are dropped and
the rest renumbered, so the weight matrices of the models have one row per feature that can be
learned from.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["TfidfFeatures", "count_matrix", "tfidf_features"]


def count_matrix(values: np.ndarray, offsets: np.ndarray, num_columns: int) -> sp.csr_matrix:
    """[documents, num_columns] CSR matrix of id counts of the ragged documents ``values``/``offsets``."""
    values = np.asarray(values, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() >= num_columns):
        raise ValueError(f"document ids must lie in [0, {num_columns}); got ids from {values.min()} to {values.max()}")
    matrix = sp.csr_matrix((np.ones(values.size, dtype=np.float32), values, offsets),
                           shape=(offsets.size - 1, num_columns))
    matrix.sum_duplicates()  # repeated ids of a document: one entry holding the count
    return matrix


@dataclass
class TfidfFeatures:
    """The fitted weighting: ``columns`` (the kept ids, increasing) and their ``idf``."""

    columns: np.ndarray
    idf: np.ndarray
    num_ids: int

    @property
    def num_features(self) -> int:
        return int(self.columns.size)

    def transform(self, values: np.ndarray, offsets: np.ndarray) -> sp.csr_matrix:
        """[documents, num_features] float32 CSR: sublinear tf x idf, rows of unit length (an
        empty row stays zero); ids outside the kept columns are dropped."""
        counts = count_matrix(values, offsets, self.num_ids)[:, self.columns].tocsr()
        counts.sort_indices()
        data = (1.0 + np.log(counts.data)) * self.idf[counts.indices]
        rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))
        norms = np.sqrt(np.bincount(rows, weights=data.astype(np.float64) ** 2, minlength=counts.shape[0]))
        data = data / np.maximum(norms, 1e-12)[rows]
        return sp.csr_matrix((data.astype(np.float32), counts.indices.astype(np.int32), counts.indptr.astype(np.int64)),
                             shape=counts.shape)


def tfidf_features(values: np.ndarray, offsets: np.ndarray, num_ids: int, min_df: int = 2,
                   max_features: int | None = None) -> TfidfFeatures:
    """Fit the weighting on the training documents: keep ids seen in at least ``min_df`` documents
    (and, with ``max_features``, only that many, the most frequent by document frequency)."""
    if min_df < 1:
        raise ValueError(f"min_df must be >= 1, got {min_df}")
    if max_features is not None and max_features < 1:
        raise ValueError(f"max_features must be >= 1 or None, got {max_features}")
    counts = count_matrix(values, offsets, num_ids)
    df = np.bincount(counts.indices, minlength=num_ids)
    keep = np.flatnonzero(df >= min_df)
    if max_features is not None and keep.size > max_features:
        keep = np.sort(keep[np.argsort(-df[keep], kind="stable")[:max_features]])
    if keep.size == 0:
        raise ValueError(f"no id is seen in {min_df} training documents: lower min_df")
    n = counts.shape[0]
    idf = (1.0 + np.log((1.0 + n) / (1.0 + df[keep]))).astype(np.float64)
    return TfidfFeatures(keep.astype(np.int64), idf, int(num_ids))
