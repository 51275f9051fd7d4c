"""GPU pairs (hfr/pairs.py, HFR_PAIRS=on: every size; auto under MPS from its size on) on a real GPU (tests/test_cupy.py) or on the fake CUDA
driver and CuPy (tests/test_staged.py): the pairs formed, every dtype and op of allreduce against a float64
reference, the same bits on every rank and for another chunk size, reduce_scatter and reduce, a call whose
rank 0 holds a host array. On the fake, argv[1] "launch" or "push" then fails rank 0's first add kernel, or its
first push to its partner: the communicator breaks on rank 0 naming the step, at once on its node; "stall"
makes rank 0's streams stall behind its partner's pushes (as where the partner's never run): rank 0 times
out naming its partner, and its node within moments; "stall-gone" (1 x 2) stalls rank 0 so and fails its
partner's copy after them: rank 0 ends at once, naming it. Then a new communicator's calls are right.
"""
import ctypes
import os
import sys
import tempfile
import time

import cupy
import ml_dtypes
import numpy as np
from mpi4py import MPI

import hfr
from checks import expect

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
driver = ctypes.CDLL("libcuda.so.1")
fake = hasattr(driver, "fake_launches")
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}
seed = 0


def inputs(dtype, count):
    """This rank's values of a new call, and every rank's as float64 rows (the reference's)."""
    global seed
    seed += 1
    every = [np.random.default_rng([seed, r]) for r in range(size)]
    if np.dtype(dtype).kind in "iu":
        every = [g.integers(-50, 50, count).astype(dtype) for g in every]
    else:
        every = [g.standard_normal(count).astype(dtype) for g in every]
    return every[rank], np.array(every, np.float64)


def reference(rows, dtype, op):
    """The float64 reference of op over the ranks' rows (integers wrapped to dtype as NumPy's do)."""
    if op in ("sum", "avg"):
        want = rows.sum(0) / (size if op == "avg" else 1)
    else:
        want = {"max": rows.max(0), "min": rows.min(0), "prod": rows.prod(0)}[op]
    return want.astype(np.int64).astype(dtype) if np.dtype(dtype).kind in "iu" else want


def close_to(got, want, dtype, what):
    got = np.asarray(got).astype(np.float64)
    if np.dtype(dtype).kind in "iu":
        assert np.array_equal(got, want.astype(np.float64)), (rank, what)
    else:
        tol = TOLERANCE[np.dtype(dtype).name]
        assert np.allclose(got, want, rtol=tol, atol=tol * size), (rank, what, np.abs(got - want).max())


def same_everywhere(got, what):
    digests = world.allgather(bytes(np.ascontiguousarray(got).view(np.uint8)))
    assert all(d == digests[0] for d in digests), (rank, what, "the ranks' bits differ")


def communicator(**kwargs):
    """A Communicator with pairs on, chunks of 256 KiB, whose pairs have formed: its first CUDA call
    publishes each rank's record, the next links the pairs."""
    comm = hfr.Communicator(world, pairs="on", **{"chunk_bytes": 256 << 10, **kwargs})
    for _ in range(2):
        comm.allreduce(cupy.asarray(np.ones(30001, np.float32)))
    return comm


comm = communicator()
formed = [(r, r + 1) for r in comm._engine.layout.node_ranks[:comm.local_size // 2 * 2:2]]
assert comm.pairs == formed, (rank, comm.pairs, formed)
other = communicator(chunk_bytes=64 << 10)  # the same bits for another chunk size
launches = driver.fake_launches() if fake else 0
every = sys.argv[1] in ("none", "launch")  # the other failures' runs check float32 sums (launch's run, all)
for count in (1, 7, 1025, 30001, 300007):  # one chunk (the smallest with an empty half), five chunks
    for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int8)[:None if every else 1]:
        for op in ("sum", "avg", "max", "min", "prod")[:None if every else 1]:
            if op == "avg" and np.dtype(dtype).kind == "i":
                continue
            host, rows = inputs(dtype, count)
            what = (count, np.dtype(dtype).name, op)
            x = cupy.asarray(host)
            got = cupy.asnumpy(comm.allreduce(x, op, out=cupy.asarray(np.full(count, 7, dtype))))
            assert np.array_equal(cupy.asnumpy(x), host), (rank, what, "out of place changed x")
            close_to(got, reference(rows, dtype, op), dtype, what)
            same_everywhere(got, what)
            again = cupy.asnumpy(other.allreduce(cupy.asarray(host), op))
            assert np.array_equal(again.view(np.uint8), got.view(np.uint8)), (rank, what, "another chunk size")
assert not fake or comm.local_rank ^ 1 >= comm.local_size or driver.fake_launches() > launches, "no call was paired"
for count in (7, 30001, 100003):  # reduce_scatter and reduce: paired copies in, unpaired copies out
    host, rows = inputs(np.float32, count * size)
    got = comm.reduce_scatter(cupy.asarray(host), cupy.asarray(np.full(count, 7, np.float32)))
    close_to(cupy.asnumpy(got), reference(rows, np.float32, "sum")[rank * count:(rank + 1) * count], np.float32,
             ("reduce_scatter", count))
    host, rows = inputs(np.float32, count)
    x = cupy.asarray(host)
    got = comm.reduce(x, root=size - 1, op="max")
    if rank == size - 1:
        close_to(cupy.asnumpy(got), reference(rows, np.float32, "max"), np.float32, ("reduce", count))
    else:
        assert np.array_equal(cupy.asnumpy(x), host), "reduce changed a non-root's x"
for count in (7, 300007):  # rank 0's array on the host: its pair stays apart, the others' pairs do not
    host, rows = inputs(np.float32, count)
    got = comm.allreduce(host.copy() if rank == 0 else cupy.asarray(host))
    got = got if rank == 0 else cupy.asnumpy(got)
    close_to(got, reference(rows, np.float32, "sum"), np.float32, ("host and device", count))
    same_everywhere(got, ("host and device", count))
other.close()
comm.close()
if sys.argv[1] != "push":  # HFR_PAIRS=auto (the default): ranks of one device pair only under MPS (concurrent),
    # from PAIRS_FROM_BYTES; the fake's "MPS" is a control pipe's name in CUDA_MPS_PIPE_DIRECTORY
    for mps in (False, True) if fake else (False,):
        if mps:
            pipes = tempfile.mkdtemp()
            open(os.path.join(pipes, "control"), "w").close()
            os.environ["CUDA_MPS_PIPE_DIRECTORY"] = pipes
        auto = hfr.Communicator(world)
        auto.allreduce(cupy.asarray(np.ones(7, np.float32)))  # meets CUDA: the ranks publish their records
        count = hfr.pairs.PAIRS_FROM_BYTES // 4
        for elements, paired in ((count - 1024, False), (count, mps)):
            host, rows = inputs(np.float32, elements)
            launches = driver.fake_launches() if fake else 0
            got = cupy.asnumpy(auto.allreduce(cupy.asarray(host)))
            close_to(got, reference(rows, np.float32, "sum"), np.float32, ("auto", elements))
            assert not fake or auto.local_rank ^ 1 >= auto.local_size or (driver.fake_launches() > launches) == paired, \
                (rank, elements, mps, "paired" if paired else "apart")
        auto.close()
        os.environ.pop("CUDA_MPS_PIPE_DIRECTORY", None)

FAILING = {"launch": "FAKE_CUDA_FAIL_LAUNCH", "push": "FAKE_CUDA_FAIL_AT", "stall": "FAKE_CUDA_PARTNER_STALLS"}
if fake and sys.argv[1] == "stall-gone":  # rank 0's streams stalled behind its partner's pushes, and the partner
    # fails its copy to the host after them: rank 0 ends as soon as the partner broke, naming it
    comm = communicator(timeout=3)
    if rank == 0:
        os.environ[FAILING["stall"]] = "1"
    elif rank == 1:
        os.environ[FAILING["push"]] = str(driver.fake_copies() + 2)  # its push, then that copy
    start = time.monotonic()
    error = expect(hfr.HFRError, "", lambda: comm.allreduce(cupy.asarray(inputs(np.float32, 300007)[0])))
    if rank == 0:
        assert "rank 1 of this node failed before it came" in str(error) and time.monotonic() - start < 2, \
            (f"{time.monotonic() - start:.1f} s", error)
    elif rank == 1:
        assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(error) and "adding the GPU pair's halves" in str(error), error
elif fake:  # a failure in the pair's steps: rank 0's first add kernel, its first push (its call's first copy), or
    # its streams stalled behind its partner's pushes
    timeout = 3
    comm = communicator(timeout=timeout)
    host, rows = inputs(np.float32, 300007)
    stall = sys.argv[1] == "stall"
    if rank == 0 and comm.local_size > 1:
        os.environ[FAILING[sys.argv[1]]] = "1" if stall else str(
            (driver.fake_launches() if sys.argv[1] == "launch" else driver.fake_copies()) + 1)
    start = time.monotonic()
    try:
        got = comm.allreduce(cupy.asarray(host))
    except hfr.HFRTimeoutError as error:  # stalled: rank 0 waited for its partner (rank 1), the others for rank 0
        assert stall, f"waited to the timeout: {error}"
        assert time.monotonic() - start < timeout + 2, f"{time.monotonic() - start:.1f} s"
        if 0 in comm._engine.layout.node_ranks:  # (another node's, timing out as rank 0 did, may name no one)
            assert ("the device to run our copies" if rank == 0 else "") in str(error), error
            assert f"ranks [{1 if rank == 0 else 0}]" in str(error), error
    except hfr.HFRError as error:
        if rank == 0:
            assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(error) and "adding the GPU pair's halves" in str(error), error
        else:  # rank 0's node from its CLOSING word; other nodes from their rails, or from a node peer that heard
            named = ("rank 0 of this node failed",) if 0 in comm._engine.layout.node_ranks else \
                ("ranks [0] of other nodes failed", "of this node failed")
            assert any(n in str(error) for n in named), error
            after = time.monotonic() - start - (timeout if stall else 0)
            assert after < 2, f"{after:.1f} s after rank 0's failure"
    else:
        assert comm.local_size == 1, "a call ran though rank 0's pair step failed"
        close_to(cupy.asnumpy(got), reference(rows, np.float32, "sum"), np.float32, "no pair: no failure")
if fake:  # the call after: a new communicator's, right
    for variable in FAILING.values():
        os.environ.pop(variable, None)
    assert driver.fake_depth() == 0
    comm.close()
    world.Barrier()
    fresh = communicator()  # a new communicator: its pairs form again, its calls are right
    for count in (7, 300007):
        for _ in range(2):
            host, rows = inputs(np.float32, count)
            got = cupy.asnumpy(fresh.allreduce(cupy.asarray(host)))
            close_to(got, reference(rows, np.float32, "sum"), np.float32, ("after the failure", count))
            same_everywhere(got, ("after the failure", count))
    fresh.close()
print(f"rank {rank}: pairs ok", flush=True)
