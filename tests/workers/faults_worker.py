"""Faults on purpose, one scenario per run (argv[1]); each rank checks the error it must get.

mismatch  ranks call with different count, dtype, op, root or collective: MismatchError on every
          rank, naming the field and the ranks; the next matched call works. A reduce_scatter or
          allgather whose sizes are not n x k raises ValueError on every rank, arrays untouched.
refusal   a check that holds on some ranks only (x writable where it receives: the root of reduce, the
          non-roots of broadcast), and a bad argument on one rank only, blocking and behind async calls:
          the refusing rank raises its error, the others MismatchError naming it; the next call is right.
rounds    argv[2] rounds of a mismatch (a whole node differing, or one rank) then a matched call that
          one rank joins late, every element checked: the call after a failure is where state bugs hide.
          With FAULT_ARRAY=cupy on CuPy arrays (tests/test_cupy.py).
timeout   the last rank never calls argv[2] (allreduce by default): the others get HFRTimeoutError within the timeout plus a few
          seconds, naming the last rank (across nodes too), and the communicator then refuses calls with HFRError; every rank exits. With argv[2]
          "rail" (nodes of one rank) the last rank calls allreduce but leaves out its step on the rail
          after the call check's vote: the others time out in that step (in C), naming it; with "vote",
          a call small enough to send its data with the vote, the last rank leaves out the vote itself.
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
    # 64 KiB, whose data goes with the call check's vote across nodes, against 4 bytes more, which does not
    expect_mismatch(lambda: comm.allreduce(np.ones(16385 if odd else 16384, np.float32)), "count")
    expect_mismatch(lambda: comm.allreduce(np.ones(8, np.float64 if odd else np.float32)), "dtype")
    expect_mismatch(lambda: comm.allreduce(np.ones(8, np.float32), op="max" if odd else "sum"), "op")
    expect_mismatch(lambda: comm.reduce(np.ones(8, np.float32), root=1 if odd else 0), "root")
    expect_mismatch(lambda: comm.broadcast(np.ones(8, np.float32)) if odd else comm.allreduce(np.ones(8, np.float32)),
                    "collective")
    ones, gathered = np.ones(8, np.float32), np.zeros(8 * size, np.float32)
    expect_mismatch(lambda: comm.allgather(ones, gathered) if odd else comm.allreduce(ones.copy()), "collective")
    expect_mismatch(lambda: comm.reduce_scatter(gathered[: (7 if odd else 8) * size], ones[: 7 if odd else 8]), "count")
    before = gathered.copy()
    for call in (lambda: comm.reduce_scatter(gathered[:-1], ones), lambda: comm.allgather(ones, gathered[:-1])):
        try:
            call()
        except ValueError as error:
            assert f"over {size} ranks needs" in str(error) and f"has {8 * size - 1}" in str(error), str(error)
        else:
            raise AssertionError("a size that is not n x k was taken")
    assert np.array_equal(gathered, before) and np.array_equal(ones, np.ones(8, np.float32))
    y = comm.allreduce(x.copy())
    assert np.array_equal(y, np.arange(1000, dtype=np.float32) * size + sum(range(size)))
    comm.close()
elif scenario == "refusal":
    def expect_refused(call, error_type, fragment):
        try:
            call()
        except hfr.MismatchError as error:
            assert rank != last and f"ranks [{last}] refused the call" in str(error), str(error)
        except error_type as error:
            assert rank == last and fragment in str(error), str(error)
        else:
            raise AssertionError(f"rank {rank}: the call went through")

    read_only = np.full(10, 100, np.float32)
    read_only.flags.writeable = False
    want = np.arange(10, dtype=np.float32) * size + size * (size - 1) / 2
    for _ in range(2):
        expect_refused(lambda: comm.reduce(read_only, root=last), ValueError, "x is read-only")
        y = np.arange(10, dtype=np.float32) + rank
        assert comm.reduce(y, root=last) is y and np.array_equal(y, want if rank == last else want * 0 + y), y
        writable = np.full(10, 100, np.float32)  # read-only on the last rank alone, which receives
        expect_refused(lambda: comm.broadcast(read_only if rank == last else writable, root=0), ValueError, "read-only")
        assert (writable == 100).all(), writable
        y = np.arange(10, dtype=np.float32) + rank
        assert np.array_equal(comm.broadcast(y, root=0), np.arange(10, dtype=np.float32)), y
        # beside a real call of nothing (the refusal's own stand-in is an empty uint8 array): a mismatch still
        expect_refused(lambda: comm.allreduce(read_only if rank == last else np.empty(0, np.uint8)), ValueError,
                       "x is read-only")
    # a bad argument on one rank, behind async calls: it takes its turn after them
    works = [comm.allreduce_async(np.ones(4096, np.float32) * (i + rank)) for i in range(3)]
    expect_refused(lambda: comm.allreduce_async([1.0] if rank == last else np.ones(10, np.float32)).wait(),
                   TypeError, "numpy.ndarray or cupy.ndarray")
    for i, work in enumerate(works):
        assert (work.wait() == i * size + size * (size - 1) / 2).all()
    y = np.arange(10, dtype=np.float32) + rank
    assert np.array_equal(comm.allreduce(y), want), y
    print("refusal ok", flush=True)
    comm.close()
elif scenario == "rounds":
    layout = f"{comm.nnodes} x {comm.local_size}"
    on_device = on_host = np.asarray
    if os.environ.get("FAULT_ARRAY") == "cupy":
        import cupy

        cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
        on_device, on_host = cupy.asarray, cupy.asnumpy
    wrong = 0
    for r in range(int(sys.argv[2])):
        count = 1 + (r * 7919) % (3 << 16)  # one chunk to a few, odd sizes
        # Ranks differ by node (each node agrees within) or one rank differs; op, count or collective.
        odd = comm.node == r % comm.nnodes if r % 2 and comm.nnodes > 1 else rank == r % size
        kind = ("op", "count", "collective")[r % 3]
        a = on_device(np.ones(count + (kind == "count" and odd), np.float32))
        try:
            if kind == "collective" and odd:
                comm.broadcast(a)
            else:
                comm.allreduce(a, op="max" if kind == "op" and odd else "sum")
        except hfr.MismatchError as error:
            assert kind in str(error), str(error)
        else:
            raise AssertionError(f"rank {rank}: round {r}: no MismatchError for a different {kind}")
        if rank == (r * 5 + 1) % size:
            time.sleep(0.02)  # a late rank: the others must wait for its data, not reduce stale slots
        y = on_device((np.arange(count) % 251 + rank + 1).astype(np.float32))
        out = on_device(np.full(count, np.nan, np.float32))
        if r % 4 == 3:
            comm.allreduce_async(y, out=out).wait()
        else:
            comm.allreduce(y, out=out)
        out = on_host(out)
        want = (np.arange(count) % 251) * size + size * (size + 1) // 2
        bad = int((out != want).sum())
        if bad:
            print(f"rank {rank} ({layout}): round {r} ({kind}, {count} elements): {bad} wrong, "
                  f"e.g. {out[out != want][:3]}", flush=True)
        wrong += bad
    wrong = world.allreduce(wrong)
    assert wrong == 0, f"{wrong} wrong elements on {layout}"
    comm.close()
elif scenario == "timeout":
    waiters = world.Split(color=int(rank != last), key=rank)  # to leave together, after every check
    collective = sys.argv[2] if len(sys.argv) > 2 else "allreduce"
    calls = {"allreduce": lambda: comm.allreduce(x), "rail": lambda: comm.allreduce(np.ones(1 << 15, np.float32)),
             "vote": lambda: comm.allreduce(x),
             "reduce_scatter": lambda: comm.reduce_scatter(np.ones(10 * size, np.float32), np.empty(10, np.float32)),
             "allgather": lambda: comm.allgather(np.ones(10, np.float32), np.empty(10 * size, np.float32))}
    if rank != last:
        start = time.monotonic()
        try:
            calls[collective]()
        except hfr.HFRTimeoutError as error:
            waited = time.monotonic() - start
            assert waited < comm.timeout + 5, waited
            if collective == "rail":
                assert "allreduce (halving) timed out waiting for" in str(error), str(error)
            elif collective == "vote":
                assert "the call check's vote timed out waiting for" in str(error), str(error)
            assert f"ranks [{last}]" in str(error), str(error)  # the rank that never came, also across nodes
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
        if collective in ("rail", "vote"):
            schedules = comm._engine._rail_schedules
            comm._engine._rail_schedules = lambda call, stage: (  # (vote, rails, folded, in_out)
                (schedules(call, stage)[0], [None], False, False) if collective == "rail"
                else (None, None, False, False))
            calls[collective]()
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
