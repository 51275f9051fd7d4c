"""CUDA arrays' calls in C (hfr/_front.pyx, hfr/_node_call.pyx staging them through hfr/_cuda.pyx) on
machines without a GPU: run with tests/fake_cuda first on PYTHONPATH and its libcuda.so.1 preloaded
(tests/test_staged.py), where device memory is host memory, a copy runs only once its stream or an event
after it is waited for, and the fake driver aborts a copy made without the device's primary context. Each
result is checked element by element against the host path's bits.

argv[1]: "calls" (every path a CUDA call takes, right), or "fail" with argv[2] 1 (rank 0's first copy in
fails) or 2 (its first copy out), argv[3] the count: the failed call, the calls after it on the broken
communicator, then a new communicator's calls, right; or "cancel": a signal handler closes the
communicator while rank 0's call of five chunks waits for peers that never come (its copies in queued):
the call ends cancelled, x untouched, the context popped, then a new communicator's calls right; or
"mismatch": rounds of a call whose count differs on rank 0 (one chunk or several, whole, folded across
nodes), MismatchError on every rank, each followed by a matched call right element by element; or "alone": a
communicator of one rank, whose calls copy on the caller's stream (no engine), blocking and async, every
collective, in place and out of place.
"""
import contextlib
import ctypes
import mmap
import os
import signal
import sys
import time

import cupy
import numpy as np
from mpi4py import MPI

import hfr
from checks import pages, read_only
from hfr.engine import STAGES

assert cupy.__file__.startswith(os.path.dirname(os.path.dirname(__file__))), "not the fake CuPy"
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
driver = ctypes.CDLL("libcuda.so.1")
seed = 0


def values(dtype, count):
    global seed
    seed += 1
    rng = np.random.default_rng([seed, rank])
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def spy(comm, method):
    """The calls that comm's engine hands to method: run_held (every call the front does not run)."""
    calls, run = [], getattr(comm._engine, method)
    setattr(comm._engine, method, lambda call, *rest: (calls.append(call), run(call, *rest))[1])
    return calls


def check_calls(comm, counts, repeat, front=True):
    """Allreduces of CuPy arrays, against the host path: every one in C; with front, the last of each shape
    through the front: any size on one node, one chunk across nodes (it takes those by doubling or halving)."""
    python_calls = spy(comm, "run_held")
    for count in counts:
        for dtype in (np.float32, np.float16, np.int32):
            for op in ("sum", "avg", "max"):
                if op == "avg" and np.dtype(dtype).kind == "i":
                    continue
                for placement in ("in place", "out of place"):
                    for _ in range(repeat):
                        host = values(dtype, count)
                        want = comm.allreduce(host.copy(), op)
                        x = cupy.asarray(host)
                        out = None if placement == "in place" else cupy.asarray(np.full(count, 7, dtype))
                        before = len(python_calls)
                        got = comm.allreduce(x, op, out=out)
                        assert got is (x if out is None else out)
                        assert np.array_equal(cupy.asnumpy(got).view(np.uint8), want.view(np.uint8)), \
                            (rank, count, dtype, op, placement)
                        if out is not None:
                            assert np.array_equal(cupy.asnumpy(x), host), "out of place changed x"
                    several = count * np.dtype(dtype).itemsize > comm._engine.chunk
                    assert several and comm.nnodes > 1 or not front or len(python_calls) == before, \
                        (rank, count, dtype, op, placement, "not the front")


def communicator(**kwargs):
    comm = hfr.Communicator(world, chunk_bytes=256 << 10, **kwargs)
    first = cupy.asarray(np.ones(3, np.float32))  # the engine meets a CUDA array: the front takes them after
    comm.allreduce(first)
    assert (cupy.asnumpy(first) == size).all()
    return comm


mode = sys.argv[1]
if mode == "alone":
    assert size == 1
    comm = hfr.Communicator(world)
    for count in (0, 1, 7, 30001):
        host = values(np.float32, count)
        x = cupy.asarray(host)
        assert comm.allreduce(x) is x and np.array_equal(cupy.asnumpy(x), host), "in place"
        out = cupy.asarray(np.full(count, 7, np.float32))
        assert comm.allreduce(x, "avg", out=out) is out and np.array_equal(cupy.asnumpy(out), host), "out of place"
        out = cupy.asarray(np.full(count, 7, np.float32))
        assert comm.allreduce_async(x, "max", out=out).wait() is out and np.array_equal(cupy.asnumpy(out), host)
        for collective in ("reduce_scatter", "allgather"):
            out = cupy.asarray(np.full(count, 7, np.float32))
            assert getattr(comm, collective)(x, out) is out and np.array_equal(cupy.asnumpy(out), host), collective
        out = cupy.asarray(np.full(count, 7, np.float32))
        assert comm.reduce(x, 0, out=out) is out and np.array_equal(cupy.asnumpy(out), host), "reduce"
        assert comm.broadcast(x) is x and np.array_equal(cupy.asnumpy(x), host), "broadcast"
    comm.close()
    print("rank 0: staged alone ok", flush=True)
elif mode == "calls":
    comm = communicator()
    # 1024 float32: the largest whole call (its result through the rank's staging); 30001: the result slot;
    # 300007: several chunks (float32 five, more than the stages), on the Communicator's own streams
    front = comm.nnodes == 1 or os.environ.get("HFR_ALGO", "auto") == "auto"
    check_calls(comm, (1, 7, 1024, 1025, 3001, 30001, 300007), 1 if comm.nnodes == 1 else 4, front)
    # reduce_scatter, reduce, allgather and broadcast in C through the engine; async calls (on the engine's
    # streams); several chunks
    for count in (0, 1, 7, 257, 3001, 75 * mmap.PAGESIZE // 4, 300007):
        host = values(np.float32, count)
        want = comm.allgather(host.copy(), np.empty(count * size, np.float32))
        got = comm.allgather(cupy.asarray(host), cupy.asarray(np.full(count * size, 7, np.float32)))
        assert np.array_equal(cupy.asnumpy(got), want), ("allgather", count)
        # in place (x at its shard of out, as FSDP2 gathers), that shard left alone: read-only where it is whole
        # pages (75 of them: shards across chunks of 256 KiB)
        guarded = count > 0 and count * 4 % mmap.PAGESIZE == 0
        whole = cupy.ndarray(pages(count * size * 4).view(np.float32) if guarded else np.empty(count * size, "f4"))
        whole[:] = 7
        whole[rank * count : (rank + 1) * count] = cupy.asarray(host)
        with read_only(whole.a[rank * count : (rank + 1) * count]) if guarded else contextlib.nullcontext():
            assert comm.allgather(whole[rank * count : (rank + 1) * count], whole) is whole
        assert np.array_equal(cupy.asnumpy(whole), want), ("allgather in place", count)
        host = values(np.float32, count)  # every rank's differs: the root's is broadcast
        want = comm.broadcast(host.copy(), root=size - 1)
        got = comm.broadcast(cupy.asarray(host), root=size - 1)
        assert np.array_equal(cupy.asnumpy(got), want), ("broadcast", count)
        host = values(np.float32, count * size)
        want = comm.reduce_scatter(host.copy(), np.empty(count, np.float32))
        got = comm.reduce_scatter(cupy.asarray(host), cupy.asarray(np.full(count, 7, np.float32)))
        assert np.array_equal(cupy.asnumpy(got), want), ("reduce_scatter", count)
        host = values(np.float32, count)
        want = comm.reduce(host.copy(), root=size - 1)
        got = comm.reduce(cupy.asarray(host), root=size - 1)
        assert rank != size - 1 or np.array_equal(cupy.asnumpy(got), want), ("reduce", count)
        want = comm.allreduce(host.copy())
        got = comm.allreduce_async(cupy.asarray(host)).wait(timeout=60)
        assert np.array_equal(cupy.asnumpy(got), want), ("async", count)
    # one call, rank 0's array on the host and the others' on the device: every rank cuts it into the same
    # chunks (cache chunks of 256 KiB where the host's ranks fit its cores: HFR_CACHE_BYTES), whichever path
    # runs it, a host array's call or a CUDA array's staged one
    os.environ["HFR_CACHE_BYTES"] = "2M"
    kinds = communicator()
    del os.environ["HFR_CACHE_BYTES"]
    for count in (7, 100003, 300007):  # one cache chunk, two, five
        host = values(np.float32, count)
        want = kinds.allreduce(host.copy())
        got = kinds.allreduce(host.copy() if rank == 0 else cupy.asarray(host))
        assert np.array_equal(got if rank == 0 else cupy.asnumpy(got), want), ("host and device", count)
    kinds.close()
    comm.close()
    assert driver.fake_copies() > 0 and driver.fake_depth() == 0, (driver.fake_copies(), driver.fake_depth())
    print(f"rank {rank}: staged calls ok", flush=True)
elif mode == "mismatch":
    comm = communicator(timeout=30)
    for round_ in range(12):
        count = (7, 3001, 300007)[round_ % 3]
        mine = count + (round_ % 2 + 1 if rank == 0 else 0)  # rank 0's count differs
        host = values(np.float32, mine)
        x = cupy.asarray(host)
        try:
            comm.allreduce(x)
        except hfr.MismatchError:
            pass
        else:
            raise AssertionError(f"rank {rank}: a call of {mine} elements beside others' {count} ran")
        assert np.array_equal(cupy.asnumpy(x), host), "a mismatched call changed x"
        host = values(np.float32, count)
        want = comm.allreduce(host.copy())
        got = comm.allreduce(cupy.asarray(host))
        assert np.array_equal(cupy.asnumpy(got), want), (rank, round_, count, "the call after a mismatch")
    comm.close()
    print(f"rank {rank}: mismatch rounds ok", flush=True)
elif mode == "cancel":
    comm = communicator(timeout=60)
    if rank == 0:
        def close_on_alarm(signum, frame):
            comm.close()

        signal.signal(signal.SIGALRM, close_on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        host = values(np.float32, 300007)  # five chunks: three copies in queued before the call check
        x = cupy.asarray(host)
        start = time.monotonic()
        try:
            comm.allreduce(x)
        except hfr.HFRError as error:
            assert "cancelled" in str(error), error
        else:
            raise AssertionError("rank 0's call ended though no peer came")
        assert time.monotonic() - start < 3, time.monotonic() - start
        assert np.array_equal(cupy.asnumpy(x), host), "a cancelled call changed x"
        assert driver.fake_depth() == 0
    else:
        time.sleep(1.0)
        start = time.monotonic()
        comm.close()  # beside a peer that closed broken: no collective free, and no wait for it on the rail
        assert time.monotonic() - start < 5, f"rank {rank}: close() took {time.monotonic() - start:.1f} s"
    world.Barrier()
    fresh = communicator()
    check_calls(fresh, (7, 300007), 1 if fresh.nnodes == 1 else 4)
    fresh.close()
    print(f"rank {rank}: cancelled call ok", flush=True)
elif mode == "fail":
    step, count = int(sys.argv[2]), int(sys.argv[3])
    comm = communicator(timeout=3)
    host = values(np.int32, count).astype(np.float32)  # small integers: every sum exact, in any order
    want = world.allreduce(host.copy())  # MPI's, for ranks whose call ends right
    x = cupy.asarray(host)
    if rank == 0:  # a chunk's copy in is one copy, as is its copy out; the first STAGES chunks' copies in come first
        chunks = len(comm._engine._node_call.chunks(count, 4))
        os.environ["FAKE_CUDA_FAIL_AT"] = str(driver.fake_copies() + (1 if step == 1 else min(chunks, STAGES) + 1))
    start = time.monotonic()
    try:
        got = comm.allreduce(x)
    except hfr.HFRError as error:
        assert comm._engine.front.broken is not None
        if rank == 0:
            assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(error), error
            assert ("copying x to the host" if step == 1 else "copying the result to the device") in str(error), error
            if step == 1:
                assert np.array_equal(cupy.asnumpy(x), host), "a failed copy in changed x"
        else:  # at once: rank 0's node from its CLOSING word; other nodes from their rails, or a node peer that heard
            named = ("rank 0 of this node failed",) if 0 in comm._engine.layout.node_ranks else \
                ("ranks [0] of other nodes failed", "of this node failed")
            assert any(n in str(error) for n in named) and not isinstance(error, hfr.HFRTimeoutError), error
            assert time.monotonic() - start < 2, f"{time.monotonic() - start:.1f} s after rank 0's failure"
    else:
        assert rank != 0 and step == 2, "the failing rank's call ended"  # the others were done with rank 0
        assert np.array_equal(cupy.asnumpy(got), want), "right though rank 0 failed"
    os.environ.pop("FAKE_CUDA_FAIL_AT", None)
    assert driver.fake_depth() == 0
    try:  # the call after: refused on rank 0 (broken), timed out or refused on the others
        comm.allreduce(cupy.asarray(values(np.float32, count)))
    except hfr.HFRError:
        pass
    else:
        raise AssertionError(f"rank {rank}: a call after rank 0's failure ran")
    comm.close()
    world.Barrier()
    fresh = communicator()  # a new communicator: normal calls, element by element
    check_calls(fresh, (7, count), 1 if fresh.nnodes == 1 else 4)
    fresh.close()
    print(f"rank {rank}: failed copy {step} ok", flush=True)
