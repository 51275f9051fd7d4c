"""The arrays hfr accepts, checked up front: NumPy on the host, CuPy on a GPU, and PyTorch tensors on
either (zero-copy: a CPU tensor as a NumPy view, a CUDA one as itself; torch itself is imported only when a
tensor is passed).

`inspect` turns a user's array into an Array: its library, where its memory is, device, dtype,
element count, a flat view and the stream its pending GPU work is queued on, or raises
TypeError/ValueError naming what is wrong, before anything is modified.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ._kernels import data_address
from ._node_call import apart, at_shard, same_or_apart
from .ops import DTYPE_CODES, DTYPES, as_dtype

__all__ = ["Array", "inspect", "check_out", "check_shards"]


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~1 us more, on every call
class Array:
    """A checked array: `flat` is a 1-D view of the same memory, a numpy.ndarray when kind is "numpy", a
    cupy.ndarray when kind is "cupy" (CUDA memory), or a CUDA tensor's own 1-D view."""

    obj: Any  # what the user passed, returned to them as the result
    flat: Any
    kind: str  # where the memory is and how hfr copies it: "numpy" (host) or "cupy" (CUDA device)
    device: Optional[int]  # CUDA device, None on the host
    dtype: np.dtype
    shape: tuple
    library: str  # what the user passed: "numpy", "cupy" or "torch"
    stream: Any  # CUDA arrays: the cupy stream (or ExternalStream) the caller's work is queued on
    address: int  # of the first element, on the host or the device
    size: int  # elements
    nbytes: int

    def describe(self) -> str:
        where = "" if self.device is None else f" on CUDA device {self.device}"
        return f"{self.library} {'tensor' if self.library == 'torch' else 'array'}{where}"


def _is_cupy(x: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def inspect(x: Any, name: str = "x", *, writable: bool = True) -> Array:
    """x as an Array, or TypeError/ValueError naming the problem."""
    if isinstance(x, np.ndarray):
        kind, device, stream, flags = "numpy", None, None, x.flags
        if writable and not flags.writeable:
            raise ValueError(f"{name} is read-only: it cannot receive the result (pass out=)")
        if flags.c_contiguous and x.dtype in DTYPE_CODES:  # the common case, in fewer steps
            return Array(x, _flat(x), kind, None, x.dtype, x.shape, kind, None, data_address(x), x.size, x.nbytes)
    elif _is_torch(x):
        return _inspect_tensor(x, name, writable)
    elif _is_cupy(x):
        import cupy

        kind, device = "cupy", x.data.device_id
        stream = cupy.cuda.get_current_stream(device)  # x's device's, whatever device is current (no CUDA call)
    else:
        raise TypeError(f"{name} must be a numpy.ndarray or cupy.ndarray (or a torch.Tensor), got {type(x).__name__}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous (shape {x.shape}, strides {x.strides})")
    dtype = as_dtype(x.dtype)
    return Array(x, _flat(x), kind, device, dtype, tuple(x.shape), kind, stream, _address(x, kind), x.size, x.nbytes)


def _inspect_tensor(t: Any, name: str, writable: bool) -> Array:
    """A torch tensor, on the CPU (viewed as a NumPy array) or a CUDA device (its pointer, with torch's current
    stream as a CuPy ExternalStream: no DLPack view, which cost more than a small call).

    Writing into a tensor that requires grad is refused while grad mode is on, as torch refuses
    in-place ops on leaves: reduce under torch.no_grad(), or reduce t.detach() or t.grad. The write
    bumps the tensor's version counter, as torch's in-place ops do."""
    import torch

    if t.layout != torch.strided or t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{name} must be a dense CPU or CUDA tensor, got a {t.layout} tensor on {t.device}")
    dtypes = torch_dtypes(torch)
    if t.dtype not in dtypes:
        raise TypeError(f"unsupported dtype {t.dtype}: hfr reduces {', '.join(d.name for d in DTYPES)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()})")
    if t.numel() and t.data_ptr() == 0:
        raise ValueError(f"{name} has no memory (a freed storage, or one of torch's zero tensors)")
    if t.is_neg():
        raise ValueError(f"{name} has torch's negative bit set (a lazily negated view, such as z.conj().imag): "
                         f"pass {name}.resolve_neg()")
    if writable and t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad and cannot be written in place while grad mode is on: "
                         f"reduce it under torch.no_grad(), or pass {name}.detach()")
    dtype = dtypes[t.dtype]
    if t.is_cuda:
        import cupy

        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(t.device).cuda_stream, t.device.index)
        flat, kind, device, address = t.detach().view(-1), "cupy", t.device.index, t.data_ptr()
    else:  # its NumPy view (what DLPack would give, for a quarter of the time); NumPy has no bfloat16
        bits = t.detach().view(torch.int16) if t.dtype == torch.bfloat16 else t.detach()
        flat, kind, device, stream = _flat(bits.numpy()).view(dtype), "numpy", None, None
        address = data_address(flat)
    if writable:
        torch.autograd.graph.increment_version(t)
    return Array(t, flat, kind, device, dtype, tuple(t.shape), "torch", stream, address, t.numel(),
                 t.numel() * dtype.itemsize)


_TORCH_DTYPES: dict = {}  # torch dtype -> ours, made at the first tensor (~16 us: torch's getattr is slow)


def torch_dtypes(torch: Any) -> dict:
    """torch's dtypes that hfr reduces -> ours (NumPy's)."""
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({getattr(torch, d.name): d for d in DTYPES})  # torch names its dtypes as NumPy does
    return _TORCH_DTYPES


def _flat(a: Any) -> Any:
    """A C-contiguous array as 1-D: itself where it is (a view costs a CuPy array more than a NumPy one)."""
    return a if a.ndim == 1 else a.reshape(-1)


def _address(a: Any, kind: str) -> int:
    return data_address(a) if kind == "numpy" else a.data.ptr


def check_out(x: Array, out: Any) -> Array:
    """out as an Array matching x in library, shape, dtype and device, not partly overlapping x."""
    o = _like(x, out)
    if o.shape != x.shape:
        raise ValueError(f"out has shape {o.shape}, x has {x.shape}")
    if not same_or_apart(o.address, x.address, x.nbytes):
        raise ValueError("out partly overlaps x: pass the same array for in place, or a separate one")
    return o


def check_shards(x: Array, out: Any, collective: str, ranks: int, rank: int) -> Array:
    """out of a reduce_scatter (x: ranks * k elements, out: this rank's k) or an allgather (x: k, out:
    ranks * k), as an Array matching x in library, dtype and device. The shard may lie in the whole
    array at this rank's place (in place, as FSDP's all-gather does), nowhere else in it."""
    o = _like(x, out)
    whole, shard = (x, o) if collective == "reduce_scatter" else (o, x)
    if whole.size != ranks * shard.size:
        raise ValueError(f"{collective} over {ranks} ranks needs {'x' if whole is x else 'out'} to hold {ranks} x "
                         f"{'out' if whole is x else 'x'}'s elements: x has {x.size}, out has {o.size}")
    if (shard.nbytes and not at_shard(shard.address, whole.address, shard.nbytes, rank)
            and not apart(o.address, o.nbytes, x.address, x.nbytes)):
        raise ValueError(f"out overlaps x other than at rank {rank}'s shard: pass separate arrays, or the shard "
                         f"at its place in the whole")
    return o


def _like(x: Array, out: Any) -> Array:
    """out as an Array of x's library, kind, device and dtype."""
    o = inspect(out, "out")
    if (o.library, o.kind, o.device) != (x.library, x.kind, x.device):
        raise ValueError(f"out is a {o.describe()}, x is a {x.describe()}")
    if o.dtype != x.dtype:
        raise TypeError(f"out has dtype {o.dtype}, x has {x.dtype}")
    return o
