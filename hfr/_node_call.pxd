# The C entry of hfr/_node_call.pyx, for hfr/_front.pyx (which runs a blocking host call through it).
from libc.stdint cimport int64_t, uintptr_t

from hfr._cuda cimport Device
from hfr._internode cimport Schedule
from hfr._kernels cimport Kind


cdef struct Node:  # the segment, as this rank sees it, and how this rank works on it
    long long* control  # local_size rows of row_words
    Py_ssize_t row_words
    int local_size, local_rank
    double timeout
    char* stages  # stage 0's first input slot; a stage is local_size input slots, then the result slot
    Py_ssize_t stage_bytes, slot_bytes
    int threads  # the kernels'
    void** inputs  # the reduce's input pointers, one per local rank
    double rail_yield_s  # polling the rail: sched_yield this long after progress stops,
    long rail_sleep_ns  # then nap this long between polls


cdef class NodeCall:
    cdef Node node
    cdef int size, rank
    cdef Py_ssize_t cache_bytes  # the node's share of the last-level cache (0: unknown)
    cdef Py_ssize_t cache_chunk  # the chunk of a host array's call on one node
    # The engine's sequence numbers, kept here for every call, run here or in the engine's Python loop:
    cdef public int64_t calls_done  # calls checked (their ANNOUNCED wait passed); picks the descriptor row
    cdef public int64_t chunks_done  # chunks ended: the next call's first chunk g
    cdef public Py_ssize_t call_chunks  # the last call's chunks
    cdef public Py_ssize_t failed_chunk  # the chunk (of the last call) it was at if it did not end DONE
    cdef public str cuda_failure  # what failed in a staged call's copy (CUDA_FAILED)

    cdef int call(self, long long* fields, char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize, Kind kind,
                  int code, bint avg, bint copy_out, Schedule vote, Schedule rail, bint staged,
                  bint folded) except -1
    cdef int call_staged(self, long long* fields, const char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize,
                         Kind kind, int code, bint avg, Device cuda, uintptr_t to_host, uintptr_t to_device,
                         char* staging, Schedule vote, Schedule rail, bint folded) except -1
