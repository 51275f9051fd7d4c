"""The node-shared staging segment: an MPI shared window allocated once per Communicator and reused.

Layout, for a node of L ranks and S pipeline **stages** (a chunk c uses stage c % S):
- a control block: one row of int64 words per local rank, written only by that rank (its progress
  counters and its call descriptor), read by the others;
- S data stages, each L input **slots** (slot l holds local rank l's copy of the chunk) and one
  **result** slot (the reduced chunk), every slot `slot_bytes` long and page aligned.
For CuPy arrays the whole segment is page-locked for the GPU (cudaHostRegister) once, on first use.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from ._node_call import Protocol

__all__ = ["Segment", "ROW_WORDS"]

PAGE = 4096
ROW_WORDS = int(Protocol.ROW_WORDS)  # int64 words of control per local rank (hfr/_node_call.pxd)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Segment:
    """Shared staging memory of one node (collective over node_comm to make and to free)."""

    def __init__(self, node_comm: MPI.Comm, slot_bytes: int, stages: int):
        self.local_size = node_comm.Get_size()
        self.slot_bytes = _round_up(max(slot_bytes, PAGE), PAGE)
        control_bytes = _round_up(self.local_size * ROW_WORDS * 8, PAGE)
        self.stage_bytes = (self.local_size + 1) * self.slot_bytes
        total = control_bytes + stages * self.stage_bytes
        # Local rank 0 allocates everything; the others map its memory.
        self._win = MPI.Win.Allocate_shared(total if node_comm.Get_rank() == 0 else 0, 1, comm=node_comm)
        buf, _ = self._win.Shared_query(0)
        self.memory = np.frombuffer(buf, dtype=np.uint8, count=total)
        self.control = self.memory[: self.local_size * ROW_WORDS * 8].view(np.int64).reshape(self.local_size, ROW_WORDS)
        self.address, self.control_address = self.memory.ctypes.data, self.control.ctypes.data
        self.stages = self.memory[control_bytes:]  # the data stages, as bytes (hfr/_node_call.pyx's offsets)
        self.stages_address = self.stages.ctypes.data
        # A passive epoch for the window's lifetime, so that sync() (MPI_Win_sync) orders our stores
        # and loads against the other ranks' on any CPU, not only on x86.
        self._win.Lock_all(MPI.MODE_NOCHECK)
        if node_comm.Get_rank() == 0:
            self.control[...] = 0
        self.sync()
        node_comm.Barrier()
        self.sync()
        self._cuda_device: Optional[int] = None  # the device the segment was page-locked on

    def sync(self) -> None:
        """A full memory barrier between this rank and the others on the segment."""
        self._win.Sync()

    def register_for_cuda(self, device: int) -> None:
        """Page-lock the whole segment for the GPUs, once, from device's context (it costs 0.2-0.6 s;
        never per call)."""
        if self._cuda_device is not None:
            return
        import cupy

        with cupy.cuda.Device(device):
            cupy.cuda.runtime.hostRegister(self.address, self.memory.nbytes, 1)  # 1: cudaHostRegisterPortable
        self._cuda_device = device

    def free(self) -> None:
        """Unregister and free the window (collective over the node)."""
        if self._cuda_device is not None:
            import cupy

            with cupy.cuda.Device(self._cuda_device):  # never a context on another device
                cupy.cuda.runtime.hostUnregister(self.address)
            self._cuda_device = None
        self.control = self.memory = self.stages = None
        self._win.Unlock_all()
        self._win.Free()
