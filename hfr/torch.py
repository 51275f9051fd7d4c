"""PyTorch: hfr as the torch.distributed backend "hfr" (registered on import), DDP communication hooks
that reduce gradient buckets with hfr, and torch.distributed set up on the ranks of an MPI communicator.
Needs torch (the `hfr[torch]` extra); `import hfr` does not import it.

    import hfr.torch
    hfr.torch.init_process_group("hfr")            # dist.all_reduce, DDP, FSDP2 then communicate through hfr
    model = torch.nn.parallel.DistributedDataParallel(model)

or, keeping gloo or NCCL as the process group:

    hfr.torch.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(None, hfr.torch.allreduce_hook)   # or an hfr.Communicator as the state

Tensors themselves need nothing from this module: hfr.allreduce(tensor) works on CPU and CUDA tensors.
"""
# No `from __future__ import annotations`: DDP compares the hooks' annotations with the real types.
import atexit
import os
import queue
import shlex
import sys
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import _wait, default_communicator
from .arrays import inspect
from .comm import Communicator
from .errors import HFRError, HFRTimeoutError
from .ops import Op
from .rendezvous import store_address
from .work import Work

__all__ = ["allreduce_hook", "sum_allreduce_hook", "init_process_group", "ProcessGroupHFR"]


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
    return _hook_completer(comm).call([comm.allreduce_async(buffer, op)], lambda: buffer, buffer.device).future


class _Call:
    """A call's hfr Works and the torch future that gets result() once they have finished, or their first
    failure. The future is settled once, by whichever thread comes first: the completer, or a thread that
    waits for the call (_Work.wait: one thread hand-off fewer for a blocking call). result() runs on that
    thread: CUDA work it queues is on that thread's current stream, which the future records."""

    def __init__(self, works: list[Work], result: Callable[[], Any], future: torch.futures.Future):
        self.works, self.result, self.future = works, result, future
        self._lock = threading.Lock()
        self._settled = False

    def finished(self) -> bool:
        return all(work.done() for work in self.works)

    def settle(self) -> None:
        """Wait for the works, then complete the future, unless another thread has."""
        error: Optional[BaseException] = None
        try:
            for work in self.works:
                work.wait()
        except BaseException as failure:
            if not self.finished():  # this wait interrupted (Ctrl-C): the call goes on, the completer settles it
                raise
            error = failure
        with self._lock:
            if self._settled:
                return
            self._settled = True
            if error is None:
                try:
                    value = self.result()
                except BaseException as failure:
                    error = failure
        if error is None:
            self.future.set_result(value)
        else:
            self.future.set_exception(error)


class _Completer:
    """A thread that completes the torch futures of one Communicator's calls, in the order the calls were
    made (the order a Communicator's Works finish in). One per Communicator, so that no call waits behind
    another communicator's; never hfr's progress thread: callbacks chained on a future run where it is
    completed, and one that waited for hfr there would stall every call."""

    def __init__(self) -> None:
        self._pending: queue.SimpleQueue[Optional[_Call]] = queue.SimpleQueue()  # None: stop
        self._thread = threading.Thread(target=self._complete, name="hfr-torch-futures", daemon=True)
        self._thread.start()

    def call(self, works: list[Work], result: Callable[[], Any], device: torch.device) -> _Call:
        """The _Call of works, whose future this thread settles unless a waiter does first."""
        call = _Call(works, result, torch.futures.Future(devices=[device] if device.type == "cuda" else None))
        self._pending.put(call)
        return call

    def stop(self) -> None:
        """End the thread once the futures already asked for are completed."""
        self._pending.put(None)

    def close(self) -> None:
        """stop(), and wait for that."""
        self.stop()
        self._thread.join()

    def _complete(self) -> None:
        while (call := self._pending.get()) is not None:
            call.settle()
            # hold no future (nor its CUDA events) while idle: one this thread dropped as it woke at exit
            # would be destroyed after CUDA's teardown
            del call


_hook_completers: weakref.WeakKeyDictionary[Communicator, _Completer] = weakref.WeakKeyDictionary()
_hook_completers_lock = threading.Lock()


def _hook_completer(comm: Communicator) -> _Completer:
    """The completer of the hooks' futures on comm, started on its first bucket; its thread ends once comm
    is gone."""
    with _hook_completers_lock:
        completer = _hook_completers.get(comm)
        if completer is None:
            completer = _hook_completers[comm] = _Completer()
            weakref.finalize(comm, completer.stop).atexit = False  # a daemon thread: left asleep at exit
        return completer


class _Work(dist.Work):
    """The backend's Work: done when its future is, which carries the call's result or failure.
    wait(), get_future().wait(), exception() and is_success() all report a failure (the Work that torch
    makes of a future, _create_work_from_future, reports a failed future as a success and hands its
    exception over as the result)."""

    def __init__(self, call: _Call):
        super().__init__()
        self._call, self._future = call, call.future

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the call has finished; re-raise its failure. With a timeout (0: none), raise
        hfr.HFRTimeoutError if it has not finished by then (the call goes on). For CUDA tensors the
        caller's current streams then wait for the result, as with a future's wait()."""
        if timeout and not _wait.until(self._call.finished, time.monotonic() + timeout.total_seconds()):
            raise HFRTimeoutError(f"the hfr collective has not finished after {timeout.total_seconds()} s")
        self._call.settle()
        self._future.wait()
        return True

    synchronize = wait

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def exception(self) -> Optional[BaseException]:
        """The call's failure, None while it has not failed."""
        if self._future.done():
            try:
                self._future.value()
            except BaseException as error:
                return error
        return None

    def is_success(self) -> bool:
        """False once the call has failed (True before it finishes, as torch's Works say)."""
        return self.exception() is None


# ------------------------------------------------------------------------------------- the backend
# torch's reduce ops that hfr does; the others (BAND, BOR, BXOR, PREMUL_SUM) go to the gloo group.
# torch's ops and hfr's, SUM first: a call's ReduceOp is compared with each in turn (== runs in C++; reading its
# op's value, as a key, costs twice the whole lookup)
_OPS = ((dist.ReduceOp.SUM, Op.SUM), (dist.ReduceOp.AVG, Op.AVG), (dist.ReduceOp.MAX, Op.MAX),
        (dist.ReduceOp.MIN, Op.MIN), (dist.ReduceOp.PRODUCT, Op.PROD))
# What hfr does not do goes to gloo, under torch's own method names (those this torch has).
_TO_GLOO = ("alltoall", "alltoall_base", "all_to_all_single", "send", "recv", "recv_anysource", "gather", "scatter",
            "allgather_coalesced", "monitored_barrier")
_world: MPI.Intracomm = MPI.COMM_WORLD  # the MPI ranks that are torch's global ranks (init_process_group's comm)


class ProcessGroupHFR(dist.ProcessGroup):
    """torch.distributed's backend "hfr": all_reduce (SUM, AVG, MAX, MIN, PRODUCT), broadcast, reduce,
    all_gather and reduce_scatter (list and flat forms, also coalesced) and barrier through an
    hfr.Communicator over the group's MPI ranks; everything else through a gloo group of the same ranks.

    Every call returns at once with a Work that completes once the data is in place (wait() blocks the host
    until then; get_future() gives the tensors, as gloo's Works do), but a blocking all_reduce of one tensor
    (dist.all_reduce without async_op), which runs before it returns, and returns no Work; a failed call
    (ranks that disagree, a peer that never comes) raises from wait(), from its future and from the blocking
    dist.* calls, on every rank. The group's calls complete independently of other groups'. Tensors must be
    contiguous, of a dtype hfr reduces, on the CPU or on one CUDA device: others raise TypeError/ValueError on
    the calling rank, before anything is modified. Tensors that require grad are reduced as gloo does
    (collectives are not autograd ops), their version counter bumped.

    destroy_process_group closes the group (shutdown()); one never destroyed is closed at exit."""

    def __init__(self, comm: MPI.Intracomm, store: dist.Store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        if comm.rank != rank or comm.size != size:
            raise ValueError(f"torch rank {rank} of {size} is MPI rank {comm.rank} of {comm.size}: set torch.distributed "
                             f"up with hfr.torch.init_process_group, whose ranks are MPI's")
        self.hfr = Communicator(comm)
        self._completer = _Completer()
        atexit.register(self.shutdown)
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("hfr-gloo", store), rank, size, timeout)
        self.gloo = dist.ProcessGroup(store, rank, size)
        self.gloo._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        # This group holds the gloo backend too: torch keeps a group's name in its backends (DeviceMesh,
        # FSDP2 need it), and torch's C++ ops (functional collectives, DTensor's redistribution) reach
        # a group's backend directly, not these methods: they run on gloo.
        for group in (self.gloo, self):
            for device in ("cpu", "cuda"):
                group._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, gloo)

    def getBackendName(self) -> str:
        return "hfr"

    def __repr__(self) -> str:
        return f"<ProcessGroupHFR rank {self.rank()}/{self.size()}>"

    def shutdown(self) -> None:
        """Finish the calls in flight, then free the group's hfr.Communicator, its thread and its gloo
        backend (collective over the group's ranks, as hfr.Communicator.close is). Harmless twice."""
        atexit.unregister(self.shutdown)
        self._completer.close()
        self.hfr.close()
        super().shutdown()

    # --- what hfr does ---------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Optional[dist.Work]:
        op = self._op(opts)
        if op is None:
            return self.gloo.allreduce(tensors, opts)
        # A blocking call of one tensor (torch waits for it at once) that hfr's front (hfr/_front.pyx) takes,
        # a CPU tensor or a CUDA one on the device the group has met, while no other call is unfinished,
        # runs here, on this thread, and returns no Work: torch takes None as a call the backend has
        # synchronised (since its options carry asyncOp), and the call's failure raises from here. The front
        # takes torch.Tensor itself (a subclass, such as a Parameter, is detached into one) and leaves one that
        # requires grad, while grad mode is on, to the path below, which detaches it.
        if len(tensors) == 1 and not getattr(opts, "asyncOp", True) and self.hfr._front is not None:
            t = tensors[0]
            if self.hfr._front.allreduce(t if type(t) is torch.Tensor else t.detach(), op, None) is not None:
                return None
        self._check(tensors)
        return self._work([self.hfr.allreduce_async(t.detach(), op) for t in tensors], lambda: tensors, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Optional[dist.Work]:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        root = self._root(opts)
        self._check(tensors)
        return self._work([self.hfr.broadcast_async(t.detach(), root) for t in tensors], lambda: tensors, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        op = self._op(opts)
        if op is None:
            return self.gloo.reduce(tensors, opts)
        root = self._root(opts)
        self._check(tensors)
        return self._work([self.hfr.reduce_async(t.detach(), root, op) for t in tensors], lambda: tensors, tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        self._check([output, input])
        return self._work([self.hfr.allgather_async(input.detach(), output.detach())], lambda: [output], [output])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        op = self._op(opts)
        if op is None:
            return self.gloo._reduce_scatter_base(output, input, opts)
        self._check([output, input])
        return self._work([self.hfr.reduce_scatter_async(input.detach(), output.detach(), op)], lambda: [output],
                          [output])

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        self._check([*outputs, *inputs])
        works = [self.hfr.allgather_async(i.detach(), o.detach()) for o, i in zip(outputs, inputs)]
        return self._work(works, lambda: outputs, outputs)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        op = self._op(opts)
        if op is None:
            raise ValueError(f"hfr's backend does not do coalesced reduce_scatter with {opts.reduceOp}")
        self._check([*outputs, *inputs])
        works = [self.hfr.reduce_scatter_async(i.detach(), o.detach(), op) for o, i in zip(outputs, inputs)]
        return self._work(works, lambda: outputs, outputs)

    # torch 2.11 names the flat and coalesced forms so (2.13 keeps them, deprecated)
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """Each input gathered through one flat buffer, copied out into its list once gathered."""
        self._check([t for ts in outputs for t in ts] + inputs)
        self._check_lists(outputs, inputs, "output")
        flats = [torch.empty((self.size(), *i.shape), dtype=i.dtype, device=i.device) for i in inputs]
        works = [self.hfr.allgather_async(i.detach(), f) for f, i in zip(flats, inputs)]

        def scatter_out() -> list[list[torch.Tensor]]:
            for ts, flat in zip(outputs, flats):
                for t, part in zip(ts, flat):
                    t.detach().copy_(part)
            return outputs

        return self._work(works, scatter_out, inputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        """Each list of inputs reduced through one flat buffer, made on the calling thread."""
        op = self._op(opts)
        if op is None:
            return self.gloo.reduce_scatter(outputs, inputs, opts)
        self._check(outputs + [t for ts in inputs for t in ts])
        self._check_lists(inputs, outputs, "input")
        flats = [torch.cat([t.detach().reshape(-1) for t in ts]) for ts in inputs]
        works = [self.hfr.reduce_scatter_async(f, o.detach(), op) for f, o in zip(flats, outputs)]
        return self._work(works, lambda: outputs, outputs)

    def barrier(self, opts: Any = None) -> dist.Work:
        token = torch.zeros(1, dtype=torch.int32)
        return self._work([self.hfr.allreduce_async(token)], lambda: [token], [token])

    # --- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _op(opts: Any) -> Optional[Op]:
        """hfr's op for the options' reduceOp (a ReduceOp; SUM without options), None for one it does not do."""
        if opts is None:
            return Op.SUM
        reduce_op = opts.reduceOp
        for theirs, ours in _OPS:
            if reduce_op == theirs:
                return ours
        return None

    def _root(self, opts: Any) -> int:
        return 0 if opts is None else opts.rootRank

    @staticmethod
    def _check(tensors: list[torch.Tensor]) -> None:
        """Every tensor of a call, checked before any of them goes to hfr (which checks each again)."""
        for t in tensors:
            inspect(t, "tensor", writable=False)

    def _check_lists(self, lists: list[list[torch.Tensor]], singles: list[torch.Tensor], name: str) -> None:
        for ts, single in zip(lists, singles):
            if len(ts) != self.size() or any(t.shape != single.shape or t.dtype != single.dtype for t in ts):
                raise ValueError(f"each {name} list must hold {self.size()} tensors of shape {tuple(single.shape)} and "
                                 f"dtype {single.dtype}, got {[(tuple(t.shape), t.dtype) for t in ts]}")

    def _work(self, works: list[Work], result: Callable[[], Any], tensors: list[torch.Tensor]) -> dist.Work:
        device = tensors[0].device if tensors else torch.device("cpu")
        return _Work(self._completer.call(works, result, device))


def _to_gloo(name: str) -> Callable:
    def method(self: ProcessGroupHFR, *args: Any, **kwargs: Any) -> dist.Work:
        return getattr(self.gloo, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{name} through the backend's gloo group (hfr does not do it)."
    return method


for _name in _TO_GLOO:
    if hasattr(dist.ProcessGroup, _name):
        setattr(ProcessGroupHFR, _name, _to_gloo(_name))


def _create(options: Any, _pg_options: Any) -> ProcessGroupHFR:
    """torch's backend creator (extended API): the group's MPI communicator is the ranks of _world
    that torch lists for it."""
    _refuse_torch_launcher()
    ranks = list(options.global_ranks_in_group)
    if ranks == list(range(_world.size)) or not ranks:
        comm = _world
    else:
        group = _world.Get_group().Incl(ranks)
        comm = _world.Create_group(group)
        group.Free()
    try:
        return ProcessGroupHFR(comm, options.store, options.group_rank, options.group_size, options.timeout)
    finally:
        if comm is not _world:
            comm.Free()  # the group's hfr.Communicator works on a Dup of it


dist.Backend.register_backend("hfr", _create, extended_api=True, devices=["cpu", "cuda"])


def _refuse_torch_launcher() -> None:
    """HFRError when torch's launcher (torchrun: WORLD_SIZE, RANK, LOCAL_RANK) started this process as one
    of several while MPI's world is this process alone: hfr's ranks are MPI's, and each such process
    would wait forever as rank 0 of 1."""
    torch_size = os.environ.get("WORLD_SIZE", "")
    torch_rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK"))
    if torch_size.isdigit() and int(torch_size) > 1 and torch_rank is not None and MPI.COMM_WORLD.Get_size() == 1:
        command = shlex.join(["mpiexec", "-n", torch_size, "python", *sys.argv])
        raise HFRError(f"torch's launcher (torchrun) made this process rank {torch_rank} of {torch_size} (WORLD_SIZE, "
                       f"RANK), but MPI's world holds this process alone: hfr's ranks are MPI's, so hfr needs an "
                       f"MPI launcher (mpirun, mpiexec, or srun with PMI) to start the job, e.g. `{command}`")


def init_process_group(backend: str = "gloo", comm: Optional[MPI.Intracomm] = None, **kwargs) -> None:
    """torch.distributed.init_process_group on the ranks of comm (default MPI.COMM_WORLD), torch rank =
    MPI rank, no MASTER_ADDR needed: the store is on rank 0 at an address every rank reaches
    (hfr.rendezvous, which also points gloo at that network). backend "hfr" is hfr's (ProcessGroupHFR);
    kwargs go to torch.distributed.init_process_group."""
    global _world
    _refuse_torch_launcher()
    comm = MPI.COMM_WORLD if comm is None else comm
    _world = comm
    host, port = store_address(comm)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=comm.rank, world_size=comm.size,
                            **kwargs)
