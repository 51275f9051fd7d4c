"""What the call check costs: allreduce time with it, and with it replaced by a stub.

    mpiexec -n 2 python -m mpi4py bench/check_cost.py --bytes 1M --calls 200

Before any data leaves a rank, every call checks that all ranks made the same call
(hfr.engine.Engine._check: a descriptor row per rank in the node's segment, a wait for the node's
ranks, across nodes a small vote on the rail, settled before chunk 0 leaves the rank). Here every rank
makes the same calls, so the stub (which only counts the call) gives the same results; the difference of
the two medians is the check's cost on the hot path. Rounds alternate between the two, to spread the
machine's noise over both. Calls of one chunk check in C (hfr/_node_call.pyx), where nothing can be
stubbed: every call here takes the engine's Python loop (for what a small call's parts cost in C, see
bench/call_parts.py).
"""
import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
import hfr
from hfr.engine import Engine
from hfr.settings import parse_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", default="1M")
    p.add_argument("--calls", type=int, default=200, help="calls per round")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    world = MPI.COMM_WORLD
    comm = hfr.Communicator(world)
    if comm._engine is not None:
        comm._engine.front.in_c = False  # the Python loop, whose check can be stubbed
    x = np.ones(parse_bytes(args.bytes, "--bytes") // 4, np.float32)
    checked = Engine._check

    def unchecked(engine: Engine, call, descriptor):
        engine._node_call.calls_done += 1
        return lambda: None  # settle(): nothing to settle

    times = {"with the check": [], "without": []}
    for r in range(2 * args.rounds):
        name = "with the check" if r % 2 == 0 else "without"
        Engine._check = checked if r % 2 == 0 else unchecked
        world.Barrier()
        start = time.perf_counter()
        for _ in range(args.calls):
            comm.allreduce(x, op="max")
        times[name].append((time.perf_counter() - start) / args.calls)
    Engine._check = checked
    nnodes = comm.nnodes
    comm.close()
    if world.rank == 0:
        w, wo = (statistics.median(times[k]) * 1e6 for k in ("with the check", "without"))
        print(f"# {world.size} ranks, {nnodes} node(s), {x.nbytes} B float32 max, median of {args.rounds} "
              f"rounds of {args.calls} calls")
        print(f"with the check {w:8.1f} us   without {wo:8.1f} us   cost {w - wo:+7.1f} us = {100 * (w - wo) / wo:+.1f}%")


if __name__ == "__main__":
    main()
