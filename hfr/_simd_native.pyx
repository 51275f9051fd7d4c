"""The tile loops (hfr/_tiles.pxi) built for every SIMD extension of the CPU it was built on (HFR_NATIVE=1): that CPU's kind only."""
include "_tiles.pxi"
