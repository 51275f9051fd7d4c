#!/usr/bin/env bash
# The Cython kernels built portable (the default: the SIMD level is picked at run time) against a build with
# HFR_NATIVE=1 (-march=native), side by side: this tree's sources built both ways in folders of their own,
# then bench/kernels_perf.py of each by turns (portable, native, portable, native, ...) at every thread
# count. Prints the tables and, per thread count, dtype and k, each build's best GB/s over the rounds and
# native / portable. No network: needs a C compiler, Cython, numpy and ml_dtypes where PYTHON runs.
#
#   bench/portable_vs_native.sh [THREADS...]     (default 1 4 16)
#   env: PYTHON (default python3), OUT (default bench/out/portable_vs_native), SIZE_MIB (default 64), ROUNDS (2)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="$(realpath -m "${OUT:-$ROOT/bench/out/portable_vs_native}")"
THREADS=("$@")
[ ${#THREADS[@]} -gt 0 ] || THREADS=(1 4 16)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # hfr imports mpi4py, which starts MPI
mkdir -p "$OUT" && rm -f "$OUT"/*-t*-r*.txt

declare -A HFR_NATIVE_OF=([portable]=0 [native]=1)
for build in portable native; do
    dir="$OUT/$build"
    rm -rf "$dir" && mkdir -p "$dir/bench"
    cp -r "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/hfr" "$dir/"
    cp "$ROOT/bench/kernels_perf.py" "$ROOT/bench/_tree.py" "$dir/bench/"
    rm -f "$dir"/hfr/*.so "$dir"/hfr/*.c
    echo "# building $build in $dir"
    if ! (cd "$dir" && HFR_NATIVE=${HFR_NATIVE_OF[$build]} "$PYTHON" setup.py build_ext --inplace -q -j "$(nproc)" \
            >"$OUT/$build-build.log" 2>&1); then
        tail -30 "$OUT/$build-build.log"
        exit 1
    fi
done

for threads in "${THREADS[@]}"; do
    for round in $(seq "${ROUNDS:-2}"); do
        for build in portable native; do
            echo "# $build, $threads thread(s), round $round"
            "$PYTHON" "$OUT/$build/bench/kernels_perf.py" --backends cython --dtypes float32 bfloat16 float16 \
                --k 2 8 --threads "$threads" --size-mib "${SIZE_MIB:-64}" | tee "$OUT/$build-t$threads-r$round.txt"
        done
    done
done

"$PYTHON" - "$OUT" <<'EOF'
"""The best cython GB/s of each build over its rounds, per (threads, dtype, k), and native / portable."""
import sys
from pathlib import Path

best = {}
for path in Path(sys.argv[1]).glob("*-t*-r*.txt"):
    build = path.name.split("-")[0]
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            key = (int(cells[0]), cells[1], int(cells[2]))
            best[build, key] = max(best.get((build, key), 0.0), float(cells[4]))  # cells[4]: cython GB/s
print("| threads | dtype | k | portable GB/s | native GB/s | native / portable |")
print("|---|---|---|---|---|---|")
for key in sorted({key for _, key in best}):
    portable, native = best["portable", key], best["native", key]
    print(f"| {key[0]} | {key[1]} | {key[2]} | {portable:.1f} | {native:.1f} | {native / portable:.3f} |")
EOF
