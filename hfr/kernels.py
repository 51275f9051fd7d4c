"""Reduce k buffers into one: the CPU kernels of the intra-node step, one signature, three backends.

Per element the inputs are combined left to right, ((x0 op x1) op x2) ..., in the accumulation type
(float32 for float16 and bfloat16, rounded once at the end; the dtype itself otherwise), so every
backend gives the bits of the NumPy reference, except a NaN's sign and payload (a NaN result is a NaN in
every backend; which one depends on the SIMD instructions that run: the Cython kernels' level, simd()). avg is the sum divided by a
divisor in the accumulation type, before that one rounding (float dtypes only).
Integers wrap as NumPy's do; max and min propagate NaN as np.maximum and np.minimum do.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import numpy as np

from .ops import Op, OpLike, accumulation_dtype, as_dtype, as_op, is_float

__all__ = ["reduce_into", "backend_name", "available_backends", "simd", "BACKENDS"]

BACKENDS = ("cython", "numba", "numpy")
KERNEL_OPS = (Op.SUM, Op.MAX, Op.MIN, Op.PROD)  # the ops that combine; AVG is SUM then one division
_UFUNCS = {Op.SUM: np.add, Op.AVG: np.add, Op.MAX: np.maximum, Op.MIN: np.minimum, Op.PROD: np.multiply}


def _reduce_numpy(out: np.ndarray, inputs: Sequence[np.ndarray], op: Op, threads: int, divisor: int = 1) -> None:
    """The reference: the chain of ufunc calls, in the accumulation type (avg: then the division)."""
    ufunc = _UFUNCS[op]
    acc_dtype = accumulation_dtype(out.dtype)
    acc = out if acc_dtype == out.dtype else np.empty(out.shape, acc_dtype)
    np.copyto(acc, inputs[0])
    for x in inputs[1:]:
        ufunc(acc, x if acc is out else x.astype(acc_dtype), out=acc)
    if op is Op.AVG:
        np.divide(acc, acc_dtype.type(divisor), out=acc)
    if acc is not out:
        np.copyto(out, acc.astype(out.dtype))


ReduceFn = Callable[..., None]  # fn(out, inputs, op, threads, divisor=1)
_LOADED: dict[str, Optional[ReduceFn]] = {"numpy": _reduce_numpy}


def _load(backend: str) -> Optional[ReduceFn]:
    """The backend's reduce function, or None when it cannot be imported here (imported once, lazily)."""
    if backend not in _LOADED:
        try:
            if backend == "cython":
                from . import _kernels as module
            else:
                from . import _numba_kernels as module
        except ImportError:
            module = None
        _LOADED[backend] = module.reduce if module is not None else None
    return _LOADED[backend]


def available_backends() -> list[str]:
    """The backends that work in this process, fastest first."""
    return [b for b in BACKENDS if _load(b) is not None]


def simd() -> Optional[str]:
    """The SIMD instructions the Cython kernels run in this process: "avx512", "avx2" or "baseline" (the
    best this CPU runs, picked at import), "native" in a build made with HFR_NATIVE=1; None when the
    Cython kernels are not built. Every level gives the same bits."""
    if _load("cython") is None:
        return None
    from . import _kernels

    return _kernels.simd()


@functools.cache
def _fastest_backend() -> str:
    return available_backends()[0]


def _flat(a: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, got {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous (strides {a.strides})")
    return a.reshape(-1)


def check_arguments(out: np.ndarray, inputs: Sequence[np.ndarray], op: OpLike,
                    divisor: Optional[int] = None) -> tuple[np.ndarray, list[np.ndarray], Op, int]:
    """Flat views of out and inputs, the Op and avg's divisor (default: the number of inputs), or
    TypeError/ValueError naming what is wrong."""
    out_flat = _flat(out, "out")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    as_dtype(out.dtype)
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
        raise TypeError(f"inputs must be a sequence of arrays, got {type(inputs).__name__}")
    if len(inputs) == 0:
        raise ValueError("inputs is empty: need at least one array")
    flats = []
    for i, x in enumerate(inputs):
        xf = _flat(x, f"inputs[{i}]")
        if x.dtype != out.dtype:
            raise TypeError(f"inputs[{i}] has dtype {x.dtype}, out has {out.dtype}")
        if x.size != out.size:
            raise ValueError(f"inputs[{i}] has {x.size} elements, out has {out.size}")
        if i > 0 and np.shares_memory(xf, out_flat):
            raise ValueError(f"out overlaps inputs[{i}]: out may alias inputs[0] only")
        flats.append(xf)
    if flats[0] is not out_flat and np.shares_memory(flats[0], out_flat) and flats[0].ctypes.data != out_flat.ctypes.data:
        raise ValueError("out partly overlaps inputs[0]: it may alias it exactly or not at all")
    op = as_op(op)
    if op not in KERNEL_OPS and op is not Op.AVG:
        raise ValueError(f"op {op.value!r} is not a kernel op: expected one of {[o.value for o in (*KERNEL_OPS, Op.AVG)]}")
    if op is Op.AVG and not is_float(out.dtype):
        raise TypeError(f"op 'avg' needs a float dtype, out has {out.dtype}")
    if divisor is None:
        divisor = len(flats)
    if isinstance(divisor, bool) or not isinstance(divisor, (int, np.integer)) or divisor < 1:
        raise ValueError(f"divisor must be an integer >= 1, got {divisor!r}")
    return out_flat, flats, op, int(divisor)


def reduce_into(
    out: np.ndarray,
    inputs: Sequence[np.ndarray],
    op: OpLike = "sum",
    *,
    backend: Optional[str] = None,
    threads: Optional[int] = None,
    divisor: Optional[int] = None,
) -> np.ndarray:
    """out = inputs[0] op inputs[1] op ... elementwise; out may be inputs[0]. Returns out.

    op "avg" (float dtypes): the sum divided by divisor (default: the number of inputs).
    backend: "cython", "numba" or "numpy" (default: HFR_KERNEL, else the fastest available).
    threads: threads to use (default: HFR_NUM_THREADS, else all cores).
    """
    out_flat, flats, op, divisor = check_arguments(out, inputs, op, divisor)
    fn = _choose(backend)
    fn(out_flat, flats, op, _threads(threads), divisor)
    return out


def backend_name(backend: Optional[str] = None) -> str:
    """The backend reduce_into would use: backend, else HFR_KERNEL, else the fastest available
    (ValueError if it is unknown or not available here)."""
    import os

    name = backend or os.environ.get("HFR_KERNEL") or _fastest_backend()
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}: expected one of {list(BACKENDS)}")
    if _load(name) is None:
        raise ValueError(f"kernel backend {name!r} is not available here (available: {available_backends()})")
    return name


def _choose(backend: Optional[str]) -> ReduceFn:
    return _load(backend_name(backend))


def _threads(threads: Optional[int]) -> int:
    import os

    if threads is None:
        threads = int(os.environ.get("HFR_NUM_THREADS", 0)) or os.cpu_count() or 1
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads
