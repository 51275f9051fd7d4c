"""Measure the namespace testbed (tests/netns.py) for bench/scaling_model.py: its parameters, and the
allreduce times the model predicts from them (issue 13).

    flock /tmp/hfr-bench.lock .venv/bin/python bench/testbed_measure.py [--out bench/testbed.json]

Needs root and `ip`/`tc` (namespace hosts, tbf-shaped links). It writes one JSON document:
- "params": measured apart from any allreduce, the model's only inputs: link_rate (MPI payload
  bytes/s one way over one shaped link, 16 MiB messages, both directions busy at once),
  link_rate_all_busy (the same with H hosts each sending to the next at once, by H), link_latency (s,
  half the round trip of an 8-byte MPI ping-pong over it), tcp_rate (payload bytes/s the whole VM moves
  over unshaped links with every core busy: 2 host pairs swapping 16 MiB; every node of the testbed
  shares these cores), memcpy_rate and reduce_rate (bytes/s of memory moved, one thread: a 64 MiB
  np.copyto, and hfr's kernel summing 2 float32 arrays of 16 MiB into a third) and cores.
- "runs": bench/allreduce_perf.py across H hosts x L ranks on links shaped to RATE, NumPy float32 sum,
  one row per (backend, size, placement): hfr with each HFR_ALGO, and MPICH ("mpi").
- "commit": the hfr commit measured (re-run after inter-node changes land).
The ranks' part of the parameter runs is this same file under mpiexec (`--worker link|pairs|shift`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import netns  # noqa: E402
from tests.mpirun import mpiexec  # noqa: E402

MESSAGE_BYTES = 16 << 20
CONFIGS = ((2, 1), (4, 1), (4, 2), (8, 1))  # (hosts, ranks per host)
ALGOS = ("dbtree", "ring", "halving")  # doubling (a whole S a step) is for small arrays only
JOB_TIMEOUT_S = 300


# ------------------------------------------------------------------------------------ on the ranks


def _worker_link() -> dict:
    """Ranks 0 and 1 on two hosts: ping-pong latency, then both sending 16 MiB at once (rate each way)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    peer = 1 - comm.rank
    small = np.zeros(8, np.uint8)
    rtts = []
    for _ in range(200):
        comm.Barrier()
        start = time.perf_counter()
        if comm.rank == 0:
            comm.Send(small, peer)
            comm.Recv(small, peer)
        else:
            comm.Recv(small, peer)
            comm.Send(small, peer)
        rtts.append(time.perf_counter() - start)
    send, recv = np.ones(MESSAGE_BYTES, np.uint8), np.empty(MESSAGE_BYTES, np.uint8)
    comm.Sendrecv(send, peer, recvbuf=recv, source=peer)  # warm-up
    times = []
    for _ in range(3):
        comm.Barrier()
        start = time.perf_counter()
        comm.Sendrecv(send, peer, recvbuf=recv, source=peer)
        times.append(time.perf_counter() - start)
    return {"link_latency": statistics.median(rtts) / 2, "link_rate": MESSAGE_BYTES / statistics.median(times)}


def _worker_shift() -> dict:
    """Every rank sends 16 MiB to the next host and receives from the previous one, all at once: the
    rate of one link when every host's link is busy (all hosts share the VM's cores)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    send, recv = np.ones(MESSAGE_BYTES, np.uint8), np.empty(MESSAGE_BYTES, np.uint8)
    comm.Sendrecv(send, right, recvbuf=recv, source=left)
    times = []
    for _ in range(3):
        comm.Barrier()
        start = time.perf_counter()
        comm.Sendrecv(send, right, recvbuf=recv, source=left)
        comm.Barrier()
        times.append(time.perf_counter() - start)
    return {"rate": MESSAGE_BYTES / statistics.median(times)}


def _worker_pairs() -> dict:
    """Ranks 2i and 2i+1 swap 16 MiB, all pairs at once: the VM's aggregate TCP payload rate."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    peer = comm.rank ^ 1
    send, recv = np.ones(MESSAGE_BYTES, np.uint8), np.empty(MESSAGE_BYTES, np.uint8)
    comm.Sendrecv(send, peer, recvbuf=recv, source=peer)
    times = []
    for _ in range(5):
        comm.Barrier()
        start = time.perf_counter()
        comm.Sendrecv(send, peer, recvbuf=recv, source=peer)
        comm.Barrier()
        times.append(time.perf_counter() - start)
    return {"tcp_rate": comm.size * MESSAGE_BYTES / statistics.median(times)}


# ----------------------------------------------------------------------------------- on this host


def measure_local() -> dict:
    """One thread's memcpy and reduce rates (bytes of memory moved per second), and the core count."""
    from hfr.kernels import reduce_into
    big = np.ones(64 << 20, np.uint8)
    copy = np.empty_like(big)
    a, b = np.ones(4 << 20, np.float32), np.ones(4 << 20, np.float32)
    out = np.empty_like(a)

    def best(fn, repeats: int = 5) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    memcpy = 2 * big.nbytes / best(lambda: np.copyto(copy, big))
    reduce = 3 * a.nbytes / best(lambda: reduce_into(out, [a, b], "sum", threads=1))
    return {"memcpy_rate": memcpy, "reduce_rate": reduce, "cores": os.cpu_count()}


def _job(cluster: netns.Cluster, ranks_per_host: int, argv: list[str], env: dict) -> str:
    """Run argv on every host of the cluster; returns its output (raises when it fails)."""
    cmd, net_env = cluster.mpiexec(ranks_per_host, argv, mpiexec()[0])
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HFR_")}
    full_env.update({"PYTHONPATH": str(REPO), "HFR_NUM_THREADS": "1", **net_env, **env})
    result = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=JOB_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _worker_result(cluster: netns.Cluster, worker: str) -> dict:
    out = _job(cluster, 1, [sys.executable, str(Path(__file__).resolve()), "--worker", worker], {})
    return json.loads(out.strip().splitlines()[-1])


def measure_params(rate: str) -> dict:
    params = measure_local()
    with netns.Cluster(2) as cluster:
        cluster.shape(rate)
        params.update(_worker_result(cluster, "link"))
    with netns.Cluster(4) as cluster:
        params.update(_worker_result(cluster, "pairs"))
    params["link_rate_all_busy"] = {}
    for hosts in sorted({h for h, _ in CONFIGS}):
        with netns.Cluster(hosts) as cluster:
            cluster.shape(rate)
            params["link_rate_all_busy"][str(hosts)] = _worker_result(cluster, "shift")["rate"]
    params["link_shaped_to"] = rate
    return params


def measure_allreduce(rate: str, sizes: str, iters: int, algos: list[str]) -> list[dict]:
    """hfr (each algo) and MPICH across every config; one row per backend, size and placement."""
    rows = []
    for hosts, ranks_per_host in CONFIGS:
        with netns.Cluster(hosts) as cluster:
            cluster.shape(rate)
            for i, algo in enumerate(algos):
                backends = "hfr,mpi" if i == 0 else "hfr"
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "result.json"
                    os.chmod(tmp, 0o777)
                    _job(cluster, ranks_per_host,
                         [sys.executable, "-m", "mpi4py", str(REPO / "bench" / "allreduce_perf.py"),
                          "-b", sizes.split(",")[0], "-e", sizes.split(",")[-1], "-f", "4", "-n", str(iters),
                          "-w", "1", "--backends", backends, "--json", str(out)],
                         {"HFR_ALGO": algo})
                    results = json.loads(out.read_text())["results"]
                for r in results:
                    if r["time_us"] is None:
                        continue
                    backend = f"hfr:{algo}" if r["backend"] == "hfr" else r["backend"]
                    rows.append({"hosts": hosts, "ranks_per_host": ranks_per_host, "rate": rate,
                                 "backend": backend, "size": r["size"], "placement": r["placement"],
                                 "time_us": r["time_us"], "wrong": r["wrong"]})
                    print(rows[-1], flush=True)
    return rows


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "hfr"], cwd=REPO, capture_output=True, text=True).stdout
    return head.strip() + ("+dirty hfr/" if dirty.strip() else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "bench" / "testbed.json"))
    p.add_argument("--rate", default="1gbit", help="tc rate of every data link (default 1gbit)")
    p.add_argument("--sizes", default="16M,64M", help="smallest,largest allreduce size, x4 steps (default 16M,64M)")
    p.add_argument("-n", "--iters", type=int, default=2, help="timed allreduces a size (default 2)")
    p.add_argument("--algos", default=",".join(ALGOS), help=f"HFR_ALGOs to time (default {','.join(ALGOS)})")
    p.add_argument("--worker", choices=("link", "pairs", "shift"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        from mpi4py import MPI
        result = {"link": _worker_link, "pairs": _worker_pairs, "shift": _worker_shift}[a.worker]()
        if MPI.COMM_WORLD.rank == 0:
            print(json.dumps(result), flush=True)
        return 0
    reason = netns.unavailable_reason()
    if reason:
        print(f"testbed_measure: {reason}", file=sys.stderr)
        return 2
    start = time.monotonic()
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
           "machine": f"{os.uname().nodename}, {os.cpu_count()} cores", "commit": _commit(),
           "params": measure_params(a.rate)}
    print(json.dumps(doc["params"]), flush=True)
    doc["settings"] = {"rate": a.rate, "sizes": a.sizes, "iters": a.iters, "algos": a.algos}
    doc["runs"] = measure_allreduce(a.rate, a.sizes, a.iters, a.algos.split(","))
    doc["seconds"] = round(time.monotonic() - start)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out} in {doc['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
