# cython: language_level=3
"""What every wait of a call looks at besides its condition: pending signals, and whether the call was
cancelled.

A signal handler runs on the thread that waits (the main thread), inside the wait. When it calls close()
on the communicator whose call it interrupted, that call cannot finish (its thread is busy with the
handler) and close() cannot wait for it: close() marks the thread's running call cancelled
(cancel_running_call) and returns; once the handler returns, the wait ends the call with HFRError.
"""
from cpython.exc cimport PyErr_SetObject

cdef extern from "pythread.h":
    unsigned long PyThread_get_thread_ident() nogil

from hfr.errors import HFRError

cdef unsigned long cancelled_thread = 0  # the thread whose running call close() cancelled, or 0


cdef bint signal_raised() noexcept nogil:
    """Run Python's pending signal handlers; True if one raised or the thread's call was cancelled
    meanwhile (the exception is left set: the caller returns to Python and calls raise_pending)."""
    global cancelled_thread
    with gil:
        if PyErr_CheckSignals():
            return True
        if cancelled_thread != 0 and cancelled_thread == PyThread_get_thread_ident():
            cancelled_thread = 0
            PyErr_SetObject(HFRError, "close() ran during this call (from a signal handler on its thread): "
                                      "the call was cancelled and the communicator is closed")
            return True
    return False


def until(ready, double deadline) -> bool:
    """A wait written in Python: call ready() until it returns true (True) or deadline (time.monotonic()'s
    clock) passes (False), idling between calls as every wait does (hfr_idle, the GIL released); a signal
    handler's exception, or close() from one, ends it (signal_raised)."""
    cdef double start = hfr_now(), now
    while not ready():
        now = hfr_now()
        if now > deadline:
            return False
        if signal_raised():
            raise_pending()
        with nogil:
            hfr_idle(now - start)
    return True


def cancel_running_call() -> None:
    """Cancel the call this thread is running: its next look at signals ends it (signal_raised)."""
    global cancelled_thread
    cancelled_thread = PyThread_get_thread_ident()


cdef void forget_cancel() noexcept nogil:
    """A call of this thread has ended: a cancellation that it outran must not end the next one."""
    global cancelled_thread
    if cancelled_thread == PyThread_get_thread_ident():
        cancelled_thread = 0
