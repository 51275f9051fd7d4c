# Waiting in C with the GIL released, shared by hfr/_node_call.pyx, hfr/_internode.pyx, hfr/_front.pyx and
# hfr/_kernels.pyx: a monotonic clock in seconds (time.monotonic()'s, so Python deadlines compare with it), a nap,
# sched_yield, what every wait does between looks (hfr_idle), the read of a word another process publishes
# (hfr_load_acquire: the stores before its release are seen after it), a look at pending signals (Ctrl-C) and at a
# cancelled call (hfr/_wait.pyx), and the one loop every wait of a call runs (wait_for).
# A call's waits run here: a wait in Python (hfr/_wait.pyx's until, for the few outside a call's steps) takes the
# GIL back after every look, and a thread waiting for the GIL (the caller's training loop, torch's autograd thread)
# then waits out the 5 ms switch interval each time.
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


cdef enum Look:  # what one look of a wait saw (look_fn)
    STILL  # nothing moved
    MOVED  # something moved, not all of it
    ENDED  # what the wait waits for is there, or failed (the wait's state says which)

cdef enum Waited:  # how wait_for ended
    WAIT_ENDED  # its look saw ENDED
    WAIT_TIMED_OUT  # the deadline passed first
    WAIT_SIGNALLED  # a signal handler raised, or the call was cancelled (signal_raised: raise_pending)
    WAIT_GONE  # its gone_fn saw that a peer the wait needs is gone (the state says which)

ctypedef Look (*look_fn)(void* state) noexcept nogil
ctypedef bint (*gone_fn)(void* state) noexcept nogil


cdef inline Waited wait_for(look_fn look, gone_fn gone, void* state, double deadline, bint signals) noexcept nogil:
    """Look until the look sees ENDED or deadline (hfr_now's clock) passes; every HFR_SIGNAL_CHECK_S, where
    `signals`, run pending signal handlers, and ask `gone` whether a peer is gone. Between
    looks that move nothing, hfr_idle, timed from the last that moved (or the start)."""
    cdef double last_moved = hfr_now(), last_check = last_moved, now
    cdef Look seen
    while True:
        seen = look(state)
        if seen == ENDED:
            return WAIT_ENDED
        now = hfr_now()
        if seen == MOVED:
            last_moved = now
            continue
        if now > deadline:
            return WAIT_TIMED_OUT
        if now - last_check > HFR_SIGNAL_CHECK_S:
            last_check = now
            if signals and signal_raised():
                return WAIT_SIGNALLED
            if gone(state):
                return WAIT_GONE
        hfr_idle(now - last_moved)
