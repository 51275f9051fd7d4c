"""NumPy or CuPy arrays behind one small interface, so the harness never branches on the kind."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ArrayKind"]


class ArrayKind:
    """"numpy": host arrays. "cupy": arrays on this rank's current CUDA device."""

    def __init__(self, name: str) -> None:
        if name not in ("numpy", "cupy"):
            raise ValueError(f"unknown array kind {name!r}: expected numpy or cupy")
        self.name = name
        if name == "cupy":
            import cupy  # noqa: F401  (fails early, with CuPy's own message, where it is missing)
            import cupyx

            self.xp = cupy
            self.cupyx = cupyx
        else:
            self.xp = np

    def from_host(self, host: np.ndarray) -> Any:
        """A new array of this kind holding host's values."""
        return host.copy() if self.name == "numpy" else self.xp.asarray(host)

    def to_host(self, array: Any) -> np.ndarray:
        return array if self.name == "numpy" else array.get()

    def copy(self, dst: Any, src: Any) -> None:
        self.xp.copyto(dst, src)

    def synchronize(self) -> None:
        """Wait for everything queued on the device, so a clock read after it covers the work."""
        if self.name == "cupy":
            self.xp.cuda.Device().synchronize()

    def empty_pinned(self, count: int, dtype: np.dtype) -> np.ndarray:
        """Page-locked host memory (CuPy), for copies to and from the device."""
        return self.cupyx.empty_pinned(count, dtype=dtype)

    def as_torch(self, array: Any) -> Any:
        """A torch tensor sharing array's memory (bfloat16 through an int16 view: NumPy has no torch dtype for it)."""
        import torch

        if self.name == "cupy":
            return torch.from_dlpack(array)
        if array.dtype.name == "bfloat16":
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)
