"""torch tensors and DDP hooks under real mpiexec (skipped where torch is missing; the CUDA cases where
CuPy or a CUDA device is missing)."""
import pytest

from .mpirun import REPO, run_mpi

torch = pytest.importorskip("torch")


def _have_cuda() -> bool:
    try:
        import cupy  # noqa: F401

        return torch.cuda.is_available()
    except ImportError:
        return False


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not _have_cuda(), reason="needs CuPy and CUDA")])]


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_bitwise_equal_to_numpy(device):
    """float32/float16/bfloat16/int32, in place and out=, and bad tensors refused untouched."""
    assert "torch tensors ok" in run_mpi(2, "torch_worker.py", "tensors", device, timeout=120).stdout


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_hooks_match_gloo(device):
    """fp32/bf16/fp16 models, odd buckets, gradient_as_bucket_view: the same parameters as gloo's."""
    assert "torch ddp ok" in run_mpi(2, "torch_worker.py", "ddp", device, timeout=120).stdout


def test_example_runs():
    out = run_mpi(2, str(REPO / "examples" / "ddp_train.py"), "--comm", "hfr", "--steps", "3", timeout=120).stdout
    assert "mean step" in out and "step    2" in out
