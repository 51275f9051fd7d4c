"""hfr.internode on real MPI jobs: COMM_WORLD is the rail, each rank one node (tests/workers/internode_worker.py)."""
from __future__ import annotations

import time

import pytest

from hfr.internode import ALGOS, DOUBLING_UP_TO_BYTES, HALVING_UP_TO_BYTES, RING_UP_TO_NODES, choose_algo
from tests.mpirun import run_mpi


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 8])
def test_every_algo_dtype_op_size_and_root(nranks):
    out = run_mpi(nranks, "internode_worker.py", "check", timeout=120).stdout
    assert "OK allreduce" in out
    assert "OK dbtree, doubling, halving, ring, gather bits independent of block_bytes and cuts" in out
    assert "OK reduce and broadcast from every root" in out
    assert "OK rewound schedules" in out
    assert "OK vote records" in out
    assert "OK allgather" in out
    assert "OK reduce_scatter" in out


def test_dead_peer_times_out_naming_it():
    start = time.monotonic()
    out = run_mpi(2, "internode_worker.py", "dead_peer", timeout=60, check=False).stdout
    assert "OK dead peer" in out, out
    for algo in ALGOS:
        assert f"OK {algo} timed out" in out, out
    assert "OK allgather timed out" in out, out
    assert "OK reduce_scatter timed out" in out, out
    assert "OK a stopped schedule refuses to run again" in out, out
    assert time.monotonic() - start < 30


def test_choose_algo():
    assert choose_algo(8, 4) == "doubling" and choose_algo(DOUBLING_UP_TO_BYTES, 8) == "doubling"
    assert choose_algo(DOUBLING_UP_TO_BYTES + 4, 4) == "halving" and choose_algo(HALVING_UP_TO_BYTES, 3) == "halving"
    assert choose_algo(HALVING_UP_TO_BYTES + 4, 2) == "ring" and choose_algo(1 << 30, RING_UP_TO_NODES) == "ring"
    assert choose_algo(HALVING_UP_TO_BYTES + 4, RING_UP_TO_NODES + 1) == "dbtree" and choose_algo(8, 1) == "dbtree"
    # never an algo whose bits depend on the cuts
    assert all(choose_algo(1 << k, n) in ("dbtree", "doubling", "halving", "ring")
               for k in range(40) for n in (1, 2, 3, 8, 9, 64))
