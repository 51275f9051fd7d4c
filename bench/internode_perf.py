"""Time the inter-node allreduce algos against MPI's own Allreduce, nccl-tests style.

Every rank of COMM_WORLD is one node of the rail. Run:
    mpiexec -n 4 python -m mpi4py bench/internode_perf.py -b 8 -e 64M -f 4
time: mean seconds per call (the slowest rank's); algbw = bytes / time; busbw = algbw * 2(n-1)/n;
vs_mpi = MPI.Allreduce's time / this time (above 1: faster than MPI).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
from hfr import internode
from hfr.ops import Op


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def time_calls(comm: MPI.Comm, call, iters: int, warmup: int) -> float:
    """Mean seconds per call over iters calls after warmup ones, the slowest rank's."""
    for _ in range(warmup):
        call()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    elapsed = (time.perf_counter() - start) / iters
    return comm.allreduce(elapsed, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--minbytes", default="8")
    parser.add_argument("-e", "--maxbytes", default="64M")
    parser.add_argument("-f", "--stepfactor", type=int, default=4)
    parser.add_argument("-n", "--iters", type=int, default=10)
    parser.add_argument("-w", "--warmup", type=int, default=3)
    parser.add_argument("--block-bytes", default=str(internode.DEFAULT_BLOCK_BYTES))
    parser.add_argument("--algos", default=",".join(internode.ALGOS))
    parser.add_argument("--threads", type=int, default=1, help="kernel threads for the combines")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    n, block_bytes = comm.Get_size(), parse_size(args.block_bytes)
    algos = args.algos.split(",")
    if comm.rank == 0:
        print(f"# {n} ranks, float32 sum, block_bytes {block_bytes}, {args.threads} kernel thread(s), {args.iters} "
              f"iters after {args.warmup} warmup")
        print(f"{'size':>10} {'algo':>8} {'time_us':>10} {'algbw':>8} {'busbw':>8} {'vs_mpi':>7}")
    size = parse_size(args.minbytes)
    while size <= parse_size(args.maxbytes):
        buf = np.zeros(max(1, size // 4), np.float32)  # sums of zeros stay finite however many calls
        nbytes = buf.nbytes
        iters = max(1, min(args.iters * 100, int(args.iters * (1 << 24) / max(nbytes, 1 << 14))))
        timings = {"MPI.Allreduce": time_calls(comm, lambda: comm.Allreduce(MPI.IN_PLACE, buf), iters, args.warmup)}
        for algo in algos:
            timings[algo] = time_calls(
                comm, lambda: internode.allreduce(comm, buf, 0, Op.SUM, algo=algo, block_bytes=block_bytes,
                                            threads=args.threads),
                iters, args.warmup)
        if comm.rank == 0:
            for algo, seconds in timings.items():
                algbw = nbytes / seconds / 1e9
                busbw = algbw * 2 * (n - 1) / n
                print(f"{nbytes:>10} {algo:>8} {seconds * 1e6:>10.1f} {algbw:>8.3f} {busbw:>8.3f} "
                      f"{timings['MPI.Allreduce'] / seconds:>7.2f}", flush=True)
        size *= args.stepfactor


if __name__ == "__main__":
    main()
