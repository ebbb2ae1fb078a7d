"""The classifiers built on the library, loaded on first use (``import hsm`` does not load them):

* :class:`FastBowClassifier` (:mod:`hsm.classifiers.fast_classifier`, trained by
  :mod:`hsm.classifiers.fast_trainer`): the bag-of-words classifier of ICML §7.1, trained like
  fastText (compiled per-example Hogwild SGD; flat, Huffman or learned trees);
* :class:`SparseTreeClassifier` (:mod:`hsm.classifiers.sparse_tree`, features from
  :mod:`hsm.classifiers.sparse_features`): the same tree learning with a linear model per node on
  sparse TF-IDF features;
* fastText's ``__label__`` file format (:mod:`hsm.classifiers.fasttext_format`) and its command
  line, ``python -m hsm supervised / test / predict / predict-prob / add-labels``
  (:mod:`hsm.classifiers.fasttext_cli`).
"""
from __future__ import annotations

import importlib

#: public name -> the module that defines it, imported when the name is first asked for
_ON_FIRST_USE = {"FastBowClassifier": "hsm.classifiers.fast_classifier",
                 "SparseTreeClassifier": "hsm.classifiers.sparse_tree"}

__all__ = ["FastBowClassifier", "SparseTreeClassifier"]


def __getattr__(name: str) -> object:
    if name in _ON_FIRST_USE:
        value = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'hsm.classifiers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))
