# Waiting in C with the GIL released, shared by hfr/_spin.pyx, hfr/_node_call.pyx and hfr/_internode.pyx:
# a monotonic clock in seconds (time.monotonic()'s, so Python deadlines compare with it), a nap,
# sched_yield, and a look at pending signals (Ctrl-C), as a Python polling loop would take.
cdef extern from *:
    """
    #include <sched.h>
    #include <time.h>
    static inline double hfr_now(void) {
        struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
    }
    static inline void hfr_nap(long ns) { struct timespec t = {0, ns}; nanosleep(&t, NULL); }
    #define HFR_SIGNAL_CHECK_S 0.05  /* a long wait in C looks at pending signals this often */
    """
    double hfr_now() nogil
    void hfr_nap(long ns) nogil
    int sched_yield() nogil
    const double HFR_SIGNAL_CHECK_S

cdef extern from "Python.h":
    int PyErr_CheckSignals() noexcept  # -1 with the handler's exception set


cdef inline bint signal_raised() noexcept nogil:
    """Run Python's pending signal handlers; True if one raised (its exception is left set: the caller
    returns to Python and calls raise_pending)."""
    cdef int failed
    with gil:
        failed = PyErr_CheckSignals()
    return failed != 0


cdef inline int raise_pending() except -1:
    """Raise the exception a signal handler left set (returning -1 with it set makes Cython raise it)."""
    return -1
