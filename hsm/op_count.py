"""Counting what a step asks of the device: every aten op below autograd, the ones that launch
work, and the ones that make the host wait for the device.

A :class:`torch.utils._python_dispatch.TorchDispatchMode` sees each aten op a CPU tensor runs
through, and a CPU tensor takes the same ops a CUDA tensor takes, so the count made on the CPU
is the count of kernel launches and host-device synchronisations on a GPU:

* launching ops: every op but views, shape and metadata queries and empty allocations;
* synchronising ops: scalar reads (``_local_scalar_dense``: ``.item()``, ``float()``, ``int()``,
  ``bool()`` of a tensor), ``nonzero``, boolean-mask indexing and ``masked_select`` (their output
  size depends on values), ``unique``, sparse ``coalesce``, copies to the host, and tensors built
  from host data (``torch.tensor(...)``) or copied from the host onto another device.

``.cpu()`` / ``.numpy()`` of a tensor already on the CPU is not an op at all: a step under test
must not call them (the engine of :mod:`hsm.engine` never does).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "OpRecord"]

#: ops that launch nothing: shape and metadata queries, allocations without a fill
_NON_LAUNCHING = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type", "detach", "alias",
    "_indices", "_values", "indices", "values", "_nnz", "sparse_dim", "dense_dim", "is_coalesced", "dim",
    "_coalesced_", "set_", "record_stream", "resize_",
})

#: ops whose output size or value the host must read from the device
_SYNCHRONISING = frozenset({
    "_local_scalar_dense", "item", "nonzero", "nonzero_static_", "masked_select", "unique", "_unique", "_unique2",
    "unique_dim", "unique_consecutive", "coalesce", "_coalesce", "lift_fresh", "lift_fresh_copy", "tolist",
    "repeat_interleave", "bincount", "histc", "_assert_scalar",
})


class OpRecord(NamedTuple):
    """One aten op: its name (``aten.<name>.<overload>``), the shapes of its tensor arguments, and
    what it asks of the device."""

    name: str
    shapes: tuple
    launches: bool
    synchronises: bool


def _shapes(args: Any) -> tuple:
    out = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            out.append((tuple(arg.shape), str(arg.dtype).replace("torch.", "")))
        elif isinstance(arg, (list, tuple)):
            out.append(_shapes(arg))
        elif isinstance(arg, (int, float, bool, str)) or arg is None:
            out.append(arg)
    return tuple(out)


def _is_sync(func: Any, args: tuple, kwargs: dict) -> bool:
    name = func.__name__.split(".")[0]
    if name in _SYNCHRONISING:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
    if name in ("_to_copy", "copy_", "to"):  # a copy between host and device
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        target = kwargs.get("device")
        devices = {t.device.type for t in tensors} | ({torch.device(target).type} if target is not None else set())
        return len(devices) > 1
    return False


class OpCounter(TorchDispatchMode):
    """Record every aten op run inside the ``with`` block (:class:`OpRecord` in :attr:`ops`).

    ``launching`` and ``synchronising`` list the ops that launch device work and those that make
    the host wait; ``signature`` is the sequence of launching ops with their argument shapes, equal
    from batch to batch when a step's work does not depend on the values of its data."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        # the profiler's markers (torch.optim's step records one) run on the host only
        view = (bool(getattr(func, "is_view", False)) or name in _NON_LAUNCHING
                or getattr(func, "namespace", "aten") == "profiler")
        self.ops.append(OpRecord(str(func), _shapes(args), not view, _is_sync(func, args, kwargs)))
        return func(*args, **kwargs)

    @property
    def launching(self) -> list[OpRecord]:
        return [op for op in self.ops if op.launches]

    @property
    def synchronising(self) -> list[OpRecord]:
        return [op for op in self.ops if op.synchronises]

    @property
    def signature(self) -> list[tuple[str, tuple]]:
        return [(op.name, op.shapes) for op in self.launching]
