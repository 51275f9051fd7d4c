"""What the engine needs for a CuPy array's calls, which run staged in C (hfr/_node_call.pyx, through the
driver: hfr/_cuda.pyx, which also orders a call's copies after its caller's work): the device, and a
page-locked staging buffer for a small call's result; and, for a call that runs later than it is made, an
event recorded on the caller's stream when it is made.
"""
from __future__ import annotations

from typing import Any

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
    """CuPy arrays on one device, whose calls are staged in C through `driver` (hfr/_cuda.pyx), with
    `staging`, page-locked, for a small call's result."""

    def __init__(self, device: int, staging_bytes: int):
        import cupy
        import cupyx

        from ._cuda import Device

        self.device = device
        self.driver = Device(device)
        with cupy.cuda.Device(device):
            self.staging = cupyx.empty_pinned(staging_bytes, np.uint8)
        self.staging_address = self.staging.ctypes.data
        self.pair_kernels = None  # the GPU pair's add (hfr/pairs.py), once the engine prepared the pair
