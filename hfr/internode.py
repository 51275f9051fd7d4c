"""The inter-node step: allreduce, reduce, broadcast and allgather of one slice over a rail, in place.

Terms. A *rail* is an MPI communicator with one rank per node (rail rank r = node r). The caller owns a
*slice*: `buf`, a 1-D C-contiguous array holding the elements with *global index* first .. first+len-1
of a larger array. Every rail rank calls with the same first, len, dtype, op, algo and block_bytes.

dbtree (the default) uses the two trees of hfr.dbtree. Element i belongs to tree (i // G) % 2, where a
*granule* of G elements is TREE_GRANULE_BYTES long: the split depends on i alone, so the result does not
depend on how the caller cut its array into slices. Each tree's share is cut into *blocks* of at most
block_bytes, the pipelining unit. A block goes *up* its tree: a node receives it from each child into
scratch, combines own ⊕ child0 ⊕ child1 (hfr.kernels, in that fixed order) and sends the sum to its
parent. The root then holds the total and sends it *down*: each node receives it from its parent into
buf and forwards it to its children. Up to BLOCKS_IN_FLIGHT blocks per tree are between stages at once,
both trees move together, and later blocks go up while earlier ones come down. Every rank ends with the
root's bits, which depend only on the number of nodes, the dtype, the op and the data.
reduce runs the up phase only, broadcast the down phase only, both on the trees rooted at `root`.
allgather moves bytes only, whatever the algo: each rank holds some of the slice (its node's ranks' shards),
cut into blocks of at most block_bytes that go around the rail from their holders (relay, in
hfr/_internode.pyx): each link carries what its right-hand rank lacks, once. reduce_scatter (where each rank
needs only the elements it *owns*, its node's ranks' shards) relays the same way, each block starting one
rank right of its owner and combined at every rank it passes: each element's n values are combined in an
order that follows from its owner, so from its global index; half the bytes of an allreduce.
The blocks move in C with the GIL released (hfr/_internode.pyx), as do doubling's and halving's.

doubling (chosen for small slices) is recursive doubling: log2 n swaps of the whole slice between rank
pairs, both partners combining lower rank's partial op higher rank's, so every rank computes the same
expression of the n slices and its bits depend on n, the dtype, the op and the data alone, like dbtree's.
halving (chosen for mid-sized slices) first halves: each swap sends the half of the current range that
the partner keeps and combines the half it keeps, until each rank owns 1/n of the slice summed; then the
owned parts are swapped back in reverse. Each element meets the same pairs in the same order, so its
bits too depend on n, the dtype, the op and the data alone. (doubling pairs ranks low bit first,
halving high bit first, so the two give different bits: the algo, chosen by the call's size, never by a
chunk's, is part of what a call's bits depend on; the cuts and block sizes are not.)

ring is reduce-scatter then allgather around the rail (n-1 steps each) over n *segments*: segment k is
the ring granules (RING_GRANULE_BYTES, fixed) of global index g with g % n == k, one message each, so an
element's segment, and the order its n values are combined in, follow from its global index: the bits
do not depend on the cuts either. It moves 2 x the slice x (n-1)/n each way on every link (bandwidth-
optimal; dbtree moves 2 x the slice). mpi is MPI's own (I)allreduce, with hfr's kernel as a user-defined op for float16, bfloat16 and
8-bit sums and products: its float bits depend on how the caller cuts its array (the chunk size), and
its max and min drop NaN as MPI's MAX and MIN do. gather is one MPI (I)allgather of every rank's slice, after which each rank
combines the n slices itself in rail-rank order: one collective, moving n x the slice; every rank
computes the same sum in the same order, so its bits depend on the data alone too.

Messages are raw bytes (a uint8 view), matched in posting order (MPI does not let messages between two
ranks with one tag overtake each other), one tag per (tree, phase) and per algo. No wait blocks inside
MPI: every algo is a schedule in C whose requests are polled, yielding the CPU between polls, until done
or past the caller's deadline.
"""
from __future__ import annotations

import bisect
import math
import threading
import time
from typing import Callable, NoReturn, Optional

import numpy as np
from mpi4py import MPI

from ._internode import BLOCKS_IN_FLIGHT, Collective, CollectiveKind, Doubling, Relay, Ring, Schedule
from ._internode import TreePipeline, ring_scratch_elements, tree_scratch_bytes
from ._internode import Tag
from ._internode import VOTE_RECORD_WORDS as VOTE_WORDS
from . import _wait
from .dbtree import TREES, Node, parent_children, rooted_parent_children
from .errors import HFRError, HFRTimeoutError
from .kernels import KERNEL_OPS, reduce_into
from .ops import Op, as_dtype

__all__ = ["allreduce", "reduce", "broadcast", "vote", "vote_schedule", "VoteRecord", "schedule", "schedule_what",
           "broadcast_schedule", "broadcast_what", "allgather", "allgather_schedule",
           "ALLGATHER_WHAT", "reduce_scatter", "reduce_scatter_schedule", "REDUCE_SCATTER_WHAT", "stopped", "abandon",
           "keep_for_good", "choose_algo", "report_absent", "reported_absent", "rail_closed", "VOTE_WHAT", "VOTE_WORDS", "VOTE_ROOM_BYTES", "ALGOS", "TREE_GRANULE_BYTES",
           "DEFAULT_BLOCK_BYTES", "BLOCKS_IN_FLIGHT", "DOUBLING_UP_TO_BYTES", "HALVING_UP_TO_BYTES",
           "RING_UP_TO_NODES", "RING_GRANULE_BYTES"]

ALGOS = ("dbtree", "doubling", "halving", "ring", "mpi", "gather")
TREE_GRANULE_BYTES = 1024 * 1024  # fixed: changing it changes which tree sums which element (1 MiB:
# fewer Python steps per byte than 256 KiB, 1.5-2x faster at 64 MiB; arrays under 1 MiB use tree 0 alone)
DEFAULT_BLOCK_BYTES = 256 * 1024
RING_GRANULE_BYTES = 64 * 1024  # fixed, as TREE_GRANULE_BYTES: it decides which order sums each element

_TREE_TAGS = [(Tag.TREE0_UP, Tag.TREE0_DOWN), (Tag.TREE1_UP, Tag.TREE1_DOWN)]  # (up, down) by tree

_MPI_OPS = {Op.SUM: MPI.SUM, Op.MAX: MPI.MAX, Op.MIN: MPI.MIN, Op.PROD: MPI.PROD}
_OWN_MPI_OPS: dict[tuple[np.dtype, Op], MPI.Op] = {}  # made once per (dtype, op), never freed
_ABANDONED: list = []  # requests and pipelines left by a timeout, kept so that MPI never writes freed memory


# ---------------------------------------------------------------------------------------- public API


def allreduce(rail: MPI.Comm, buf: np.ndarray, first: int, op: Op, *, algo: str = "dbtree",
              block_bytes: int = DEFAULT_BLOCK_BYTES, deadline: Optional[float] = None, threads: int = 1) -> None:
    """buf = the op-reduction of buf over all rail ranks, on every rank, in place."""
    op = _check(rail, buf, first, op, algo, block_bytes)
    if rail.Get_size() == 1 or buf.size == 0:
        return
    _run_in_c(rail, schedule(rail, buf, first, op, algo, threads, block_bytes=block_bytes), deadline,
              schedule_what(algo))


def reduce(rail: MPI.Comm, buf: np.ndarray, first: int, op: Op, root: int, *, algo: str = "dbtree",
           block_bytes: int = DEFAULT_BLOCK_BYTES, deadline: Optional[float] = None, threads: int = 1) -> None:
    """buf on rail rank `root` = the op-reduction of buf over all rail ranks; other ranks' buf: unspecified.

    algos "doubling", "halving", "ring" and "gather" run their allreduce (every rank gets the result)."""
    op = _check(rail, buf, first, op, algo, block_bytes, root)
    if rail.Get_size() == 1 or buf.size == 0:
        return
    _run_in_c(rail, schedule(rail, buf, first, op, algo, threads, root=root, block_bytes=block_bytes), deadline,
              schedule_what(algo, root))


def broadcast(rail: MPI.Comm, buf: np.ndarray, first: int, root: int, *,
              block_bytes: int = DEFAULT_BLOCK_BYTES, deadline: Optional[float] = None) -> None:
    """buf on every rail rank = buf of rail rank `root`, in place, down both trees rooted at root."""
    _check(rail, buf, first, Op.SUM, "dbtree", block_bytes, root)
    if rail.Get_size() == 1 or buf.size == 0:
        return
    _run_in_c(rail, broadcast_schedule(rail, buf, first, root, block_bytes=block_bytes), deadline,
              broadcast_what(root))


def allgather(rail: MPI.Comm, buf: np.ndarray, first: int, held: list[list[int]], length: int, *,
              block_bytes: int = DEFAULT_BLOCK_BYTES, deadline: Optional[float] = None) -> None:
    """buf on every rail rank = the elements each rail rank holds of it, in place: rail rank r holds
    [start, start + length) of the global elements for each start of held[r] (allgather_schedule)."""
    _check(rail, buf, first, Op.SUM, "dbtree", block_bytes)
    if rail.Get_size() == 1 or buf.size == 0:
        return
    held = [sorted(starts) for starts in held]
    _run_in_c(rail, allgather_schedule(rail, buf, first, held, length, block_bytes=block_bytes), deadline,
              ALLGATHER_WHAT)


def reduce_scatter(rail: MPI.Comm, buf: np.ndarray, first: int, op, owned: list[list[int]], length: int, *,
                   block_bytes: int = DEFAULT_BLOCK_BYTES, deadline: Optional[float] = None, threads: int = 1) -> None:
    """The elements rail rank r owns of buf (global [start, start + length) for each start of owned[r]) = their
    op-reduction over all rail ranks, on rank r; the rest of buf: unspecified (reduce_scatter_schedule)."""
    op = _check(rail, buf, first, op, "dbtree", block_bytes)
    if rail.Get_size() == 1 or buf.size == 0:
        return
    owned = [sorted(starts) for starts in owned]
    _run_in_c(rail, reduce_scatter_schedule(rail, buf, first, op, owned, length, threads, block_bytes=block_bytes),
              deadline, REDUCE_SCATTER_WHAT)


DOUBLING_UP_TO_BYTES = 64 * 1024
HALVING_UP_TO_BYTES = 1024 * 1024
RING_UP_TO_NODES = 8  # the most hosts the testbed has measured


def choose_algo(nbytes: int, nnodes: int) -> str:
    """The algo for an allreduce of an array of nbytes over nnodes nodes, whatever its dtype (chosen by
    the call's size, never a chunk's: every chunk of a call takes the same algo).

    doubling (log2 n swaps of the whole slice: fewest steps) up to 64 KiB; halving (2 log2 n steps
    moving 2 x the slice in all) up to 1 MiB (both from the shared-memory emulation, not yet re-measured
    on links); above that ring on 2..RING_UP_TO_NODES nodes and dbtree on more. ring is from hosts joined
    by shaped links (bench/multihost_perf.py; bench/RESULTS.md, "The ring in C"): at 1 Gbit/s, 16-64 MiB,
    on 4 hosts x 2 and 8 x 1 it took 0.57-0.78x dbtree's time, as its bytes per link predict (2(n-1)/n
    of the slice against dbtree's 2); beyond 8 nodes its 2(n-1) dependent steps are unmeasured, and
    dbtree's 2 log2 n hops keep the latency down. All of these give bits that do not depend on where the
    caller cuts its array, for every dtype; mpi's do, and gather moves n x the slice to every node, so
    those two are never chosen.
    """
    if nnodes <= 1:
        return "dbtree"  # nothing moves
    if nbytes <= DOUBLING_UP_TO_BYTES:
        return "doubling"
    if nbytes <= HALVING_UP_TO_BYTES:
        return "halving"
    return "ring" if nnodes <= RING_UP_TO_NODES else "dbtree"


# ---------------------------------------------------------------------------------------- arguments


def _check(rail, buf, first, op, algo, block_bytes, root=None) -> Op:
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"buf must be a numpy.ndarray, got {type(buf).__name__}")
    if buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError(f"buf must be 1-D and C-contiguous, got shape {buf.shape} strides {buf.strides}")
    if not buf.flags.writeable:
        raise ValueError("buf is read-only")
    as_dtype(buf.dtype)
    if not isinstance(op, Op) or op not in KERNEL_OPS:
        raise ValueError(f"op must be one of {[o.value for o in KERNEL_OPS]} as an hfr.Op, got {op!r}")
    if int(first) != first or first < 0:
        raise ValueError(f"first must be an integer >= 0, got {first!r}")
    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}: expected one of {list(ALGOS)}")
    if int(block_bytes) != block_bytes or block_bytes < 1:
        raise ValueError(f"block_bytes must be an integer >= 1, got {block_bytes!r}")
    if root is not None and not 0 <= root < rail.Get_size():
        raise ValueError(f"root {root} is out of range for a rail of {rail.Get_size()} ranks")
    return op


_SCRATCH = threading.local()  # per thread: {key: uint8 buffer}, reused so no call pays page faults


def _scratch(key: str, nbytes: int) -> np.ndarray:
    """At least nbytes of scratch (uint8) for `key` (an algo), reused by later calls on this thread."""
    pool = _SCRATCH.__dict__.setdefault("buffers", {})
    buffer = pool.get(key)
    if buffer is None or buffer.size < nbytes:
        buffer = pool[key] = np.empty(nbytes, np.uint8)
    return buffer


# ---------------------------------------------------------------------------------------- dbtree


def _rooted_nodes(rail: MPI.Comm, root: int) -> list[Node]:
    rank, n = rail.Get_rank(), rail.Get_size()
    return [rooted_parent_children(rank, n, which, root) for which in TREES]


def _trees(rail, buf, first, op, nodes, block_bytes, threads, *, up, down, scratch=None) -> TreePipeline:
    """The trees' blocks, up and/or down, as a schedule of hfr/_internode.pyx."""
    granule = TREE_GRANULE_BYTES // buf.itemsize
    block = min(max(1, block_bytes // buf.itemsize), granule, buf.size)
    need = tree_scratch_bytes(len(TREES), block, buf.itemsize) if up else 0
    return TreePipeline(rail, buf, op, _scratch("tree", need) if scratch is None else scratch, threads, first, nodes,
                        granule, block, up, down, _TREE_TAGS)


def _run_in_c(rail: MPI.Comm, schedule, deadline: Optional[float], what: str) -> None:
    """Run one of hfr/_internode.pyx's schedules; HFRTimeoutError naming what is awaited once past deadline.
    A schedule that does not finish (timeout, MPI error, no memory) is abandoned: its receives cancelled,
    it and its buffers kept for good, since MPI may still write there, and this thread's scratch dropped."""
    try:
        done = schedule.run(math.inf if deadline is None else deadline)
    except BaseException:
        abandon(schedule)
        raise
    if not done:
        stopped(rail, schedule, what)


def stopped(rail: MPI.Comm, schedule, what: str) -> NoReturn:
    """Abandon a schedule that did not finish and raise why: its MPI error (MPI.Exception), MemoryError,
    RailPeersFailed (the peers' reports received), or HFRTimeoutError naming what it waits for."""
    try:
        schedule.raise_error()
    except BaseException:
        abandon(schedule)
        raise
    if schedule.peer_failed:
        abandon(schedule)
        reports = _reports(rail, [p for p in range(rail.Get_size()) if p != rail.Get_rank()])
        blamed = sorted({r for _, ranks in reports.values() for r in ranks})
        raise RailPeersFailed(f"rail rank {rail.Get_rank()}: {what}: rail ranks {sorted(reports)} broke", sorted(reports),
                              blamed, bool(reports) and all(timed_out for timed_out, _ in reports.values()))
    waits = "; ".join(schedule.waiting_for())
    error = HFRTimeoutError(f"rail rank {rail.Get_rank()}: {what} timed out waiting for {waits}")
    error.rail_peers = tuple(schedule.awaited())  # the engine names their ranks
    abandon(schedule)
    raise error


def complete(request: MPI.Request, timeout: float, timed_out: Callable[[], BaseException], *buffers,
             vain: Optional[Callable[[], bool]] = None) -> None:
    """Wait for request (an MPI exchange of the Python side: the mismatch report, the settings' check, the
    rail's closing barrier): poll it as every wait in Python does (_wait.until); raise timed_out() once timeout
    seconds pass, or once vain() says it never completes. A signal handler's exception (or close() from one)
    ends the wait too. If the wait ends first, request and buffers are kept for good: MPI may still write there."""
    try:  # a completed request is MPI.REQUEST_NULL
        if (not _wait.until(lambda: request.Test() or vain is not None and vain(), time.monotonic() + timeout)
                or request != MPI.REQUEST_NULL):
            raise timed_out()
    except BaseException:
        keep_for_good(request, *buffers)
        raise


def keep_for_good(*objects) -> None:
    """Keep what MPI may still use (a request no one completes, its buffers) alive for good."""
    _ABANDONED.append(objects)


def abandon(*schedules) -> None:
    """Cancel the receives the schedules (None: none) still have posted and keep them for good."""
    for schedule in schedules:
        if schedule is not None:
            schedule.abandon()
            _ABANDONED.append(schedule)
            _SCRATCH.__dict__.pop("buffers", None)


# ------------------------------------------------------------------------------- who never came
# A rank whose call timed out waiting for ranks of its own node knows them; the ranks of other nodes that
# wait on its node over the rail only know that the node never answered. Every rank whose communicator
# breaks tells its rail so, and whom it blames (report_absent): the ranks it waited for, or the rank that
# failed (itself, or one before it). A rail peer's wait on the rail stops at the report (RailPeersFailed,
# within a signal check's slice) and names those ranks, rather than waiting its own timeout; a rank that
# timed out waiting on a rail peer names the ranks the peer's report names (reported_absent).


class RailPeersFailed(HFRError):
    """A schedule stopped because rail peers reported that their communicators broke (report_absent): the
    rail_peers, the ranks they blame, and whether every one of them timed out."""

    def __init__(self, message: str, rail_peers: list[int], blamed: list[int], timed_out: bool):
        super().__init__(message)
        self.rail_peers, self.blamed, self.timed_out = rail_peers, blamed, timed_out


def report_absent(rail: MPI.Comm, ranks: list[int], timed_out: bool) -> None:
    """Tell every other rank of the rail that this rank's communicator broke: it timed out waiting for ranks
    that never came, or failed (timed_out False), ranks then those it blames (itself, or a rank that
    failed before it). A rail peer's schedule stops at it (hfr/_internode.pyx's poll): this rank never
    takes another step."""
    message = np.array([timed_out, *ranks], np.int64)
    for peer in range(rail.Get_size()):
        if peer != rail.Get_rank():
            keep_for_good(rail.Isend(message, peer, Tag.ABSENT_TAG), message)  # no one may ever receive it


def rail_closed(rail: MPI.Comm, timeout: float) -> bool:
    """Whether every rank of the rail closed healthy within timeout seconds (a barrier over it), so that none
    may still send on it and it can be freed. False once a rail peer reports that it broke (report_absent),
    or at the timeout: then the rail is kept for good, for a message still on its way to a freed
    communicator can reach the one made next with its context (Open MPI then crashes)."""
    if rail.Get_size() == 1:
        return True
    try:
        complete(rail.Ibarrier(), timeout, _RailKept, vain=lambda: rail.Iprobe(MPI.ANY_SOURCE, Tag.ABSENT_TAG))
    except _RailKept:
        keep_for_good(rail)
        return False
    return True


class _RailKept(Exception):
    """rail_closed's barrier will not complete: a peer broke, or the timeout passed."""


def reported_absent(rail: MPI.Comm, peers: list[int], grace: float) -> dict[int, list[int]]:
    """The ranks that each of these rail peers blamed in its report (report_absent) within grace seconds."""
    reports: dict[int, tuple[bool, list[int]]] = {}

    def all_reported() -> bool:
        reports.update(_reports(rail, [p for p in peers if p not in reports]))
        return len(reports) == len(peers)

    _wait.until(all_reported, time.monotonic() + grace)
    return {peer: ranks for peer, (_, ranks) in reports.items()}


def _reports(rail: MPI.Comm, peers: list[int]) -> dict[int, tuple[bool, list[int]]]:
    """The report (report_absent) of each of these rail peers that has sent one this rank has not received:
    whether it timed out, and the ranks it blames."""
    reports: dict[int, tuple[bool, list[int]]] = {}
    status = MPI.Status()
    for peer in peers:
        if rail.Iprobe(peer, Tag.ABSENT_TAG, status):
            message = np.empty(status.Get_count(MPI.INT64_T), np.int64)
            rail.Recv(message, peer, Tag.ABSENT_TAG)
            reports[peer] = (bool(message[0]), [int(r) for r in message[1:]])
    return reports


# ---------------------------------------------------------------------------------------- schedules


def schedule(rail: MPI.Comm, buf: np.ndarray, first: int, op: Op, algo: str, threads: int, *,
             root: Optional[int] = None, block_bytes: int = DEFAULT_BLOCK_BYTES,
             scratch: Optional[np.ndarray] = None) -> Schedule:
    """The schedule (hfr/_internode.pyx) of one allreduce of the slice buf (its global first element
    `first`) by algo, one of ALGOS; with root, of a reduce to rail rank root (dbtree: up the trees rooted
    there; mpi: MPI's Ireduce; the others run their allreduce). To run with _run_in_c, or to poll in C
    between the node's steps (hfr/_node_call.pyx). scratch: room for what the algo receives (default:
    this thread's)."""
    if algo == "dbtree":
        nodes = ([parent_children(rail.Get_rank(), rail.Get_size(), which) for which in TREES] if root is None
                 else _rooted_nodes(rail, root))
        return _trees(rail, buf, first, op, nodes, block_bytes, threads, up=True, down=root is None, scratch=scratch)
    if algo == "ring":
        granule = max(1, RING_GRANULE_BYTES // buf.itemsize)
        need = ring_scratch_elements(first, buf.size, granule, rail.Get_size()) * buf.itemsize
        return Ring(rail, buf, op, _scratch("ring", need) if scratch is None else scratch, threads, Tag.RING_TAG, first,
                    granule)
    if algo in ("doubling", "halving"):
        return Doubling(rail, buf, op, _scratch("doubling", buf.nbytes) if scratch is None else scratch, threads,
                        Tag.DOUBLING_TAG, algo == "halving")
    if algo == "gather":
        gathered = _scratch("gather", rail.Get_size() * buf.nbytes) if scratch is None else scratch
        return Collective(rail, buf, op, gathered, threads, CollectiveKind.GATHER)
    if algo == "mpi":
        datatype, count, mpi_op = _mpi_spec(buf, op)
        kind = CollectiveKind.MPI_ALLREDUCE if root is None else CollectiveKind.MPI_REDUCE
        return Collective(rail, buf, op, _scratch("mpi", 0), threads, kind, datatype, count, mpi_op,
                          0 if root is None else root)
    raise ValueError(f"unknown algo {algo!r}: expected one of {list(ALGOS)}")


def broadcast_schedule(rail: MPI.Comm, buf: np.ndarray, first: int, root: int, *,
                       block_bytes: int = DEFAULT_BLOCK_BYTES) -> TreePipeline:
    """The schedule of one broadcast of the slice buf from rail rank root, down both trees rooted there."""
    return _trees(rail, buf, first, Op.SUM, _rooted_nodes(rail, root), block_bytes, 1, up=False, down=True)


def allgather_schedule(rail: MPI.Comm, buf: np.ndarray, first: int, held: list[list[int]], length: int, *,
                       block_bytes: int = DEFAULT_BLOCK_BYTES) -> Relay:
    """The schedule of an allgather over the rail of the slice buf (its global first element `first`) where
    rail rank r holds the elements [start, start + length) for each start of held[r], ascending (every element
    of the slice held by one): the blocks of what each holds go around the rail from it."""
    blocks = _relay_blocks(rail, buf, first, held, length, block_bytes, 0)
    return Relay(rail, buf.view(np.uint8), Op.SUM, _NO_SCRATCH, 1, Tag.RELAY_TAG, blocks, False)


def reduce_scatter_schedule(rail: MPI.Comm, buf: np.ndarray, first: int, op: Op, owned: list[list[int]],
                            length: int, threads: int, *, block_bytes: int = DEFAULT_BLOCK_BYTES) -> Relay:
    """The schedule of a reduce-scatter over the rail of the slice buf (its global first element `first`),
    where rail rank r owns the elements [start, start + length) for each start of owned[r], ascending (every
    element of the slice owned by one): each owner's blocks go around the rail from its right-hand rank, combined by op
    on the way, what arrives landing in this thread's scratch."""
    blocks = _relay_blocks(rail, buf, first, owned, length, block_bytes, 1)
    return Relay(rail, buf, op, _scratch("relay", buf.nbytes), threads, Tag.RELAY_TAG, blocks, True)


def _relay_blocks(rail: MPI.Comm, buf: np.ndarray, first: int, shards: list[list[int]], length: int,
                  block_bytes: int, after: int) -> list[tuple[int, int, int]]:
    """Relay's blocks (start, a, b) of the slice buf: each rail rank r's shards [start, start + length) of it
    (shards[r], ascending), cut into blocks of at most block_bytes (whole elements), their chains starting
    `after` ranks right of r. Only the shards that meet the slice are looked at: a call makes this per chunk."""
    end, size, n = first + buf.size, buf.itemsize, rail.Get_size()
    if len(shards) != n:
        raise ValueError(f"one list of shards per rail rank ({n}), got {len(shards)}")
    block = max(1, block_bytes // size)
    blocks = []
    for r, starts in enumerate(shards):
        for i in range(bisect.bisect_right(starts, first - length), len(starts)):  # the first ending past first
            if starts[i] >= end:
                break
            stop = min(starts[i] + length, end)
            for lo in range(max(starts[i], first), stop, block):
                blocks.append(((r + after) % n, (lo - first) * size, (min(lo + block, stop) - first) * size))
    return blocks


ALLGATHER_WHAT = "allgather"
REDUCE_SCATTER_WHAT = "reduce-scatter"
_NO_SCRATCH = np.empty(0, np.uint8)


def broadcast_what(root: int) -> str:
    return f"broadcast from {root}"


def schedule_what(algo: str, root: Optional[int] = None) -> str:
    """What a schedule's timeout says it ran: "allreduce (ring)", "reduce to 1 (dbtree)"."""
    return f"allreduce ({algo})" if root is None else f"reduce to {root} ({algo})"


VOTE_WHAT = "the call check's vote"
VOTE_ROOM_BYTES = DOUBLING_UP_TO_BYTES  # the most data a vote record carries


class VoteRecord:
    """Room for the call check's vote records (hfr/_internode.pyx, "vote records"): `votes`, VOTE_WORDS
    int64 [flag, v, -v] that the vote max-reduces, then up to VOTE_ROOM_BYTES of data that it op-reduces
    where every rank voted for the same call; and the scratch for a partner's record."""

    def __init__(self) -> None:
        self.buffer = np.zeros(VOTE_WORDS * 8 + VOTE_ROOM_BYTES, np.uint8)
        self.scratch = np.empty_like(self.buffer)
        self.votes = self.buffer[: VOTE_WORDS * 8].view(np.int64)

    def data(self, count: int, dtype: np.dtype) -> np.ndarray:
        """The record's first count elements of data, as dtype (where its data begins even when empty)."""
        return np.ndarray((count,), dtype, buffer=self.buffer, offset=VOTE_WORDS * 8)


def vote_schedule(rail: MPI.Comm, record: VoteRecord, count: int = 0, dtype: np.dtype = np.dtype(np.int64),
                  op: Op = Op.SUM, threads: int = 1) -> Doubling:
    """The schedule of one call check's vote, in place in record: its votes = their elementwise max over
    the rail and, where every rank voted for the same call, its count elements of data = their op-reduction,
    the bits doubling gives (a doubling on a tag of its own, so that messages a failed data step left
    behind can never match it). May be rewound and run again; schedules of one record run one at a time."""
    return Doubling(rail, record.data(count, dtype), op, record.scratch, threads, Tag.VOTE_TAG, False, record.buffer)


def vote(rail: MPI.Comm, schedule: Doubling, deadline: Optional[float]) -> None:
    """Run a call check's vote (vote_schedule), once made or rewound."""
    if rail.Get_size() > 1:
        _run_in_c(rail, schedule, deadline, VOTE_WHAT)


# ---------------------------------------------------------------------------------------- mpi


def _mpi_spec(buf: np.ndarray, op: Op) -> tuple[MPI.Datatype, int, MPI.Op]:
    """buf as MPI's datatype, count and op: MPI's own types and ops, or hfr's kernel as a user-defined op
    on raw unsigned words for the half types (no MPI type) and for 8-bit sums and products (Open MPI 4.1.6
    saturates them: 3 x int8 100 summed to 127, not NumPy's wrapped 44)."""
    if buf.itemsize > 2 or (buf.itemsize == 1 and op in (Op.MAX, Op.MIN)):
        return MPI.Datatype.fromcode(buf.dtype.char), buf.size, _MPI_OPS[op]
    key = (buf.dtype, op)
    if key not in _OWN_MPI_OPS:
        dtype = buf.dtype

        def combine(inbuf, inoutbuf, datatype) -> None:  # MPI's contract: inoutbuf = inbuf op inoutbuf
            acc = np.frombuffer(inoutbuf, dtype)
            reduce_into(acc, [acc, np.frombuffer(inbuf, dtype)], op, threads=1)

        _OWN_MPI_OPS[key] = MPI.Op.Create(combine, commute=True)
    return MPI.UINT8_T if buf.itemsize == 1 else MPI.UINT16_T, buf.size, _OWN_MPI_OPS[key]
