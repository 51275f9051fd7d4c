"""Which blocking allreduces the front runs in C (hfr/_front.pyx) and which it hands to the engine's
Python, on every rank of the job; each call's result is checked element by element against a float64
reference (or its error and the caller's arrays against what the checks promise).

argv[1]: local_size (or "none"); argv[2] (optional) "no-exchange-api": torch.Tensor without its DLPack
exchange API (as a torch before 2.11 is), so that the front takes no tensor and the engine's Python takes
them all. A spy counts the calls that the engine's Python runs (Engine.run_held, which every call not run in
C reaches: those handed to Engine.run, and across nodes those whose rail schedules the engine has yet to
make).
"""
import pickle
import sys
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

import hfr

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
local_size = None if sys.argv[1] == "none" else int(sys.argv[1])
no_exchange_api = sys.argv[2:] == ["no-exchange-api"]
comm = hfr.Communicator(world, local_size=local_size, chunk_bytes=4096)
engine = comm._engine
python_calls = []
run_held = engine.run_held
engine.run_held = lambda call: (python_calls.append(call.collective), run_held(call))[1]


def values(n, dtype, seed):
    """Rank-dependent, never zero, exact in every dtype hfr reduces (small integers)."""
    return ((np.arange(n) * 7 + seed + 3 * rank) % 11 + 1).astype(dtype)


def reference(n, dtype, seed, op):
    all_ranks = np.stack([((np.arange(n) * 7 + seed + 3 * r) % 11 + 1).astype(np.float64) for r in range(size)])
    return {"sum": all_ranks.sum(0), "avg": all_ranks.mean(0), "max": all_ranks.max(0), "min": all_ranks.min(0),
            "prod": all_ranks.prod(0)}[op]


def check(call, n, dtype, op, seed, *, by_python, what):
    """call() returns the result of an allreduce of values(n, dtype, seed); it must equal the reference and
    have taken the Python path (or not) as by_python says (None: either)."""
    before = len(python_calls)
    got = call()
    want = reference(n, dtype, seed, op).astype(dtype)
    assert np.array_equal(np.asarray(got, np.float64), want.astype(np.float64)), f"rank {rank} {what}: {got} != {want}"
    took = len(python_calls) > before
    assert by_python is None or took == by_python, f"rank {rank} {what}: took the {'Python' if took else 'C'} path"


def refused(error_type, fragment, call, *arrays_before):
    """call() raises error_type naming fragment; the arrays (array, its values before) are untouched."""
    try:
        call()
    except error_type as error:
        assert fragment in str(error), f"rank {rank}: {error!r} does not say {fragment!r}"
    else:
        raise AssertionError(f"rank {rank}: no {error_type.__name__} ({fragment})")
    for array, before in arrays_before:
        assert np.array_equal(array, before), f"rank {rank}: a refused call changed the caller's array"


# Across nodes the engine makes a call shape's rail schedules (one per stage) at its first calls there.
first_of_shape = comm.nnodes > 1
seed = 0
for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.int32, np.uint8, np.float64):
    for op in ("sum", "avg", "max", "min", "prod"):
        if op == "avg" and np.dtype(dtype).kind in "iu" or op == "prod" and np.dtype(dtype).itemsize == 1:
            continue
        n = 5 if op == "prod" else 37
        for _ in range(3 if first_of_shape else 1):  # each stage's first call of the shape, then the front's
            seed += 1
            x = values(n, dtype, seed)
            check(lambda: comm.allreduce(x, op), n, dtype, op, seed, by_python=first_of_shape, what=f"{dtype} {op}")
        seed += 1
        x, out = values(n, dtype, seed), np.full(n, 99, dtype)
        check(lambda: comm.allreduce(x, op), n, dtype, op, seed, by_python=False, what=f"{dtype} {op} in place")
        seed += 1
        x = values(n, dtype, seed)
        check(lambda: comm.allreduce(x, hfr.Op(op), out=out), n, dtype, op, seed, by_python=False,
              what=f"{dtype} {op} out of place")
        assert np.array_equal(x, values(n, dtype, seed)), "out of place changed x"

# Handed to the engine: spellings the front does not know, and arrays it does not take; right all the same.
# Taken in C though: an array of another shape, and an unpickled array (its dtype an equal, other object).
n = 37
for _ in range(3):  # across nodes the engine keeps 64 shapes' schedules: those above are gone by now
    seed += 1
    check(lambda: comm.allreduce(values(n, np.float32, seed)), n, np.float32, "sum", seed, by_python=None, what="again")
for what, make in [
    ("op SUM", lambda x: comm.allreduce(x, "SUM")),
    ("MPI.SUM", lambda x: comm.allreduce(x, MPI.SUM)),
    ("a subclass", lambda x: comm.allreduce(x.view(np.memmap)).view(np.ndarray)),
    ("in C: a 2-D array", lambda x: comm.allreduce(x.reshape(1, n)).reshape(n)),
    ("in C: an unpickled array", lambda x: comm.allreduce(pickle.loads(pickle.dumps(x)))),
    ("in C: into an unpickled out", lambda x: comm.allreduce(x, out=pickle.loads(pickle.dumps(np.zeros_like(x))))),
]:
    seed += 1
    check(lambda: make(values(n, np.float32, seed)), n, np.float32, "sum", seed,
          by_python=not what.startswith("in C"), what=what)
seed += 1
big = 4096 // 4 + 1  # past one chunk across nodes: the engine runs it
check(lambda: comm.allreduce(values(big, np.float32, seed)), big, np.float32, "sum", seed, by_python=comm.nnodes > 1,
      what="two chunks")
seed += 1
x = values(n, np.float32, seed)
if rank == size - 1:
    time.sleep(0.2)  # the others' async calls wait for this rank's: unfinished when their blocking call comes
work = comm.allreduce_async(x)  # another call unfinished: the blocking call goes behind it, through the engine
y = values(n, np.float32, seed + 1)
check(lambda: comm.allreduce(y), n, np.float32, "sum", seed + 1, by_python=None if rank == size - 1 else True,
      what="behind an async call")
work.wait()
assert np.array_equal(x, reference(n, np.float32, seed, "sum").astype(np.float32)), "the async call's result"
seed += 2

# What the checks refuse is refused as before, naming the bad value, the caller's arrays untouched.
x = values(n, np.float32, seed)
overlap = np.full(2 * n, 5, np.float32)
refused(ValueError, "partly overlaps", lambda: comm.allreduce(overlap[:n], out=overlap[1 : n + 1]),
        (overlap, np.full(2 * n, 5, np.float32)))
ro = values(n, np.float32, seed)
ro.flags.writeable = False
refused(ValueError, "read-only", lambda: comm.allreduce(ro), (ro, values(n, np.float32, seed)))
refused(TypeError, "op 'avg' needs a float dtype", lambda: comm.allreduce(values(n, np.int32, seed), "avg"))
refused(TypeError, "unsupported dtype", lambda: comm.allreduce(values(n, np.float32, seed).astype(">f4")))
refused(TypeError, "unsupported dtype",  # equal to float32 by ==, not by the checks' lookup
        lambda: comm.allreduce(values(n, np.float32, seed).view(np.dtype(("f4", [("a", "f4")])))))
refused(ValueError, "not C-contiguous", lambda: comm.allreduce(np.ones((n, 2), np.float32)[:, 0]))
refused(ValueError, "unknown op 'mean'", lambda: comm.allreduce(x, "mean"), (x, values(n, np.float32, seed)))
refused(TypeError, "out has dtype float64", lambda: comm.allreduce(x, out=np.zeros(n)), (x, values(n, np.float32, seed)))
refused(ValueError, "out has shape", lambda: comm.allreduce(x, out=np.zeros(n + 1, np.float32)),
        (x, values(n, np.float32, seed)))

# torch CPU tensors take the same C path (described through torch's DLPack exchange API), the written
# tensor's version counter bumped as torch's in-place ops do; what the front does not take goes to the
# engine's Python, right all the same; what the checks refuse is refused, the tensors untouched.
try:
    import torch
except ImportError:  # torch is optional (make TORCH_SPEC= test)
    torch = None
if torch is not None:
    if no_exchange_api:
        del torch.Tensor.__dlpack_c_exchange_api__
    def tensor(dtype, seed, **kwargs):
        return torch.tensor(values(n, np.float32, seed), **kwargs).to(dtype)

    def as_numpy(t, dtype):
        return t.to(torch.float64).numpy().astype(dtype)

    for np_dtype, dtype in ((np.float32, torch.float32), (np.float16, torch.float16),
                            (ml_dtypes.bfloat16, torch.bfloat16), (np.float64, torch.float64),
                            (np.int8, torch.int8), (np.uint8, torch.uint8), (np.int32, torch.int32),
                            (np.int64, torch.int64)):
        for op in ("sum", "max"):
            for _ in range(3 if first_of_shape else 0):  # across nodes: the shape's schedules, made by Python
                seed += 1
                comm.allreduce(tensor(dtype, seed), op)
            seed += 1
            t = tensor(dtype, seed)
            version = t._version
            check(lambda: as_numpy(comm.allreduce(t, op), np_dtype), n, np_dtype, op, seed, by_python=no_exchange_api,
                  what=f"tensor {dtype} {op} in place")
            assert t._version > version, "the tensor written in place kept its version"
            seed += 1
            t, out = tensor(dtype, seed), torch.full((n,), 99, dtype=dtype)
            version = out._version
            check(lambda: as_numpy(comm.allreduce(t, op, out=out), np_dtype), n, np_dtype, op, seed,
                  by_python=no_exchange_api, what=f"tensor {dtype} {op} out of place")
            assert torch.equal(t, tensor(dtype, seed)) and out._version > version, "out of place: x or out's version"
    leaf = tensor(torch.float32, seed, requires_grad=True)
    with torch.no_grad():  # in C: grad mode is off
        check(lambda: comm.allreduce(leaf).numpy(), n, np.float32, "sum", seed, by_python=no_exchange_api,
              what="a leaf, no_grad")
    # in C too: a 2-D tensor, one whose size-1 dimension has any stride (contiguous, as torch says), and a
    # slice that starts inside its storage
    for what, make in [("a 2-D tensor", lambda t: comm.allreduce(t.reshape(1, n)).reshape(n)),
                       ("a size-1 dimension's stride", lambda t: comm.allreduce(t.reshape(n, 1).t()).reshape(n)),
                       ("a slice", lambda t: comm.allreduce(torch.cat([torch.full((3,), 99.0), t])[3:])),

                       ("into a slice", lambda t: comm.allreduce(t, out=torch.full((n + 3,), 99.0)[3:]))]:
        seed += 1
        check(lambda: make(tensor(torch.float32, seed)).numpy(), n, np.float32, "sum", seed, by_python=no_exchange_api,
              what=what)
    for _ in range(3 if first_of_shape else 0):  # across nodes: the shape's schedules, made by Python
        comm.allreduce(torch.tensor(1.0))
    seed += 1
    check(lambda: comm.allreduce(tensor(torch.float32, seed)[0].clone()).reshape(1).numpy(), 1, np.float32, "sum", seed,
          by_python=no_exchange_api, what="a 0-d tensor")
    seed += 1
    param = torch.nn.Parameter(tensor(torch.float32, seed), requires_grad=False)  # a subclass: by Python
    check(lambda: comm.allreduce(param).detach().numpy(), n, np.float32, "sum", seed, by_python=True, what="a Parameter")
    seed += 1
    t = tensor(torch.float32, seed)
    refused(ValueError, "requires grad", lambda: comm.allreduce(tensor(torch.float32, seed, requires_grad=True)))
    refused(ValueError, "not contiguous", lambda: comm.allreduce(torch.ones((n, 2))[:, 0]))
    refused(ValueError, "not contiguous", lambda: comm.allreduce(torch.ones((2, n)).t()))
    refused(ValueError, "not contiguous", lambda: comm.allreduce(t, out=torch.zeros((n, 2))[:, 0]))
    refused(TypeError, "dense CPU or CUDA tensor", lambda: comm.allreduce(torch.ones(n).to_sparse()))
    # DLPack describes torch's 1- to 7-bit integers as 8-bit ones: the front asks torch
    nibbles = torch.full((n,), 9, dtype=torch.uint8).view(torch.uint4)
    refused(TypeError, "unsupported dtype torch.uint4", lambda: comm.allreduce(nibbles))
    refused(TypeError, "unsupported dtype torch.int4", lambda: comm.allreduce(torch.ones(n, dtype=torch.int8),
                                                               out=torch.zeros(n, dtype=torch.int8).view(torch.int4)))
    refused(TypeError, "unsupported dtype torch.bool", lambda: comm.allreduce(torch.ones(n, dtype=torch.bool)))
    assert torch.equal(nibbles.view(torch.uint8), torch.full((n,), 9, dtype=torch.uint8)), "a refused call wrote"
    freed = torch.ones(n)
    freed.untyped_storage().resize_(0)  # as FSDP frees a parameter: its shape stays
    refused(ValueError, "has no memory", lambda: comm.allreduce(freed))
    refused(ValueError, "has no memory", lambda: comm.allreduce(t, out=freed))
    both = torch.full((2 * n,), 5.0)
    refused(ValueError, "partly overlaps", lambda: comm.allreduce(both[:n], out=both[1 : n + 1]),
            (both, torch.full((2 * n,), 5.0)))
    check(lambda: comm.allreduce(torch.ones(0)).numpy(), 0, np.float32, "sum", seed, by_python=True, what="empty")
    # -3, lazily: its memory holds 3 (contiguous: one element; the imaginary parts of more have a stride of 2)
    negated = torch.tensor([2 + 3j], dtype=torch.complex64).conj().imag
    refused(ValueError, "negative bit", lambda: comm.allreduce(negated))
    refused(ValueError, "negative bit", lambda: comm.allreduce(torch.ones(1), out=negated))
    assert torch.equal(negated, torch.tensor([-3.0])), "a refused call changed the negated view"
    refused(TypeError, "out has dtype", lambda: comm.allreduce(t, out=torch.zeros(n, dtype=torch.float64)))
    refused(ValueError, "out has shape", lambda: comm.allreduce(t, out=torch.zeros(n + 1)))
    refused(ValueError, "out is a numpy array, x is a torch tensor",
            lambda: comm.allreduce(t, out=np.zeros(n, np.float32)))
    # neither on the CPU nor on CUDA (a meta tensor has no data, and its device index reads as a CPU's): the
    # front leaves them to the checks
    refused(TypeError, "x must be a dense CPU or CUDA tensor", lambda: comm.allreduce(torch.ones(n, device="meta")))
    refused(TypeError, "out must be a dense CPU or CUDA tensor",
            lambda: comm.allreduce(t, out=torch.zeros(n, device="meta")))
    assert torch.equal(t, tensor(torch.float32, seed)), "a refused call changed the caller's tensor"

# After all that, the front again, element by element.
seed += 1
check(lambda: comm.allreduce(values(n, np.float32, seed)), n, np.float32, "sum", seed, by_python=False, what="last")
comm.close()
refused(hfr.HFRError, "closed", lambda: comm.allreduce(values(n, np.float32, seed)))
print(f"rank {rank}: front ok", flush=True)
