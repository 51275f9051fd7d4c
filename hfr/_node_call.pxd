# The C entry of hfr/_node_call.pyx, for hfr/_front.pyx (which runs a blocking host call through it).
from libc.stdint cimport int64_t, uintptr_t

from hfr._cuda cimport Device
from hfr._internode cimport Schedule
from hfr._kernels cimport Kind


cdef struct Node:  # the segment, as this rank sees it
    long long* control  # local_size rows of row_words
    Py_ssize_t row_words
    int local_size, local_rank
    double timeout


cdef class NodeCall:
    cdef Node node
    cdef char* stages  # stage 0's first input slot; a stage is local_size input slots, then the result slot
    cdef Py_ssize_t stage_bytes, slot_bytes
    cdef int size, rank, threads
    cdef double rail_yield_s  # polling the rail: sched_yield this long after progress stops,
    cdef long rail_sleep_ns  # then nap this long between polls
    cdef void** inputs  # the reduce's input pointers, one per local rank
    # The engine's sequence numbers, kept here for every call, run here or in the engine's Python loop:
    cdef public int64_t calls_done  # calls checked (their ANNOUNCED wait passed); picks the descriptor row
    cdef public int64_t chunks_done  # chunks ended: the next call's first chunk g
    cdef public str cuda_failure  # what failed in a staged call's copy (CUDA_FAILED)

    cdef int call(self, long long* fields, char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize, Kind kind,
                  int code, bint avg, bint copy_out, Schedule vote, Schedule rail, bint announced,
                  bint folded) except -1
    cdef int call_staged(self, long long* fields, const char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize,
                         Kind kind, int code, bint avg, Device cuda, uintptr_t to_host, uintptr_t to_device,
                         char* staging, Schedule vote, Schedule rail, bint folded) except -1
