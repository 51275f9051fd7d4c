"""cupy.cuda's parts that hfr uses, over host memory (tests/fake_cuda/cupy/__init__.py)."""
import ctypes
import itertools
import threading

_local = threading.local()
_handles = itertools.count(0x100)


def _current() -> int:
    return getattr(_local, "device", 0)


class Device:
    def __init__(self, device=None):
        self.id = _current() if device is None else int(device)

    def use(self) -> None:
        _local.device = self.id

    def __enter__(self):
        self._before = _current()
        self.use()
        return self

    def __exit__(self, *exc) -> None:
        _local.device = self._before


class Stream:
    def __init__(self, non_blocking: bool = False, ptr=None):
        self.ptr = next(_handles) if ptr is None else ptr
        self.device_id = _current()

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def __enter__(self):  # current within the block: the fake's copies run at once, on no stream of their own
        return self

    def __exit__(self, *exc) -> None:
        pass


Stream.null = Stream(ptr=0)


def get_current_stream(device_id: int = -1) -> Stream:
    return Stream.null


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False):
        self.done = True
        self.ptr = next(_handles)  # never looked at: the fake driver's stream waits wait for nothing

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class runtime:  # noqa: N801 (CuPy's module name)
    memcpyHostToDevice, memcpyDeviceToHost = 1, 2

    @staticmethod
    def memcpyAsync(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    @staticmethod
    def hostRegister(address: int, nbytes: int, flags: int) -> None:
        pass

    @staticmethod
    def hostUnregister(address: int) -> None:
        pass

    @staticmethod
    def getDevice() -> int:
        return _current()

    @staticmethod
    def getDeviceCount() -> int:
        return 1
