"""hfr on CuPy arrays, ranks sharing the GPUs there are: the same bits as the NumPy path, out=,
async, the copies ordered after work queued on the caller's stream, and every CUDA event, copy and
stream hfr makes on the array's device even when another device is current (where there are two)."""
import cupy as cp
import numpy as np
from mpi4py import MPI

import hfr
from hfr.ops import DTYPES, Op

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
devices = cp.cuda.runtime.getDeviceCount()
mine = rank % devices
cp.cuda.Device(mine).use()
comm = hfr.Communicator(world, chunk_bytes=1 << 20)

# Record the current device at every event hfr makes and every copy it queues.
seen = []


class RecordedEvent(cp.cuda.Event):
    def record(self, stream=None):
        seen.append(("event", cp.cuda.runtime.getDevice(), None if stream is None else stream.device_id))
        return super().record(stream)


real_copy = cp.cuda.runtime.memcpyAsync


def recorded_copy(*args):
    seen.append(("copy", cp.cuda.runtime.getDevice(), None))
    return real_copy(*args)


cp.cuda.Event, cp.cuda.runtime.memcpyAsync = RecordedEvent, recorded_copy


def make_input(dtype, op, count, seed):
    rng = np.random.default_rng([seed, rank])
    if dtype.kind in "iu":
        return rng.integers(-50, 50, count).astype(dtype)
    values = rng.uniform(0.5, 1.5, count) if op is Op.PROD else rng.standard_normal(count)
    return values.astype(dtype)


def cupy_holds(dtype):
    try:
        cp.zeros(1, dtype)
        return True
    except Exception:
        return False


seed = 0
for dtype in DTYPES:
    if not cupy_holds(dtype):
        if rank == 0:
            print(f"cupy cannot hold {dtype}: skipped")
        continue
    for op in Op:
        if op is Op.AVG and dtype.kind in "iu":
            continue
        for count in (0, 1, 7, 100003, (3 << 20) + 3):
            seed += 1
            host = make_input(dtype, op, count, seed)
            want = comm.allreduce(host.copy(), op=op)
            x = cp.asarray(host)
            got = comm.allreduce(x, op=op)
            assert got is x
            assert np.array_equal(cp.asnumpy(x).view(np.uint8), want.view(np.uint8)), f"{dtype} {op} {count}"
            x = cp.asarray(host)
            out = cp.full(count, 7, dtype)
            assert comm.allreduce(x, op=op, out=out) is out
            assert np.array_equal(cp.asnumpy(out).view(np.uint8), want.view(np.uint8))
            assert np.array_equal(cp.asnumpy(x).view(np.uint8), host.view(np.uint8)), "x modified"

# reduce_scatter and allgather: the same bits as the NumPy path, out poisoned, x untouched, and an
# allgather in place (x at its shard of out, as FSDP2 calls it).
for dtype in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)):
    for count in (0, 1, 7, 100003):
        seed += 1
        host = make_input(dtype, Op.SUM, count * size, seed)
        want_rs = comm.reduce_scatter(host, np.empty(count, dtype))
        want_ag = comm.allgather(host[:count], np.empty(count * size, dtype))
        x = cp.asarray(host)
        out = cp.full(count, 7, dtype)
        assert comm.reduce_scatter(x, out) is out
        assert np.array_equal(cp.asnumpy(out).view(np.uint8), want_rs.view(np.uint8)), f"reduce_scatter {dtype} {count}"
        assert np.array_equal(cp.asnumpy(x).view(np.uint8), host.view(np.uint8)), "x modified"
        out = cp.full(count * size, 7, dtype)
        assert comm.allgather(x[:count], out) is out
        assert np.array_equal(cp.asnumpy(out).view(np.uint8), want_ag.view(np.uint8)), f"allgather {dtype} {count}"
        whole = cp.full(count * size, 7, dtype)
        whole[rank * count : (rank + 1) * count] = x[:count]
        comm.allgather_async(whole[rank * count : (rank + 1) * count], whole).wait(timeout=120)
        assert np.array_equal(cp.asnumpy(whole).view(np.uint8), want_ag.view(np.uint8)), f"allgather in place {dtype}"

# A write queued on the caller's stream right before the call, behind slow work, is included (a call of
# one chunk, which runs in C, and one of several; queued, and blocking on the caller's thread).
for blocking in (False, True):
    for stream, count in ((cp.cuda.Stream(non_blocking=True), 8 << 20), (cp.cuda.Stream.null, 8 << 20),
                          (cp.cuda.Stream(non_blocking=True), 1000), (cp.cuda.Stream.null, 1000)):
        with stream:
            a = cp.random.rand(4096, 4096, dtype=cp.float32)
            x = cp.zeros(count, cp.float32)
            for _ in range(30):
                a = a @ a * 1e-3
            x += rank + 1
            y = comm.allreduce(x) if blocking else comm.allreduce_async(x).wait(timeout=120)
        assert float(cp.asnumpy(y).min()) == float(cp.asnumpy(y).max()) == size * (size + 1) / 2, (blocking, count)

# Made on x's device, also when the caller has another device current: a blocking call, staged in C
# (through the CUDA driver, in x's device's context, on its own streams or the caller's), makes no event or
# copy through CuPy; an async call records one event through CuPy (its copies wait for it), on x's device.
# Both leave the caller's device current.
other = (mine + 1) % devices
for count in (3 << 20, 1000):
    for blocking in (True, False):
        with cp.cuda.Device(mine):
            x = cp.full(count, rank + 1.0, cp.float32)
        cp.cuda.Device(other).use()
        seen.clear()
        comm.allreduce(x) if blocking else comm.allreduce_async(x).wait(timeout=120)
        assert cp.cuda.runtime.getDevice() == other
        with cp.cuda.Device(mine):
            assert float(x[-1].get()) == size * (size + 1) / 2
        assert all(current == mine and stream in (None, -1, mine) for _, current, stream in seen), seen
        assert [what for what, _, _ in seen] == ([] if blocking else ["event"]), (count, blocking, seen)
        cp.cuda.Device(mine).use()

# The front (hfr/_front.pyx) takes a blocking allreduce of a CuPy array on the communicator's device once
# the engine has met one (above): on one node every call, of any size, across nodes a call of one chunk once
# the engine has made the call shape's rail schedules (its first call on each of the 3 stages). Each is right, element
# by element, on the caller's current stream (behind a write queued there), x untouched out of place.
if size > 1:  # one rank has no engine: its calls return x (or a copy)
    python_calls = []
    run_held = comm._engine.run_held
    comm._engine.run_held = lambda call: (python_calls.append(call), run_held(call))[1]
    # 1024 float32: the largest whole call; 100003: the result slot's; 600001: several chunks (one node only)
    for count in (1, 257, 1024, 1025, 100003) + ((600001,) if comm.nnodes == 1 else ()):
        for dtype in (np.float32, np.float16, np.int32):
            for placement in ("in place", "out of place"):
                for _ in range(1 if comm.nnodes == 1 else 4):
                    seed += 1
                    host = make_input(np.dtype(dtype), Op.SUM, count, seed)
                    want = comm.allreduce(host.copy())
                    stream = cp.cuda.Stream(non_blocking=True)
                    with stream:
                        staged = cp.asarray(host)
                        x = cp.empty_like(staged)
                        x[...] = staged  # a kernel queued on the caller's stream right before the call
                        out = None if placement == "in place" else cp.full(count, 7, dtype)
                        before = len(python_calls)
                        got = comm.allreduce(x, out=out)
                    assert got is (x if out is None else out)
                    assert np.array_equal(cp.asnumpy(got).view(np.uint8), want.view(np.uint8)), (count, dtype, placement)
                    if out is not None:
                        assert np.array_equal(cp.asnumpy(x).view(np.uint8), host.view(np.uint8)), "x modified"
                took_python = len(python_calls) > before
                assert not took_python, (rank, count, dtype, placement, "the last call took the Python path")
    # Those it leaves to the engine's Python, whose checks refuse them naming the bad value, x untouched: an
    # out on the host, a strided array.
    x = cp.full(7, rank + 1.0, cp.float32)
    for what, call, error in (("numpy out", lambda: comm.allreduce(x, out=np.zeros(7, np.float32)), ValueError),
                              ("strided", lambda: comm.allreduce(cp.ones((7, 2), cp.float32)[:, 0]), ValueError)):
        try:
            call()
        except error:
            pass
        else:
            raise AssertionError(f"{what}: no {error.__name__}")
        assert float(cp.asnumpy(x).max()) == rank + 1.0, what
    comm._engine.run_held = run_held

# Several in flight, reduce and broadcast.
xs = [cp.full(300000 + i, rank + i, cp.float32) for i in range(4)]
works = [comm.allreduce_async(x) for x in xs]
for i, (w, x) in enumerate(zip(works, xs)):
    assert float(w.wait(timeout=120)[-1]) == sum(r + i for r in range(size))
x = cp.full(1000, rank + 1.0, cp.float64)
comm.reduce(x, root=size - 1)
assert float(x[0]) == (size * (size + 1) / 2 if rank == size - 1 else rank + 1)
comm.broadcast(x, root=size - 1)
assert float(x[0]) == size * (size + 1) / 2
comm.close()
if rank == 0:
    print(f"cupy ok on {size} ranks")
