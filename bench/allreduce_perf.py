"""Benchmark hfr's allreduce (or reduce, broadcast, reduce_scatter, allgather) against MPI, gloo and
NCCL, as nccl-tests does.

    mpiexec -n 4 python -m mpi4py bench/allreduce_perf.py -b 8 -e 64M -f 4 -n 10 -w 3 --plot out.png

Flags as nccl-tests (-b -e -f -n -w -c -o -d -r), plus --collective, --array, --backends, --json,
--csv, --plot, --table; see --help. Exits 1 when any result is wrong. A rank that fails ends the
whole job (also when started without -m mpi4py), so the others never wait for it.
"""
import sys
import time
import traceback

from mpi4py import MPI
import _tree  # noqa: F401  (this checkout's hfr first: A/B runs of two trees)
from perf.harness import main

if __name__ == "__main__":
    try:
        code = main()
    except SystemExit:  # argument errors: every rank parses the same arguments and exits alike
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        # Abort ends the whole job at once, and MPICH's mpiexec then drops output it has not yet forwarded: the
        # traceback would be lost about one run in three (tests/test_bench.py). Give it a moment first.
        time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)
        code = 1  # where Abort returns before the job is ended
    sys.exit(code)
