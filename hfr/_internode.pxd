# The C entry of hfr/_internode.pyx, for other extensions (hfr/_node_call.pyx polls a schedule made in
# Python, with the GIL released, between the node's steps).
from libc.stdint cimport uint64_t, uintptr_t

from hfr._kernels cimport Kind

cdef enum:
    NO_MEMORY = -1  # Call.error when the kernel had no memory for its scratch tiles
    INTERRUPTED = -2  # Call.error when a signal handler raised (Ctrl-C): its exception is left set
    PEER_FAILED = -3  # Call.error when a rail peer reported that its communicator broke: it takes no more steps
    NODE_PEER_FAILED = -4  # Call.error when a word Call.watch watches says that a rank of our node broke

cpdef enum Tag:  # every MPI tag hfr sends on a rail, each once: all below MPI's smallest TAG_UB, 32767
    TREE0_UP = 0x4846  # the double binary tree's two trees (hfr/dbtree.py), up and down
    TREE1_UP = 0x4847
    TREE0_DOWN = 0x4848
    TREE1_DOWN = 0x4849
    RING_TAG = 0x484A
    DOUBLING_TAG = 0x484B  # recursive doubling and halving
    VOTE_TAG = 0x484C  # the call check's vote
    ABSENT_TAG = 0x484D  # a timed-out rank's report of whom it waited for (hfr/internode.py's report_absent)
    RELAY_TAG = 0x484E  # the relay of an allgather's or a reduce-scatter's blocks

cdef enum:
    VOTE_WORDS = 11  # a vote record's int64 votes, before its data (hfr/_internode.pyx, "vote records")
    VOTE_FIELDS = (VOTE_WORDS - 1) // 2  # the descriptor's fields a vote carries


cdef inline void vote_for(long long* votes, bint differs, const long long* fields) noexcept nogil:
    """A vote record's votes: the verdict (nonzero: a mismatch met), then the call's descriptor as d and -d,
    so that once merged by max, max(d) == -max(-d) field by field says every rank voted for one call."""
    cdef int i
    votes[0] = differs
    for i in range(VOTE_FIELDS):
        votes[1 + i], votes[1 + VOTE_FIELDS + i] = fields[i], -fields[i]


cdef inline bint votes_agree(const long long* votes) noexcept nogil:
    """Whether (merged) votes say that no rank met a mismatch and all voted for one call."""
    cdef int i
    if votes[0]:
        return False
    for i in range(1, 1 + VOTE_FIELDS):
        if votes[i] != -votes[i + VOTE_FIELDS]:
            return False
    return True

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
