"""Run real MPI jobs from pytest: mpiexec -n N python -m mpi4py SCRIPT, bounded by a timeout.

`python -m mpi4py` aborts the whole job when any rank raises, so a failing rank never hangs it; the
timeout (and killing the process group) covers a rank that hangs. MPICH's shared-memory segments of a job
whose ranks were killed outlive them in /dev/shm: after a failed job, those it made are removed.
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

WORKERS = Path(__file__).parent / "workers"
REPO = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")


def mapped_shm() -> set[str]:
    """Names under /dev/shm that some process maps or holds open."""
    names = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            names.update(line.split("/dev/shm/", 1)[1].split()[0] for line in (proc / "maps").read_text().splitlines()
                         if "/dev/shm/" in line)
            names.update(os.readlink(fd).split("/dev/shm/", 1)[1] for fd in (proc / "fd").iterdir()
                         if os.readlink(fd).startswith("/dev/shm/"))
        except OSError:  # gone, or not ours to read
            continue
    return names


def remove_stray_shm(before: set[str]) -> list[str]:
    """Remove what appeared in /dev/shm since `before` and no process uses (a killed job's segments);
    returns their names."""
    stray = sorted(set(os.listdir(SHM)) - before - mapped_shm())
    for name in stray:
        (SHM / name).unlink(missing_ok=True)
    return stray


@functools.lru_cache(maxsize=None)
def mpiexec() -> list[str]:
    """The launcher beside this Python (the venv's MPICH), else the one on PATH, with the flags it needs."""
    exe = Path(sys.executable).parent / "mpiexec"
    launcher = str(exe) if exe.exists() else shutil.which("mpiexec") or shutil.which("mpirun")
    if launcher is None:
        raise RuntimeError("no mpiexec found: install the 'mpich' extra or an MPI library")
    version = subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        return [launcher, "--oversubscribe", "--bind-to", "none"]
    return [launcher]


def run_mpi(
    nprocs: int,
    script: str,
    *args: str,
    env: Optional[dict] = None,
    timeout: float = 120,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run tests/workers/SCRIPT on nprocs ranks; returns the finished process (stdout+stderr as text).

    With check, a non-zero exit fails the calling test and shows what the ranks printed."""
    full_env = dict(os.environ)
    full_env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                     "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "HFR_NUM_THREADS": full_env.get("HFR_NUM_THREADS", "1")})
    full_env.update(env or {})
    path = script if os.path.isabs(script) else str(WORKERS / script)
    cmd = mpiexec() + ["-n", str(nprocs), sys.executable, "-m", "mpi4py", path, *args]
    shm_before = set(os.listdir(SHM))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        remove_stray_shm(shm_before)
        raise AssertionError(f"{' '.join(cmd)} hung for {timeout} s; output:\n{out}") from None
    if proc.returncode != 0:  # ranks were killed, maybe before MPICH unlinked its segments
        remove_stray_shm(shm_before)
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}; output:\n{out}")
    return result
