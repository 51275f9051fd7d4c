"""Allreduce across hosts made of network namespaces, then a cut link (tests/test_multihost.py).

argv: HOSTS RANKS_PER_HOST [LOOP]. Every rank
 1. checks that hfr's nodes are the hosts (MPI's COMM_TYPE_SHARED split, no HFR_LOCAL_SIZE);
 2. allreduces a few arrays across them and checks the results (sums and max; small arrays cross nodes
    by recursive doubling, the larger ones by the double binary tree in chunks; HFR_ALGO may force one);
 3. prints "ready", then loops allreduces while the test takes one host's data link down: LOOP
    "mixed" (the default) takes 4 MiB of float32 (ring) and 8 KiB of int64 (doubling) by turns,
    "small" only the int64 ones;
 4. must get hfr.HFRError (HFRTimeoutError) within the communicator's timeout plus a few seconds of
    its last finished call, prints "rank R: <error type> after S s: <message>", checks that the
    communicator then refuses calls, and leaves with os._exit(0) (no MPI_Finalize: the peers' MPI state
    is unknown after the cut) once every rank has reported.
Every rank writes what it reports, and how far it got, to files in MULTIHOST_DIR (the test's).
A loop that runs past LOOP_LIMIT_S raises, which aborts the job.
"""
import faulthandler
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import hfr

LOOP_LIMIT_S = 40.0
GRACE_S = 5.0  # beyond the timeout, for the error to reach the caller

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
hosts, per_host = int(sys.argv[1]), int(sys.argv[2])
loop = sys.argv[3] if len(sys.argv) > 3 else "mixed"
assert loop in ("mixed", "small"), loop
assert size == hosts * per_host, (size, hosts, per_host)

comm = hfr.Communicator(world, timeout=float(os.environ.get("MULTIHOST_TIMEOUT", "5")))
assert (comm.nnodes, comm.local_size) == (hosts, per_host), \
    f"rank {rank}: hfr sees {comm.nnodes} nodes of {comm.local_size}, expected {hosts} of {per_host}"
assert comm.node == rank // per_host, (rank, comm.node)


def expected_sum(n, dtype):
    return (np.arange(n) * size + size * (size - 1) // 2).astype(dtype)


for n in (1, 7, 4099, 300007):
    for dtype in (np.float32, np.int64):
        x = (np.arange(n) + rank).astype(dtype)
        comm.allreduce(x)
        assert np.array_equal(x, expected_sum(n, dtype)), f"rank {rank}: wrong sum of {n} {dtype.__name__}"
y = comm.allreduce(np.full(1000, rank, np.int32), op="max", out=np.empty(1000, np.int32))
assert (y == size - 1).all(), y[:4]
print(f"rank {rank} on {MPI.Get_processor_name()}: node {comm.node}/{comm.nnodes}, "
      f"local rank {comm.local_rank}/{comm.local_size}: sums correct; ready", flush=True)

# Where this rank leaves its error, its count of calls done and, should a call near its error's deadline, a
# fatal signal come or the test send SIGUSR1, where every thread of it stood (MULTIHOST_DIR): files the test
# reads, should a line of ours not reach the launcher's output.
report_dir = os.environ["MULTIHOST_DIR"]
trace = open(os.path.join(report_dir, f"rank{rank}.trace"), "w")
progress = os.open(os.path.join(report_dir, f"rank{rank}.progress"), os.O_WRONLY | os.O_CREAT)
faulthandler.enable(file=trace, all_threads=True)
faulthandler.register(signal.SIGUSR1, file=trace, all_threads=True)
big = np.empty(1 << 20, np.float32)  # 4 MiB: ring (auto, <= 4 nodes), in chunks
small = np.empty(1 << 10, np.int64)  # 8 KiB of integers: doubling
calls, start = 0, time.monotonic()
last_done = start
while True:
    if time.monotonic() - start > LOOP_LIMIT_S:
        raise AssertionError(f"rank {rank}: {calls} allreduces in {LOOP_LIMIT_S} s and no error: "
                             "the link was not cut, or the cut went unnoticed")
    x = big if loop == "mixed" and calls % 2 == 0 else small
    x[...] = calls % 1000 + rank  # a result left from another call would not pass
    faulthandler.dump_traceback_later(comm.timeout + GRACE_S - 1, exit=False, file=trace)
    try:
        comm.allreduce(x)
    except hfr.HFRError as error:
        faulthandler.cancel_dump_traceback_later()
        waited = time.monotonic() - last_done
        report = f"rank {rank}: {type(error).__name__} after {waited:.1f} s ({calls} calls in the loop): {error}"
        with open(os.path.join(report_dir, f"rank{rank}.error"), "w") as f:
            f.write(f"{time.time():.3f} {report}\n")
        print(report, flush=True)
        assert waited < comm.timeout + GRACE_S, f"rank {rank}: the error took {waited:.1f} s"
        break
    assert (x == size * (calls % 1000) + size * (size - 1) // 2).all(), f"rank {rank}: a wrong sum: {x[:4]}"
    calls += 1
    last_done = time.monotonic()
    os.pwrite(progress, f"{calls} calls in the loop, the last done at {time.time():.3f}\n".encode(), 0)

try:
    comm.allreduce(small)
except hfr.HFRError as error:
    assert "failed earlier" in str(error), str(error)
else:
    raise AssertionError(f"rank {rank}: a broken communicator took a call")
comm.close()  # nothing collective after a failure
print(f"rank {rank} done", flush=True)
# Hydra kills a job's ranks once one of them leaves without MPI_Finalize, so leave only once every rank has
# left its error (a rank whose wait began later may report a second after us), or by the latest a rank may.
deadline = last_done + comm.timeout + GRACE_S
while (time.monotonic() < deadline
       and not all(os.path.exists(os.path.join(report_dir, f"rank{r}.error")) for r in range(size))):
    time.sleep(0.05)
time.sleep(0.2)  # let the proxy forward the lines above: hydra can drop what a rank prints as it exits
os._exit(0)
