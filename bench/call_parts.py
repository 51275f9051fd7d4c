"""Where a small call's time goes: hfr's allreduce, its parts alone and MPI's, each in a tight loop.

    mpiexec -n 2 python -m mpi4py bench/call_parts.py [--bytes 8] [--calls 3000] [--rounds 3]
    HFR_LOCAL_SIZE=1 mpiexec -n 4 python -m mpi4py bench/call_parts.py   # 4 emulated nodes of one rank
    mpiexec -n 4 python -m mpi4py bench/call_parts.py --array cupy   # a CuPy array's call, in pieces

Rank 0 prints the median over rounds of the mean time of one call (us), float32 sum in place:
  hfr       comm.allreduce(x): a call of one chunk, which runs in C (hfr/_front.pyx, hfr/_node_call.pyx)
  c         the node's protocol alone (NodeCall.run, which the front calls; across nodes with the call
            shape's rail schedules, made once by the engine and rewound in Python): hfr - c is the cost
            of the checks, admission and counting around it
  vote      across nodes only: the call check's vote alone, no data in its record (internode.vote)
  doubling  across nodes only: the data's doubling alone (internode.allreduce(..., algo="doubling"))
  mpi       MPI_Allreduce of x over all ranks
With --array cupy (x on the GPU) also:
  host      the same call on a NumPy array: the call without copies
  d2h, h2d  one copy of x between the GPU and page-locked memory, then a stream synchronize
  mpi-staged  d2h, MPI_Allreduce on the host, h2d: the peer bench/allreduce_perf.py times
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
from hfr.engine import STAGES
from hfr.ops import Op
from hfr.settings import parse_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", default="8")
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--array", choices=("numpy", "cupy"), default="numpy")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    comm = hfr.Communicator(world)
    if comm.size == 1:
        raise SystemExit("call_parts.py needs 2 or more ranks")
    host = np.ones(max(1, parse_bytes(args.bytes, "--bytes") // 4), np.float32)
    engine = comm._engine
    x = host if args.array == "numpy" else _on_gpu(host, world)
    parts: dict[str, Callable[[], object]] = {"hfr": lambda: comm.allreduce(x), "c": _node_protocol(engine, host)}
    if args.array == "cupy":
        parts.update(_cupy_parts(comm, world, x, host))
    if comm.nnodes > 1:
        rail = engine.rail_comm
        vote = internode.vote_schedule(rail, internode.VoteRecord())

        def vote_again() -> None:
            vote.rewind()
            internode.vote(rail, vote, None)

        parts["vote"] = vote_again
        parts["doubling"] = lambda: internode.allreduce(rail, x, 0, Op.SUM, algo="doubling")
    parts["mpi"] = lambda: world.Allreduce(MPI.IN_PLACE, host)
    times: dict[str, list] = {name: [] for name in parts}
    for _ in range(args.rounds):
        for name, call in parts.items():
            times[name].append(_seconds_per_call(call, args.calls, world))
    comm.close()
    if world.rank == 0:
        print(f"# {comm.size} ranks, {comm.nnodes} node(s), {x.nbytes} B {args.array} float32 sum in place, us a call "
              f"(median of {args.rounds} rounds of {args.calls})")
        print("  ".join(f"{name} {statistics.median(t) * 1e6:.2f}" for name, t in times.items()))


def _node_protocol(engine, x: np.ndarray) -> Callable[[], object]:
    """NodeCall.run of an allreduce of x in place, as the front runs it."""
    node_call, address = engine._node_call, x.ctypes.data
    call = engine.front_call(x, Op.SUM, None)
    descriptor = call.descriptor()
    # across nodes the call shape's schedules of each stage (the engine's), rewound before each call
    schedules = [engine._rail_schedules(call, stage) if engine.layout.nnodes > 1 else (None, None, False, False)
                 for stage in range(STAGES)]

    def run() -> None:
        vote, rails, folded, in_out = schedules[node_call.chunks_done % STAGES]
        for schedule in (vote, *(rails or ())):
            if schedule is not None:
                schedule.rewind()
        if node_call.run(descriptor, address, address, x.size, x.dtype, Op.SUM, vote, rails, folded, in_out):
            raise RuntimeError("the node's protocol did not end DONE")

    return run


def _on_gpu(host: np.ndarray, world: MPI.Comm):
    """host's values on this rank's GPU (ranks share GPUs round-robin)."""
    import cupy

    cupy.cuda.Device(world.rank % cupy.cuda.runtime.getDeviceCount()).use()
    return cupy.asarray(host)


def _cupy_parts(comm: "hfr.Communicator", world: MPI.Comm, x, host: np.ndarray) -> dict[str, Callable[[], object]]:
    """The pieces of a CuPy call, each alone: the C call on a host array, each copy, and mpi-staged."""
    import cupy
    import cupyx

    pinned = cupyx.empty_pinned(x.size, x.dtype)
    stream = cupy.cuda.get_current_stream()

    def d2h() -> None:
        x.get(out=pinned, stream=stream)
        stream.synchronize()

    def h2d() -> None:
        x.set(pinned, stream=stream)
        stream.synchronize()

    def staged() -> None:
        d2h()
        world.Allreduce(MPI.IN_PLACE, pinned)
        h2d()

    return {"host": lambda: comm.allreduce(host), "d2h": d2h, "h2d": h2d, "mpi-staged": staged}


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
