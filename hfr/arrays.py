"""The arrays hfr accepts, checked up front: NumPy on the host, CuPy on a GPU.

`inspect` turns a user's array into an Array: its kind, device, dtype, element count and a flat
view, or raises TypeError/ValueError naming what is wrong, before anything is modified.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .ops import as_dtype

__all__ = ["Array", "inspect", "check_out"]


@dataclass(frozen=True)
class Array:
    """A checked array: `flat` is a 1-D view of the same memory (numpy.ndarray or cupy.ndarray)."""

    obj: Any  # what the user passed, returned to them as the result
    flat: Any
    kind: str  # "numpy" or "cupy"
    device: Optional[int]  # CUDA device of a cupy array, None on the host
    dtype: np.dtype
    shape: tuple

    @property
    def size(self) -> int:
        return self.flat.size

    @property
    def nbytes(self) -> int:
        return self.flat.size * self.dtype.itemsize

    @property
    def address(self) -> int:
        return self.flat.ctypes.data if self.kind == "numpy" else self.flat.data.ptr


def _is_cupy(x: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def inspect(x: Any, name: str = "x", *, writable: bool = True) -> Array:
    """x as an Array, or TypeError/ValueError naming the problem."""
    if isinstance(x, np.ndarray):
        kind, device = "numpy", None
        if writable and not x.flags.writeable:
            raise ValueError(f"{name} is read-only: it cannot receive the result (pass out=)")
    elif _is_cupy(x):
        kind, device = "cupy", x.device.id
    else:
        raise TypeError(f"{name} must be a numpy.ndarray or cupy.ndarray, got {type(x).__name__}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous (shape {x.shape}, strides {x.strides})")
    dtype = as_dtype(x.dtype)
    return Array(x, x.reshape(-1), kind, device, dtype, tuple(x.shape))


def check_out(x: Array, out: Any) -> Array:
    """out as an Array matching x in shape, dtype and device, not partly overlapping x."""
    o = inspect(out, "out")
    if (o.kind, o.device) != (x.kind, x.device):
        where = lambda a: a.kind if a.device is None else f"{a.kind} on device {a.device}"  # noqa: E731
        raise ValueError(f"out is a {where(o)} array, x is a {where(x)} array")
    if o.dtype != x.dtype:
        raise TypeError(f"out has dtype {o.dtype}, x has {x.dtype}")
    if o.shape != x.shape:
        raise ValueError(f"out has shape {o.shape}, x has {x.shape}")
    if o.address != x.address and x.nbytes and _overlaps(o, x):
        raise ValueError("out partly overlaps x: pass the same array for in place, or a separate one")
    return o


def _overlaps(a: Array, b: Array) -> bool:
    return a.address < b.address + b.nbytes and b.address < a.address + a.nbytes
