"""Hosts made of network namespaces on this machine, and MPI jobs across them (issue 6).

    switch namespace  {name}-sw : bridge bdata (the fabric), bridge bctl 10.77.1.254/24 (management);
                                  mpiexec runs here
    host namespace i  {name}-h{i}: data 10.77.0.{i+1}/24 <-veth-> d{i} on bdata
                                   ctl  10.77.1.{i+1}/24 <-veth-> c{i} on bctl

MPI's traffic (MPICH ch4, libfabric's tcp provider) is pinned to the `data` links; hydra's control
traffic (mpiexec <-> its proxies) uses the `ctl` links. Cutting a host's data link (`cut(i)`) so cuts
MPI and leaves the launcher able to see the ranks exit and end the job. Hydra launches its proxies
through tests/netns_launcher.sh, an `ssh` that runs the command under `ip netns exec`. Hydra gives
every host of -hosts its own proxy, hence its own node: MPI_COMM_TYPE_SHARED groups the ranks of one
namespace, and MPICH's shared-memory transport never joins two of them.

Only namespaces made here see the 10.77.x addresses; nothing is routed outside them. Everything is
torn down by `close()` (the processes left inside, then the namespaces, which take their veths and
bridges with them). `python -m tests.netns --clean` removes what a killed run left behind.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "netns_launcher.sh"
PREFIX = "hfrmh"  # namespaces are named hfrmh<pid>x<n>-sw / -h<i>

DATA_NET, CTL_NET = "10.77.0", "10.77.1"
SWITCH_CTL = f"{CTL_NET}.254"


class Unavailable(RuntimeError):
    """Namespaces (or MPI across them) cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, ["ip", *args], result.stdout, result.stderr)
    return result


def _tc(ns: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True, timeout=30,
                   check=True)


_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def parse_rate(rate: str) -> float:
    """Bits per second of a tc rate such as "1gbit" or "500mbit" (decimal prefixes, as tc's)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?bit)\s*", rate.lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"a link rate is a positive number and one of {', '.join(_RATE_UNITS)}, got {rate!r}")
    return float(match.group(1)) * _RATE_UNITS[match.group(2)]


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(ns: str) -> list[int]:
    """SIGKILL the processes in namespace ns (only ever ours: we made it) and wait for them to go;
    returns those still there after 5 s."""
    pids: list[int] = []
    for _ in range(50):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return pids


def _delete(ns: str) -> list[str]:
    """Delete namespace ns and what runs in it; returns what could not be removed."""
    left = [f"process {pid} in {ns}" for pid in _kill_inside(ns)]
    _ip("netns", "del", ns, check=False)
    if ns in _namespaces():
        left.append(f"namespace {ns}")
    return left


def clean_stale() -> list[str]:
    """Delete namespaces of earlier runs whose process is gone; returns their names."""
    gone = []
    for ns in _namespaces():
        if not ns.startswith(PREFIX):
            continue
        pid = ns[len(PREFIX):].split("x", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _delete(ns)
            gone.append(ns)
    return gone


def unavailable_reason() -> Optional[str]:
    """Why namespaces cannot be made here, or None when they (probably) can."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


class Cluster:
    """`hosts` namespaces joined by two bridges in a switch namespace (see the module docstring)."""

    _count = 0

    def __init__(self, hosts: int = 2):
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts must be in [1, 200], got {hosts}")
        reason = unavailable_reason()
        if reason:
            raise Unavailable(reason)
        Cluster._count += 1
        self.name = f"{PREFIX}{os.getpid()}x{Cluster._count}"
        self.switch = f"{self.name}-sw"
        self.hosts = [f"{self.name}-h{i}" for i in range(hosts)]
        self.ctl_addrs = [f"{CTL_NET}.{i + 1}" for i in range(hosts)]
        self.data_addrs = [f"{DATA_NET}.{i + 1}" for i in range(hosts)]
        self._made: list[str] = []
        clean_stale()
        try:
            self._build()
        except subprocess.CalledProcessError as error:
            self.close()
            raise Unavailable(f"`{' '.join(error.cmd)}` failed: {error.stderr.strip()}") from None
        except BaseException:
            self.close()
            raise

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _build(self) -> None:
        sw = self.switch
        self._add_ns(sw)
        for bridge in ("bdata", "bctl"):
            _ip("-n", sw, "link", "add", "name", bridge, "type", "bridge")
            _ip("-n", sw, "link", "set", bridge, "up")
        _ip("-n", sw, "addr", "add", f"{SWITCH_CTL}/24", "dev", "bctl")
        for i, ns in enumerate(self.hosts):
            self._add_ns(ns)
            for link, port, bridge, addr in (("data", f"d{i}", "bdata", self.data_addrs[i]),
                                              ("ctl", f"c{i}", "bctl", self.ctl_addrs[i])):
                # Made inside the switch namespace, the peer moved straight into the host's: the
                # veths never appear in the machine's own namespace.
                _ip("-n", sw, "link", "add", "name", port, "type", "veth", "peer", "name", link, "netns", ns)
                _ip("-n", sw, "link", "set", port, "master", bridge)
                _ip("-n", sw, "link", "set", port, "up")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", link)
                _ip("-n", ns, "link", "set", link, "up")

    # --- links -------------------------------------------------------------------------------
    def shape(self, rate: str, burst: str = "256k") -> None:
        """Limit every host's data link to `rate` (tc's units: "1gbit", "500mbit") each way: a token
        bucket (tbf) on both ends of each veth, the host's `data` (what it sends) and the switch's
        port (what it receives). netem does not work on this kernel; tbf does."""
        parse_rate(rate)
        for i, ns in enumerate(self.hosts):
            for where, dev in ((ns, "data"), (self.switch, f"d{i}")):
                _tc(where, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                    "latency", "100ms")

    def data_bytes(self) -> list[tuple[int, int]]:
        """(bytes sent, bytes received) so far by each host's data link, from its counters."""
        def read(ns: str, name: str) -> int:
            path = f"/sys/class/net/data/statistics/{name}"
            out = subprocess.run(["ip", "netns", "exec", ns, "cat", path], capture_output=True, text=True,
                                 timeout=30, check=True).stdout
            return int(out)
        return [(read(ns, "tx_bytes"), read(ns, "rx_bytes")) for ns in self.hosts]

    # --- faults ------------------------------------------------------------------------------
    def cut(self, host: int) -> None:
        """Take host's data link down (MPI's traffic to and from it stops; the control link stays)."""
        _ip("-n", self.hosts[host], "link", "set", "data", "down")

    def mend(self, host: int) -> None:
        _ip("-n", self.hosts[host], "link", "set", "data", "up")

    # --- MPI -----------------------------------------------------------------------------------
    def mpiexec(self, ranks_per_host: int, argv: Sequence[str], mpiexec: str) -> tuple[list[str], dict]:
        """The command line and environment that start argv on ranks_per_host ranks of every host."""
        hosts = ",".join(f"{addr}:{ranks_per_host}" for addr in self.ctl_addrs)
        cmd = ["ip", "netns", "exec", self.switch, mpiexec,
               "-launcher", "ssh", "-launcher-exec", str(LAUNCHER), "-disable-x",
               "-localhost", SWITCH_CTL, "-hosts", hosts,
               "-n", str(ranks_per_host * len(self.hosts)), *argv]
        env = {
            "HFR_NETNS_HOSTS": " ".join(f"{a}={ns}" for a, ns in zip(self.ctl_addrs, self.hosts)),
            # ch4 over libfabric's tcp provider, on the data links only (not UCX, not the ctl links).
            "MPIR_CVAR_CH4_NETMOD": "ofi",
            "FI_PROVIDER": "tcp",
            "FI_TCP_IFACE": "data",
            "UCX_NET_DEVICES": "data",
        }
        return cmd, env

    # --- life ----------------------------------------------------------------------------------
    def close(self) -> list[str]:
        """Kill whatever still runs in the namespaces and delete them (their veths and bridges go
        too); returns what could not be removed (nothing, normally)."""
        left = [item for ns in reversed(self._made) for item in _delete(ns)]
        self._made = []
        return left

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--clean"]:
        print("\n".join(clean_stale()) or "nothing to clean")
    else:
        raise SystemExit("usage: python -m tests.netns --clean")
