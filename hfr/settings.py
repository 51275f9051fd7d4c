"""Settings from arguments or the environment (HFR_*), checked, with their defaults."""
from __future__ import annotations

import os
import re
from typing import Optional, Union

from ._node_call import Protocol
from .internode import ALGOS as RAIL_ALGOS
from .pairs import MODES as PAIRS_MODES

__all__ = ["chunk_bytes", "timeout", "num_threads", "threads", "algo", "pairs", "cache_bytes", "DEFAULT_CHUNK_BYTES",
           "DEFAULT_TIMEOUT"]

DEFAULT_CHUNK_BYTES = 8 << 20  # measured: 186 MiB on CuPy, n=4, 23.7 ms vs 33.8 with 4 MiB (bench/RESULTS.md)
DEFAULT_TIMEOUT = 300.0  # seconds a rank waits for a peer before HFRTimeoutError
CHUNK_ALIGN = int(Protocol.CHUNK_ALIGN_BYTES)
ALGOS = ("auto", *RAIL_ALGOS)  # auto: chosen by size (internode.choose_algo)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(value: Union[int, str], name: str) -> int:
    """An int, or a string like '4M', '256KiB', '1G', as a number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of bytes, got {value!r}")
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(value), re.IGNORECASE)
    if not m:
        raise ValueError(f"{name}={value!r} is not a number of bytes (e.g. 4194304, 4M, 256KiB)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def chunk_bytes(value: Optional[Union[int, str]]) -> int:
    """Bytes per pipeline chunk: a multiple of 4 KiB, at least 4 KiB."""
    source = "chunk_bytes"
    if value is None:
        value, source = os.environ.get("HFR_CHUNK_BYTES") or DEFAULT_CHUNK_BYTES, "HFR_CHUNK_BYTES"
    n = parse_bytes(value, source)
    if n < CHUNK_ALIGN or n % CHUNK_ALIGN:
        raise ValueError(f"{source}={value!r}: must be a positive multiple of {CHUNK_ALIGN} bytes")
    return n


def timeout(value: Optional[float]) -> float:
    """Seconds any wait for a peer may last."""
    source = "timeout"
    if value is None:
        value, source = os.environ.get("HFR_TIMEOUT") or DEFAULT_TIMEOUT, "HFR_TIMEOUT"
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source}={value!r} is not a number of seconds") from None
    if not t > 0:
        raise ValueError(f"{source}={value!r}: must be a positive number of seconds")
    return t


def num_threads() -> Optional[int]:
    """HFR_NUM_THREADS, checked, or None where it is not set."""
    env = os.environ.get("HFR_NUM_THREADS", "").strip()
    if not env:
        return None
    if not env.isdigit() or int(env) < 1:
        raise ValueError(f"HFR_NUM_THREADS={env!r} must be a positive integer")
    return int(env)


def threads(host_ranks: int) -> int:
    """Threads each rank's kernels use: HFR_NUM_THREADS, else its share of the host's cores."""
    return num_threads() or max(1, (os.cpu_count() or 1) // host_ranks)


def algo() -> str:
    """The inter-node algorithm: HFR_ALGO, default auto (chosen by size)."""
    name = os.environ.get("HFR_ALGO", "auto").strip().lower() or "auto"
    if name not in ALGOS:
        raise ValueError(f"HFR_ALGO={name!r}: expected one of {list(ALGOS)}")
    return name


def pairs(value: Optional[str]) -> str:
    """Whether ranks pair their GPUs (hfr/pairs.py): the argument, else HFR_PAIRS, else auto."""
    source = "pairs"
    if value is None:
        value, source = os.environ.get("HFR_PAIRS", "").strip() or "auto", "HFR_PAIRS"
    if not isinstance(value, str) or value.strip().lower() not in PAIRS_MODES:
        raise ValueError(f"{source}={value!r}: expected one of {list(PAIRS_MODES)}")
    return value.strip().lower()


def cache_bytes() -> Optional[int]:
    """HFR_CACHE_BYTES, the last-level cache a node's calls are planned for (0: none, as where sysfs does not
    say: chunks of chunk_bytes, stores streamed by their size), checked; None where it is not set (the
    host's, as sysfs tells it)."""
    env = os.environ.get("HFR_CACHE_BYTES", "").strip()
    return parse_bytes(env, "HFR_CACHE_BYTES") if env else None
