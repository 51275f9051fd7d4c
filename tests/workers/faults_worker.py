"""Faults on purpose, one scenario per run (argv[1]); each rank checks the error it must get.

mismatch  ranks call with different count, dtype, op, root or collective: MismatchError on every
          rank, naming the field and the ranks; the next matched call works.
timeout   the last rank never calls: the others get HFRTimeoutError within the timeout plus a few
          seconds, and the communicator then refuses calls with HFRError; every rank exits.
slow      the last rank calls late: Work.wait(timeout) raises a TimeoutError, the call then finishes.
sigkill   the last rank kills itself in the middle of a large allreduce: the job must end.
"""
import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import hfr

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
last = size - 1
scenario = sys.argv[1]
comm = hfr.Communicator(world, timeout=float(os.environ.get("FAULT_TIMEOUT", "3")))
x = np.arange(1000, dtype=np.float32) + rank


def expect_mismatch(call, field):
    try:
        call()
    except hfr.MismatchError as error:
        assert field in str(error) and f"[{last}]" in str(error), str(error)
    else:
        raise AssertionError(f"rank {rank}: no MismatchError for a different {field}")


if scenario == "mismatch":
    odd = rank == last
    expect_mismatch(lambda: comm.allreduce(np.ones(7 if odd else 8, np.float32)), "count")
    expect_mismatch(lambda: comm.allreduce(np.ones(8, np.float64 if odd else np.float32)), "dtype")
    expect_mismatch(lambda: comm.allreduce(np.ones(8, np.float32), op="max" if odd else "sum"), "op")
    expect_mismatch(lambda: comm.reduce(np.ones(8, np.float32), root=1 if odd else 0), "root")
    expect_mismatch(lambda: comm.broadcast(np.ones(8, np.float32)) if odd else comm.allreduce(np.ones(8, np.float32)),
                    "collective")
    y = comm.allreduce(x.copy())
    assert np.array_equal(y, np.arange(1000, dtype=np.float32) * size + sum(range(size)))
    comm.close()
elif scenario == "timeout":
    waiters = world.Split(color=int(rank != last), key=rank)  # to leave together, after every check
    if rank != last:
        start = time.monotonic()
        try:
            comm.allreduce(x)
        except hfr.HFRTimeoutError as error:
            waited = time.monotonic() - start
            assert waited < comm.timeout + 5, waited
            assert f"[{last}]" in str(error) or "waited" in str(error), str(error)
        else:
            raise AssertionError("no HFRTimeoutError")
        try:
            comm.allreduce(x)
        except hfr.HFRError as error:
            assert "failed earlier" in str(error), str(error)
        else:
            raise AssertionError("a broken communicator took a call")
        comm.close()
        # A file, not a printed line: the launcher may drop output, or kill us, once a peer has left.
        open(os.path.join(os.environ["FAULT_DIR"], f"rank{rank}.ok"), "w").close()
        waiters.Barrier()
    else:
        time.sleep(comm.timeout + 6)
    os._exit(0)  # the peers' MPI state is unknown after a fault: leave without MPI_Finalize
elif scenario == "slow":
    if rank == last:
        time.sleep(2.0)
    work = comm.allreduce_async(x)
    if rank != last:
        try:
            work.wait(timeout=0.2)
        except TimeoutError:
            pass
        else:
            raise AssertionError("wait(timeout) returned before the last rank called")
    assert work.wait(timeout=60) is x
    assert x[1] == size + sum(range(size))
    comm.close()
elif scenario == "sigkill":
    big = np.ones(64 << 20 >> 2, np.float32)
    if rank == last:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    for _ in range(1000):
        comm.allreduce(big)
    raise AssertionError("the allreduce loop outlived the killed peer")
else:
    raise SystemExit(f"unknown scenario {scenario}")
if rank == 0:
    print(f"{scenario} ok", flush=True)
