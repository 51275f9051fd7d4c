"""The tile loops (hfr/_tiles.pxi) built for AVX2, FMA and F16C: Haswell, Zen and later."""
include "_tiles.pxi"
