"""Arrays past the 32-bit limits: 2**31 + 5 int8 elements and 4 GiB + 12 bytes of float32, so no
count or byte offset anywhere may be an int32. Checks both ends and samples in between."""
import numpy as np
from mpi4py import MPI

import hfr

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
comm = hfr.Communicator(world, chunk_bytes=64 << 20)
expected_sum = sum(range(1, size + 1))
probe = np.array([0, 1, 2**31 - 1, 2**31, 2**31 + 1], dtype=np.int64)

x = np.full(2**31 + 5, rank + 1, np.int8)
x[-1] = 2 * (rank + 1)
comm.allreduce(x)
assert x.size > 2**31 and (x[probe] == expected_sum).all() and x[-1] == 2 * expected_sum, x[probe]
del x

count = (4 << 30) // 4 + 3
y = np.full(count, rank + 1, np.float32)
y[count // 2] = 0.5 * (rank + 1)
comm.allreduce(y, op="max")
assert y.nbytes > 4 << 30 and y[0] == y[2**30 + 2] == size and y[count // 2] == 0.5 * size
comm.close()
if rank == 0:
    print("large ok")
