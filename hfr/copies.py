"""What the engine needs for a CuPy array's calls, which run staged in C (hfr/_node_call.pyx, through the
driver: hfr/_cuda.pyx): two streams of the Communicator's own, one each way, so that a call's copies in and
out overlap (the GPU's copy engines, no kernel), ordered after the work the caller had queued on its
current stream when it made the call; and a page-locked staging buffer for a small call's result.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["CudaCopies", "caller_ready"]


def caller_ready(stream: Any, device: int) -> Any:
    """A CUDA event recorded on the caller's stream of device (CuPy's or torch's current one, a cupy
    Stream or ExternalStream), made on that device whatever device is current: copies wait for it."""
    import cupy

    with cupy.cuda.Device(device):
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
    return event


class CudaCopies:
    """CuPy arrays on one device, whose calls are staged in C through `driver` (hfr/_cuda.pyx) on the streams
    that streams() names, with `staging`, page-locked, for a small call's result. Used with that device
    current (the engine makes it so), so that every event is made on the streams' device."""

    def __init__(self, device: int, staging_bytes: int):
        import cupy
        import cupyx

        from ._cuda import Device

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
