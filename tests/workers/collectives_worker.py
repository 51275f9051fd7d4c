"""Checks hfr's allreduce, reduce, broadcast, reduce_scatter and allgather on every rank of the job it runs in.

argv[1]: a JSON object of settings: sizes, dtypes, ops, chunk_bytes (list, compared bitwise),
local_size (or null), collectives (reduce_scatter's x holds size x count elements, allgather's out
too). Each rank builds its input from (seed, rank), every rank gathers
every input and computes the expected result itself: bitwise for one node (slot order is rank order),
within a float tolerance across nodes (tree order), exact for integers and for max/min.
"""
import json
import mmap
import os
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

import hfr
from checks import pages, read_only
from hfr.kernels import reduce_into
from hfr.ops import DTYPES, Op, accumulation_dtype

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
cfg = json.loads(sys.argv[1])
dtypes = [d for d in DTYPES if d.name in cfg.get("dtypes", [d.name for d in DTYPES])]
ops = [Op(o) for o in cfg.get("ops", [o.value for o in Op])]
sizes = cfg.get("sizes", [0, 1, 7, 100003])
collectives = cfg.get("collectives", ["allreduce", "reduce", "broadcast", "reduce_scatter", "allgather"])
comms = [hfr.Communicator(world, local_size=cfg.get("local_size"), chunk_bytes=c) for c in cfg.get("chunk_bytes", [None])]
POISON = 0x5A


def make_input(dtype, op, count, seed):
    rng = np.random.default_rng([seed, rank])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    if op is Op.PROD:
        values = rng.uniform(0.5, 1.5, count)
    else:
        values = rng.standard_normal(count) * 4
    if count > 3:
        values[count // 3] = np.nan if op in (Op.MAX, Op.MIN) and rank == size - 1 else values[count // 3]
    return values.astype(dtype)


def expected(inputs, op, dtype):
    """The slot-order result: exact for one node (avg: the sum divided once, in the accumulation type)."""
    exact = np.empty_like(inputs[0])
    reduce_into(exact, inputs, op, backend="numpy", divisor=size)
    return exact


def check_close(got, want, inputs, op, dtype, what):
    if dtype.kind in "iu" or op in (Op.MAX, Op.MIN):
        assert np.array_equal(got, want, equal_nan=True), f"{what}: differs from the reference"
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0) if op is not Op.PROD else np.abs(w)
    if op is Op.AVG:
        scale = scale / size
    eps = float(np.finfo(accumulation_dtype(dtype) if dtype.itemsize == 2 else dtype).eps)
    # The half types round their node's sum once, then every tree step once.
    half_eps = 2.0 ** -8 if dtype.name == "bfloat16" else 2.0 ** -11 if dtype.itemsize == 2 else 0.0
    bound = (4 * size * eps + (2 + np.log2(size + 1)) * half_eps) * scale + 1e-30
    bad = ~(np.abs(g - w) <= bound)
    assert not bad.any(), f"{what}: {bad.sum()} elements off, e.g. got {g[bad][:3]} want {w[bad][:3]}"


def same_on_every_rank(a, what):
    digests = world.allgather(a.tobytes())
    assert all(d == digests[0] for d in digests), f"{what}: ranks got different bits"


seed = 0
for collective in collectives:
    for dtype in dtypes:
        for op in ops if collective not in ("broadcast", "allgather") else [Op.SUM]:
            if op is Op.AVG and dtype.kind in "iu":
                continue
            for count in sizes:
                seed += 1
                x = make_input(dtype, op, count * size if collective == "reduce_scatter" else count, seed)
                inputs = world.allgather(x)
                root = seed % size
                if collective == "broadcast":
                    want = inputs[root]
                elif collective == "allgather":
                    want = np.concatenate(inputs)
                else:
                    want = expected(inputs, op, dtype)
                shard = slice(rank * count, (rank + 1) * count)
                if collective == "reduce_scatter":
                    inputs, want = [i[shard] for i in inputs], want[shard]
                results = []
                for comm in comms:
                    what = f"{collective} {dtype} {op.value} n={count} root={root} chunk={comm.chunk_bytes} layout={comm}"
                    receives = collective != "reduce" or rank == root
                    # out of place: x untouched, out poisoned before
                    out = np.full(want.nbytes, POISON, np.uint8).view(dtype).reshape(want.shape)
                    x_before = x.copy()
                    if collective == "reduce_scatter":
                        got = comm.reduce_scatter(x, out, op=op)
                    elif collective == "allgather":
                        got = comm.allgather(x, out)
                    elif collective == "broadcast":
                        got = x.copy()
                        comm.broadcast(got, root=root)
                    elif collective == "reduce":
                        got = comm.reduce(x, root=root, op=op, out=out)
                    else:
                        got = comm.allreduce(x, op=op, out=out)
                    assert np.array_equal(x.view(np.uint8), x_before.view(np.uint8)), f"{what}: x was modified"
                    if not receives:
                        assert np.all(out.view(np.uint8) == POISON), f"{what}: a non-root's out was written"
                        continue
                    if comm.nnodes == 1 or collective in ("broadcast", "allgather"):
                        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{what}: not bitwise the slot-order result"
                    else:
                        check_close(got, want, inputs, op, dtype, what)
                    results.append(got)
                # In place gives the same bits as out of place (allgather: x at its shard of out).
                if collective == "allreduce":
                    inplace = x.copy()
                    assert comms[-1].allreduce(inplace, op=op) is inplace
                    assert np.array_equal(inplace.view(np.uint8), results[-1].view(np.uint8)), f"{what}: in place differs"
                if collective == "allgather":
                    inplace = np.full(want.nbytes, POISON, np.uint8).view(dtype)
                    inplace[shard] = x
                    assert comms[-1].allgather(inplace[shard], inplace) is inplace
                    assert np.array_equal(inplace.view(np.uint8), results[-1].view(np.uint8)), f"{what}: in place differs"
                for r in results[1:]:
                    assert np.array_equal(r.view(np.uint8), results[0].view(np.uint8)), f"{what}: depends on chunk_bytes"
                if collective in ("allreduce", "allgather"):
                    same_on_every_rank(results[0], what)

# Several async calls in flight complete in order, with their own results.
comm = comms[0]
xs = [make_input(np.dtype(np.float32), Op.SUM, 50000 + i, 1000 + i) for i in range(4)]
refs = [expected(world.allgather(x), Op.SUM, x.dtype) for x in xs]
works = [comm.allreduce_async(x) for x in xs]
# A blocking call made while those are in flight queues behind them (it may not run on this thread).
y = make_input(np.dtype(np.int32), Op.SUM, 1000, 2000)
y_ref = expected(world.allgather(y), Op.SUM, y.dtype)
assert np.array_equal(comm.allreduce(y), y_ref)
assert all(w.done() for w in works)
for w, x, ref in zip(works, xs, refs):
    assert w.wait(timeout=120) is x
    assert w.done()
    if comm.nnodes == 1:
        assert np.array_equal(x, ref)
# Every collective's async twin, all in flight at once, each with its own result.
k = 3001
x = make_input(np.dtype(np.float64), Op.SUM, k * size, 3000)
inputs = world.allgather(x)
total = np.sum(inputs, axis=0)
outs = {name: np.full(n, np.nan) for name, n in [("rs", k), ("ag", k * size), ("red", k * size)]}
bcast = x.copy()
works = [comm.reduce_scatter_async(x, outs["rs"]), comm.allgather_async(x[:k], outs["ag"]),
         comm.reduce_async(x, root=size - 1, out=outs["red"]), comm.broadcast_async(bcast, root=0)]
results = [outs["rs"], outs["ag"], outs["red"] if rank == size - 1 else x, bcast]
assert all(w.wait(timeout=120) is result for w, result in zip(works, results))
np.testing.assert_allclose(outs["rs"], total[rank * k : (rank + 1) * k], rtol=1e-12)
assert np.array_equal(outs["ag"], np.concatenate([i[:k] for i in inputs]))
assert np.array_equal(bcast, inputs[0])
if rank == size - 1:
    np.testing.assert_allclose(outs["red"], total, rtol=1e-12)
# avg of the half types at the edges of their range: no overflow where the mean fits. On one node it is
# the float32 mean rounded once. Across nodes it is the sum of the nodes' partial means, each rounded
# once, so it may overflow only within a few units in the last place of the type's largest value (the
# top of float16's range is used less 4 of them there). bfloat16's range is float32's: its float32 sum
# overflows first, as a float32 array's own would.
for dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
    info = ml_dtypes.finfo(dtype)
    tiny = float(info.smallest_subnormal)
    for comm in comms:
        top = float(info.max) if dtype == np.float16 else 2.0**127 * 1.5 / size
        ulp = float(info.eps) * 2.0 ** np.floor(np.log2(top))
        big = top if comm.nnodes == 1 else top - 4 * ulp
        x = np.array([big, -big, big * (1 - rank / size / 2), 40000.0, tiny * (rank + 1), 1.0 + rank / 1024], dtype)
        inputs = world.allgather(x)
        mean = np.mean([i.astype(np.float64) for i in inputs], axis=0)
        got = comm.allreduce(x.copy(), op="avg")
        what = f"avg {dtype} at the edges of its range, layout={comm}"
        assert np.isfinite(got.astype(np.float64)).all(), f"{what}: overflowed: {got}"
        if comm.nnodes == 1:
            assert np.array_equal(got.view(np.uint16), expected(inputs, Op.AVG, dtype).view(np.uint16)), what
        half_ulp = (2.0 ** -8 if dtype.name == "bfloat16" else 2.0 ** -11) * np.abs(mean)
        steps = 1 if comm.nnodes == 1 else 2 + np.log2(comm.nnodes)  # a rounding per node and tree step
        assert (np.abs(got.astype(np.float64) - mean) <= steps * half_ulp + tiny).all(), f"{what}: {got} vs {mean}"
# An allgather in place leaves its own shard of out alone (it is x): read-only (three 4 KiB chunks where comm's are).
shard = 3 * mmap.PAGESIZE
x = make_input(np.dtype(np.float32), Op.SUM, shard // 4, 4000)
want = np.concatenate(world.allgather(x))
for comm in comms:
    whole = pages(shard * size).view(np.float32)
    whole.view(np.uint8)[:] = POISON
    whole[rank * x.size : (rank + 1) * x.size] = x
    with read_only(whole[rank * x.size : (rank + 1) * x.size]):
        assert comm.allgather(whole[rank * x.size : (rank + 1) * x.size], whole) is whole
    assert np.array_equal(whole, want), f"allgather in place, its shard read-only, layout={comm}"
# The progress thread has its own OS-level name (top -H, py-spy), not its creator's.
if size > 1:
    names = {open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
    assert "hfr-progress" in names, names
for comm in comms:
    comm.close()
if rank == 0:
    print(f"collectives ok on {size} ranks, local_size {cfg.get('local_size')}")
