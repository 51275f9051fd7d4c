"""The implementations the harness times: hfr and its peers, each real or reported missing.

Every backend's collectives have one signature, (send, recv, op, root); in place means `send is recv`.
Where a library's collective only works in place, out-of-place is a copy then the in-place collective, as
its users would write it, and the copy is timed. Where a library has no average, "avg" is a sum then one
division, also timed. `unsupported(...)` names the reason a combination cannot run (deepspeed's: all but an
in-place sum); a library that cannot be used at all raises Unavailable from its constructor.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from mpi4py import MPI

import hfr
from hfr import kernels
from hfr.internode import ALGOS
from hfr.rendezvous import store_address

from .arrays import ArrayKind
from .collectives import Collective

__all__ = ["Unavailable", "make_backend", "BACKEND_NAMES", "FLOOR_NAMES", "HFR_ALGO_NAMES", "HFR_PAIRS_NAMES",
           "ranks_per_host"]

_HALF_TYPES = ("float16", "bfloat16")


class Unavailable(Exception):
    """The backend cannot run here; the message says why."""


def ranks_per_host(comm: MPI.Comm) -> int:
    host_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return host_comm.size
    finally:
        host_comm.Free()


def _finish_avg(recv: Any, op: str, nranks: int) -> None:
    """Turn a sum into an average, in place, for libraries that have no AVG."""
    if op == "avg":
        recv /= nranks


class HfrBackend:
    """hfr's Communicator on the whole job; "hfr:ALGO" forces the inter-node algorithm ALGO (HFR_ALGO),
    "hfr:pairs-MODE" its GPU pairs (the Communicator's pairs argument: on, off)."""

    name = "hfr"

    def __init__(self, comm: MPI.Comm, kind: ArrayKind, algo: Optional[str] = None, pairs: Optional[str] = None) -> None:
        if pairs is not None:
            self.name = f"hfr:pairs-{pairs}"
        if algo is None:
            self.comm = hfr.Communicator(comm=comm, pairs=pairs)
            return
        self.name = f"hfr:{algo}"
        saved = os.environ.get("HFR_ALGO")
        os.environ["HFR_ALGO"] = algo  # read once, by the Communicator's constructor
        try:
            self.comm = hfr.Communicator(comm=comm)
        finally:
            if saved is None:
                del os.environ["HFR_ALGO"]
            else:
                os.environ["HFR_ALGO"] = saved

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        method = getattr(self.comm, coll.name)
        if not in_place and "out" not in inspect.signature(method).parameters:
            return f"hfr's {coll.name} works in place only"
        return None

    def describe(self) -> str:
        c = self.comm
        settings = " ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith("HFR_"))
        return (f"{self.name} {hfr.__version__}: {c.nnodes} node(s) x local size {c.local_size}, chunk {c.chunk_bytes} B, "
                f"kernels cython {kernels.simd()}; env {settings or '(no HFR_* set: defaults)'}")

    def allreduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        self.comm.allreduce(send, op=op, out=None if send is recv else recv)

    def reduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._rooted(self.comm.reduce, send, recv, root, op=op)

    def broadcast(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._rooted(self.comm.broadcast, send, recv, root)

    def reduce_scatter(self, send: Any, recv: Any, op: str, root: int) -> None:
        self.comm.reduce_scatter(send, recv, op=op)

    def allgather(self, send: Any, recv: Any, op: str, root: int) -> None:
        self.comm.allgather(send, recv)

    @staticmethod
    def _rooted(method: Callable, send: Any, recv: Any, root: int, **kwargs: Any) -> None:
        if send is recv:
            method(send, root=root, **kwargs)
        else:
            method(send, root=root, out=recv, **kwargs)

    def close(self) -> None:
        self.comm.close()


class MpiBackend:
    """MPI Allreduce / Reduce / Bcast on host arrays, through mpi4py's buffer interface."""

    name = "mpi"
    _OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}

    def __init__(self, comm: MPI.Comm, kind: ArrayKind) -> None:
        self.comm = comm
        self.kind = kind

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        if self.kind.name == "torch":
            return "takes NumPy arrays: use --array numpy"
        if self.kind.name != "numpy":
            return "takes host arrays (CUDA-aware MPI not assumed): see mpi-staged"
        if coll.uses_op and dtype.name in _HALF_TYPES:
            return f"MPI has no standard {dtype.name} reduction"
        return None

    def allreduce(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        self.comm.Allreduce(MPI.IN_PLACE if send is recv else send, recv, op=self._OPS[op])
        _finish_avg(recv, op, self.comm.size)

    def reduce(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        if self.comm.rank != root:
            self.comm.Reduce(send, None, op=self._OPS[op], root=root)
            return
        self.comm.Reduce(MPI.IN_PLACE if send is recv else send, recv, op=self._OPS[op], root=root)
        _finish_avg(recv, op, self.comm.size)

    def broadcast(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        if self.comm.rank == root and send is not recv:
            np.copyto(recv, send)
        self.comm.Bcast([recv.view(np.uint8), MPI.BYTE], root=root)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        if np.may_share_memory(send, recv):  # recv is our shard of send: MPI's in place leaves it at send's start
            self.comm.Reduce_scatter_block(MPI.IN_PLACE, send, op=self._OPS[op])
            np.copyto(recv, send[: recv.size])
        else:
            self.comm.Reduce_scatter_block(send, recv, op=self._OPS[op])
        _finish_avg(recv, op, self.comm.size)

    def allgather(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        self.comm.Allgather(MPI.IN_PLACE if np.may_share_memory(send, recv) else send, recv)

    def close(self) -> None:
        pass


class MpiStagedBackend:
    """Device arrays through MPI on the host: D2H into pinned buffers, the MPI collective, H2D."""

    name = "mpi-staged"

    def __init__(self, comm: MPI.Comm, kind: ArrayKind) -> None:
        self.host = MpiBackend(comm, ArrayKind("numpy"))
        self.kind = kind
        self.staging: dict[tuple, np.ndarray] = {}  # (shape, dtype, role) -> pinned host buffer, reused

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        if self.kind.name != "cupy":
            return "stages device arrays; host arrays are the mpi backend"
        return self.host.unsupported(coll, dtype, op, in_place)

    def _staged(self, array: Any, role: str) -> np.ndarray:
        key = (array.shape, array.dtype, role)
        if key not in self.staging:
            self.staging[key] = self.kind.empty_pinned(array.size, array.dtype)
        return self.staging[key]

    def _run(self, method: Callable, send: Any, recv: Any, op: str, root: int) -> None:
        host_send = self._staged(send, "send")
        send.get(out=host_send)
        host_recv = host_send if send is recv else self._staged(recv, "recv")
        method(host_send, host_recv, op, root)
        recv.set(host_recv)

    def allreduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._run(self.host.allreduce, send, recv, op, root)

    def reduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._run(self.host.reduce, send, recv, op, root)

    def broadcast(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._run(self.host.broadcast, send, recv, op, root)

    def reduce_scatter(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._run(self.host.reduce_scatter, send, recv, op, root)

    def allgather(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._run(self.host.allgather, send, recv, op, root)

    def close(self) -> None:
        self.staging.clear()


def _init_torch_distributed(comm: MPI.Comm) -> Any:
    """torch.distributed's default (gloo) group on the MPI job: rank 0 opens a TCP store on a free port
    at an address every rank reaches (hfr.rendezvous, which also points gloo at that network).
    Returns torch.distributed."""
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise Unavailable(f"torch is not importable: {e}") from None
    if dist.is_initialized():
        return dist
    address, port = store_address(comm)
    store = None
    if comm.rank == 0:  # the server listens before any client connects, so no client waits to retry
        store = dist.TCPStore(address, port, comm.size, is_master=True, wait_for_workers=False)
    comm.Barrier()
    if comm.rank != 0:
        store = dist.TCPStore(address, port, comm.size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size)
    return dist


class TorchBackend:
    """torch.distributed collectives (in place only) on tensors that share memory with the arrays."""

    def __init__(self, comm: MPI.Comm, kind: ArrayKind) -> None:
        self.dist = _init_torch_distributed(comm)
        self.kind = kind
        self.nranks = comm.size
        self.group: Any = None  # None: the default (gloo) group
        self._ops = {"sum": self.dist.ReduceOp.SUM, "avg": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX,
                     "min": self.dist.ReduceOp.MIN, "prod": self.dist.ReduceOp.PRODUCT}

    def _in_place(self, send: Any, recv: Any, root: Optional[int]) -> Any:
        """recv as a tensor, holding send's data where a copy is needed first."""
        if send is not recv and (root is None or self.dist.get_rank() == root):
            self.kind.copy(recv, send)
        return self.kind.as_torch(recv)

    def allreduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        tensor = self._in_place(send, recv, None)
        self.dist.all_reduce(tensor, op=self._ops[op], group=self.group)
        _finish_avg(tensor, op, self.nranks)

    def reduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        # every rank's recv is also its input to the reduction, so every rank copies
        tensor = self._in_place(send, recv, None)
        self.dist.reduce(tensor, dst=root, op=self._ops[op], group=self.group)
        if self.dist.get_rank() == root:
            _finish_avg(tensor, op, self.nranks)

    def broadcast(self, send: Any, recv: Any, op: str, root: int) -> None:
        self.dist.broadcast(self._in_place(send, recv, root), src=root, group=self.group)

    # The flat forms: torch 2.13 names them *_single, 2.11 only reduce_scatter_tensor/all_gather_into_tensor.
    def reduce_scatter(self, send: Any, recv: Any, op: str, root: int) -> None:
        flat = getattr(self.dist, "reduce_scatter_single", None) or self.dist.reduce_scatter_tensor
        out = self.kind.as_torch(recv)
        flat(out, self.kind.as_torch(send), op=self._ops[op], group=self.group)
        _finish_avg(out, op, self.nranks)

    def allgather(self, send: Any, recv: Any, op: str, root: int) -> None:
        flat = getattr(self.dist, "all_gather_single", None) or self.dist.all_gather_into_tensor
        flat(self.kind.as_torch(recv), self.kind.as_torch(send), group=self.group)

    def close(self) -> None:
        if self.group is not None:
            self.dist.destroy_process_group(self.group)


class GlooBackend(TorchBackend):
    """torch.distributed over gloo: CPU tensors, and CUDA tensors for allreduce and broadcast."""

    name = "gloo"

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        if self.kind.name == "cupy" and coll.name == "reduce":
            return "gloo reduces CPU tensors only"
        return None


class NcclBackend(TorchBackend):
    """torch.distributed over NCCL, one GPU per rank: device arrays only."""

    name = "nccl"

    def __init__(self, comm: MPI.Comm, kind: ArrayKind) -> None:
        if kind.name != "cupy":
            raise Unavailable("NCCL reduces device arrays: use --array cupy")
        try:
            import torch
        except ImportError as e:
            raise Unavailable(f"torch is not importable: {e}") from None
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        per_host = ranks_per_host(comm)
        # every rank decides alike, or the group creation below would hang
        if comm.allreduce(int(gpus < max(per_host, 2)), op=MPI.MAX):
            raise Unavailable(f"needs >= 2 GPUs and one per rank: this host has {gpus} GPU(s) for {per_host} rank(s)")
        super().__init__(comm, kind)
        self.group = self.dist.new_group(backend="nccl")

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        return None


class DeepSpeedBackend:
    """DeepSpeed's shared-memory allreduce, deepspeed.comm.inference_all_reduce on CPU tensors (DS_ACCELERATOR=cpu),
    on torch views of the arrays: one host, sum, in place, float32 (bfloat16 and float16 where the CPU has
    AVX-512BW). Its op (csrc/cpu/comm/shm.cpp) is built on first use with ninja and a C++ compiler and cached under
    TORCH_EXTENSIONS_DIR (~/.cache/torch_extensions); its OpenMP threads (torch's): OMP_NUM_THREADS, by default
    this host's cores / ranks.

    DeepSpeed takes the shm op only where LOCAL_SIZE is the world size; where the op is not loaded or the CPU lacks
    the kernel's ISA, inference_all_reduce falls back to torch.distributed.all_reduce (gloo) without a word. So the
    constructor calls it once per dtype with that fallback replaced by a tripwire, checks the sums, and fails
    loudly unless float32 took the shm op.
    """

    name = "deepspeed"
    VERSION = "0.19.8"  # the one measured
    _SHM_DTYPES = ("float32", "bfloat16", "float16")  # the op returns other types as they were, unreduced

    def __init__(self, comm: MPI.Comm, kind: ArrayKind) -> None:
        if kind.name == "cupy":
            raise Unavailable("DeepSpeed's shm allreduce reduces CPU tensors: use --array numpy or torch")
        per_host = ranks_per_host(comm)
        if per_host != comm.size:
            raise Unavailable(f"one host only: DeepSpeed's shm allreduce needs every rank on one host, "
                              f"not {comm.size} ranks with {per_host} on this one")
        if comm.size < 2:
            raise Unavailable("needs >= 2 ranks: on one, inference_all_reduce returns its tensor untouched")
        os.environ["DS_ACCELERATOR"] = "cpu"  # read when deepspeed is imported
        try:
            import deepspeed
            import deepspeed.comm
            import torch
        except ImportError as e:
            raise Unavailable(f"{e}: pip install deepspeed=={self.VERSION} ninja") from None
        self.comm, self.kind, self.torch, self.ds_comm = comm, kind, torch, deepspeed.comm
        # the op's OpenMP loops run in torch's libgomp, which read OMP_NUM_THREADS when torch was imported
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // comm.size)))
        self.version = deepspeed.__version__
        failures = [f for f in comm.allgather(self._load_op()) if f]
        if failures:  # every rank decides alike, or the rendezvous below would hang
            raise Unavailable(failures[0])
        address, port = store_address(comm)
        # one host: the local rank is the rank; LOCAL_SIZE = the world size is what turns the shm op on
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), RANK=str(comm.rank), WORLD_SIZE=str(comm.size),
                          LOCAL_RANK=str(comm.rank), LOCAL_SIZE=str(comm.size))
        with contextlib.redirect_stdout(sys.stderr):  # its chatter would land above the table
            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        # this rank's segment (2 x 1 MiB + 2 x 32 MiB), named from MASTER_ADDR and MASTER_PORT; shm.cpp never removes it
        self.segment = Path("/dev/shm") / f"deepspeed_allreduce_buffer_{os.getuid()}_{address}_{port}_{comm.rank}"
        self.dtypes = self._shm_dtypes()
        if "float32" not in self.dtypes or not self.segment.exists():
            raise RuntimeError(f"deepspeed: inference_all_reduce did not take the shm op for float32 (no segment "
                               f"{self.segment}, or it fell back to torch.distributed.all_reduce): it would time gloo")

    @staticmethod
    def _load_op() -> Optional[str]:
        """Build (the first time) or load DeepSpeed's shm op: None, or why it failed."""
        from deepspeed.accelerator import get_accelerator

        if shutil.which("ninja") is None:  # pip's ninja lies beside this Python where its venv is not activated
            os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        try:
            with contextlib.redirect_stdout(sys.stderr):
                get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)
        except Exception as e:  # no compiler, no ninja, a failed build: DeepSpeed raises them all as RuntimeError
            return f"DeepSpeed's shm op did not build: {e}"
        return None

    def _shm_dtypes(self) -> tuple[str, ...]:
        """The dtypes whose calls take the shm op: one call each with DeepSpeed's fallback replaced by a tripwire
        (every rank on the host takes the same route, so none waits in the fallback), and its sum checked."""
        dist, n = self.torch.distributed, self.comm.size
        fallback, fell_back = dist.all_reduce, []
        dist.all_reduce = lambda *args, **kwargs: fell_back.append(True)
        taken = []
        try:
            for name in self._SHM_DTYPES:
                fell_back.clear()
                probe = self.torch.full((1024,), self.comm.rank + 1, dtype=getattr(self.torch, name))
                self.ds_comm.inference_all_reduce(probe)
                if not fell_back and bool((probe == n * (n + 1) // 2).all()):
                    taken.append(name)
        finally:
            dist.all_reduce = fallback
        everywhere = set.intersection(*map(set, self.comm.allgather(taken)))
        return tuple(name for name in self._SHM_DTYPES if name in everywhere)

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        if coll.name != "allreduce":
            return "DeepSpeed's shm op is an allreduce only"
        if op != "sum":
            return "DeepSpeed's shm allreduce sums only"
        if dtype.name in self._SHM_DTYPES and dtype.name not in self.dtypes:
            return f"DeepSpeed falls back to gloo for {dtype.name} on this CPU (its shm kernel needs AVX-512BW)"
        if dtype.name not in self.dtypes:
            return f"DeepSpeed's shm op sums {', '.join(self._SHM_DTYPES)} only"
        if not in_place:
            return "in place only: inference_all_reduce reduces its tensor where it lies"
        return None

    def describe(self) -> str:
        return (f"deepspeed {self.version}: the cpu accelerator's shm op for {', '.join(self.dtypes)}, "
                f"{self.torch.get_num_threads()} OpenMP thread(s); torch {self.torch.__version__}")

    def allreduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        self.ds_comm.inference_all_reduce(self.kind.as_torch(recv))

    def close(self) -> None:
        self.comm.Barrier()  # every rank mapped every segment in the constructor: none is opened after this
        self.segment.unlink(missing_ok=True)


class PcieFloorBackend:
    """Not a collective: the PCIe traffic of a staged call alone, the floor hfr's CuPy calls are held against.
    Each rank copies its send array device to host into page-locked memory and its recv array's bytes host to
    device, the two directions at once on two streams of their own, while every other rank does the same: the
    bytes a staged call must move across the link the ranks share, at the rate the link gives them together.
    Nothing is reduced, so nothing is checked."""

    name = "pcie-floor"

    def __init__(self, comm: MPI.Comm, kind: ArrayKind) -> None:
        if kind.name != "cupy":
            raise Unavailable("times copies between the device and the host: use --array cupy")
        import cupy

        self.kind = kind
        self.down, self.up = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        self.pinned: dict[tuple, np.ndarray] = {}  # (count, dtype, direction) -> page-locked buffer, reused

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        return None

    def _pinned(self, array: Any, direction: str) -> np.ndarray:
        key = (array.size, array.dtype, direction)
        if key not in self.pinned:
            self.pinned[key] = self.kind.empty_pinned(array.size, array.dtype)
            self.pinned[key][...] = 1  # touched, and not zeros
        return self.pinned[key]

    def copies(self, send: Any, recv: Any, op: str, root: int) -> None:
        send.get(stream=self.down, out=self._pinned(send, "down"), blocking=False)
        recv.set(self._pinned(recv, "up"), stream=self.up)
        self.down.synchronize()
        self.up.synchronize()

    allreduce = reduce = broadcast = reduce_scatter = allgather = copies

    def close(self) -> None:
        self.pinned.clear()


class PairFloorBackend(PcieFloorBackend):
    """Not a collective: the copies a call of issue 28's paired path makes, the floor that path is held
    against, beside pcie-floor's. The node's ranks pair up (local ranks 2i and 2i + 1, on one device or two
    with peer access); per call each rank copies its partner's half of send into the partner's inbox over
    the device link (CUDA IPC), its own half device to host and host to device (pcie-floor's copies), then
    its half of recv to the partner's inbox, which the partner copies into its recv: half the bytes a staged
    call moves across PCIe, and the pair's two exchanges. Nothing is added nor reduced, so nothing is
    checked."""

    name = "pair-floor"

    def __init__(self, comm: MPI.Comm, kind: ArrayKind) -> None:
        super().__init__(comm, kind)
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank, local_size = node.rank, node.size
        if local_size % 2:
            node.Free()
            raise Unavailable(f"pairs the ranks of a node: {local_size} here")
        import cupy

        self.cupy = cupy
        self.pair = node.Split(local_rank // 2, local_rank)
        node.Free()
        self.lower, self.partner = self.pair.rank == 0, 1 - self.pair.rank
        device = cupy.cuda.Device().id
        theirs = self.pair.sendrecv(device, dest=self.partner, source=self.partner)
        if theirs != device and not cupy.cuda.runtime.deviceCanAccessPeer(device, theirs):
            raise Unavailable(f"devices {device} and {theirs} of a pair have no peer access")
        self.link = cupy.cuda.Stream(non_blocking=True)
        self.inbox_bytes, self.inbox, self.partner_inbox = 0, None, 0

    def unsupported(self, coll: Collective, dtype: np.dtype, op: str, in_place: bool) -> Optional[str]:
        return None if coll.name == "allreduce" else "pairs are timed for allreduce"

    def _inboxes(self, nbytes: int) -> None:
        """An inbox of nbytes on our device and the partner's mapped here (both partners ask for the same)."""
        runtime = self.cupy.cuda.runtime
        if nbytes <= self.inbox_bytes:
            return
        if self.partner_inbox:
            runtime.ipcCloseMemHandle(self.partner_inbox)
        self.pair.Barrier()  # the partner no longer maps the inbox we free
        self.inbox = self.cupy.cuda.Memory(nbytes)
        handle = runtime.ipcGetMemHandle(self.inbox.ptr)
        theirs = self.pair.sendrecv(handle, dest=self.partner, source=self.partner)
        self.partner_inbox, self.inbox_bytes = runtime.ipcOpenMemHandle(theirs, 1), nbytes  # 1: lazy peer access

    def _push(self, dst: int, src: int, nbytes: int) -> None:
        """nbytes from src to dst, device to device on the link's stream, done on return."""
        self.cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, 3, self.link.ptr)  # 3: cudaMemcpyDeviceToDevice
        self.link.synchronize()

    def allreduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        half = send.size // 2
        mine, other = (slice(0, half), slice(half, None)) if self.lower else (slice(half, None), slice(0, half))
        self._inboxes((send.size - half) * send.itemsize)
        part = send[other]  # the reduce-scatter's push: the partner's half of send into its inbox
        self._push(self.partner_inbox, part.data.ptr, part.nbytes)
        self.pair.Barrier()
        back = recv[mine]
        self.copies(send[mine], back, op, root)  # our half across PCIe, both ways at once
        self._push(self.partner_inbox, back.data.ptr, back.nbytes)  # the all-gather: our half of recv to theirs
        self.pair.Barrier()
        part = recv[other]
        self._push(part.data.ptr, self.inbox.ptr, part.nbytes)

    def close(self) -> None:
        if self.partner_inbox:
            self.cupy.cuda.runtime.ipcCloseMemHandle(self.partner_inbox)
            self.partner_inbox = 0
        self.pair.Barrier()
        self.inbox = None
        self.pair.Free()
        super().close()


class WrongBackend(MpiBackend):
    """For the harness's own tests only (hidden from --help): MPI, then rank 0 corrupts one element."""

    name = "wrong"

    def _corrupt(self, recv: np.ndarray) -> None:
        if self.comm.rank == 0 and recv.size:
            recv[:1] += 1

    def allreduce(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        super().allreduce(send, recv, op, root)
        self._corrupt(recv)

    def reduce(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        super().reduce(send, recv, op, root)
        self._corrupt(recv)

    def broadcast(self, send: np.ndarray, recv: np.ndarray, op: str, root: int) -> None:
        super().broadcast(send, recv, op, root)
        self._corrupt(recv)


_BACKENDS = {b.name: b for b in (HfrBackend, MpiBackend, MpiStagedBackend, GlooBackend, NcclBackend, DeepSpeedBackend,
                                  PcieFloorBackend, PairFloorBackend, WrongBackend)}
BACKEND_NAMES = ("hfr", "mpi", "mpi-staged", "gloo", "nccl", "deepspeed")  # the default ones, in table order
FLOOR_NAMES = ("pcie-floor", "pair-floor")  # not collectives, timed where asked for: never checked, never the best peer


HFR_ALGO_NAMES = tuple(f"hfr:{algo}" for algo in ALGOS)  # hfr with one inter-node algorithm forced
HFR_PAIRS_NAMES = ("hfr:pairs-on", "hfr:pairs-off")  # hfr with its GPU pairs forced on (every size) or off


def make_backend(name: str, comm: MPI.Comm, kind: ArrayKind) -> Any:
    """The named backend, ready to run, or Unavailable(reason). Collective over comm."""
    if name in HFR_PAIRS_NAMES:
        return HfrBackend(comm, kind, pairs=name[len("hfr:pairs-"):])
    if name.startswith("hfr:"):
        return HfrBackend(comm, kind, algo=name[len("hfr:"):])
    return _BACKENDS[name](comm, kind)
