# The protocol's numbers and the C entry of hfr/_node_call.pyx, for hfr/_front.pyx (which runs a blocking call
# through it).
from libc.stdint cimport int64_t, uintptr_t

from hfr._cuda cimport Cuda
from hfr._internode cimport Schedule
from hfr._kernels cimport Kind



# The node's protocol, defined here once (hfr/engine.py and hfr/_front.pyx take it from here; its terms:
# hfr/_node_call.pyx).
cpdef enum Protocol:
    ANNOUNCED = 0  # control words, one cache line apart: the counters (hfr/engine.py's terms)
    ARRIVED = 8
    REDUCED = 16
    CONSUMED = 24
    DESCRIPTOR = 32  # two descriptor rows of DESCRIPTOR_WORDS, used by alternate calls
    DESCRIPTOR_WORDS = 8
    CLOSING = 48  # a Closing, or 0 (hfr/_node_call.pyx)
    PUSHED = 56  # a GPU pair's counters, read by the partner (hfr/_node_call.pyx)
    RETURNED = 57
    PAIR_READY = 58  # 0, PAIR_PUBLISHED once PAIR_RECORD holds this rank's PairRecord (hfr/_cuda.pxd), PAIR_LINKED
    PAIR_SINCE = 59  # the calls it had checked when it published its record (set before PAIR_READY)
    PAIR_RECORD = 64
    ROW_WORDS = 128  # a local rank's control row: 1 KiB, whole cache lines (hfr/shm.py lays them out)
    DESCRIPTOR_FIELDS = 5  # collective, count, dtype, op, root
    PAIRABLE = DESCRIPTOR_FIELDS  # a descriptor row's word after the fields: whether this rank can pair the call
    STAGES = 3
    CHUNK_ALIGN_BYTES = 4096  # chunks (and the engine's chunk) are multiples of this
    SLICE_ALIGN_BYTES = 64  # slices start on cache lines, so two ranks never write one line
    WHOLE_UP_TO_BYTES = 4096  # a call on one node of at most this many bytes: x whole in every input slot
    # (reducing 4 KiB per rank costs less than a hand-off)
    REFUSED = -1  # the count of a refused call's descriptor (its other fields -1 but the collective)


cpdef enum Closing:  # a rank's CLOSING word, once set
    TIMED_OUT = -1  # its communicator failed on a timeout, and it has not closed: its peers time out in turn
    HEALTHY = 1  # it closed healthy
    BROKEN = 2  # its communicator failed otherwise, or it closed so


cpdef enum PairReady:  # a rank's PAIR_READY word
    PAIR_PUBLISHED = 1  # its PairRecord is written
    PAIR_LINKED = 2  # and it has opened its partner's


cpdef enum Pairs:  # HFR_PAIRS (hfr/pairs.py)
    PAIRS_AUTO, PAIRS_ON, PAIRS_OFF


cpdef enum Collective:  # wire codes: append only
    ALLREDUCE = 0
    REDUCE = 1
    BROADCAST = 2
    REDUCE_SCATTER = 3
    ALLGATHER = 4


cpdef enum Outcome:  # of run(); a WAIT_ outcome is a wait that timed out (the engine names it), a _STOPPED
    # one a schedule on the rail that did not finish (the schedule says why)
    DONE, MISMATCH, NO_MEMORY, WAIT_CALL, WAIT_RESULT_SLOT, WAIT_ARRIVED, WAIT_PREVIOUS_RESULT, WAIT_REDUCED
    VOTE_STOPPED, RAIL_STOPPED, MISMATCH_SPENT, CUDA_FAILED  # CUDA_FAILED: a staged call's copy (cuda_failure)
    WAIT_INPUT_SLOT, WAIT_PARTNER, WAIT_DEVICE


cdef struct Node:  # the segment, as this rank sees it, and how this rank works on it
    long long* control  # local_size rows of row_words
    Py_ssize_t row_words
    int local_size, local_rank
    double timeout
    char* stages  # stage 0's first input slot; a stage is local_size input slots, then the result slot
    Py_ssize_t stage_bytes, slot_bytes
    int threads  # the kernels'
    void** inputs  # the reduce's input pointers, one per local rank
    Py_ssize_t late_column  # the counter column and target of the last wait that timed out (the engine names
    int64_t late_target  # the ranks it waited for)
    int gone_rank  # the local rank whose CLOSING word ended that wait before its timeout, or -1
    int late_only  # the one local rank that wait was for (a GPU pair's partner), or -1: every rank
    int partner  # this rank's GPU pair partner (local rank), or -1
    Pairs pairs
    Py_ssize_t pairs_from  # PAIRS_AUTO: the bytes from which a call is paired
    char* halves  # per local rank, what its input slot holds in the call that runs (a Half of _node_call.pyx)


cpdef bint same_or_apart(Py_ssize_t a, Py_ssize_t b, Py_ssize_t nbytes) noexcept nogil
cdef void describe(long long* fields, int collective, Py_ssize_t count, int dtype, int op, int root) noexcept nogil


cdef class NodeCall:
    cdef Node node
    cdef int size, rank
    cdef Py_ssize_t cache_bytes  # the node's share of the last-level cache (0: unknown)
    cdef Py_ssize_t chunk  # the engine's chunk: what every call is cut into, on every rank alike
    # The engine's sequence numbers, kept here for every call:
    cdef readonly int64_t calls_done  # calls checked (their ANNOUNCED wait passed); picks the descriptor row
    cdef readonly int64_t chunks_done  # chunks ended: the next call's first chunk g
    cdef readonly Py_ssize_t call_chunks  # the last call's chunks
    cdef readonly Py_ssize_t failed_chunk  # the chunk (of the last call) it was at if it did not end DONE
    cdef readonly str cuda_failure  # what failed in a staged call's copies (CUDA_FAILED)
    cdef double* marks  # mark_steps: each chunk's step times, or NULL
    cdef Py_ssize_t mark_rows
    cdef object marked  # the array marks points into

    cdef int call(self, long long* fields, char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize, Kind kind,
                  int code, bint avg, Schedule vote, list rails, bint folded, bint in_out, Cuda* cuda,
                  char* staging) except -1
