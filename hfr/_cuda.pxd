# The C entry of hfr/_cuda.pyx, for hfr/_node_call.pyx (which stages a CUDA array's one chunk with it).
from libc.stdint cimport uintptr_t


cdef class Device:
    cdef void* context  # the device's primary context, retained
    cdef int device  # the driver's handle of it
    cdef int copy(self, char* dst, const char* src, size_t nbytes, bint to_host, uintptr_t stream) noexcept nogil
