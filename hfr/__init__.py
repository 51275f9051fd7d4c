"""hfr: HFReduce in Python. Allreduce that sums on the CPU, for CuPy and NumPy arrays over MPI."""
from .errors import HFRError, HFRTimeoutError, MismatchError
from .ops import Op

__version__ = "0.1.0"
__all__ = ["HFRError", "HFRTimeoutError", "MismatchError", "Op", "__version__"]
