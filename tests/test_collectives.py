"""allreduce, reduce and broadcast under real mpiexec: 1-4 ranks, emulated node layouts, every dtype
and op, odd sizes, out of place and in place, bitwise equal across ranks and across chunk sizes."""
import json

import numpy as np
import pytest

from .mpirun import run_mpi

# (ranks, HFR local_size): one node of 1-4 ranks, and 2, 3 and 4 emulated nodes.
LAYOUTS = [(1, None), (2, None), (3, None), (4, 4), (4, 2), (4, 1), (3, 1)]


@pytest.mark.parametrize("nprocs,local_size", LAYOUTS, ids=[f"{n}ranks-local{l}" for n, l in LAYOUTS])
def test_every_dtype_op_and_size(nprocs, local_size):
    cfg = {"local_size": local_size, "chunk_bytes": [4096, 1 << 20], "sizes": [0, 1, 7, 100003]}
    out = run_mpi(nprocs, "collectives_worker.py", json.dumps(cfg), timeout=240).stdout
    assert "collectives ok" in out


@pytest.mark.parametrize("nprocs,local_size", [(2, None), (2, 1), (4, 2)])
def test_the_front_runs_small_host_allreduces_and_hands_the_rest_to_the_engine(nprocs, local_size):
    """The blocking allreduce of a NumPy array or CPU tensor runs in C (hfr/_front.pyx), in place and out of
    place, every op on six dtypes, right element by element; the engine's Python takes every other call
    (other op spellings, a subclass, a call behind an async one, across nodes two chunks and a call shape's
    first calls) and refuses bad input as before (meta tensors too), the arrays untouched."""
    out = run_mpi(nprocs, "front_worker.py", "none" if local_size is None else str(local_size), timeout=120).stdout
    assert out.count("front ok") == nprocs


def test_without_torchs_exchange_api_the_engine_takes_tensors():
    """With a torch whose tensors have no DLPack exchange API (torch before 2.11), the front takes no tensor:
    the engine's Python runs every tensor call, right all the same."""
    pytest.importorskip("torch")
    out = run_mpi(2, "front_worker.py", "none", "no-exchange-api", timeout=120).stdout
    assert out.count("front ok") == 2


def test_a_whole_call_is_not_overwritten_by_the_next_calls_copies_ahead():
    """A whole call's rank reduces its out from the input slots and may leave while a slower rank still
    reads them; the next call, of three chunks, copies its third chunk into that stage before its call
    check. 20000 rounds on 3 ranks: before REDUCED waited for the whole call's reading, 2-5 went wrong."""
    out = run_mpi(3, "slot_reuse_worker.py", "20000", timeout=180).stdout
    assert "20000 iterations: 0 results wrong" in out, out


@pytest.mark.parametrize("algo", ["dbtree", "doubling", "halving", "gather", "ring", "mpi"])
def test_every_inter_node_algo_through_the_engine(algo):
    """HFR_ALGO on 2 emulated nodes of 2 ranks: right results; the bits of all but ring and mpi do not depend
    on the chunk size (ring's and mpi's may, for floats: one chunk size for them). MPI's own MAX and MIN
    drop NaN (the inputs hold some), so mpi is checked on sums and averages."""
    chunks = [4096, 1 << 20] if algo not in ("ring", "mpi") else [4096]
    cfg = {"local_size": 2, "chunk_bytes": chunks, "sizes": [1, 7, 100003],
           "dtypes": ["float32", "float16", "int64"], "ops": ["sum", "avg"] if algo == "mpi" else ["sum", "avg", "max"]}
    out = run_mpi(4, "collectives_worker.py", json.dumps(cfg), env={"HFR_ALGO": algo}, timeout=240).stdout
    assert "collectives ok" in out


@pytest.mark.parametrize("algo", ["dbtree", "ring", "halving"])
def test_one_rank_a_node_makes_each_chunk_in_out_itself(algo):
    """3 emulated nodes of 1 rank: an allreduce's chunks are made in out itself, where the rail works on
    them; right results, in place and not, and but for ring the same bits for any chunk size."""
    cfg = {"local_size": 1, "chunk_bytes": [4096, 1 << 20] if algo != "ring" else [4096], "sizes": [0, 7, 100003],
           "dtypes": ["float32", "bfloat16", "int64"], "ops": ["sum", "avg", "max"],
           "collectives": ["allreduce", "reduce"]}
    out = run_mpi(3, "collectives_worker.py", json.dumps(cfg), env={"HFR_ALGO": algo}, timeout=240).stdout
    assert "collectives ok" in out


@pytest.mark.parametrize("nprocs,local_size", [(2, None), (4, 2)])
def test_large_array_many_chunks(nprocs, local_size):
    """A few MiB + 3 elements: many chunks, a ragged last one, slices split across trees."""
    cfg = {"local_size": local_size, "chunk_bytes": [64 << 10, 4 << 20], "sizes": [(3 << 20) + 3],
           "dtypes": ["float32", "bfloat16", "int32"], "ops": ["sum", "avg", "max"], "collectives": ["allreduce"]}
    run_mpi(nprocs, "collectives_worker.py", json.dumps(cfg), timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("local_size", [None, 1], ids=["one-node", "two-nodes"])
def test_arrays_past_32_bit_counts_and_4_gib(local_size):
    env = {"HFR_LOCAL_SIZE": str(local_size)} if local_size else {}
    assert "large ok" in run_mpi(2, "large_worker.py", env=env, timeout=400).stdout


def test_close_closes_the_default_communicator():
    assert run_mpi(2, "close_worker.py", timeout=60).stdout.count("close ok") == 2


def test_a_host_call_on_one_node_is_cut_into_chunks_that_fit_half_the_cache():
    from hfr._node_call import cache_chunk_bytes
    from hfr.engine import STAGES

    chunk = cache_chunk_bytes(32 << 20, 2, 8 << 20)  # 3 stages of 3 slots in 16 MiB
    assert chunk % 4096 == 0 and STAGES * 3 * chunk <= 16 << 20 < STAGES * 3 * (chunk + 4096)
    assert cache_chunk_bytes(0, 4, 8 << 20) == 8 << 20  # the cache unknown: the Communicator's chunk
    assert cache_chunk_bytes(1 << 20, 4, 8 << 20) == 256 << 10  # the least
    assert cache_chunk_bytes(1 << 30, 2, 8 << 20) == 8 << 20
    assert cache_chunk_bytes(32 << 20, 4, 8 << 20, oversubscribed=True) == 8 << 20  # hand-offs cost time slices


def test_a_call_is_cut_into_the_fewest_chunks_of_one_size():
    """NodeCall.chunks, as the chunk loop cuts: ceil(total / chunk) chunks that tile the call, all of one size
    (a multiple of 4 KiB, at most the chunk) but the last, which falls short by the rounding alone; each
    chunk's slices tile it across the local ranks; each slice is reduced to its place in its stage's result
    slot (chunk c of the next call is chunk chunks_done + c: stage (chunks_done + c) % STAGES), or in out."""
    from hfr._node_call import NodeCall, Protocol

    rng = np.random.default_rng(5)
    for _ in range(300):
        itemsize = int(rng.choice([1, 2, 4, 8]))
        chunk = int(rng.integers(1, 64)) * int(Protocol.CHUNK_ALIGN_BYTES)
        elements = int(rng.choice([0, 1, 7, int(rng.integers(1, 40 * chunk // itemsize))]))
        local_size = int(rng.integers(1, 5))
        in_out = local_size == 1 and bool(rng.integers(2))
        slot_bytes = chunk + int(rng.integers(0, 3)) * 4096
        stage_bytes = (local_size + 1) * slot_bytes
        slices = []
        for local_rank in range(local_size):
            # only the cut is asked of it: no segment behind these addresses
            node_call = NodeCall(0, 64, local_size, local_rank, 1.0, 0, stage_bytes, slot_bytes, local_size,
                                 local_rank, 1, 0, chunk)
            slices.append(node_call.chunks(elements, itemsize, in_out))
        cuts = slices[0]
        assert len(cuts) == -(-elements * itemsize // chunk), (chunk, elements, itemsize)
        assert [cut[0] for cut in cuts] == list(np.cumsum([0] + [cut[1] for cut in cuts])[:-1])
        assert sum(cut[1] for cut in cuts) == elements
        sizes = {cut[1] * itemsize for cut in cuts[:-1]}
        assert len(sizes) <= 1 and all(s <= chunk and s % int(Protocol.CHUNK_ALIGN_BYTES) == 0 for s in sizes), sizes
        assert not cuts or cuts[-1][1] * itemsize <= chunk
        if len(cuts) > 1:  # even: the last short of the others by the rounding alone, never a sliver
            assert sizes.pop() - cuts[-1][1] * itemsize < len(cuts) * int(Protocol.CHUNK_ALIGN_BYTES)
        for c, (_, count, _, _, _) in enumerate(cuts):
            edges = [(cut[c][2], cut[c][3]) for cut in slices]
            assert edges[0][0] == 0 and edges[-1][1] == count
            assert all(hi == lo for (_, hi), (lo, _) in zip(edges, edges[1:]))
            for cut in slices:
                first, _, lo, _, result = cut[c]
                slot = (first + lo) * itemsize if in_out else c % int(Protocol.STAGES) * stage_bytes + local_size * slot_bytes
                assert result == slot + (0 if in_out else lo * itemsize), (c, cut[c], in_out)


def test_the_host_cache_is_the_last_level_of_sysfs_over_its_instances(tmp_path):
    from hfr.topology import host_cache_bytes

    def cache(cpu, index, level, kind, size, shared):
        path = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
        path.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (path / name).write_text(f"{value}\n")

    for cpu in range(4):
        cache(cpu, 0, 1, "Data", "48K", cpu)
        cache(cpu, 1, 1, "Instruction", "32K", cpu)
        cache(cpu, 2, 2, "Unified", "2048K", cpu)
        cache(cpu, 3, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")  # two sockets' L3
        (tmp_path / f"cpu{cpu}" / "cache" / "uevent").write_text("\n")
    (tmp_path / "cpufreq").mkdir()
    assert host_cache_bytes(str(tmp_path)) == 64 << 20
    assert host_cache_bytes(str(tmp_path / "absent")) == 0
