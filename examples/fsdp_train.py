"""The transformer of examples/models.py trained under FSDP2 (torch.distributed.fsdp.fully_shard): each
encoder layer and the whole model sharded over the ranks, parameters all-gathered before forward and
backward, gradients reduce-scattered. Prints the loss per step and the mean step time.

    mpirun -n 4 python -m mpi4py examples/fsdp_train.py --comm hfr --device cuda --dtype bf16

--comm hfr makes hfr the process group (the torch.distributed backend "hfr"), gloo and nccl torch's own;
none trains the whole model on every rank without FSDP and without communication (each rank on its own
data: the compute-only baseline for step times).
"""
from __future__ import annotations

import sys
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ddp_train import DTYPES, arguments, report, setup
from models import make_model, run_steps


def train(comm: str, steps: int, device: torch.device, *, batch: int = 8, dtype: torch.dtype = torch.float32,
          mesh: Optional[DeviceMesh] = None, **sizes: int) -> tuple[torch.nn.Module, list[float], list[float]]:
    """(model, losses, step seconds); torch.distributed must be initialised already (FSDP shards over
    mesh, default: every rank of the default group). Parameters are kept in float32 and computed in
    dtype (FSDP2's mixed precision), gradients reduced in float32."""
    model = make_model("transformer", torch.float32, device, **sizes)
    if comm != "none":
        # on device's type: FSDP2's own default is CUDA wherever there is a GPU, even for a CPU model
        mesh = mesh or init_device_mesh(device.type, (dist.get_world_size(),))
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    elif dtype != torch.float32:
        model = model.to(dtype)
    done = run_steps(model, model, steps, dist.get_rank(), batch, dtype, device)
    return model, done.losses, done.step_seconds


def main() -> None:
    parser = arguments(__doc__, ["hfr", "gloo", "nccl", "none"])
    args = parser.parse_args()
    device = setup(args.comm, args.device, parser)
    if device is None:
        return
    model, losses, step_seconds = train(args.comm, args.steps, device, batch=args.batch or 8, dtype=DTYPES[args.dtype])
    report(f"fsdp comm {args.comm}  model transformer  device {device}  dtype {args.dtype}", model, losses,
           step_seconds, args.warmup)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
