"""CuPy arrays (GPU only: skipped where CuPy or a CUDA device is missing)."""
import pytest

from .mpirun import run_mpi


def _have_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _have_gpu(), reason="needs CuPy and a CUDA device")]


@pytest.mark.parametrize("nprocs,local_size", [(1, None), (2, None), (4, None), (4, 2)])
def test_cupy_arrays(nprocs, local_size):
    env = {"HFR_LOCAL_SIZE": str(local_size)} if local_size else {}
    assert "cupy ok" in run_mpi(nprocs, "cupy_worker.py", env=env, timeout=300).stdout


@pytest.mark.parametrize("nprocs,local_size", [(2, None), (3, None), (4, 2)])
def test_gpu_pairs(nprocs, local_size):
    """Ranks sharing the GPU pair (HFR_PAIRS=on): tests/workers/pairs_worker.py's checks on the device."""
    env = {"HFR_LOCAL_SIZE": str(local_size)} if local_size else {}
    assert run_mpi(nprocs, "pairs_worker.py", "none", env=env, timeout=300).stdout.count("pairs ok") == nprocs


def test_ten_thousand_cupy_calls_leave_memory_fds_shm_and_gpu_memory_flat():
    assert "flat after 10000 cupy calls" in run_mpi(2, "leak_worker.py", "10000", "cupy", timeout=300).stdout


@pytest.mark.parametrize("nprocs,local_size", [(3, None), (4, 2), (4, 1)])
def test_cupy_calls_after_mismatches_are_right(nprocs, local_size):
    """tests/test_faults.py's mismatch rounds on CuPy arrays: across nodes the small calls' data goes with
    the call check's vote and a mismatch the vote finds ends the chunk (the engine copies out otherwise)."""
    env = {"FAULT_ARRAY": "cupy", **({"HFR_LOCAL_SIZE": str(local_size)} if local_size else {})}
    assert "rounds ok" in run_mpi(nprocs, "faults_worker.py", "rounds", "60", env=env, timeout=240).stdout
