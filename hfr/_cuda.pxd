# The C entry of hfr/_cuda.pyx, for hfr/_node_call.pyx (which stages a CUDA array's call with it).
from libc.stdint cimport uintptr_t

cdef enum:
    CUDA_EVENTS = 8  # events of a device's, made once, that a call records on its streams


cdef struct Cuda:  # one device's copies, as a call runs them from C
    void* context  # the device's primary context, retained by its Device
    void* events[CUDA_EVENTS]  # made on the first enter()
    bint pushed  # enter() made the context current (leave() pops it)
    uintptr_t to_host, to_device  # the call's streams, one each way (they may be one)


cdef int enter(Cuda* cuda) noexcept nogil
cdef void leave(Cuda* cuda) noexcept nogil
cdef int copy(Cuda* cuda, char* dst, const char* src, size_t nbytes, bint to_host) noexcept nogil
cdef int record(Cuda* cuda, int event, bint to_host) noexcept nogil
cdef int wait(Cuda* cuda, int event) noexcept nogil
cdef int drain(Cuda* cuda) noexcept nogil


cdef class Device:
    cdef Cuda cuda
    cdef int device  # the driver's handle of it
