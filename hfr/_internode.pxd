# The C entry of hfr/_internode.pyx, for other extensions (hfr/_node_call.pyx polls a schedule made in
# Python, with the GIL released, between the node's steps).
from libc.stdint cimport uint64_t, uintptr_t

from hfr._kernels cimport Kind

cdef enum:
    NO_MEMORY = -1  # Call.error when the kernel had no memory for its scratch tiles
    INTERRUPTED = -2  # Call.error when a signal handler raised (Ctrl-C): its exception is left set
    PEER_FAILED = -3  # Call.error when a rail peer reported that its communicator broke: it takes no more steps
    NODE_PEER_FAILED = -4  # Call.error when a word Call.watch watches says that a rank of our node broke
    ABSENT_TAG = 0x484D  # the tag of those reports (hfr/internode.py's report_absent)

cdef enum:
    VOTE_WORDS = 11  # a vote record's int64 votes, before its data (hfr/_internode.pyx, "vote records")

ctypedef uint64_t Request  # storage for one MPI_Request: an int (MPICH) or a pointer

ctypedef struct Call:  # what every step of one call's schedule shares
    char* buf
    Py_ssize_t itemsize
    Kind kind
    int code  # the kernel's op
    int threads
    uintptr_t comm
    uintptr_t byte  # MPI_BYTE
    int error  # the first failing MPI call's error code, NO_MEMORY, INTERRUPTED, or 0
    Py_ssize_t* unheld  # byte ranges [unheld[2i], unheld[2i + 1]) of buf zeroed as polling starts, once
    Py_ssize_t nunheld
    const long long* watch  # NULL, or the CLOSING words of our node's ranks (hfr/_node_call.pyx sets them), one
    Py_ssize_t watch_stride  # every watch_stride words, watch_rows of them: one that reads watch_broken stops
    int watch_rows  # the schedule (its node can no longer finish the call)
    long long watch_broken

ctypedef bint (*advance_fn)(void* state, Call* c, bint* done) noexcept nogil  # True if anything moved

cdef bint poll(advance_fn advance, void* state, Call* c, double deadline) noexcept nogil

cdef class Schedule:
    cdef Call call
    cdef advance_fn advance
    cdef void* state
    cdef object buffers
    cdef void _cancel(self, Request* request)
