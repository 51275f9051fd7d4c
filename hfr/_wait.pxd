# Waiting in C with the GIL released, shared by hfr/_spin.pyx, hfr/_node_call.pyx, hfr/_internode.pyx and
# hfr/_front.pyx: a monotonic clock in seconds (time.monotonic()'s, so Python deadlines compare with it), a
# nap, sched_yield, what every wait does between looks (hfr_idle), the read of a word another process
# publishes (hfr_load_acquire: the stores before its release are seen after it), and a look at pending
# signals (Ctrl-C) and at a cancelled call (hfr/_wait.pyx).
cdef extern from *:
    """
    #include <sched.h>
    #include <time.h>
    static inline double hfr_now(void) {
        struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
    }
    static inline void hfr_nap(long ns) { struct timespec t = {0, ns}; nanosleep(&t, NULL); }
    #define HFR_SIGNAL_CHECK_S 0.05  /* a long wait in C looks at pending signals this often */
    /* Between two looks at what a wait waits for (counters, MPI requests), idle_s after the last progress:
       yield the CPU (a chunk's copies take ~0.1-1 ms), then nap, so idle ranks leave the cores to others. */
    #define HFR_WAIT_YIELD_S 2e-3
    #define HFR_WAIT_NAP_NS 20000
    static inline void hfr_idle(double idle_s) {
        if (idle_s < HFR_WAIT_YIELD_S) sched_yield(); else hfr_nap(HFR_WAIT_NAP_NS);
    }
    static inline long long hfr_load_acquire(const long long *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    """
    double hfr_now() nogil
    void hfr_nap(long ns) nogil
    void hfr_idle(double idle_s) nogil
    long long hfr_load_acquire(const long long* p) nogil
    int sched_yield() nogil
    const double HFR_SIGNAL_CHECK_S

cdef extern from "Python.h":
    int PyErr_CheckSignals() noexcept  # -1 with the handler's exception set


cdef bint signal_raised() noexcept nogil
cdef void forget_cancel() noexcept nogil


cdef inline int raise_pending() except -1:
    """Raise the exception signal_raised left set (returning -1 with it set makes Cython raise it)."""
    return -1
