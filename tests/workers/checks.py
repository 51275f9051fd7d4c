"""Checks the workers share (each worker imports this from its own folder, under mpiexec)."""
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
