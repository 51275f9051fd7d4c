"""The engine of one Communicator: the node-shared segment, the progress thread that runs queued calls in
order, and what a call's outcome means.

Every call runs in C (hfr/_node_call.pyx: the node protocol, Algorithm 1 of the paper, where its terms are
defined: chunks, sequence numbers, stages, slots, counters, whole and folded calls). Python describes a
call once (Call.descriptor; across nodes the rail's schedules of hfr/_internode.pyx, one per chunk, or the
call check's vote carrying a folded call's slice), NodeCall.run runs it with the GIL released, and
_c_call_failed turns an outcome other than DONE into the exception every rank of the call expects: a
mismatch, or a timeout naming the ranks that never came.
The engine's chunk (self.chunk) is chunk_bytes across nodes, and on one node a **cache chunk**
(cache_chunk_bytes): its stages in flight stay in the last-level cache. Every rank cuts a call alike,
since a call's descriptor says nothing of where its arrays are.
The **front** (hfr/_front.pyx) is the calling thread's side: it admits calls, holds the running lock for
the call that runs, and runs a blocking allreduce itself (a host array's or CPU tensor's, or a CuPy
array's or CUDA tensor's on this engine's device once _copies has met one; across nodes of one chunk only)
in C.
"""
from __future__ import annotations

import os
import queue
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
from mpi4py import MPI

from . import _node_call, _wait, internode, pairs, topology
from ._front import Front, rail_shape_key, rewound
from ._node_call import Closing, Collective, PairReady, Pairs, Protocol, cache_chunk_bytes
from .arrays import Array, inspect
from .copies import CudaCopies, caller_ready
from .errors import HFRError, HFRTimeoutError, MismatchError
from .ops import DTYPES, Op, as_op, combining, dtype_code, op_code
from .shm import ROW_WORDS, Segment
from .threads import name_this_thread
from .topology import Layout
from .work import Work

__all__ = ["Engine", "Call", "COLLECTIVES", "COLLECTIVE_CODES"]

# The protocol's numbers, defined once in hfr/_node_call.pxd
STAGES = int(Protocol.STAGES)
CLOSING = int(Protocol.CLOSING)
WHOLE_UP_TO_BYTES = int(Protocol.WHOLE_UP_TO_BYTES)
COLLECTIVES = tuple(c.name.lower() for c in Collective)  # in wire code order
HEALTHY, BROKEN, TIMED_OUT = (int(c) for c in (Closing.HEALTHY, Closing.BROKEN, Closing.TIMED_OUT))  # CLOSING's
REFUSED = int(Protocol.REFUSED)
PAIR_READY, PAIR_SINCE, PAIR_RECORD = (int(Protocol.PAIR_READY), int(Protocol.PAIR_SINCE),
                                      int(Protocol.PAIR_RECORD))
ABSENT_REPORT_GRACE_S = 1.0  # a rank timed out on the rail waits up to this long for its peers' word on who never came
COLLECTIVE_CODES = {name: code for code, name in enumerate(COLLECTIVES)}
_REDUCING = tuple(name for name, code in COLLECTIVE_CODES.items() if _node_call.reduces(code))
_REWOUND = ("doubling", "halving")  # calls of one chunk in C by these keep their schedules per call shape
_RAIL_SHAPES_KEPT = 64  # ... for this many call shapes
_FOLDED_UP_TO_BYTES = internode.VOTE_ROOM_BYTES  # folded calls (the terms above): at most the vote record's room


@dataclass
class Call:
    """One collective as the calling thread checked it."""

    collective: str
    x: Array
    out: Array
    op: Op  # SUM for broadcast and allgather, where it is unused
    root: int  # 0 where it is unused
    ready: Any  # CUDA event recorded on the caller's stream, or None
    result: Any  # what the call returns: the array that receives, in the caller's library
    refused: bool = False  # its arguments failed their checks on this rank: it only takes part in the call check

    def describe(self, rank: int) -> str:
        return f"{self.collective} of {self.x.size} {self.x.dtype} on rank {rank}"

    @property
    def elements(self) -> int:
        """The elements the chunks cut (hfr/_node_call.pyx's cut_count)."""
        return _node_call.cut_count(COLLECTIVE_CODES[self.collective], self.x.size, self.out.size)

    @property
    def nbytes(self) -> int:
        return self.elements * self.x.dtype.itemsize

    def descriptor(self) -> list[int]:
        """What the call check compares (hfr/_node_call.pyx's describe)."""
        code = COLLECTIVE_CODES[self.collective]
        if self.refused:
            return _node_call.descriptor(code, REFUSED)
        return _node_call.descriptor(code, self.x.size, dtype_code(self.x.dtype), op_code(self.op), self.root)


class Engine:
    """Owns the segment and the progress thread; runs the calls submitted to it, in order."""

    def __init__(self, comm: MPI.Comm, layout: Layout, node_comm: MPI.Comm, rail_comm: MPI.Comm,
                 *, chunk_bytes: int, timeout: float, threads: int, algo: str, pairing: str = "off",
                 cache_bytes: Optional[int] = None):
        self.layout = layout
        self.comm, self.node_comm, self.rail_comm = comm, node_comm, rail_comm
        self.chunk_bytes, self.timeout, self.threads, self.algo = chunk_bytes, timeout, threads, algo
        self.pairing = pairing  # HFR_PAIRS (hfr/pairs.py)
        self.segment = Segment(node_comm, chunk_bytes, STAGES)
        # The node's share of its host's last-level cache (HFR_CACHE_BYTES, else sysfs's), the same on
        # every rank of the node: a host array's call on one node is cut into chunks whose stages in
        # flight fit half of it (hfr/_node_call.pyx).
        if cache_bytes is None:
            cache_bytes = topology.host_cache_bytes() * layout.local_size // layout.host_size
        self.cache_bytes = node_comm.allreduce(cache_bytes, op=MPI.MIN)
        self.chunk = chunk_bytes if layout.nnodes > 1 else cache_chunk_bytes(
            self.cache_bytes, layout.local_size, chunk_bytes, layout.host_size > (os.cpu_count() or 1))
        self._node_call = _node_call.NodeCall(
            self.segment.control_address, ROW_WORDS, layout.local_size, layout.local_rank, timeout,
            self.segment.stages_address, self.segment.stage_bytes, self.segment.slot_bytes, layout.size,
            layout.rank, threads, self.cache_bytes, self.chunk, getattr(Pairs, f"PAIRS_{pairing.upper()}"),
            pairs.PAIRS_FROM_BYTES)
        # Calls in C across nodes poll the call check's vote and their slice's allreduce over the rail,
        # or the vote alone carrying the slice (folded, _FOLDED_UP_TO_BYTES): made once (the bare vote)
        # or once per call shape (sharing one scratch, or the vote's record: calls run one at a time),
        # then rewound for each later call, since making them costs more than a small call's exchanges.
        # Only schedules that finished run again: a call that stops one breaks the engine.
        self._vote_record = internode.VoteRecord() if layout.nnodes > 1 else None
        self._vote = None if layout.nnodes == 1 else internode.vote_schedule(rail_comm, self._vote_record)
        self._rail_shapes: dict[tuple, Any] = {}
        self._reported = False  # whether this rank told its rail that its communicator broke (_report)
        self._rail_scratch = np.empty(0, np.uint8)
        self._cuda: Optional[CudaCopies] = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._queue_lock = threading.Lock()  # orders a call's queueing against the progress thread's stop
        self._stopped = False  # the progress thread takes no more calls: a call queued now is refused
        # Admission, the running lock and the blocking allreduce, in C (hfr/_front.pyx)
        self.front = Front(self._node_call, self, layout.rank, layout.nnodes, self._rail_shapes)
        self._thread = threading.Thread(target=self._serve, name=f"hfr-progress-{layout.rank}", daemon=True)
        self._thread.start()

    # --- the calling thread's side -------------------------------------------------------------
    def submit(self, call: Call) -> Work:
        """Queue the call for the progress thread. Raises HFRError once the communicator is closed or
        has failed."""
        self.front.admit(False)
        return self._enqueue(call)

    def run(self, call: Call) -> Any:
        """Run the call and return its result, raising its failure (as submit, then wait). It runs right
        here when no other call is queued or running: two thread hand-offs fewer."""
        if not self.front.admit(True):
            return self._enqueue(call).wait()
        error = self._execute(call)
        if error is not None:
            raise error
        return call.result

    def refuse(self, collective: str, error: BaseException) -> None:
        """Take part in the check of a call whose arguments this rank refused (error), with a descriptor
        no real call has: the peers' call fails with MismatchError naming this rank, or, where every
        rank refused it, ends on every rank. The caller then raises error (its context says what else
        went wrong: a peer that never came, a communicator that failed earlier)."""
        nothing = inspect(np.empty(0, np.uint8), writable=False)
        try:
            self.run(Call(collective, nothing, nothing, Op.SUM, 0, None, None, refused=True))
        except MismatchError:
            pass  # the peers made a real call: they are told, and error is this rank's answer
        except HFRError:
            raise error  # with the HFRError as its context

    def _enqueue(self, call: Call) -> Work:
        """Queue an admitted call (undoing its admission if that fails)."""
        try:
            if call.x.kind == "cupy":  # the call runs later: its copies wait for the caller's work queued by now
                call.ready = caller_ready(call.x.stream, call.x.device)
        except BaseException:
            self.front.leave()
            raise
        work = Work(lambda: call.describe(self.layout.rank), call.result)
        with self._queue_lock:
            stopped = self._stopped
            if not stopped:
                self._queue.put((call, work))
        if stopped:  # admitted before close() began, queued after the progress thread stopped
            self.front.leave()
            raise HFRError("the communicator is closed")
        return work

    def close(self) -> bool:
        """Refuse new calls, finish those already submitted, stop the thread; then free the segment
        (collective over the node) if every rank of the node closes healthy within the timeout.
        Returns whether it was freed: if not, nothing collective may be attempted any more, and the rail
        is told so (its ranks then stop waiting for this one, in a call or in close: internode.rail_closed)."""
        self.front.close()
        self._queue.put(None)
        if self.front.held_here():  # called by a signal handler inside a call of this thread: cancel it
            _wait.cancel_running_call()
            self._publish(CLOSING, BROKEN)
            freed = False
        else:
            freed = self._close_node()
        if not freed:
            self._report([self.layout.rank], False)
        return freed

    def _close_node(self) -> bool:
        """close() once the thread stopped: whether every rank of the node closed healthy and the segment
        was freed."""
        self._thread.join()
        # Blocking calls still running on their callers' threads finish first, within the timeout.
        healthy = self.front.wait_idle(self.timeout) and self.front.broken is None
        # Each rank says how it closes in its control row, so a healthy rank never enters the window's
        # collective free beside a peer that failed (and skips it), nor waits for one past the timeout.
        self._publish(CLOSING, HEALTHY if healthy else BROKEN)
        if not healthy:
            return False
        if not self._node_call.wait_all(CLOSING, HEALTHY):  # a node peer never closed: take HEALTHY back, so
            self._publish(CLOSING, BROKEN)  # that one coming late skips the collective free too
            return False
        if int(self.segment.control[:, CLOSING].max()) != HEALTHY:
            return False
        self._rail_shapes.clear()  # their buffers are views of the segment
        self.segment.free()
        return True

    # --- the progress thread -------------------------------------------------------------------
    def _serve(self) -> None:
        name_this_thread("hfr-progress")
        while True:
            item = self._queue.get()
            if item is None:
                break
            call, work = item
            work._finish(self._execute(call))
        # close() came: calls queued after it (admitted before it began) are refused, not left waiting
        with self._queue_lock:
            self._stopped = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self.front.leave()
                item[1]._finish(HFRError("the communicator is closed"))

    def _execute(self, call: Call) -> Optional[BaseException]:
        """Run one call, one at a time. Returns its failure, if it failed: an HFRError (the original as
        its __cause__), or the KeyboardInterrupt that ended it."""
        try:
            self.front.hold()
            try:
                error = self.front.refusal()
                if error is None:
                    error = self.run_held(call)
            finally:
                self.front.release()
        finally:
            self.front.leave()
        return error

    def run_held(self, call: Call) -> Optional[BaseException]:
        """Run an admitted call whose thread holds the running lock; returns its failure (_failed)."""
        try:
            self._run(call)
        except BaseException as failure:
            return self._failed(call, failure)
        return None

    def front_call(self, x: Any, op: Any, out: Any) -> Call:
        """The Call of an allreduce the front (hfr/_front.pyx) took, its arguments as the front checked them
        (for a call it hands to run_held, or whose failure it hands to front_failed)."""
        xa = inspect(x, "x", writable=False)
        return Call("allreduce", xa, xa if out is None else inspect(out, "out", writable=False), as_op(op), 0, None,
                    x if out is None else out)

    def _failed(self, call: Call, failure: BaseException) -> BaseException:
        """What a failed call raises: a mismatch as it is; any other failure leaves the peers' state
        unknown and refuses further calls (front.broken): as an HFRError (the original as its __cause__),
        or the KeyboardInterrupt as it is. The node's ranks see it at once (CLOSING: BROKEN), so none of
        them waits for this one until its timeout; after a timeout (TIMED_OUT) they time out in turn, each
        naming whom it waited for."""
        if isinstance(failure, MismatchError):
            return failure
        wrap = isinstance(failure, Exception) and not isinstance(failure, HFRError)  # not Ctrl-C
        self.front.broken = error = _as_hfr_error(failure, call, self.layout) if wrap else failure
        self._publish(CLOSING, TIMED_OUT if isinstance(error, HFRTimeoutError) else BROKEN)
        self._report([self.layout.rank], isinstance(error, HFRTimeoutError))  # other nodes' waits end now
        return error

    def front_failed(self, x: Any, op: Any, out: Any, ended: Any, vote, rails) -> BaseException:
        """What an allreduce that the front ran in C raises where it did not end DONE: ended is its outcome,
        or the exception that stopped it (Ctrl-C in a wait); as for the engine's own calls
        (_run_in_c, then _execute)."""
        call = self.front_call(x, op, out)
        try:
            if isinstance(ended, BaseException):
                self._abandon(vote, rails)
                raise ended
            self._c_call_failed(call, ended, vote, rails)  # raises
        except BaseException as failure:
            return self._failed(call, failure)

    def _run(self, call: Call) -> None:
        """Run the call on this thread, in C (a CUDA array's in its device's context, whatever device is
        current: hfr/_cuda.pyx)."""
        self._run_in_c(call, None if call.x.kind == "numpy" else self._copies(call.x))

    def _run_in_c(self, call: Call, copies: Optional[CudaCopies]) -> None:
        """The call's chunk loop in C (hfr/_node_call.pyx), with the GIL released throughout (across nodes
        with the rail's vote and each chunk's rail schedule polled in C too). With copies (a CUDA array) the
        call is staged: x's chunks copied into our input slots and our part of the result out, after the
        caller's work on x's stream (that queued by call.ready, where the call was queued)."""
        x, out, g = call.x, call.out, self._node_call.chunks_done
        cuda, caller, ready, staging = None, 0, 0, 0
        if copies is not None:
            cuda, caller, staging = copies.driver, x.stream.ptr, copies.staging_address
            ready = 0 if call.ready is None else call.ready.ptr
        vote, rails, folded, in_out = self._rails(call, g)
        try:
            outcome = self._node_call.run(call.descriptor(), x.address, out.address, out.size, x.dtype, call.op, vote,
                                          rails, folded, in_out, cuda=cuda, caller=caller,
                                          ready=ready, staging=staging)
        except BaseException:  # Ctrl-C in a wait: the rail's receives may be posted
            self._abandon(vote, rails)
            raise
        if outcome != _node_call.Outcome.DONE:
            self._c_call_failed(call, outcome, vote, rails)

    def _abandon(self, vote, rails) -> None:
        """After Ctrl-C in a call in C: the vote and the schedule of the chunk it stopped at may have receives
        posted (those before it finished, those after never started)."""
        internode.abandon(vote, rails[min(self._node_call.failed_chunk, len(rails) - 1)] if rails else None)

    def _result_in_out(self, call: Call) -> bool:
        """Whether each chunk's result is made in out itself, not in the result slot (in_out, as
        hfr/_node_call.pyx says): across nodes, a host array's allreduce
        with one rank a node, whose data is its node's sum (two copies fewer a chunk, the same bits), unless
        its rail schedules are kept per call shape (_kept), over the result slot."""
        return (self.layout.nnodes > 1 and self.layout.local_size == 1 and call.x.kind == "numpy"
                and call.collective == "allreduce" and not self._kept(call))

    def _kept(self, call: Call) -> bool:
        """Whether the call's rail schedules are kept per call shape and rewound (_rail_schedules): across
        nodes, one chunk by doubling or halving, where making them would cost more than the exchanges."""
        return (self.layout.nnodes > 1 and call.collective in _REDUCING and 0 < call.nbytes <= self.chunk
                and self._algo_for(call) in _REWOUND)

    def _rails(self, call: Call, g: int) -> tuple:
        """(vote, rails, folded, in_out) of a call in C from chunk g on: across nodes the call check's vote
        and per chunk our slice's step over the rail (_rail_step; None where the slice is empty), or, folded,
        the vote carrying the slice and no rail; in_out as _result_in_out says; (None, None, False, False) on
        one node. Kept per call shape (_kept), or made for the call."""
        if self.layout.nnodes == 1:
            return None, None, False, False
        if self._kept(call):
            return self._rail_schedules(call, g % STAGES)
        self._vote.rewind()
        schedule, _ = self._rail_step(call)
        in_out = self._result_in_out(call)
        rails = []
        for first, _, lo, hi, result in self._node_call.chunks(call.elements, call.x.dtype.itemsize, in_out):
            rails.append(schedule(self._result_slice(call, result, hi - lo, in_out), first + lo) if hi > lo else None)
        return self._vote, rails, False, in_out

    def _result_slice(self, call: Call, at: int, count: int, in_out: bool) -> np.ndarray:
        """count elements of the call's dtype where NodeCall.chunks says a chunk's slice is reduced to: at
        bytes into out (in_out) or into the segment's stages."""
        memory = call.out.flat.view(np.uint8) if in_out else self.segment.stages
        return memory[at : at + count * call.x.dtype.itemsize].view(call.x.dtype)

    def _rail_step(self, call: Call) -> tuple[Callable[[np.ndarray, int], Any], str]:
        """How a call across nodes crosses the rail in C: a maker of one slice's schedule, (buf, its global
        first element) -> the allreduce (a reduce's reduce, a broadcast's broadcast, an allgather's
        allgather, a reduce_scatter's reduce-scatter where its algo, chosen by the call's size, is not
        doubling or halving: those run as the allreduce, as _kept schedules of one chunk do, so a call takes one
        way whatever the chunk size), and what a timeout of it says it ran."""
        root = self.layout.rank_nodes[call.root]
        if call.collective == "broadcast":
            return (lambda buf, first: internode.broadcast_schedule(self.rail_comm, buf, first, root),
                    internode.broadcast_what(root))
        if call.collective == "allgather":  # each node holds its ranks' shards of out
            held = self._node_shards(call.x.size)
            return (lambda buf, first: internode.allgather_schedule(self.rail_comm, buf, first, held, call.x.size),
                    internode.ALLGATHER_WHAT)
        algo = self._algo_for(call)
        op = combining(call.op)
        if call.collective == "reduce_scatter" and algo not in _REWOUND:  # each node owns its ranks' shards of x
            owned = self._node_shards(call.out.size)
            return (lambda buf, first: internode.reduce_scatter_schedule(self.rail_comm, buf, first, op, owned,
                                                                         call.out.size, self.threads),
                    internode.REDUCE_SCATTER_WHAT)
        to = root if call.collective == "reduce" else None
        return (lambda buf, first: internode.schedule(self.rail_comm, buf, first, op, algo, self.threads, root=to),
                internode.schedule_what(algo, to))

    def _folded(self, call: Call) -> bool:
        """Whether the call's one chunk goes over the rail with the call check's vote (folded, in
        hfr/_node_call.pyx's terms): the same answer on every rank that made this call (its size, the algo
        and the settings agreed when the Communicator was made)."""
        return self._kept(call) and call.nbytes <= _FOLDED_UP_TO_BYTES and self._algo_for(call) == "doubling"

    def _rail_schedules(self, call: Call, stage: int) -> tuple:
        """_rails of a call of one chunk by doubling or halving, made once per call shape and rewound: the
        front runs such calls with them too."""
        shape = rail_shape_key(stage, call.elements, dtype_code(call.x.dtype), op_code(call.op))
        schedules = self._rail_shapes.get(shape)
        if schedules is None:
            if len(self._rail_shapes) >= _RAIL_SHAPES_KEPT:
                del self._rail_shapes[next(iter(self._rail_shapes))]  # the oldest
            schedules = self._rail_shapes[shape] = self._rail_schedule(call)
        return rewound(schedules)

    def _rail_schedule(self, call: Call) -> tuple:
        """(vote, [rail], folded, in_out) for _rail_schedules."""
        size, in_out = call.x.dtype.itemsize, self._result_in_out(call)
        (_, _, lo, hi, at), = self._node_call.chunks(call.elements, size, in_out)  # one chunk
        op = combining(call.op)
        if self._folded(call):
            vote = internode.vote_schedule(self.rail_comm, self._vote_record, hi - lo, call.x.dtype, op, self.threads)
            return vote, [None], True, in_out
        if lo == hi:
            return self._vote, [None], False, in_out
        if self._rail_scratch.nbytes < (hi - lo) * size:
            self._rail_scratch = np.empty((hi - lo) * size, np.uint8)  # schedules made before keep theirs
        rail = internode.schedule(self.rail_comm, self._result_slice(call, at, hi - lo, in_out), lo, op,
                                  self._algo_for(call), self.threads, scratch=self._rail_scratch)
        return self._vote, [rail], False, in_out

    def _c_call_failed(self, call: Call, outcome: int, vote, rails) -> None:
        """Raise what the outcome of a call in C means (NodeCall counted the call, and its chunks where they
        ended; a wait that timed out, the counter and target it waited for)."""
        Outcome = _node_call.Outcome
        if outcome in _node_call.WAITED_FOR:  # the call's, or a chunk's
            c, where = self._node_call.failed_chunk, call.collective
            if outcome != Outcome.WAIT_CALL:
                where += f" chunk {c + 1}/{self._node_call.call_chunks}"
            column, target, gone, only = self._node_call.late_wait
            what = f"{where}: {_node_call.WAITED_FOR[outcome]}"
            if gone >= 0:  # a rank the wait needed has failed, or closed: it never comes (the rail hears of it)
                self.segment.sync()
                how = "failed" if self.segment.control[gone, CLOSING] == BROKEN else "closed its communicator"
                rank = self.layout.node_ranks[gone]
                self._report([rank], False)
                raise HFRError(f"{what}: rank {rank} of this node {how} before it came")
            raise self._timed_out(what, self._laggards(column, target, only))
        if outcome == Outcome.MISMATCH_SPENT:  # every rank of the node ended chunk g with no result
            outcome = Outcome.MISMATCH
        if outcome in (Outcome.VOTE_STOPPED, Outcome.RAIL_STOPPED):
            voting = outcome == Outcome.VOTE_STOPPED
            schedule = vote if voting else rails[self._node_call.failed_chunk]
            if schedule.node_peer_failed:  # a rank of this node broke while this one waited on the rail
                internode.abandon(schedule)
                self.segment.sync()
                broken = [self.layout.node_ranks[j] for j in np.flatnonzero(self.segment.control[:, CLOSING] == BROKEN)]
                self._report(broken, False)
                raise HFRError(f"{call.collective}: waiting on the rail: ranks {broken} of this node failed")
            step = "the call check" if voting else "the rail's step"
            try:
                internode.stopped(self.rail_comm, schedule, internode.VOTE_WHAT if voting else self._rail_step(call)[1])
            except HFRTimeoutError as error:
                raise self._timed_out(f"{step} ({error})", None, error.rail_peers) from None
            except internode.RailPeersFailed as error:
                raise self._peers_failed(step, error) from None
        if outcome == Outcome.MISMATCH:
            self._raise_mismatch(call.descriptor())
        if outcome == Outcome.NO_MEMORY:
            raise MemoryError("no memory for the kernel's scratch tiles")
        if outcome == Outcome.CUDA_FAILED:
            raise RuntimeError(self._node_call.cuda_failure)
        raise HFRError(f"unknown outcome {outcome!r} of a call in C")

    def _copies(self, x: Array):
        """The copies for x's kind; the first CUDA array page-locks the segment (on its device)."""
        if x.kind == "numpy":
            return self._host
        if self._cuda is None:
            self.segment.register_for_cuda(x.device)
            self._cuda = CudaCopies(x.device, WHOLE_UP_TO_BYTES)
            self._prepare_pair(self._cuda)
            self.front.take_cuda(self._cuda)
        return self._cuda

    def _prepare_pair(self, copies: CudaCopies) -> None:
        """This rank's side of its GPU pair (hfr/pairs.py), published in its control row (PAIR_SINCE, then
        PAIR_READY) for its partner, where pairs are wanted and can form (pairs.wanted) and it has one."""
        layout = self.layout
        if _node_call.partner_of(layout.local_rank, layout.local_size) < 0 or not pairs.wanted(self.pairing):
            return
        record = self.segment.control[layout.local_rank, PAIR_RECORD:].ctypes.data
        try:
            box_bytes = _node_call.pair_box_bytes(self.chunk)
            copies.pair_kernels = pairs.prepare(copies.driver, copies.device, box_bytes, record, self.pairing)
        except Exception as error:
            if self.pairing == "on":
                raise HFRError(f"rank {layout.rank}: HFR_PAIRS=on, but its GPU pair could not be prepared: {error}") \
                    from error
            warnings.warn(f"hfr: rank {layout.rank} does not pair its GPU: {type(error).__name__}: {error}")
            return
        self._publish(PAIR_SINCE, self._node_call.calls_done)
        self._publish(PAIR_READY, int(PairReady.PAIR_PUBLISHED))

    def formed_pairs(self) -> list[tuple[int, int]]:
        """The GPU pairs of this node that formed (both ranks linked: PAIR_LINKED), as ranks in comm."""
        if self.segment.control is None:
            return []
        self.segment.sync()
        ready, ranks, linked = self.segment.control[:, PAIR_READY], self.layout.node_ranks, int(PairReady.PAIR_LINKED)
        partners = ((j, _node_call.partner_of(j, len(ranks))) for j in range(len(ranks)))
        return [(ranks[j], ranks[k]) for j, k in partners if j < k and ready[j] == linked and ready[k] == linked]

    def _node_shards(self, shard: int) -> list[list[int]]:
        """Per node, where its ranks' shards of `shard` elements start (shard_start), ascending."""
        starts = [[] for _ in range(self.layout.nnodes)]
        for rank, node in enumerate(self.layout.rank_nodes):
            starts[node].append(_node_call.shard_start(rank, shard))
        return starts

    def _algo_for(self, call: Call) -> str:
        """HFR_ALGO, or by the call's size (internode.choose_algo)."""
        if self.algo != "auto":
            return self.algo
        return internode.choose_algo(call.elements * call.x.dtype.itemsize, self.layout.nnodes)

    # --- failures ------------------------------------------------------------------------------
    def _raise_mismatch(self, mine: list[int]) -> None:
        """Gather every rank's descriptor and raise MismatchError naming what differs (every rank calls it)."""
        table = np.empty((self.layout.size, len(mine)), np.int64)
        descriptor = np.array(mine, np.int64)
        internode.complete(self.comm.Iallgather(descriptor, table), self.timeout,
                           lambda: self._timed_out("the call check", None), descriptor, table)
        raise MismatchError(describe_mismatch(table))

    # --- waiting -------------------------------------------------------------------------------
    def _publish(self, column: int, value: int) -> None:
        self._node_call.publish(column, value)  # our data stores become visible before the counter

    def _laggards(self, column: int, target: int, only: int = -1) -> list[int]:
        """The ranks (in comm) of this node whose counter in column is still below target (of local rank only,
        where it is not -1); column -1 (a wait on the device, not a counter): local rank only, if any."""
        if column < 0:
            return [self.layout.node_ranks[only]] if only >= 0 else []
        self.segment.sync()
        late = np.flatnonzero(self.segment.control[:, column] < target)
        return [self.layout.node_ranks[j] for j in late if only < 0 or j == only]

    def _report(self, blamed: list[int], timed_out: bool) -> None:
        """Tell the rail, once, that this rank's communicator broke, and whom it blames: its rail peers' waits
        for it end at once (internode.report_absent)."""
        if not self._reported:
            self._reported = True
            internode.report_absent(self.rail_comm, blamed, timed_out)

    def _peers_failed(self, what: str, error: internode.RailPeersFailed) -> HFRError:
        """What a wait on the rail raises where rail peers reported that their communicators broke: where
        every one timed out, the HFRTimeoutError of the ranks they waited for; else an HFRError naming the
        ranks they blame. Passed on to this rank's rail (_report)."""
        layout = self.layout
        where = f"rank {layout.rank} (node {layout.node}, local rank {layout.local_rank}): {what}"
        self._report(error.blamed, error.timed_out)
        if error.timed_out:
            return HFRTimeoutError(f"{where}: ranks {error.blamed} never came (other nodes' ranks waited for them)")
        return HFRError(f"{where}: ranks {error.blamed} of other nodes failed or closed before they came")

    def _timed_out(self, what: str, laggards: Optional[list[int]], rail_peers: list[int] = ()) -> HFRTimeoutError:
        """The timeout of a wait for laggards (ranks of this node), or for rail_peers (rail ranks: their
        nodes), named by the ranks that never came. Every rank that times out tells its rail whom it
        waited for (internode.report_absent): a rail peer that reports is there, and waits in turn for
        the ranks it names, so this rank names those instead."""
        layout = self.layout
        who = ""
        if laggards:
            self._report(laggards, True)
            who = f" (still waiting for ranks {laggards})"
        elif rail_peers:
            self._report([layout.rail_ranks[p] for p in rail_peers], True)
            grace = min(ABSENT_REPORT_GRACE_S, self.timeout / 4)  # a call that times out takes at most this longer
            reports = internode.reported_absent(self.rail_comm, rail_peers, grace)
            absent = sorted({r for p in rail_peers for r in reports.get(p, [layout.rail_ranks[p]]) if r != layout.rank})
            who = f" (still waiting on the rail for nodes {list(rail_peers)}: ranks {absent} never came)"
        return HFRTimeoutError(f"rank {layout.rank} (node {layout.node}, local rank {layout.local_rank}) "
                               f"waited {self.timeout:g} s for {what}{who}")


def _as_hfr_error(error: BaseException, call: Call, layout: Layout) -> HFRError:
    """An error that is not hfr's own (MPI's, no memory, CUDA's), as an HFRError caused by it."""
    wrapped = HFRError(f"rank {layout.rank}: {call.collective} of {call.x.size} {call.x.dtype} failed: "
                       f"{type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


def describe_mismatch(table: np.ndarray) -> str:
    """Which fields of the call descriptors differ, and on which ranks."""
    names = {
        "collective": lambda v: COLLECTIVES[v] if 0 <= v < len(COLLECTIVES) else str(v),
        "dtype": lambda v: DTYPES[v].name if 0 <= v < len(DTYPES) else str(v),
        "op": lambda v: "-" if v < 0 else list(Op)[v].value,
    }
    refused = table[:, _node_call.DESCRIPTOR_NAMES.index("count")] == REFUSED
    parts = [f"ranks {np.flatnonzero(refused).tolist()} refused the call (their arguments failed its checks: their "
             f"own error says why)"] if refused.any() else []
    callers = np.flatnonzero(~refused).tolist()  # the ranks that made a real call
    for column, field in enumerate(_node_call.DESCRIPTOR_NAMES):
        values = table[callers, column].tolist()
        if len(set(values)) < 2:
            continue
        show = names.get(field, str)
        groups = {}
        for rank, v in zip(callers, values):
            groups.setdefault(v, []).append(rank)
        parts.append(f"{field} differs: " + "; ".join(f"ranks {ranks} have {show(v)}" for v, ranks in groups.items()))
    return "ranks made different calls: " + " | ".join(parts)
