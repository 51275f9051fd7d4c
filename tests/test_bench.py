"""The benchmark harness (bench/allreduce_perf.py): its checking in process, then real runs on 2 ranks."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bench.perf.collectives import COLLECTIVES, DTYPES, count_wrong, poison, rank_input
from bench.perf.harness import parse_args, parse_size, sweep_sizes
from tests.mpirun import REPO, mpiexec, run_mpi

SCRIPT = str(REPO / "bench" / "allreduce_perf.py")
TINY = ["-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1"]
NUMBER_COLUMNS = ("time", "algbw", "busbw", "#wrong")
# DeepSpeed's shm op is built on first use (35-85 s on the shared 2-core dev VM, then cached): it needs both
NO_DEEPSPEED = importlib.util.find_spec("deepspeed") is None or shutil.which(os.environ.get("CXX", "c++")) is None


def table_rows(output: str) -> list[dict]:
    """The data rows of the printed table: backend size count type redop root, then out-of-place and
    in-place time algbw busbw #wrong."""
    rows = []
    for line in output.splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) != 14 or not fields[1].isdigit():
            continue
        row = dict(zip(("backend", "size", "count", "type", "redop", "root"), fields))
        for placement, values in (("oop", fields[6:10]), ("ip", fields[10:14])):
            row.update({f"{placement} {name}": value for name, value in zip(NUMBER_COLUMNS, values)})
        rows.append(row)
    return rows


def test_parse_size_and_sweep():
    assert [parse_size(s) for s in ("8", "64K", "16M", "1G")] == [8, 64 << 10, 16 << 20, 1 << 30]
    assert sweep_sizes(8, 64 << 20, 4, 4) == [8 * 4**k for k in range(12)]
    assert sweep_sizes(6, 6, 1, 4) == [4]
    with pytest.raises(SystemExit):
        parse_args(["-b", "8", "-e", "64", "-f", "1"])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", ["sum", "prod", "max"])
def test_inputs_are_per_rank_and_the_expected_result_is_exact(dtype, op):
    dt = DTYPES[dtype]
    inputs = [rank_input(1000, dt, op, seed=3, rank=r) for r in range(4)]
    assert np.array_equal(inputs[0], rank_input(1000, dt, op, seed=3, rank=0))  # rebuilt alike
    assert not np.array_equal(inputs[0], inputs[1])
    expected = COLLECTIVES["allreduce"].expected(inputs.__getitem__, 4, 0, 0, op, dt)
    by_numpy = {"sum": np.sum, "prod": np.prod, "max": np.max}[op](np.stack(inputs).astype(np.float64), axis=0)
    assert count_wrong(expected, by_numpy.astype(dt)) == 0


def test_reduce_and_broadcast_expect_the_root():
    dt = DTYPES["int32"]
    inputs = [np.full(3, r + 1, dt) for r in range(3)]
    reduce, broadcast = COLLECTIVES["reduce"], COLLECTIVES["broadcast"]
    assert reduce.expected(inputs.__getitem__, 3, 1, 1, "sum", dt).tolist() == [6, 6, 6]
    assert reduce.expected(inputs.__getitem__, 3, 0, 1, "sum", dt) is None
    assert broadcast.expected(inputs.__getitem__, 3, 0, 2, "sum", dt).tolist() == [3, 3, 3]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_poisoned_output_counts_as_wrong(dtype):
    expected = rank_input(100, DTYPES[dtype], "sum", seed=1, rank=0)
    output = expected.copy()
    poison(output)
    assert count_wrong(output, expected) == 100


def test_peers_report_columns_json_csv_and_plot(tmp_path):
    out = run_mpi(2, SCRIPT, *TINY, "--backends", "mpi,gloo,mpi-staged,nccl", "--json", str(tmp_path / "r.json"),
                  "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "r.png"), timeout=60).stdout
    assert "size" in out and "algbw" in out and "busbw" in out and "#wrong" in out
    assert "# backend mpi-staged: skipped:" in out and "# backend nccl: skipped:" in out
    rows = table_rows(out)
    backends = {r["backend"] for r in rows}
    assert "mpi" in backends
    assert backends <= {"mpi", "gloo"}
    assert {int(r["size"]) for r in rows} == {8, 64, 512, 4096}
    assert all(r["oop #wrong"] == "0" and r["ip #wrong"] == "0" for r in rows)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["layout"]["ranks"] == 2 and len(doc["results"]) == 2 * len(rows)
    assert (tmp_path / "r.csv").read_text().startswith("backend,")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_fails_before_anything_runs(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit):
        parse_args([*TINY, "--plot", "x.png"])
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_one_rank_failing_ends_the_job_without_mpi4py_run(tmp_path):
    """Started as plain `python script` (no -m mpi4py): rank 0 alone fails writing its JSON at the end,
    while the others finish; the job must still end, non-zero."""
    cmd = mpiexec() + ["-n", "2", sys.executable, SCRIPT, *TINY, "--backends", "hfr,mpi", "--json", "/proc/no/such/dir/r.json"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0 and "Traceback" in proc.stderr + proc.stdout


def test_a_wrong_backend_is_caught():
    proc = run_mpi(2, SCRIPT, *TINY, "--backends", "wrong", timeout=60, check=False)
    rows = table_rows(proc.stdout)
    assert rows and all(int(r["oop #wrong"]) > 0 and int(r["ip #wrong"]) > 0 for r in rows), proc.stdout
    assert "FAILED" in proc.stdout and proc.returncode != 0


@pytest.mark.parametrize("collective,dtype,op", [("allreduce", "float32", "sum"), ("allreduce", "bfloat16", "avg"),
                                                 ("reduce", "int8", "prod"), ("broadcast", "float64", "sum")])
def test_hfr_and_mpi_are_right(collective, dtype, op):
    """Two emulated nodes; reduce and broadcast with root 1, so a root-0 assumption shows."""
    out = run_mpi(2, SCRIPT, *TINY, "--collective", collective, "-d", dtype, "-o", op, "-r", "1",
                  "--backends", "hfr,mpi", env={"HFR_LOCAL_SIZE": "1"}, timeout=60).stdout
    rows = table_rows(out)
    assert "hfr" in {r["backend"] for r in rows}
    assert all(r[f"{p} #wrong"] in ("0", "n/a") for r in rows for p in ("oop", "ip")), out
    if collective != "allreduce":
        assert all(r["root"] == "1" for r in rows)
    if dtype != "bfloat16":  # MPI has no bfloat16 reduction: no peer to compare with
        assert "hfr speedup over the best peer" in out


@pytest.mark.parametrize("collective,op", [("reduce_scatter", "sum"), ("reduce_scatter", "avg"), ("allgather", "sum")])
@pytest.mark.parametrize("nprocs", [2, 3])
def test_fsdp_collectives_against_every_host_peer(collective, op, nprocs):
    """reduce_scatter and allgather for hfr, MPI and gloo, out of place and in place (the smaller buffer
    this rank's slice of the larger, as nccl-tests and FSDP do): every row run, nothing wrong."""
    out = run_mpi(nprocs, SCRIPT, "-b", "4", "-e", "64K", "-f", "64", "-n", "2", "-w", "1", "--collective",
                  collective, "-o", op, "--backends", "hfr,mpi,gloo", timeout=120).stdout
    rows = table_rows(out)
    assert {r["backend"] for r in rows} == {"hfr", "mpi", "gloo"}, out
    assert all(r[f"{p} #wrong"] == "0" for r in rows for p in ("oop", "ip")), out
    assert {int(r["count"]) % nprocs for r in rows} == {0}  # the larger buffer's count, n x k


@pytest.mark.parametrize("local_size,parts", [(None, {"hfr", "c", "mpi"}),
                                              (1, {"hfr", "c", "vote", "doubling", "mpi"})])
def test_call_parts_times_every_part(local_size, parts):
    """bench/call_parts.py on one node and on 2 emulated nodes: one line with every part's time."""
    env = {"HFR_LOCAL_SIZE": str(local_size)} if local_size else {}
    out = run_mpi(2, str(REPO / "bench" / "call_parts.py"), "--calls", "50", "--rounds", "1", env=env,
                  timeout=120).stdout
    line = [ln for ln in out.splitlines() if ln and not ln.startswith("#")][-1].split()
    times = dict(zip(line[::2], map(float, line[1::2])))
    assert set(times) == parts and all(t > 0 for t in times.values()), out


@pytest.mark.parametrize("local_size", [None, 1])
def test_chunk_steps_times_every_step_of_every_chunk(local_size):
    """bench/chunk_steps.py on one node and on 2 emulated nodes, a call of 4 chunks: a line a step, its times
    (median and mean) on rank 0 and the largest; on one node the reduce and the copy out take time and crossing none, across
    nodes of one rank crossing does (the in-place call's chunks are made in x itself: nothing to reduce or
    copy out)."""
    from hfr._node_call import STEP_MARKS

    env = {"HFR_CHUNK_BYTES": "256K", "HFR_CACHE_BYTES": "0", **({"HFR_LOCAL_SIZE": str(local_size)} if local_size else {})}
    out = run_mpi(2, str(REPO / "bench" / "chunk_steps.py"), "--bytes", "1M", "--calls", "3", env=env,
                  timeout=120).stdout
    assert "in 4 chunk(s) of 262144 B" in out, out
    # per step: the median on rank 0, the largest, its rank, the mean on rank 0, the largest mean
    rows = {" ".join(ln.split()[:-5]): ln.split()[-5:] for ln in out.splitlines() if ln.startswith("  ")}
    assert list(rows) == list(STEP_MARKS[1:]), out
    took = {step for step, (_, largest, _, _, _) in rows.items() if float(largest) > 0}
    assert took >= ({"crossed"} if local_size == 1 else {"reduced", "copied out"}), out
    assert ("crossed" in took) == (local_size == 1), out


def test_torch_tensors_for_hfr_and_gloo():
    """--array torch: hfr and gloo on CPU tensors (bfloat16 through an int16 view), MPI skipped with the reason."""
    out = run_mpi(2, SCRIPT, *TINY, "--array", "torch", "-d", "bfloat16", "--backends", "hfr,gloo,mpi",
                  timeout=60).stdout
    rows = table_rows(out)
    assert {r["backend"] for r in rows} == {"hfr", "gloo"}, out
    assert all(r[f"{p} #wrong"] == "0" for r in rows for p in ("oop", "ip")), out
    assert "# backend mpi: skipped: takes NumPy arrays: use --array numpy" in out


@pytest.mark.skipif(NO_DEEPSPEED, reason="needs deepspeed==0.19.8, ninja and a C++ compiler")
@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_deepspeed_peer_is_timed_in_place_and_right(array):
    """DeepSpeed's shm allreduce beside hfr on 2 ranks, below and above its 1 MiB switch between algorithms:
    in-place rows checked, out-of-place ones n/a with the reason."""
    out = run_mpi(2, SCRIPT, "-b", "8", "-e", "2M", "-f", "64", "-n", "2", "-w", "1", "--array", array,
                  "--backends", "hfr,deepspeed", timeout=300).stdout
    rows = table_rows(out)
    deepspeed = [r for r in rows if r["backend"] == "deepspeed"]
    assert {r["backend"] for r in rows} == {"hfr", "deepspeed"}, out
    assert [int(r["size"]) for r in deepspeed] == [8, 512, 32768, 2097152]
    assert all(r["oop time"] == "n/a" and r["ip #wrong"] == "0" for r in deepspeed), out
    assert all(r["oop #wrong"] == "0" and r["ip #wrong"] == "0" for r in rows if r["backend"] == "hfr"), out
    assert "# backend deepspeed: out-of-place n/a: in place only" in out and "shm op for float32" in out


def test_deepspeed_missing_is_skipped_with_how_to_install(tmp_path):
    """Where deepspeed cannot be imported (here: shadowed by one that fails), its rows are skipped with the
    pip line, and hfr's still run."""
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "__init__.py").write_text("raise ImportError(\"No module named 'deepspeed'\")\n")
    out = run_mpi(2, SCRIPT, *TINY, "--backends", "hfr,deepspeed", env={"PYTHONPATH": f"{tmp_path}:{REPO}"},
                  timeout=60).stdout
    assert "# backend deepspeed: skipped: No module named 'deepspeed': pip install deepspeed==0.19.8 ninja" in out
    assert {r["backend"] for r in table_rows(out)} == {"hfr"}, out


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_calls_times_every_way_of_calling_from_torch():
    """bench/torch_calls.py on 2 ranks: one row a size, every way's time and the four ratios, each way checked."""
    out = run_mpi(2, str(REPO / "bench" / "torch_calls.py"), "-b", "8", "-e", "64K", "-f", "64", "--calls", "20",
                  "--rounds", "1", timeout=180).stdout
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [8, 512, 32768], out
    assert all(len(r) == 10 and all(float(v.rstrip("x")) > 0 for v in r[1:]) for r in rows), out
