"""Link use of a timed loop across hosts (bench/multihost_perf.py): how busy the busiest data link was.

*Link use* of a row half = the bytes the busiest link carried in one direction during the timed
iterations, per iteration, over (RATE x time): RATE is the link's shaped rate (HFR_BENCH_LINK_BPS,
bits/s, set by bench/multihost_perf.py), time the row's median time. Each host's link is its `data`
interface (tests/netns.py's naming); one rank per host reads its counters, which a process run in a
network namespace sees for that namespace. Without HFR_BENCH_LINK_BPS nothing is measured.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from mpi4py import MPI

__all__ = ["LinkMeter", "RATE_ENV", "LINK"]

RATE_ENV = "HFR_BENCH_LINK_BPS"
LINK = "data"


def _counters() -> tuple[int, int]:
    stats = Path("/sys/class/net") / LINK / "statistics"
    return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


class LinkMeter:
    """Counts the busiest link's bytes between start() and stop(); collective over comm."""

    def __init__(self, comm: MPI.Comm) -> None:
        env = os.environ.get(RATE_ENV)
        self.rate_bps: Optional[float] = float(env) if env else None
        self.comm = comm
        host = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.reads = self.rate_bps is not None and host.rank == 0  # one reader a host
        host.Free()
        self._start = (0, 0)

    @property
    def enabled(self) -> bool:
        return self.rate_bps is not None

    def start(self) -> None:
        if self.reads:
            self._start = _counters()

    def use(self, iters: int, seconds: float) -> Optional[float]:
        """The busiest link's share of RATE during the calls since start(): iters calls of `seconds` each."""
        if not self.enabled:
            return None
        moved = 0
        if self.reads:
            tx, rx = _counters()
            moved = max(tx - self._start[0], rx - self._start[1])
        busiest = self.comm.allreduce(moved, op=MPI.MAX)
        return busiest / iters / (self.rate_bps / 8 * seconds)
