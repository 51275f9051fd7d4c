"""The tile loops (hfr/_tiles.pxi) built for AVX-512 (F, BW, DQ, VL) with AVX2, FMA and F16C: Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4 and later."""
include "_tiles.pxi"
