"""PyTorch: DDP communication hooks that reduce gradient buckets with hfr, and torch.distributed set up
on the ranks of an MPI communicator. Needs torch (the `hfr[torch]` extra); `import hfr` does not import it.

    import hfr.torch
    hfr.torch.init_process_group("gloo")           # DDP still needs a process group for its own setup
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(None, hfr.torch.allreduce_hook)   # or an hfr.Communicator as the state

Tensors themselves need nothing from this module: hfr.allreduce(tensor) works on CPU and CUDA tensors.
"""
# No `from __future__ import annotations`: DDP compares the hooks' annotations with the real types.
import queue
import threading
from typing import Optional

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import default_communicator
from .comm import Communicator
from .ops import Op
from .rendezvous import store_address
from .work import Work

__all__ = ["allreduce_hook", "sum_allreduce_hook", "init_process_group"]


def allreduce_hook(state: Optional[Communicator], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over all ranks with hfr: DDP's default behaviour, like torch's
    `ddp_comm_hooks.default_hooks.allreduce_hook`, which it replaces.

    state: the hfr.Communicator to reduce over, or None for hfr's default one on MPI.COMM_WORLD; it must
    hold the same ranks as DDP's process group. The average is summed in float32 for float16 and
    bfloat16 buckets and rounded once."""
    return _reduce_bucket(state, bucket, Op.AVG)


def sum_allreduce_hook(state: Optional[Communicator], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sum the bucket over all ranks with hfr, without dividing by their number (for a loss that is
    already scaled by 1 / world size). state: as for allreduce_hook."""
    return _reduce_bucket(state, bucket, Op.SUM)


def _reduce_bucket(state: Optional[Communicator], bucket: dist.GradBucket, op: Op) -> torch.futures.Future[torch.Tensor]:
    if state is not None and not isinstance(state, Communicator):
        raise TypeError(f"the hook's state must be an hfr.Communicator or None, got {type(state).__name__}")
    comm = default_communicator() if state is None else state
    buffer = bucket.buffer()
    future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
    _pending.put((comm.allreduce_async(buffer, op), future))
    return future


# The hooks' futures are completed by one thread of this module, in the order the hooks ran (the Works
# of one Communicator finish in that order), never by hfr's progress thread: callbacks chained on a
# future run where it is completed, and one that waited for hfr there would stall every call.
_pending: queue.SimpleQueue[tuple[Work, torch.futures.Future]] = queue.SimpleQueue()


def _complete_futures() -> None:
    while True:
        work, future = _pending.get()
        try:
            result = work.wait()
        except BaseException as error:
            future.set_exception(error)
        else:
            future.set_result(result)


threading.Thread(target=_complete_futures, name="hfr-torch-futures", daemon=True).start()


def init_process_group(backend: str = "gloo", comm: Optional[MPI.Intracomm] = None, **kwargs) -> None:
    """torch.distributed.init_process_group on the ranks of comm (default MPI.COMM_WORLD), torch rank =
    MPI rank, no MASTER_ADDR needed: the store is on rank 0 at an address every rank reaches
    (hfr.rendezvous, which also points gloo at that network). kwargs go to
    torch.distributed.init_process_group."""
    comm = MPI.COMM_WORLD if comm is None else comm
    host, port = store_address(comm)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=comm.rank, world_size=comm.size,
                            **kwargs)
