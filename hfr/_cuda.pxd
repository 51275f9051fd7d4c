# The C entry of hfr/_cuda.pyx, for hfr/_node_call.pyx (which stages a CUDA array's call with it).
from libc.stdint cimport uintptr_t

cdef enum:
    CALL_EVENTS = 6  # events of a device's, made once, that a call records after its copies (hfr/_node_call.pyx)
    CUDA_EVENTS = CALL_EVENTS + 1  # and one on the caller's stream (order)


cdef struct Cuda:  # one device's copies, as a call runs them from C
    void* context  # the device's primary context, retained by its Device
    void* events[CUDA_EVENTS]  # made on the first enter()
    uintptr_t own[2]  # the device's own two streams, one each way, made on the first enter()
    bint pushed  # enter() made the context current (leave() pops it)
    uintptr_t caller  # the call's caller's stream, the one its x and out are used on
    void* ready  # an event recorded on it when the call was queued, or NULL (a call run on its caller's thread)
    uintptr_t to_host, to_device  # the call's streams, one each way (they may be one), as order() chose them


cdef int enter(Cuda* cuda) noexcept nogil
cdef void leave(Cuda* cuda) noexcept nogil
cdef int order(Cuda* cuda, bint several) noexcept nogil
cdef int copy(Cuda* cuda, char* dst, const char* src, size_t nbytes, bint to_host) noexcept nogil
cdef int record(Cuda* cuda, int event, bint to_host) noexcept nogil
cdef int wait(Cuda* cuda, int event) noexcept nogil
cdef int drain(Cuda* cuda) noexcept nogil


cdef class Device:
    cdef Cuda cuda
    cdef int device  # the driver's handle of it
