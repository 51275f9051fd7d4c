# The C entry of hfr/_spin.pyx, for other extensions (hfr/_node_call.pyx waits on the counters with it).
from libc.stdint cimport int64_t

cdef int gone_row(const long long* words, Py_ssize_t row_words, Py_ssize_t rows, Py_ssize_t flag, Py_ssize_t column,
                  int64_t target) noexcept nogil
cdef bint counters_reached(const long long* words, Py_ssize_t row_words, Py_ssize_t rows, Py_ssize_t column,
                           int64_t target, double seconds) noexcept nogil
