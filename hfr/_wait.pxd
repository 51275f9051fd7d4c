# Waiting in C with the GIL released, shared by hfr/_spin.pyx and hfr/_tree.pyx: a monotonic clock in
# seconds (time.monotonic()'s, so Python deadlines compare with it), a nap, and sched_yield.
cdef extern from *:
    """
    #include <sched.h>
    #include <time.h>
    static inline double hfr_now(void) {
        struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
    }
    static inline void hfr_nap(long ns) { struct timespec t = {0, ns}; nanosleep(&t, NULL); }
    """
    double hfr_now() nogil
    void hfr_nap(long ns) nogil
    int sched_yield() nogil
