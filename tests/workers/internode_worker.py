"""Checks of hfr.internode on COMM_WORLD as the rail; run by tests/test_internode.py under mpiexec.

    internode_worker.py check      every algo, dtype, op and size; reduce and broadcast to every root;
                                   the bits of CUT_FREE_ALGOS independent of blocks and cuts; schedules
                                   rewound and run again; vote records carrying data; allgather and
                                   reduce_scatter of shards held or owned in every pattern
    internode_worker.py dead_peer  2 ranks, rank 1 never calls: rank 0 must time out, naming rank 1 (every
                                   algo, the allgather and the reduce_scatter); the stopped schedule
                                   refuses to run again

Every rank makes every rank's input from a seed (rank, case), so each computes the expected result
itself. Prints "OK <what>" lines on rank 0; any failure raises, and mpi4py's runner aborts the job.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

from hfr import internode
from hfr.errors import HFRTimeoutError
from hfr.kernels import KERNEL_OPS
from hfr.ops import DTYPES, Op, accumulation_dtype

COMM = MPI.COMM_WORLD
RANK, NRANKS = COMM.Get_rank(), COMM.Get_size()
SIZES = (0, 1, 7, 100_003)
UFUNCS = {Op.SUM: np.add, Op.MAX: np.maximum, Op.MIN: np.minimum, Op.PROD: np.multiply}
POISON = 0xA5
CUT_FREE_ALGOS = ("dbtree", "doubling", "halving", "ring", "gather")  # whose bits do not depend on how the array is cut


def deadline() -> float:
    return time.monotonic() + 60


def make_input(rank: int, dtype: np.dtype, op: Op, size: int, case: int) -> np.ndarray:
    """Rank `rank`'s input: never zeros; values that keep float sums and products well conditioned."""
    rng = np.random.default_rng([rank, case, size])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)  # the full range: sums and products wrap around, exactly as NumPy's
        return rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
    if op == Op.PROD:
        return rng.uniform(0.5, 1.5, size).astype(dtype)
    return rng.uniform(-1, 1, size).astype(dtype)


def is_exact(dtype: np.dtype, op: Op) -> bool:
    """Whether the reduction is exact whatever the order: integers (which wrap) and max and min."""
    return dtype.kind in "iu" or op in (Op.MAX, Op.MIN)


def expected(dtype: np.dtype, op: Op, size: int, case: int) -> np.ndarray:
    """The reduction over all ranks: exact (in the dtype) for ints, max and min; float64 otherwise."""
    inputs = [make_input(r, dtype, op, size, case) for r in range(NRANKS)]
    acc = inputs[0].copy() if is_exact(dtype, op) else inputs[0].astype(np.float64)
    for x in inputs[1:]:
        UFUNCS[op](acc, x.astype(acc.dtype), out=acc)
    return acc


def check_close(result: np.ndarray, want: np.ndarray, dtype: np.dtype, op: Op, what: str) -> None:
    if is_exact(dtype, op):
        bad = np.flatnonzero(result != want)
        assert bad.size == 0, f"{what}: {bad.size} wrong, first at {bad[0]}: {result[bad[0]]} != {want[bad[0]]}"
        return
    eps = float(ml_dtypes.finfo(dtype).eps)  # np.finfo knows bfloat16 only with newer ml_dtypes
    rounding = eps * (2 if accumulation_dtype(dtype) != dtype else 1)  # a half type: one rounding per combine
    tol = 4 * NRANKS * rounding * (np.abs(want) + (1 if op == Op.SUM else 0))
    err = np.abs(result.astype(np.float64) - want)
    assert np.all(err <= tol), f"{what}: max error {err.max()} at {err.argmax()}, tolerance {tol[err.argmax()]}"


def digest(a: np.ndarray) -> str:
    return hashlib.sha1(a.view(np.uint8).tobytes()).hexdigest()


def check_same_everywhere(a: np.ndarray, what: str) -> None:
    digests = COMM.allgather(digest(a))
    assert len(set(digests)) == 1, f"{what}: ranks differ: {digests}"


def check_allreduce() -> None:
    case = 0
    for algo in internode.ALGOS:
        for dtype in DTYPES:
            for op in KERNEL_OPS:
                for size in SIZES:
                    case += 1
                    buf = make_input(RANK, dtype, op, size, case)
                    internode.allreduce(COMM, buf, 3, op, algo=algo, deadline=deadline())
                    what = f"allreduce {algo} {dtype} {op.value} size {size}"
                    check_close(buf, expected(dtype, op, size, case), dtype, op, what)
                    check_same_everywhere(buf, what)
    if RANK == 0:
        print(f"OK allreduce: {case} cases")


def check_bits_do_not_depend_on_cuts() -> None:
    """A float16 sum spanning several granules, with an odd first: each of CUT_FREE_ALGOS gives the same
    bits for any blocks and cuts."""
    dtype, first = np.dtype(np.float16), 12_345
    granule = internode.TREE_GRANULE_BYTES // dtype.itemsize
    size = 3 * granule + 777
    data = make_input(RANK, dtype, Op.SUM, size, 1000)
    for algo in CUT_FREE_ALGOS:
        whole = data.copy()
        internode.allreduce(COMM, whole, first, Op.SUM, algo=algo, deadline=deadline())
        check_close(whole, expected(dtype, Op.SUM, size, 1000), dtype, Op.SUM, f"{algo} float16 several granules")
        check_same_everywhere(whole, f"{algo} float16 several granules")
        for block_bytes in (1002, (64 << 10) + 2, 1 << 20):
            buf = data.copy()
            internode.allreduce(COMM, buf, first, Op.SUM, algo=algo, block_bytes=block_bytes, deadline=deadline())
            assert digest(buf) == digest(whole), f"{algo} bits change with block_bytes {block_bytes}"
        for cuts in ([granule // 2], [1, 2, granule + 5], [size // 3, 2 * size // 3, size - 1]):
            buf = data.copy()
            for start, stop in zip([0, *cuts], [*cuts, size]):
                internode.allreduce(COMM, buf[start:stop], first + start, Op.SUM, algo=algo, deadline=deadline())
            assert digest(buf) == digest(whole), f"{algo} bits change when cut at {cuts}"
    if RANK == 0:
        print(f"OK {', '.join(CUT_FREE_ALGOS)} bits independent of block_bytes and cuts")


def check_reduce_and_broadcast() -> None:
    case = 2000
    for root in range(NRANKS):
        for algo in internode.ALGOS:
            for dtype in (np.dtype(np.float32), DTYPES[1], np.dtype(np.int8)):
                for size in (1, 100_003):
                    case += 1
                    buf = make_input(RANK, dtype, Op.SUM, size, case)
                    internode.reduce(COMM, buf, 5, Op.SUM, root, algo=algo, block_bytes=40_000, deadline=deadline())
                    if RANK == root:
                        what = f"reduce to {root} {algo} {dtype} size {size}"
                        check_close(buf, expected(dtype, Op.SUM, size, case), dtype, Op.SUM, what)
        for size in (0, 1, 7, 100_003):
            source = make_input(root, np.dtype(np.float64), Op.SUM, size, case)
            buf = source.copy() if RANK == root else np.full(size * 8, POISON, np.uint8).view(np.float64)
            internode.broadcast(COMM, buf, 1, root, block_bytes=10_000, deadline=deadline())
            assert digest(buf) == digest(source), f"broadcast from {root} size {size}: wrong bits"
    if RANK == 0:
        print("OK reduce and broadcast from every root")


def check_rewound_schedules() -> None:
    """A doubling or halving schedule rewound and run again over new data in the same buffer (as the
    engine reuses one per call shape) gives each round's own result; so does the call check's vote."""
    case = 3000
    for halving in (False, True):
        for dtype, op in ((np.dtype(np.float32), Op.SUM), (np.dtype(np.int64), Op.MAX)):
            buf = np.empty(1001, dtype)
            schedule = internode.schedule(COMM, buf, 0, op, "halving" if halving else "doubling", 2,
                                          scratch=np.empty(buf.nbytes, np.uint8))
            for round_ in range(4):
                case += 1
                buf[:] = make_input(RANK, dtype, op, buf.size, case)
                if round_:
                    schedule.rewind()
                assert schedule.run(deadline())
                what = f"{'halving' if halving else 'doubling'} rewound {round_} times, {dtype} {op.value}"
                check_close(buf, expected(dtype, op, buf.size, case), dtype, op, what)
    record = internode.VoteRecord()
    vote = internode.vote_schedule(COMM, record)
    for round_ in range(3):
        record.votes[:] = RANK * 10 + round_
        if round_:
            vote.rewind()
        assert vote.run(deadline())
        assert (record.votes == (NRANKS - 1) * 10 + round_).all(), f"vote rewound {round_} times: {record.votes}"
    if RANK == 0:
        print("OK rewound schedules")


def check_vote_records() -> None:
    """The call check's vote carrying data (hfr/_internode.pyx, "vote records"): where every rank votes
    for the same call the data comes back with the bits doubling gives, votes max-reduced; where ranks
    vote for different calls (or one flags a mismatch), with data of different lengths up to the room,
    every rank gets the votes' max and nothing breaks; the same record then serves agreeing calls again."""
    record = internode.VoteRecord()
    room = internode.VOTE_ROOM_BYTES
    plain_votes = internode.vote_schedule(COMM, record)
    case = 4000
    for round_, (dtype, op, count, disagree) in enumerate([
            (np.dtype(np.float32), Op.SUM, 7, None), (np.dtype(np.float64), Op.SUM, room // 8, None),
            (np.dtype(ml_dtypes.bfloat16), Op.SUM, 1001, "descriptor"), (np.dtype(np.int32), Op.MAX, 1, "flag"),
            (np.dtype(np.float16), Op.PROD, 13, None), (np.dtype(np.float32), Op.SUM, 0, "descriptor"),
            (np.dtype(np.int64), Op.SUM, 100, None)]):
        case += 1
        mine = count if disagree is None else (RANK * 997) % (room // dtype.itemsize + 1)  # lengths differ too
        v = [5, mine, 7, 1, 0] if disagree != "descriptor" else [RANK % 2, mine, 7, 1, 0]
        votes = [int(disagree == "flag" and RANK == NRANKS - 1), *v, *(-a for a in v)]
        record.votes[:] = votes
        data = make_input(RANK, dtype, op, mine, case)
        record.data(mine, dtype)[:] = data
        schedule = internode.vote_schedule(COMM, record, mine, dtype, op, threads=2)
        assert schedule.run(deadline())
        everyone = np.array(COMM.allgather(votes))
        want_votes = everyone.max(axis=0)
        assert (record.votes == want_votes).all(), f"round {round_}: votes {record.votes} != {want_votes}"
        agreed = not want_votes[0] and (want_votes[1:6] == -want_votes[6:]).all()
        assert agreed == (disagree is None or disagree == "descriptor" and NRANKS == 1), f"round {round_}: {agreed}"
        if agreed:
            buf = data.copy()
            internode.allreduce(COMM, buf, 0, op, algo="doubling", deadline=deadline())
            assert digest(record.data(mine, dtype)) == digest(buf), f"round {round_}: bits differ from doubling's"
            check_close(record.data(mine, dtype), expected(dtype, op, mine, case), dtype, op, f"round {round_}")
        plain_votes.rewind()  # a bare vote (no data) after each round, as the engine runs
        record.votes[:] = round_
        assert plain_votes.run(deadline())
        assert (record.votes == round_).all(), f"round {round_}: the bare vote gave {record.votes}"
    if RANK == 0:
        print("OK vote records")


def check_allgather() -> None:
    """Every rank's slice of one global array, each element held by one rank (shards of `length` elements,
    contiguous per rank or dealt round, slices that start or end inside a shard or hold no shard of some
    rank, blocks from one element to the whole slice): every rank ends with the global array's bytes, the
    parts it did not hold poisoned before."""
    cases = 0
    for dtype in (np.dtype(np.float16), np.dtype(np.int64)):
        for length in (1, 7, 1009):
            shards = 2 * NRANKS
            values = make_input(NRANKS, dtype, Op.SUM, shards * length, length)  # the same on every rank
            for dealt in (False, True):  # shard s is rank s // 2's, or rank s % NRANKS's
                held = [[s * length for s in range(shards) if (s % NRANKS if dealt else s // 2) == r]
                        for r in range(NRANKS)]
                for first, stop in ((0, shards * length), (length // 2, shards * length - 1), (length, 2 * length + 1)):
                    for block_bytes in (dtype.itemsize, 1000, 1 << 20):
                        buf = values[first:stop].copy()
                        mine = np.zeros(buf.size, bool)
                        for start in held[RANK]:
                            mine[max(start - first, 0) : max(start + length - first, 0)] = True
                        buf.view(np.uint8).reshape(buf.size, -1)[~mine] = POISON
                        internode.allgather(COMM, buf, first, held, length, block_bytes=block_bytes,
                                            deadline=deadline())
                        what = f"allgather {dtype} length {length} dealt {dealt} [{first}, {stop}) blocks {block_bytes}"
                        assert digest(buf) == digest(values[first:stop]), what
                        cases += 1
    for held, says in (([[0]] * (NRANKS + 1), "one list of shards per rail rank"),
                       ([[0, 2]] + [[]] * (NRANKS - 1), "overlap")):
        try:
            internode.allgather_schedule(COMM, np.empty(10, np.float32), 0, held, 5)
        except ValueError as e:
            assert says in str(e), f"shards {held}: {e}"
        else:
            raise AssertionError(f"shards {held} were taken")
    if RANK == 0:
        print(f"OK allgather: {cases} cases")


def check_reduce_scatter() -> None:
    """Each rank's input over one global index range, each element owned by one rank (shards contiguous per
    rank or dealt round; slices that start or end inside a shard): every owner ends with its elements reduced,
    close to the float64 reduction (exact for ints, max and min), with the same bits for any blocks and cuts."""
    cases = 0
    for dtype, op in ((np.dtype(np.float32), Op.SUM), (DTYPES[1], Op.SUM), (np.dtype(np.int32), Op.PROD),
                      (np.dtype(np.float64), Op.MAX), (np.dtype(np.float16), Op.MIN)):
        for length in (1, 7, 1009):
            shards = 2 * NRANKS
            case = 5000 + length
            data = make_input(RANK, dtype, op, shards * length, case)
            want = expected(dtype, op, shards * length, case)
            for dealt in (False, True):
                owned = [[s * length for s in range(shards) if (s % NRANKS if dealt else s // 2) == r]
                         for r in range(NRANKS)]
                mine = np.zeros(shards * length, bool)
                for start in owned[RANK]:
                    mine[start : start + length] = True
                for first, stop in ((0, shards * length), (length // 2, shards * length - 1)):
                    results = []
                    for block_bytes, cuts in ((dtype.itemsize, []), (1000, []), (1 << 20, []),
                                              (1000, [first + length + 1, stop - length // 2 - 1])):
                        buf = data[first:stop].copy()
                        for lo, hi in zip([first, *cuts], [*cuts, stop]):
                            internode.reduce_scatter(COMM, buf[lo - first : hi - first], lo, op, owned, length,
                                                     block_bytes=block_bytes, deadline=deadline(), threads=2)
                        ours = mine[first:stop]
                        what = (f"reduce_scatter {dtype} {op.value} length {length} dealt {dealt} [{first}, {stop}) "
                                f"blocks {block_bytes} cuts {cuts}")
                        check_close(buf[ours], want[first:stop][ours], dtype, op, what)
                        results.append(digest(buf[ours]))
                        cases += 1
                    assert len(set(results)) == 1, f"reduce_scatter {dtype} {op.value}: bits change with blocks or cuts"
    if RANK == 0:
        print(f"OK reduce_scatter: {cases} cases")


def check_dead_peer() -> None:
    """Rank 1 never calls; rank 0 must raise HFRTimeoutError naming rank 1 for every algo, the allgather and the
    reduce_scatter, in time."""
    if RANK == 1:
        time.sleep(60)  # the job ends with rank 0's Abort long before
        return
    shards = [[0], [500]]  # of 1000 elements: rank 0 holds (owns) the first half, rank 1 the second
    calls = [(algo, lambda d, algo=algo: internode.allreduce(COMM, np.ones(1000, np.float32), 0, Op.SUM, algo=algo,
                                                             deadline=d)) for algo in internode.ALGOS]
    calls += [("allgather", lambda d: internode.allgather(COMM, np.ones(1000, np.float32), 0, shards, 500, deadline=d)),
              ("reduce_scatter", lambda d: internode.reduce_scatter(COMM, np.ones(1000, np.float32), 0, Op.SUM, shards,
                                                                    500, deadline=d))]
    for name, call in calls:
        start = time.monotonic()
        try:
            call(start + 0.5)
        except HFRTimeoutError as e:
            late = time.monotonic() - start - 0.5
            assert late < 3, f"{name}: timed out {late:.1f} s after the deadline"
            assert name in ("mpi", "gather") or "1" in str(e), f"{name}: the error does not name rank 1: {e}"
            print(f"OK {name} timed out {late * 1e3:.0f} ms after the deadline: {e}", flush=True)
        else:
            raise AssertionError(f"{name} returned without its peer")
    # A schedule that stopped part way may still have receives posted: it never runs again.
    buf = np.ones(1000, np.float32)
    stopped = internode.schedule(COMM, buf, 0, Op.SUM, "doubling", 1)
    assert not stopped.run(time.monotonic() + 0.2)
    try:
        stopped.rewind()
    except ValueError as e:
        print(f"OK a stopped schedule refuses to run again: {e}", flush=True)
    internode.abandon(stopped)
    print("OK dead peer", flush=True)
    os._exit(0)  # MPI_Finalize would wait for rank 1


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check_allreduce()
        check_bits_do_not_depend_on_cuts()
        check_reduce_and_broadcast()
        check_rewound_schedules()
        check_vote_records()
        check_allgather()
        check_reduce_scatter()
    elif sys.argv[1] == "dead_peer":
        check_dead_peer()
    else:
        raise SystemExit(f"unknown check {sys.argv[1]!r}")
