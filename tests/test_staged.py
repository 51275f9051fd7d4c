"""CUDA arrays' calls in C (the front, hfr/_node_call.pyx, hfr/_cuda.pyx) on machines without a GPU: on a
fake CUDA driver and CuPy (tests/fake_cuda) whose device memory is host memory. tests/test_cupy.py runs the
real thing on a GPU; this covers the same C paths, and CUDA failures, in CI."""
import shutil
import subprocess
from pathlib import Path

import pytest

from .mpirun import REPO, run_mpi

FAKE = Path(__file__).parent / "fake_cuda"
LAYOUTS = [(2, None), (3, None), (2, 1), (4, 2)]  # one node (its ranks fitting the cores, and not), one rank a node, 2 x 2


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory) -> dict:
    """The environment of a job on the fake: its CuPy first on the path, its libcuda.so.1 built here and
    preloaded: the first library of that name in each process, so whatever asks for libcuda.so.1 gets the fake
    (on the GPU host, with the fake only first on LD_LIBRARY_PATH, the ranks had bound the host's driver before
    the fake CuPy's import)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler for the fake CUDA driver")
    driver = tmp_path_factory.mktemp("fake_cuda") / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(driver),
                    str(FAKE / "libcuda.c")], check=True)
    return {"PYTHONPATH": f"{FAKE}:{REPO}", "LD_PRELOAD": str(driver)}


def test_a_communicator_of_one_rank_takes_cuda_arrays(fake_cuda):
    """One rank: every collective's result is its input, copied on the caller's stream where out is apart."""
    assert "staged alone ok" in run_mpi(1, "staged_worker.py", "alone", env=fake_cuda, timeout=60).stdout


@pytest.mark.parametrize("nprocs,local_size", LAYOUTS)
def test_cuda_calls_in_c_are_right(fake_cuda, nprocs, local_size):
    env = {**fake_cuda, **({"HFR_LOCAL_SIZE": str(local_size)} if local_size else {})}
    assert run_mpi(nprocs, "staged_worker.py", "calls", env=env, timeout=180).stdout.count("staged calls ok") == nprocs


@pytest.mark.parametrize("nprocs,local_size,failing", [(2, None, "launch"), (2, None, "push"), (2, None, "stall-gone"),
                                                        (3, None, "launch"), (2, 1, "launch"), (4, 2, "launch"),
                                                        (4, 2, "push"), (4, 2, "stall")])
def test_gpu_pairs_are_right_and_a_failed_pair_step_breaks_the_communicator(fake_cuda, nprocs, local_size, failing):
    """HFR_PAIRS=on (every size): pairs 0-1 (and 2-3 on 2 x 2; the third rank of 1 x 3 unpaired, none with
    one rank a node), every dtype and op against a float64 reference, then a failed pair step (its add kernel,
    or its push) or a stalled one (the partner's push never runs; on 1 x 2 the partner then fails)."""
    env = {**fake_cuda, **({"HFR_LOCAL_SIZE": str(local_size)} if local_size else {})}
    out = run_mpi(nprocs, "pairs_worker.py", failing, env=env, timeout=240).stdout
    assert out.count("pairs ok") == nprocs, out


# On one node a call of 7 elements is whole (its result through the rank's staging), 3001 goes through the
# result slot; across nodes both are folded (the slice rides on the vote): one size there. 300007 float32 is
# five chunks of the worker's 256 KiB, more than the stages: copies queued ahead, then while others run.
FAILURES = [(3, None, 7), (3, None, 3001), (3, None, 300007), (2, 1, 7), (4, 2, 3001), (4, 2, 300007)]


@pytest.mark.parametrize("step", [1, 2], ids=["copy-in", "copy-out"])
@pytest.mark.parametrize("nprocs,local_size,count", FAILURES,
                         ids=["1x3-whole", "1x3-result-slot", "1x3-chunks", "2x1", "2x2", "2x2-chunks"])
def test_a_failed_cuda_copy_breaks_the_communicator_and_a_new_one_works(fake_cuda, nprocs, local_size, count, step):
    env = {**fake_cuda, **({"HFR_LOCAL_SIZE": str(local_size)} if local_size else {})}
    out = run_mpi(nprocs, "staged_worker.py", "fail", str(step), str(count), env=env, timeout=120).stdout
    assert out.count(f"failed copy {step} ok") == nprocs, out


@pytest.mark.parametrize("nprocs,local_size", [(2, None), (4, 2)])
def test_a_signal_that_closes_the_communicator_cancels_a_staged_call(fake_cuda, nprocs, local_size):
    env = {**fake_cuda, **({"HFR_LOCAL_SIZE": str(local_size)} if local_size else {})}
    out = run_mpi(nprocs, "staged_worker.py", "cancel", env=env, timeout=120).stdout
    assert out.count("cancelled call ok") == nprocs, out


@pytest.mark.parametrize("nprocs,local_size", LAYOUTS)
def test_a_mismatched_staged_call_raises_everywhere_and_the_next_is_right(fake_cuda, nprocs, local_size):
    env = {**fake_cuda, **({"HFR_LOCAL_SIZE": str(local_size)} if local_size else {})}
    out = run_mpi(nprocs, "staged_worker.py", "mismatch", env=env, timeout=120).stdout
    assert out.count("mismatch rounds ok") == nprocs, out


@pytest.mark.parametrize("algo", ["mpi", "gather"])
def test_cuda_calls_by_mpi_and_gather_across_nodes_are_right(fake_cuda, algo):
    """MPI's own collectives, polled in C (hfr/_internode.pyx's Collective), under CUDA calls on 2 x 2."""
    env = {**fake_cuda, "HFR_LOCAL_SIZE": "2", "HFR_ALGO": algo}
    assert run_mpi(4, "staged_worker.py", "calls", env=env, timeout=180).stdout.count("staged calls ok") == 4
