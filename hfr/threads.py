"""OS-level names for hfr's threads, as `top -H`, py-spy and gdb show them.

Python 3.11 names its threads only for Python itself: at the OS level a new thread keeps the name of
the thread that started it (`pt_autograd_0` when DDP's autograd thread makes the first call).
"""
from __future__ import annotations

import ctypes
import sys

__all__ = ["name_this_thread"]

_PR_SET_NAME = 15  # prctl(2): name the calling thread (at most 15 bytes)


def name_this_thread(name: str) -> None:
    """Give the calling thread the OS-level name `name` (cut to 15 bytes); nothing where prctl is missing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
