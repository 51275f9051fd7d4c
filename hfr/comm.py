"""Communicator: the public object. Checks every argument on the calling thread, then hands the
call to its Engine's progress thread."""
from __future__ import annotations

import sys
from typing import Any, Optional, Union

from mpi4py import MPI

from . import settings, topology
from .arrays import Array, check_out, inspect
from .engine import Call, Engine
from .errors import HFRError
from .ops import Op, OpLike, as_op, is_float
from .work import Work

__all__ = ["Communicator"]


class Communicator:
    """HFReduce over an MPI communicator (collective to make and to close).

    comm: the MPI intra-communicator to reduce over (default MPI.COMM_WORLD); hfr works on a Dup.
    local_size: ranks per node, to emulate nodes of consecutive ranks on one host (default:
        HFR_LOCAL_SIZE, else the hosts as MPI sees them).
    chunk_bytes: pipeline chunk, a multiple of 4 KiB (default: HFR_CHUNK_BYTES, else 8 MiB); the
        same on every rank.
    timeout: seconds any rank waits for a peer before hfr.HFRTimeoutError (default: HFR_TIMEOUT,
        else 300).
    """

    def __init__(self, comm: Optional[MPI.Comm] = None, *, local_size: Optional[int] = None,
                 chunk_bytes: Optional[Union[int, str]] = None, timeout: Optional[float] = None):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py intra-communicator, got {comm!r}")
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise HFRError("hfr needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default): "
                           "its progress thread calls MPI beside yours")
        chunk = settings.chunk_bytes(chunk_bytes)
        wait = settings.timeout(timeout)
        algo = settings.algo()
        self._comm = comm.Dup()
        try:
            chunks = self._comm.allgather(chunk)
            if len(set(chunks)) > 1:
                raise ValueError(f"chunk_bytes must be the same on every rank, got {chunks} by rank")
            self._layout, node_comm, rail_comm = topology.split(self._comm, local_size)
        except BaseException:
            self._comm.Free()
            raise
        self._device: Optional[int] = _current_cuda_device()
        self._engine: Optional[Engine] = None
        if self._layout.size > 1:
            self._engine = Engine(self._comm, self._layout, node_comm, rail_comm, chunk_bytes=chunk, timeout=wait,
                                  threads=settings.threads(self._layout.host_size), algo=algo)
        else:
            node_comm.Free()
            rail_comm.Free()
        self.chunk_bytes, self.timeout = chunk, wait

    # --- layout ------------------------------------------------------------------------------
    rank = property(lambda self: self._layout.rank, doc="This rank in comm.")
    size = property(lambda self: self._layout.size, doc="Ranks in comm.")
    local_rank = property(lambda self: self._layout.local_rank, doc="This rank's index in its node.")
    local_size = property(lambda self: self._layout.local_size, doc="Ranks per node.")
    node = property(lambda self: self._layout.node, doc="This rank's node.")
    nnodes = property(lambda self: self._layout.nnodes, doc="Nodes in comm.")

    @property
    def closed(self) -> bool:
        return self._comm is None

    def __repr__(self) -> str:
        if self.closed:
            return "<hfr.Communicator closed>"
        return (f"<hfr.Communicator rank {self.rank}/{self.size}, node {self.node}/{self.nnodes}, "
                f"local rank {self.local_rank}/{self.local_size}>")

    # --- collectives ---------------------------------------------------------------------------
    def allreduce(self, x: Any, op: OpLike = "sum", out: Any = None) -> Any:
        """Reduce x over all ranks; every rank gets the result, in x or in out. Returns it."""
        return self._submit("allreduce", x, out, op, root=0, receives=True, inline=True).wait()

    def allreduce_async(self, x: Any, op: OpLike = "sum", out: Any = None) -> Work:
        return self._submit("allreduce", x, out, op, root=0, receives=True)

    def reduce(self, x: Any, root: int = 0, op: OpLike = "sum", out: Any = None) -> Any:
        """Reduce x over all ranks into x (or out) of rank root; the other ranks' arrays are untouched."""
        root = self._check_root(root)
        return self._submit("reduce", x, out, op, root, receives=self.rank == root, inline=True).wait()

    def reduce_async(self, x: Any, root: int = 0, op: OpLike = "sum", out: Any = None) -> Work:
        root = self._check_root(root)
        return self._submit("reduce", x, out, op, root, receives=self.rank == root)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Copy x of rank root into x of every rank. Returns x."""
        root = self._check_root(root)
        return self._submit("broadcast", x, None, Op.SUM, root, receives=self.rank != root, inline=True).wait()

    def broadcast_async(self, x: Any, root: int = 0) -> Work:
        root = self._check_root(root)
        return self._submit("broadcast", x, None, Op.SUM, root, receives=self.rank != root)

    # --- life ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the calls in flight and free everything (collective). Closing twice is harmless.

        After a failure (a timeout, a dead peer) nothing collective is attempted: the process can exit."""
        if self.closed:
            return
        engine, self._engine = self._engine, None
        comm, self._comm = self._comm, None
        if engine is not None:
            engine.close()
            if engine.broken is not None:
                return
            engine.node_comm.Free()
            engine.rail_comm.Free()
        comm.Free()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- checks --------------------------------------------------------------------------------
    def _check_root(self, root: Any) -> int:
        self._check_open()
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root {root!r} is out of range: expected an int in [0, {self.size})")
        return root

    def _check_open(self) -> None:
        if self.closed:
            raise HFRError("the communicator is closed")

    def _submit(self, collective: str, x: Any, out: Any, op: OpLike, root: int, receives: bool,
                inline: bool = False) -> Work:
        """Check the arguments, then hand the call to the engine (inline: the blocking forms, which
        the engine may run on this thread)."""
        self._check_open()
        xa = inspect(x, "x", writable=receives and out is None)
        oa = xa if out is None else check_out(xa, out)
        op = as_op(op)
        if op is Op.AVG and not is_float(xa.dtype):
            raise TypeError(f"op 'avg' needs a float dtype, x has {xa.dtype}")
        if xa.kind == "cupy":
            if self._device is None:
                self._device = _current_cuda_device()
            if xa.device != self._device:
                raise ValueError(f"x is on CUDA device {xa.device}, the communicator uses device {self._device}")
        result = oa.obj if receives else xa.obj
        work = Work(lambda: f"{collective} of {xa.size} {xa.dtype} on rank {self.rank}", result)
        if self._engine is None:  # one rank: the result is the input
            if receives and oa.address != xa.address:
                oa.flat[...] = xa.flat
            work._succeed()
            return work
        if self._engine.broken is not None:
            raise HFRError(f"rank {self.rank}: the communicator failed earlier and takes no more calls: "
                           f"{self._engine.broken}")
        return self._engine.submit(Call(collective, xa, oa, op, root, _ready_event(xa), work), inline=inline)


def _current_cuda_device() -> Optional[int]:
    """The current CUDA device when CuPy is already imported and sees one, else None."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        return cupy.cuda.runtime.getDevice()
    except Exception:  # no driver or no device
        return None


def _ready_event(x: Array) -> Any:
    """For a CUDA array, an event on the caller's stream (CuPy's or torch's current one): the copies wait for it."""
    if x.kind != "cupy":
        return None
    import cupy

    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(x.stream)
    return event
