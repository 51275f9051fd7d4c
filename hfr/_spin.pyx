# cython: language_level=3
"""Wait for the node's progress counters without holding the GIL.

A Python polling loop takes the GIL back after every yield, and a thread waiting for the GIL (the
caller's training loop, torch's autograd thread) then waits out the 5 ms switch interval each time.
Here the spin runs with the GIL released: it reads one int64 word per local rank (acquire loads),
and between rounds does what every wait does (hfr/_wait.pxd's hfr_idle).
"""
from libc.stdint cimport int64_t

from hfr._wait cimport hfr_idle, hfr_load_acquire, hfr_now


cdef int gone_row(const long long* words, Py_ssize_t row_words, Py_ssize_t rows, Py_ssize_t flag, Py_ssize_t column,
                  int64_t target) noexcept nogil:
    """The first row whose word `flag` is positive while its word `column` is below target, or -1: a row's
    owner stores its counters before its flag, so one read after the flag (acquire) is its last."""
    cdef Py_ssize_t r
    for r in range(rows):
        if hfr_load_acquire(words + r * row_words + flag) > 0 and hfr_load_acquire(words + r * row_words + column) < target:
            return <int>r
    return -1


cdef bint counters_reached(const long long* words, Py_ssize_t row_words, Py_ssize_t rows, Py_ssize_t column,
                           int64_t target, double seconds) noexcept nogil:
    """True once word `column` of every row (rows of row_words int64 at words) is >= target; False if
    `seconds` pass first."""
    cdef Py_ssize_t r
    cdef bint reached
    cdef double start = hfr_now(), now
    while True:
        reached = True
        for r in range(rows):
            if hfr_load_acquire(words + r * row_words + column) < target:
                reached = False
                break
        if reached:
            return True
        now = hfr_now()
        if now - start > seconds:
            return False
        hfr_idle(now - start)
