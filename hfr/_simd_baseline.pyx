"""The tile loops (hfr/_tiles.pxi) built for the architecture's baseline (SSE2 on x86-64): any CPU."""
include "_tiles.pxi"
