"""NumPy arrays, torch CPU tensors or CuPy arrays behind one small interface, so the harness never branches
on the kind."""
from __future__ import annotations

from typing import Any

import numpy as np

from .collectives import poison

__all__ = ["ArrayKind", "KINDS"]

KINDS = ("numpy", "torch", "cupy")


def _torch_view(host: np.ndarray) -> Any:
    """A torch tensor sharing host's memory (bfloat16 through an int16 view: NumPy has no torch dtype for it)."""
    import torch

    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(host)


def _numpy_view(tensor: Any) -> np.ndarray:
    """A NumPy array sharing a CPU tensor's memory (bfloat16 through an int16 view)."""
    import ml_dtypes
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


class ArrayKind:
    """"numpy": host arrays. "torch": torch CPU tensors. "cupy": arrays on this rank's current CUDA device."""

    def __init__(self, name: str) -> None:
        if name not in KINDS:
            raise ValueError(f"unknown array kind {name!r}: expected one of {', '.join(KINDS)}")
        self.name = name
        self.xp = np
        if name == "torch":
            import torch  # noqa: F401  (fails early, with its own message, where it is missing)
        elif name == "cupy":
            import cupy  # noqa: F401  (fails early, with CuPy's own message, where it is missing)
            import cupyx

            self.xp = cupy
            self.cupyx = cupyx

    def from_host(self, host: np.ndarray) -> Any:
        """A new array of this kind holding host's values."""
        if self.name == "cupy":
            return self.xp.asarray(host)
        return _torch_view(host.copy()) if self.name == "torch" else host.copy()

    def to_host(self, array: Any) -> np.ndarray:
        """array's values as a NumPy array: itself, a view of a tensor's memory, or a copy of a device array."""
        if self.name == "cupy":
            return array.get()
        return _numpy_view(array) if self.name == "torch" else array

    def copy(self, dst: Any, src: Any) -> None:
        if self.name == "torch":
            dst.copy_(src)
        else:
            self.xp.copyto(dst, src)

    def poison(self, array: Any) -> None:
        """Fill an output with values no correct result holds (collectives.poison), in its own memory."""
        poison(self.to_host(array) if self.name == "torch" else array)

    def synchronize(self) -> None:
        """Wait for everything queued on the device, so a clock read after it covers the work."""
        if self.name == "cupy":
            self.xp.cuda.Device().synchronize()

    def empty_pinned(self, count: int, dtype: np.dtype) -> np.ndarray:
        """Page-locked host memory (CuPy), for copies to and from the device."""
        return self.cupyx.empty_pinned(count, dtype=dtype)

    def as_torch(self, array: Any) -> Any:
        """A torch tensor sharing array's memory (the array itself for torch tensors)."""
        if self.name == "cupy":
            import torch

            return torch.from_dlpack(array)
        return array if self.name == "torch" else _torch_view(array)
