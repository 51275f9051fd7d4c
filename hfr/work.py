"""Work: the handle of a collective in flight."""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from .errors import HFRTimeoutError

__all__ = ["Work"]


class Work:
    """Returned by the *_async calls. Calls on one Communicator complete in the order they were made."""

    def __init__(self, describe: Callable[[], str], result: Any):
        self._describe = describe  # formatted only when needed: a dtype's str costs microseconds
        self._result = result
        self._error: Optional[BaseException] = None
        self._finished = threading.Event()

    def done(self) -> bool:
        """True once the collective has finished, successfully or not."""
        return self._finished.is_set()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """The result array, once the collective has finished; re-raises its failure.

        With a timeout, raises hfr.HFRTimeoutError (a TimeoutError) if it has not finished by then;
        the collective goes on and can be waited for again."""
        if not self._finished.wait(timeout):
            raise HFRTimeoutError(f"{self._describe()} has not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done() else "pending"
        return f"<hfr.Work {self._describe()} {state}>"

    # Called by the progress thread.
    def _succeed(self) -> None:
        self._finished.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._finished.set()
