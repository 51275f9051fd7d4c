"""hfr across hosts made of network namespaces and veth pairs, MPI over TCP between them, and a link
cut in the middle of the run: every rank must get an HFRError within the timeout, not hang (issue 6).

Skips where namespaces cannot be made (not root, no `ip`, EPERM) or MPI cannot start across them.
"""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from . import netns
from .mpirun import REPO, WORKERS, mpiexec

TIMEOUT_S = 5  # hfr's timeout in the job
GRACE_S = 5  # for the error to reach every rank and the job to end
HELLO = ("from mpi4py import MPI; w = MPI.COMM_WORLD; "
         "print('hello', w.Get_rank(), w.allreduce(1), w.Split_type(MPI.COMM_TYPE_SHARED).Get_size(), flush=True)")


class Job:
    """An MPI job across the cluster, its output read line by line on a thread."""

    def __init__(self, cluster: netns.Cluster, ranks_per_host: int, argv: list, env: dict):
        cmd, net_env = cluster.mpiexec(ranks_per_host, argv, mpiexec()[0])
        full_env = dict(os.environ)
        full_env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "HFR_NUM_THREADS": "1"})
        full_env.pop("HFR_LOCAL_SIZE", None)  # the hosts are the nodes
        full_env.update(net_env)
        full_env.update(env)
        self.cmd = cmd
        self.lines: list = []
        self._queue: queue.Queue = queue.Queue()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=full_env, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, count: int, deadline: float) -> bool:
        """Read until text occurs `count` times (True), or the output ends or the deadline passes (False).

        Occurrences, not lines: the ranks' lines may come through mpiexec interleaved."""
        while self.output.count(text) < count:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if line is None:
                self._queue.put(None)
                return False
            self.lines.append(line)
        return True

    def finish(self, deadline: float) -> int | None:
        """The exit status, or None when the job had to be killed at the deadline."""
        try:
            rc = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
        self.kill()
        self.wait_for("\0", 1, time.monotonic() + 2)  # drain what is left
        return rc

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


@pytest.fixture
def cluster(request):
    hosts = request.param
    version = subprocess.run([mpiexec()[0], "--version"], capture_output=True, text=True).stdout
    if "HYDRA" not in version:
        pytest.skip("the multi-host launch needs MPICH's hydra mpiexec (-launcher ssh -launcher-exec)")
    try:
        c = netns.Cluster(hosts)
    except netns.Unavailable as error:
        pytest.skip(f"no network namespaces here: {error}")
    try:
        job = Job(c, 1, [sys.executable, "-c", HELLO], {})
        ok = job.wait_for("hello", hosts, time.monotonic() + 30)
        rc = job.finish(time.monotonic() + 10)
        if not ok or rc != 0:
            pytest.skip(f"MPI cannot start across {hosts} namespaces (exit {rc}):\n{job.output[-2000:]}")
        yield c
    finally:
        left = c.close()
        assert not left, f"left behind: {left}"


def _ranks_of(report_dir) -> list[int]:
    """The pids of the job's ranks still running: those whose MULTIHOST_DIR is report_dir."""
    mark = f"MULTIHOST_DIR={report_dir}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in open(f"/proc/{entry}/environ", "rb").read():
                pids.append(int(entry))
        except OSError:
            pass
    return pids


def _state(pid: int) -> str:
    """A process's state and that of its threads, and the kernel function each sleeps in."""
    try:
        threads = sorted(os.listdir(f"/proc/{pid}/task"))
        return "; ".join(f"thread {t}: " + open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
                         + " in " + open(f"/proc/{pid}/task/{t}/wchan").read() for t in threads)
    except OSError as error:
        return f"gone ({error})"


@pytest.mark.slow
@pytest.mark.parametrize("cluster,ranks_per_host,cut,loop,algo",
                         [(2, 2, 1, "mixed", "auto"), (3, 1, 1, "mixed", "auto"), (2, 1, 0, "small", "mpi")],
                         indirect=["cluster"],
                         ids=["2 hosts x 2 ranks, ring and doubling", "3 hosts x 1 rank, ring and doubling",
                              "2 hosts x 1 rank, MPI Iallreduce only"])
def test_a_cut_link_gives_a_timeout_on_every_rank_not_a_hang(cluster, ranks_per_host, cut, loop, algo, tmp_path):
    hosts = len(cluster.hosts)
    ranks = hosts * ranks_per_host
    job = Job(cluster, ranks_per_host, [sys.executable, "-m", "mpi4py", str(WORKERS / "multihost_worker.py"),
                                        str(hosts), str(ranks_per_host), loop],
              {"MULTIHOST_TIMEOUT": str(TIMEOUT_S), "HFR_CHUNK_BYTES": "256K", "HFR_ALGO": algo,
               "MULTIHOST_DIR": str(tmp_path)})

    def reports() -> str:
        """What the ranks left in files (their errors, their count of calls, where a call stood near its
        deadline: a rank dumps that up to a few seconds after the test gave up on it), the state of those
        still running, then where their threads stand now (SIGUSR1 dumps them), with the time of the cut:
        should a line of theirs not reach the output."""
        time.sleep(GRACE_S)
        states = "".join(f"--- pid {pid} {_state(pid)}\n" for pid in _ranks_of(tmp_path)) or "--- no rank runs\n"
        for pid in _ranks_of(tmp_path):
            os.kill(pid, signal.SIGUSR1)
        time.sleep(1)
        files = sorted(p for p in tmp_path.iterdir() if p.stat().st_size)
        return f"cut at {cut_wall:.3f}\n{states}" + "".join(f"--- {p.name}\n{p.read_text()}" for p in files)

    try:
        started = job.wait_for("ready", ranks, time.monotonic() + 60)
        assert started, f"the ranks did not get ready across {hosts} hosts:\n{job.output}"
        # Each rank prints "ready" once its checked allreduces are done, then loops more of them.
        assert "sums correct" in job.output
        time.sleep(0.5)
        cut_at, cut_wall = time.monotonic(), time.time()
        cluster.cut(cut)
        errors = job.wait_for("Error after", ranks, cut_at + TIMEOUT_S + GRACE_S)
        took = time.monotonic() - cut_at
        assert errors, (f"not every rank got an error within {TIMEOUT_S + GRACE_S} s of the cut:\n{job.output}\n"
                        f"{reports()}")
        rc = job.finish(time.monotonic() + GRACE_S)
        assert rc == 0, f"the job exited {rc} (None: hung and killed):\n{job.output}"
    finally:
        job.kill()
    out = job.output
    assert out.count("HFRTimeoutError after") == ranks, out
    # Exit status 0 means every rank passed its own checks (an assertion aborts the job) and left by
    # os._exit(0); its last line ("rank R done") is not counted: hydra can drop what a rank prints
    # just before it exits.
    assert "in the loop" in out and took < TIMEOUT_S + GRACE_S
    if algo == "mpi":  # the cut lands in the call check (a doubling) or in the data's polled MPI Iallreduce
        assert out.count("for the call check") + out.count("allreduce (mpi) timed out") == ranks, out
    print(f"{hosts} hosts x {ranks_per_host}, {loop} with {algo}: every rank timed out {took:.1f} s after the cut\n"
          f"{out}")


GLOO = ("import torch, torch.distributed as dist, hfr.torch; from mpi4py import MPI; w = MPI.COMM_WORLD; "
        "hfr.torch.init_process_group('gloo'); t = torch.full((1 << 20,), float(w.rank + 1)); dist.all_reduce(t); "
        "want = w.size * (w.size + 1) / 2; assert bool((t == want).all()), (w.rank, t[:4]); "
        "print('gloo ok', w.rank, flush=True); dist.destroy_process_group()")


@pytest.mark.slow
@pytest.mark.parametrize("cluster", [3], indirect=True, ids=["3 hosts x 2 ranks"])
def test_init_process_group_and_gloo_work_across_hosts_that_share_a_hostname(cluster):
    """Namespaces share one hostname; the store must still be on an address the other hosts reach (5
    ranks probe rank 0's 2 addresses: more than a backlog of comm.size held), and gloo's 4 MiB per rank
    must cross the data links (GLOO_SOCKET_IFNAME=data)."""
    pytest.importorskip("torch")
    before = cluster.data_bytes()
    job = Job(cluster, 2, [sys.executable, "-c", GLOO], {"GLOO_SOCKET_IFNAME": "data"})
    try:
        ok = job.wait_for("gloo ok", 6, time.monotonic() + 90)
        rc = job.finish(time.monotonic() + 20)
    finally:
        job.kill()
    assert ok and rc == 0, f"exit {rc} (None: hung and killed):\n{job.output}"
    received = [rx - rx0 for (_, rx), (_, rx0) in zip(cluster.data_bytes(), before)]
    assert min(received) >= 4 << 20, f"the data links carried too little of gloo's allreduce: {received}"
