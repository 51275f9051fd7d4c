"""Data-parallel training of a small MLP with DistributedDataParallel, its gradients reduced by hfr or by
torch.distributed, on generated data with fixed seeds. Prints the loss per step and the mean step time.

    mpirun -n 2 python -m mpi4py examples/ddp_train.py --comm hfr --steps 20 --device cpu
    mpirun -n 2 python -m mpi4py examples/ddp_train.py --comm gloo --steps 20 --device cuda

--comm hfr registers hfr.torch.allreduce_hook on a gloo process group (which DDP still uses to
broadcast the initial parameters); gloo and nccl use DDP's own allreduce; none registers a hook that
communicates nothing (each rank keeps its own gradients: the compute-only baseline for step times). On CUDA, ranks share the
GPUs round-robin (all on cuda:0 with one GPU); nccl needs a GPU per rank of the host.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel

import hfr.torch

INPUTS, CLASSES = 37, 10  # odd sizes: no bucket is a multiple of anything


@dataclass
class Trained:
    model: torch.nn.Module  # the DDP module's inner model
    losses: list[float]  # this rank's loss before each step
    step_seconds: list[float]


def make_model(hidden: int, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(1234)  # the same initial parameters on every rank (DDP broadcasts rank 0's anyway)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, hidden), torch.nn.GELU(),
        torch.nn.Linear(hidden, hidden // 2), torch.nn.GELU(),
        torch.nn.Linear(hidden // 2, CLASSES),
    ).to(device=device, dtype=dtype)


def make_batch(step: int, rank: int, batch: int, dtype: torch.dtype, device: torch.device):
    """Rank `rank`'s batch of step `step`: Gaussian inputs, labelled by a fixed random linear teacher."""
    teacher = torch.randn(INPUTS, CLASSES, generator=torch.Generator().manual_seed(99))
    x = torch.randn(batch, INPUTS, generator=torch.Generator().manual_seed(step * 100_003 + rank))
    y = (x @ teacher).argmax(dim=1)
    return x.to(device=device, dtype=dtype), y.to(device)


def no_communication_hook(state, bucket):  # unannotated: DDP checks real annotations, these are strings
    """A DDP hook that leaves the bucket as it is: step time without communication."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def train(comm: str, steps: int, device: torch.device, *, hidden: int = 255, batch: int = 64,
          dtype: torch.dtype = torch.float32, bucket_cap_mb: float = 25.0,
          gradient_as_bucket_view: bool = False) -> Trained:
    """Train on this rank's share of the data; torch.distributed must be initialised already."""
    model = make_model(hidden, dtype, device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb,
                                  gradient_as_bucket_view=gradient_as_bucket_view)
    if comm == "hfr":
        ddp.register_comm_hook(None, hfr.torch.allreduce_hook)
    elif comm == "none":
        ddp.register_comm_hook(None, no_communication_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses, step_seconds = [], []
    for step in range(steps):
        x, y = make_batch(step, dist.get_rank(), batch, dtype, device)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x).float(), y)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    return Trained(model, losses, step_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comm", choices=["hfr", "gloo", "nccl", "none"], default="hfr")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--hidden", type=int, default=255, help="width of the first hidden layer")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the mean step time")
    args = parser.parse_args()
    if args.comm == "nccl" and args.device != "cuda":
        parser.error("--comm nccl needs --device cuda")

    world = MPI.COMM_WORLD
    local_size = world.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    device = torch.device("cpu")
    if args.device == "cuda":
        gpus = torch.cuda.device_count()
        if gpus == 0 or (args.comm == "nccl" and gpus < local_size):
            if world.rank == 0:
                print(f"--comm {args.comm} --device cuda needs {'a GPU per rank' if gpus else 'a GPU'}: "
                      f"{local_size} ranks on this host, {gpus} GPUs; nothing to do")
            return
        device = torch.device("cuda", world.rank % local_size % gpus)
        torch.cuda.set_device(device)
    hfr.torch.init_process_group("nccl" if args.comm == "nccl" else "gloo")
    result = train(args.comm, args.steps, device, hidden=args.hidden, batch=args.batch,
                   dtype=getattr(torch, args.dtype))
    if world.rank == 0:
        for step, loss in enumerate(result.losses):
            print(f"step {step:4d}  loss {loss:.5f}")
        timed = result.step_seconds[args.warmup:] or result.step_seconds
        parameters = sum(p.numel() for p in result.model.parameters())
        print(f"comm {args.comm}  device {device}  ranks {world.size}  parameters {parameters}  dtype {args.dtype}  "
              f"mean step {1e3 * statistics.mean(timed):.3f} ms, median {1e3 * statistics.median(timed):.3f} ms "
              f"over {len(timed)} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
