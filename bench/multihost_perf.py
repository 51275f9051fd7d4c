"""allreduce_perf.py across hosts made of network namespaces whose data links are shaped (issue 13).

    sudo python bench/multihost_perf.py --hosts 4 --ranks-per-host 2 --link 1gbit \\
        -b 16M -e 64M -f 4 -n 5 -w 2 --backends hfr,hfr:ring,hfr:dbtree,mpi,gloo

Makes H hosts with tests/netns.py's Cluster (each namespace its own MPI node, MPI over libfabric tcp on
the `data` links, hydra on the `ctl` links), limits every data link to RATE each way (tbf on both
ends), runs bench/allreduce_perf.py with L ranks a host and every other flag passed on, and tears it
all down afterwards, also on an error or Ctrl-C (exit 130): the job's processes, the namespaces, and
the /dev/shm segments the job left that no process maps. gloo is pinned to the data links
(GLOO_SOCKET_IFNAME=data). Each row adds the busiest link's use (bench/perf/links.py). Needs root,
`ip` and `tc`; without them it says why and exits 2.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import netns  # noqa: E402  (the one Cluster, shared with tests/test_multihost.py)
from tests.mpirun import SHM, remove_stray_shm  # noqa: E402

NO_TESTBED = 2


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="multihost_perf.py",
        description="allreduce_perf.py across namespace hosts joined by shaped links; every flag not "
                    "listed here goes to allreduce_perf.py (see its --help)")
    p.add_argument("--hosts", type=int, required=True, help="hosts (network namespaces), 1..200")
    p.add_argument("--ranks-per-host", type=int, default=1, help="MPI ranks on each host (default 1)")
    p.add_argument("--link", required=True, help="each data link's rate each way, in tc's units: 1gbit, 500mbit")
    p.add_argument("--mpiexec", default=str(Path(sys.executable).parent / "mpiexec"),
                   help="MPICH's hydra mpiexec (default: the one beside this python)")
    args, rest = p.parse_known_args(argv)
    try:
        args.link_bps = netns.parse_rate(args.link)
    except ValueError as error:
        p.error(str(error))
    if not 1 <= args.hosts <= 200 or args.ranks_per_host < 1:
        p.error("--hosts must be in 1..200 and --ranks-per-host >= 1")
    return args, rest


def run(args: argparse.Namespace, rest: list[str], cluster: netns.Cluster) -> int:
    cluster.shape(args.link)
    argv = [sys.executable, "-m", "mpi4py", str(REPO / "bench" / "allreduce_perf.py"), *rest]
    cmd, net_env = cluster.mpiexec(args.ranks_per_host, argv, args.mpiexec)
    env = dict(os.environ)
    env.pop("HFR_LOCAL_SIZE", None)  # the hosts are the nodes
    env.update(net_env)
    env.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
                "GLOO_SOCKET_IFNAME": "data", "HFR_BENCH_LINK_BPS": repr(args.link_bps)})
    # Its own session: Ctrl-C reaches this process only, which then ends the job and cleans up.
    job = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return job.wait()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def main(argv: list[str]) -> int:
    args, rest = parse_args(argv)
    reason = netns.unavailable_reason() or (None if shutil.which("tc") else "no `tc` command (iproute2)")
    if reason is None and not Path(args.mpiexec).exists():
        reason = f"no mpiexec at {args.mpiexec} (pip install 'hfr[mpich]', or --mpiexec)"
    if reason:
        print(f"multihost_perf.py: cannot make the testbed: {reason}", file=sys.stderr)
        return NO_TESTBED
    shm_before = set(os.listdir(SHM))
    try:
        cluster = netns.Cluster(args.hosts)
    except netns.Unavailable as error:
        print(f"multihost_perf.py: cannot make the testbed: {error}", file=sys.stderr)
        return NO_TESTBED
    try:
        return run(args, rest, cluster)
    except KeyboardInterrupt:
        print("multihost_perf.py: interrupted; tearing down", file=sys.stderr)
        return 130
    finally:
        left = cluster.close() + [f"/dev/shm/{name} (could not remove)" for name in remove_stray_shm(shm_before)
                                  if (SHM / name).exists()]
        if left:
            print(f"multihost_perf.py: left behind: {', '.join(left)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
