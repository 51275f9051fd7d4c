# cython: language_level=3
"""Copies between a CUDA device and page-locked host memory, from C with the GIL released: the staging
of a CUDA array's call of one chunk (hfr/_node_call.pyx), where CuPy's Python wrappers around the same
two calls cost more than the copy of a small array.

The CUDA driver's functions (libcuda.so.1, which CuPy and torch load too) are looked up when the engine
first meets a CUDA array (bind), so hfr builds and imports without CUDA. A copy runs on a stream the
caller names (a handle CuPy's and torch's streams give as .ptr: the driver's and the runtime's are one)
and returns once that stream has run it, with the device's primary context current for the two calls
(the context CuPy and torch use), whatever context the calling thread has.
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
ctypedef int (*error_text_fn)(int error, const char** text) noexcept nogil

cdef init_fn cu_init = NULL
cdef device_get_fn cu_device_get
cdef retain_fn cu_primary_retain
cdef release_fn cu_primary_release
cdef get_context_fn cu_get_current, cu_pop_current
cdef push_fn cu_push_current
cdef to_host_fn cu_to_host
cdef to_device_fn cu_to_device
cdef synchronize_fn cu_synchronize
cdef error_text_fn cu_error_name, cu_error_string
_driver = None  # libcuda.so.1, once bound


def bind() -> None:
    """Look the driver's functions up (once): OSError where libcuda.so.1 is missing."""
    global cu_init, cu_device_get, cu_primary_retain, cu_primary_release, cu_get_current, cu_pop_current
    global cu_push_current, cu_to_host, cu_to_device, cu_synchronize, cu_error_name, cu_error_string, _driver
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


cdef class Device:
    """One CUDA device (its ordinal, as CuPy and torch number them), its primary context retained until
    this object goes (the engine's CudaCopies holds it, with the page-locked staging, past close())."""

    def __cinit__(self, int ordinal):
        bind()
        cdef int device = -1, error = cu_init(0)
        if not error:
            error = cu_device_get(&device, ordinal)
        if not error:
            error = cu_primary_retain(&self.context, device)
        if error:
            raise RuntimeError(f"CUDA device {ordinal}: {error_text(error)}")
        self.device = device

    def __dealloc__(self):
        if self.context != NULL:
            cu_primary_release(self.device)

    cdef int copy(self, char* dst, const char* src, size_t nbytes, bint to_host, uintptr_t stream) noexcept nogil:
        """Copy nbytes from src to dst, device to host (to_host) or host to device, on stream, and wait
        until the stream has run it (and the work queued on it before). Returns the CUresult (0: done)."""
        cdef void* current = NULL
        cdef int error = cu_get_current(&current)
        cdef bint pushed = False
        if not error and current != self.context:
            error = cu_push_current(self.context)
            pushed = not error
        if not error:
            if to_host:
                error = cu_to_host(dst, <uintptr_t>src, nbytes, stream)
            else:
                error = cu_to_device(<uintptr_t>dst, src, nbytes, stream)
        if not error:
            error = cu_synchronize(stream)
        if pushed:
            cu_pop_current(&current)
        return error
