"""Communicator: the public object. Checks every argument on the calling thread, then hands the
call to its Engine's progress thread."""
from __future__ import annotations

import json
import threading
from typing import Any, Optional, Union

import numpy as np
from mpi4py import MPI

from . import internode, settings, topology
from ._node_call import receives
from .arrays import check_out, check_shards, inspect
from .copies import caller_ready
from .engine import COLLECTIVE_CODES, Call, Engine
from .errors import HFRError, HFRTimeoutError
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
        else 300); making the Communicator waits as long for every rank of comm to come.
    pairs: "auto", "on" or "off": whether local ranks 2i and 2i + 1 pair their GPUs, reducing a CUDA
        array's halves over their device link before half the bytes cross PCIe (default: HFR_PAIRS, else
        auto; hfr/pairs.py says when a pair forms); the same on every rank. `pairs` says which formed.

    Every rank checks its settings, then the ranks compare them, waiting at most the timeout, before
    any blocking MPI call: a bad or differing setting raises on every rank, a rank that never comes
    gives HFRTimeoutError on the others.
    """

    def __init__(self, comm: Optional[MPI.Comm] = None, *, local_size: Optional[int] = None,
                 chunk_bytes: Optional[Union[int, str]] = None, timeout: Optional[float] = None,
                 pairs: Optional[str] = None):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py intra-communicator, got {comm!r}")
        try:
            wait = settings.timeout(timeout)
        except ValueError as error:
            wait, problem = settings.DEFAULT_TIMEOUT, error  # still tell the others, within the default
        else:
            problem = None
        chunk = algo = wanted = pairing = None
        if problem is None:
            try:
                if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
                    raise HFRError("hfr needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default): "
                                   "its progress thread calls MPI beside yours")
                chunk, algo, pairing = settings.chunk_bytes(chunk_bytes), settings.algo(), settings.pairs(pairs)
                wanted = topology.requested_local_size(local_size)
                settings.num_threads()
                settings.cache_bytes()
            except (ValueError, TypeError, HFRError) as error:
                problem = error
        _agree_on_settings(comm, problem, {"chunk_bytes": chunk, "HFR_ALGO": algo, "local_size": wanted,
                                           "pairs": pairing}, wait)
        self._device: Optional[int] = None  # the CUDA device of the first CUDA array; every later one's
        self._engine: Optional[Engine] = None
        self._front = None  # the engine's, for the blocking allreduce
        self._closing = threading.RLock()  # re-entered by a signal handler's close() during close()
        self.chunk_bytes, self.timeout = chunk, wait
        try:
            self._comm = comm.Dup()
            try:
                self._layout, node_comm, rail_comm = topology.split(self._comm, local_size)
            except BaseException:
                self._comm.Free()
                raise
            if self._layout.size > 1:
                self._engine = Engine(self._comm, self._layout, node_comm, rail_comm, chunk_bytes=chunk, timeout=wait,
                                      threads=settings.threads(self._layout.host_size), algo=algo,
                                      pairing=pairing, cache_bytes=settings.cache_bytes())
                self._front = self._engine.front
            else:
                node_comm.Free()
                rail_comm.Free()
        except MPI.Exception as error:  # MPI's own failure (no memory for the window, ...): an HFRError, as in calls
            raise HFRError(f"rank {comm.Get_rank()}: MPI failed while making the hfr.Communicator: {error}") from error

    # --- layout ------------------------------------------------------------------------------
    rank = property(lambda self: self._layout.rank, doc="This rank in comm.")
    size = property(lambda self: self._layout.size, doc="Ranks in comm.")
    local_rank = property(lambda self: self._layout.local_rank, doc="This rank's index in its node.")
    local_size = property(lambda self: self._layout.local_size, doc="Ranks per node.")
    node = property(lambda self: self._layout.node, doc="This rank's node.")
    nnodes = property(lambda self: self._layout.nnodes, doc="Nodes in comm.")

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The GPU pairs of this rank's node formed so far (their ranks in comm): a pair forms at the first
        CUDA call that both its ranks can pair (hfr/pairs.py)."""
        return [] if self._engine is None else self._engine.formed_pairs()

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
        if self._front is not None:  # most calls run in C from here (hfr/_front.pyx says which)
            result = self._front.allreduce(x, op, out)
            if result is not None:
                return result
        return self._run("allreduce", x, out, op, root=0)

    def allreduce_async(self, x: Any, op: OpLike = "sum", out: Any = None) -> Work:
        return self._submit("allreduce", x, out, op, root=0)

    def reduce(self, x: Any, root: int = 0, op: OpLike = "sum", out: Any = None) -> Any:
        """Reduce x over all ranks into x (or out) of rank root; the other ranks' arrays are untouched."""
        return self._run("reduce", x, out, op, root)

    def reduce_async(self, x: Any, root: int = 0, op: OpLike = "sum", out: Any = None) -> Work:
        return self._submit("reduce", x, out, op, root)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Copy x of rank root into x of every rank. Returns x."""
        return self._run("broadcast", x, None, Op.SUM, root)

    def broadcast_async(self, x: Any, root: int = 0) -> Work:
        return self._submit("broadcast", x, None, Op.SUM, root)

    def reduce_scatter(self, x: Any, out: Any, op: OpLike = "sum") -> Any:
        """Reduce x (size * k elements) over all ranks; out (k elements) gets this rank's k of the result,
        rank r the elements [r * k, (r + 1) * k). Returns out."""
        return self._run("reduce_scatter", x, out, op, root=0)

    def reduce_scatter_async(self, x: Any, out: Any, op: OpLike = "sum") -> Work:
        return self._submit("reduce_scatter", x, out, op, root=0)

    def allgather(self, x: Any, out: Any) -> Any:
        """Every rank's x (k elements) into out (size * k elements), in rank order. Returns out."""
        return self._run("allgather", x, out, Op.SUM, root=0)

    def allgather_async(self, x: Any, out: Any) -> Work:
        return self._submit("allgather", x, out, Op.SUM, root=0)

    # --- life ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the calls in flight and free everything (collective). Closing twice is harmless.

        Calls made after close() begins raise HFRError; so does a call admitted before it whose turn
        comes after. Blocking calls running on other threads are waited for at most the timeout. After
        a failure (a timeout, a dead peer) on any rank of the node, or when a peer does not close within
        the timeout, nothing collective is attempted: the process can exit. Called by a signal handler
        that interrupted a call of its thread, it cancels that call (which then raises HFRError) and
        returns at once."""
        with self._closing:
            comm, self._comm = self._comm, None
            if comm is None:
                return
            if self._engine is not None:
                self._engine.front.close()  # the front's calls too are refused from here on
                if not self._engine.close():
                    return
                self._engine.node_comm.Free()
                if internode.rail_closed(self._engine.rail_comm, self._engine.timeout):  # else kept for good
                    self._engine.rail_comm.Free()
            comm.Free()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- checks --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise HFRError("the communicator is closed")

    def _run(self, collective: str, x: Any, out: Any, op: OpLike, root: Any) -> Any:
        """Check the arguments, run the call, return its result (the blocking forms)."""
        call = self._call(collective, x, out, op, root)
        if self._engine is None:
            return self._alone(call)
        return self._engine.run(call)

    def _submit(self, collective: str, x: Any, out: Any, op: OpLike, root: Any) -> Work:
        """Check the arguments, then hand the call to the engine's progress thread (the _async forms)."""
        call = self._call(collective, x, out, op, root)
        if self._engine is None:
            result = self._alone(call, wait=False)
            ready = caller_ready(call.x.stream, call.x.device) if call.x.kind == "cupy" else None
            work = Work(lambda: call.describe(0), result, ready)
            work._finish()
            return work
        return self._engine.submit(call)

    def _call(self, collective: str, x: Any, out: Any, op: OpLike, root: Any) -> Call:
        """The call, its arguments checked: TypeError/ValueError naming the bad value before anything is
        modified, or HFRError once closed. A rank whose arguments fail the checks still takes part in
        the call's check, as a refused call, before it raises: its peers' calls fail too (MismatchError
        naming it) rather than pair with its next call, since some checks hold on some ranks only (x
        must be writable where it receives)."""
        self._check_open()
        try:
            return self._checked_call(collective, x, out, op, root)
        except (TypeError, ValueError) as error:
            if self._engine is not None:
                self._engine.refuse(collective, error)
            raise

    def _checked_call(self, collective: str, x: Any, out: Any, op: OpLike, root: Any) -> Call:
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root {root!r} is out of range: expected an int in [0, {self.size})")
        receiving = receives(COLLECTIVE_CODES[collective], self.rank == root)
        xa = inspect(x, "x", writable=receiving and out is None)
        if collective in ("reduce_scatter", "allgather"):
            oa = check_shards(xa, out, collective, self.size, self.rank)
        else:
            oa = xa if out is None else check_out(xa, out)
        op = as_op(op)
        if op is Op.AVG and not is_float(xa.dtype):
            raise TypeError(f"op 'avg' needs a float dtype, x has {xa.dtype}")
        if xa.kind == "cupy":
            if self._device is None:
                self._device = xa.device
            if xa.device != self._device:
                raise ValueError(f"x is on CUDA device {xa.device}, the communicator uses device {self._device}")
        return Call(collective, xa, oa, op, root, None, oa.obj if receiving else xa.obj)

    @staticmethod
    def _alone(call: Call, wait: bool = True) -> Any:
        """A call of a communicator of one rank: the result is the input. A CUDA array's is final, as with
        peers, once the work queued on the caller's stream before the call has run: the blocking forms
        wait for that here (the async forms' Work waits for an event recorded after it)."""
        x, out = call.x, call.out
        copy = call.result is out.obj and out.address != x.address
        if x.kind == "cupy":
            import cupy

            with cupy.cuda.Device(x.device), x.stream:
                if copy:
                    out.flat[...] = x.flat
            if wait:
                x.stream.synchronize()
        elif copy:
            out.flat[...] = x.flat
        return call.result


SETTINGS_RECORD_BYTES = 4096  # one rank's settings (or its error, cut to 500 characters) as UTF-8 JSON


def _agree_on_settings(comm: MPI.Intracomm, problem: Optional[BaseException], mine: dict, timeout: float) -> None:
    """Compare every rank's settings (or its error) over comm with one non-blocking allgather polled for
    at most `timeout` seconds, before any blocking MPI call. Raises on every rank when some rank's
    settings are bad (that rank re-raises its own error) or differ, and HFRTimeoutError when some rank
    does not come in time."""
    record = {"error": None if problem is None else f"{type(problem).__name__}: {problem}"[:500], **mine}
    send = np.zeros(SETTINGS_RECORD_BYTES, np.uint8)
    encoded = json.dumps(record, ensure_ascii=False).encode()
    send[: len(encoded)] = np.frombuffer(encoded, np.uint8)
    table = np.zeros((comm.Get_size(), SETTINGS_RECORD_BYTES), np.uint8)
    internode.complete(comm.Iallgather(send, table), timeout, lambda: HFRTimeoutError(
        f"rank {comm.Get_rank()} waited {timeout:g} s for every rank of the communicator to make its "
        f"hfr.Communicator (its first call): some rank never came"), send, table)
    records = [json.loads(bytes(row).rstrip(b"\0")) for row in table]
    if problem is not None:
        raise problem
    bad = [(rank, r["error"]) for rank, r in enumerate(records) if r["error"]]
    if bad:
        raise ValueError("; ".join(f"rank {rank} cannot make the hfr.Communicator: {error}" for rank, error in bad))
    for name in mine:
        values = [r[name] for r in records]
        if len(set(values)) > 1:
            raise ValueError(f"{name} must be the same on every rank, got {values} by rank")
