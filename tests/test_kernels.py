"""Every kernel backend against the in-order NumPy reference, bit for bit; bad arguments leave out untouched."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hfr import kernels
from hfr.kernels import _reduce_numpy, available_backends, reduce_into
from hfr.ops import DTYPES, Op

# the reference warns where values overflow or meet NaN; that is what these tests feed it
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
OPS = [Op.SUM, Op.MAX, Op.MIN, Op.PROD]
CPUS = os.cpu_count() or 1


def backend_param(name: str) -> str:
    if kernels._load(name) is None:
        pytest.skip(f"kernel backend {name} is not available (extension not built or numba missing)")
    return name


@pytest.fixture(params=kernels.BACKENDS)
def backend(request) -> str:
    return backend_param(request.param)


def random_array(dtype: np.dtype, n: int, rng: np.random.Generator, specials: bool = True) -> np.ndarray:
    """Random values of dtype; floats get a sprinkle of NaN, +-inf and +-0 when specials."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    a = (rng.standard_normal(n) * rng.choice([1e-6, 1.0, 1e3], n)).astype(dtype)
    if specials and n > 0:
        where = rng.integers(0, n, max(1, n // 100))
        a[where] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]), where.size).astype(dtype)
    return a


def poisoned(dtype: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.frombuffer(rng.bytes(n * np.dtype(dtype).itemsize), dtype).copy()


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bits, except that any NaN matches any NaN (payloads are the hardware's business)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind == "f" or got.dtype == ml_dtypes.bfloat16:
        nan_got, nan_want = np.isnan(got), np.isnan(want)
        np.testing.assert_array_equal(nan_got, nan_want, err_msg="NaN in different places")
        got, want = got[~nan_got], want[~nan_want]
    bits = np.dtype(f"u{got.dtype.itemsize}")
    bad = np.flatnonzero(got.view(bits) != want.view(bits))
    assert bad.size == 0, f"{bad.size} elements differ, first at {bad[0]}: got {got[bad[0]]!r}, want {want[bad[0]]!r}"


def reference(inputs: list[np.ndarray], op: Op) -> np.ndarray:
    want = np.empty_like(inputs[0])
    _reduce_numpy(want, inputs, op, 1)
    return want


def check(backend: str, inputs: list[np.ndarray], op: Op, threads: int, rng, alias: bool = False) -> None:
    want = reference(inputs, op)
    if alias:
        out = inputs[0]
    else:
        out = poisoned(inputs[0].dtype, inputs[0].size, rng)
    assert reduce_into(out, inputs, op, backend=backend, threads=threads) is out
    assert_same_bits(out, want)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference(backend, dtype, op):
    rng = np.random.default_rng([DTYPES.index(dtype), OPS.index(op)])
    for n in (0, 1, 7, 100003):
        for k in (1, 2, 3, 5, 7, 8, 9):  # a sum out of place folds 2, 2 + 1, 4 + 1, 4 + 3, 8, 8 + 1 inputs a pass
            check(backend, [random_array(dtype, n, rng) for _ in range(k)], op, CPUS, rng)


FLOATS = [d for d in DTYPES if d.kind == "f" or d == ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_avg_matches_reference(backend, dtype):
    """avg: the sum divided by the divisor in the accumulation type, rounded once."""
    rng = np.random.default_rng([DTYPES.index(dtype), 9])
    for n in (0, 1, 7, 100003, 300007):
        for k, divisor in ((1, 1), (1, 4), (2, 2), (3, 7), (4, 4), (7, 3), (8, 8)):
            inputs = [random_array(dtype, n, rng) for _ in range(k)]
            want = np.empty_like(inputs[0])
            _reduce_numpy(want, inputs, Op.AVG, 1, divisor)
            for out in (poisoned(dtype, n, rng), inputs[0]):  # out of place, and out is inputs[0]
                assert reduce_into(out, inputs, "avg", backend=backend, threads=CPUS, divisor=divisor) is out
                assert_same_bits(out, want)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=str)
def test_half_avg_is_the_float32_mean_rounded_once(backend, dtype):
    """No overflow where the float32 sum fits (float16: 3 x 65504), and one rounding, not two."""
    rng = np.random.default_rng(5)
    inputs = [random_array(dtype, 100003, rng, specials=False) for _ in range(3)]
    top = float(ml_dtypes.finfo(dtype).max)
    for x in inputs:
        x[:4] = np.array([top, -top, 40000.0, top / 2], np.float32).astype(dtype)
    out = reduce_into(np.empty_like(inputs[0]), inputs, "avg", backend=backend, threads=CPUS)
    mean32 = (inputs[0].astype(np.float32) + inputs[1].astype(np.float32) + inputs[2].astype(np.float32)) / np.float32(3)
    assert_same_bits(out, mean32.astype(dtype))
    if dtype == np.float16:
        assert np.isfinite(out).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_out_is_inputs0_and_unaligned_views(backend, dtype):
    rng = np.random.default_rng(1)
    for k in (1, 2, 5):
        check(backend, [random_array(dtype, 100003, rng) for _ in range(k)], Op.SUM, CPUS, rng, alias=True)
        # a[1:] starts one element in; a view of bytes at offset 1 is not even aligned to the itemsize
        check(backend, [random_array(dtype, 100004, rng)[1:] for _ in range(k)], Op.MAX, CPUS, rng)
        n, size = 70001, np.dtype(dtype).itemsize
        odd = [np.frombuffer(rng.bytes(n * size + 1), np.uint8)[1:].view(dtype).copy() for _ in range(k)]
        raw = [np.empty(n * size + 1, np.uint8)[1:].view(dtype) for _ in range(k)]
        for r, o in zip(raw, odd):
            r[...] = o
        check(backend, raw, Op.SUM, CPUS, rng, alias=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int64], ids=str)
def test_every_thread_count(backend, dtype):
    rng = np.random.default_rng(2)
    inputs = [random_array(dtype, 300007, rng) for _ in range(3)]
    for threads in [*range(1, CPUS + 1), CPUS + 1, 7]:
        check(backend, inputs, Op.SUM, threads, rng)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16], ids=str)
def test_nan_and_inf_propagate(backend, dtype):
    nan, inf = np.nan, np.inf
    cols = [(1, nan, 2), (nan, 1, 2), (1, 2, nan), (inf, -inf, 1), (inf, 1, 2), (-inf, nan, 1), (0.0, -0.0, -0.0)]
    inputs = [np.array(c, dtype) for c in zip(*cols)]
    for op in OPS:
        out = np.full(len(cols), 7, dtype)
        reduce_into(out, inputs, op, backend=backend, threads=1)
        assert_same_bits(out, reference(inputs, op))
        assert np.isnan(out[:3]).all(), f"{op.value} lost a NaN: {out}"


def test_integers_wrap(backend):
    cases = [
        (np.int8, [127, 1], Op.SUM, -128), (np.uint8, [255, 1], Op.SUM, 0), (np.int8, [-128, -1], Op.SUM, 127),
        (np.int32, [2**31 - 1, 1], Op.SUM, -(2**31)), (np.int64, [2**63 - 1, 2], Op.SUM, -(2**63) + 1),
        (np.int64, [2**62, 4], Op.PROD, 0), (np.int8, [16, 16], Op.PROD, 0), (np.uint8, [255, 255], Op.PROD, 1),
        (np.int32, [-(2**31), -1], Op.PROD, -(2**31)), (np.int8, [-128, 127], Op.MAX, 127),
    ]
    for dtype, values, op, want in cases:
        inputs = [np.full(1000, v, dtype) for v in values]
        out = np.zeros(1000, dtype)
        reduce_into(out, inputs, op, backend=backend, threads=1)
        assert (out == np.array(want, dtype)).all(), (np.dtype(dtype), values, op, out[0])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=str)
def test_half_conversions_every_bit_pattern(backend, dtype):
    """k=1 round-trips all 65536 patterns; sums and products of them hit every rounding case."""
    rng = np.random.default_rng(3)
    every = np.arange(2**16, dtype=np.uint16).view(dtype)
    check(backend, [every], Op.SUM, CPUS, rng)
    for op in (Op.SUM, Op.PROD):
        for _ in range(3):
            check(backend, [every, rng.permutation(every)], op, CPUS, rng)


@settings(max_examples=60, deadline=None)
@given(
    backend_name=st.sampled_from(kernels.BACKENDS),
    dtype=st.sampled_from(DTYPES),
    op=st.sampled_from(OPS),
    n=st.integers(0, 3000),
    k=st.integers(1, 9),
    offset=st.integers(0, 3),
    threads=st.integers(1, CPUS + 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes(backend_name, dtype, op, n, k, offset, threads, seed):
    if kernels._load(backend_name) is None:
        return
    rng = np.random.default_rng(seed)
    inputs = [random_array(dtype, n + offset, rng)[offset:] for _ in range(k)]
    check(backend_name, inputs, op, threads, rng, alias=bool(seed & 1))


def _simd_levels() -> list[str]:
    """The SIMD levels of the Cython kernels this build has and this CPU runs (none without them)."""
    if kernels._load("cython") is None:
        return []
    from hfr import _kernels

    return _kernels.simd_levels()


@pytest.fixture(params=_simd_levels())
def simd_level(request):
    """The Cython kernels forced to run one SIMD level, then back to the one picked at import."""
    from hfr import _kernels

    picked = _kernels.simd()
    _kernels.use_simd(request.param)
    yield request.param
    _kernels.use_simd(picked)


def test_every_simd_level_gives_the_reference_bits(simd_level):
    """Each level this CPU runs, forced: every dtype and op (avg too), vector loops and their tails, and
    every half-type bit pattern, bit for bit (a NaN matches any NaN: its payload is the hardware's)."""
    rng = np.random.default_rng(6)
    for dtype in DTYPES:
        for k in (1, 2, 3, 4, 7, 8):  # 300007 elements: from 4-byte types on, out is written with streaming stores
            inputs = [random_array(dtype, 300007, rng) for _ in range(k)]
            for op in OPS:
                check("cython", inputs, op, 1, rng)
            check("cython", [x.copy() for x in inputs], Op.SUM, 1, rng, alias=True)  # in place: a sum's other passes
            if dtype in FLOATS:
                want = np.empty_like(inputs[0])
                _reduce_numpy(want, inputs, Op.AVG, 1, 4)
                out = reduce_into(np.empty_like(want), inputs, "avg", backend="cython", threads=1, divisor=4)
                assert_same_bits(out, want)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        every = np.arange(2**16, dtype=np.uint16).view(dtype)
        check("cython", [every, rng.permutation(every)], Op.SUM, 1, rng)


def test_half_type_sums_streamed_into_out(simd_level):
    """float16 and bfloat16 sums (avg too) of more than 1 MiB, whose out is written with streaming stores
    from a scratch tile, on each level: the reference bits, in place and out of place."""
    rng = np.random.default_rng(11)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for k in (2, 5, 8):
            inputs = [random_array(dtype, 600_001, rng) for _ in range(k)]
            check("cython", inputs, Op.SUM, 2, rng)
            check("cython", [x.copy() for x in inputs], Op.SUM, 2, rng, alias=True)
            want = np.empty_like(inputs[0])
            _reduce_numpy(want, inputs, Op.AVG, 1, k)
            assert_same_bits(reduce_into(np.empty_like(want), inputs, "avg", backend="cython", threads=2, divisor=k),
                             want)


def test_half_type_sums_of_short_runs_and_many_inputs(simd_level):
    """float16 and bfloat16 sums (avg too) of 0 to 70 elements, unaligned, of 1 to 17 inputs, on each level: the
    vector sums' last elements (fewer than a vector: padded copies) and their loops over inputs."""
    rng = np.random.default_rng(12)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for n in (0, 1, 7, 15, 16, 17, 31, 33, 70):
            for k in (1, 2, 17):
                inputs = [random_array(dtype, n + 1, rng)[1:] for _ in range(k)]
                check("cython", inputs, Op.SUM, 1, rng)
                want = np.empty_like(inputs[0])
                _reduce_numpy(want, inputs, Op.AVG, 1, 3)
                assert_same_bits(reduce_into(np.empty_like(want), inputs, "avg", backend="cython", threads=1,
                                             divisor=3), want)


def test_simd_level_in_use():
    backend_param("cython")
    from hfr import _kernels

    assert kernels.simd() == _kernels.simd() == _kernels.simd_levels()[0]
    with pytest.raises(ValueError, match="SIMD level 'sse9'"):
        _kernels.use_simd("sse9")


def bad_calls(dtype=np.float32, n=1000):
    """(name, out, inputs, op, message fragment): each call must fail without touching out."""
    rng = np.random.default_rng(4)
    x = lambda: random_array(dtype, n, rng)  # noqa: E731
    read_only = x()
    read_only.flags.writeable = False
    shared = x()
    buf = random_array(dtype, 2 * n, rng)
    return [
        ("size", x(), [x(), random_array(dtype, n + 1, rng)], "sum", "elements"),
        ("dtype", x(), [x(), x().astype(np.float64)], "sum", "dtype"),
        ("complex", np.zeros(n, np.complex64), [np.zeros(n, np.complex64)], "sum", "unsupported dtype"),
        ("bool", np.zeros(n, bool), [np.zeros(n, bool)], "sum", "unsupported dtype"),
        ("read-only", read_only, [x()], "sum", "read-only"),
        ("non-contiguous out", buf[::2], [x()], "sum", "not C-contiguous"),
        ("non-contiguous input", x(), [x(), buf[::2]], "sum", "not C-contiguous"),
        ("empty", x(), [], "sum", "empty"),
        ("not a sequence", x(), x(), "sum", "sequence"),
        ("out is inputs[1]", shared, [x(), shared], "sum", "overlaps inputs[1]"),
        ("out overlaps inputs[1]", buf[:n], [x(), buf[n // 2:n // 2 + n]], "sum", "overlaps inputs[1]"),
        ("out partly overlaps inputs[0]", buf[:n], [buf[1:n + 1]], "sum", "partly overlaps"),
        ("op", x(), [x()], "xor", "unknown op"),
        ("avg on integers", np.ones(n, np.int32), [np.ones(n, np.int32)], "avg", "needs a float dtype"),
        ("divisor 0", x(), [x()], "avg", "divisor must be an integer >= 1, got 0"),
        ("list", [1.0] * n, [x()], "sum", "numpy.ndarray"),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())), ids=[c[0] for c in bad_calls()])
def test_bad_arguments_leave_out_untouched(backend, case):
    name, out, inputs, op, fragment = bad_calls()[case]
    before = np.array(out, copy=True)
    with pytest.raises((TypeError, ValueError), match=re.escape(fragment)):
        reduce_into(out, inputs, op, backend=backend, divisor=0 if name == "divisor 0" else None)
    np.testing.assert_array_equal(np.asarray(out), before)


def test_bad_backend_and_threads():
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="unknown kernel backend 'fortran'"):
        reduce_into(x, [x], backend="fortran")
    with pytest.raises(ValueError, match="threads must be >= 1"):
        reduce_into(x, [x], threads=0)


def test_backend_choice(monkeypatch):
    backends = available_backends()
    assert backends[-1] == "numpy" and backends == [b for b in kernels.BACKENDS if b in backends]
    x = np.arange(10, dtype=np.float32)
    monkeypatch.setenv("HFR_KERNEL", "numpy")
    monkeypatch.setitem(kernels._LOADED, "numpy", lambda out, inputs, op, threads, divisor=1: out.fill(42))
    assert (reduce_into(np.empty_like(x), [x, x]) == 42).all()


def test_kernels_work_without_the_cython_backend():
    """With hfr._kernels unimportable, the kernel backends fall back to numba or numpy. (hfr itself needs
    its extensions: the inter-node step runs in hfr/_internode.pyx, which combines with hfr._kernels.)"""
    code = (
        "import sys, numpy as np, hfr\n"
        "from hfr import kernels\n"
        "sys.modules['hfr._kernels'] = None; del hfr._kernels; kernels._LOADED.pop('cython', None)\n"
        "assert 'cython' not in kernels.available_backends(), kernels.available_backends()\n"
        "x = np.arange(5, dtype=np.float32)\n"
        "assert (kernels.reduce_into(np.empty_like(x), [x, x, x]) == 3 * x).all()\n"
        "print(kernels.available_backends()[0])\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("numba", "numpy")


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_cython_pool_serves_concurrent_callers_and_forked_children():
    """The Cython kernels' thread pool: right sums for 4 Python threads calling at once, large calls and
    many small ones (jobs back to back, claimed by threads still spinning from the last), and in a child
    forked after the pool's threads started (the child has none of them)."""
    backend_param("cython")
    rng = np.random.default_rng(5)
    sizes = (400_009, 400_009, 65_537, 65_537)  # 65_537 float32 x 4 arrays: 3 threads' worth of traffic
    cases = [[random_array(np.float32, n, rng, specials=False) for _ in range(3)] for n in sizes]
    results: list = [None] * len(cases)
    wants = [reference(inputs, Op.SUM) for inputs in cases]
    wrong: list = []

    def work(i: int) -> None:
        out = np.empty_like(cases[i][0])
        for call in range(20 if sizes[i] > 100_000 else 500):
            out.fill(np.nan)
            reduce_into(out, cases[i], Op.SUM, backend="cython", threads=3)
            if not np.array_equal(out, wants[i]):
                wrong.append((i, call))
        results[i] = out

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"(thread, call) with a wrong sum: {wrong[:10]}"
    for want, out in zip(wants, results):
        assert_same_bits(out, want)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its threaded sum is right
        out = np.empty_like(cases[0][0])
        reduce_into(out, cases[0], Op.SUM, backend="cython", threads=4)
        os._exit(0 if np.array_equal(out, reference(cases[0], Op.SUM)) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


IDLE_AFTER_CALLS = """
import sys, time
try:
    import torch  # first, as in training scripts: its libgomp is the one that spins
except ImportError:
    pass
import numpy as np
from hfr.kernels import reduce_into
x = np.ones(4 << 20, np.float32)
idle = wall = 0.0
for _ in range(10):
    reduce_into(np.empty_like(x), [x, x], "sum", backend=sys.argv[1], threads=4)
    cpu, start = time.process_time(), time.perf_counter()
    time.sleep(0.05)
    idle, wall = idle + time.process_time() - cpu, wall + time.perf_counter() - start
print(idle / wall)
"""


@pytest.mark.parametrize("name", ["cython", "numba"])
def test_kernel_threads_sleep_between_calls(name):
    """Idle kernel threads cost no CPU (OpenMP's spinning threads starved ranks sharing a host), also
    with torch imported first."""
    backend_param(name)
    share = subprocess.run([sys.executable, "-c", IDLE_AFTER_CALLS, name], capture_output=True, text=True,
                           check=True, timeout=120).stdout
    assert float(share) < 0.1, f"{float(share):.0%} of a core busy between calls"
