"""Where a call's time goes, chunk by chunk: the node protocol's steps timed inside hfr/_node_call.pyx.

    mpirun -n 4 python -m mpi4py bench/chunk_steps.py --array cupy --bytes 64M --calls 20
    HFR_CHUNK_BYTES=1M mpirun -n 4 ...     (the chunk is the engine's: HFR_CHUNK_BYTES, HFR_CACHE_BYTES)

Every rank has its NodeCall mark when each step of each chunk of a blocking allreduce ended (mark_steps:
begin, the staged copies out STAGES back retired, our copy in done, every rank arrived, our slice reduced,
crossed nodes, every rank reduced, copied out, the copy in STAGES ahead). Rank 0 prints, per step, the
median over calls and chunks of the time since the step before (us) on itself and on the rank where it is
largest, its mean on itself and the largest mean (means add up to the chunk's time), then the median chunk
(begin to begin) and call. A step a chunk does not take counts 0. --save keeps every mark for a timeline.
"""
import argparse

import numpy as np
from mpi4py import MPI

import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
import hfr
from hfr._node_call import STEP_MARKS
from hfr.settings import parse_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--array", choices=("numpy", "cupy"), default="numpy")
    p.add_argument("--bytes", default="64M", help="float32 allreduce of this many bytes")
    p.add_argument("--calls", type=int, default=20, help="timed calls, after 3 untimed")
    p.add_argument("--save", help="rank 0 saves every rank's marks here (.npy: ranks x calls x chunks x steps, "
                   "seconds on the host's monotonic clock)")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    comm = hfr.Communicator(world)
    count = parse_bytes(args.bytes, "--bytes") // 4
    host = np.random.default_rng(world.rank).standard_normal(count).astype(np.float32)
    if args.array == "cupy":
        import cupy

        cupy.cuda.Device(world.rank % cupy.cuda.runtime.getDeviceCount()).use()
        x = cupy.asarray(host)
        synchronize = cupy.cuda.get_current_stream().synchronize
    else:
        x, synchronize = host, lambda: None
    node_call = comm._engine._node_call
    chunks = len(node_call.chunks(count, 4))
    marks = np.full((args.calls, chunks, len(STEP_MARKS)), np.nan)
    for call in range(-3, args.calls):
        if call >= 0:
            node_call.mark_steps(marks[call])
        world.Barrier()
        comm.allreduce(x)
        synchronize()
    node_call.mark_steps(None)
    # a step not taken ends where the one before it did; each step's time is since the step before
    filled = marks.copy()
    for step in range(1, len(STEP_MARKS)):
        missing = np.isnan(filled[:, :, step])
        filled[:, :, step][missing] = filled[:, :, step - 1][missing]
    steps = np.diff(filled, axis=2) * 1e6  # (calls, chunks, steps - 1), us
    mine = np.nanmedian(steps.reshape(-1, steps.shape[2]), axis=0)
    every = world.gather(mine, root=0)
    means = world.gather(np.nanmean(steps.reshape(-1, steps.shape[2]), axis=0), root=0)
    everyone = world.gather(marks, root=0) if args.save else None
    periods = np.diff(filled[:, :, 0], axis=1).ravel() * 1e6 if chunks > 1 else np.array([np.nan])
    calls = (filled[:, -1, -1] - filled[:, 0, 0]) * 1e6
    if world.rank == 0:
        every = np.array(every)
        print(f"# {world.size} ranks, {comm.nnodes} node(s), {args.array} float32 allreduce of {count * 4} B in "
              f"{chunks} chunk(s) of {comm._engine.chunk} B; us, median of {args.calls} calls x {chunks} chunks")
        print(f"# {'step':<14}{'rank 0':>10}{'largest':>10}{'on rank':>9}{'mean r0':>10}{'mean max':>10}")
        means = np.array(means)
        for i, name in enumerate(STEP_MARKS[1:]):
            worst = int(np.nanargmax(every[:, i]))
            print(f"  {name:<14}{every[0, i]:>10.1f}{every[worst, i]:>10.1f}{worst:>9}{means[0, i]:>10.1f}"
                  f"{means[:, i].max():>10.1f}")
        print(f"# rank 0: chunk begin to begin {np.nanmedian(periods):.1f} us, call (first begin to last step) "
              f"{np.nanmedian(calls):.1f} us")
        if args.save:
            np.save(args.save, np.array(everyone))
    comm.close()


if __name__ == "__main__":
    main()
