"""Reduction ops and dtypes: the tables every other module checks against."""
from __future__ import annotations

import enum
from typing import Any, Union

import ml_dtypes
import numpy as np

__all__ = ["Op", "OpLike", "DTYPES", "DTYPE_CODES", "as_op", "as_dtype", "accumulation_dtype", "is_float", "dtype_code",
           "op_code", "combining"]


class Op(str, enum.Enum):
    """The reductions hfr does. Integers wrap as NumPy's do; MAX and MIN propagate NaN.

    AVG is SUM divided by the number of ranks (float dtypes only), divided inside the kernel that sums a
    node's ranks: on one node it is the mean in the accumulation type (float32 for float16 and bfloat16)
    rounded once; across nodes the nodes' partial means, each rounded once, are summed, so a half-type
    average never overflows unless the mean lies within a few units in the last place of the type's
    largest value."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


OpLike = Union[Op, str, Any]  # Any: MPI.SUM-style objects

# Supported dtypes, in the order of their wire codes (dtype_code); never reorder.
DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64)
)
DTYPE_CODES = {dt: code for code, dt in enumerate(DTYPES)}
_OP_CODES = {op: code for code, op in enumerate(Op)}
_HALF_TYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _mpi_ops() -> list:
    """(MPI op, Op) pairs for MPI.SUM-style objects (MPI ops are not hashable)."""
    from mpi4py import MPI

    return [(MPI.SUM, Op.SUM), (MPI.MAX, Op.MAX), (MPI.MIN, Op.MIN), (MPI.PROD, Op.PROD)]


_BY_NAME = {o.value: o for o in Op}  # the common spelling, without Enum's lookup


def as_op(op: OpLike) -> Op:
    """The Op that op names: an Op, its name ("sum", case-insensitive) or MPI.SUM/MAX/MIN/PROD."""
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        try:
            return _BY_NAME.get(op) or Op(op.lower())
        except ValueError:
            raise ValueError(f"unknown op {op!r}: expected one of {[o.value for o in Op]}") from None
    for mpi_op, ours in _mpi_ops():
        if op == mpi_op:
            return ours
    raise ValueError(f"unknown op {op!r}: expected one of {[o.value for o in Op]}, an hfr.Op or MPI.SUM/MAX/MIN/PROD")


def as_dtype(dtype: Any) -> np.dtype:
    """dtype as a NumPy dtype, or TypeError naming it when hfr does not reduce it."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in DTYPE_CODES:
        names = ", ".join(d.name for d in DTYPES)
        raise TypeError(f"unsupported dtype {dtype!s}: hfr reduces {names}")
    return dt


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """The type sums are carried in: float32 for float16 and bfloat16, the dtype itself otherwise."""
    return np.dtype(np.float32) if dtype in _HALF_TYPES else dtype


def is_float(dtype: np.dtype) -> bool:
    """True for the float dtypes (float16, bfloat16, float32, float64): the ones avg takes."""
    return accumulation_dtype(dtype).kind == "f"


def dtype_code(dtype: np.dtype) -> int:
    return DTYPE_CODES[dtype]


def op_code(op: Op) -> int:
    return _OP_CODES[op]


def combining(op: Op) -> Op:
    """The op that combines partial results: avg's is sum (its one division by the ranks comes in the node's
    reduce, so the nodes' partial means add up to the mean)."""
    return Op.SUM if op is Op.AVG else op
