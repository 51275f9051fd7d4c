# The C entry of hfr/_kernels.pyx, for other extensions (hfr/_internode.pyx combines blocks with it, hfr/_node_call.pyx
# reduces and copies with it).

from hfr._simd cimport Kind  # the element type a reduce runs on

cpdef enum Stores:  # how a reduce's out is written
    CACHED  # plain stores: out stays in the cache, to be read again soon
    STREAMED  # non-temporal stores: out goes to memory, past the cache (no read for ownership first)
    STORES_BY_SIZE  # streamed from STREAM_MIN_BYTES of out, for callers that know nothing better

cdef int op_code(object op) except -1
cdef Kind kernel_kind(object dtype, int code) except *
cdef int reduce_nogil(Kind kind, Py_ssize_t itemsize, void* out, void** xs, int k, Py_ssize_t n, int code,
                      int threads, Py_ssize_t divisor, Stores stores) noexcept nogil
cdef int copy_nogil(void* dst, void* src, Py_ssize_t nbytes, int threads, Stores stores) noexcept nogil
cdef void on_caller_team(bint asked) noexcept nogil
