"""The Cython reduce kernel: out = x0 op x1 op ... op x(k-1), elementwise, in one pass over memory.

Terms:
- k: the number of inputs x0..x(k-1); out may be x0 itself.
- block: the contiguous run of elements one thread owns (the array is cut into `threads` blocks).
  The calling thread takes blocks too; the others are run by the kernels' own pool of threads, which
  sleep on a condition variable between calls. (Not OpenMP: torch ships its own libgomp.so.1, which a
  process that imports torch first shares with any extension linked to libgomp; its threads then spin
  ~10 ms after each call whatever hfr asks, and ranks sharing a host starve each other: a DDP step
  went from 9.5 to 37 ms.)
- the caller's team: the OpenMP threads of torch's runtime that serve the calling thread's parallel
  regions. After torch's ops on CPU tensors they spin for the next region, and a pool of hfr's own
  fights them for the cores (DeepSpeed's reduce runs on them: bench/RESULTS.md). A thread that asks for
  it (on_caller_team) runs its parts on that team instead, where torch's runtime is the process's
  (take_caller_team) and the team has a thread for each part.
- level: the SIMD instructions one block's tile loops (hfr/_tiles.pxi) are built for. setup.py builds
  them once per level (hfr/_simd_<level>.pyx); at import this module takes the best level the CPU runs,
  so one build runs on any CPU of its architecture at the speed of its best instructions. simd() says
  which level a process runs; every level gives the same bits.
"""
from libc.stdlib cimport free, malloc

cimport numpy as cnp
import importlib
import ml_dtypes
import numpy as np

from hfr._wait cimport hfr_now, sched_yield
from hfr._simd cimport BF16, F32, F64, FP16, I8, I32, I64, SUM, MAX, MIN, PROD, U8, U32, U64, block_fn
from hfr.ops import Op, combining

cnp.import_array()

cdef extern from *:
    """
    /* Whether this CPU (and its OS) runs a level's instructions: setup.py's flags for the level. */
    static int hfr_cpu_runs_avx2(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    #else
        return 0;
    #endif
    }
    static int hfr_cpu_runs_avx512(void) {
    #if defined(__x86_64__) || defined(__i386__)
        return hfr_cpu_runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    #else
        return 0;
    #endif
    }
    """
    bint hfr_cpu_runs_avx2() noexcept nogil
    bint hfr_cpu_runs_avx512() noexcept nogil

cdef extern from "hfr_simd_levels.h":  # written by setup.py
    const char* HFR_SIMD_LEVELS  # the levels this build has, best first

cdef extern from *:
    """
    #include <pthread.h>
    #include <signal.h>
    /* The pool: hfr_pool_run(fn, job, parts) runs fn(job, p) for every p in [0, parts), on the calling
       thread and up to parts - 1 pool threads, and returns the sum of fn's results. Threads are started
       on demand and never stop. One job at a time (`owner`); jobs are numbered, and `claims` holds the
       current job's number (high 32 bits), its parts (16 bits) and how many of them are claimed (low 16
       bits), in one word, so that a thread claims a part of the job it read, or none: with the parts a
       field of their own, a thread that read an exhausted job's claims, then the next job's parts, could
       claim a part past the old job's end before the next job's claims were stored (it ran a part twice
       and counted it against the next job). Between jobs a thread and the caller spin (yielding)
       for HFR_POOL_SPIN_S before they sleep on a condition variable: a call's chunks hand work out every
       ~10-100 us, and a sleeping thread takes ~30 us to wake (bench/RESULTS.md). hfr_pool_init() runs
       once, at import, before any of the pool's locks can be held. */
    #define HFR_POOL_SPIN_S 5e-4
    #define HFR_POOL_MAX_PARTS 0xffff
    typedef int (*hfr_part_fn)(void *job, int part);
    static struct {
        pthread_mutex_t lock, owner;  /* lock: sleeping and waking */
        pthread_cond_t wake, done;
        int threads;
        hfr_part_fn fn;  /* the job, written before its number is published in claims */
        void *job;
        unsigned long long claims;  /* atomic: (job number << 32) | (parts << 16) | parts claimed */
        int unfinished, failed;  /* atomic: the job's parts not yet finished, their failures */
        int sleepers, waiters;  /* atomic: threads asleep on wake, callers on done, or about to be */
    } hfr_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                  PTHREAD_COND_INITIALIZER};

    static inline unsigned long long hfr_pool_claims(void) {
        return __atomic_load_n(&hfr_pool.claims, __ATOMIC_SEQ_CST);
    }

    static int hfr_pool_job_after(unsigned long long seen) { return hfr_pool_claims() >> 32 != seen; }

    static int hfr_pool_finished(unsigned long long unused) {
        return __atomic_load_n(&hfr_pool.unfinished, __ATOMIC_SEQ_CST) == 0;
    }

    /* Wait until ready(arg): yielding for HFR_POOL_SPIN_S, then asleep on cond, counted in *sleepers so that
       whoever makes ready() hold wakes it (hfr_pool_wake). Counter and condition are seq_cst on both sides:
       a waiter that counts itself, then finds ready() false, is seen by the waker, who takes the lock. */
    static void hfr_pool_wait(int (*ready)(unsigned long long), unsigned long long arg, pthread_cond_t *cond,
                              int *sleepers) {
        double idle = hfr_now();
        while (!ready(arg)) {
            if (hfr_now() - idle < HFR_POOL_SPIN_S) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&hfr_pool.lock);
            __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
            while (!ready(arg))
                pthread_cond_wait(cond, &hfr_pool.lock);
            __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&hfr_pool.lock);
        }
    }

    /* After making a waiter's ready() hold: wake those asleep on cond (no lock where none sleeps). */
    static void hfr_pool_wake(pthread_cond_t *cond, int *sleepers) {
        if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) > 0) {
            pthread_mutex_lock(&hfr_pool.lock);
            pthread_cond_broadcast(cond);
            pthread_mutex_unlock(&hfr_pool.lock);
        }
    }

    /* Claim and run parts of job `number` until none is left. A part's fields are read before its claim:
       the job cannot change while one of its parts is unclaimed, so a claim that succeeds read them right. */
    static void hfr_pool_work(unsigned long long number) {
        for (;;) {
            unsigned long long c = hfr_pool_claims();
            hfr_part_fn fn = hfr_pool.fn;
            void *job = hfr_pool.job;
            int part = (int)(c & 0xffff), failed;
            if (c >> 32 != number || part >= (int)((c >> 16) & 0xffff))
                return;
            if (!__atomic_compare_exchange_n(&hfr_pool.claims, &c, c + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                continue;
            failed = fn(job, part);
            if (failed)
                __atomic_fetch_add(&hfr_pool.failed, failed, __ATOMIC_SEQ_CST);
            if (__atomic_sub_fetch(&hfr_pool.unfinished, 1, __ATOMIC_SEQ_CST) == 0)
                hfr_pool_wake(&hfr_pool.done, &hfr_pool.waiters);
        }
    }

    static void *hfr_pool_thread(void *seen_job) {
        unsigned long long seen = (unsigned long long)(uintptr_t)seen_job;
    #if defined(__linux__)
        pthread_setname_np(pthread_self(), "hfr-kernels");  /* as top -H and py-spy show it */
    #endif
        for (;;) {
            hfr_pool_wait(hfr_pool_job_after, seen, &hfr_pool.wake, &hfr_pool.sleepers);
            seen = hfr_pool_claims() >> 32;
            hfr_pool_work(seen);
        }
        return NULL;
    }

    /* The caller's team (the module's docstring): GOMP_parallel(fn, data, 0, 0) runs fn(data) on the calling
       thread and the rest of its team, as `#pragma omp parallel` compiles to; the team's threads claim parts
       from a counter until none is left. The team is always whole, as torch's large ops run it: libgomp
       ends the threads a smaller team leaves out, and torch's next op starts them again (bench/RESULTS.md).
       A team smaller than the job's parts leaves it to the pool: a call would run on fewer threads than hfr's
       own (OMP_NUM_THREADS=1, as MPI jobs often set, makes no team at all), and the team has fewer threads to
       spin against it. Resolved by hfr_team_take, asked for per thread. */
    #include <dlfcn.h>
    typedef void (*hfr_omp_parallel_fn)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);
    static hfr_omp_parallel_fn hfr_omp_parallel;
    static int (*hfr_omp_team_size)(void);  /* omp_get_max_threads: the size of the caller's next team */
    static __thread int hfr_team_asked;  /* the calling thread runs its jobs on its team */

    struct hfr_team_job { hfr_part_fn fn; void *job; int parts, claimed, failed; };

    static void hfr_team_work(void *data) {
        struct hfr_team_job *t = data;
        int part;
        while ((part = __atomic_fetch_add(&t->claimed, 1, __ATOMIC_RELAXED)) < t->parts) {
            int failed = t->fn(t->job, part);
            if (failed)
                __atomic_fetch_add(&t->failed, failed, __ATOMIC_RELAXED);
        }
    }

    static int hfr_team_run(hfr_part_fn fn, void *job, int parts) {
        struct hfr_team_job t = {fn, job, parts, 0, 0};
        hfr_omp_parallel(hfr_team_work, &t, 0, 0);  /* 0: the team's size (OMP_NUM_THREADS, set_num_threads) */
        return t.failed;  /* the region's end is a barrier: every part has run */
    }

    /* Whether the process's OpenMP runtime (the first global one) can run teams: resolve it. */
    static int hfr_team_take(void) {
        hfr_omp_team_size = (int (*)(void))dlsym(RTLD_DEFAULT, "omp_get_max_threads");
        hfr_omp_parallel = hfr_omp_team_size ? (hfr_omp_parallel_fn)dlsym(RTLD_DEFAULT, "GOMP_parallel") : NULL;
        return hfr_omp_parallel != NULL;
    }

    static void hfr_team_ask(int asked) {
        hfr_team_asked = asked && hfr_omp_parallel != NULL;
    }

    /* A forked child has none of the threads, and the locks may be held by threads it lacks. */
    static void hfr_pool_after_fork(void) {
        pthread_mutex_init(&hfr_pool.lock, NULL);
        pthread_mutex_init(&hfr_pool.owner, NULL);
        pthread_cond_init(&hfr_pool.wake, NULL);
        pthread_cond_init(&hfr_pool.done, NULL);
        hfr_pool.threads = hfr_pool.sleepers = hfr_pool.waiters = 0;
    }

    static int hfr_pool_init(void) {
        return pthread_atfork(NULL, NULL, hfr_pool_after_fork);
    }

    static int hfr_pool_run(hfr_part_fn fn, void *job, int parts) {  /* parts <= HFR_POOL_MAX_PARTS */
        unsigned long long number;
        int failed, i;
        if (hfr_team_asked && hfr_omp_team_size() >= parts)
            return hfr_team_run(fn, job, parts);
        pthread_mutex_lock(&hfr_pool.owner);
        number = ((hfr_pool_claims() >> 32) + 1) & 0xffffffffu;
        while (hfr_pool.threads < parts - 1) {
            pthread_t thread;
            pthread_attr_t attr;
            sigset_t all, old;
            sigfillset(&all);  /* pool threads take no signals: they stay with Python's threads */
            pthread_sigmask(SIG_BLOCK, &all, &old);
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            i = pthread_create(&thread, &attr, hfr_pool_thread, (void *)(uintptr_t)((number - 1) & 0xffffffffu));
            pthread_attr_destroy(&attr);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            if (i != 0)
                break;  /* fewer threads: the caller runs the parts left over */
            hfr_pool.threads++;
        }
        hfr_pool.fn = fn;
        hfr_pool.job = job;
        __atomic_store_n(&hfr_pool.unfinished, parts, __ATOMIC_SEQ_CST);
        __atomic_store_n(&hfr_pool.failed, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&hfr_pool.claims, number << 32 | (unsigned long long)parts << 16, __ATOMIC_SEQ_CST);
        hfr_pool_wake(&hfr_pool.wake, &hfr_pool.sleepers);
        hfr_pool_work(number);
        hfr_pool_wait(hfr_pool_finished, 0, &hfr_pool.done, &hfr_pool.waiters);  /* the parts others claimed */
        failed = __atomic_load_n(&hfr_pool.failed, __ATOMIC_SEQ_CST);
        hfr_pool.job = NULL;  /* it lives on the caller's stack */
        pthread_mutex_unlock(&hfr_pool.owner);
        return failed;
    }
    """
    ctypedef int (*hfr_part_fn)(void* job, int part) noexcept nogil
    int hfr_pool_init() noexcept nogil
    int hfr_pool_run(hfr_part_fn fn, void* job, int parts) noexcept nogil
    const int HFR_POOL_MAX_PARTS
    int hfr_team_take() noexcept nogil
    void hfr_team_ask(int asked) noexcept nogil

if hfr_pool_init() != 0:
    raise ImportError("hfr._kernels: pthread_atfork failed (out of memory)")

__all__ = ["reduce", "parallel_copy", "data_address", "simd", "simd_levels", "use_simd", "take_caller_team"]


def take_caller_team() -> bool:
    """Whether threads can run their kernels on their OpenMP team (on_caller_team): the process's global
    OpenMP runtime runs teams. Call once torch, whose runtime it is to be, is imported."""
    return hfr_team_take() != 0


cdef void on_caller_team(bint asked) noexcept nogil:
    """Run the calling thread's kernels on its OpenMP team (where take_caller_team found one), or on hfr's pool."""
    hfr_team_ask(asked)

cdef enum:
    STREAM_MIN_BYTES = 1 << 20  # STORES_BY_SIZE: a smaller out is likely read again soon: leave it in the cache
    # (from 1 MiB non-temporal stores made the engine 2x faster with 2-4 MiB chunks: bench/RESULTS.md)
    BLOCK_ALIGN_BYTES = 64  # blocks start on cache lines, so threads never write one line together
    MIN_BYTES_PER_THREAD = 256 * 1024  # below this much memory traffic per thread, another costs more than it saves

_OPS = {Op.SUM: SUM, Op.MAX: MAX, Op.MIN: MIN, Op.PROD: PROD}

# ---- the SIMD level ------------------------------------------------------------------------------------

# What each level needs of the CPU; baseline and native run wherever this build does (native: on the
# CPU it was built on, HFR_NATIVE=1).
_CPU_RUNS = {"avx512": hfr_cpu_runs_avx512, "avx2": hfr_cpu_runs_avx2}
cdef block_fn _reduce_block  # the tile loops of the level in use
_level = None


def simd_levels() -> list:
    """The levels this build has and this CPU runs, best first."""
    return [level for level in HFR_SIMD_LEVELS.decode().split() if level not in _CPU_RUNS or _CPU_RUNS[level]()]


def use_simd(level: str) -> None:
    """Run the tile loops of level, one of simd_levels() (the tests check every level's bits with it).
    Not while a reduce runs."""
    global _reduce_block, _level
    if level not in simd_levels():
        raise ValueError(f"SIMD level {level!r} is not one this build has and this CPU runs: {simd_levels()}")
    _reduce_block = <block_fn><size_t>importlib.import_module(f"hfr._simd_{level}").block_address()
    _level = level


def simd() -> str:
    """The level in use: avx512, avx2, baseline, or native (built with HFR_NATIVE=1)."""
    return _level


use_simd(simd_levels()[0])


# ---- Python entry points ------------------------------------------------------------------------

# dtype -> (kind for max and min, kind for sum and prod): signed sums run on the unsigned type.
_KINDS = {
    np.dtype(np.float32): (F32, F32),
    np.dtype(np.float64): (F64, F64),
    np.dtype(np.int8): (I8, U8),
    np.dtype(np.uint8): (U8, U8),
    np.dtype(np.int32): (I32, U32),
    np.dtype(np.int64): (I64, U64),
    np.dtype(ml_dtypes.bfloat16): (BF16, BF16),
    np.dtype(np.float16): (FP16, FP16),
}


ctypedef struct Job:  # one reduce, cut into blocks of `per` elements
    Kind kind
    void* out
    void** xs
    int k
    Py_ssize_t n
    Py_ssize_t per
    int op
    bint stream
    Py_ssize_t divisor


cdef int _run_block(void* job, int block) noexcept nogil:
    cdef Job* j = <Job*>job
    cdef Py_ssize_t lo = block * j.per
    if lo >= j.n:
        return 0
    return _reduce_block(j.kind, j.out, j.xs, j.k, lo, min(lo + j.per, j.n), j.op, j.stream, j.divisor)


cdef int _reduce(Kind kind, Py_ssize_t itemsize, void* out, void** xs, int k, Py_ssize_t n, int op,
                 int threads, Py_ssize_t divisor, Stores stores) noexcept nogil:
    """Cut [0, n) into `threads` cache-line-aligned blocks, one per thread. Returns the number of
    blocks that could not get their scratch tiles (then out is partly written)."""
    cdef Py_ssize_t align = BLOCK_ALIGN_BYTES // itemsize
    cdef Job job
    threads = min(threads, HFR_POOL_MAX_PARTS)
    job.kind, job.out, job.xs, job.k, job.n, job.op, job.divisor = kind, out, xs, k, n, op, divisor
    job.per = ((n + threads - 1) // threads + align - 1) // align * align
    job.stream = stores == STREAMED or stores == STORES_BY_SIZE and n * itemsize >= STREAM_MIN_BYTES
    if threads == 1:
        return _run_block(&job, 0)
    return hfr_pool_run(_run_block, &job, threads)


cdef int _threads_for(Py_ssize_t traffic_bytes, int threads) noexcept nogil:
    """threads, cut down so that each thread moves at least MIN_BYTES_PER_THREAD."""
    return max(1, min(threads, traffic_bytes // MIN_BYTES_PER_THREAD))


cdef int op_code(object op) except -1:
    """The kernel's code for an hfr.Op among SUM, MAX, MIN and PROD."""
    return _OPS[op]


cdef Kind kernel_kind(object dtype, int code) except *:
    """The element type a reduce of dtype with op `code` runs on."""
    return _KINDS[dtype][code == SUM or code == PROD]


cdef int reduce_nogil(Kind kind, Py_ssize_t itemsize, void* out, void** xs, int k, Py_ssize_t n, int code,
                      int threads, Py_ssize_t divisor, Stores stores) noexcept nogil:
    """out = xs[0] op ... op xs[k-1] over n elements on up to `threads` threads (fewer for small n); a
    divisor other than 1 divides a float sum by it (avg); out's stores as `stores` says. Returns nonzero
    when scratch tiles could not be had (then out is partly written)."""
    return _reduce(kind, itemsize, out, xs, k, n, code, _threads_for((k + 1) * n * itemsize, threads), divisor,
                   stores)


cdef int copy_nogil(void* dst, void* src, Py_ssize_t nbytes, int threads, Stores stores) noexcept nogil:
    """dst[:nbytes] = src[:nbytes] with the kernel's threading (one thread below its per-thread minimum)."""
    return reduce_nogil(U8, 1, dst, &src, 1, nbytes, SUM, threads, 1, stores)


def reduce(cnp.ndarray out, list inputs, op, int threads, Py_ssize_t divisor=1) -> None:
    """out = inputs[0] op ... op inputs[-1]; for Op.AVG the sum divided by divisor (float dtypes).
    Arguments are checked by hfr.kernels.check_arguments: 1-D C-contiguous arrays of one supported
    dtype and size; out is inputs[0] or overlaps none."""
    cdef int k = len(inputs)
    cdef bint avg = op is Op.AVG
    cdef int code = op_code(combining(op))
    cdef Kind kind = kernel_kind(out.dtype, code)
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t itemsize = out.itemsize
    cdef void** xs = <void**>malloc(k * sizeof(void*))
    cdef int j, failed
    if xs == NULL:
        raise MemoryError()
    try:
        for j in range(k):
            xs[j] = cnp.PyArray_DATA(inputs[j])
        with nogil:
            failed = _reduce(kind, itemsize, cnp.PyArray_DATA(out), xs, k, n, code,
                             _threads_for((k + 1) * n * itemsize, threads), divisor if avg else 1, STORES_BY_SIZE)
    finally:
        free(xs)
    if failed:
        raise MemoryError("hfr reduce: no memory for the scratch tiles")


def data_address(cnp.ndarray a) -> int:
    """Where a's first element is (numpy's __array_interface__ builds a dict for it: ~1 us a call)."""
    return <size_t>cnp.PyArray_DATA(a)


def parallel_copy(cnp.ndarray dst, cnp.ndarray src, int threads) -> None:
    """dst[:] = src with the same threading as reduce (for benchmarks): C-contiguous, equal nbytes."""
    if not (dst.flags.c_contiguous and src.flags.c_contiguous) or dst.nbytes != src.nbytes:
        raise ValueError("parallel_copy needs C-contiguous arrays of equal nbytes")
    cdef void* d = cnp.PyArray_DATA(dst)
    cdef void* s = cnp.PyArray_DATA(src)
    cdef Py_ssize_t n = dst.nbytes
    with nogil:
        copy_nogil(d, s, n, threads, STORES_BY_SIZE)
