"""The dbtree's block pipeline (hfr/internode.py's default algo), driven in C with the GIL released.

Terms as in hfr/internode.py: a *slice* buf holds global elements first .., each tree carries the
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

MPI is called through pointers to the functions of the MPI library that mpi4py loaded, with handles
(communicator, datatype, request) as pointer-sized integers: MPICH's ABI has int handles, Open MPI's
and the MPI standard ABI pointers; either is passed in one register or stack word, of which an int
parameter reads the low half (mpi4py gives MPICH's handles sign-extended to 64 bits), so one binary
serves every ABI mpi4py does, without MPI's headers at build time. Statuses are never read.
"""
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

cimport numpy as cnp
from hfr._kernels cimport Kind, kernel_kind, op_code, reduce_nogil
from hfr._wait cimport hfr_nap, hfr_now, sched_yield

import ctypes

from mpi4py import MPI

cnp.import_array()

__all__ = ["TreePipeline", "BLOCKS_IN_FLIGHT"]

cdef enum:
    IN_FLIGHT = 4  # blocks per tree between two stages (with 1 MiB blocks 4 and 8 measured alike)
    MAX_CHILDREN = 2
    STATUS_WORDS = 8  # room for any ABI's MPI_Status (20 to 32 bytes)
    NO_MEMORY = -1  # Call.error when the kernel had no memory for its scratch tiles

ctypedef uint64_t Request  # storage for one MPI_Request: an int (MPICH) or a pointer

ctypedef int (*isend_fn)(const void* buf, int count, uintptr_t datatype, int dest, int tag, uintptr_t comm,
                         Request* request) noexcept nogil
ctypedef int (*irecv_fn)(void* buf, int count, uintptr_t datatype, int source, int tag, uintptr_t comm,
                         Request* request) noexcept nogil
ctypedef int (*test_fn)(Request* request, int* flag, uint64_t* status) noexcept nogil
ctypedef int (*cancel_fn)(Request* request) noexcept nogil

cdef isend_fn mpi_isend
cdef irecv_fn mpi_irecv
cdef test_fn mpi_test
cdef cancel_fn mpi_cancel


def _bind_mpi() -> None:
    """Look MPI's functions up in the library mpi4py loaded (dlsym through mpi4py's extension searches
    its dependencies, libmpi among them)."""
    global mpi_isend, mpi_irecv, mpi_test, mpi_cancel
    lib = ctypes.CDLL(MPI.__file__)

    cdef uintptr_t isend = ctypes.cast(lib.MPI_Isend, ctypes.c_void_p).value
    cdef uintptr_t irecv = ctypes.cast(lib.MPI_Irecv, ctypes.c_void_p).value
    cdef uintptr_t test = ctypes.cast(lib.MPI_Test, ctypes.c_void_p).value
    cdef uintptr_t cancel = ctypes.cast(lib.MPI_Cancel, ctypes.c_void_p).value
    mpi_isend, mpi_irecv, mpi_test, mpi_cancel = <isend_fn>isend, <irecv_fn>irecv, <test_fn>test, <cancel_fn>cancel


_bind_mpi()
BLOCKS_IN_FLIGHT = IN_FLIGHT


ctypedef struct Call:  # what both trees of one call share
    char* buf
    Py_ssize_t itemsize
    Kind kind
    int code  # the kernel's op
    int threads
    uintptr_t comm
    uintptr_t byte  # MPI_BYTE
    int error  # the first failing MPI call's error code, NO_MEMORY, or 0


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
                            _block_bytes(f, c, b) // c.itemsize, c.code, c.threads):
                c.error = NO_MEMORY
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


cdef bint _drive(Flow* flows, int nflows, Call* c, double deadline, double yield_s, long sleep_ns) noexcept nogil:
    """Advance the flows until all are done (True), an MPI call fails (c.error) or deadline passes
    (False). After progress stops: sched_yield for yield_s, then nap sleep_ns between polls."""
    cdef double last_progress = hfr_now(), now
    cdef Py_ssize_t before
    cdef int i
    cdef bint all_done
    while True:
        before, all_done = 0, True
        for i in range(nflows):
            before += _progress(&flows[i])
            if flows[i].up:
                _advance_up(&flows[i], c)
            if flows[i].down:
                _advance_down(&flows[i], c)
            before -= _progress(&flows[i])
            all_done = all_done and _done(&flows[i])
        if c.error:
            return False
        if all_done:
            return True
        now = hfr_now()
        if before != 0:
            last_progress = now
            continue
        if now > deadline:
            return False
        if now - last_progress < yield_s:
            sched_yield()
        else:
            hfr_nap(sleep_ns)


cdef class TreePipeline:
    """One call's blocks on both trees (or on those given). Holds buf and the scratch arrays for as
    long as it lives: after a timeout, keep it alive for good (MPI may still write into them)."""
    cdef Call call
    cdef Flow flows[2]
    cdef int nflows
    cdef object buffers  # buf and the scratch arrays, kept alive with the requests

    def __cinit__(self, comm: MPI.Comm, cnp.ndarray buf not None, Py_ssize_t first, op, list nodes,
                  cnp.ndarray scratch not None, Py_ssize_t granule, Py_ssize_t block, bint up, bint down,
                  list tags, int threads):
        """nodes[t] = (parent, children) of this rank in tree t (hfr.dbtree); scratch: contiguous bytes,
        if up room for IN_FLIGHT x MAX_CHILDREN blocks per tree; granule and block in elements, block
        <= granule; tags[t] = (up tag, down tag)."""
        cdef Flow* f
        cdef int t, i
        self.nflows = 0
        self.buffers = (buf, scratch)
        self.call.buf = <char*>cnp.PyArray_DATA(buf)
        self.call.itemsize = buf.itemsize
        self.call.code = op_code(op)
        self.call.kind = kernel_kind(buf.dtype, self.call.code)
        self.call.threads = threads
        self.call.comm = MPI._handleof(comm)
        self.call.byte = MPI._handleof(MPI.BYTE)
        self.call.error = 0
        for t in range(len(nodes)):
            f = &self.flows[t]
            parent, children = nodes[t]
            f.up, f.down, f.parent, f.nchildren = up, down, parent, len(children)
            for i in range(f.nchildren):
                f.children[i] = children[i]
            f.up_tag, f.down_tag = tags[t]
            f.posted = f.combined = f.sent_up = f.listening = f.arrived = f.finished = 0
            f.nblocks = _tree_blocks(first, buf.shape[0], granule, block, t, NULL, 0)
            f.bounds = <Py_ssize_t*>malloc(max(1, 2 * f.nblocks) * sizeof(Py_ssize_t))
            if f.bounds == NULL:
                raise MemoryError()
            self.nflows += 1
            _tree_blocks(first, buf.shape[0], granule, block, t, f.bounds, f.nblocks)
            f.slot_bytes = block * buf.itemsize
            f.scratch = <char*>cnp.PyArray_DATA(scratch) + t * IN_FLIGHT * MAX_CHILDREN * f.slot_bytes
        if up and scratch.nbytes < len(nodes) * IN_FLIGHT * MAX_CHILDREN * block * buf.itemsize:
            raise ValueError(f"scratch holds {scratch.nbytes} bytes, {len(nodes)} trees need "
                             f"{len(nodes) * IN_FLIGHT * MAX_CHILDREN * block * buf.itemsize}")
        if not 1 <= block <= granule:
            raise ValueError(f"block must be 1 .. granule ({granule}) elements, got {block}")

    def __dealloc__(self):
        for t in range(self.nflows):
            free(self.flows[t].bounds)

    def run(self, double deadline, double yield_s, double sleep_s) -> bool:
        """Move every block through its stages with the GIL released: True once done, False once past
        deadline (time.monotonic()'s clock); an MPI error raises MPI.Exception."""
        cdef bint done
        cdef long sleep_ns = <long>(sleep_s * 1e9)
        with nogil:
            done = _drive(self.flows, self.nflows, &self.call, deadline, yield_s, sleep_ns)
        if self.call.error == NO_MEMORY:
            raise MemoryError("hfr dbtree: no memory for the kernel's scratch tiles")
        if self.call.error:
            raise MPI.Exception(self.call.error)
        return done

    def waiting_for(self) -> list:
        """The head block of each stage that is stuck, and the peers it waits on, in words."""
        cdef Flow* f
        cdef int t
        waits = []
        for t in range(self.nflows):
            f = &self.flows[t]
            if f.up and f.combined < f.posted:
                self._report(waits, t, f.combined, "from child", f.child_recv[f.combined % IN_FLIGHT],
                             f.children, f.nchildren)
            if f.parent >= 0 and f.sent_up < f.combined:
                self._report(waits, t, f.sent_up, "to be taken by parent", &f.parent_send[f.sent_up % IN_FLIGHT],
                             &f.parent, 1)
            if f.parent >= 0 and f.arrived < f.listening:
                self._report(waits, t, f.arrived, "from parent", &f.parent_recv[f.arrived % IN_FLIGHT],
                             &f.parent, 1)
            if f.finished < f.arrived:
                self._report(waits, t, f.finished, "to be taken by child", f.child_send[f.finished % IN_FLIGHT],
                             f.children, f.nchildren)
        return waits

    cdef _report(self, list waits, int t, Py_ssize_t block, str what, Request* requests, int* peers, int n):
        late = [str(peers[i]) for i in range(n) if not _tested(&requests[i], &self.call)]
        if late:
            waits.append(f"tree {t} block {block} {what} {', '.join(late)}")

    def abandon(self) -> None:
        """Cancel the receives still posted (the sends and this object's buffers stay as they are)."""
        cdef Flow* f
        cdef Py_ssize_t b
        cdef int i
        for t in range(self.nflows):
            f = &self.flows[t]
            for b in range(f.combined, f.posted):
                for i in range(f.nchildren):
                    self._cancel(&f.child_recv[b % IN_FLIGHT][i])
            for b in range(f.arrived, f.listening):
                self._cancel(&f.parent_recv[b % IN_FLIGHT])

    cdef void _cancel(self, Request* request):
        if not _tested(request, &self.call):
            mpi_cancel(request)
