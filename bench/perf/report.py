"""What rank 0 prints and writes: the nccl-tests table, the speedup table, JSON, CSV, a plot, progress."""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional

import mpi4py
from mpi4py import MPI

from .backends import FLOOR_NAMES, ranks_per_host
from .collectives import COLLECTIVES, DTYPES

__all__ = ["Report", "Progress"]

_KEY_COLUMNS = f"{'backend':>10} {'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'root':>5}"
_KEY_UNITS = f"{'':>10} {'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} {'':>5}"
_NUM_COLUMNS = f"{'time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>7}"
_NUM_UNITS = f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>7}"
_LINK_COLUMN, _LINK_UNITS = f" {'link':>6}", f" {'(%)':>6}"  # across hosts with a link rate (links.py)


class Progress:
    """A progress bar for rank 0, shown once a sweep has run a few seconds, and only where stdout is a
    terminal: the bar is drawn on stdout, the table's stream, and cleared before each row, so rows never
    meet bar frames. (Under MPICH's mpiexec a rank's stdout is a pipe: there is no bar, and the rows,
    printed as they are measured, show the progress.) tqdm if installed, else a plain bar."""

    DELAY_S = 3.0
    WIDTH = 30

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done = total, 0
        self.enabled = enabled and sys.stdout.isatty()
        self.start = time.monotonic()
        self.bar: Any = None  # the tqdm bar, made when first shown
        self.shown = False

    def advance(self) -> None:
        self.done += 1
        if not self.enabled or time.monotonic() - self.start < self.DELAY_S:
            return
        if not self.shown:
            self.shown = True
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, initial=self.done - 1, file=sys.stdout, unit="run", leave=False)
            except ImportError:
                pass
        if self.bar is not None:
            self.bar.update()
        else:
            filled = self.WIDTH * self.done // self.total
            sys.stdout.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total}")
            sys.stdout.flush()

    def write(self, line: str) -> None:
        """Print a line to stdout, the bar cleared first (tqdm draws it again below the line)."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
            return
        self.close()
        print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.shown:
            sys.stdout.write("\r" + " " * (self.WIDTH + 20) + "\r")
            sys.stdout.flush()


def _fmt(value: Optional[float], width: int, digits: int) -> str:
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


class Report:
    """Collects the lines rank 0 prints; other ranks only take part in gathering the layout."""

    def __init__(self, args: argparse.Namespace, comm: MPI.Comm, backends: list, missing: dict[str, str],
                 link_bps: Optional[float] = None) -> None:
        self.args, self.comm, self.backends, self.missing = args, comm, backends, missing
        self.link_bps = link_bps
        self.coll = COLLECTIVES[args.collective]
        self.lines: list[str] = []
        hosts = comm.allgather(socket.gethostname())
        self.layout = {
            "ranks": comm.size,
            "hosts": sorted(set(hosts)),
            "ranks_per_host": ranks_per_host(comm),
            "hfr": next((b.describe() for b in backends if b.name == "hfr"), f"hfr: {missing.get('hfr', 'not run')}"),
            "peers": {b.name: b.describe() for b in backends  # those that say more than their name (deepspeed)
                      if b.name.split(":")[0] != "hfr" and hasattr(b, "describe")},
            "mpi": MPI.Get_library_version().replace("\0", "").splitlines()[0].strip(),
            "mpi4py": mpi4py.__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "array": args.array,
            "link_bps": link_bps,
        }
        self.redop = args.op if self.coll.uses_op else "none"
        self.root = args.root if self.coll.uses_root else -1

    def _print(self, line: str, progress: Optional[Progress] = None) -> None:
        if self.comm.rank != 0:
            return
        self.lines.append(line)
        if progress is None:
            print(line, flush=True)
        else:
            progress.write(line)

    def header(self) -> None:
        a, lay = self.args, self.layout
        self._print(f"# hfr benchmark: {a.collective}, {a.datatype}, op {self.redop}"
                    + (f", root {a.root}" if self.coll.uses_root else "")
                    + f", {a.array} arrays, sizes {a.minbytes}..{a.maxbytes} B x{a.stepfactor}")
        self._print(f"# date {lay['date']}, host {socket.gethostname()}, hosts {', '.join(lay['hosts'])}")
        self._print(f"# ranks {lay['ranks']}, {lay['ranks_per_host']} per host; {lay['hfr']}")
        self._print(f"# {lay['mpi']}; mpi4py {lay['mpi4py']}")
        for peer in lay["peers"].values():
            self._print(f"# {peer}")
        self._print(f"# time: median over {a.iters} iterations ({a.warmup_iters} warm-up) of the slowest rank, "
                    f"MPI barrier before each call; check {'on' if a.check else 'off'} (seed {a.seed})")
        self._print(f"# busbw = algbw x {self.coll.name}'s bus factor, here {self.coll.bus_factor(self.comm.size):.3f}")
        cores = os.cpu_count() or 1
        if lay["ranks_per_host"] > cores:
            self._print(f"# note: {lay['ranks_per_host']} ranks share this host's {cores} cores (oversubscribed): they "
                        f"take turns on the cores, so every backend's times are longer than with a core each")
        for name, reason in self.missing.items():
            self._print(f"# backend {name}: skipped: {reason}")
        dtype = DTYPES[a.datatype]
        for backend in self.backends:
            for in_place, placement in ((False, "out-of-place"), (True, "in-place")):
                reason = backend.unsupported(self.coll, dtype, a.op, in_place)
                if reason:
                    self._print(f"# backend {backend.name}: {placement} n/a: {reason}")
        links = self.link_bps is not None
        if links:
            self._print(f"# link: each host's data link shaped to {self.link_bps / 1e9:g} Gbit/s each way; link % = "
                        f"the busiest link's bytes one way per call / (rate x time)")
        self._print("#")
        pad = " " * len(_KEY_COLUMNS)
        columns = _NUM_COLUMNS + (_LINK_COLUMN if links else "")
        units = _NUM_UNITS + (_LINK_UNITS if links else "")
        self._print(f"#{pad} {'out-of-place':>{len(columns)}}  {'in-place':>{len(columns)}}")
        self._print(f"#{_KEY_COLUMNS} {columns}  {columns}")
        self._print(f"#{_KEY_UNITS} {units}  {units}")

    def row(self, results: list, progress: Progress) -> None:
        first = results[0]
        key = (f" {first.backend:>10} {first.size:>12} {first.count:>12} {self.args.datatype:>8} "
               f"{self.redop:>6} {self.root:>5}")
        halves = [f"{_fmt(r.time_us, 10, 1)} {_fmt(r.algbw, 7, 3)} {_fmt(r.busbw, 7, 3)} "
                  f"{'n/a' if r.wrong is None else r.wrong:>7}"
                  + (f" {_fmt(None if r.link_use is None else 100 * r.link_use, 6, 1)}" if self.link_bps else "")
                  for r in results]
        self._print(key + " " + "  ".join(halves), progress)

    def speedups(self, results: list) -> list[dict]:
        """Per size and placement: hfr's time (auto) against the fastest peer whose results were right, and
        where one was timed, against the floor (FLOOR_NAMES)."""
        table = []
        for size in sorted({r.size for r in results}):
            for placement in ("out-of-place", "in-place"):
                timed = [r for r in results if r.size == size and r.placement == placement
                         and r.time_us is not None and not r.wrong]
                hfr = next((r for r in timed if r.backend == "hfr"), None)
                floor = next((r for r in timed if r.backend in FLOOR_NAMES), None)
                peers = [r for r in timed if r.backend.split(":")[0] != "hfr"  # not hfr:ALGO either
                         and r.backend not in FLOOR_NAMES]
                if hfr is None or not peers:
                    continue
                best = min(peers, key=lambda r: r.time_us)
                row = {"size": size, "placement": placement, "best_peer": best.backend,
                       "peer_time_us": best.time_us, "hfr_time_us": hfr.time_us,
                       "speedup": best.time_us / hfr.time_us}
                if floor is not None:
                    row.update(floor_time_us=floor.time_us, hfr_over_floor=hfr.time_us / floor.time_us)
                table.append(row)
        return table

    def finish(self, results: list) -> int:
        """Print the totals and speedups, write the files; returns the total #wrong."""
        wrong = sum(r.wrong or 0 for r in results)
        if self.comm.rank != 0:
            return wrong
        checked = any(r.wrong is not None for r in results)
        self._print(f"# #wrong in all: {wrong} {'OK' if wrong == 0 else 'FAILED'}" if checked
                    else "# #wrong: not checked (-c 0)")
        speedups = self.speedups(results)
        self._print("#")
        if speedups:
            self._print("# hfr speedup over the best peer (peer time / hfr time; > 1: hfr is faster)")
            floors = any("floor_time_us" in s for s in speedups)
            self._print(f"# {'size':>12} {'placement':>12} {'best peer':>10} {'peer (us)':>11} {'hfr (us)':>11} "
                        f"{'speedup':>8}" + (f" {'floor (us)':>11} {'hfr/floor':>9}" if floors else ""))
            for s in speedups:
                floor = (f" {_fmt(s.get('floor_time_us'), 11, 1)} {_fmt(s.get('hfr_over_floor'), 9, 2)}"
                         if floors else "")
                self._print(f"  {s['size']:>12} {s['placement']:>12} {s['best_peer']:>10} {s['peer_time_us']:>11.1f} "
                            f"{s['hfr_time_us']:>11.1f} {s['speedup']:>8.2f}" + floor)
        else:
            self._print("# no speedup table: needs hfr and at least one peer with right results")
        self._write_files(results, speedups)
        return wrong

    def _write_files(self, results: list, speedups: list) -> None:
        a = self.args
        rows = [dataclasses.asdict(r) for r in results]
        if a.table:
            _open_for_writing(a.table).write_text("\n".join(self.lines) + "\n")
        if a.json:
            settings = {k: getattr(a, k) for k in ("collective", "datatype", "op", "root", "array", "iters",
                                                    "warmup_iters", "check", "seed", "backends")}
            doc = {"layout": self.layout, "settings": settings, "redop": self.redop,
                   "hfr_env": {k: v for k, v in os.environ.items() if k.startswith("HFR_")},
                   "skipped": self.missing, "results": rows, "speedups": speedups}
            _open_for_writing(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        if a.csv:
            with _open_for_writing(a.csv).open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["backend"])
                writer.writeheader()
                writer.writerows(rows)
        if a.plot:
            self._plot(results, _open_for_writing(a.plot))

    def _plot(self, results: list, path: Path) -> None:
        """algbw against size, log axes: a colour per backend, a line per placement (out of place solid, in
        place dashed) at the median call, and a band from the slowest call to the fastest."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        fig, ax = plt.subplots(figsize=(8, 5))
        styles = {"out-of-place": ("-", "o"), "in-place": ("--", "s")}
        for colour, backend in enumerate(dict.fromkeys(r.backend for r in results)):
            for placement, (line, marker) in styles.items():
                runs = [r for r in results if r.backend == backend and r.placement == placement and r.algbw]
                if not runs:
                    continue
                sizes = [r.size for r in runs]
                ax.plot(sizes, [r.algbw for r in runs], line, marker=marker, color=f"C{colour}",
                        label=f"{backend} ({placement})")
                ax.fill_between(sizes, [r.size / r.time_max_us / 1e3 for r in runs],
                                [r.size / r.time_min_us / 1e3 for r in runs], color=f"C{colour}", alpha=0.15, lw=0)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: _binary_bytes(x)))
        ax.set_yscale("log")
        ax.set_xlabel("size per rank (bytes)")
        ax.set_ylabel("algbw (GB/s) = size / time")
        lay, a = self.layout, self.args
        ax.set_title(f"{a.collective} {a.datatype} {self.redop}, {a.array} arrays: {lay['ranks']} ranks, "
                     f"{len(lay['hosts'])} host(s)\n{lay['hfr']}\n"
                     f"lines: the median of {a.iters} timed calls; bands: their slowest to fastest", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)


def _binary_bytes(n: float) -> str:
    """16 -> "16 B", 65536 -> "64 KiB": tick labels for sizes."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"


def _open_for_writing(name: str) -> Path:
    path = Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
