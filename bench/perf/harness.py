"""The sweep: for each size, each backend, out of place then in place: check once, then time.

Terms (as nccl-tests): *size* is the bytes of one rank's array, *count* its elements. *time* is the
median over the timed iterations of one call's wall time on the slowest rank (per iteration, the max
over ranks; every call starts from an MPI barrier). *algbw* = size / time; *busbw* = algbw times the
collective's bus factor. *#wrong* is the number of elements, summed over ranks, that differ from what
the rank computed locally from the seeds (plus, out of place, input elements the call changed).
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from . import report
from .arrays import KINDS, ArrayKind
from .backends import BACKEND_NAMES, FLOOR_NAMES, HFR_ALGO_NAMES, HFR_PAIRS_NAMES, Unavailable, make_backend
from .collectives import COLLECTIVES, DTYPES, OPS, Collective, count_wrong, rank_input
from .links import LinkMeter

__all__ = ["main", "parse_args", "parse_size", "sweep_sizes", "Result"]

PLACEMENTS = ("out-of-place", "in-place")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """Bytes from "8", "64K", "16M", "1G" (binary units, as nccl-tests)."""
    m = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if m is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: expected a number with an optional K, M or G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int, itemsize: int) -> list[int]:
    """min_bytes, min_bytes*factor, ... up to max_bytes, each rounded down to whole elements
    (just min_bytes when it equals max_bytes or factor < 2)."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size - size % itemsize)
        if size == max_bytes or factor < 2:
            break
        size *= factor
    return sorted(set(sizes))


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="allreduce_perf.py",
        description="nccl-tests-style benchmark of hfr against MPI, gloo and NCCL. "
                    "Run as: mpiexec -n N python -m mpi4py bench/allreduce_perf.py [flags]")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"), help="smallest size (default 32M)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"), help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="multiplication factor between sizes (default 2)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed warm-up iterations (default 5)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (default 1)")
    p.add_argument("-o", "--op", choices=OPS, default="sum")
    p.add_argument("-d", "--datatype", choices=list(DTYPES), default="float32")
    p.add_argument("-r", "--root", type=int, default=0, help="root of reduce and broadcast (default 0)")
    p.add_argument("--collective", choices=list(COLLECTIVES), default="allreduce")
    p.add_argument("--array", choices=KINDS, default="numpy",
                   help="NumPy arrays, torch CPU tensors or CuPy arrays (default numpy)")
    p.add_argument("--backends", default=",".join(BACKEND_NAMES),
                   help=f"comma-separated, timed in this order (default {','.join(BACKEND_NAMES)}); "
                        f"hfr:ALGO forces an inter-node algorithm, one of {','.join(HFR_ALGO_NAMES)}; "
                        f"{' and '.join(HFR_PAIRS_NAMES)} force GPU pairs on (every size) or off; "
                        f"pcie-floor (CuPy) times only the copies a staged call makes, the floor of hfr's time; "
                        f"pair-floor (CuPy) those of a call whose ranks pair up over their device link")
    p.add_argument("--seed", type=int, default=1, help="seed of every rank's input (default 1)")
    p.add_argument("--json", metavar="FILE", help="write layout, results and speedups as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the results, one row per size, backend and placement")
    p.add_argument("--plot", metavar="FILE.png", help="plot algbw against size, one line per backend")
    p.add_argument("--table", metavar="FILE", help="also write the printed table to FILE")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name in args.backends:
        known = BACKEND_NAMES + HFR_ALGO_NAMES + HFR_PAIRS_NAMES + FLOOR_NAMES
        if name not in known and name != "wrong":  # "wrong": the tests' corrupting one
            p.error(f"unknown backend {name!r}: choose from {','.join(known)}")
    if args.op == "avg" and DTYPES[args.datatype].kind not in "fV":
        p.error(f"-o avg needs a float type, not {args.datatype}")
    if args.minbytes > args.maxbytes or (args.stepfactor < 2 and args.minbytes != args.maxbytes):
        p.error("-b must be <= -e, and -f >= 2 unless -b equals -e")
    if args.iters < 1 or args.warmup_iters < 0:
        p.error("-n must be >= 1 and -w >= 0")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before anything runs, on every rank
        p.error("--plot needs matplotlib: pip install 'hfr[bench]'")
    return args


@dataclass
class Result:
    """One row half: a backend's numbers for one size and one placement (None: not run, see reason)."""

    backend: str
    placement: str
    size: int
    count: int
    time_us: Optional[float] = None  # the median of the timed calls (each the slowest rank's)
    time_min_us: Optional[float] = None  # the fastest and the slowest of them
    time_max_us: Optional[float] = None
    algbw: Optional[float] = None  # GB/s
    busbw: Optional[float] = None  # GB/s
    wrong: Optional[int] = None  # None: not checked
    reason: Optional[str] = None  # why it did not run
    link_use: Optional[float] = None  # busiest link's bytes / (rate x time), across hosts (links.py)


class Sweep:
    """One size on this rank: its buffers, how to run a backend on them, and how to check the result."""

    def __init__(self, args: argparse.Namespace, kind: ArrayKind, comm: MPI.Comm, size: int,
                 links: LinkMeter) -> None:
        self.args, self.kind, self.comm, self.links = args, kind, comm, links
        self.coll: Collective = COLLECTIVES[args.collective]
        self.dtype = DTYPES[args.datatype]
        send_count, recv_count = self.coll.counts(size // self.dtype.itemsize, comm.size)
        self.count = max(send_count, recv_count)  # nccl-tests: the larger buffer's
        self.size = self.count * self.dtype.itemsize

        def input_of(rank: int) -> np.ndarray:
            return rank_input(send_count, self.dtype, args.op, args.seed, rank)

        self.input = input_of(comm.rank)
        self.expected = (self.coll.expected(input_of, comm.size, comm.rank, args.root, args.op, self.dtype)
                         if args.check else None)
        self.pristine = kind.from_host(self.input)  # copied into the send buffer before every call
        self.send = kind.from_host(self.input)
        self.recv = kind.from_host(self.input if recv_count == send_count else np.zeros(recv_count, self.dtype))
        # In place, as nccl-tests: one buffer, or where the counts differ (reduce_scatter, allgather) the
        # smaller buffer is this rank's slice of the larger one.
        self.in_place = (self.recv, self.recv)
        if send_count != recv_count:
            k = min(send_count, recv_count)
            whole = kind.from_host(np.zeros(self.count, self.dtype))
            shard = whole[comm.rank * k : (comm.rank + 1) * k]
            self.in_place = (shard, whole) if send_count < recv_count else (whole, shard)

    def buffers(self, in_place: bool) -> tuple[Any, Any]:
        return self.in_place if in_place else (self.send, self.recv)

    def prepare(self, in_place: bool) -> None:
        """Poison the output and restore the input, so no call sees old results; then wait for the device."""
        send, recv = self.buffers(in_place)
        self.kind.poison(recv)
        self.kind.copy(send, self.pristine)
        self.kind.synchronize()

    def call(self, backend: Any, in_place: bool) -> None:
        """One call of the collective, finished on the device too."""
        send, recv = self.buffers(in_place)
        getattr(backend, self.coll.name)(send, recv, self.args.op, self.args.root)
        self.kind.synchronize()

    def wrong(self, in_place: bool) -> int:
        """Wrong elements on all ranks, after one call: the output, and out of place the untouched input."""
        send, recv = self.buffers(in_place)
        wrong = 0
        if self.expected is not None:
            wrong += count_wrong(self.kind.to_host(recv), self.expected)
        if not in_place:
            wrong += count_wrong(self.kind.to_host(send), self.input)
        return self.comm.allreduce(wrong, op=MPI.SUM)

    def seconds(self, backend: Any, in_place: bool) -> tuple[np.ndarray, Optional[float]]:
        """The slowest rank's seconds for each timed call (warm-up calls are not timed), and the link use
        of the timed calls at their median (None without a link rate)."""
        iters, warmup = self.args.iters, self.args.warmup_iters
        seconds = np.zeros(iters)
        for i in range(warmup + iters):
            self.prepare(in_place)
            self.comm.Barrier()
            if i == warmup:
                self.links.start()
            start = time.perf_counter()
            self.call(backend, in_place)
            if i >= warmup:
                seconds[i - warmup] = time.perf_counter() - start
        self.comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
        return seconds, self.links.use(iters, float(np.median(seconds)))


def run_one(backend: Any, sweep: Sweep, in_place: bool) -> Result:
    """Check once (unless -c 0), then time: one half of a table row."""
    result = Result(backend.name, PLACEMENTS[in_place], sweep.size, sweep.count)
    result.reason = backend.unsupported(sweep.coll, sweep.dtype, sweep.args.op, in_place)
    if result.reason:
        return result
    if sweep.args.check and backend.name not in FLOOR_NAMES:
        sweep.prepare(in_place)
        sweep.call(backend, in_place)
        result.wrong = sweep.wrong(in_place)
    seconds, result.link_use = sweep.seconds(backend, in_place)
    median = float(np.median(seconds))
    result.time_us, result.time_min_us, result.time_max_us = (1e6 * t for t in (median, seconds.min(), seconds.max()))
    result.algbw = sweep.size / median / 1e9
    result.busbw = result.algbw * sweep.coll.bus_factor(sweep.comm.size)
    return result


def make_backends(args: argparse.Namespace, comm: MPI.Comm, kind: ArrayKind) -> tuple[list[Any], dict[str, str]]:
    """The backends that can run this collective, and for the others the reason (all ranks agree)."""
    coll, dtype = COLLECTIVES[args.collective], DTYPES[args.datatype]
    ready, missing = [], {}
    for name in args.backends:
        try:
            backend, reason = make_backend(name, comm, kind), None
        except Unavailable as e:
            backend, reason = None, str(e)
        reasons = [r for r in comm.allgather(reason) if r]
        if backend is not None and not reasons:
            placement_reasons = {backend.unsupported(coll, dtype, args.op, in_place) for in_place in (False, True)}
            if None not in placement_reasons:  # neither placement runs: skip the backend
                reasons = sorted(placement_reasons)
        if reasons:
            missing[name] = reasons[0]
            if backend is not None:
                backend.close()
        else:
            ready.append(backend)
    return ready, missing


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    kind = ArrayKind(args.array)
    dtype = DTYPES[args.datatype]
    if not 0 <= args.root < comm.size:
        raise SystemExit(f"-r {args.root}: the root must be a rank, 0..{comm.size - 1}")
    sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor, dtype.itemsize)
    backends, missing = make_backends(args, comm, kind)
    links = LinkMeter(comm)
    out = report.Report(args, comm, backends, missing, links.rate_bps)
    out.header()
    progress = report.Progress(len(sizes) * len(backends) * len(PLACEMENTS), enabled=comm.rank == 0)
    results: list[Result] = []
    for size in sizes:
        sweep = Sweep(args, kind, comm, size, links)
        for backend in backends:
            row = []
            for in_place in (False, True):
                row.append(run_one(backend, sweep, in_place))
                progress.advance()
            out.row(row, progress)
            results.extend(row)
        del sweep
    progress.close()
    wrong = out.finish(results)
    for backend in backends:
        backend.close()
    return 1 if wrong else 0
