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


@pytest.mark.parametrize("nprocs, local_size, omp_threads", [(2, None, "2"), (4, "2", "2"), (2, None, "4"),
                                                             (2, None, "1")],
                         ids=["1x2", "2x2", "1x2-team-of-4", "1x2-team-of-1"])
def test_cpu_tensor_kernels_run_on_torchs_openmp_team(nprocs, local_size, omp_threads):
    """Blocking calls on CPU tensors run their kernels on the caller's OpenMP team, on one node and across nodes
    (calls of several chunks, which the engine's Python runs): no pool thread of hfr's, no thread of the team
    ended by a smaller one, and a new thread's team of torch's size; with a team of fewer threads than hfr's, on
    hfr's pool. (With one rank a node no call of these starts the pool.)"""
    env = {"HFR_NUM_THREADS": "2", "HFR_CHUNK_BYTES": "1M", "OMP_NUM_THREADS": omp_threads,
           **({"HFR_LOCAL_SIZE": local_size} if local_size else {})}
    assert "torch team ok" in run_mpi(nprocs, "torch_worker.py", "team", "cpu", env=env, timeout=180).stdout


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_hooks_match_gloo(device):
    """fp32/bf16/fp16 models, odd buckets, gradient_as_bucket_view: the same parameters as gloo's."""
    assert "torch ddp ok" in run_mpi(2, "torch_worker.py", "ddp", device, timeout=120).stdout


LAYOUTS = [pytest.param(1, None, id="1rank"), pytest.param(2, None, id="2ranks"), pytest.param(3, None, id="3ranks"),
           pytest.param(4, "2", id="2nodes-x-2ranks")]


@pytest.mark.parametrize("nprocs, local_size", LAYOUTS)
def test_backend_collectives_match_gloo(nprocs, local_size):
    """The backend "hfr": every collective torch routes to it gives a gloo group's results, async Works,
    what hfr does not do reaches gloo, bad tensors refused untouched."""
    env = {"HFR_LOCAL_SIZE": local_size} if local_size else None
    assert "torch backend ok" in run_mpi(nprocs, "torch_worker.py", "backend", "cpu", env=env, timeout=240).stdout


@pytest.mark.parametrize("device", DEVICES[1:])  # the CPU case runs on every layout above
def test_backend_with_cuda_tensors(device):
    assert "torch backend ok" in run_mpi(2, "torch_worker.py", "backend", device, timeout=240).stdout


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_without_hook_and_fsdp2_train_as_on_gloo(device):
    """DDP with no hook and FSDP2 (fully_shard) on the backend "hfr": the parameters of the same training
    on a gloo group, within 1e-5 (fp32)."""
    assert "torch training ok" in run_mpi(2, "torch_worker.py", "training", device, timeout=300).stdout


def test_example_runs():
    out = run_mpi(2, str(REPO / "examples" / "ddp_train.py"), "--comm", "hfr", "--steps", "3", timeout=120).stdout
    assert "mean step" in out and "step    2" in out


FAULT_LAYOUTS = [pytest.param(2, None, "cpu", id="1x2"), pytest.param(2, "1", "cpu", id="2x1"),
                 pytest.param(4, "2", "cpu", id="2x2"),
                 pytest.param(2, None, "cuda", id="1x2-cuda", marks=DEVICES[1].marks)]


@pytest.mark.parametrize("nprocs, local_size, device", FAULT_LAYOUTS)
def test_backend_mismatch_raises_on_every_rank(nprocs, local_size, device):
    """A count mismatch through dist.all_reduce, work.wait(), get_future().wait() and a DDP hook's future,
    and an op mismatch (MAX against SUM) blocking and through work.wait(), raise MismatchError on every rank,
    then the next call is right; tensors that require grad reduce."""
    env = {"HFR_LOCAL_SIZE": local_size} if local_size else None
    out = run_mpi(nprocs, "torch_faults_worker.py", "mismatch", device, env=env, timeout=90).stdout
    assert "torch mismatch ok" in out


def test_backend_timeout_raises_then_refuses():
    """A peer that never calls: a timeout through dist.all_reduce, work.wait() and the future, then the
    broken groups' next calls raise; the job exits."""
    out = run_mpi(2, "torch_faults_worker.py", "timeout", env={"HFR_TIMEOUT": "3"}, timeout=90).stdout
    assert "torch timeout ok" in out


def test_backend_closed_group_raises_at_once():
    """A rank destroys its groups while the others of its node call on them: dist.all_reduce, work.wait() and
    the future raise HFRError naming it, well before the timeout; the groups' next calls raise."""
    out = run_mpi(3, "torch_faults_worker.py", "closed", env={"HFR_TIMEOUT": "10"}, timeout=90).stdout
    assert "torch closed ok" in out


@pytest.mark.parametrize("nprocs, local_size", [(2, None), (2, "1"), (4, "2")], ids=["1x2", "2x1", "2x2"])
def test_ctrl_c_in_a_wait_interrupts_the_wait_not_the_call(nprocs, local_size):
    """Ctrl-C in work.wait() of an async dist.all_reduce while a peer is late: KeyboardInterrupt, the call goes
    on; waited for again it is right, and so are the next calls."""
    env = {"HFR_LOCAL_SIZE": local_size} if local_size else None
    assert "torch interrupt ok" in run_mpi(nprocs, "torch_faults_worker.py", "interrupt", env=env, timeout=90).stdout


def test_backend_groups_independent_and_freed():
    """Groups {0,1} and {0,2}: a call on one never waits for the other's; 4 init/destroy cycles with
    groups destroyed leave threads and /dev/shm mappings as they were before the first."""
    out = run_mpi(3, "torch_faults_worker.py", "lifecycle", env={"HFR_TIMEOUT": "10"}, timeout=120).stdout
    assert "torch lifecycle ok" in out


def test_torchrun_launch_refused():
    """WORLD_SIZE=2 RANK=0 (torchrun's) in a one-rank MPI job: init raises at once, naming MPI launchers."""
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    assert "torch torchrun ok" in run_mpi(1, "torch_faults_worker.py", "torchrun", env=env, timeout=60).stdout
