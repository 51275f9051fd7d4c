"""Data-parallel training with DistributedDataParallel, its gradients reduced by hfr or by
torch.distributed, on generated data with fixed seeds (examples/models.py). Prints the loss per step
and the mean step time.

    mpirun -n 2 python -m mpi4py examples/ddp_train.py --comm hfr --steps 20 --device cpu
    mpirun -n 4 python -m mpi4py examples/ddp_train.py --model transformer --dtype bf16 --comm hfr --device cuda

--comm hfr makes hfr the process group (the torch.distributed backend "hfr"): DDP reduces through it
with no hook. hfr-hook registers hfr.torch.allreduce_hook on a gloo process group (which DDP still uses
to broadcast the initial parameters); gloo and nccl use DDP's own allreduce on that process group; none
registers a hook that communicates nothing (each rank keeps its own gradients: the compute-only baseline
for step times). On CUDA, ranks share the GPUs round-robin (all on cuda:0 with one GPU); nccl needs a
GPU per rank of the host.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel

import hfr.torch
from models import make_model, run_steps

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BACKENDS = {"hfr": "hfr", "hfr-hook": "gloo", "gloo": "gloo", "nccl": "nccl", "none": "gloo"}


@dataclass
class Trained:
    model: torch.nn.Module  # the DDP module's inner model
    losses: list[float]  # this rank's loss before each step
    step_seconds: list[float]


def no_communication_hook(state, bucket):  # unannotated: DDP checks real annotations, these are strings
    """A DDP hook that leaves the bucket as it is: step time without communication."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def train(comm: str, steps: int, device: torch.device, *, model: str = "mlp", batch: int = 64,
          dtype: torch.dtype = torch.float32, bucket_cap_mb: float = 25.0, gradient_as_bucket_view: bool = False,
          group: Optional[dist.ProcessGroup] = None, **sizes: int) -> Trained:
    """Train on this rank's share of the data; torch.distributed must be initialised already (with
    the process group BACKENDS[comm], or DDP runs on group)."""
    net = make_model(model, dtype, device, **sizes)
    ddp = DistributedDataParallel(net, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view,
                                  process_group=group)
    if comm == "hfr-hook":
        ddp.register_comm_hook(None, hfr.torch.allreduce_hook)
    elif comm == "none":
        ddp.register_comm_hook(None, no_communication_hook)
    done = run_steps(ddp, net, steps, dist.get_rank(), batch, dtype, device)
    return Trained(net, done.losses, done.step_seconds)


def setup(comm: str, device_kind: str, parser: argparse.ArgumentParser) -> Optional[torch.device]:
    """This rank's device (GPUs shared round-robin), with torch.distributed set up for comm; None when
    this host cannot run it (said on rank 0)."""
    if comm == "nccl" and device_kind != "cuda":
        parser.error("--comm nccl needs --device cuda")
    world = MPI.COMM_WORLD
    local_size = world.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    device = torch.device("cpu")
    if device_kind == "cuda":
        gpus = torch.cuda.device_count()
        if gpus == 0 or (comm == "nccl" and gpus < local_size):
            if world.rank == 0:
                print(f"--comm {comm} --device cuda needs {'a GPU per rank' if gpus else 'a GPU'}: "
                      f"{local_size} ranks on this host, {gpus} GPUs; nothing to do")
            return None
        device = torch.device("cuda", world.rank % local_size % gpus)
        torch.cuda.set_device(device)
    hfr.torch.init_process_group(BACKENDS[comm])
    return device


def report(what: str, model: torch.nn.Module, losses: list[float], step_seconds: list[float], warmup: int) -> None:
    """Rank 0 prints the losses and one line `comm ... mean step X ms` (bench/step_shares.py reads it)."""
    if dist.get_rank() != 0:
        return
    for step, loss in enumerate(losses):
        print(f"step {step:4d}  loss {loss:.5f}")
    timed = step_seconds[warmup:] or step_seconds  # all of them when there are no more than the warm-up's
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{what}  ranks {dist.get_world_size()}  parameters {parameters}  "
          f"mean step {1e3 * statistics.mean(timed):.3f} ms, median {1e3 * statistics.median(timed):.3f} ms "
          f"over {len(timed)} steps after {len(step_seconds) - len(timed)} warm-up steps", flush=True)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help: the module's docstring as written, and each option's default."""


def arguments(description: str, comms: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    parser.add_argument("--comm", choices=comms, default="hfr", help="what reduces the gradients")
    parser.add_argument("--steps", type=int, default=20, help="training steps, the warm-up's included")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="the model's compute type")
    parser.add_argument("--batch", type=int, default=0,
                        help="samples per rank and step; 0: the model's own, 64 for the mlp, 8 for the transformer")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the mean step time")
    return parser


def main() -> None:
    parser = arguments(__doc__, list(BACKENDS))
    parser.add_argument("--model", choices=["mlp", "transformer"], default="mlp", help="what is trained")
    parser.add_argument("--hidden", type=int, default=255, help="the mlp's first hidden layer")
    args = parser.parse_args()
    device = setup(args.comm, args.device, parser)
    if device is None:
        return
    sizes = {"hidden": args.hidden} if args.model == "mlp" else {}
    batch = args.batch or (64 if args.model == "mlp" else 8)
    result = train(args.comm, args.steps, device, model=args.model, batch=batch, dtype=DTYPES[args.dtype], **sizes)
    report(f"ddp comm {args.comm}  model {args.model}  device {device}  dtype {args.dtype}", result.model,
           result.losses, result.step_seconds, args.warmup)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
