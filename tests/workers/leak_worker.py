"""10,000 calls of random sizes, sync and async: RSS, open file descriptors and /dev/shm stay flat.

argv: [calls] [numpy|cupy]; with cupy the arrays live on the GPU, so the segment's page-locking and
the CUDA copies and events are exercised too (GPU memory in use must stay flat as well)."""
import os
import sys

import numpy as np
from mpi4py import MPI

import hfr

world = MPI.COMM_WORLD
calls = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
kind = sys.argv[2] if len(sys.argv) > 2 else "numpy"
if kind == "cupy":
    import cupy as xp

    xp.cuda.Device(world.rank % xp.cuda.runtime.getDeviceCount()).use()
else:
    xp = np
rng = np.random.default_rng(7)  # the same sizes on every rank
comm = hfr.Communicator(world, chunk_bytes=64 << 10)
arrays = [xp.ones(n, np.float32) for n in (0, 1, 100, 5000, 70000)]


def usage():
    rss_kib = int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1])
    gpu_used = xp.cuda.runtime.memGetInfo()[1] - xp.cuda.runtime.memGetInfo()[0] if kind == "cupy" else 0
    return rss_kib, len(os.listdir("/proc/self/fd")), len(os.listdir("/dev/shm")), gpu_used


samples = {}
pending = []
for i in range(calls):
    x = arrays[rng.integers(len(arrays))]
    if rng.random() < 0.5:
        comm.allreduce(x, op="max")
    else:
        pending.append(comm.allreduce_async(x, op="max"))
        if len(pending) > 8:
            [w.wait(timeout=60) for w in pending]
            pending.clear()
    if i + 1 in (calls // 10, calls):
        [w.wait(timeout=60) for w in pending]
        pending.clear()
        samples[i + 1] = usage()
comm.close()
(rss0, fds0, shm0, gpu0), (rss1, fds1, shm1, gpu1) = samples[calls // 10], samples[calls]
assert fds1 == fds0, f"open file descriptors grew from {fds0} to {fds1}"
assert shm1 == shm0, f"/dev/shm entries grew from {shm0} to {shm1}"
assert rss1 - rss0 < 8 * 1024, f"RSS grew by {rss1 - rss0} KiB over {calls - calls // 10} calls"
assert gpu1 - gpu0 < 8 << 20, f"GPU memory in use grew by {gpu1 - gpu0} bytes"
if world.rank == 0:
    print(f"flat after {calls} {kind} calls: RSS {rss0}->{rss1} KiB, fds {fds0}->{fds1}, /dev/shm {shm0}->{shm1}")
