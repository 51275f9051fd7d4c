# cython: language_level=3
"""Copies between a CUDA device and page-locked host memory, from C with the GIL released: the staging
of a CUDA array's call (hfr/_node_call.pyx), where CuPy's Python wrappers around the same calls cost more
than the copy of a small array.

The CUDA driver's functions (libcuda.so.1, which CuPy and torch load too) are looked up when the engine first
meets a CUDA array (bind), so hfr builds and imports without CUDA. A call's copies run on the two streams
order() chooses, its caller's (a handle CuPy's and torch's streams give as .ptr: the driver's and the
runtime's are one) or the device's own, queued without waiting (copy), each direction's followed by an event
where the call needs to know that they ran (record, wait); the device's primary context (the one CuPy and
torch use) is current from enter() to leave(), whatever context the calling thread had.
"""
from libc.stdint cimport uintptr_t

import ctypes

ctypedef int (*init_fn)(unsigned int flags) noexcept nogil
ctypedef int (*device_get_fn)(int* device, int ordinal) noexcept nogil
ctypedef int (*retain_fn)(void** context, int device) noexcept nogil
ctypedef int (*release_fn)(int device) noexcept nogil
ctypedef int (*get_context_fn)(void** context) noexcept nogil
ctypedef int (*push_fn)(void* context) noexcept nogil
ctypedef int (*to_host_fn)(void* dst, uintptr_t src, size_t nbytes, uintptr_t stream) noexcept nogil
ctypedef int (*to_device_fn)(uintptr_t dst, const void* src, size_t nbytes, uintptr_t stream) noexcept nogil
ctypedef int (*synchronize_fn)(uintptr_t stream) noexcept nogil
ctypedef int (*event_create_fn)(void** event, unsigned int flags) noexcept nogil
ctypedef int (*event_record_fn)(void* event, uintptr_t stream) noexcept nogil
ctypedef int (*event_fn)(void* event) noexcept nogil
ctypedef int (*error_text_fn)(int error, const char** text) noexcept nogil
ctypedef int (*stream_create_fn)(uintptr_t* stream, unsigned int flags) noexcept nogil
ctypedef int (*stream_wait_fn)(uintptr_t stream, void* event, unsigned int flags) noexcept nogil

cdef init_fn cu_init = NULL
cdef device_get_fn cu_device_get
cdef retain_fn cu_primary_retain
cdef release_fn cu_primary_release
cdef get_context_fn cu_get_current, cu_pop_current
cdef push_fn cu_push_current
cdef to_host_fn cu_to_host
cdef to_device_fn cu_to_device
cdef synchronize_fn cu_synchronize
cdef event_create_fn cu_event_create
cdef event_record_fn cu_event_record
cdef event_fn cu_event_synchronize, cu_event_destroy
cdef error_text_fn cu_error_name, cu_error_string
cdef stream_create_fn cu_stream_create
cdef stream_wait_fn cu_stream_wait_event
cdef synchronize_fn cu_stream_destroy
_driver = None  # libcuda.so.1, once bound


def bind() -> None:
    """Look the driver's functions up (once): OSError where libcuda.so.1 is missing."""
    global cu_init, cu_device_get, cu_primary_retain, cu_primary_release, cu_get_current, cu_pop_current
    global cu_push_current, cu_to_host, cu_to_device, cu_synchronize, cu_error_name, cu_error_string, _driver
    global cu_event_create, cu_event_record, cu_event_synchronize, cu_event_destroy
    global cu_stream_create, cu_stream_wait_event, cu_stream_destroy
    if cu_init != NULL:
        return
    _driver = lib = ctypes.CDLL("libcuda.so.1")
    cu_device_get = <device_get_fn>_address(lib, "cuDeviceGet")
    cu_primary_retain = <retain_fn>_address(lib, "cuDevicePrimaryCtxRetain")
    cu_primary_release = <release_fn>_address(lib, "cuDevicePrimaryCtxRelease_v2")
    cu_get_current = <get_context_fn>_address(lib, "cuCtxGetCurrent")
    cu_push_current = <push_fn>_address(lib, "cuCtxPushCurrent_v2")
    cu_pop_current = <get_context_fn>_address(lib, "cuCtxPopCurrent_v2")
    cu_to_host = <to_host_fn>_address(lib, "cuMemcpyDtoHAsync_v2")
    cu_to_device = <to_device_fn>_address(lib, "cuMemcpyHtoDAsync_v2")
    cu_synchronize = <synchronize_fn>_address(lib, "cuStreamSynchronize")
    cu_event_create = <event_create_fn>_address(lib, "cuEventCreate")
    cu_event_record = <event_record_fn>_address(lib, "cuEventRecord")
    cu_event_synchronize = <event_fn>_address(lib, "cuEventSynchronize")
    cu_event_destroy = <event_fn>_address(lib, "cuEventDestroy_v2")
    cu_stream_create = <stream_create_fn>_address(lib, "cuStreamCreate")
    cu_stream_wait_event = <stream_wait_fn>_address(lib, "cuStreamWaitEvent")
    cu_stream_destroy = <synchronize_fn>_address(lib, "cuStreamDestroy_v2")
    cu_error_name = <error_text_fn>_address(lib, "cuGetErrorName")
    cu_error_string = <error_text_fn>_address(lib, "cuGetErrorString")
    cu_init = <init_fn>_address(lib, "cuInit")


cdef uintptr_t _address(lib, str name) except 0:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def error_text(int error) -> str:
    """The driver's name and words for a CUresult."""
    cdef const char* name = NULL
    cdef const char* words = NULL
    if cu_init == NULL or cu_error_name(error, &name) or cu_error_string(error, &words):
        return f"CUDA error {error}"
    return f"{name.decode()}: {words.decode()}"


cdef enum:
    EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
    STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
    CALLER_READY = CALL_EVENTS  # the event order() records on the caller's stream


cdef int _push(Cuda* cuda) noexcept nogil:
    """Make the device's primary context current, if it is not. Returns the CUresult; leave() after."""
    cdef void* current = NULL
    cdef int error = cu_get_current(&current)
    cuda.pushed = False
    if not error and current != cuda.context:
        error = cu_push_current(cuda.context)
        cuda.pushed = not error
    return error


cdef int enter(Cuda* cuda) noexcept nogil:
    """Make the device's primary context current for the copies that follow (made its events and its own
    streams, the first time). Returns the CUresult (0: entered); leave() after either way."""
    cdef int error = _push(cuda), i = 0
    while not error and i < CUDA_EVENTS:
        if cuda.events[i] == NULL:
            error = cu_event_create(&cuda.events[i], EVENT_DISABLE_TIMING)
        i += 1
    i = 0
    while not error and i < 2:
        if cuda.own[i] == 0:
            error = cu_stream_create(&cuda.own[i], STREAM_NON_BLOCKING)
        i += 1
    return error


cdef void leave(Cuda* cuda) noexcept nogil:
    """The calling thread's context back as it was before enter()."""
    cdef void* popped = NULL
    if cuda.pushed:
        cu_pop_current(&popped)
        cuda.pushed = False


cdef int order(Cuda* cuda, bint several) noexcept nogil:
    """Choose the call's streams (to_host, to_device), the context entered: a call of one chunk run on its
    caller's thread (ready NULL) copies on the caller's stream both ways, in its order, with no event; any
    other on the device's own two streams, so that its chunks copy both ways at once, after the caller's
    work: that queued when the call was (ready), or, without ready, that queued by now (an event recorded
    on the caller's stream here). Returns the CUresult."""
    cdef void* after = cuda.ready
    cdef int error = 0
    if after == NULL and not several:
        cuda.to_host = cuda.to_device = cuda.caller
        return 0
    if after == NULL:
        after = cuda.events[CALLER_READY]
        error = cu_event_record(after, cuda.caller)
    cuda.to_host, cuda.to_device = cuda.own[0], cuda.own[1]
    if not error:
        error = cu_stream_wait_event(cuda.to_host, after, 0)
    if not error:
        error = cu_stream_wait_event(cuda.to_device, after, 0)
    return error


cdef int copy(Cuda* cuda, char* dst, const char* src, size_t nbytes, bint to_host) noexcept nogil:
    """Queue a copy of nbytes from src to dst, device to host (to_host, on stream to_host) or host to device
    (on stream to_device). Returns the CUresult of queueing it."""
    if to_host:
        return cu_to_host(dst, <uintptr_t>src, nbytes, cuda.to_host)
    return cu_to_device(<uintptr_t>dst, src, nbytes, cuda.to_device)


cdef int record(Cuda* cuda, int event, bint to_host) noexcept nogil:
    """Record events[event] after what is queued so far on the stream of that direction."""
    return cu_event_record(cuda.events[event], cuda.to_host if to_host else cuda.to_device)


cdef int wait(Cuda* cuda, int event) noexcept nogil:
    """Block until what events[event] was recorded after has run (its copies done, or failed)."""
    return cu_event_synchronize(cuda.events[event])


cdef int drain(Cuda* cuda) noexcept nogil:
    """Block until every copy queued on both streams has run; the first CUresult that is not 0, if any."""
    cdef int error = cu_synchronize(cuda.to_host)
    cdef int later = cu_synchronize(cuda.to_device) if cuda.to_device != cuda.to_host else 0
    return error or later


cdef class Device:
    """One CUDA device (its ordinal, as CuPy and torch number them), its primary context retained until
    this object goes (the engine's CudaCopies holds it, with the page-locked staging, past close())."""

    def __cinit__(self, int ordinal):
        bind()
        cdef int device = -1, error = cu_init(0)
        if not error:
            error = cu_device_get(&device, ordinal)
        if not error:
            error = cu_primary_retain(&self.cuda.context, device)
        if error:
            raise RuntimeError(f"CUDA device {ordinal}: {error_text(error)}")
        self.device = device

    def __dealloc__(self):
        cdef int i
        if self.cuda.context == NULL:
            return
        if not _push(&self.cuda):  # whatever enter() made, in the context it was made in
            for i in range(CUDA_EVENTS):
                if self.cuda.events[i] != NULL:
                    cu_event_destroy(self.cuda.events[i])
            for i in range(2):
                if self.cuda.own[i] != 0:
                    cu_stream_destroy(self.cuda.own[i])
        leave(&self.cuda)
        cu_primary_release(self.device)
