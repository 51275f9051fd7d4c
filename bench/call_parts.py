"""Where a small call's time goes: hfr's allreduce, its parts alone and MPI's, each in a tight loop.

    mpiexec -n 2 python -m mpi4py bench/call_parts.py [--bytes 8] [--calls 3000] [--rounds 3]
    HFR_LOCAL_SIZE=1 mpiexec -n 4 python -m mpi4py bench/call_parts.py   # 4 emulated nodes of one rank

Rank 0 prints the median over rounds of the mean time of one call (us), NumPy float32 sum in place:
  hfr       comm.allreduce(x): a call of one chunk, which runs in C (hfr/_node_call.pyx)
  vote      across nodes only: the call check's vote alone (internode.vote, a doubling of 11 int64)
  doubling  across nodes only: the data's doubling alone (internode.allreduce(..., algo="doubling"))
  mpi       MPI_Allreduce of x over all ranks
  python    comm.allreduce(x) with the C call replaced by one that returns at once: the Python around
            it (no rank waits for another then; measured last, as it leaves the node's counters behind)
Unlike bench/allreduce_perf.py no barrier separates the calls: this is the cost per call of a stream
of calls, without the skew a barrier leaves between ranks.
"""
import argparse
import statistics
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
import hfr
from hfr import internode
from hfr.ops import Op
from hfr.settings import parse_bytes


class _Returns:
    """Stands in for the engine's NodeCall: every call is DONE at once."""

    @staticmethod
    def run(*args, **kwargs) -> int:
        return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", default="8")
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    world = MPI.COMM_WORLD
    comm = hfr.Communicator(world)
    if comm.size == 1:
        raise SystemExit("call_parts.py needs 2 or more ranks")
    x = np.ones(max(1, parse_bytes(args.bytes, "--bytes") // 4), np.float32)
    votes = np.zeros(11, np.int64)
    engine = comm._engine
    parts: dict[str, Callable[[], object]] = {"hfr": lambda: comm.allreduce(x)}
    if comm.nnodes > 1:
        rail = engine.rail_comm
        parts["vote"] = lambda: internode.vote(rail, votes, None)
        parts["doubling"] = lambda: internode.allreduce(rail, x, 0, Op.SUM, algo="doubling")
    parts["mpi"] = lambda: world.Allreduce(MPI.IN_PLACE, x)
    times: dict[str, list] = {name: [] for name in [*parts, "python"]}
    for _ in range(args.rounds):
        for name, call in parts.items():
            times[name].append(_seconds_per_call(call, args.calls, world))
    engine._node_call = _Returns()  # last: the node's counters stay behind the engine's from here on
    for _ in range(args.rounds):
        times["python"].append(_seconds_per_call(lambda: comm.allreduce(x), args.calls, world))
    comm.close()
    if world.rank == 0:
        print(f"# {comm.size} ranks, {comm.nnodes} node(s), {x.nbytes} B float32 sum in place, us a call "
              f"(median of {args.rounds} rounds of {args.calls})")
        print("  ".join(f"{name} {statistics.median(t) * 1e6:.2f}" for name, t in times.items()))


def _seconds_per_call(call: Callable[[], object], calls: int, world: MPI.Comm) -> float:
    for _ in range(calls // 10):
        call()
    world.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


if __name__ == "__main__":
    main()
