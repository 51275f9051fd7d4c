"""The exceptions hfr raises; every one derives from HFRError."""

__all__ = ["HFRError", "MismatchError", "HFRTimeoutError"]


class HFRError(RuntimeError):
    """A collective failed; the message says on which rank and why."""


class MismatchError(HFRError):
    """Ranks called a collective with different count, dtype, op, root or collective."""


class HFRTimeoutError(HFRError, TimeoutError):
    """A peer did not arrive in time (or a wait ran out of its own timeout)."""

    rail_peers: tuple = ()  # a wait over the rail: the rail ranks it waited on (hfr.internode.stopped)
