"""hfr.close() closes the default Communicator (every rank calls it); the module functions then make a new one."""
import numpy as np

import hfr

first = hfr.default_communicator()
x = np.ones(8, np.float32)
hfr.allreduce(x)
assert (x == first.size).all(), x
hfr.close()
assert first.closed
hfr.close()  # nothing left to close
x[:] = 1
hfr.allreduce(x)
assert (x == first.size).all(), x
assert hfr.default_communicator() is not first
hfr.close()
print("close ok")
