"""Hypothesis-driven allreduce over the ranks of this job. derandomize=True makes every rank draw
the same examples (and shrink the same way), so the ranks always make the same calls."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import hfr
from hfr.kernels import reduce_into
from hfr.ops import DTYPES, Op

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
comm = hfr.Communicator(world, chunk_bytes=8192)


@settings(derandomize=True, database=None, max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(count=st.integers(0, 20000), dtype=st.sampled_from(DTYPES), op=st.sampled_from(list(Op)),
       seed=st.integers(0, 2**32 - 1), specials=st.booleans())
def test_allreduce_matches_the_slot_order_reference(count, dtype, op, seed, specials):
    if op is Op.AVG and dtype.kind in "iu":
        return
    rng = np.random.default_rng([seed, rank])
    if dtype.kind in "iu":
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, count, dtype=dtype, endpoint=True)
    else:
        x = (rng.standard_normal(count) * 10).astype(dtype)
        if specials and count:
            x[rng.integers(count, size=3)] = np.array([np.nan, np.inf, -np.inf]).astype(dtype)
    inputs = world.allgather(x)
    want = np.empty_like(x)
    reduce_into(want, inputs, op, backend="numpy", divisor=size)
    got = comm.allreduce(x, op=op)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (count, dtype, op, seed)


test_allreduce_matches_the_slot_order_reference()
comm.close()
if rank == 0:
    print("properties ok")
