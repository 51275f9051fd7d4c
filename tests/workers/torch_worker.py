"""Checks of hfr on torch tensors, on every rank of the job it runs in; run by tests/test_torch.py.

    torch_worker.py tensors DEVICE  hfr.allreduce of float32/float16/bfloat16/int32 tensors, in place and
                                    out=, bitwise equal to the NumPy path; bad tensors refused untouched
    torch_worker.py ddp DEVICE      DDP with hfr's hooks against DDP's own gloo allreduce: same parameters
                                    after a few steps, bitwise the same on every rank; fp32, bf16 and fp16
                                    models, small buckets of odd sizes, gradient_as_bucket_view
    torch_worker.py backend DEVICE  the backend "hfr": torch's collectives give a gloo group's results, async
                                    Works, what hfr does not do reaches gloo, bad tensors refused untouched
    torch_worker.py training DEVICE the backend "hfr": DDP without a hook and FSDP2 give the parameters of
                                    the same training on a gloo group (fp32, within 1e-5)
    torch_worker.py team cpu        with HFR_NUM_THREADS > 1 and torch's threads OMP_NUM_THREADS: blocking calls
                                    on large CPU tensors run their kernels on torch's OpenMP team where it has
                                    that many threads (no hfr-kernels thread starts, no thread of the team
                                    ends, a new thread's team has torch's size), else on hfr's pool, and give
                                    the NumPy path's bits; a NumPy call then starts hfr's pool

Prints "torch <mode> ok" on rank 0; any failure raises, and mpi4py's runner aborts the job.
"""
import collections
import os
import sys
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import hfr
import hfr.torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import fsdp_train  # noqa: E402
from ddp_train import train  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16, torch.int32: np.int32}


def to_tensor(a: np.ndarray, device: torch.device) -> torch.Tensor:
    bits = torch.from_numpy(a.view(f"i{a.itemsize}").copy())
    return bits.view(getattr(torch, a.dtype.name)).to(device)


def bits(x) -> bytes:
    """The bytes of a numpy array or a tensor."""
    if isinstance(x, torch.Tensor):
        x = x.cpu().view(torch.int8 if x.element_size() == 1 else getattr(torch, f"int{8 * x.element_size()}")).numpy()
    return x.tobytes()


def check_tensors(device: torch.device) -> None:
    for torch_dtype, np_dtype in DTYPES.items():
        for op in ("sum", "avg", "max"):
            if op == "avg" and torch_dtype == torch.int32:
                continue
            rng = np.random.default_rng([7, rank])
            a = (rng.standard_normal((3, 1001)) * 8).astype(np_dtype)  # 3003 elements: odd
            want = hfr.allreduce(a.copy(), op)
            t = to_tensor(a, device)
            assert hfr.allreduce(t, op) is t, "in place returns the tensor passed"
            assert bits(t) == bits(want), f"in place {torch_dtype} {op}: differs from the NumPy path"
            x, out = to_tensor(a, device), torch.zeros(a.shape, dtype=torch_dtype, device=device)
            assert hfr.allreduce(x, op, out=out) is out, "out= returns out"
            assert bits(out) == bits(want) and bits(x) == bits(a), f"out= {torch_dtype} {op}: wrong result or x changed"
            work = hfr.allreduce_async(to_tensor(a, device), op)
            assert bits(work.wait()) == bits(want), f"allreduce_async {torch_dtype} {op}"
    check_refused(device)


def threads() -> dict[int, str]:
    """This process's threads: id -> OS-level name (a thread that ends meanwhile left out)."""
    found = {}
    for task in os.listdir("/proc/self/task"):
        try:
            found[int(task)] = Path(f"/proc/self/task/{task}/comm").read_text().strip()
        except FileNotFoundError:
            pass
    return found


def threads_of_a_new_thread(t: torch.Tensor) -> int:
    """The threads a blocking call on t from a new thread, which has run no torch op, runs its kernels on."""
    before, started = set(threads()), []

    def call() -> None:
        hfr.allreduce(t)
        started.extend(set(threads()) - before - {threading.get_native_id()})

    caller = threading.Thread(target=call)
    caller.start()
    caller.join()
    return 1 + len(started)


def check_team(device: torch.device) -> None:
    hfr_threads = int(os.environ["HFR_NUM_THREADS"])
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # torch caps the variable at the host's cores
    # torch's team takes a call of as many parts as hfr's threads (torch's parallel backend OpenMP)
    team = ("ATen parallel backend: OpenMP" in torch.__config__.parallel_info()
            and torch.get_num_threads() >= hfr_threads)
    cases, first_team = [], None
    for torch_dtype, np_dtype in DTYPES.items():
        for op in ("sum", "max", "prod"):
            rng = np.random.default_rng([11, rank])
            a = (rng.standard_normal(1_048_583) * 4).astype(np_dtype)  # a prime: blocks of odd ends
            t = to_tensor(a, device)
            t.add_(0)  # torch's own parallel op first: its team is up, as after a backward pass
            first_team = first_team or set(threads())
            assert hfr.allreduce(t, op) is t
            cases.append((f"{torch_dtype} {op}", a, op, t))
    assert ("hfr-kernels" in threads().values()) != team, f"torch's team {'un' if team else ''}used"
    if team:  # the whole team ran each call: no thread of it ended for torch's next op to start again
        assert first_team <= set(threads()), "threads of torch's team ended between calls"
        torch.set_num_threads(hfr_threads)
        assert threads_of_a_new_thread(torch.ones(1 << 20)) == hfr_threads, "a new thread's team is not torch's size"
    for name, a, op, t in cases:
        assert bits(t) == bits(hfr.allreduce(a, op)), f"{name}: the team's result differs from the NumPy path's"
    assert "hfr-kernels" in threads().values(), "NumPy calls run on hfr's pool"


def check_refused(device: torch.device) -> None:
    """Bad tensors raise TypeError/ValueError on the calling rank and are left as they were."""
    leaf = torch.ones(5, device=device, requires_grad=True)
    cases = [
        (torch.ones(4, 6, device=device).t(), ValueError, "not contiguous"),
        (torch.ones(5, dtype=torch.bool, device=device), TypeError, "unsupported dtype torch.bool"),
        (torch.ones(5, dtype=torch.complex64, device=device), TypeError, "unsupported dtype"),
        (leaf, ValueError, "requires grad"),
    ]
    for x, error, words in cases:
        before = bits(x.detach().contiguous())
        try:
            hfr.allreduce(x)
        except error as e:
            assert words in str(e), f"{e!r} does not say {words!r}"
        else:
            raise AssertionError(f"{x.dtype} {tuple(x.shape)}: no {error.__name__}")
        assert bits(x.detach().contiguous()) == before, "a refused tensor was modified"
    with torch.no_grad():  # under no_grad a leaf that requires grad may be written, as with torch's in-place ops
        version = leaf._version
        hfr.allreduce(leaf)
        assert torch.equal(leaf, torch.full_like(leaf, size)) and leaf._version > version
    try:
        hfr.allreduce(torch.ones(5, device=device), out=np.ones(5, np.float32))
    except ValueError as e:
        assert "out is a numpy array" in str(e), e
    else:
        raise AssertionError("a numpy out for a tensor x was accepted")


def same_on_every_rank(model: torch.nn.Module) -> bool:
    mine = b"".join(bits(p.detach()) for p in model.parameters())
    return len(set(world.allgather(mine))) == 1


def check_ddp(device: torch.device) -> None:
    hfr.torch.init_process_group("gloo")
    comm = hfr.Communicator()
    configs = [  # (dtype, bucket_cap_mb, gradient_as_bucket_view, rtol, atol)
        (torch.float32, 25.0, False, 1e-5, 1e-6),
        (torch.float32, 0.01, True, 1e-5, 1e-6),  # ~2600-float buckets cut at parameter boundaries
        (torch.bfloat16, 0.01, False, 2e-2, 2e-3),
        (torch.float16, 0.01, True, 2e-3, 2e-4),
    ]
    for dtype, cap, view, rtol, atol in configs:
        what = f"{dtype}, bucket_cap_mb {cap}, gradient_as_bucket_view {view}"
        kwargs = dict(steps=4, device=device, dtype=dtype, bucket_cap_mb=cap, gradient_as_bucket_view=view)
        ours, theirs = train("hfr-hook", **kwargs), train("gloo", **kwargs)
        assert same_on_every_rank(ours.model), f"{what}: ranks' parameters differ"
        for p, q in zip(ours.model.parameters(), theirs.model.parameters()):
            torch.testing.assert_close(p, q, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
    check_hook_variants(device, comm)
    comm.close()
    dist.destroy_process_group()


def check_hook_variants(device: torch.device, comm: hfr.Communicator) -> None:
    """sum_allreduce_hook gives size × the average; an explicit Communicator as the state; gradients of
    one backward pass against torch's own."""
    grads = {}
    for name, state, hook in [("avg", None, hfr.torch.allreduce_hook), ("sum", comm, hfr.torch.sum_allreduce_hook),
                              ("torch", None, None)]:
        torch.manual_seed(0)
        model = torch.nn.Linear(13, 7).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        ddp(torch.full((3, 13), float(rank + 1), device=device)).square().sum().backward()
        grads[name] = [p.grad.clone() for p in model.parameters()]
    for avg, total, reference in zip(grads["avg"], grads["sum"], grads["torch"]):
        torch.testing.assert_close(avg, reference)
        torch.testing.assert_close(total, avg * size)


def check_backend(device: torch.device) -> None:
    hfr.torch.init_process_group("hfr")
    assert dist.get_backend() == "hfr", dist.get_backend()
    gloo = dist.new_group(backend="gloo")

    def both(call, *tensors, compared_on=None):
        """call(tensors, group) through hfr and through gloo, on copies: the same results, bit for bit
        (the values are small integers: every order of summing gives the same floats), on every rank or
        only on rank compared_on (a reduce's root: torch leaves the other ranks' tensors undefined)."""
        ours, theirs = [t.clone() for t in tensors], [t.clone() for t in tensors]
        call(ours, None)
        call(theirs, gloo)
        if compared_on is not None and rank != compared_on:
            return ours
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b), f"{call}: {a} differs from gloo's {b}"
        return ours

    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        for k in (0, 1, 7, 1001):
            x = ((torch.arange(k * size) * (rank + 3)) % 11 - 5).to(dtype).to(device)
            shard = x[:k].clone()
            ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
            for op in ops:
                both(lambda t, g: dist.all_reduce(t[0], op=op, group=g), x)
                both(lambda t, g: dist.reduce(t[0], dst=size - 1, op=op, group=g), x, compared_on=size - 1)
                both(lambda t, g: dist.reduce_scatter_tensor(t[0], t[1], op=op, group=g), shard, x)
                both(lambda t, g: dist.reduce_scatter(t[0], list(t[1:]), op=op, group=g), shard, *x.chunk(size) if k else [shard] * size)
            both(lambda t, g: dist.broadcast(t[0], src=size - 1, group=g), x)
            both(lambda t, g: dist.all_gather_into_tensor(t[0], t[1], group=g), x, shard)
            both(lambda t, g: dist.all_gather(list(t[1:]), t[0], group=g), shard, *[torch.empty_like(shard)] * size)
            if dtype.is_floating_point:  # gloo has no AVG: the sum over size
                mean = x.clone()
                dist.all_reduce(mean, op=dist.ReduceOp.AVG)
                total = x.clone()
                dist.all_reduce(total, group=gloo)
                torch.testing.assert_close(mean, (total.double() / size).to(dtype), rtol=0, atol=0)
    # async Works: wait() and get_future() as torch's
    t = torch.full((5,), float(rank + 1), device=device)
    work = dist.all_reduce(t, async_op=True)
    assert work.get_future().wait()[0] is not None and work.wait()
    assert torch.equal(t, torch.full_like(t, size * (size + 1) / 2))
    out = torch.empty(3 * size, device=device)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=device), async_op=True).wait()
    assert torch.equal(out, torch.arange(size, device=device).float().repeat_interleave(3))
    dist.barrier()
    # A tensor that requires grad is reduced as gloo reduces it, grad mode on or off, its version bumped.
    for grad_mode in (True, False):
        leaf = torch.full((5,), float(rank + 1), device=device, requires_grad=True)
        version = leaf._version
        with torch.set_grad_enabled(grad_mode):
            dist.all_reduce(leaf)
        assert torch.equal(leaf.detach(), torch.full((5,), size * (size + 1) / 2, device=device))
        assert leaf._version > version and leaf.requires_grad, f"grad mode {grad_mode}: version or requires_grad"
    # What hfr does not do goes to gloo: all_to_all, send/recv, gather, a bitwise op.
    if device.type == "cpu":
        a = torch.arange(size, dtype=torch.float32) + 10 * rank
        b = torch.empty(size)
        dist.all_to_all_single(b, a)
        assert torch.equal(b, torch.arange(size) * 10.0 + rank)
        flags = torch.tensor([1 << rank], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.BOR)
        assert flags.item() == (1 << size) - 1
        if size > 1:
            if rank == 0:
                dist.send(torch.tensor([42.0]), dst=1)
            elif rank == 1:
                got = torch.zeros(1)
                dist.recv(got, src=0)
                assert got.item() == 42.0
    # Bad tensors: clear errors on the calling rank, nothing modified.
    for bad, error, words in [(torch.ones(4, 6, device=device).t(), ValueError, "not contiguous"),
                              (torch.ones(5, dtype=torch.bool, device=device), TypeError, "unsupported dtype"),
                              (torch.ones(5, device="meta"), TypeError, "dense CPU or CUDA tensor")]:
        try:
            dist.all_reduce(bad)
        except error as e:
            assert words in str(e), e
        else:
            raise AssertionError(f"{bad.dtype} on {bad.device}: no {error.__name__}")
    try:
        dist.all_gather_into_tensor(torch.empty(3 * size + 1, device=device), torch.ones(3, device=device))
    except ValueError as e:
        assert f"over {size} ranks needs out" in str(e), e
    else:
        raise AssertionError("an all_gather of the wrong size was taken")
    dist.destroy_process_group()


def count_hfr_calls(group: dist.ProcessGroup) -> collections.Counter:
    """Counts the calls the backend group makes on its hfr.Communicator, by method."""
    calls = collections.Counter()
    for name in ("allreduce_async", "allgather_async", "reduce_scatter_async", "broadcast_async"):
        def counted(*args, _method=getattr(group.hfr, name), _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)
        setattr(group.hfr, name, counted)
    return calls


def check_training(device: torch.device) -> None:
    hfr.torch.init_process_group("hfr")
    calls = count_hfr_calls(dist.distributed_c10d._get_default_group())
    gloo = dist.new_group(backend="gloo")
    kwargs = dict(steps=3, device=device, dtype=torch.float32, bucket_cap_mb=0.01)
    ours, theirs = train("hfr", **kwargs), train("gloo", group=gloo, **kwargs)
    for p, q in zip(ours.model.parameters(), theirs.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)
    assert calls["allreduce_async"] >= 3, f"DDP did not reduce its buckets through hfr: {calls}"  # one a step at least
    calls.clear()
    sizes = dict(vocab=64, width=32, layers=2, heads=2, context=16)
    ours = fsdp_train.train("hfr", 3, device, batch=4, **sizes)[0]
    theirs = fsdp_train.train("gloo", 3, device, batch=4, mesh=DeviceMesh.from_group(gloo, device.type), **sizes)[0]
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p.full_tensor(), q.full_tensor(), rtol=1e-5, atol=1e-5)
    # 3 FSDP groups (2 layers and the root): gathered for forward and backward, reduce-scattered once a step
    assert calls["allgather_async"] >= 3 * 3 and calls["reduce_scatter_async"] >= 3 * 3, f"FSDP2 missed hfr: {calls}"
    dist.destroy_process_group()


def main() -> None:
    mode, device = sys.argv[1], torch.device(sys.argv[2])
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    {"tensors": check_tensors, "ddp": check_ddp, "backend": check_backend, "training": check_training,
     "team": check_team}[mode](device)
    world.Barrier()
    if rank == 0:
        print(f"torch {mode} ok")


main()
