"""A whole call (one node, 4 KiB: each rank reduces its out straight from the input slots) followed by
a call of three chunks, over and over; run by tests/test_collectives.py under mpiexec.

    slot_reuse_worker.py ITERATIONS

The three-chunk call's first copies go out before its call check, the third into the stage the whole
call just used: a fast rank must not overwrite its input slot while a slow one still reads it for the
whole call. Every whole call's result is checked on every rank; rank 0 prints how many were wrong.
"""
import sys

import numpy as np
from mpi4py import MPI

import hfr

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
iterations = int(sys.argv[1])
comm = hfr.Communicator(world, chunk_bytes=4096, timeout=30)
whole, several = 1024, 3 * 1024  # float32: 4 KiB (whole), then three chunks of 4 KiB
out = np.empty(whole, np.float32)
wrong = 0
for i in range(iterations):
    base = 1000 * (i % 7)
    comm.allreduce(np.full(whole, rank + 1 + base, np.float32), out=out)
    wrong += not (out == sum(r + 1 + base for r in range(size))).all()
    y = np.full(several, -7.0 * (rank + 1), np.float32)  # values no whole call sums to: a foreign write shows
    assert (comm.allreduce(y) == -7.0 * sum(range(1, size + 1))).all()
wrong = world.allreduce(wrong)
if rank == 0:
    print(f"{size} ranks, {iterations} iterations: {wrong} results wrong", flush=True)
comm.close()
