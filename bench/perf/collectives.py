"""One small descriptor per collective, as nccl-tests has, and the data every rank can rebuild.

Terms: a rank's *input* is a deterministic function of (seed, rank, element index): small integers,
so sums over ranks are exact in every float type and every rank can rebuild every other rank's input.
The *expected* result is reduced from those inputs in float64 or int64 and cast to the dtype once
(integers wrap as they do in the dtype, products overflow to inf as they do in the dtype).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np

__all__ = ["Collective", "COLLECTIVES", "DTYPES", "OPS", "rank_input", "count_wrong", "poison"]

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16), ("float32", np.float32),
                    ("float64", np.float64), ("int8", np.int8), ("uint8", np.uint8), ("int32", np.int32),
                    ("int64", np.int64)]
}
OPS = ("sum", "avg", "max", "min", "prod")
_REDUCE_UFUNCS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
# Relative tolerance for floats: the results are exact but for avg's one division (one rounding).
_RTOL = {"float16": 2.0**-9, "bfloat16": 2.0**-6, "float32": 2.0**-21, "float64": 2.0**-50}

InputOf = Callable[[int], np.ndarray]  # rank -> that rank's input


def is_float(dtype: np.dtype) -> bool:
    return dtype.name in _RTOL


def rank_input(count: int, dtype: np.dtype, op: str, seed: int, rank: int) -> np.ndarray:
    """Rank's input: values picked by a hash of (seed, rank, index) from a small table that keeps the
    result exact (-4..4 for sum/max/min, 0..8 unsigned; -1, 1, 2 for prod so products stay powers of 2)."""
    if op == "prod":
        table = [1, 2] if dtype.kind == "u" else [-1, 1, 2, 1]
    else:
        table = range(9) if dtype.kind == "u" else range(-4, 5)
    table = np.array(table, dtype=np.float64).astype(dtype)
    h = np.arange(count, dtype=np.uint64) + np.uint64((seed * 0x9E3779B1 + rank * 0x85EBCA77) % 2**63)
    h *= np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finaliser: neighbouring indices get unrelated values
    h ^= h >> np.uint64(31)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(29)
    return table[h % np.uint64(len(table))]


def _reduced(input_of: InputOf, nranks: int, op: str, dtype: np.dtype) -> np.ndarray:
    """The reduction over all ranks' inputs, carried in float64 or int64 and cast to dtype once."""
    wide = np.float64 if is_float(dtype) else np.int64
    acc = input_of(0).astype(wide)
    for r in range(1, nranks):
        _REDUCE_UFUNCS[op](acc, input_of(r).astype(wide), out=acc)
    if op == "avg":
        acc /= nranks
    with np.errstate(over="ignore"):
        return acc.astype(dtype)


def _allreduce_expected(input_of: InputOf, nranks: int, rank: int, root: int, op: str, dtype: np.dtype):
    return _reduced(input_of, nranks, op, dtype)


def _reduce_expected(input_of: InputOf, nranks: int, rank: int, root: int, op: str, dtype: np.dtype):
    return _reduced(input_of, nranks, op, dtype) if rank == root else None


def _broadcast_expected(input_of: InputOf, nranks: int, rank: int, root: int, op: str, dtype: np.dtype):
    return input_of(root)


def _reduce_scatter_expected(input_of: InputOf, nranks: int, rank: int, root: int, op: str, dtype: np.dtype):
    """This rank's k of the reduction of n*k-element inputs: elements [rank*k, (rank+1)*k)."""
    full = _reduced(input_of, nranks, op, dtype)
    k = full.size // nranks
    return full[rank * k:(rank + 1) * k]


def _allgather_expected(input_of: InputOf, nranks: int, rank: int, root: int, op: str, dtype: np.dtype):
    """Every rank's k-element input, in rank order."""
    return np.concatenate([input_of(r) for r in range(nranks)])


def _same_counts(count: int, nranks: int) -> tuple[int, int]:
    return count, count


def _scatter_counts(count: int, nranks: int) -> tuple[int, int]:
    """reduce_scatter: count is the larger (send) buffer's, rounded down to a multiple of n (nccl-tests)."""
    k = count // nranks
    return nranks * k, k


def _gather_counts(count: int, nranks: int) -> tuple[int, int]:
    """allgather: count is the larger (recv) buffer's, rounded down to a multiple of n (nccl-tests)."""
    k = count // nranks
    return k, nranks * k


@dataclass(frozen=True)
class Collective:
    """What the harness needs to know of a collective (nccl-tests' struct testColl).

    expected(input_of, nranks, rank, root, op, dtype) is this rank's correct output, or None where the
    output is unspecified (reduce on a rank other than the root). busbw = algbw * bus_factor(nranks):
    the bandwidth a link would need, comparable across rank counts."""

    name: str
    uses_op: bool
    uses_root: bool
    bus_factor: Callable[[int], float]
    expected: Callable[..., Optional[np.ndarray]]
    # (send count, recv count) from the sweep's count (the larger buffer's elements) and n.
    counts: Callable[[int, int], tuple[int, int]] = _same_counts


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in [
        Collective("allreduce", True, False, lambda n: 2 * (n - 1) / n, _allreduce_expected),
        Collective("reduce", True, True, lambda n: 1.0, _reduce_expected),
        Collective("broadcast", False, True, lambda n: 1.0, _broadcast_expected),
        Collective("reduce_scatter", True, False, lambda n: (n - 1) / n, _reduce_scatter_expected, _scatter_counts),
        Collective("allgather", False, False, lambda n: (n - 1) / n, _allgather_expected, _gather_counts),
    ]
}


def poison(array: Any) -> None:
    """Fill an output (NumPy or CuPy) with values no correct result holds: NaN for floats, the dtype's maximum for ints
    (only a sum or product that wraps to exactly that value could hide behind it)."""
    array.fill(np.nan if is_float(array.dtype) else np.iinfo(array.dtype).max)


def count_wrong(actual: np.ndarray, expected: np.ndarray) -> int:
    """Elements of actual that differ from expected: exactly for ints, within _RTOL for floats."""
    if not is_float(expected.dtype):
        return int(np.count_nonzero(actual != expected))
    ok = np.isclose(actual.astype(np.float64), expected.astype(np.float64), rtol=_RTOL[expected.dtype.name], atol=0)
    return int(ok.size - np.count_nonzero(ok))
