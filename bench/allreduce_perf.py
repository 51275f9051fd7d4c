"""Benchmark hfr's allreduce (or reduce, broadcast) against MPI, gloo and NCCL, as nccl-tests does.

    mpiexec -n 4 python -m mpi4py bench/allreduce_perf.py -b 8 -e 64M -f 4 -n 10 -w 3 --plot out.png

Flags as nccl-tests (-b -e -f -n -w -c -o -d -r), plus --collective, --array, --backends, --json,
--csv, --plot, --table; see --help. Exits 1 when any result is wrong.
"""
import sys

from perf.harness import main

if __name__ == "__main__":
    sys.exit(main())
