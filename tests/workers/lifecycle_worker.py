"""Faults around making and closing a Communicator, and failures that are not hfr's own; one scenario
per run (argv[1]). The last rank is the odd one out; every rank checks what it must get, then leaves a
file FAULT_DIR/rankN.ok (a printed line may be lost once a peer has left the job).

settings  the last rank has a bad HFR_ALGO, then another chunk size, then another HFR_ALGO, then a bad
          HFR_CACHE_BYTES: an error on every rank each time, never a hang; then a good Communicator works
          (its ranks' HFR_CACHE_BYTES differing).
absent    the last rank never makes its first call: hfr.allreduce (the default Communicator) gives
          HFRTimeoutError on the others within the timeout + 5 s.
close     the last rank's communicator fails (it alone calls, and times out); the others' close() then
          returns at once instead of entering the window's collective free without it.
foreign   a failure that is not hfr's (MemoryError in the engine) reaches Work.wait() as an HFRError
          whose __cause__ is the original; the communicator then refuses calls; the others fail at once,
          those of its node naming it, those of other nodes naming it (its rail told them) or a rank of
          their node that failed so.
gone      the last rank closes its communicator while the others make a call it never makes: the others
          fail at once, those of its node naming it, those of other nodes naming it (their rails told them)
          or a rank of their node that failed so; then a new Communicator's calls are right, element by
          element.
race      a call that passed its checks just before close() ran is refused (HFRError), never "done"
          with the caller's own input; so is a call made while close() runs; a call counted in and
          never out (Ctrl-C at the wrong moment) holds close() up for the timeout at most.
interrupt a signal handler that raises (Ctrl-C's KeyboardInterrupt) during a call waiting in C for a
          peer that never comes ends the call at once with that exception, not after the timeout.
held      the same while a call admitted to run on its caller's thread waits for the running lock
          (held by another thread): the call ends with that exception, having changed nothing, and
          the communicator's next call is right.
inflight  rank 0 closes while a blocking call of another of its threads waits for a late peer: close()
          waits for that call, which ends right, before it frees the segment.
closerace argv[2] rounds of close() racing a call on another thread (allreduce_async + wait, and the
          blocking allreduce, by turns), Python switching threads every microsecond: every close()
          returns within the timeout, every call either ends right or raises HFRError, x untouched
          where it was refused.
cancel    a signal handler calls close() while its thread's call waits for a peer that never comes:
          close() returns at once,
          the call ends with HFRError (cancelled) soon after, the communicator refuses calls; then
          a new Communicator's call is right on every rank.
"""
import os
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import hfr
from checks import expect

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
last = size - 1
scenario = sys.argv[1]
TIMEOUT = float(os.environ.get("FAULT_TIMEOUT", "3"))


def done():
    open(os.path.join(os.environ["FAULT_DIR"], f"rank{rank}.ok"), "w").close()


if scenario == "settings":
    if rank == last:
        os.environ["HFR_ALGO"] = "fastest"
        expect(ValueError, "HFR_ALGO='fastest'", lambda: hfr.Communicator(world, timeout=TIMEOUT))
        os.environ["HFR_ALGO"] = "auto"
    else:
        expect(ValueError, f"rank {last} cannot make the hfr.Communicator: ValueError: HFR_ALGO='fastest'",
               lambda: hfr.Communicator(world, timeout=TIMEOUT))
    expect(ValueError, "chunk_bytes must be the same on every rank",
           lambda: hfr.Communicator(world, timeout=TIMEOUT, chunk_bytes=8192 if rank == last else 4096))
    os.environ["HFR_ALGO"] = "ring" if rank == last else "auto"
    expect(ValueError, "HFR_ALGO must be the same on every rank", lambda: hfr.Communicator(world, timeout=TIMEOUT))
    os.environ["HFR_ALGO"] = "auto"
    if rank == last:
        os.environ["HFR_CACHE_BYTES"] = "lots"
    expect(ValueError, "HFR_CACHE_BYTES='lots' is not a number of bytes", lambda: hfr.Communicator(world, timeout=TIMEOUT))
    os.environ["HFR_CACHE_BYTES"] = str(rank << 20)  # ranks may differ: a node plans for the least
    with hfr.Communicator(world, timeout=TIMEOUT) as comm:
        x = np.arange(1000, dtype=np.float32) + rank
        assert np.array_equal(comm.allreduce(x), np.arange(1000, dtype=np.float32) * size + size * (size - 1) / 2)
    done()
elif scenario == "absent":
    os.environ["HFR_TIMEOUT"] = str(TIMEOUT)  # the default Communicator's
    waiters = world.Split(color=int(rank != last), key=rank)  # to leave together, after every check
    if rank != last:
        start = time.monotonic()
        expect(hfr.HFRTimeoutError, "some rank never came", lambda: hfr.allreduce(np.ones(10, np.float32)))
        assert time.monotonic() - start < TIMEOUT + 5, time.monotonic() - start
        done()
        waiters.Barrier()
    else:
        time.sleep(TIMEOUT + 6)
    os._exit(0)  # the absent rank's allgather is abandoned: leave without MPI_Finalize
elif scenario == "close":
    comm = hfr.Communicator(world, timeout=TIMEOUT)
    if rank == last:
        expect(hfr.HFRTimeoutError, "waited", lambda: comm.allreduce(np.ones(10, np.float32)))
    world.Barrier()  # every peer of the node now closes beside a failed one
    start = time.monotonic()
    comm.close()
    assert time.monotonic() - start < TIMEOUT + 5, time.monotonic() - start
    done()
    world.Barrier()  # no rank leaves (ending the job) before every rank has left its file
    os._exit(0)
elif scenario == "foreign":
    comm = hfr.Communicator(world, timeout=TIMEOUT)
    n = 4096
    if rank == last:
        def no_memory(*args):
            raise MemoryError("no memory for the rail's schedules (injected)")

        comm._engine._rails = no_memory  # a step in Python before the call runs in C
        error = expect(hfr.HFRError, "MemoryError: no memory",
                       lambda: comm.allreduce_async(np.ones(n, np.float32), out=np.empty(n, np.float32)).wait())
        assert isinstance(error.__cause__, MemoryError), repr(error.__cause__)
        expect(hfr.HFRError, "failed earlier", lambda: comm.allreduce(np.ones(10, np.float32)))
    else:  # on the node's counters, or on the rail, whose failed peers tell it: the failure is seen at once
        start = time.monotonic()
        error = expect(hfr.HFRError, "", lambda: comm.allreduce(np.ones(n, np.float32), out=np.empty(n, np.float32)))
        named = (f"rank {last} of this node failed",) if last in comm._engine.layout.node_ranks else \
            (f"ranks [{last}] of other nodes failed or closed", "of this node failed")
        assert any(n in str(error) for n in named) and not isinstance(error, hfr.HFRTimeoutError), error
        assert time.monotonic() - start < TIMEOUT / 2, time.monotonic() - start
    done()
    world.Barrier()  # hfr works on its own Dup; an early exit would make the launcher end the others
    os._exit(0)
elif scenario == "gone":
    comm = hfr.Communicator(world, timeout=TIMEOUT)
    if rank == last:
        assert not comm.close()  # not freed: its peers failed, so none frees the segment with it
    else:
        start = time.monotonic()
        x = np.ones(5000, np.float32)
        if last in comm._engine.layout.node_ranks:
            expect(hfr.HFRError, f"rank {last} of this node closed its communicator", lambda: comm.allreduce(x))
        else:
            error = expect(hfr.HFRError, "", lambda: comm.allreduce(x))
            assert f"ranks [{last}] of other nodes failed or closed" in str(error) or "of this node failed" in str(error), \
                error
        assert time.monotonic() - start < TIMEOUT / 2, time.monotonic() - start
        assert (x == 1).all(), "a failed call changed x"
        comm.close()
    world.Barrier()
    with hfr.Communicator(world, timeout=TIMEOUT) as fresh:
        for n in (1, 7, 5000, 300007):
            x = np.arange(n, dtype=np.float32) % 1000 + rank
            want = (np.arange(n, dtype=np.float64) % 1000) * size + size * (size - 1) / 2
            assert np.array_equal(fresh.allreduce(x), want.astype(np.float32)), n
    done()
elif scenario == "race":
    comm = hfr.Communicator(world, timeout=TIMEOUT)
    checks = comm._check_open
    comm._check_open = lambda: None  # as if this call had passed its checks just before close() ran
    comm.close()
    x = np.ones(10, np.float32)
    expect(hfr.HFRError, "closed", lambda: comm.allreduce(x))
    assert (x == 1).all()
    comm._check_open = checks
    expect(hfr.HFRError, "closed", lambda: comm.allreduce(x))
    # A call made while close() runs (here: from within the engine's close, as if another thread's came then)
    comm = hfr.Communicator(world, timeout=TIMEOUT)
    engine_close, late = comm._engine.close, []

    def close_after_a_late_call():
        late.append(expect(hfr.HFRError, "closed", lambda: comm.allreduce(x)))
        return engine_close()

    comm._engine.close = close_after_a_late_call
    comm.close()
    assert late and (x == 1).all(), x
    # A call counted in but never counted out (as Ctrl-C between admission and the call's own cleanup
    # would leave it): close() gives up on it after the timeout, without the collective free
    comm = hfr.Communicator(world, timeout=TIMEOUT)
    comm._engine.front.admit(False)
    start = time.monotonic()
    comm.close()
    assert time.monotonic() - start < TIMEOUT + 1, time.monotonic() - start
    done()
elif scenario == "inflight":
    comm = hfr.Communicator(world, timeout=TIMEOUT)
    x = np.ones(1000, np.float32)
    if rank == 0:
        results = []
        caller = threading.Thread(target=lambda: results.append(comm.allreduce(x)))
        caller.start()
        time.sleep(0.3)  # the call waits in C for the others
        comm.close()
        caller.join()
        assert len(results) == 1 and (x == size).all(), x[:4]
    else:
        time.sleep(1.0)
        comm.allreduce(x)
        comm.close()
        assert (x == size).all()
    done()
elif scenario == "interrupt":
    import signal

    comm = hfr.Communicator(world, timeout=60)
    if rank == 0:
        def interrupt(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        start = time.monotonic()
        expect(KeyboardInterrupt, "", lambda: comm.allreduce(np.ones(10, np.float32)))
        assert time.monotonic() - start < 5, f"the interrupt took {time.monotonic() - start:.1f} s"
    done()
    world.Barrier()
    os._exit(0)
elif scenario == "held":
    import signal

    comm = hfr.Communicator(world, timeout=60)
    if rank == 0:  # a call admitted to run here waits for the running lock, which another call holds
        holder = threading.Thread(target=comm._engine.front.hold)
        holder.start()
        holder.join()

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        start = time.monotonic()
        x = np.ones(10, np.float32)
        expect(KeyboardInterrupt, "", lambda: comm.allreduce(x))
        assert time.monotonic() - start < 5, f"the interrupt took {time.monotonic() - start:.1f} s"
        assert (x == 1).all(), x
        comm._engine.front.release()  # as the holder would once its call ended
    x = np.arange(10, dtype=np.float32) + rank  # the call never started: the next one is the first, on every rank
    assert np.array_equal(comm.allreduce(x), np.arange(10, dtype=np.float32) * size + size * (size - 1) / 2), x
    comm.close()
    done()
elif scenario == "closerace":
    sys.setswitchinterval(1e-6)
    expected = np.full(7, size * (size + 1) / 2, np.float32)
    for i in range(int(sys.argv[2])):
        world.Barrier()  # a rank whose call timed out beside a refused one comes late to the next round
        comm = hfr.Communicator(world, timeout=TIMEOUT, chunk_bytes=4096)
        x, outcome = np.full(7, rank + 1, np.float32), []

        def call():
            try:
                outcome.append(comm.allreduce_async(x).wait() if i % 2 else comm.allreduce(x))
            except hfr.HFRError as error:
                outcome.append(error)

        caller = threading.Thread(target=call)
        caller.start()
        start = time.monotonic()
        comm.close()
        assert time.monotonic() - start < TIMEOUT + 1, f"round {i}: close() took {time.monotonic() - start:.1f} s"
        caller.join(TIMEOUT + 5)
        assert not caller.is_alive(), f"round {i}: the call never ended"
        got = outcome[0]
        if isinstance(got, hfr.HFRError):
            assert any(w in str(got) for w in ("closed", "waited", "failed earlier")), f"round {i}: {got!r}"
            if "closed" in str(got):
                assert (x == rank + 1).all(), f"round {i}: a refused call changed x: {x}"
        else:
            assert got is x and np.array_equal(x, expected), f"round {i}: {x}"
    done()
elif scenario == "cancel":
    import signal

    comm = hfr.Communicator(world, timeout=60)
    if rank == 0:
        closing = []

        def close_on_alarm(signum, frame):
            start = time.monotonic()
            comm.close()
            closing.append(time.monotonic() - start)

        signal.signal(signal.SIGALRM, close_on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        start = time.monotonic()
        x = np.ones(10, np.float32)
        expect(hfr.HFRError, "cancelled", lambda: comm.allreduce(x))
        took = time.monotonic() - start
        assert closing and closing[0] < 1 and took < 2, f"close() took {closing}, the call {took:.1f} s"
        expect(hfr.HFRError, "closed", lambda: comm.allreduce(x))
    else:
        time.sleep(1.0)
        start = time.monotonic()
        comm.close()  # beside a peer that closed broken: no collective free
        assert time.monotonic() - start < 5, time.monotonic() - start
    with hfr.Communicator(world, timeout=TIMEOUT) as fresh:
        x = np.arange(10, dtype=np.float32) + rank
        assert np.array_equal(fresh.allreduce(x), np.arange(10, dtype=np.float32) * size + size * (size - 1) / 2), x
    done()
else:
    raise SystemExit(f"unknown scenario {scenario}")
