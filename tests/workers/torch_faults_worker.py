"""Faults and lifetimes of the torch backend "hfr", on every rank of the job it runs in; run by
tests/test_torch.py.

    torch_faults_worker.py mismatch DEVICE  a count mismatch through dist.all_reduce, work.wait(),
                        work.get_future().wait() and a DDP hook's future: every rank raises, then the next
                        call is right; wait(timeout) on a late peer's call; all_reduce and reduce of tensors
                        that require grad are right, as on gloo
    torch_faults_worker.py timeout      (2 ranks, HFR_TIMEOUT=3) rank 1 never calls on three groups: rank 0's
                        dist.all_reduce, work.wait() and future raise a timeout, then each group's next call
                        raises; every rank exits
    torch_faults_worker.py closed       (3 ranks, one node) the last rank destroys two groups while the others
                        call on them: dist.all_reduce, work.wait() and the future raise at once, naming it;
                        each group's next call raises; then a new group's call is right
    torch_faults_worker.py lifecycle    (3 ranks) 4 cycles of init, groups A = {0, 1} and B = {0, 2} where
                        rank 0's blocking call on B must not wait for its call on A (rank 1 joins A only after
                        it), the groups destroyed, then the whole; threads and /dev/shm mappings after
                        each cycle as before the first
    torch_faults_worker.py interrupt    (2 ranks, or more) rank 1 joins late: Ctrl-C (SIGALRM's handler raising
                        KeyboardInterrupt) ends rank 0's work.wait() of an async all_reduce while the call goes
                        on; waited for again, it gives the right sums (its future settled once, by whichever
                        thread came first), and the next calls are right
    torch_faults_worker.py torchrun     (1 rank, WORLD_SIZE=2 RANK=0 set as torchrun does) init refused at
                        once, naming MPI launchers

Prints "torch <mode> ok" on rank 0; any failure raises, and mpi4py's runner aborts the job.
"""
import gc
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import hfr
import hfr.torch
from checks import expect

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
COUNT = 1001


def values(count: int, of_rank: int, device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """of_rank's input: eighths in [-6, 6) (their sums are exact in float32, in any order)."""
    return torch.from_numpy(((np.arange(count) * (of_rank + 3)) % 97 - 48) / 8).float().to(device)


def reference(ranks: list[int], count: int = COUNT) -> torch.Tensor:
    """The sum over ranks, in float64, as float32."""
    return sum(values(count, r).double() for r in ranks).float()


def assert_right(x: torch.Tensor, ranks: list[int], what: str) -> None:
    want = reference(ranks)
    wrong = (x.cpu() != want).nonzero().flatten()
    assert not len(wrong), (f"{what}: {len(wrong)} elements wrong, first at {wrong[0].item()}: "
                            f"{x[wrong[0]]} != {want[wrong[0]]}")


class Bucket:
    """What a DDP hook reads of a dist.GradBucket (which Python cannot make)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def buffer(self) -> torch.Tensor:
        return self.tensor


def check_mismatch(device: torch.device) -> None:
    hfr.torch.init_process_group("hfr")
    everyone = list(range(size))
    mine = COUNT + 1 if rank == size - 1 else COUNT  # the last rank's count differs

    def blocking(x):
        dist.all_reduce(x)

    def waited(x):
        work = dist.all_reduce(x, async_op=True)
        try:
            work.wait()
        except hfr.MismatchError:
            assert work.is_completed() and not work.is_success() and isinstance(work.exception(), hfr.MismatchError)
            raise
        assert work.is_completed() and work.is_success() and work.exception() is None

    def future(x):
        dist.all_reduce(x, async_op=True).get_future().wait()

    def hook(x):
        hfr.torch.sum_allreduce_hook(None, Bucket(x)).wait()

    for how, call in [("dist.all_reduce", blocking), ("work.wait()", waited), ("get_future().wait()", future),
                      ("sum_allreduce_hook", hook)]:
        expect(hfr.MismatchError, "count", lambda: call(values(mine, rank, device)), f"{how} of a count mismatch")
        x = values(COUNT, rank, device)
        call(x)
        assert_right(x, everyone, f"{how} after a mismatch")

    # an op mismatch (torch's ops mapped to hfr's on every rank), blocking and through work.wait(), then a MAX
    op = dist.ReduceOp.MAX if rank == size - 1 else dist.ReduceOp.SUM
    expect(hfr.MismatchError, "op", lambda: dist.all_reduce(values(COUNT, rank, device), op=op),
           "dist.all_reduce of an op mismatch")
    expect(hfr.MismatchError, "op", lambda: dist.all_reduce(values(COUNT, rank, device), op=op, async_op=True).wait(),
           "work.wait() of an op mismatch")
    x = values(COUNT, rank, device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    want = torch.stack([values(COUNT, r) for r in everyone]).max(dim=0).values
    assert torch.equal(x.cpu(), want), "a MAX after an op mismatch"

    # wait(timeout) on a call the last rank joins late: a timeout, then the call completes
    x = values(COUNT, rank, device)
    if rank == size - 1:
        time.sleep(1)
    work = dist.all_reduce(x, async_op=True)
    if rank == 0:
        expect(hfr.HFRTimeoutError, "not finished", lambda: work.wait(timedelta(seconds=0.2)), "wait(timeout)")
    work.wait()
    assert_right(x, everyone, "a call waited for with a timeout")

    # Tensors that require grad: gloo reduces them (collectives are not autograd ops), and so does hfr.
    leaf = values(COUNT, rank, device).requires_grad_()
    version = leaf._version
    dist.all_reduce(leaf)
    assert_right(leaf.detach(), everyone, "all_reduce of a leaf that requires grad")
    assert leaf._version > version, "the written tensor's version counter was not bumped"
    for root in range(size):
        x = values(COUNT, rank, device).requires_grad_()
        dist.reduce(x, dst=root)
        if rank == root:
            assert_right(x.detach(), everyone, f"reduce to {root} of a tensor that requires grad")
    x = values(COUNT, rank, device)
    dist.all_reduce(x)
    assert_right(x, everyone, "all_reduce after those")
    dist.destroy_process_group()


def check_timeout() -> None:
    """Rank 1 never calls on the three groups; rank 0 waits on each a different way, at once."""
    hfr.torch.init_process_group("hfr")
    groups = [dist.new_group(backend="hfr") for _ in range(3)]
    if rank == 0:
        timeout = groups[0].hfr.timeout
        start = time.monotonic()
        waited = dist.all_reduce(values(COUNT, rank), group=groups[1], async_op=True)
        future = dist.all_reduce(values(COUNT, rank), group=groups[2], async_op=True).get_future()
        expect(hfr.HFRTimeoutError, "ranks [1]", lambda: dist.all_reduce(values(COUNT, rank), group=groups[0]),
               "dist.all_reduce with a peer absent")
        expect(hfr.HFRTimeoutError, "ranks [1]", waited.wait, "work.wait() with a peer absent")
        assert not waited.is_success()
        expect(hfr.HFRTimeoutError, "ranks [1]", future.wait, "get_future().wait() with a peer absent")
        took = time.monotonic() - start
        assert took < timeout + 5, f"the timeouts came after {took:.1f} s"
        for group in groups:  # broken: the next call raises, never hands the tensor back unreduced
            expect(hfr.HFRError, "", lambda: dist.all_reduce(values(COUNT, rank), group=group), "the next call")
    world.Barrier()
    dist.destroy_process_group()


def check_closed() -> None:
    """The last rank destroys two groups while the others call on them: dist.all_reduce, work.wait() and the
    future raise at once, naming it; the groups' next calls raise; a new group's call is right."""
    hfr.torch.init_process_group("hfr")
    groups = [dist.new_group(backend="hfr") for _ in range(2)]
    last = size - 1
    if rank == last:
        for group in groups:
            dist.destroy_process_group(group)
    else:
        timeout = groups[0].hfr.timeout
        gone = f"rank {last} of this node closed its communicator"
        blocking, waited = groups if rank % 2 == 0 else groups[::-1]
        start = time.monotonic()
        work = dist.all_reduce(values(COUNT, rank), group=waited, async_op=True)
        expect(hfr.HFRError, gone, lambda: dist.all_reduce(values(COUNT, rank), group=blocking),
               "dist.all_reduce beside a closed group")
        expect(hfr.HFRError, gone, work.wait, "work.wait() beside a closed group")
        assert not work.is_success()
        expect(hfr.HFRError, gone, work.get_future().wait, "get_future().wait() beside a closed group")
        took = time.monotonic() - start
        assert took < timeout / 2, f"the failures came after {took:.1f} s"
        for group in groups:  # broken: the next call raises, never hands the tensor back unreduced
            expect(hfr.HFRError, "", lambda: dist.all_reduce(values(COUNT, rank), group=group), "the next call")
    world.Barrier()
    fresh = dist.new_group(backend="hfr")
    x = values(COUNT, rank)
    dist.all_reduce(x, group=fresh)
    assert_right(x, list(range(size)), "a new group's call")
    dist.destroy_process_group()


def check_interrupt() -> None:
    """Ctrl-C in a wait for an unfinished call interrupts the wait, not the call (hfr/torch.py's _Call)."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    hfr.torch.init_process_group("hfr")
    everyone = list(range(size))
    previous = signal.signal(signal.SIGALRM, interrupt)
    for late in (1.0, 0.0, 1.0, 0.0):  # rank 1 late, then all at once: the call after the interrupted one
        x = values(COUNT, rank)
        if rank == 1:
            time.sleep(late)
        work = dist.all_reduce(x, async_op=True)
        if rank == 0 and late:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            expect(KeyboardInterrupt, "", work.wait, "work.wait() interrupted while rank 1 is late")
            assert not work.is_completed() or work.is_success()
        work.wait()
        assert_right(x, everyone, f"work.wait() waited for again (rank 1 {late} s late)")
        assert work.is_success() and work.exception() is None, work.exception()
        assert_right(work.get_future().wait()[0], everyone, "the future's value")
    signal.signal(signal.SIGALRM, previous)
    x = values(COUNT, rank)
    dist.all_reduce(x)
    assert_right(x, everyone, "a blocking all_reduce after those")
    dist.destroy_process_group()


def usage() -> dict:
    """This process's threads and its mappings of /dev/shm files."""
    files, mapped = set(), 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/dev/shm/"):
                begin, end = (int(a, 16) for a in fields[0].split("-"))
                files.add(fields[5])
                mapped += end - begin
    return {"threads": len(os.listdir("/proc/self/task")), "shm_files": len(files), "shm_mapped": mapped}


def check_lifecycle() -> None:
    assert size == 3, "lifecycle runs on 3 ranks"
    before, seen = usage(), []
    for cycle in range(4):
        hfr.torch.init_process_group("hfr")
        a, b = dist.new_group([0, 1], backend="hfr"), dist.new_group([0, 2], backend="hfr")
        if rank == 0:
            xa, xb = values(COUNT, 0), values(COUNT, 0)
            on_a = dist.all_reduce(xa, group=a, async_op=True)  # rank 1 comes only when told, after B's call
            start = time.monotonic()
            dist.all_reduce(xb, group=b)
            took = time.monotonic() - start
            assert took < 5, f"cycle {cycle}: a blocking call on B waited {took:.1f} s for a call on A"
            assert_right(xb, [0, 2], "B's call")
            world.send("join A", dest=1)
            on_a.wait()
            assert_right(xa, [0, 1], "A's call")
        elif rank == 1:
            world.recv(source=0)
            x = values(COUNT, 1)
            dist.all_reduce(x, group=a)
            assert_right(x, [0, 1], "A's call")
        else:
            x = values(COUNT, 2)
            dist.all_reduce(x, group=b)
            assert_right(x, [0, 2], "B's call")
        x = values(COUNT, rank)
        dist.all_reduce(x)
        assert_right(x, [0, 1, 2], "the whole group's call")
        for group in (a, b):
            dist.destroy_process_group(group)
        del a, b, group  # a destroyed group's object keeps its gloo threads until it is dropped
        dist.destroy_process_group()
        gc.collect()
        seen.append(usage())
    print(f"rank {rank} before: {before}, after each cycle: {seen}", flush=True)
    assert seen == [before] * len(seen), f"init/destroy cycles leak: before {before}, after each {seen}"


def check_torchrun() -> None:
    """The job is one MPI rank that torchrun's variables call rank 0 of 2."""
    assert size == 1 and os.environ["WORLD_SIZE"] == "2"
    start = time.monotonic()
    for how, init in [("hfr.torch.init_process_group", lambda: hfr.torch.init_process_group("hfr")),
                      ("the backend's creator", lambda: dist.init_process_group("hfr", store=dist.HashStore(), rank=0,
                                                                                   world_size=2))]:
        error = expect(hfr.HFRError, "needs an MPI launcher", init, how)
        assert "mpirun" in str(error) and "mpiexec -n 2 python" in str(error), error
    assert time.monotonic() - start < 5


def main() -> None:
    mode = sys.argv[1]
    if mode == "mismatch":
        device = torch.device(sys.argv[2])
        if device.type == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        check_mismatch(device)
    else:
        {"timeout": check_timeout, "closed": check_closed, "interrupt": check_interrupt, "lifecycle": check_lifecycle,
         "torchrun": check_torchrun}[mode]()
    world.Barrier()
    if rank == 0:
        print(f"torch {mode} ok")


main()
