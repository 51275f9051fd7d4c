"""Work: the handle of a collective in flight."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from . import _wait
from .errors import HFRTimeoutError

__all__ = ["Work"]


class Work:
    """Returned by the *_async calls. Calls on one Communicator complete in the order they were made."""

    def __init__(self, describe: Callable[[], str], result: Any, device_ready: Any = None):
        self._describe = describe  # formatted only when needed: a dtype's str costs microseconds
        self._result = result
        self._device_ready = device_ready  # a CUDA event the result is final at (a one-rank communicator's)
        self._error: Optional[BaseException] = None
        self._finished = False
        self._event: Optional[threading.Event] = None  # made only for a wait() that comes first (~2 us)

    def done(self) -> bool:
        """True once the collective has finished, successfully or not."""
        return self._finished and (self._device_ready is None or self._device_ready.done)

    def wait(self, timeout: Optional[float] = None) -> Any:
        """The result array, once the collective has finished; re-raises its failure.

        With a timeout, raises hfr.HFRTimeoutError (a TimeoutError) if it has not finished by then;
        the collective goes on and can be waited for again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._finished:
            with _EVENTS:
                if not self._finished and self._event is None:
                    self._event = threading.Event()
                event = self._event
            if event is not None and not event.wait(timeout):
                raise HFRTimeoutError(f"{self._describe()} has not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        if self._device_ready is not None and deadline is None:
            self._device_ready.synchronize()
        if not self.done() and not _wait.until(self.done, deadline):  # with a timeout: poll the device
            raise HFRTimeoutError(f"{self._describe()} has not finished on the device after {timeout} s")
        return self._result

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done() else "pending"
        return f"<hfr.Work {self._describe()} {state}>"

    def _finish(self, error: Optional[BaseException] = None) -> None:
        """Called once the collective has finished, with its failure if it failed."""
        self._error = error
        with _EVENTS:
            self._finished = True
            event = self._event
        if event is not None:
            event.set()


_EVENTS = threading.Lock()  # orders a Work's finishing against a waiter making its event
