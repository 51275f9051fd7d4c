"""Copies between a rank's array and the node-shared segment.

A copy returns a token: None when it has already finished, else a CUDA event to poll. For CuPy
arrays the copies run on two streams of the Communicator's own, one each way, so that copies in and
out overlap (the GPU's copy engines, no kernel), both ordered after the work the caller had queued on
its current stream when it made the call.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["HostCopies", "CudaCopies", "finished", "caller_ready"]


def finished(token: Any) -> bool:
    return token is None or token.done


def caller_ready(stream: Any, device: int) -> Any:
    """A CUDA event recorded on the caller's stream of device (CuPy's or torch's current one, a cupy
    Stream or ExternalStream), made on that device whatever device is current: copies wait for it."""
    import cupy

    with cupy.cuda.Device(device):
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
    return event


def _copy_with_threads():
    """copy(dst, src, threads): the Cython kernels' threaded copy, else NumPy's memcpy."""
    try:
        from ._kernels import parallel_copy

        return parallel_copy
    except ImportError:
        return lambda dst, src, threads: np.copyto(dst, src)


class HostCopies:
    """NumPy arrays: a copy on `threads` threads, finished when it returns."""

    def __init__(self, threads: int):
        self.threads = threads
        self._copy = _copy_with_threads()

    def begin(self, ready: Any, caller: Any) -> None:
        pass

    def wait(self, token: Any) -> None:
        pass

    def drain(self) -> None:
        pass

    def to_segment(self, dst: np.ndarray, src: Any, start: int) -> None:
        self._copy(dst, src.view(np.uint8)[start : start + dst.size], self.threads)

    def from_segment(self, dst: Any, start: int, src: np.ndarray) -> None:
        self._copy(dst.view(np.uint8)[start : start + src.size], src, self.threads)


class CudaCopies:
    """CuPy arrays on one device: asynchronous copies through a page-locked segment. Used with that
    device current (the engine makes it so), so that every event is made on the streams' device.
    Calls are staged in C instead where they can be (hfr/_node_call.pyx): through `driver` (hfr/_cuda.pyx)
    on the streams that streams() names, with `staging`, page-locked, for a small call's result."""

    def __init__(self, device: int, staging_bytes: int):
        import cupy
        import cupyx

        from ._cuda import Device

        self._cupy = cupy
        self.device = device
        self.driver = Device(device)
        with cupy.cuda.Device(device):
            self.to_host = cupy.cuda.Stream(non_blocking=True)
            self.to_device = cupy.cuda.Stream(non_blocking=True)
            self.staging = cupyx.empty_pinned(staging_bytes, np.uint8)
        self.staging_address = self.staging.ctypes.data

    def begin(self, ready: Optional[Any], caller: Any) -> None:
        """Order the copies that follow after the event recorded on the caller's stream when the call was
        queued; with none (a call run on the caller's thread), after the caller's stream as it is now."""
        if ready is None:
            ready = caller_ready(caller, self.device)
        self.to_host.wait_event(ready)
        self.to_device.wait_event(ready)

    def streams(self, ready: Optional[Any], caller: Any, several: bool) -> tuple[int, int]:
        """The streams (handles) that a call staged in C copies in and out on: the caller's stream for a
        call of one chunk run on its thread (ready None: in that stream's order, without an event), else
        ours after begin(ready), so that a call of several chunks copies both ways at once."""
        if ready is None and not several:
            return caller.ptr, caller.ptr
        self.begin(ready, caller)
        return self.to_host.ptr, self.to_device.ptr

    def wait(self, token: Any) -> None:
        """Block until the copy of token has finished (the GIL is released meanwhile)."""
        if token is not None:
            token.synchronize()

    def drain(self) -> None:
        """Block until every copy queued so far, either way, has finished."""
        self.to_host.synchronize()
        self.to_device.synchronize()

    def _copy(self, stream: Any, dst_ptr: int, src_ptr: int, nbytes: int, kind: int) -> Any:
        self._cupy.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, kind, stream.ptr)
        event = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return event

    def to_segment(self, dst: np.ndarray, src: Any, start: int) -> Any:
        return self._copy(self.to_host, dst.ctypes.data, src.data.ptr + start, dst.size,
                          self._cupy.cuda.runtime.memcpyDeviceToHost)

    def from_segment(self, dst: Any, start: int, src: np.ndarray) -> Any:
        return self._copy(self.to_device, dst.data.ptr + start, src.ctypes.data, src.size,
                          self._cupy.cuda.runtime.memcpyHostToDevice)
