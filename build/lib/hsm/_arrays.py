"""Array conventions of :mod:`hsm.objective` and :mod:`hsm.theory`: NumPy arrays, (nested) lists or
torch tensors in; a torch tensor out (differentiable, the inputs' dtype and device) when any input
is one, else float64 NumPy arrays and Python floats. Distributions are checked (finite,
non-negative, summing to one within ``atol``, shapes that agree) with a ValueError naming the problem.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

__all__ = ["ArrayLike", "as_float64_numpy", "check_arity", "check_distribution_inputs", "check_finite", "check_real",
           "scalar", "to_float_arrays", "torch_if_tensor"]

# NumPy array, nested list, or torch.Tensor. torch is only touched when the caller passes a tensor, so
# NumPy-only users never pay for importing it.
ArrayLike = Any


def torch_if_tensor(*values: Any) -> Any:
    """The torch module if any value is a torch tensor, else None (torch cannot be needed otherwise)."""
    torch = sys.modules.get("torch")
    if torch is not None and any(isinstance(v, torch.Tensor) for v in values):
        return torch
    return None


def to_float_arrays(named: dict[str, Any]) -> tuple[list[Any], Any]:
    """Convert the named inputs to one common floating array type.

    Returns the converted arrays (in the order of ``named``) and the torch module (torch mode) or
    None (NumPy mode, float64). In torch mode the dtype is the promotion of the floating dtypes of the
    tensor inputs (the default dtype when none is floating) and the device is the tensors' device.
    """
    torch = torch_if_tensor(*named.values())
    if torch is None:
        out = []
        for name, value in named.items():
            try:
                array = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise TypeError(f"{name} must be a numeric array, list or tensor ({err})") from None
            out.append(array)
        return out, None

    tensors = {name: v for name, v in named.items() if isinstance(v, torch.Tensor)}
    devices = {v.device for v in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"tensor inputs are on different devices: {sorted(map(str, devices))}")
    device = devices.pop()
    dtype = None
    for name, tensor in tensors.items():
        if tensor.is_complex():
            raise TypeError(f"{name} must be real, got dtype {tensor.dtype}")
        if tensor.is_floating_point():
            dtype = tensor.dtype if dtype is None else torch.promote_types(dtype, tensor.dtype)
    if dtype is None:
        dtype = torch.get_default_dtype()
    out = []
    for name, value in named.items():
        if isinstance(value, torch.Tensor):
            out.append(value.to(dtype=dtype))
        else:
            try:
                array = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise TypeError(f"{name} must be a numeric array, list or tensor ({err})") from None
            out.append(torch.as_tensor(array, dtype=dtype, device=device))
    return out, torch


def as_float64_numpy(x: Any) -> np.ndarray:
    """A float64 NumPy view of an array or tensor, for validation only (never for results)."""
    torch = torch_if_tensor(x)
    if torch is not None:
        return x.detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def check_finite(name: str, x: Any) -> None:
    if not np.all(np.isfinite(as_float64_numpy(x))):
        raise ValueError(f"{name} contains NaN or infinite values")


def check_distribution_inputs(q: Any, p_cond: Any, atol: float) -> tuple[Any, Any, Any]:
    """Validate (q, p_cond) and return them as arrays of one type plus the torch module or None."""
    (q, p_cond), torch = to_float_arrays({"q": q, "p_cond": p_cond})
    if q.ndim != 1:
        raise ValueError(f"q must be 1-D with shape [K], got shape {tuple(q.shape)}")
    if p_cond.ndim != 2:
        raise ValueError(f"p_cond must be 2-D with shape [K, M], got shape {tuple(p_cond.shape)}")
    num_classes = q.shape[0]
    if num_classes < 1:
        raise ValueError("q is empty: a node needs at least one class (K >= 1)")
    if p_cond.shape[0] != num_classes:
        raise ValueError(
            f"p_cond has {p_cond.shape[0]} rows but q has {num_classes} entries; "
            "p_cond must have shape [K, M] with K = len(q)"
        )
    if p_cond.shape[1] < 2:
        raise ValueError(f"p_cond must have M >= 2 columns (children), got M = {p_cond.shape[1]}")
    q64 = as_float64_numpy(q)
    p64 = as_float64_numpy(p_cond)
    if not np.all(np.isfinite(q64)):
        raise ValueError("q contains NaN or infinite values")
    if not np.all(np.isfinite(p64)):
        raise ValueError("p_cond contains NaN or infinite values")
    if q64.min() < -atol:
        raise ValueError(f"q must be non-negative, got min {q64.min():.3g}")
    if abs(q64.sum() - 1.0) > atol:
        raise ValueError(f"q must sum to 1 (tolerance {atol:g}), got sum {q64.sum():.9g}")
    if p64.min() < -atol:
        raise ValueError(f"p_cond must be non-negative, got min {p64.min():.3g}")
    row_error = np.abs(p64.sum(axis=1) - 1.0)
    if row_error.max() > atol:
        bad = int(row_error.argmax())
        raise ValueError(
            f"each row of p_cond must sum to 1 (tolerance {atol:g}); "
            f"row {bad} sums to {p64[bad].sum():.9g}"
        )
    return q, p_cond, torch


def scalar(value: Any, torch: Any) -> Any:
    """Python float in NumPy mode, 0-d tensor in torch mode."""
    return value if torch is not None else float(value)


def check_arity(M: Any, name: str = "M") -> int:
    """An integer number of children >= 2 (integral floats such as 3.0 are accepted)."""
    if isinstance(M, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    if isinstance(M, numbers.Integral):
        value = int(M)
    elif isinstance(M, numbers.Real) and float(M).is_integer():
        value = int(M)
    else:
        raise ValueError(f"{name} must be an integer, got {M!r}")
    if value < 2:
        raise ValueError(f"{name} must be >= 2 (a node needs at least two children), got {value}")
    return value


def check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


# ----------------------------------------------------------------------------------------------------
# The objective
# ----------------------------------------------------------------------------------------------------
