# The C entry of hfr/_kernels.pyx, for other extensions (hfr/_internode.pyx combines blocks with it, hfr/_node_call.pyx
# reduces and copies with it).

from hfr._simd cimport Kind  # the element type a reduce runs on

cdef int op_code(object op) except -1
cdef Kind kernel_kind(object dtype, int code) except *
cdef int reduce_nogil(Kind kind, Py_ssize_t itemsize, void* out, void** xs, int k, Py_ssize_t n, int code,
                      int threads, Py_ssize_t divisor) noexcept nogil
cdef int copy_nogil(void* dst, void* src, Py_ssize_t nbytes, int threads) noexcept nogil
