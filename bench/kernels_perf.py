"""Throughput of the reduce kernels, next to a parallel copy measured in the same run with the same threads.

GB/s counts the bytes a kernel must move: (k+1)*bytes for k inputs (k reads, one write), 2*bytes for the
copy. copy% is a backend's GB/s over the copy's; xchain is the time of a chain of k-1 np.add calls (in the
dtype itself, one thread, as NumPy does it) over the backend's time. Each repeat times the copy, every
backend and the chain back to back, so that a noisy machine shifts them together; the table shows medians.
A sample is as many calls in a row as it takes one input's bytes to add up to 64 MiB (one call from 64 MiB on),
so a size that fits the cache (a protocol's chunk: --size-mib 0.25) is timed in it, over a millisecond or more;
each backend's kernel is called with the arguments hfr.kernels.reduce_into checked once, before the timing.

    python bench/kernels_perf.py [--size-mib 64] [--k 2 4 8] [--dtypes float32 ...] [--threads 1 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import ml_dtypes
import numpy as np

import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
from hfr import kernels
from hfr._kernels import parallel_copy

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float64": np.float64, "int32": np.int32, "int8": np.int8}
TARGETS = """targets: cython float32 k=8 copy% >= 90; cython float32 k=8 xchain >= 2.5;
         half types >= 70% of float32's GB/s (same k, threads); numba >= 50% of cython's GB/s"""


def random_array(dtype: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    return rng.standard_normal(n, dtype=np.float32).astype(dtype)


def add_chain(out: np.ndarray, inputs: list[np.ndarray]) -> None:
    np.add(inputs[0], inputs[1], out=out)
    for x in inputs[2:]:
        np.add(out, x, out=out)


SAMPLE_BYTES = 64 << 20  # a sample's calls move at least this much of one input


def seconds(fn, calls: int) -> float:
    """Seconds a call of fn, over `calls` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def measure(dtype, k: int, threads: int, nbytes: int, backends: list[str], repeats: int, chain: bool) -> dict:
    """Median seconds per column: "copy", each backend, and "chain" when asked."""
    rng = np.random.default_rng(k)
    n = nbytes // np.dtype(dtype).itemsize
    inputs = [random_array(dtype, n, rng) for _ in range(k)]
    out = np.empty_like(inputs[0])
    copy_dst = np.empty_like(inputs[0])
    runs = {"copy": lambda: parallel_copy(copy_dst, inputs[0], threads)}
    checked = kernels.check_arguments(out, inputs, "sum", None)  # once: reduce_into's checks cost ~5-8 us a call
    for b in backends:
        runs[b] = lambda fn=kernels._choose(b): fn(*checked[:3], threads, checked[3])
    if chain:
        runs["chain"] = lambda: add_chain(out, inputs)
    times: dict[str, list[float]] = {name: [] for name in runs}
    calls = max(1, SAMPLE_BYTES // max(nbytes, 1))
    for rep in range(repeats + 1):  # the first is the warm-up
        for name, fn in runs.items():
            t = seconds(fn, calls)
            if rep:
                times[name].append(t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=float, default=64, help="bytes per input, MiB (default 64)")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4, 8], help="numbers of inputs")
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16", "float64", "int32"],
                   choices=list(DTYPES))
    p.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    p.add_argument("--backends", nargs="+", default=kernels.available_backends(),
                   choices=list(kernels.BACKENDS))
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    nbytes = int(args.size_mib * 2**20)
    cols = ["copy"] + args.backends
    print(f"# {args.size_mib:g} MiB per input, median of {args.repeats} after a warm-up; GB/s = (k+1)*bytes/s; "
          f"cython kernels: {kernels.simd() or 'not built'} SIMD")
    header = ["threads", "dtype", "k"] + [f"{c} GB/s" for c in cols] + [f"{b} copy%" for b in args.backends]
    header += ["cython xchain"] if "cython" in args.backends else []
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for threads in args.threads:
        for name in args.dtypes:
            for k in args.k:
                chain = k == 8 and "cython" in args.backends
                t = measure(DTYPES[name], k, threads, nbytes, args.backends, args.repeats, chain)
                gbs = {c: (2 if c == "copy" else k + 1) * nbytes / t[c] / 1e9 for c in cols}
                row = [str(threads), name, str(k)] + [f"{gbs[c]:.1f}" for c in cols]
                row += [f"{100 * gbs[b] / gbs['copy']:.0f}" for b in args.backends]
                if "cython" in args.backends:
                    row.append(f"{t['chain'] / t['cython']:.2f}" if chain else "")
                print("| " + " | ".join(row) + " |", flush=True)
    print(TARGETS)


if __name__ == "__main__":
    main()
