"""A model of HFReduce's allreduce, NCCL's and MPICH's, from a machine's named parameters (issue 13).

    python bench/scaling_model.py --paper [--json PATH] [--plot PATH]   # the paper's cluster, Fig. 7
    python bench/scaling_model.py --testbed bench/testbed.json           # this VM's namespace hosts

Terms. S: the bytes of the array on every GPU (rank). N: nodes; L: GPUs (ranks) a node; G = N L.
A *resource* is something a byte must cross at a fixed rate: a node's NIC (each way), its memory, a PCIe
root port (each way), NVLink; on the testbed, where every node is a namespace of one VM, a host's
shaped link (each way) and the VM's cores, which all nodes share. An allreduce's stages (copies in, the
node's reduce, the inter-node step, copies out) are pipelined over chunks and run at once, so

    time = max over resources (bytes it carries / its rate) + latency + fill

where *latency* is the inter-node algorithm's messages in sequence times the per-message latency (for
a pipelined tree: 2 x its depth hops of one block each) and *fill* the stages one chunk must pass
before and after the pipeline runs full. Bandwidth is algbw = S / time, the "inter-node bandwidth" of
the paper's Fig. 7. Inter-node algorithms over N nodes each holding S (hfr/internode.py's terms), as
bytes the busiest node sends (and receives) and the steps it waits on:
    ring      reduce-scatter then allgather, 2(N-1) steps of S/N: 2S(N-1)/N sent
    halving   recursive halving then doubling (Rabenseifner), 2 log2 N steps: 2S(N-1)/N sent
    doubling  recursive doubling, log2 N swaps of the whole S: S log2 N sent
    dbtree    two binary trees (hfr.dbtree), half of S each, blocks pipelined up and down: a node
              interior in one tree sends S/2 to its parent and S/2 to each child there, S/2 up the
              other: 2S (S on 2 nodes); latency 2 x depth block hops
A non-power-of-two N folds its excess nodes in first (a whole S to a partner and back, 2 more steps).
Every parameter is named with its source: the paper (shared/seeds/000), shared/notes/allreduce-models.md
(sourced facts, NCCL's own cost model) or, for the testbed, bench/testbed_measure.py. Nothing is fitted.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hfr.dbtree import TREES, tree  # noqa: E402  (pure functions: the trees hfr runs)

MiB = 1 << 20
PAPER_BYTES = 186 * MiB
PAPER_GPUS = (16, 32, 64, 128, 256, 512, 1024, 1440)
FIG_7A = {"hfreduce": (6.3, 8.1), "nccl": (1.6, 4.8)}  # GB/s, 186 MiB, 16-1440 GPUs (paper §IV-B)
FIG_7B_ABOVE = 10.0  # GB/s: HFReduce with NVLink "exceeding 10 GB/s" (paper §IV-C)


def _param(value: float, source: str):
    return field(default=value, metadata={"source": source})


# ----------------------------------------------------------------------------- inter-node schedules


class Schedule(NamedTuple):
    """An inter-node algorithm on N nodes, per byte of S, at its busiest node."""

    sent: float  # bytes sent (= received) over the network
    combined: float  # bytes the combines read and write (a + b -> c: 3 bytes a byte combined)
    steps: int  # messages in sequence, each paying the latency (pipelined: block hops)
    pipelined: bool  # blocks stream through (each step is one block's hop), not whole messages


def _fold(nnodes: int) -> tuple[int, int]:
    """(the power of two p <= nnodes the algorithm runs on, the extra steps of folding the rest in)."""
    p = 1 << (nnodes.bit_length() - 1)
    return p, 0 if p == nnodes else 2


def schedule(algo: str, nnodes: int) -> Schedule:
    if nnodes <= 1:
        return Schedule(0.0, 0.0, 0, False)
    if algo == "ring":
        part = (nnodes - 1) / nnodes
        return Schedule(2 * part, 3 * part, 2 * (nnodes - 1), False)
    if algo in ("halving", "doubling"):
        p, extra = _fold(nnodes)
        fold = 2.0 if extra else 0.0  # a whole S to the partner and the result back
        if algo == "halving":
            part = (p - 1) / p
            return Schedule(2 * part + fold, 3 * part + 3 * fold / 2, 2 * int(math.log2(p)) + extra, False)
        rounds = int(math.log2(p))
        return Schedule(rounds + fold, 3 * rounds + 3 * fold / 2, rounds + extra, False)
    if algo == "dbtree":
        return dbtree_schedule(nnodes)
    raise ValueError(f"unknown algo {algo!r}: choose from ring, halving, doubling, dbtree")


def dbtree_schedule(nnodes: int) -> Schedule:
    """From the trees hfr builds: each tree carries S/2; a node sends it to its parent (up) and to
    each child (down), receives as much, and combines own + children's (reads 1 + c, writes 1)."""
    sent = [0.0] * nnodes
    combined = [0.0] * nnodes
    depth = 0
    for which in TREES:
        nodes = tree(nnodes, which)
        for r, node in enumerate(nodes):
            sent[r] += 0.5 * ((node.parent >= 0) + len(node.children))
            if node.children:
                combined[r] += 0.5 * (len(node.children) + 2)
            hops, up = 0, node.parent
            while up >= 0:
                hops, up = hops + 1, nodes[up].parent
            depth = max(depth, hops)
    busiest = max(range(nnodes), key=lambda r: (sent[r], combined[r]))
    return Schedule(sent[busiest], combined[busiest], 2 * depth, True)


def latency(s: Schedule, hop_latency: float, block_bytes: float, rate: float) -> float:
    """The algorithm's time beyond its bytes / rate: steps x (latency + one block's transfer, when pipelined)."""
    return s.steps * (hop_latency + (block_bytes / rate if s.pipelined else 0.0))


class Prediction(NamedTuple):
    """Seconds each resource is busy, and the latency and fill terms; time is their model."""

    busy: dict[str, float]
    latency: float
    fill: float

    @property
    def time(self) -> float:
        return max(self.busy.values()) + self.latency + self.fill

    @property
    def bound(self) -> str:
        return max(self.busy, key=self.busy.get)

    def algbw(self, nbytes: float) -> float:
        return nbytes / self.time / 1e9


# ---------------------------------------------------------------------------- the paper's cluster


@dataclass(frozen=True)
class Paper:
    """One node of Fire-Flyer 2 and its fabric; each default's source in its metadata."""

    gpus_per_node: int = _param(8, "paper §III-A, Fig. 4: 8 PCIe A100 a node")
    gpus_per_root_port: int = _param(2, "paper Fig. 4, notes: two GPUs share one PCIe root port")
    pcie_gpu_rate: float = _param(27e9, "notes: PCIe Gen4 x16 GPU->CPU > 27 GB/s, one GPU")
    pcie_port_rate: float = _param(37.5e9, "notes: a root port's link into the CPU tops out near 37.5 GB/s")
    memory_rate: float = _param(320e9, "notes (paper §IV): a practical 320 GB/s of 16-channel DDR4-3200")
    nic_rate: float = _param(24e9, "notes: one 200 Gb/s CX6 = 25 GB/s; ~24 GB/s practical (nccl #412)")
    p2p_rate: float = _param(9 * 2**30, "notes: GPU<->NIC peer-to-peer on Rome tops out at ~9 GiB/s")
    nvlink_rate: float = _param(300e9, "paper §IV-C: 600 GB/s NVLink bridge between pairs (300 each way)")
    net_latency: float = _param(14e-6, "notes (NCCL tuning.cc): 14 us a hop over the network")
    pcie_latency_ring: float = _param(5.7e-6, "notes (NCCL tuning.cc): 5.7 us a ring hop over PCIe")
    pcie_latency_tree: float = _param(4.0e-6, "notes (NCCL tuning.cc): 4.0 us a tree hop over PCIe")
    nccl_base_latency: float = _param(8.4e-6, "notes (NCCL tuning.cc): 8.4 us base (Simple protocol)")
    nccl_tree_efficiency: float = _param(0.92, "notes (NCCL tuning.cc): the tree runs at 0.92 x busbw")
    nccl_ring_plateau: float = _param(1.9, "NVIDIA/nccl src/graph/tuning.cc (2022): multi-node Simple ring "
                                           "allreduce latency x 1.9, the 'plateau effect of ring'")
    h2d_reads: float = _param(8, "paper §IV-B: MemCpyAsync for large data, each GPU reads its copy (GDRCopy "
                                 "to 4 GPUs a NUMA node would make it 2)")
    block_bytes: float = _param(256 * 1024, "not in the paper: hfr's DEFAULT_BLOCK_BYTES")
    chunk_bytes: float = _param(8 * MiB, "not in the paper: hfr's DEFAULT_CHUNK_BYTES")


def sources(machine) -> list[tuple[str, float, str]]:
    return [(f.name, getattr(machine, f.name), f.metadata["source"]) for f in dataclasses.fields(machine)]


def hfreduce(m: Paper, nbytes: float, nnodes: int, nvlink: bool = False) -> Prediction:
    """HFReduce on the paper's nodes: D2H into host memory, the CPU's reduce of the node's slots, the
    double binary tree over RDMA from host memory, H2D. With NVLink (§IV-C) pairs reduce-scatter over
    NVLink first, so the host gets L/2 slots, each GPU moves S/2 over PCIe, and pairs allgather after."""
    pair = 2 if nvlink else 1
    slots = m.gpus_per_node / pair
    tree_ = schedule("dbtree", nnodes)
    per_gpu = nbytes / pair  # each way over PCIe
    pcie = per_gpu / min(m.pcie_gpu_rate, m.pcie_port_rate / m.gpus_per_root_port)
    # Memory traffic a byte of S: D2H writes a slot each, the reduce reads them and writes one, the NIC
    # reads what it sends and writes what it receives, the tree combines, H2D reads.
    memory = slots + (slots + 1) + 2 * tree_.sent + tree_.combined + m.h2d_reads / pair
    busy = {"pcie": pcie, "memory": memory * nbytes / m.memory_rate, "nic": tree_.sent * nbytes / m.nic_rate}
    if nvlink:
        busy["nvlink"] = nbytes / m.nvlink_rate  # S/2 each way to reduce-scatter, S/2 to allgather
    chunk = min(nbytes, m.chunk_bytes)
    fill = 2 * chunk / pair / m.pcie_gpu_rate + (2 * slots + 1) * chunk / m.memory_rate
    return Prediction(busy, latency(tree_, m.net_latency, m.block_bytes, m.nic_rate), fill)


def nccl_ring(m: Paper, nbytes: float, nnodes: int) -> Prediction:
    """NCCL's ring over all G GPUs: each sends and receives 2S(G-1)/G; every hop, GPU to GPU or GPU to
    NIC (GPUDirect RDMA), is a peer-to-peer transfer through the CPU's root complex. The notes give
    Rome's cap for GPU<->NIC; the model takes it for GPU<->GPU too (an assumption, same mechanism)."""
    gpus = nnodes * m.gpus_per_node
    bus = 2 * (gpus - 1) / gpus * nbytes
    busy = {"pcie port": m.gpus_per_root_port * bus / m.pcie_port_rate, "p2p": bus / m.p2p_rate}
    if nnodes > 1:
        busy["nic"] = bus / m.nic_rate
    hops = m.net_latency * 2 * (nnodes - 1) + m.pcie_latency_ring * 2 * (gpus - nnodes)
    plateau = m.nccl_ring_plateau if nnodes > 1 else 1.0
    return Prediction(busy, (m.nccl_base_latency + hops) * plateau, 0.0)


def nccl_tree(m: Paper, nbytes: float, nnodes: int) -> Prediction:
    """NCCL's tree: a chain of the node's GPUs (each GPU passes S up and S down, peer-to-peer) under the
    double binary tree over nodes (the NIC moves its bytes peer-to-peer too); at NCCL's own tree
    efficiency."""
    chain = 2 * nbytes  # each way a GPU: S up the chain, S down
    net = schedule("dbtree", nnodes).sent * nbytes
    busy = {"pcie port": m.gpus_per_root_port * chain / m.pcie_port_rate, "p2p": max(chain, net) / m.p2p_rate}
    if nnodes > 1:
        busy["nic"] = net / m.nic_rate
    busy = {k: v / m.nccl_tree_efficiency for k, v in busy.items()}
    hops = 2 * ((m.gpus_per_node - 1) * m.pcie_latency_tree + math.log2(max(nnodes, 1)) * m.net_latency)
    return Prediction(busy, m.nccl_base_latency + hops, 0.0)


def nccl(m: Paper, nbytes: float, nnodes: int) -> Prediction:
    """What NCCL runs: the faster of ring and tree (its tuner picks by predicted time)."""
    return min(nccl_ring(m, nbytes, nnodes), nccl_tree(m, nbytes, nnodes), key=lambda p: p.time)


def paper_rows(m: Paper, gpus: Sequence[int] = PAPER_GPUS, nbytes: float = PAPER_BYTES) -> list[dict]:
    rows = []
    for g in gpus:
        n = g // m.gpus_per_node
        rows.append({"gpus": g, "hfreduce": round(hfreduce(m, nbytes, n).algbw(nbytes), 3),
                     "nccl": round(nccl(m, nbytes, n).algbw(nbytes), 3),
                     "hfreduce_nvlink": round(hfreduce(m, nbytes, n, nvlink=True).algbw(nbytes), 3)})
    return rows


# --------------------------------------------------------------------------------------- the testbed


@dataclass(frozen=True)
class Testbed:
    """The namespace hosts of tests/netns.py on one VM, as bench/testbed_measure.py measured them."""

    link_rate: float = _param(0.0, "measured: MPI payload bytes/s one way over a shaped link, both ways busy")
    link_rate_all_busy: dict = field(default_factory=dict, metadata={
        "source": "measured: the same with H hosts each sending to the next at once, by H (str)"})
    link_latency: float = _param(0.0, "measured: half an 8-byte MPI ping-pong's round trip over it")
    tcp_rate: float = _param(0.0, "measured: payload bytes/s the whole VM moves over unshaped links")
    memcpy_rate: float = _param(0.0, "measured: bytes of memory one thread's np.copyto moves a second")
    reduce_rate: float = _param(0.0, "measured: bytes of memory one thread's hfr sum of 2 arrays moves")
    cores: int = _param(0, "measured: os.cpu_count(); every host's processes share them")
    chunk_bytes: float = _param(8 * MiB, "hfr's DEFAULT_CHUNK_BYTES (hfr/settings.py)")
    block_bytes: float = _param(256 * 1024, "hfr's DEFAULT_BLOCK_BYTES (hfr/internode.py)")

    def link_rate_of(self, hosts: int) -> float:
        """One link's rate while every one of `hosts` hosts sends (they share the VM's cores)."""
        return self.link_rate_all_busy.get(str(hosts), self.link_rate)

    @classmethod
    def load(cls, path: str | Path) -> "Testbed":
        params = json.loads(Path(path).read_text())["params"]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names})


def _testbed_prediction(t: Testbed, hosts: int, link_bytes: float, cpu_seconds: float, lat: float,
                        fill: float) -> Prediction:
    """The link of the busiest host each way, and the VM's cores that every host shares: each payload
    byte over TCP costs 1/tcp_rate of the whole VM; cpu_seconds is one host's other work, one core."""
    cpu = hosts * (link_bytes / t.tcp_rate + cpu_seconds / t.cores)
    return Prediction({"link": link_bytes / t.link_rate_of(hosts), "cpu": cpu}, lat, fill)


def hfr_testbed(t: Testbed, algo: str, nbytes: float, hosts: int, ranks_per_host: int) -> Prediction:
    """hfr with NumPy arrays: each rank memcpys its chunk into the node's segment, the node's ranks
    reduce it (L > 1), each local rank runs the inter-node algo on its slice (L rails share the link),
    each rank copies the result out. Chunks go through the inter-node step one after another."""
    L = ranks_per_host
    s = schedule(algo, hosts)
    def node_work(size: float) -> float:  # one node's copies in and out (read + write) and reduce, one core
        return 2 * L * 2 * size / t.memcpy_rate + ((L + 1) * size if L > 1 else 0.0) / t.reduce_rate

    chunk = min(nbytes, t.chunk_bytes)
    block = min(t.block_bytes, chunk / L / 2) * L  # L rails' blocks share the link
    lat = math.ceil(nbytes / t.chunk_bytes) * latency(s, t.link_latency, block, t.link_rate_of(hosts))
    cpu = node_work(nbytes) + s.combined * nbytes / t.reduce_rate
    return _testbed_prediction(t, hosts, s.sent * nbytes, cpu, lat, node_work(chunk) / t.cores)


def rabenseifner_on_hosts(ranks: int, per_host: int) -> tuple[float, float, int]:
    """MPICH's allreduce for large arrays (recursive halving, then doubling; the partner of step k is
    rank ^ 2^k) over `ranks` ranks (a power of two) placed per_host a host in rank order: (bytes a host
    sends to other hosts, bytes its ranks send each other, steps that cross hosts), per byte of S."""
    if ranks & (ranks - 1):
        raise ValueError(f"ranks must be a power of two here, got {ranks}")
    cross = inside = 0.0
    steps, mask, share = 0, 1, 0.5
    while mask < ranks:
        crossing = [(r ^ mask) // per_host != 0 for r in range(per_host)]  # host 0's ranks
        cross += 2 * share * sum(crossing)  # reduce-scatter and allgather both
        inside += 2 * share * (per_host - sum(crossing))
        steps += 2 * any(crossing)
        mask, share = mask << 1, share / 2
    return cross, inside, steps


def mpich_testbed(t: Testbed, nbytes: float, hosts: int, ranks_per_host: int) -> Prediction:
    """MPICH's flat Rabenseifner over all ranks (not node-aware): shared memory inside a host (a copy
    in and out of its cells), TCP between hosts; each rank combines S(P-1)/P."""
    ranks = hosts * ranks_per_host
    cross, inside, steps = rabenseifner_on_hosts(ranks, ranks_per_host)
    copies = 2 * 2 * inside * nbytes / t.memcpy_rate
    reduce = ranks_per_host * 3 * (ranks - 1) / ranks * nbytes / t.reduce_rate
    return _testbed_prediction(t, hosts, cross * nbytes, copies + reduce, steps * t.link_latency, 0.0)


def predict_run(t: Testbed, run: dict) -> Prediction:
    """The prediction for one row of testbed.json's runs ("hfr:ALGO" or "mpi")."""
    backend = run["backend"]
    if backend == "mpi":
        return mpich_testbed(t, run["size"], run["hosts"], run["ranks_per_host"])
    return hfr_testbed(t, backend.split(":", 1)[1], run["size"], run["hosts"], run["ranks_per_host"])


# ---------------------------------------------------------------------------------------------- CLI


def _print_sources(machine) -> None:
    for name, value, source in sources(machine):
        shown = ", ".join(f"{k}: {v:.4g}" for k, v in value.items()) if isinstance(value, dict) else f"{value:>12.4g}"
        print(f"  {name:22} {shown}  {source}")


SENSITIVITY = (
    ("as above", {}),
    ("H2D by GDRCopy, 2 reads a byte (the paper's 24-operation count)", {"h2d_reads": 2}),
    ("all traffic on one socket's 8 channels (160 GB/s)", {"memory_rate": 160e9}),
    ("memory at DDR4-3200's peak, 16 x 25.6 GB/s", {"memory_rate": 409.6e9}),
)


def print_paper(m: Paper) -> list[dict]:
    rows = paper_rows(m)
    print(f"# The paper's cluster (Fig. 7), allreduce of {PAPER_BYTES // MiB} MiB; GB/s = S / time")
    _print_sources(m)
    lo, hi = FIG_7A["hfreduce"]
    nlo, nhi = FIG_7A["nccl"]
    print(f"\n(b) Fig. 7a: HFReduce (paper {lo}-{hi} GB/s) and NCCL (paper {nlo}-{nhi} GB/s)")
    print(f"{'GPUs':>6} {'nodes':>6} {'HFReduce':>9} {'bound':>7} {'NCCL':>6} {'ring':>6} {'tree':>6} {'bound':>10}")
    for row in rows:
        n = row["gpus"] // m.gpus_per_node
        h, r, t = hfreduce(m, PAPER_BYTES, n), nccl_ring(m, PAPER_BYTES, n), nccl_tree(m, PAPER_BYTES, n)
        print(f"{row['gpus']:>6} {n:>6} {row['hfreduce']:>9.2f} {h.bound:>7} {row['nccl']:>6.2f} "
              f"{r.algbw(PAPER_BYTES):>6.2f} {t.algbw(PAPER_BYTES):>6.2f} {nccl(m, PAPER_BYTES, n).bound:>10}")
    print(f"\nHFReduce at 128 GPUs if one parameter were otherwise (what the prediction hangs on):")
    for label, change in SENSITIVITY:
        h = hfreduce(dataclasses.replace(m, **change), PAPER_BYTES, 128 // m.gpus_per_node)
        print(f"  {label:66} {h.algbw(PAPER_BYTES):6.2f} GB/s, bound: {h.bound}")
    print(f"\n(c) Fig. 7b: HFReduce with NVLink (paper > {FIG_7B_ABOVE} GB/s)")
    print(f"{'GPUs':>6} {'nodes':>6} {'HFReduce+NVLink':>16} {'bound':>7}")
    for row in rows:
        n = row["gpus"] // m.gpus_per_node
        print(f"{row['gpus']:>6} {n:>6} {row['hfreduce_nvlink']:>16.2f} "
              f"{hfreduce(m, PAPER_BYTES, n, nvlink=True).bound:>7}")
    return rows


def print_testbed(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    t = Testbed.load(path)
    print(f"# The testbed ({doc['machine']}, {doc['date']}, hfr {doc['commit']}), links {doc['params']['link_shaped_to']}")
    _print_sources(t)
    print(f"{'hosts x L':>9} {'backend':>13} {'MiB':>5} {'placement':>12} {'measured ms':>12} {'model ms':>9} "
          f"{'model/meas':>10} {'bound':>5}")
    for run in doc["runs"]:
        p = predict_run(t, run)
        measured = run["time_us"] / 1e3
        print(f"{run['hosts']:>5} x {run['ranks_per_host']} {run['backend']:>13} {run['size'] // MiB:>5} "
              f"{run['placement']:>12} {measured:>12.1f} {p.time * 1e3:>9.1f} {p.time * 1e3 / measured:>10.2f} "
              f"{p.bound:>5}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpus = [r["gpus"] for r in rows]
    for key, label, color in (("hfreduce", "HFReduce (model)", "C0"), ("nccl", "NCCL (model)", "C1"),
                              ("hfreduce_nvlink", "HFReduce with NVLink (model)", "C2")):
        ax.plot(gpus, [r[key] for r in rows], "o-", color=color, label=label)
    for key, label, color in (("hfreduce", "HFReduce, Fig. 7a", "C0"), ("nccl", "NCCL, Fig. 7a", "C1")):
        ax.axhspan(*FIG_7A[key], color=color, alpha=0.15, label=label)
    ax.axhline(FIG_7B_ABOVE, color="C2", ls="--", label="HFReduce with NVLink, Fig. 7b: > 10")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_xlabel("GPUs (8 a node)")
    ax.set_ylabel("inter-node bandwidth, GB/s (186 MiB / time)")
    ax.set_title("Allreduce of 186 MiB on the paper's cluster: model vs Fig. 7")
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paper", action="store_true", help="print the model of the paper's cluster against Fig. 7")
    p.add_argument("--json", metavar="PATH", help="write [{gpus, hfreduce, nccl}, ...] (GB/s, 186 MiB)")
    p.add_argument("--plot", metavar="PATH", help="plot the paper's cluster against Fig. 7's ranges")
    p.add_argument("--testbed", metavar="JSON", help="predict the runs of bench/testbed_measure.py's JSON")
    a = p.parse_args(argv)
    if not (a.paper or a.json or a.plot or a.testbed):
        a.paper = True
    machine = Paper()
    rows = print_paper(machine) if a.paper else paper_rows(machine)
    if a.json:
        Path(a.json).write_text(json.dumps([{k: r[k] for k in ("gpus", "hfreduce", "nccl")} for r in rows],
                                           indent=1) + "\n")
    if a.plot:
        plot(rows, a.plot)
    if a.testbed:
        print_testbed(a.testbed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
