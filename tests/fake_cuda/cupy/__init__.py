"""A stand-in for CuPy over NumPy host memory, with tests/fake_cuda/libcuda.c: what hfr asks of CuPy (an
ndarray's memory, device, dtype, shape and flags; devices, streams, events, the runtime's copies), for
tests/test_staged.py on machines without a GPU. Device memory is host memory."""
import ctypes

import numpy as np

from . import cuda

# The libcuda.so.1 this process binds (hfr's too, by the same name) must be the fake one tests/test_staged.py
# preloads: a real driver would take these host arrays for device memory (CUDA_ERROR_INVALID_VALUE).
_driver = ctypes.CDLL("libcuda.so.1")
if not hasattr(_driver, "fake_depth"):
    with open("/proc/self/maps") as maps:
        loaded = sorted({line.split()[-1] for line in maps if "libcuda" in line})
    raise ImportError(f"libcuda.so.1 here is not tests/fake_cuda's but {loaded}")


class _Memory:
    def __init__(self, ptr: int, device_id: int):
        self.ptr, self.device_id = ptr, device_id


class _Flags:
    def __init__(self, a: np.ndarray):
        self.c_contiguous = a.flags.c_contiguous


class ndarray:  # noqa: N801 (CuPy's name)
    def __init__(self, a: np.ndarray, device_id: int = 0):
        self.a, self._device_id = a, device_id

    data = property(lambda self: _Memory(self.a.ctypes.data, self._device_id))
    device = property(lambda self: cuda.Device(self._device_id))
    flags = property(lambda self: _Flags(self.a))
    dtype = property(lambda self: self.a.dtype)
    size = property(lambda self: self.a.size)
    shape = property(lambda self: self.a.shape)
    ndim = property(lambda self: self.a.ndim)
    nbytes = property(lambda self: self.a.nbytes)
    strides = property(lambda self: self.a.strides)

    def reshape(self, *shape):
        return ndarray(self.a.reshape(*shape), self._device_id)

    def __getitem__(self, key):
        return ndarray(self.a[key], self._device_id)

    def __setitem__(self, key, value):  # a copy on the current stream: at once, device memory being host memory
        self.a[key] = value.a if isinstance(value, ndarray) else value


def asarray(a) -> ndarray:
    return ndarray(np.array(a))


def asnumpy(x: ndarray) -> np.ndarray:
    return x.a.copy()


class _Function:  # a RawKernel: its kernel, the loaded function, has the CUfunction as ptr
    def __init__(self, ptr: int):
        self.ptr = ptr
        self.kernel = self


class RawModule:
    """CuPy's RawModule over the fake driver: its functions are the fake's kernels, known by name."""

    def __init__(self, code: str, options=(), name_expressions=None, backend: str = "nvrtc"):
        self._driver = _driver
        self._module = ctypes.c_void_p()
        self._driver.cuModuleLoadData(ctypes.byref(self._module), ctypes.c_char_p(code.encode()))

    def get_function(self, name: str) -> _Function:
        function = ctypes.c_void_p()
        self._driver.cuModuleGetFunction(ctypes.byref(function), self._module, name.encode())
        return _Function(function.value)
