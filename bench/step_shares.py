"""What communication costs in a training step: examples/ddp_train.py and examples/fsdp_train.py on the
transformer, each with every --comm, and each communication's share of the step (its mean step time
minus that of `none`, which trains the same model without communicating).

    python bench/step_shares.py --np 4 --device cuda --mpiexec "mpirun --oversubscribe --bind-to none"
    python bench/step_shares.py --np 2 --device cpu --steps 4 --warmup 1 --examples fsdp   # on a CPU
    python bench/step_shares.py --np 4 --examples ddp --comms none,hfr-hook --pairs off,on  # GPU pairs (issue 28)

Prints one row a run (example, dtype, comm, mean step, share) and the ratios issues 12 and 14 set
targets on: hfr's share with bf16 parameters over its share with fp32 ones, DDP through the backend
over DDP with hfr's hook, and FSDP's step on gloo over its step on hfr.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.mpirun import mpiexec  # noqa: E402
RUNS = {"ddp": ["none", "hfr", "hfr-hook", "gloo"], "fsdp": ["none", "hfr", "gloo"]}
STEP = re.compile(r"mean step ([0-9.]+) ms")


def mean_step_ms(args: argparse.Namespace, example: str, comm: str, dtype: str, pairs: str) -> float | None:
    """The example's mean step time on args.np ranks (with HFR_PAIRS=pairs, where not ""), or None when it
    fails or cannot run here (said)."""
    script = REPO / "examples" / f"{example}_train.py"
    launcher = shlex.split(args.mpiexec) if args.mpiexec else mpiexec()
    command = [*launcher, "-n", str(args.np), sys.executable, "-m", "mpi4py", str(script),
               "--comm", comm, "--device", args.device, "--dtype", dtype, "--steps", str(args.steps),
               "--warmup", str(args.warmup)]
    if example == "ddp":
        command += ["--model", "transformer"]
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               **({"HFR_PAIRS": pairs} if pairs else {}))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank
        proc.communicate()
        print(f"# {example} {dtype} {comm}: over {args.timeout} s", flush=True)
        return None
    found = STEP.search(out)
    if proc.returncode != 0 or found is None:
        tail = [line for line in out.strip().splitlines() if "Warning" not in line][-3:]
        print(f"# {example} {dtype} {comm}: exit {proc.returncode}: {' | '.join(tail)}", flush=True)
        return None
    return float(found.group(1))


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--dtypes", default="fp32,bf16", help="parameter dtypes (default fp32,bf16)")
    parser.add_argument("--examples", default="ddp,fsdp", help="ddp, fsdp or both (default)")
    parser.add_argument("--comms", help="the comms to run, of those an example has (default: all; none is the base)")
    parser.add_argument("--pairs", default="", help="run each hfr comm once per HFR_PAIRS value listed, as comm/value "
                                                    "(default: once, as the environment says)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--mpiexec", help="the launcher and its options (default: tests/mpirun.py's, the venv's MPICH)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds a run (default 240)")
    args = parser.parse_args()
    wanted = ["none", *args.comms.split(",")] if args.comms else None
    unknown = set(wanted or ()) - {c for example in args.examples.split(",") for c in RUNS[example]}
    if unknown:
        parser.error(f"--comms {args.comms}: no example has {sorted(unknown)}")

    print(f"# step_shares: {args.np} ranks, device {args.device}, {args.steps} steps ({args.warmup} warm-up)")
    print(f"{'example':>7} {'dtype':>5} {'comm':>12} {'step ms':>9} {'share ms':>9} {'share/step':>10}")
    steps: dict[tuple[str, str, str], float | None] = {}
    for example in args.examples.split(","):
        for dtype in args.dtypes.split(","):
            for comm in [c for c in RUNS[example] if wanted is None or c in wanted]:
                for pairs in args.pairs.split(",") if comm.startswith("hfr") else [""]:
                    name = f"{comm}/{pairs}" if pairs else comm
                    step = steps[example, dtype, name] = mean_step_ms(args, example, comm, dtype, pairs)
                    alone = steps[example, dtype, "none"]
                    share = step - alone if step is not None and alone is not None and comm != "none" else None
                    print(f"{example:>7} {dtype:>5} {name:>12} {f'{step:.1f}' if step is not None else '-':>9} "
                          f"{f'{share:.1f}' if share is not None else '-':>9} {ratio(share, step):>10}", flush=True)

    def share(example: str, dtype: str, comm: str) -> float | None:
        step, alone = steps.get((example, dtype, comm)), steps.get((example, dtype, "none"))
        return step - alone if step is not None and alone is not None else None

    print(f"# ddp: hfr's share bf16 / fp32 {ratio(share('ddp', 'bf16', 'hfr'), share('ddp', 'fp32', 'hfr'))} "
          f"(issue 12: <= 0.6); hook's {ratio(share('ddp', 'bf16', 'hfr-hook'), share('ddp', 'fp32', 'hfr-hook'))}")
    for dtype in args.dtypes.split(","):
        print(f"# {dtype}: ddp step on the backend / with the hook "
              f"{ratio(steps.get(('ddp', dtype, 'hfr')), steps.get(('ddp', dtype, 'hfr-hook')))} (issue 14: <= 1.05); "
              f"fsdp step gloo / hfr {ratio(steps.get(('fsdp', dtype, 'gloo')), steps.get(('fsdp', dtype, 'hfr')))} "
              f"(issue 14: >= 1.5)")

    if args.pairs:
        first, *others = args.pairs.split(",")
        for example, dtype, name in steps:
            comm, _, pairs = name.partition("/")
            if pairs in others:
                print(f"# {example} {dtype} {comm}: share with HFR_PAIRS={pairs} / {first} "
                      f"{ratio(share(example, dtype, name), share(example, dtype, f'{comm}/{first}'))}")


if __name__ == "__main__":
    main()
