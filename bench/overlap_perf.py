"""How much hfr's allreduce slows GPU compute running beside it (it runs no GPU kernel).

    mpirun -n 4 python -m mpi4py bench/overlap_perf.py --mib 186

Rank 0 times a loop of matrix products on its own stream (CUDA events), first alone, then while
every rank runs allreduce_async on an array of --mib MiB back to back; prints both times, the
slowdown, and the allreduce time alone and beside the compute. Rank 0's array is a CuPy array.
--peers cupy: the other ranks' arrays are CuPy arrays on the same GPU(s) (ranks share a GPU: their
contexts time-slice it); --peers numpy: they hold NumPy arrays and never touch the GPU, so rank 0's
GPU sees only its own copies, as on a machine with one GPU per rank.
"""
import argparse
import statistics
import time

import cupy as cp
import numpy as np
from mpi4py import MPI

import hfr


def matmul_loop(a, b, iters, stream):
    """Queue iters products on stream; returns (start, end) events."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    with stream:
        start.record(stream)
        c = a
        for _ in range(iters):
            c = a @ b
        end.record(stream)
    return start, end, c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=186)
    p.add_argument("--n", type=int, default=8192, help="matrix side")
    p.add_argument("--iters", type=int, default=60, help="products per timed loop")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peers", choices=["cupy", "numpy"], default="cupy", help="array kind of ranks 1..n-1")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    on_gpu = rank == 0 or args.peers == "cupy"
    if on_gpu:
        cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
    comm = hfr.Communicator(world)
    count = int(args.mib * 2**20) // 4
    x = cp.ones(count, cp.float32) if on_gpu else np.ones(count, np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    if rank == 0:
        a = cp.random.rand(args.n, args.n, dtype=cp.float32).astype(cp.float16)
        b = cp.random.rand(args.n, args.n, dtype=cp.float32).astype(cp.float16)
        matmul_loop(a, b, 3, stream)[1].synchronize()
    comm.allreduce(x)  # warm-up: registers the segment

    def allreduce_seconds(count):
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(count):
            comm.allreduce_async(x).wait()
        return (time.perf_counter() - t0) / count

    alone = allreduce_seconds(3)
    compute_alone, compute_beside, allreduce_beside = [], [], []
    for _ in range(args.repeats):
        if rank == 0:
            start, end, _ = matmul_loop(a, b, args.iters, stream)
            end.synchronize()
            compute_alone.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        world.Barrier()
        if rank == 0:
            start, end, _ = matmul_loop(a, b, args.iters, stream)
        # Enough allreduces to cover the compute loop.
        calls = max(2, int(1.2 * (compute_alone[-1] if rank == 0 else 0) / alone) + 1)
        calls = world.bcast(calls, root=0)
        allreduce_beside.append(allreduce_seconds(calls))
        if rank == 0:
            end.synchronize()
            compute_beside.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    comm.close()
    if rank == 0:
        ca, cb = statistics.median(compute_alone), statistics.median(compute_beside)
        flops = 2 * args.n**3 * args.iters
        print(f"# overlap: {size} ranks, peers hold {args.peers} arrays, {cp.cuda.runtime.getDeviceCount()} GPU(s), "
              f"allreduce {args.mib} MiB fp32, "
              f"matmul {args.n}^2 fp16 x{args.iters}, median of {args.repeats}")
        print(f"compute alone      {ca * 1e3:9.1f} ms  ({flops / ca / 1e12:.0f} TFLOP/s)")
        print(f"compute beside hfr {cb * 1e3:9.1f} ms  ({flops / cb / 1e12:.0f} TFLOP/s)  slowdown {100 * (cb / ca - 1):+.1f}%")
        print(f"allreduce alone    {alone * 1e3:9.1f} ms;  beside compute {statistics.median(allreduce_beside) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
