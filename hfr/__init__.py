"""hfr: HFReduce in Python. Allreduce that sums on the CPU, for CuPy and NumPy arrays over MPI.

The module functions use a default Communicator on MPI.COMM_WORLD, made on first use and closed by
hfr.close() or at exit.
"""
from __future__ import annotations

import atexit
import threading
from typing import Any, Optional

from .comm import Communicator
from .errors import HFRError, HFRTimeoutError, MismatchError
from .ops import Op, OpLike
from .work import Work

__version__ = "0.1.0"
__all__ = [
    "Communicator", "Work", "Op", "HFRError", "HFRTimeoutError", "MismatchError",
    "allreduce", "allreduce_async", "reduce", "reduce_async", "broadcast", "broadcast_async",
    "reduce_scatter", "reduce_scatter_async", "allgather", "allgather_async",
    "default_communicator", "close", "__version__",
]

_default: Optional[Communicator] = None
_default_lock = threading.Lock()


def default_communicator() -> Communicator:
    """The Communicator on MPI.COMM_WORLD that the module functions use (collective on first call)."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Communicator()
            atexit.register(_default.close)
        return _default


def close() -> None:
    """Close the default Communicator, if it was made (collective: every rank calls it). The module
    functions make a new one if called again."""
    global _default
    with _default_lock:
        if _default is not None:
            atexit.unregister(_default.close)
            _default.close()
            _default = None


def allreduce(x: Any, op: OpLike = "sum", out: Any = None) -> Any:
    """Reduce x over all ranks of MPI.COMM_WORLD; in place unless out is given. Returns the result."""
    return default_communicator().allreduce(x, op, out)


def allreduce_async(x: Any, op: OpLike = "sum", out: Any = None) -> Work:
    """Start an allreduce and return its Work at once."""
    return default_communicator().allreduce_async(x, op, out)


def reduce(x: Any, root: int = 0, op: OpLike = "sum", out: Any = None) -> Any:
    """Reduce x over all ranks into x (or out) of rank root."""
    return default_communicator().reduce(x, root, op, out)


def reduce_async(x: Any, root: int = 0, op: OpLike = "sum", out: Any = None) -> Work:
    return default_communicator().reduce_async(x, root, op, out)


def broadcast(x: Any, root: int = 0) -> Any:
    """Copy x of rank root into x of every rank."""
    return default_communicator().broadcast(x, root)


def broadcast_async(x: Any, root: int = 0) -> Work:
    return default_communicator().broadcast_async(x, root)


def reduce_scatter(x: Any, out: Any, op: OpLike = "sum") -> Any:
    """Reduce x (n * k elements) over all n ranks; out (k elements) gets this rank's k, in rank order."""
    return default_communicator().reduce_scatter(x, out, op)


def reduce_scatter_async(x: Any, out: Any, op: OpLike = "sum") -> Work:
    return default_communicator().reduce_scatter_async(x, out, op)


def allgather(x: Any, out: Any) -> Any:
    """Every rank's x (k elements) into out (n * k elements), in rank order."""
    return default_communicator().allgather(x, out)


def allgather_async(x: Any, out: Any) -> Work:
    return default_communicator().allgather_async(x, out)


def __getattr__(name: str) -> Any:
    """hfr.torch (the DDP hooks) on first use, so that `import hfr` never imports torch."""
    if name == "torch":
        import importlib

        return importlib.import_module("hfr.torch")
    raise AttributeError(f"module 'hfr' has no attribute {name!r}")
