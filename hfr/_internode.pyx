"""The inter-node algorithms that run in C with the GIL released: dbtree's block pipeline
(TreePipeline), recursive doubling, alone or after recursive halving (Doubling), the ring over
fixed granules (Ring), blocks relayed around the rail (Relay), and MPI's own collectives, polled
(Collective: mpi and gather).
hfr/internode.py checks arguments and chooses; this moves the bytes.

dbtree. Terms as in hfr/internode.py: a *slice* buf holds global elements first .., each tree carries the
granules of its parity, cut into *blocks*; blocks go up a tree (children's blocks received into scratch
slots and combined with our own, the sum sent to the parent) and/or down it (received from the parent
into buf, forwarded to the children). Each stage takes its tree's blocks in order; with the count of
blocks that have passed each stage:
  up:   posted    receives from the children posted (into scratch slot block % IN_FLIGHT)
        combined  children's blocks combined into buf; the send to the parent posted
        sent_up   the send to the parent completed
  down: listening receive from the parent posted (after our own send up of that block completed)
        arrived   the block is final in buf (received, or combined at the root); sends to children posted
        finished  the sends to the children completed
At most IN_FLIGHT blocks are between any two stages, so each stage's requests fit a ring of IN_FLIGHT.

doubling (for small slices: log2 steps instead of a tree's 2 x depth hops). With p the largest power of
two <= n ranks, an *extra* rank r >= p first hands its slice to r - p, which combines the two; then for
d = 1, 2, .. p/2 each rank r < p swaps its partial with r XOR d, and both combine (lower rank's
partial) op (higher rank's); at last r - p hands the result back to r. Both partners of a swap combine
the same operands in the same order, so every rank ends with the same bits, which depend on n, the dtype,
the op and the data alone (not on how the caller cut its array).

halving (Rabenseifner's allreduce, for mid-sized slices; extra ranks as in doubling): for d = p/2 .. 1 each rank
sends its partner (r XOR d) the half of its current range that the partner keeps, receives the half it
keeps and combines it (lower rank's partial first, as above); each rank then owns 1/p of the slice, summed.
For d = 1 .. p/2 the owned ranges are swapped back, so ranges double until every rank holds the whole.
Each element meets the same pairs in the same order, so its bits too depend on n, dtype, op and data alone
(not the same bits as doubling's, which pairs low bit first).

vote records (the call check's vote, hfr/internode.py): a doubling whose every message is a *record*:
VOTE_WORDS int64 *votes*, [flag, v, -v] (v: a call's descriptor), then the data, if any (`count` elements,
at most the room the record buffer has after the votes). Votes combine by max; the data combines as in
doubling only where the two records *agree*: neither flag set, the same v, and v = -(-v) in each (no two
calls met yet). So where every rank voted for the same call the data is allreduced, bit for bit as
doubling would; elsewhere the votes say so and the data is left as it is. Every receive takes the whole
room, since records of different calls differ in length.

ring: reduce-scatter then allgather around the rail over n segments of fixed granules, as
hfr/internode.py defines them; each step posts one message per granule of the segment it sends right and
of the one it receives from the left, and a reduce-scatter step combines (ours op theirs) once all have
arrived. Steps follow one another (the next step's segment is this step's result).

relay (an allgather, or a reduce-scatter of large slices): the slice's bytes are cut into *blocks*, each
with a *chain* of n rail ranks from its start rightwards: an allgather's block starts at the rank that holds
it, a reduce-scatter's one rank right of the rank it is reduced to, and ends at that rank; each rank of the
chain but the last sends the block to its right-hand neighbour once it has it (a reduce-scatter's: once it
has combined its own into what arrived, ours op theirs, so a block's n values are combined in the order of
its chain). Every rank posts the receives of the blocks that come to it at once (into their places in buf,
or a reduce-scatter's into scratch), and sends in one order both ends compute: the blocks whose chain
starts at it, then those starting one rank further left, and so on, each start's in buf's order. Each link
carries every block whose chain does not start at its right-hand rank, once: the slice x (n-1)/n where
every rank starts as much, as a ring does; a slice whose blocks all start at one rank flows down the chain
pipelined in blocks.

mpi and gather (hfr/internode.py says what they give): one nonblocking collective of MPI's, posted on
the first poll and tested after: MPI_Iallreduce in place, MPI_Ireduce (in place at the root), or, for
gather, MPI_Iallgather of the slice's bytes into scratch, whose n rows are then combined into buf in rail
rank order. A collective cannot be cancelled: one that does not finish is kept with its buffers for good.

MPI is called through pointers to the functions of the MPI library that mpi4py loaded, with handles
(communicator, datatype, request) as pointer-sized integers: MPICH's ABI has int handles, Open MPI's
and the MPI standard ABI pointers; either is passed in one register or stack word, of which an int
parameter reads the low half (mpi4py gives MPICH's handles sign-extended to 64 bits), so one binary
serves every ABI mpi4py does, without MPI's headers at build time. Statuses are never read.
"""
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

cimport numpy as cnp
from hfr._kernels cimport STORES_BY_SIZE, Kind, kernel_kind, op_code, reduce_nogil
from hfr._wait cimport ENDED, MOVED, STILL, WAIT_SIGNALLED, Look, hfr_load_acquire, raise_pending, wait_for

import ctypes

import numpy as np

from mpi4py import MPI

cnp.import_array()

__all__ = ["TreePipeline", "Doubling", "Ring", "Relay", "Collective", "CollectiveKind", "ring_scratch_elements",
           "tree_scratch_bytes", "BLOCKS_IN_FLIGHT", "VOTE_RECORD_WORDS", "Tag"]

cdef enum:
    IN_FLIGHT = 4  # blocks per tree between two stages (with 1 MiB blocks 4 and 8 measured alike)
    MAX_CHILDREN = 2
    STATUS_WORDS = 8  # room for any ABI's MPI_Status (20 to 32 bytes)
    PART_BYTES = 1 << 30  # the most bytes a message of doubling's or relay's carries (int counts)

ctypedef int (*isend_fn)(const void* buf, int count, uintptr_t datatype, int dest, int tag, uintptr_t comm,
                         Request* request) noexcept nogil
ctypedef int (*irecv_fn)(void* buf, int count, uintptr_t datatype, int source, int tag, uintptr_t comm,
                         Request* request) noexcept nogil
ctypedef int (*test_fn)(Request* request, int* flag, uint64_t* status) noexcept nogil
ctypedef int (*cancel_fn)(Request* request) noexcept nogil  # also MPI_Request_free's signature
ctypedef int (*iprobe_fn)(int source, int tag, uintptr_t comm, int* flag, uint64_t* status) noexcept nogil
ctypedef int (*iallreduce_fn)(const void* sendbuf, void* recvbuf, int count, uintptr_t datatype, uintptr_t op,
                              uintptr_t comm, Request* request) noexcept nogil
ctypedef int (*ireduce_fn)(const void* sendbuf, void* recvbuf, int count, uintptr_t datatype, uintptr_t op, int root,
                           uintptr_t comm, Request* request) noexcept nogil
ctypedef int (*iallgather_fn)(const void* sendbuf, int sendcount, uintptr_t sendtype, void* recvbuf, int recvcount,
                              uintptr_t recvtype, uintptr_t comm, Request* request) noexcept nogil

cdef isend_fn mpi_isend
cdef irecv_fn mpi_irecv
cdef test_fn mpi_test
cdef cancel_fn mpi_cancel
cdef cancel_fn mpi_request_free
cdef iprobe_fn mpi_iprobe
cdef int mpi_any_source
cdef iallreduce_fn mpi_iallreduce
cdef ireduce_fn mpi_ireduce
cdef iallgather_fn mpi_iallgather
cdef void* mpi_in_place  # MPI_IN_PLACE: (void*)-1 in MPICH, (void*)1 in Open MPI


def _bind_mpi() -> None:
    """Look MPI's functions up in the library mpi4py loaded (dlsym through mpi4py's extension searches
    its dependencies, libmpi among them)."""
    global mpi_isend, mpi_irecv, mpi_test, mpi_cancel, mpi_request_free, mpi_iallreduce, mpi_ireduce, mpi_iallgather
    global mpi_in_place, mpi_iprobe, mpi_any_source
    lib = ctypes.CDLL(MPI.__file__)

    cdef uintptr_t isend = ctypes.cast(lib.MPI_Isend, ctypes.c_void_p).value
    cdef uintptr_t irecv = ctypes.cast(lib.MPI_Irecv, ctypes.c_void_p).value
    cdef uintptr_t test = ctypes.cast(lib.MPI_Test, ctypes.c_void_p).value
    cdef uintptr_t cancel = ctypes.cast(lib.MPI_Cancel, ctypes.c_void_p).value
    cdef uintptr_t request_free = ctypes.cast(lib.MPI_Request_free, ctypes.c_void_p).value
    mpi_isend, mpi_irecv, mpi_test, mpi_cancel = <isend_fn>isend, <irecv_fn>irecv, <test_fn>test, <cancel_fn>cancel
    mpi_request_free = <cancel_fn>request_free
    cdef uintptr_t iprobe = ctypes.cast(lib.MPI_Iprobe, ctypes.c_void_p).value
    mpi_iprobe, mpi_any_source = <iprobe_fn>iprobe, int(MPI.ANY_SOURCE)
    cdef uintptr_t iallreduce = ctypes.cast(lib.MPI_Iallreduce, ctypes.c_void_p).value
    cdef uintptr_t ireduce = ctypes.cast(lib.MPI_Ireduce, ctypes.c_void_p).value
    cdef uintptr_t iallgather = ctypes.cast(lib.MPI_Iallgather, ctypes.c_void_p).value
    mpi_iallreduce, mpi_ireduce = <iallreduce_fn>iallreduce, <ireduce_fn>ireduce
    mpi_iallgather = <iallgather_fn>iallgather
    mpi_in_place = <void*><Py_ssize_t>int(MPI.IN_PLACE)


_bind_mpi()
BLOCKS_IN_FLIGHT = IN_FLIGHT
VOTE_RECORD_WORDS = VOTE_WORDS


ctypedef struct Flow:  # one tree's blocks, moving up and/or down
    int up, down
    int parent  # -1 at the root
    int nchildren
    int children[MAX_CHILDREN]
    int up_tag, down_tag
    Py_ssize_t nblocks
    Py_ssize_t* bounds  # block b is elements [bounds[b], bounds[nblocks + b]) of buf
    char* scratch  # IN_FLIGHT slots of nchildren blocks, slot_bytes each
    Py_ssize_t slot_bytes
    Py_ssize_t posted, combined, sent_up, listening, arrived, finished
    Request child_recv[IN_FLIGHT][MAX_CHILDREN]
    Request parent_send[IN_FLIGHT]
    Request parent_recv[IN_FLIGHT]
    Request child_send[IN_FLIGHT][MAX_CHILDREN]


cdef Py_ssize_t _tree_blocks(Py_ssize_t first, Py_ssize_t count, Py_ssize_t granule, Py_ssize_t block,
                             int which, Py_ssize_t* bounds, Py_ssize_t nblocks) noexcept nogil:
    """The blocks of tree `which` in the slice [first, first + count), as indices into the slice: granule
    g (elements [g * granule, (g + 1) * granule)) belongs to tree g % 2. Counts them; with bounds, also
    writes their starts to bounds[0 ..] and their stops to bounds[nblocks ..]."""
    cdef Py_ssize_t end = first + count, g = first // granule, b = 0, start, stop
    if g % 2 != which:
        g += 1
    while g * granule < end:
        start, stop = max(g * granule, first), min((g + 1) * granule, end)
        while start < stop:
            if bounds != NULL:
                bounds[b], bounds[nblocks + b] = start - first, min(start + block, stop) - first
            b += 1
            start += block
        g += 2
    return b


cdef inline char* _block(Flow* f, Call* c, Py_ssize_t b) noexcept nogil:
    return c.buf + f.bounds[b] * c.itemsize


cdef inline int _block_bytes(Flow* f, Call* c, Py_ssize_t b) noexcept nogil:
    return <int>((f.bounds[f.nblocks + b] - f.bounds[b]) * c.itemsize)  # at most a granule


cdef inline char* _slot(Flow* f, Py_ssize_t b, int child) noexcept nogil:
    return f.scratch + ((b % IN_FLIGHT) * f.nchildren + child) * f.slot_bytes


cdef inline void _failed(int err, Call* c) noexcept nogil:
    if err and not c.error:
        c.error = err


cdef bint _tested(Request* request, Call* c) noexcept nogil:
    """Whether the request is complete (MPI then sets it to MPI_REQUEST_NULL, which tests complete)."""
    cdef int flag = 0
    cdef uint64_t status[STATUS_WORDS]
    _failed(mpi_test(request, &flag, status), c)
    return flag != 0


cdef bint _all_tested(Request* requests, int n, Call* c) noexcept nogil:
    cdef int i
    for i in range(n):
        if not _tested(&requests[i], c):
            return False
    return True


cdef void _advance_up(Flow* f, Call* c) noexcept nogil:
    cdef Py_ssize_t b
    cdef int i
    cdef void* inputs[1 + MAX_CHILDREN]
    cdef bint is_root = f.parent < 0
    while f.posted < min(f.nblocks, f.combined + IN_FLIGHT):
        b = f.posted
        for i in range(f.nchildren):
            _failed(mpi_irecv(_slot(f, b, i), _block_bytes(f, c, b), c.byte, f.children[i], f.up_tag, c.comm,
                              &f.child_recv[b % IN_FLIGHT][i]), c)
        f.posted += 1
    while (f.combined < f.posted and (is_root or f.combined < f.sent_up + IN_FLIGHT)
           and _all_tested(f.child_recv[f.combined % IN_FLIGHT], f.nchildren, c)):
        b = f.combined
        if f.nchildren:  # own + child 0 + child 1, in that order
            inputs[0] = _block(f, c, b)
            for i in range(f.nchildren):
                inputs[1 + i] = _slot(f, b, i)
            if reduce_nogil(c.kind, c.itemsize, _block(f, c, b), inputs, 1 + f.nchildren,
                            _block_bytes(f, c, b) // c.itemsize, c.code, c.threads, 1, STORES_BY_SIZE):
                _failed(NO_MEMORY, c)
                return
        if not is_root:
            _failed(mpi_isend(_block(f, c, b), _block_bytes(f, c, b), c.byte, f.parent, f.up_tag, c.comm,
                              &f.parent_send[b % IN_FLIGHT]), c)
        f.combined += 1
    while f.sent_up < f.combined and not is_root and _tested(&f.parent_send[f.sent_up % IN_FLIGHT], c):
        f.sent_up += 1


cdef void _send_to_children(Flow* f, Call* c) noexcept nogil:
    cdef Py_ssize_t b = f.arrived
    cdef int i
    for i in range(f.nchildren):
        _failed(mpi_isend(_block(f, c, b), _block_bytes(f, c, b), c.byte, f.children[i], f.down_tag, c.comm,
                          &f.child_send[b % IN_FLIGHT][i]), c)
    f.arrived += 1


cdef void _advance_down(Flow* f, Call* c) noexcept nogil:
    cdef Py_ssize_t window_end = f.finished + IN_FLIGHT
    if f.parent < 0:
        while f.arrived < min(f.combined if f.up else f.nblocks, window_end):
            _send_to_children(f, c)
    else:
        while f.listening < min(f.sent_up if f.up else f.nblocks, window_end):
            _failed(mpi_irecv(_block(f, c, f.listening), _block_bytes(f, c, f.listening), c.byte, f.parent,
                              f.down_tag, c.comm, &f.parent_recv[f.listening % IN_FLIGHT]), c)
            f.listening += 1
        while f.arrived < f.listening and _tested(&f.parent_recv[f.arrived % IN_FLIGHT], c):
            _send_to_children(f, c)
    while f.finished < f.arrived and _all_tested(f.child_send[f.finished % IN_FLIGHT], f.nchildren, c):
        f.finished += 1


cdef inline Py_ssize_t _progress(Flow* f) noexcept nogil:
    return f.posted + f.combined + f.sent_up + f.listening + f.arrived + f.finished


cdef inline bint _done(Flow* f) noexcept nogil:
    if f.down:
        return f.finished == f.nblocks
    return (f.combined if f.parent < 0 else f.sent_up) == f.nblocks


# ---- polling --------------------------------------------------------------------------------------------

cdef struct Polled:  # a schedule as wait_for polls it
    advance_fn advance
    void* state
    Call* c
    bint done


cdef Look _advanced(void* state) noexcept nogil:
    """One advance of the schedule: ENDED once done or failed (c.error)."""
    cdef Polled* p = <Polled*>state
    cdef bint moved = p.advance(p.state, p.c, &p.done)
    return ENDED if p.c.error or p.done else MOVED if moved else STILL


cdef bint _rail_gone(void* state) noexcept nogil:
    """Whether a rail peer reported that it broke (c.error PEER_FAILED: the steps that wait for it never end)
    or a rank of our node broke (c.error NODE_PEER_FAILED, where c.watch)."""
    cdef Call* c = (<Polled*>state).c
    if _peer_failed(c):
        c.error = PEER_FAILED
    elif _node_peer_failed(c):
        c.error = NODE_PEER_FAILED
    return c.error != 0


cdef bint poll(advance_fn advance, void* state, Call* c, double deadline) noexcept nogil:
    """Advance until done (True), an MPI call fails (c.error), a signal handler raises (c.error
    INTERRUPTED), a peer is gone (_rail_gone's c.error) or deadline passes (False): a wait (wait_for)."""
    cdef Polled p
    p.advance, p.state, p.c, p.done = advance, state, c, False
    if wait_for(_advanced, _rail_gone, &p, deadline, True) == WAIT_SIGNALLED:
        c.error = INTERRUPTED
    return p.done and not c.error


cdef bint _peer_failed(Call* c) noexcept nogil:
    """Whether a rail peer's report that it broke (hfr/internode.py's report_absent) waits to be received."""
    cdef int flag = 0
    cdef uint64_t status[STATUS_WORDS]
    _failed(mpi_iprobe(mpi_any_source, ABSENT_TAG, c.comm, &flag, status), c)
    return flag != 0


cdef bint _node_peer_failed(Call* c) noexcept nogil:
    """Whether a word c.watch watches reads c.watch_broken."""
    cdef int r
    if c.watch != NULL:
        for r in range(c.watch_rows):
            if hfr_load_acquire(c.watch + r * c.watch_stride) == c.watch_broken:
                return True
    return False


cdef class Schedule:
    """What the C algorithms share: the call's buffers and MPI handles, polling, timeouts. After a
    timeout, keep the object alive for good: it holds buf and the scratch, where MPI may still write.
    (Its C fields are declared in hfr/_internode.pxd.)"""

    def __cinit__(self, comm: MPI.Comm, cnp.ndarray buf not None, op, cnp.ndarray scratch not None, int threads,
                  *args):
        self.buffers = (buf, scratch)
        self.call.buf = <char*>cnp.PyArray_DATA(buf)
        self.call.itemsize = buf.itemsize
        self.call.code = op_code(op)
        self.call.kind = kernel_kind(buf.dtype, self.call.code)
        self.call.threads = threads
        self.call.comm = MPI._handleof(comm)
        self.call.byte = MPI._handleof(MPI.BYTE)
        self.call.error = 0
        self.call.watch = NULL

    def awaited(self) -> list:
        """The rail ranks the step under way waits on, where the schedule says (Doubling does)."""
        return []

    def run(self, double deadline) -> bool:
        """Move every byte with the GIL released: True once done, False once past deadline
        (time.monotonic()'s clock); an MPI error raises MPI.Exception."""
        cdef bint done
        with nogil:
            done = poll(self.advance, self.state, &self.call, deadline)
        if self.call.error == INTERRUPTED:
            raise_pending()
        self.raise_error()
        return done

    @property
    def peer_failed(self) -> bool:
        """Whether a rail peer's report that it broke stopped the schedule (hfr/internode.py's stopped)."""
        return self.call.error == PEER_FAILED

    @property
    def node_peer_failed(self) -> bool:
        """Whether a rank of our node that broke stopped the schedule (Call.watch)."""
        return self.call.error == NODE_PEER_FAILED

    def raise_error(self) -> None:
        """Raise what stopped the schedule, if an MPI call failed (MPI.Exception) or the kernel had no
        memory (MemoryError); nothing if it finished, ran out of time or a peer (of the rail or the node) failed."""
        if self.call.error == NO_MEMORY:
            raise MemoryError("hfr: no memory for the kernel's scratch tiles")
        if self.call.error and self.call.error not in (PEER_FAILED, NODE_PEER_FAILED):
            raise MPI.Exception(self.call.error)

    cdef void _cancel(self, Request* request):
        """Cancel a pending receive and free it (MPI then completes it on its own, cancelled or not)."""
        if not _tested(request, &self.call):
            mpi_cancel(request)
            mpi_request_free(request)


# ---- dbtree ----------------------------------------------------------------------------------------------

ctypedef struct Trees:
    int nflows
    Flow flows[2]


cdef bint _advance_trees(void* state, Call* c, bint* done) noexcept nogil:
    cdef Trees* trees = <Trees*>state
    cdef Py_ssize_t before = 0
    cdef int t
    done[0] = True
    for t in range(trees.nflows):
        before += _progress(&trees.flows[t])
        if trees.flows[t].up:
            _advance_up(&trees.flows[t], c)
        if trees.flows[t].down:
            _advance_down(&trees.flows[t], c)
        before -= _progress(&trees.flows[t])
        done[0] = done[0] and _done(&trees.flows[t])
    return before != 0


cdef class TreePipeline(Schedule):
    """One call's blocks on the trees given, up and/or down."""
    cdef Trees trees

    def __cinit__(self, comm: MPI.Comm, cnp.ndarray buf not None, op, cnp.ndarray scratch not None, int threads,
                  Py_ssize_t first, list nodes, Py_ssize_t granule, Py_ssize_t block, bint up, bint down,
                  list tags):
        """nodes[t] = (parent, children) of this rank in tree t (hfr.dbtree); scratch: contiguous bytes,
        if up room for IN_FLIGHT x MAX_CHILDREN blocks per tree; granule and block in elements, block
        <= granule; tags[t] = (up tag, down tag)."""
        cdef Flow* f
        cdef int t, i
        self.advance, self.state = _advance_trees, &self.trees
        self.trees.nflows = 0
        if not 1 <= block <= granule:
            raise ValueError(f"block must be 1 .. granule ({granule}) elements, got {block}")
        if up and scratch.nbytes < tree_scratch_bytes(len(nodes), block, buf.itemsize):
            raise ValueError(f"scratch holds {scratch.nbytes} bytes, {len(nodes)} trees need "
                             f"{tree_scratch_bytes(len(nodes), block, buf.itemsize)}")
        for t in range(len(nodes)):
            f = &self.trees.flows[t]
            parent, children = nodes[t]
            if len(children) > MAX_CHILDREN:
                raise ValueError(f"tree {t}: {len(children)} children, at most {MAX_CHILDREN}")
            f.up, f.down, f.parent, f.nchildren = up, down, parent, len(children)
            for i in range(f.nchildren):
                f.children[i] = children[i]
            f.up_tag, f.down_tag = tags[t]
            f.posted = f.combined = f.sent_up = f.listening = f.arrived = f.finished = 0
            f.nblocks = _tree_blocks(first, buf.shape[0], granule, block, t, NULL, 0)
            f.bounds = <Py_ssize_t*>malloc(max(1, 2 * f.nblocks) * sizeof(Py_ssize_t))
            if f.bounds == NULL:
                raise MemoryError()
            self.trees.nflows += 1
            _tree_blocks(first, buf.shape[0], granule, block, t, f.bounds, f.nblocks)
            f.slot_bytes = block * buf.itemsize
            f.scratch = <char*>cnp.PyArray_DATA(scratch) + t * IN_FLIGHT * MAX_CHILDREN * f.slot_bytes

    def __dealloc__(self):
        for t in range(self.trees.nflows):
            free(self.trees.flows[t].bounds)

    def waiting_for(self) -> list:
        """The head block of each stage that is stuck, and the peers it waits on, in words."""
        cdef Flow* f
        cdef int t
        waits = []
        for t in range(self.trees.nflows):
            f = &self.trees.flows[t]
            if f.up and f.combined < f.posted:
                self._report(waits, f"tree {t} block {f.combined} from child", f.child_recv[f.combined % IN_FLIGHT],
                             f.children, f.nchildren)
            if f.parent >= 0 and f.sent_up < f.combined:
                self._report(waits, f"tree {t} block {f.sent_up} to be taken by parent",
                             &f.parent_send[f.sent_up % IN_FLIGHT], &f.parent, 1)
            if f.parent >= 0 and f.arrived < f.listening:
                self._report(waits, f"tree {t} block {f.arrived} from parent", &f.parent_recv[f.arrived % IN_FLIGHT],
                             &f.parent, 1)
            if f.finished < f.arrived:
                self._report(waits, f"tree {t} block {f.finished} to be taken by child",
                             f.child_send[f.finished % IN_FLIGHT], f.children, f.nchildren)
        return waits

    cdef _report(self, list waits, str where, Request* requests, int* peers, int n):
        """Append `where` and the peers whose request is not complete, if any, to waits."""
        late = [str(peers[i]) for i in range(n) if not _tested(&requests[i], &self.call)]
        if late:
            waits.append(f"{where} {', '.join(late)}")

    def abandon(self) -> None:
        """Cancel the receives still posted (the sends stay as they are)."""
        cdef Flow* f
        cdef Py_ssize_t b
        cdef int i, t
        for t in range(self.trees.nflows):
            f = &self.trees.flows[t]
            for b in range(f.combined, f.posted):
                for i in range(f.nchildren):
                    self._cancel(&f.child_recv[b % IN_FLIGHT][i])
            for b in range(f.arrived, f.listening):
                self._cancel(&f.parent_recv[b % IN_FLIGHT])


# ---- doubling and halving --------------------------------------------------------------------------------

cdef enum Received:  # what a step does with the peer's elements
    NOTHING  # this step only sends
    OWN_FIRST  # mine = mine op theirs
    THEIRS_FIRST  # mine = theirs op mine
    RESULT  # theirs are final: received straight into buf

ctypedef struct Step:  # one exchange with one peer; element ranges [lo, hi) of buf
    int peer
    bint sends  # whether this step sends (its range, which may be empty; a record's votes)
    Py_ssize_t send_lo, send_hi
    Py_ssize_t recv_lo, recv_hi
    Received received

ctypedef struct Swaps:
    int nsteps
    Step steps[2 * 64 + 2]  # hand-off, up to 64 halvings and 64 doublings, hand-back
    int step  # the step under way
    bint posted  # whether its requests are posted
    int tag
    int parts  # room for this many messages per direction (a range goes in parts of at most PART_BYTES)
    char* theirs  # scratch for the peer's elements
    Request* requests  # parts sends, then parts receives
    Py_ssize_t head  # vote records: the votes' bytes before buf (and before theirs); 0 without
    Py_ssize_t record_bytes  # vote records: the room a receive takes, votes included


cdef int _post(char* data, Py_ssize_t nbytes, bint send, int peer, Swaps* s, Request* requests,
               Call* c) noexcept nogil:
    """Post nbytes at data to or from peer in parts of at most PART_BYTES; returns the number of parts."""
    cdef Py_ssize_t offset = 0
    cdef int i = 0
    while offset < nbytes:
        if send:
            _failed(mpi_isend(data + offset, <int>min(PART_BYTES, nbytes - offset), c.byte, peer, s.tag, c.comm,
                              &requests[i]), c)
        else:
            _failed(mpi_irecv(data + offset, <int>min(PART_BYTES, nbytes - offset), c.byte, peer, s.tag, c.comm,
                              &requests[i]), c)
        offset += PART_BYTES
        i += 1
    return i


cdef inline int _nparts(Py_ssize_t nbytes) noexcept nogil:
    return <int>((nbytes + PART_BYTES - 1) // PART_BYTES)


cdef inline Py_ssize_t _send_bytes(Swaps* s, Step* step, Call* c) noexcept nogil:
    """What the step sends, from c.buf + send_lo - head: its range, after a record's votes."""
    return s.head + (step.send_hi - step.send_lo) * c.itemsize if step.sends else 0


cdef inline Py_ssize_t _recv_bytes(Swaps* s, Step* step, Call* c) noexcept nogil:
    """What the step receives, to its place - head: its range, or a record's whole room."""
    if step.received == NOTHING:
        return 0
    return s.record_bytes if s.head else (step.recv_hi - step.recv_lo) * c.itemsize


cdef bint _merge_votes(long long* mine, const long long* theirs) noexcept nogil:
    """mine = the elementwise max of two records' votes; returns whether the records agreed before: voted
    for the same call, with no mismatch met yet (the module notes)."""
    cdef int i
    cdef bint agree = votes_agree(mine) and not theirs[0]
    for i in range(1, VOTE_WORDS):
        agree = agree and mine[i] == theirs[i]
    for i in range(VOTE_WORDS):
        mine[i] = max(mine[i], theirs[i])
    return agree


cdef bint _advance_swaps(void* state, Call* c, bint* done) noexcept nogil:
    cdef Swaps* s = <Swaps*>state
    cdef Step* step
    cdef void* inputs[2]
    cdef char* mine
    cdef Py_ssize_t count
    cdef bint moved = False
    while s.step < s.nsteps:
        step = &s.steps[s.step]
        count = step.recv_hi - step.recv_lo
        mine = c.buf + step.recv_lo * c.itemsize
        if not s.posted:
            _post((mine if step.received == RESULT else s.theirs) - s.head, _recv_bytes(s, step, c), False,
                  step.peer, s, s.requests + s.parts, c)
            _post(c.buf + step.send_lo * c.itemsize - s.head, _send_bytes(s, step, c), True, step.peer, s,
                  s.requests, c)
            s.posted, moved = True, True
        if not (_all_tested(s.requests, _nparts(_send_bytes(s, step, c)), c)
                and _all_tested(s.requests + s.parts, _nparts(_recv_bytes(s, step, c)), c)):
            break
        # a record's votes merge first; its data combines only where the two records agreed
        if (step.received == OWN_FIRST or step.received == THEIRS_FIRST) and (
                not s.head or _merge_votes(<long long*>(mine - s.head), <long long*>(s.theirs - s.head))):
            # the kernel's out may alias its first input only: theirs first goes into theirs, then to buf
            inputs[0], inputs[1] = (mine, s.theirs) if step.received == OWN_FIRST else (s.theirs, mine)
            if reduce_nogil(c.kind, c.itemsize, inputs[0], inputs, 2, count, c.code, c.threads, 1, STORES_BY_SIZE):
                _failed(NO_MEMORY, c)
                break
            if step.received == THEIRS_FIRST:
                memcpy(mine, s.theirs, count * c.itemsize)
        s.step, s.posted, moved = s.step + 1, False, True
    done[0] = s.step == s.nsteps
    return moved


cdef class Doubling(Schedule):
    """One call's recursive doubling, or with halving its recursive halving then doubling, or a doubling
    of vote records (the module notes)."""
    cdef Swaps swaps

    def __cinit__(self, comm: MPI.Comm, cnp.ndarray buf not None, op, cnp.ndarray scratch not None, int threads,
                  int tag, bint halving, cnp.ndarray record=None):
        """scratch: contiguous room for buf's bytes. With record (uint8, contiguous; doubling only), a
        doubling of vote records: buf lies in record right after its votes, and scratch has room for
        all of record, the room every receive takes."""
        cdef int rank = comm.Get_rank(), n = comm.Get_size(), p = 1, d
        cdef Py_ssize_t size = buf.shape[0], lo = 0, hi = size, half
        cdef Py_ssize_t los[64]
        cdef Py_ssize_t his[64]
        cdef int k = 0
        cdef Swaps* s = &self.swaps
        self.advance, self.state = _advance_swaps, s
        s.requests = NULL
        s.head = s.record_bytes = 0
        if record is not None:
            self.buffers += (record,)
            s.head, s.record_bytes = VOTE_WORDS * sizeof(long long), record.nbytes
            if halving or not record.flags.c_contiguous or record.dtype.itemsize != 1:
                raise ValueError("a vote record is a contiguous uint8 array, and takes doubling only")
            if (<char*>cnp.PyArray_DATA(buf) != <char*>cnp.PyArray_DATA(record) + s.head
                    or record.nbytes < s.head + buf.nbytes or record.nbytes > PART_BYTES):
                raise ValueError(f"buf must lie in record right after its {VOTE_WORDS} votes "
                                 f"(record of {record.nbytes} bytes, buf of {buf.nbytes})")
        if scratch.nbytes < max(buf.nbytes, s.record_bytes):
            raise ValueError(f"scratch holds {scratch.nbytes} bytes, buf {buf.nbytes}, record {s.record_bytes}")
        while 2 * p <= n:
            p *= 2
        s.nsteps = s.step = s.posted = 0
        s.tag, s.theirs = tag, <char*>cnp.PyArray_DATA(scratch) + s.head
        s.parts = max(1, _nparts(buf.nbytes))
        s.requests = <Request*>calloc(2 * s.parts, sizeof(Request))
        if s.requests == NULL:
            raise MemoryError()
        if rank >= p:  # an extra rank: hand off, then wait for the result
            self._add(rank - p, True, 0, size, 0, 0, NOTHING)
            self._add(rank - p, False, 0, 0, 0, size, RESULT)
            return
        if rank + p < n:
            self._add(rank + p, False, 0, 0, 0, size, OWN_FIRST)
        if halving:  # d = p/2 .. 1: keep the half on my side of bit d, send the other, combine the kept one
            d = p // 2
            while d >= 1:
                los[k], his[k], half = lo, hi, (hi - lo) // 2
                if rank & d:
                    self._add(rank ^ d, True, lo, lo + half, lo + half, hi, THEIRS_FIRST)
                    lo += half
                else:
                    self._add(rank ^ d, True, lo + half, hi, lo, lo + half, OWN_FIRST)
                    hi = lo + half
                k += 1
                d //= 2
            d = 1
            while d < p:  # then the halves back, in reverse: I own [lo, hi) of the range I split at this d
                k -= 1
                if rank & d:
                    self._add(rank ^ d, True, lo, hi, los[k], lo, RESULT)
                else:
                    self._add(rank ^ d, True, lo, hi, hi, his[k], RESULT)
                lo, hi = los[k], his[k]
                d *= 2
        else:
            d = 1
            while d < p:
                self._add(rank ^ d, True, 0, size, 0, size, OWN_FIRST if rank < rank ^ d else THEIRS_FIRST)
                d *= 2
        if rank + p < n:
            self._add(rank + p, True, 0, size, 0, 0, NOTHING)

    cdef void _add(self, int peer, bint sends, Py_ssize_t send_lo, Py_ssize_t send_hi, Py_ssize_t recv_lo,
                   Py_ssize_t recv_hi, Received received):
        self.swaps.steps[self.swaps.nsteps] = Step(peer, sends, send_lo, send_hi, recv_lo, recv_hi, received)
        self.swaps.nsteps += 1

    def __dealloc__(self):
        free(self.swaps.requests)

    def rewind(self) -> None:
        """Make the schedule ready to run again from its first step, over the same buffers (the engine
        reuses one per call shape). Only one that finished, or never started, may: ValueError otherwise."""
        cdef Swaps* s = &self.swaps
        if self.call.error or s.posted or 0 < s.step < s.nsteps:
            raise ValueError(f"hfr: a schedule stopped at step {s.step} of {s.nsteps} cannot run again")
        s.step = 0

    def waiting_for(self) -> list:
        """The step under way and the peer it waits on, in words."""
        cdef Swaps* s = &self.swaps
        cdef Step* step
        waits = []
        if s.step < s.nsteps and s.posted:
            step = &s.steps[s.step]
            if not _all_tested(s.requests, _nparts(_send_bytes(s, step, &self.call)), &self.call):
                waits.append(f"step {s.step}: to be taken by {step.peer}")
            if not _all_tested(s.requests + s.parts, _nparts(_recv_bytes(s, step, &self.call)), &self.call):
                waits.append(f"step {s.step}: from {step.peer}")
        return waits

    def awaited(self) -> list:
        """The rail ranks the step under way waits on (its peer), or none."""
        cdef Swaps* s = &self.swaps
        return [s.steps[s.step].peer] if s.step < s.nsteps and s.posted else []

    def abandon(self) -> None:
        """Cancel the receives still posted (the sends stay as they are)."""
        cdef Swaps* s = &self.swaps
        cdef int i
        if s.step < s.nsteps and s.posted:
            for i in range(_nparts(_recv_bytes(s, &s.steps[s.step], &self.call))):
                self._cancel(&s.requests[s.parts + i])


# ---- ring ------------------------------------------------------------------------------------------------

ctypedef struct RingState:
    int rank, n, left, right
    Py_ssize_t first, size, granule  # the slice's global first element, its length, the granule (elements)
    int step  # 0 .. n-2: reduce-scatter; n-1 .. 2n-3: allgather
    bint posted  # whether the step's requests are posted
    int tag
    char* theirs  # scratch for a reduce-scatter step's received segment, its pieces packed in order
    int room  # requests for this many pieces each way
    int nsends, nrecvs  # posted this step
    Request* requests  # room sends, then room receives


cdef inline Py_ssize_t _first_granule(RingState* r, int segment) noexcept nogil:
    """The first granule of the slice in `segment` (granule g is in segment g % n)."""
    cdef Py_ssize_t g0 = r.first // r.granule
    return g0 + ((segment - g0) % r.n + r.n) % r.n


cdef int _post_segment(RingState* r, Call* c, int segment, bint send, bint packed) noexcept nogil:
    """Post one message per granule of `segment` in the slice: sends to the right, or receives from the
    left (packed into theirs, or each into its place in buf). Returns how many."""
    cdef Py_ssize_t g = _first_granule(r, segment), end = r.first + r.size, lo, hi, at = 0
    cdef int i = 0
    cdef Request* requests = r.requests if send else r.requests + r.room
    while g * r.granule < end:
        lo, hi = max(g * r.granule, r.first) - r.first, min((g + 1) * r.granule, end) - r.first
        if send:
            _failed(mpi_isend(c.buf + lo * c.itemsize, <int>((hi - lo) * c.itemsize), c.byte, r.right, r.tag,
                              c.comm, &requests[i]), c)
        else:
            _failed(mpi_irecv((r.theirs + at * c.itemsize) if packed else (c.buf + lo * c.itemsize),
                              <int>((hi - lo) * c.itemsize), c.byte, r.left, r.tag, c.comm, &requests[i]), c)
        at += hi - lo
        g += r.n
        i += 1
    return i


cdef int _combine_segment(RingState* r, Call* c, int segment) noexcept nogil:
    """Each granule of `segment` in buf = buf op the received partial (ours first, as the Python ring did)."""
    cdef Py_ssize_t g = _first_granule(r, segment), end = r.first + r.size, lo, hi, at = 0
    cdef void* inputs[2]
    while g * r.granule < end:
        lo, hi = max(g * r.granule, r.first) - r.first, min((g + 1) * r.granule, end) - r.first
        inputs[0], inputs[1] = c.buf + lo * c.itemsize, r.theirs + at * c.itemsize
        if reduce_nogil(c.kind, c.itemsize, inputs[0], inputs, 2, hi - lo, c.code, c.threads, 1, STORES_BY_SIZE):
            return NO_MEMORY
        at += hi - lo
        g += r.n
    return 0


def ring_pieces(Py_ssize_t first, Py_ssize_t size, Py_ssize_t granule, int n) -> int:
    """The most granules of the slice [first, first + size) that one of n segments holds."""
    granules = (first + size + granule - 1) // granule - first // granule
    return (granules + n - 1) // n


def tree_scratch_bytes(int trees, Py_ssize_t block, Py_ssize_t itemsize) -> int:
    """The trees' scratch going up: per tree, IN_FLIGHT slots of MAX_CHILDREN blocks of `block` elements."""
    return trees * IN_FLIGHT * MAX_CHILDREN * block * itemsize


def ring_scratch_elements(Py_ssize_t first, Py_ssize_t size, Py_ssize_t granule, int n) -> int:
    """Ring's scratch: room for the largest segment's elements."""
    return min(ring_pieces(first, size, granule, n) * granule, size)


cdef inline int _mod(int a, int n) noexcept nogil:
    return (a % n + n) % n


cdef bint _advance_ring(void* state, Call* c, bint* done) noexcept nogil:
    cdef RingState* r = <RingState*>state
    cdef bint moved = False, scatter
    cdef int s, received
    while r.step < 2 * (r.n - 1):
        scatter = r.step < r.n - 1
        s = r.step if scatter else r.step - (r.n - 1)
        # reduce-scatter: send segment rank - s, receive rank - s - 1; allgather one segment later
        received = _mod(r.rank - s - 1 + (0 if scatter else 1), r.n)
        if not r.posted:
            r.nrecvs = _post_segment(r, c, received, False, scatter)
            r.nsends = _post_segment(r, c, _mod(received + 1, r.n), True, False)
            r.posted, moved = True, True
        if not (_all_tested(r.requests, r.nsends, c) and _all_tested(r.requests + r.room, r.nrecvs, c)):
            break
        if scatter and _combine_segment(r, c, received):
            _failed(NO_MEMORY, c)
            break
        r.step, r.posted, moved = r.step + 1, False, True
    done[0] = r.step == 2 * (r.n - 1)
    return moved


cdef class Ring(Schedule):
    """One call's ring allreduce over fixed granules (hfr/internode.py's terms): n - 1 reduce-scatter steps,
    then n - 1 allgather steps, each a message per granule of one segment each way."""
    cdef RingState ring

    def __cinit__(self, comm: MPI.Comm, cnp.ndarray buf not None, op, cnp.ndarray scratch not None, int threads,
                  int tag, Py_ssize_t first, Py_ssize_t granule):
        """scratch: room for the largest segment's elements; granule in elements."""
        cdef RingState* r = &self.ring
        cdef Py_ssize_t need
        self.advance, self.state = _advance_ring, r
        r.requests = NULL
        r.rank, r.n = comm.Get_rank(), comm.Get_size()
        r.left, r.right = _mod(r.rank - 1, r.n), (r.rank + 1) % r.n
        r.first, r.size, r.granule = first, buf.shape[0], granule
        r.step, r.posted, r.tag, r.nsends, r.nrecvs = 0, False, tag, 0, 0
        r.room = <int>ring_pieces(first, r.size, granule, r.n)
        need = ring_scratch_elements(first, r.size, granule, r.n) * buf.itemsize
        if scratch.nbytes < need:
            raise ValueError(f"scratch holds {scratch.nbytes} bytes, a segment up to {need}")
        r.theirs = <char*>cnp.PyArray_DATA(scratch)
        r.requests = <Request*>calloc(2 * max(1, r.room), sizeof(Request))
        if r.requests == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.ring.requests)

    def waiting_for(self) -> list:
        """The step under way and its neighbours, in words."""
        cdef RingState* r = &self.ring
        if r.step >= 2 * (r.n - 1):
            return []
        phase, s = ("reduce-scatter", r.step) if r.step < r.n - 1 else ("allgather", r.step - (r.n - 1))
        return [f"ring {phase} step {s}: rank {r.left} to send, rank {r.right} to receive"]

    def abandon(self) -> None:
        """Cancel the receives still posted (the sends stay as they are)."""
        cdef RingState* r = &self.ring
        cdef int i
        if r.posted:
            for i in range(r.nrecvs):
                self._cancel(&r.requests[r.room + i])


# ---- relay -----------------------------------------------------------------------------------------------

ctypedef struct RelayState:
    int rank, n, left, right, tag
    bint combine  # a reduce-scatter's: a block received is combined into buf before it goes on
    const long long* blocks  # rows (start, a, b): bytes [a, b) of buf, whose chain starts at rail rank `start`
    int nrecvs, nsends  # blocks this rank receives (from the left), and sends (to the right)
    int* recv_rows  # the rows received, in the order the left sends them
    int* send_rows  # the rows sent, in that order
    int* arrival  # per row: where its receive is in recv_rows (-1: none, the chain starts here)
    char* landing  # where receives land: buf (allgather) or scratch
    Py_ssize_t* landed  # per receive: its offset there
    bint posted  # the receives
    int received, sends_posted, sent  # receives completed (and combined), sends posted and completed, in order
    Request* recvs
    Request* sends


cdef bint _advance_relay(void* state, Call* c, bint* done) noexcept nogil:
    cdef RelayState* r = <RelayState*>state
    cdef const long long* row
    cdef void* inputs[2]
    cdef bint moved = False
    cdef int i, at
    if not r.posted:
        for i in range(r.nrecvs):
            row = r.blocks + 3 * r.recv_rows[i]
            _failed(mpi_irecv(r.landing + r.landed[i], <int>(row[2] - row[1]), c.byte, r.left, r.tag, c.comm,
                              &r.recvs[i]), c)
        r.posted = moved = True
    while r.received < r.nrecvs and _tested(&r.recvs[r.received], c):
        if r.combine:  # ours op the partial from the left
            row = r.blocks + 3 * r.recv_rows[r.received]
            inputs[0], inputs[1] = c.buf + row[1], r.landing + r.landed[r.received]
            if reduce_nogil(c.kind, c.itemsize, inputs[0], inputs, 2, (row[2] - row[1]) // c.itemsize, c.code,
                            c.threads, 1, STORES_BY_SIZE):
                _failed(NO_MEMORY, c)
                return moved
        r.received += 1
        moved = True
    while r.sends_posted < r.nsends:  # a block goes on once we hold it, in the order the right receives them
        at = r.arrival[r.send_rows[r.sends_posted]]
        if at >= r.received:
            break
        row = r.blocks + 3 * r.send_rows[r.sends_posted]
        _failed(mpi_isend(c.buf + row[1], <int>(row[2] - row[1]), c.byte, r.right, r.tag, c.comm,
                          &r.sends[r.sends_posted]), c)
        r.sends_posted += 1
        moved = True
    while r.sent < r.sends_posted and _tested(&r.sends[r.sent], c):
        r.sent += 1
        moved = True
    done[0] = r.received == r.nrecvs and r.sent == r.nsends
    return moved


cdef class Relay(Schedule):
    """One relay of the slice buf around the rail (the module notes): blocks, (start, a, b), the bytes [a, b)
    of buf (whole elements), each at most PART_BYTES, whose chain starts at rail rank `start`; every rank
    passes the same blocks. combine: a reduce-scatter's (op; scratch holds buf's bytes), else an
    allgather's."""
    cdef RelayState relay

    def __cinit__(self, comm: MPI.Comm, cnp.ndarray buf not None, op, cnp.ndarray scratch not None, int threads,
                  int tag, blocks, bint combine):
        cdef RelayState* r = &self.relay
        cdef Py_ssize_t offset = 0
        cdef int i
        self.advance, self.state = _advance_relay, r
        r.recv_rows = r.send_rows = r.arrival = NULL
        r.landed, r.recvs, r.sends = NULL, NULL, NULL
        r.rank, r.n, r.tag, r.combine = comm.Get_rank(), comm.Get_size(), tag, combine
        r.left, r.right = _mod(r.rank - 1, r.n), (r.rank + 1) % r.n
        for start, a, b in blocks:
            if not (0 <= start < r.n and 0 <= a < b <= buf.nbytes and b - a <= PART_BYTES
                    and a % buf.itemsize == b % buf.itemsize == 0):
                raise ValueError(f"block ({start}, {a}, {b}) is not a rail rank's nonempty range of whole elements, "
                                 f"at most {PART_BYTES} bytes, of buf's {buf.nbytes}")
        ends = sorted((a, b) for _, a, b in blocks)
        if any(b > a for (_, b), (a, _) in zip(ends, ends[1:])):
            raise ValueError(f"blocks {blocks} overlap")
        if combine and scratch.nbytes < buf.nbytes:
            raise ValueError(f"scratch holds {scratch.nbytes} bytes, a reduce-scatter's relay up to {buf.nbytes}")
        rows = np.array(blocks, np.int64).reshape(-1, 3)
        self.buffers += (rows,)
        r.blocks = <const long long*>cnp.PyArray_DATA(rows)
        r.landing = <char*>cnp.PyArray_DATA(scratch if combine else buf)
        # a block's chain runs from its start rightwards to the start's left neighbour; a rank sends the blocks
        # whose chain starts at it, then those starting one rank further left, and so on, each start's in buf's
        # order: the order its right neighbour receives them in
        n = r.n

        def sender_order(int sender):  # hops back from the sender to the chain's start, then place in buf
            return lambda i: ((sender - blocks[i][0]) % n, blocks[i][1])

        received = sorted((i for i in range(len(blocks)) if blocks[i][0] != r.rank), key=sender_order(r.left))
        sent = sorted((i for i in range(len(blocks)) if blocks[i][0] != r.right), key=sender_order(r.rank))
        r.nrecvs, r.nsends = len(received), len(sent)
        r.recv_rows = <int*>malloc(max(1, r.nrecvs) * sizeof(int))
        r.send_rows = <int*>malloc(max(1, r.nsends) * sizeof(int))
        r.arrival = <int*>malloc(max(1, len(blocks)) * sizeof(int))
        r.landed = <Py_ssize_t*>malloc(max(1, r.nrecvs) * sizeof(Py_ssize_t))
        r.recvs = <Request*>calloc(max(1, r.nrecvs), sizeof(Request))
        r.sends = <Request*>calloc(max(1, r.nsends), sizeof(Request))
        if not (r.recv_rows and r.send_rows and r.arrival and r.landed and r.recvs and r.sends):
            raise MemoryError()
        for i in range(len(blocks)):
            r.arrival[i] = -1
        for i, row in enumerate(received):
            r.recv_rows[i], r.arrival[row] = row, i
            r.landed[i] = offset if combine else blocks[row][1]
            offset += blocks[row][2] - blocks[row][1]
        for i, row in enumerate(sent):
            r.send_rows[i] = row
        r.posted, r.received, r.sends_posted, r.sent = False, 0, 0, 0

    def __dealloc__(self):
        free(self.relay.recv_rows)
        free(self.relay.send_rows)
        free(self.relay.arrival)
        free(self.relay.landed)
        free(self.relay.recvs)
        free(self.relay.sends)

    def awaited(self) -> list:
        """The neighbours whose part is under way: the left while blocks are to come, the right while sends
        are pending."""
        cdef RelayState* r = &self.relay
        late = []
        if r.posted and r.received < r.nrecvs:
            late.append(r.left)
        if r.sent < r.sends_posted and r.right not in late:
            late.append(r.right)
        return late

    def waiting_for(self) -> list:
        """The blocks under way and their neighbours, in words."""
        cdef RelayState* r = &self.relay
        waits = []
        if r.posted and r.received < r.nrecvs:
            waits.append(f"block {r.received} of {r.nrecvs} from rank {r.left}")
        if r.sent < r.sends_posted:
            waits.append(f"block {r.sent} of {r.nsends} to be taken by rank {r.right}")
        return waits

    def abandon(self) -> None:
        """Cancel the receives still posted (the sends stay as they are)."""
        cdef RelayState* r = &self.relay
        cdef int i
        if r.posted:
            for i in range(r.received, r.nrecvs):
                self._cancel(&r.recvs[i])


# ---- MPI's own collectives (mpi, gather) -----------------------------------------------------------------

cpdef enum CollectiveKind:
    MPI_ALLREDUCE, MPI_REDUCE, GATHER

ctypedef struct CollectiveState:
    CollectiveKind kind
    int count  # of datatype's items (gather: the slice's bytes)
    uintptr_t datatype, op  # handles
    int root, rank, n
    Py_ssize_t elements  # buf's, which gather's rows combine into
    char* gathered  # gather: n rows of the slice's bytes, in rail-rank order
    void** rows  # gather: where each row begins
    bint posted, finished
    Request request


cdef int _post_collective(CollectiveState* s, Call* c) noexcept nogil:
    if s.kind == MPI_ALLREDUCE:
        return mpi_iallreduce(mpi_in_place, c.buf, s.count, s.datatype, s.op, c.comm, &s.request)
    if s.kind == MPI_REDUCE:
        return mpi_ireduce(mpi_in_place if s.rank == s.root else c.buf, c.buf if s.rank == s.root else NULL,
                           s.count, s.datatype, s.op, s.root, c.comm, &s.request)
    return mpi_iallgather(c.buf, s.count, c.byte, s.gathered, s.count, c.byte, c.comm, &s.request)


cdef bint _advance_collective(void* state, Call* c, bint* done) noexcept nogil:
    cdef CollectiveState* s = <CollectiveState*>state
    cdef bint moved = False
    if not s.posted:
        _failed(_post_collective(s, c), c)
        if c.error:
            return False
        s.posted = moved = True
    if not s.finished:
        if not _tested(&s.request, c):
            return moved
        s.finished = moved = True
        if s.kind == GATHER:  # the rows combined in rail-rank order: the same expression on every rank
            if reduce_nogil(c.kind, c.itemsize, c.buf, s.rows, s.n, s.elements, c.code, c.threads, 1,
                            STORES_BY_SIZE):
                _failed(NO_MEMORY, c)
                return False
    done[0] = True
    return moved


cdef class Collective(Schedule):
    """One of MPI's nonblocking collectives over the rail (the module notes): kind MPI_ALLREDUCE or
    MPI_REDUCE of buf as `count` items of `datatype` by `mpi_op` (mpi4py objects; root for the reduce), or
    GATHER, buf's bytes gathered into scratch (n x buf's bytes) and combined by op."""
    cdef CollectiveState coll

    def __cinit__(self, comm: MPI.Comm, cnp.ndarray buf not None, op, cnp.ndarray scratch not None, int threads,
                  CollectiveKind kind, datatype=None, int count=0, mpi_op=None, int root=0):
        cdef CollectiveState* s = &self.coll
        cdef int i
        self.advance, self.state = _advance_collective, s
        s.kind, s.root, s.rank, s.n = kind, root, comm.Get_rank(), comm.Get_size()
        s.elements, s.posted, s.finished, s.rows = buf.shape[0], False, False, NULL
        if buf.nbytes > 2147483647:
            raise ValueError(f"one collective moves at most 2 GiB - 1 bytes here, not {buf.nbytes}")
        if kind == GATHER:
            if scratch.nbytes < s.n * buf.nbytes:
                raise ValueError(f"scratch holds {scratch.nbytes} bytes, gather needs {s.n * buf.nbytes}")
            s.count, s.gathered = buf.nbytes, <char*>cnp.PyArray_DATA(scratch)
            s.rows = <void**>malloc(s.n * sizeof(void*))
            if s.rows == NULL:
                raise MemoryError()
            for i in range(s.n):
                s.rows[i] = s.gathered + i * <Py_ssize_t>s.count
            return
        if datatype is None or mpi_op is None or not 0 <= root < s.n:
            raise ValueError(f"MPI's allreduce or reduce needs a datatype, an op and a root in range, got "
                             f"{datatype!r}, {mpi_op!r}, {root}")
        self.buffers += (datatype, mpi_op)
        s.count, s.datatype, s.op = count, MPI._handleof(datatype), MPI._handleof(mpi_op)

    def __dealloc__(self):
        free(self.coll.rows)

    def waiting_for(self) -> list:
        """The collective under way, in words."""
        name = {MPI_ALLREDUCE: "Iallreduce", MPI_REDUCE: f"Ireduce to {self.coll.root}", GATHER: "Iallgather"}
        if self.coll.posted and not self.coll.finished:
            return [f"MPI's {name[self.coll.kind]} (some rail rank has not joined it)"]
        return []

    def abandon(self) -> None:
        """Nothing to cancel: MPI cannot cancel a collective (the caller keeps this schedule for good)."""
