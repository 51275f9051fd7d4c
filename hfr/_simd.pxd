# What hfr/_kernels.pyx (the driver: blocks, threads) and the tile loops of hfr/_tiles.pxi share. The tile
# loops are built once per SIMD level (hfr/_simd_<level>.pyx); the driver calls the level it picked at import.

cdef enum Kind:  # the element type a reduce runs on (signed sums and products run on the unsigned type)
    F32, F64, I8, U8, I32, U32, I64, U64, BF16, FP16

cdef enum:  # the ops the loops combine with (avg is SUM with a divisor)
    SUM, MAX, MIN, PROD

cdef enum:
    KIND_COUNT = FP16 + 1  # the Kinds above
    OP_COUNT = PROD + 1  # and the ops

# out[lo:hi] = xs[0][lo:hi] op ... op xs[k-1][lo:hi] (see _tiles.pxi's reduce_block); nonzero: no scratch memory
ctypedef int (*block_fn)(Kind kind, void* out, void** xs, int k, Py_ssize_t lo, Py_ssize_t hi, int op,
                         bint stream, Py_ssize_t divisor) noexcept nogil
