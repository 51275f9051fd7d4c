"""Where the time of a DDP step goes with hfr's hook, against the same bytes reduced alone.

    mpirun -n 4 python -m mpi4py bench/ddp_trace.py --device cuda --hidden 4095

Trains examples/ddp_train.py's MLP with a hook that wraps hfr.torch.allreduce_hook and stamps, per
bucket, when DDP called it, when the call returned and when its future completed, all relative to the
step's start; then when backward returned and when the step ended (optimizer and a device sync). It also
times, per step, the calls hfr's engine ran (in C, with the GIL released: the hook's calls; the blocking
calls the front runs itself are not counted). Variants of the hook:
  hfr           hfr.torch.allreduce_hook as it is
  hfr-synced    the same after the caller's stream is synchronised (no copy waits for the backward pass)
  hfr-blocking  a blocking hfr.allreduce inside the hook, which returns a completed future
Rank 0 prints the medians over the timed steps, then the time of hfr allreducing each bucket's bytes
alone (blocking, and through the hook's future).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel

import hfr
import hfr.torch
from hfr import engine

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from ddp_train import no_communication_hook  # noqa: E402
from models import make_batch, make_model  # noqa: E402


# Seconds hfr's engine spent, by what on: summed over calls, read per step.
spent: collections.defaultdict = collections.defaultdict(float)


def time_into(key: str, function):
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0

    return timed


def instrument_engine() -> None:
    """Wrap the engine's steps so that `spent` adds up their time (before any Communicator is made)."""
    engine.Engine._run = time_into("call", engine.Engine._run)


def synced_hook(state, bucket):
    torch.cuda.current_stream(bucket.buffer().device).synchronize()
    return hfr.torch.allreduce_hook(state, bucket)


def blocking_hook(state, bucket):
    future = torch.futures.Future()
    future.set_result(hfr.allreduce(bucket.buffer(), op=hfr.Op.AVG))
    return future


HOOKS = {"none": no_communication_hook, "hfr": hfr.torch.allreduce_hook, "hfr-synced": synced_hook,
         "hfr-blocking": blocking_hook}


def traced_steps(hook, steps: int, device: torch.device, hidden: int, batch: int):
    """Per step: (the bucket stamps [(bytes, called, returned, completed)], backward end, step end,
    the engine's seconds by key), times in seconds."""
    model = make_model("mlp", torch.float32, device, hidden=hidden)
    ddp = DistributedDataParallel(model)
    stamps: list = []
    clock = {"start": 0.0}

    def traced(state, bucket):  # unannotated: DDP checks real annotations, and this module has string ones
        record = [bucket.buffer().nbytes, time.perf_counter() - clock["start"]]
        future = hook(state, bucket)
        record.append(time.perf_counter() - clock["start"])
        stamps.append(record)

        def completed(f):
            record.append(time.perf_counter() - clock["start"])
            return f.value()

        return future.then(completed)

    ddp.register_comm_hook(None, traced)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    steps_out = []
    for step in range(steps):
        x, y = make_batch(model, step, dist.get_rank(), batch, torch.float32, device)
        stamps.clear()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        MPI.COMM_WORLD.Barrier()
        spent.clear()
        clock["start"] = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x).float(), y)
        loss.backward()
        backward_end = time.perf_counter() - clock["start"]
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_end = time.perf_counter() - clock["start"]
        steps_out.append(([tuple(r) for r in stamps], backward_end, step_end, dict(spent)))
    return steps_out


def median_ms(values) -> str:
    return f"{1e3 * statistics.median(values):7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--hidden", type=int, default=4095)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--variants", nargs="+", choices=list(HOOKS), default=list(HOOKS))
    args = parser.parse_args()
    instrument_engine()
    world = MPI.COMM_WORLD
    device = torch.device("cpu")
    if args.device == "cuda":
        local = world.Split_type(MPI.COMM_TYPE_SHARED)
        device = torch.device("cuda", local.rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    hfr.torch.init_process_group("gloo")
    report = []
    for name in args.variants:
        timed = traced_steps(HOOKS[name], args.steps, device, args.hidden, args.batch)[args.warmup:]
        report.append(f"{name}: step {median_ms([t[2] for t in timed])} ms, backward returned at "
                      f"{median_ms([t[1] for t in timed])} ms (medians over {len(timed)} steps)")
        if timed[0][3]:
            report.append("  hfr's engine, per step: " + ", ".join(
                f"{key} {median_ms([t[3].get(key, 0.0) for t in timed]).strip()}" for key in sorted(timed[0][3])) + " ms")
        for b in range(len(timed[0][0])):
            buckets = [t[0][b] for t in timed]
            report.append(f"  bucket {b}: {buckets[0][0] / 2**20:8.3f} MiB  hook called {median_ms([r[1] for r in buckets])}"
                          f"  returned {median_ms([r[2] for r in buckets])}  future done {median_ms([r[3] for r in buckets])} ms")
        sizes = [r[0] for r in timed[0][0]]
    # The same bytes alone, a bucket at a time: blocking, and through the hook's future.
    for nbytes in sizes:
        t = torch.randn(nbytes // 4, device=device)
        for label, reduce in (("allreduce", lambda: hfr.allreduce(t)),
                              ("future", lambda: hfr.torch._reduce_bucket(None, _Bucket(t), hfr.Op.AVG).wait())):
            seconds = []
            for _ in range(8):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                world.Barrier()
                t0 = time.perf_counter()
                reduce()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds.append(time.perf_counter() - t0)
            report.append(f"alone, {nbytes / 2**20:8.3f} MiB, {label}: {median_ms(seconds[2:])} ms")
    if world.rank == 0:
        print(f"# ddp_trace: {world.size} ranks, device {device}, hidden {args.hidden}, batch {args.batch}")
        print("\n".join(report))
    dist.destroy_process_group()


class _Bucket:
    """What the hook reads of a GradBucket."""

    def __init__(self, buffer: torch.Tensor):
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer


if __name__ == "__main__":
    main()
