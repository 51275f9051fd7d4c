"""The Numba reduce kernel: the same algorithm, tiles and bits as hfr/_kernels.pyx, for when it is not built.

Terms (as in _kernels.pyx): k inputs x0..x(k-1); a block is the contiguous run of elements one thread
owns; a tile is TILE elements of a block, folded over all k inputs while it stays in L2, so each input is
read once and out written once. float16 and bfloat16 arrive viewed as uint16 and are widened to float32
tile by tile (Numba has no float16 on the CPU), combined in float32 and rounded once, to nearest even.
avg divides each tile's sum by the divisor in the accumulation type before that rounding.
Numba's integer arithmetic wraps, as NumPy's does.
"""
from __future__ import annotations

import os
from typing import Sequence

import ml_dtypes
import numba
import numpy as np
from numba import njit, prange
from numba.typed import List

from .ops import Op

__all__ = ["reduce"]

# numba's OpenMP layer would share torch's libgomp, whose threads spin after every call (measured here with
# torch imported first: ~5 ms of CPU per call, and the call itself 4x slower); the workqueue layer's
# threads sleep. Chosen only where the user chose none and numba has not started its threads yet. (The
# workqueue layer runs one parallel region at a time: hfr's own calls never overlap.)
if "NUMBA_THREADING_LAYER" not in os.environ:
    from numba.np.ufunc import parallel as _parallel

    if not _parallel._is_initialized:
        numba.config.THREADING_LAYER = "workqueue"

SUM, MAX, MIN, PROD = 0, 1, 2, 3
_OPS = {Op.SUM: SUM, Op.AVG: SUM, Op.MAX: MAX, Op.MIN: MIN, Op.PROD: PROD}
TILE = 32768  # elements; as in _kernels.pyx, long runs of each input keep the prefetchers streaming
BLOCK_ALIGN = 64  # elements: blocks start on cache lines
MIN_BYTES_PER_THREAD = 256 * 1024
_HALF_KINDS = {np.dtype(ml_dtypes.bfloat16): True, np.dtype(np.float16): False}  # dtype -> is bfloat16
SUBNORMAL_STEP = np.float32(2.0**-24)  # the float16 subnormal step


@njit(cache=True, inline="always")
def _fold(acc, x, op):
    """acc[i] = acc[i] op x[i]. max/min return a NaN of either side, as np.maximum does.
    (Two arrays, not dst = a op b with dst is a: LLVM's overlap check would then pick the scalar loop.)"""
    if op == SUM:
        for i in range(acc.size):
            acc[i] = acc[i] + x[i]
    elif op == PROD:
        for i in range(acc.size):
            acc[i] = acc[i] * x[i]
    elif op == MAX:
        for i in range(acc.size):
            acc[i] = acc[i] if (acc[i] > x[i]) | (acc[i] != acc[i]) else x[i]
    else:
        for i in range(acc.size):
            acc[i] = acc[i] if (acc[i] < x[i]) | (acc[i] != acc[i]) else x[i]


@njit(cache=True, inline="always")
def _divide(acc, divisor):
    """acc[i] /= divisor, in acc's type (avg's last step, while the tile is in cache)."""
    d = acc.dtype.type(divisor)
    for i in range(acc.size):
        acc[i] = acc[i] / d


@njit(cache=True, inline="always")
def _block(t, nthreads, n):
    """[lo, hi) of thread t's block."""
    per = ((n + nthreads - 1) // nthreads + BLOCK_ALIGN - 1) // BLOCK_ALIGN * BLOCK_ALIGN
    return min(t * per, n), min(t * per + per, n)


@njit(cache=True, parallel=True)
def _reduce_plain(out, xs, op, divisor, nthreads):
    for t in prange(nthreads):
        lo, hi = _block(t, nthreads, out.size)
        for start in range(lo, hi, TILE):
            stop = min(start + TILE, hi)
            dst, x0 = out[start:stop], xs[0][start:stop]
            for i in range(dst.size):  # a loop, not dst[:] = x0, as out may be xs[0]
                dst[i] = x0[i]
            for j in range(1, len(xs)):
                _fold(dst, xs[j][start:stop], op)
            if divisor != 1:
                _divide(dst, divisor)


@njit(cache=True, inline="always")
def _widen(dst_bits, dst, h, is_bf16):
    """dst (float32, a view of the uint32 dst_bits) = the half bits h, exactly."""
    if is_bf16:
        for i in range(h.size):
            dst_bits[i] = np.uint32(h[i]) << 16
        return
    for i in range(h.size):
        m = np.uint32(h[i] & 0x7FFF) << 13  # exponent and mantissa, in float32 position
        e = m & 0x0F800000
        mag = m + (224 << 23) if e == 0x0F800000 else m + (112 << 23)  # inf/NaN keep the payload
        dst_bits[i] = mag | (np.uint32(h[i] & 0x8000) << 16)
    for i in range(h.size):  # subnormals and zeros: mantissa * 2^-24, with the sign
        if h[i] & 0x7C00 == 0:
            dst[i] = np.float32(h[i] & 0x3FF) * (-SUBNORMAL_STEP if h[i] & 0x8000 else SUBNORMAL_STEP)


@njit(cache=True, inline="always")
def _narrow(h, src_bits, src, tmp_bits, tmp, is_bf16):
    """h = the float32 values src (a view of src_bits) rounded to nearest even; NaN stays NaN."""
    if is_bf16:
        for i in range(h.size):
            b = src_bits[i]
            rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
            h[i] = (b >> 16) | 0x40 if (b & 0x7FFFFFFF) > 0x7F800000 else rounded
        return
    for i in range(h.size):  # below 2^-14 adding 0.5 rounds to a multiple of 2^-24, the subnormal step
        tmp[i] = np.abs(src[i]) + np.float32(0.5)
    for i in range(h.size):
        a = src_bits[i] & 0x7FFFFFFF
        big = 0x7E00 if a > 0x7F800000 else 0x7C00  # NaN -> quiet NaN; >= 2^16 -> inf
        subnormal = tmp_bits[i] - 0x3F000000
        normal = (a - (112 << 23) + 0xFFF + ((a >> 13) & 1)) >> 13
        mag = big if a >= (143 << 23) else (subnormal if a < (113 << 23) else normal)
        h[i] = mag | ((src_bits[i] >> 16) & 0x8000)


@njit(cache=True, parallel=True)
def _reduce_half(out, xs, op, divisor, is_bf16, nthreads):
    k = len(xs)
    for t in prange(nthreads):
        lo, hi = _block(t, nthreads, out.size)
        acc_bits = np.empty(TILE, np.uint32)
        tmp_bits = np.empty(TILE, np.uint32)
        for start in range(lo, hi, TILE):
            stop = min(start + TILE, hi)
            m = stop - start
            acc_b, tmp_b = acc_bits[:m], tmp_bits[:m]
            acc, tmp = acc_b.view(np.float32), tmp_b.view(np.float32)
            _widen(acc_b, acc, xs[0][start:stop], is_bf16)
            for j in range(1, k):
                _widen(tmp_b, tmp, xs[j][start:stop], is_bf16)
                _fold(acc, tmp, op)
            if divisor != 1:
                _divide(acc, divisor)
            _narrow(out[start:stop], acc_b, acc, tmp_b, tmp, is_bf16)


def reduce(out: np.ndarray, inputs: Sequence[np.ndarray], op: Op, threads: int, divisor: int = 1) -> None:
    """out = inputs[0] op ... op inputs[-1] (avg: the sum / divisor), for arguments checked by
    hfr.kernels.check_arguments."""
    nthreads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS, (len(inputs) + 1) * out.nbytes // MIN_BYTES_PER_THREAD))
    numba.set_num_threads(nthreads)
    code = _OPS[op]
    divisor = divisor if op is Op.AVG else 1
    if out.dtype in _HALF_KINDS:
        xs = List([x.view(np.uint16) for x in inputs])
        _reduce_half(out.view(np.uint16), xs, code, divisor, _HALF_KINDS[out.dtype], nthreads)
    else:
        _reduce_plain(out, List(inputs), code, divisor, nthreads)
