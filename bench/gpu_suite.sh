#!/usr/bin/env bash
# Everything the GPU machine builds, checks and times, in one call (DESIGN.md, "On the GPU machine").
#   bash bench/gpu_suite.sh check   # build in place, GPU tests, kernel benchmark (~4 min)
#   bash bench/gpu_suite.sh bench   # allreduce on CuPy and NumPy arrays, n = 4 and 8; overlap (~4 min)
#   bash bench/gpu_suite.sh torch   # torch tests, DDP step times, overlap, NumPy allreduce again (~5 min)
# Results go to $OUT (the device tool's folder) or bench/out/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-check}
out=${OUT:-bench/out/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
log() { echo "== $(date +%T) $*"; }

log "build"
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
python3 -c "import hfr, hfr.kernels as k, cupy, mpi4py.MPI as M; print('backends', k.available_backends(), 'cupy', cupy.__version__, M.Get_library_version().splitlines()[0]); print(cupy.cuda.runtime.getDeviceCount(), 'GPU(s)'); import os; print(os.cpu_count(), 'cores')"

if [ "$stage" = check ]; then
  log "tests: kernels, cupy, collectives"
  timeout 420 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py tests/test_cupy.py \
    tests/test_collectives.py 2>&1 | tail -15
  log "kernels_perf"
  timeout 120 python3 bench/kernels_perf.py --size-mib 64 --k 8 --dtypes float32 bfloat16 --threads 1 4 16 \
    2>&1 | tee "$out/kernels_perf.txt"
elif [ "$stage" = bench ]; then
  # cupy: a sweep up to the paper's 186 MiB at n=4, that size alone at n=8; numpy: 186 MiB.
  for spec in "4 -b 2976K -e 186M -f 4" "8 -b 186M -e 186M -f 1"; do
    set -- $spec; n=$1; shift
    log "allreduce cupy n=$n"
    timeout 200 $MPIRUN -n $n python3 -m mpi4py bench/allreduce_perf.py "$@" -n 5 -w 2 --array cupy \
      --backends hfr,mpi-staged,gloo --plot "$out/cupy_n$n.png" 2>/dev/null | tee "$out/cupy_n$n.txt"
  done
  for n in 4 8; do
    log "allreduce numpy n=$n"
    timeout 120 $MPIRUN -n $n python3 -m mpi4py bench/allreduce_perf.py -b 186M -e 186M -n 5 -w 2 \
      --array numpy --backends hfr,mpi,gloo 2>/dev/null | tee "$out/numpy_n$n.txt"
  done
  log "overlap n=4"
  timeout 90 $MPIRUN -n 4 python3 -m mpi4py bench/overlap_perf.py --mib 186 2>&1 | tee "$out/overlap.txt"
elif [ "$stage" = torch ]; then
  log "torch tests"
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_torch.py 2>&1 | tail -5
  log "DDP step times, 4 ranks sharing the GPU"
  for comm in none hfr gloo; do
    timeout 120 $MPIRUN -n 4 python3 -m mpi4py examples/ddp_train.py --comm $comm --device cuda --steps 40 \
      --warmup 5 --hidden 4095 2>&1 | tail -1
  done 2>&1 | tee "$out/ddp.txt"
  for peers in numpy cupy; do
    log "overlap n=4, peers $peers"
    timeout 90 $MPIRUN -n 4 python3 -m mpi4py bench/overlap_perf.py --mib 186 --peers $peers 2>&1 | tee -a "$out/overlap.txt"
  done
  log "allreduce numpy n=4 (threaded copies)"
  timeout 120 $MPIRUN -n 4 python3 -m mpi4py bench/allreduce_perf.py -b 186M -e 186M -f 1 -n 5 -w 2 \
    --array numpy --backends hfr,mpi,gloo 2>/dev/null | tee "$out/numpy_n4.txt"
else
  echo "unknown stage $stage: check or bench" >&2
  exit 2
fi
log "done"
