"""How much hfr's allreduce slows GPU compute running beside it (it runs no GPU kernel).

    mpirun -n 4 python -m mpi4py bench/overlap_perf.py --mib 186

Rank 0 times a loop of matrix products on its own stream (CUDA events), first alone, then while
every rank runs allreduce_async on an array of --mib MiB back to back, then while rank 0 alone runs
plain copies of the same bytes to and from page-locked memory (what any PCIe allreduce moves: the
part of the slowdown that is the copies', not hfr's); prints the times, the slowdowns, the GPU's
median SM clock and power in each phase (nvidia-smi), and the allreduce time alone and beside the
compute. Rank 0's array is a CuPy array.
--peers cupy: the other ranks' arrays are CuPy arrays on the same GPU(s) (ranks share a GPU: their
contexts time-slice it); --peers numpy: they hold NumPy arrays and never touch the GPU, so rank 0's
GPU sees only its own copies, as on a machine with one GPU per rank.
"""
import argparse
import contextlib
import shutil
import statistics
import subprocess
import time

import cupy as cp
import cupyx
import numpy as np
from mpi4py import MPI

import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
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


def copy_loop(x, host, until):
    """Copy x to the page-locked host and back, a stream each way as hfr does, until event `until` is done;
    returns the copies' bytes per second."""
    to_host, to_device = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    back = cp.empty_like(x)
    moved, t0 = 0, time.perf_counter()
    while not until.done:
        cp.cuda.runtime.memcpyAsync(host.ctypes.data, x.data.ptr, x.nbytes, cp.cuda.runtime.memcpyDeviceToHost,
                                    to_host.ptr)
        cp.cuda.runtime.memcpyAsync(back.data.ptr, host.ctypes.data, x.nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                    to_device.ptr)
        to_host.synchronize()
        to_device.synchronize()
        moved += 2 * x.nbytes
    return moved / (time.perf_counter() - t0)


@contextlib.contextmanager
def gpu_sampler(samples: list):
    """Append (median SM clock MHz, median power W) of the GPU while the block runs; nothing without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        yield
        return
    proc = subprocess.Popen(["nvidia-smi", "-i", str(cp.cuda.Device().id), "--query-gpu=clocks.sm,power.draw",
                             "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        proc.terminate()
        rows = [line.split(",") for line in proc.communicate()[0].splitlines() if "," in line]
        if rows:
            samples.append((statistics.median(float(r[0]) for r in rows), statistics.median(float(r[1]) for r in rows)))


def describe(samples: list) -> str:
    if not samples:
        return ""
    return f"  SM clock {statistics.median(s[0] for s in samples):.0f} MHz, power {statistics.median(s[1] for s in samples):.0f} W"


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

    def elapsed(start, end):
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3

    alone = allreduce_seconds(3)
    compute_alone, compute_beside, compute_copies, allreduce_beside, copy_rates = [], [], [], [], []
    clocks_alone, clocks_beside, clocks_copies = [], [], []
    host = cupyx.empty_pinned(x.nbytes, np.uint8) if rank == 0 else None
    for _ in range(args.repeats):
        if rank == 0:
            with gpu_sampler(clocks_alone):
                compute_alone.append(elapsed(*matmul_loop(a, b, args.iters, stream)[:2]))
        world.Barrier()
        if rank == 0:
            start, end, _ = matmul_loop(a, b, args.iters, stream)
        # Enough allreduces to cover the compute loop.
        calls = max(2, int(1.2 * (compute_alone[-1] if rank == 0 else 0) / alone) + 1)
        calls = world.bcast(calls, root=0)
        with gpu_sampler(clocks_beside) if rank == 0 else contextlib.nullcontext():
            allreduce_beside.append(allreduce_seconds(calls))
        if rank == 0:
            compute_beside.append(elapsed(start, end))
            start, end, _ = matmul_loop(a, b, args.iters, stream)
            with gpu_sampler(clocks_copies):
                copy_rates.append(copy_loop(x, host, end))
            compute_copies.append(elapsed(start, end))
        world.Barrier()
    comm.close()
    if rank == 0:
        ca, cb, cc = (statistics.median(t) for t in (compute_alone, compute_beside, compute_copies))
        flops = 2 * args.n**3 * args.iters
        print(f"# overlap: {size} ranks, peers hold {args.peers} arrays, {cp.cuda.runtime.getDeviceCount()} GPU(s), "
              f"allreduce {args.mib} MiB fp32, "
              f"matmul {args.n}^2 fp16 x{args.iters}, median of {args.repeats}")
        print(f"compute alone         {ca * 1e3:9.1f} ms  ({flops / ca / 1e12:.0f} TFLOP/s){describe(clocks_alone)}")
        print(f"compute beside hfr    {cb * 1e3:9.1f} ms  ({flops / cb / 1e12:.0f} TFLOP/s)  slowdown "
              f"{100 * (cb / ca - 1):+.1f}%{describe(clocks_beside)}")
        print(f"compute beside copies {cc * 1e3:9.1f} ms  ({flops / cc / 1e12:.0f} TFLOP/s)  slowdown "
              f"{100 * (cc / ca - 1):+.1f}%{describe(clocks_copies)}  (rank 0 copies alone: "
              f"{statistics.median(copy_rates) / 1e9:.1f} GB/s both ways)")
        print(f"allreduce alone       {alone * 1e3:9.1f} ms;  beside compute {statistics.median(allreduce_beside) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
