"""GPU pairs (the paper's Section IV-C; hfr/_node_call.pyx says how a paired call runs): the pair's add, one
small CUDA kernel per element kind and op, compiled once through CuPy (NVRTC), and what a rank prepares for
its partner at its first CUDA call.

Local ranks 2i and 2i + 1 of a node are partners. With HFR_PAIRS=auto (the default) a pair forms where
their devices are NVLink peers (peer access with native atomics, which PCIe peers lack), or one device
whose processes run at once (an MPS server: concurrent()), for calls from PAIRS_FROM_BYTES; `on` pairs
over any peer access, on one device always, and at every size; `off` never pairs. A call is paired only
where both partners can pair it (the C loop decides from both ranks' words after the call check), so a
partner on host arrays, or one that met CUDA later, just leaves the pair apart for that call.

Why not on a time-sliced device: a paired chunk's hand-overs (a push, then the partner's add after it)
cross processes, and where the device time-slices its processes each waits for the partner's slice. On
the GPU host (H100, bench/RESULTS.md, "GPU pairs"), 186 MiB: 4 ranks time-sliced 1.15-1.37x faster than
unpaired, 8 ranks 0.78x (slower), 64 MiB and below slower; under MPS 2.8x (4 ranks), 2.1x (8), and
1.2-3x from 1 MiB.
"""
from __future__ import annotations

import os
from typing import Any

from . import _node_call

__all__ = ["MODES", "PAIRS_FROM_BYTES", "concurrent", "wanted", "prepare"]

MODES = tuple(mode.name[len("PAIRS_"):].lower() for mode in _node_call.Pairs)  # HFR_PAIRS: auto, on, off
# With `auto`, calls of fewer bytes stay apart: the smallest measured faster paired (one device under MPS, 4 and
# 8 ranks: 1.2-1.26x at 1 MiB; 512 KiB even, 256 KiB slower). NVLink peers are unmeasured (a lease of 2+ GPUs).
PAIRS_FROM_BYTES = 1 << 20

# The add: acc[i] = a op b over the pair's two halves, a the lower local rank's (acc's where acc_first), in
# the accumulation type (float32 for the half types, rounded to nearest even once), as hfr/_tiles.pxi's
# loops do (max and min return a NaN of either side; integer sums wrap: they run on the unsigned kinds).
_SOURCE = r"""
__device__ __forceinline__ float fp16_wide(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short fp16_narrow(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float bf16_wide(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short bf16_narrow(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  /* a quiet NaN */
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#define SAME(v) (v)
#define SUM(a, b) ((a) + (b))
#define PROD(a, b) ((a) * (b))
#define MAX(a, b) (((a) > (b)) | ((a) != (a)) ? (a) : (b))
#define MIN(a, b) (((a) < (b)) | ((a) != (a)) ? (a) : (b))
#define ADD(NAME, T, W, WIDE, NARROW, OP) \
extern "C" __global__ void NAME(T* acc, const T* other, unsigned long long n, int acc_first) { \
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x; \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) { \
        W mine = WIDE(acc[i]), theirs = WIDE(other[i]); \
        W a = acc_first ? mine : theirs, b = acc_first ? theirs : mine; \
        acc[i] = (T)NARROW(OP(a, b)); \
    } \
}
"""


def _source() -> str:
    """The add's CUDA source, one kernel a line of _node_call.PAIR_ADDS."""
    return "\n".join([_SOURCE] + [f"ADD({', '.join(kernel)})" for kernel in _node_call.PAIR_ADDS]) + "\n"


def concurrent() -> bool:
    """Whether this host's processes run at once on a device: an MPS server's control pipe is there
    (CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps), and a CUDA process connects to it."""
    return os.path.exists(os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control"))


def wanted(mode: str) -> bool:
    """Whether a rank with a partner prepares its side of a pair (compiles the add, allocates its boxes) under
    mode: not `off`, nor `auto` where no pair can form, one time-sliced device visible and no MPS (a partner
    is then on this device, which auto leaves apart, or on one this process cannot see)."""
    if mode != "auto":
        return mode == "on"
    import cupy

    return concurrent() or cupy.cuda.runtime.getDeviceCount() > 1


def prepare(driver: Any, device: int, box_bytes: int, record: int, mode: str) -> Any:
    """Compile the add's kernels on device (CuPy caches them on disk) and make this rank's side of its pair
    through driver (hfr/_cuda.pyx's Device.prepare_pair), its record written at address record, linking as
    mode (HFR_PAIRS) says. Returns the module, which must live as long as the driver."""
    import cupy

    with cupy.cuda.Device(device):
        module = cupy.RawModule(code=_source(), options=("--std=c++11",))
        kernels = [module.get_function(kernel[0]).kernel.ptr for kernel in _node_call.PAIR_ADDS]
        driver.prepare_pair(box_bytes, kernels, record, mode == "on" or concurrent(), mode == "on")
    return module
