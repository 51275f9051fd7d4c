#!/usr/bin/env bash
# This tree's allreduce against another tree's (an earlier commit), side by side in one session: the other
# tree unpacked and built in a folder of its own, then bench/allreduce_perf.py of each by turns, ROUNDS
# rounds, on N ranks. For the GPU machine, which has no git: pack the other tree here and carry bench/out,
#   git archive REV hfr bench setup.py pyproject.toml README.md | gzip > bench/out/base.tgz
#   bench/ab_trees.sh bench/out/base.tgz 4 -b 2976K -e 186M -f 4 -n 5 -w 2 --array cupy --backends hfr,pcie-floor
# Prints each run's rows (hfr's and its peers'), headed by tree and round.
#   env: PYTHON (default python3), MPIRUN (default: mpirun --oversubscribe --bind-to none, or MPICH's
#   mpiexec from .venv where that exists), ROUNDS (default 2)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
[ $# -ge 2 ] || { echo "usage: $0 OTHER_TREE.tgz N [allreduce_perf.py args...]" >&2; exit 2; }
packed=$(realpath "$1") n=$2
shift 2
default_mpirun="mpirun --oversubscribe --bind-to none"
[ -x "$ROOT/.venv/bin/mpiexec" ] && default_mpirun="$ROOT/.venv/bin/mpiexec"
MPIRUN="${MPIRUN:-$default_mpirun}"
pass_path=""  # Open MPI passes the environment only where told; MPICH's hydra passes it all
$MPIRUN --version 2>&1 | grep -q "Open MPI" && pass_path="-x PYTHONPATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
other=$(mktemp -d /tmp/hfr-other.XXXX)
tar xzf "$packed" -C "$other"
echo "# building the other tree in $other"
(cd "$other" && "$PYTHON" setup.py build_ext --inplace -q -j "$(nproc)" >build.log 2>&1) || { tail -20 "$other/build.log"; exit 1; }
(cd "$ROOT" && "$PYTHON" setup.py build_ext --inplace -q -j "$(nproc)" >/dev/null 2>&1) || { echo "this tree does not build" >&2; exit 1; }
for round in $(seq "${ROUNDS:-2}"); do
    for tree in this other; do
        dir=$ROOT
        [ $tree = other ] && dir=$other
        echo "== $tree tree, round $round"
        # from the tree's own folder, first on the path: python -m puts the working folder first
        (cd "$dir" && PYTHONPATH=$dir timeout 300 $MPIRUN -n "$n" $pass_path "$PYTHON" -m mpi4py \
            bench/allreduce_perf.py "$@" 2>/dev/null | grep -E "^ +[a-z]|wrong")
    done
done
