"""What a call from torch costs: hfr on a NumPy array, hfr on a CPU tensor of the same memory, and
torch.distributed.all_reduce on the "hfr" backend, on gloo and on a backend that does nothing.

    mpiexec -n 2 python -m mpi4py bench/torch_calls.py [-b 8 -e 64M -f 8] [--calls 2000] [--rounds 3]

For each size, rank 0 prints the median over rounds of the mean time of one call (us), float32 sum in
place, the calls of one round made in a tight loop (no barrier between them, as bench/call_parts.py),
each way in turn within a round:
  numpy    hfr.Communicator.allreduce on a NumPy array
  tensor   the same call on a torch CPU tensor sharing the array's memory
  hfr      dist.all_reduce(tensor) on a group of the "hfr" backend (hfr.torch)
  gloo     dist.all_reduce(tensor) on a gloo group
  null     dist.all_reduce(tensor) on a group whose all_reduce returns a finished Work at once: what
           torch's dispatch into a backend written in Python costs alone
then the ratios the issue's targets name: tensor/numpy, hfr/gloo, hfr/tensor and hfr/null. Every way's
result is checked once per size before the timing (null's is not: it does nothing).
"""
import argparse
import statistics
import time
from datetime import timedelta
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
import hfr
from hfr.settings import parse_bytes

WAYS = ("numpy", "tensor", "hfr", "gloo", "null")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", type=int, default=8)
    p.add_argument("--calls", type=int, default=2000, help="calls of 8 B in a round; fewer for larger sizes")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    import hfr.torch

    world = MPI.COMM_WORLD
    if world.size == 1:
        raise SystemExit("torch_calls.py needs 2 or more ranks")
    hfr.torch.init_process_group("gloo")
    _register_null_backend(dist)
    groups = {"hfr": dist.new_group(backend="hfr"), "gloo": dist.new_group(backend="gloo"),
              "null": dist.new_group(backend="null")}
    comm = hfr.Communicator(world)
    size = parse_bytes(args.minbytes, "-b")
    if world.rank == 0:
        print(f"# {world.size} ranks, float32 sum in place, us a call (median of {args.rounds} rounds); "
              f"torch {torch.__version__}")
        print(f"#{'bytes':>11}" + "".join(f"{w:>10}" for w in WAYS)
              + "".join(f"{r:>14}" for r in ("tensor/numpy", "hfr/gloo", "hfr/tensor", "hfr/null")))
    while size <= parse_bytes(args.maxbytes, "-e"):
        count = max(1, size // 4)
        host = np.empty(count, np.float32)
        tensor = torch.from_numpy(host)
        ways: dict[str, Callable[[], Any]] = {
            "numpy": lambda: comm.allreduce(host),
            "tensor": lambda: comm.allreduce(tensor),
            **{name: (lambda g=g: dist.all_reduce(tensor, group=g)) for name, g in groups.items()},
        }
        for name, way in ways.items():
            if name != "null":
                _check(way, host, world, name)
        calls = max(5, min(args.calls, args.calls * 64 // max(size // 1024, 1)))
        times: dict[str, list[float]] = {name: [] for name in WAYS}
        for _ in range(args.rounds):
            for name, way in ways.items():
                host[:] = 1.0  # no overflow to inf however many calls run
                times[name].append(_seconds_per_call(way, calls, world))
        if world.rank == 0:
            us = {name: statistics.median(t) * 1e6 for name, t in times.items()}
            print(f"{count * 4:>12}" + "".join(f"{us[w]:>10.1f}" for w in WAYS)
                  + "".join(f"{us[a] / us[b]:>13.3g}x" for a, b in (("tensor", "numpy"), ("hfr", "gloo"),
                                                                      ("hfr", "tensor"), ("hfr", "null"))), flush=True)
        size *= args.stepfactor
    comm.close()
    dist.destroy_process_group()  # every group


def _check(way: Callable[[], Any], host: np.ndarray, world: MPI.Comm, name: str) -> None:
    """One call on rank-dependent data, poisoned first where it lands, compared with the float64 sum."""
    data = (np.arange(host.size) % 13 + world.rank).astype(np.float32)
    host[:] = data
    way()
    expected = (np.arange(host.size) % 13 * world.size + world.size * (world.size - 1) // 2).astype(np.float64)
    wrong = world.allreduce(int(np.count_nonzero(host.astype(np.float64) != expected)))
    if wrong:
        raise SystemExit(f"{name}: {wrong} wrong elements at {host.nbytes} B")


def _seconds_per_call(call: Callable[[], Any], calls: int, world: MPI.Comm) -> float:
    """Mean seconds of one call over a tight loop of calls, the slowest rank's."""
    world.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return world.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)


def _register_null_backend(dist: Any) -> None:
    """The backend "null": a process group whose all_reduce returns a finished Work and does nothing."""

    class NullWork(dist.Work):
        def wait(self, timeout: timedelta = timedelta(0)) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

    class NullGroup(dist.ProcessGroup):
        def getBackendName(self) -> str:
            return "null"

        def allreduce(self, tensors: list, opts: Any = None) -> Any:
            return NullWork()

    def create(options: Any, _pg_options: Any) -> NullGroup:
        return NullGroup(options.group_rank, options.group_size)

    dist.Backend.register_backend("null", create, extended_api=True, devices=["cpu"])


if __name__ == "__main__":
    main()
