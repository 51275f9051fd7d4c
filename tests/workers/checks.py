"""Checks the workers share (each worker imports this from its own folder, under mpiexec)."""
import contextlib
import ctypes
import mmap

import numpy as np
from mpi4py import MPI


def expect(error_type: type, fragment: str, call, what: str = "") -> BaseException:
    """The error_type that call() raises, whose message says fragment; AssertionError (naming this rank
    and what) if it returns or says otherwise."""
    who = f"rank {MPI.COMM_WORLD.Get_rank()}" + (f", {what}" if what else "")
    try:
        call()
    except error_type as error:
        assert fragment in str(error), f"{who}: {error!r} does not say {fragment!r}"
        return error
    raise AssertionError(f"{who}: no {error_type.__name__} ({fragment})")


def pages(nbytes: int) -> np.ndarray:
    """nbytes (a multiple of the page size) of page-aligned memory of their own, as uint8."""
    assert nbytes % mmap.PAGESIZE == 0, nbytes
    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


@contextlib.contextmanager
def read_only(array: np.ndarray):
    """array's memory (whole pages) read-only within the block: a store into it ends the process with SIGSEGV,
    which the test sees as a rank that died."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    address, nbytes = array.ctypes.data, array.nbytes
    assert address % mmap.PAGESIZE == 0 and nbytes % mmap.PAGESIZE == 0, (address, nbytes)
    if libc.mprotect(address, nbytes, mmap.PROT_READ):
        raise OSError(ctypes.get_errno(), "mprotect")
    try:
        yield
    finally:
        libc.mprotect(address, nbytes, mmap.PROT_READ | mmap.PROT_WRITE)
