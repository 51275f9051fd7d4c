#!/usr/bin/env bash
# Everything the GPU machine builds, checks and times, by stages (DESIGN.md, "On the GPU machine"); one
# call may run several (`bash bench/gpu_suite.sh overlap torch`) within the device's 10 minutes a command.
#   check      build in place, kernel/CuPy/torch tests (the CPU-only ones run in CI), the fake CUDA driver's tests
#              (tests/test_staged.py: CI's, here beside a real driver they must not bind), kernel benchmark (~7 min)
#   bench      allreduce on CuPy (beside the PCIe floor) and NumPy arrays, n = 4 and 8 (~4 min)
#   overlap    matrix products beside hfr's allreduce and beside plain copies (~1.5 min)
#   torch      the transformer's step under DDP and FSDP2 with none/hfr/hfr-hook/gloo, fp32 and bf16 (~8 min)
#   ddp-trace  where a DDP step's time goes with hfr's hook (~2 min)
#   internode  the inter-node step alone and the allreduce on 4 and 8 emulated nodes (~5 min)
#   dtypes     186 MiB on CuPy n=4: sum and avg of float32, float16 and bfloat16 (~2 min)
#   fsdp       FSDP's collectives, reduce_scatter and allgather, beside allreduce: 186 MiB CuPy n=4 (~2 min)
#   small      the per-call cost: 8 B up, NumPy n=4 against Open MPI and CuPy n=4 against mpi-staged (~3 min)
#   mps        CuPy n=4 small calls under MPS, where a small copy costs ~10 us rather than a time slice
#              (~550 us for an H2D of <= 16 KiB with 4 processes time-slicing the GPU: bench/RESULTS.md) (~1 min)
#   steps      where a staged call's chunks spend their time (bench/chunk_steps.py): CuPy 64 MiB n=4 in chunks
#              of 8 MiB and 1 MiB, time-sliced and under MPS, and NumPy beside them (~2 min)
#   pairs      GPU pairs (issue 28): their tests, then CuPy n=4 1 MiB - 186 MiB and n=8 186 MiB with pairs off, on and
#              auto (hfr) beside the PCIe and pair floors, time-sliced and under MPS (where auto pairs) (~6 min)
#   shm        hfr on NumPy arrays and torch CPU tensors (also with OMP_WAIT_POLICY=PASSIVE) against DeepSpeed's
#              shm allreduce, in place, 8 B up, n = 4 and 8, and bfloat16 1-64 MiB (~5 min; needs the deepspeed wheels:
#              see the stage)
# Results go to $OUT (the device tool's folder, which gives back 8 files a call: a stage writes at most 8) or bench/out/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
stages=("${@:-check}")
out=${OUT:-bench/out/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
log() { echo "== $(date +%T) $*"; }
perf() {  # perf N ARGS...: bench/allreduce_perf.py on N ranks, the table only
  local n=$1
  shift
  timeout 200 $MPIRUN -n "$n" python3 -m mpi4py bench/allreduce_perf.py "$@" 2>/dev/null
}

log "build"
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
python3 -c "import hfr, hfr.kernels as k, cupy, mpi4py.MPI as M; print('backends', k.available_backends(), 'cupy', cupy.__version__, M.Get_library_version().splitlines()[0]); print(cupy.cuda.runtime.getDeviceCount(), 'GPU(s)'); import os; print(os.cpu_count(), 'cores')"
# the machine: its kernel tells the sandbox (gVisor reports 4.4.0, where every syscall, a wait's sched_yield too, is
# served by the sandbox), the GPU, its driver and compute mode, the CPU
echo "kernel $(uname -r); $(nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader); $(grep -m1 "model name" /proc/cpuinfo)"
# how far apart the cores are (a round trip, and stores into lines another core holds): near and far CPU pairs
cc -O2 -pthread bench/core_trip.c -o /tmp/core_trip && for far in $(printf "%s\n" 1 $(( $(nproc) / 2 )) $(( $(nproc) - 1 )) | sort -nu); do
  /tmp/core_trip 0 $far
done

for stage in "${stages[@]}"; do
case "$stage" in
check)
  log "tests: kernels, cupy, torch (the CPU-only ones run in CI), and the fake CUDA driver's beside the real one"
  timeout 480 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py tests/test_cupy.py \
    tests/test_staged.py tests/test_torch.py 2>&1 | tail -15
  log "kernels_perf"
  timeout 120 python3 bench/kernels_perf.py --size-mib 64 --k 8 --dtypes float32 bfloat16 --threads 1 4 16 \
    2>&1 | tee "$out/kernels_perf.txt"
  ;;
bench)
  log "allreduce cupy n=4, up to the paper's 186 MiB"
  perf 4 -b 2976K -e 186M -f 4 -n 5 -w 2 --array cupy --backends hfr,mpi-staged,gloo,pcie-floor,pair-floor \
    --plot "$out/cupy_n4.png" | tee "$out/cupy_n4.txt"
  for n in 8; do
    log "allreduce cupy n=$n, 186 MiB"
    perf $n -b 186M -e 186M -f 1 -n 5 -w 2 --array cupy --backends hfr,mpi-staged,gloo,pcie-floor,pair-floor \
      | tee "$out/cupy_n$n.txt"
  done
  for n in 4 8; do
    log "allreduce numpy n=$n, 186 MiB"
    perf $n -b 186M -e 186M -f 1 -n 5 -w 2 --array numpy --backends hfr,mpi,gloo | tee "$out/numpy_n$n.txt"
  done
  ;;
overlap)
  for peers in numpy cupy; do
    log "overlap n=4, peers $peers"
    timeout 90 $MPIRUN -n 4 python3 -m mpi4py bench/overlap_perf.py --mib 186 --peers $peers 2>&1 \
      | tee -a "$out/overlap.txt"
  done
  ;;
torch)
  log "the transformer (~55 M parameters, AdamW) under DDP and FSDP2, 4 ranks sharing the GPU: each comm's share of the step"
  timeout 560 python3 bench/step_shares.py --np 4 --device cuda --steps 20 --warmup 5 --timeout 150 \
    --mpiexec "$MPIRUN" 2>&1 | tee "$out/step_shares.txt"
  ;;
ddp-trace)
  log "where a DDP step's time goes with hfr's hook (the mlp), 4 ranks sharing the GPU"
  timeout 150 $MPIRUN -n 4 python3 -m mpi4py bench/ddp_trace.py --device cuda --hidden 4095 2>&1 \
    | tee "$out/ddp_trace.txt"
  ;;
internode)
  for n in 4 8; do
    log "inter-node step alone, $n emulated nodes"
    timeout 150 $MPIRUN -n $n python3 -m mpi4py bench/internode_perf.py -b 8 -e 64M -f 4 -n 10 -w 3 2>&1 \
      | tee "$out/internode_n$n.txt"
    log "dbtree and doubling around the switch, and dbtree from 2 MiB with 4 kernel threads, $n emulated nodes"
    timeout 60 $MPIRUN -n $n python3 -m mpi4py bench/internode_perf.py -b 64K -e 1M -f 2 -n 10 -w 3 \
      --algos dbtree,doubling 2>&1 | tee "$out/internode_switch_n$n.txt"
    timeout 60 $MPIRUN -n $n python3 -m mpi4py bench/internode_perf.py -b 2M -e 32M -f 2 -n 10 -w 3 \
      --algos dbtree --threads 4 2>&1 | tee "$out/internode_threads_n$n.txt"
    log "allreduce numpy, $n emulated nodes of 1 rank"
    HFR_LOCAL_SIZE=1 perf $n -b 8 -e 64M -f 8 -n 5 -w 2 --array numpy --backends hfr,mpi \
      | tee "$out/emulated_n$n.txt"
  done
  ;;
dtypes)
  log "186 MiB CuPy n=4: sum and avg of float32, float16 and bfloat16 (hfr)"
  for d in float32 float16 bfloat16; do
    for o in sum avg; do
      echo "# $d $o"
      perf 4 -b 186M -e 186M -f 1 -n 5 -w 2 --array cupy --backends hfr -d $d -o $o | grep -v "^#"
    done
  done | tee "$out/dtypes_n4.txt"
  ;;
fsdp)
  for c in reduce_scatter allgather allreduce; do
    log "$c 186 MiB cupy n=4"
    perf 4 -b 186M -e 186M -f 1 -n 5 -w 2 --array cupy --backends hfr,mpi-staged,gloo --collective $c \
      | tee "$out/${c}_n4.txt"
  done
  ;;
small)
  log "allreduce numpy n=4 from 8 B"
  perf 4 -b 8 -e 1M -f 8 -n 200 -w 20 --array numpy --backends hfr,mpi | tee "$out/small_numpy_n4.txt"
  log "allreduce numpy, 4 emulated nodes of 1 rank, from 8 B"
  HFR_LOCAL_SIZE=1 perf 4 -b 8 -e 4K -f 8 -n 200 -w 20 --array numpy --backends hfr,mpi \
    | tee "$out/small_emulated_n4.txt"
  log "allreduce cupy n=4 from 8 B to 186 MiB"
  perf 4 -b 8 -e 186M -f 8 -n 20 -w 5 --array cupy --backends hfr,mpi-staged | tee "$out/small_cupy_n4.txt"
  ;;
mps)
  log "allreduce cupy n=4 from 8 B under MPS, and a call in pieces (bench/call_parts.py)"
  nvidia-cuda-mps-control -d && sleep 1
  perf 4 -b 8 -e 256K -f 8 -n 100 -w 10 --array cupy --backends hfr,mpi-staged | tee "$out/small_cupy_mps_n4.txt"
  timeout 60 $MPIRUN -n 4 python3 -m mpi4py bench/call_parts.py --array cupy --bytes 8 --calls 2000 --rounds 3 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^#|^hfr" | tee "$out/parts_cupy_mps_n4.txt"
  echo quit | nvidia-cuda-mps-control
  ;;
steps)
  for mps in off on; do
    [ $mps = on ] && nvidia-cuda-mps-control -d && sleep 1
    for chunk in 8M 1M; do
      for array in cupy numpy; do
        [ $mps = on ] && [ $array = numpy ] && continue
        log "chunk steps: $array 64 MiB n=4, chunks of $chunk, MPS $mps"
        HFR_CHUNK_BYTES=$chunk timeout 120 $MPIRUN -x HFR_CHUNK_BYTES -n 4 python3 -m mpi4py bench/chunk_steps.py \
          --array $array --bytes 64M --calls 10 2>/dev/null | tee "$out/steps_${array}_${chunk}_mps_$mps.txt"
      done
    done
    [ $mps = on ] && echo quit | nvidia-cuda-mps-control
  done
  ;;
pairs)
  log "GPU pairs: tests"
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_cupy.py -k pairs 2>&1 | tail -15
  for mps in off on; do
    [ $mps = on ] && nvidia-cuda-mps-control -d && sleep 1
    log "allreduce cupy n=4, MPS $mps: pairs off, on and auto (hfr), beside the floors"
    perf 4 -b 1M -e 186M -f 4 -n 5 -w 2 --array cupy --backends hfr:pairs-off,hfr:pairs-on,hfr,pcie-floor,pair-floor \
      | tee "$out/pairs_n4_mps_$mps.txt"
    perf 4 -b 186M -e 186M -f 1 -n 5 -w 2 --array cupy --backends hfr:pairs-off,hfr:pairs-on,hfr | grep "^ " \
      | tee -a "$out/pairs_n4_mps_$mps.txt"
    log "allreduce cupy n=8, 186 MiB, MPS $mps: pairs off, on and auto, beside the floors"
    perf 8 -b 186M -e 186M -f 1 -n 5 -w 2 --array cupy --backends hfr:pairs-off,hfr:pairs-on,hfr,pcie-floor,pair-floor \
      | tee "$out/pairs_n8_mps_$mps.txt"
    [ $mps = on ] && echo quit | nvidia-cuda-mps-control
  done
  ;;
shm)
  # DeepSpeed 0.19.8 is an sdist on PyPI and the host has no network: carry wheels for Python 3.12, made on a
  # machine that has it with
  #   pip wheel --no-deps deepspeed==0.19.8 -w wheels
  #   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d wheels \
  #     ninja hjson py-cpuinfo msgpack einops pydantic psutil tqdm packaging
  # (with pydantic come pydantic-core, annotated-types, typing-inspection, typing-extensions: 14 wheels), and
  # install them there with `pip install --no-index --find-links wheels deepspeed==0.19.8 ninja`: torch 2.11
  # meets its torch>=2.0, so no torch is pulled. Its op is built with g++ on first use, then cached.
  log "DeepSpeed's shm op: build (the first time) or load, before anything is timed"
  build="from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
  time DS_ACCELERATOR=cpu timeout 300 python3 -c "$build" 2>&1 | tail -3
  rm -f "$out/shm_bf16.txt" "$out/torch_calls.txt"  # both n append to these two
  for n in 4 8; do
    for array in numpy torch; do  # DeepSpeed's OpenMP threads: cores / n (the backend's default)
      log "allreduce $array n=$n, 8 B - 128 MiB, hfr against deepspeed (in place only)"
      perf $n -b 8 -e 186M -f 4 -n 20 -w 5 --array $array --backends hfr,deepspeed | tee "$out/shm_${array}_n$n.txt"
    done
    log "allreduce numpy bfloat16 n=$n, 1 - 64 MiB, hfr against deepspeed (the half types' kernels)"
    perf $n -b 1M -e 64M -f 4 -n 20 -w 5 -d bfloat16 --backends hfr,deepspeed | tee -a "$out/shm_bf16.txt"
    # torch's OpenMP threads spin after the harness's copy_ and take the cores from hfr's (README, PyTorch)
    log "allreduce torch n=$n with OMP_WAIT_POLICY=PASSIVE, hfr against deepspeed"
    OMP_WAIT_POLICY=PASSIVE timeout 200 $MPIRUN -x OMP_WAIT_POLICY -n $n python3 -m mpi4py bench/allreduce_perf.py \
      -b 8 -e 186M -f 4 -n 20 -w 5 --array torch --backends hfr,deepspeed 2>/dev/null | tee "$out/shm_torch_passive_n$n.txt"
    log "calls from torch n=$n: NumPy, tensor, dist.all_reduce on hfr, gloo and a null backend"
    $MPIRUN -n $n python3 -m mpi4py bench/torch_calls.py -b 8 -e 64M -f 8 --rounds 3 | tee -a "$out/torch_calls.txt"
  done
  ;;
*)
  echo "unknown stage $stage: check, bench, overlap, torch, ddp-trace, internode, dtypes, fsdp, small, mps, steps, pairs or shm" >&2
  exit 2
  ;;
esac
done
log "done"
