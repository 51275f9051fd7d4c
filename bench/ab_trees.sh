#!/usr/bin/env bash
# This tree's allreduce against other trees' (earlier commits, or variants), side by side in one session:
# each other tree unpacked and built in a folder of its own (all at once), then bench/allreduce_perf.py of
# each by turns, ROUNDS rounds, on N ranks. For the GPU machine, which has no git: pack the trees here and
# carry bench/out,
#   git archive REV hfr bench examples setup.py pyproject.toml README.md | gzip > bench/out/base.tgz
#   bench/ab_trees.sh bench/out/base.tgz 4 -b 2976K -e 186M -f 4 -n 5 -w 2 --array cupy --backends hfr,pcie-floor
# Several trees: "a.tgz b.tgz" as the first argument. Another program than allreduce_perf.py: SCRIPT, and
# KEEP for the lines of its output to print, as for the DDP step of the transformer on CUDA:
#   SCRIPT=examples/ddp_train.py KEEP="mean step" bench/ab_trees.sh "bench/out/a.tgz bench/out/b.tgz" 4 \
#       --comm hfr-hook --device cuda --model transformer --steps 15 --warmup 3
# Prints each run's kept lines (hfr's rows and its peers'), headed by tree and round; odd rounds in the order
# given (this tree first), even ones reversed.
#   env: PYTHON (default python3), MPIRUN (default: mpirun --oversubscribe --bind-to none, or MPICH's
#   mpiexec from .venv where that exists), ROUNDS (default 2), SCRIPT (default bench/allreduce_perf.py),
#   KEEP (an extended regex; default allreduce_perf.py's rows and its #wrong line)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
SCRIPT="${SCRIPT:-bench/allreduce_perf.py}"
KEEP="${KEEP:-^ +[a-z]|wrong}"
[ $# -ge 2 ] || { echo "usage: $0 'OTHER_TREE.tgz ...' N [program args...]" >&2; exit 2; }
packed=($1) n=$2
shift 2
default_mpirun="mpirun --oversubscribe --bind-to none"
[ -x "$ROOT/.venv/bin/mpiexec" ] && default_mpirun="$ROOT/.venv/bin/mpiexec"
MPIRUN="${MPIRUN:-$default_mpirun}"
pass_path=""  # Open MPI passes the environment only where told; MPICH's hydra passes it all
$MPIRUN --version 2>&1 | grep -q "Open MPI" && pass_path="-x PYTHONPATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
jobs_each=$(( $(nproc) / (${#packed[@]} + 1) ))
jobs_each=$(( jobs_each > 0 ? jobs_each : 1 ))
names=(this) dirs=("$ROOT")
for tgz in "${packed[@]}"; do
    dir=$(mktemp -d /tmp/hfr-other.XXXX)
    tar xzf "$tgz" -C "$dir"
    names+=("$(basename "$tgz" .tgz)") dirs+=("$dir")
done
echo "# building ${#dirs[@]} trees, $jobs_each jobs each: ${dirs[*]}"
for i in "${!dirs[@]}"; do
    (cd "${dirs[$i]}" && "$PYTHON" setup.py build_ext --inplace -q -j "$jobs_each" >/tmp/hfr-build.$$.$i.log 2>&1 ||
        { echo "${names[$i]} does not build:"; tail -20 /tmp/hfr-build.$$.$i.log; exit 1; }) &
done
for job in $(jobs -p); do wait "$job" || exit 1; done
for round in $(seq "${ROUNDS:-2}"); do
    order=$(seq 0 $(( ${#dirs[@]} - 1 )))
    [ $(( round % 2 )) = 0 ] && order=$(echo "$order" | tac)
    for i in $order; do
        echo "== ${names[$i]} tree, round $round"
        # from the tree's own folder, first on the path: python -m puts the working folder first
        (cd "${dirs[$i]}" && PYTHONPATH=${dirs[$i]} timeout 300 $MPIRUN -n "$n" $pass_path "$PYTHON" -m mpi4py \
            "$SCRIPT" "$@" 2>/dev/null | grep -E "$KEEP")
    done
done
