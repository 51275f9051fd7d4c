"""bench/multihost_perf.py: shaped links (every row's busiest link at most its rate, and near it),
gloo and hfr:ALGO across namespace hosts, and teardown after a run and after Ctrl-C (issue 13).

Skips without root, `ip` or `tc`, or where MPI cannot start across namespaces (exit 2 or a skip line).
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from . import netns
from .mpirun import REPO, mapped_shm

SCRIPT = REPO / "bench" / "multihost_perf.py"


def _ours(pid: int) -> list[str]:
    """Namespaces made by the process pid (tests/netns.py names them after it)."""
    return [ns for ns in netns._namespaces() if ns.startswith(f"{netns.PREFIX}{pid}x")]


def _skip_without_testbed():
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)


def test_without_ip_or_tc_it_says_why_and_exits_2(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no ip, no tc
    result = subprocess.run([sys.executable, str(SCRIPT), "--hosts", "2", "--link", "1gbit"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert "cannot make the testbed" in result.stderr


@pytest.mark.slow
def test_links_are_shaped_and_everything_is_torn_down(tmp_path):
    _skip_without_testbed()
    out = tmp_path / "r.json"
    shm_before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--hosts", "2", "--ranks-per-host", "1", "--link", "200mbit",
                             "-b", "2M", "-e", "2M", "-n", "2", "-w", "1", "--backends", "hfr,hfr:ring,mpi,gloo",
                             "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = proc.communicate(timeout=300)
    if proc.returncode == 2:
        pytest.skip(output)
    assert proc.returncode == 0, output
    assert "link" in output and "#wrong in all: 0 OK" in output, output
    assert not _ours(proc.pid), netns._namespaces()
    doc = json.loads(out.read_text())
    uses = {(r["backend"], r["placement"]): r["link_use"] for r in doc["results"]}
    assert {b for b, _ in uses} == {"hfr", "hfr:ring", "mpi", "gloo"}, uses
    # Each of these allreduces sends the whole 2 MiB over each link one way (2 hosts): shaped to 200 Mbit/s
    # it takes >= 84 ms, so no row beats its link (the veths alone run several GB/s), and one gets close.
    assert all(0 < u <= 1.1 for u in uses.values()), uses
    assert max(uses.values()) > 0.5, uses
    assert doc["layout"]["link_bps"] == 2e8
    _assert_no_shm_left(shm_before)


def _assert_no_shm_left(before: set) -> None:
    left = set(os.listdir("/dev/shm")) - before - mapped_shm()
    assert not left, f"left in /dev/shm: {left}"


@pytest.mark.slow
def test_ctrl_c_ends_the_job_and_tears_down_with_exit_130():
    _skip_without_testbed()
    shm_before = set(os.listdir("/dev/shm"))
    # SIGINT as a terminal gives it: a suite started as a background job (`pytest &` in a script) has
    # SIGINT ignored, which its children inherit, and Python then raises no KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--hosts", "2", "--link", "100mbit",
                             "-b", "64M", "-e", "64M", "-n", "50", "--backends", "hfr"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while len(_ours(proc.pid)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if proc.poll() is not None:
            (pytest.skip if proc.returncode == 2 else pytest.fail)(proc.stdout.read())
        time.sleep(3)  # the job is running (a 64 MiB allreduce at 100 Mbit/s takes seconds)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    assert "interrupted" in output and "left behind" not in output, output
    assert not _ours(proc.pid), netns._namespaces()
    _assert_no_shm_left(shm_before)
