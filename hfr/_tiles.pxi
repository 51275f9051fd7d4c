# The tile loops of hfr/_kernels.pyx: one block of a reduce, out[lo:hi] = x0 op x1 op ... op x(k-1), in one
# pass over memory. Included by hfr/_simd_<level>.pyx, each built with its level's SIMD flags (setup.py);
# the driver in _kernels.pyx calls the level this CPU runs best, through reduce_block's address.
#
# Terms:
# - tile: a run of TILE_BYTES of one block, small enough to stay in L2 while all k inputs are folded
#   into it, so each input is read once and out is written once: (k+1)*bytes of memory traffic.
# - half types (float16, bfloat16): widened to float32 tile by tile, combined in float32, rounded once.
#
# Every loop is a plain `for i in range(m)` over raw pointers with no branch the compiler cannot turn
# into a select, so gcc vectorises it at -O3 for the level's vector width. Each element gets the same
# operations in the same order at every level (and contraction into FMA is off: setup.py), so every level
# gives the same bits (a NaN's payload aside: that is the hardware's). Signed sums and products run on the
# unsigned type of the same width, which wraps as NumPy does (signed overflow is undefined in C). The half
# types' one-pass sums (F16C's float16, AVX2's bfloat16) are written in vector intrinsics instead, with the
# same operations in the same order.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from cython cimport floating

from hfr._simd cimport BF16, F32, F64, FP16, I8, I32, I64, Kind, MAX, MIN, PROD, SUM, U8, U32, U64, block_fn

cdef extern from *:
    """
    #include <string.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    /* memcpy with non-temporal stores: dst's lines are written without being read into the cache. */
    static void hfr_stream_copy(void *dst, const void *src, size_t n) {
        char *d = (char *)dst;
        const char *s = (const char *)src;
        size_t head = (16 - ((size_t)d & 15)) & 15;
        if (head > n) head = n;
        memcpy(d, s, head);
        for (d += head, s += head, n -= head; n >= 16; d += 16, s += 16, n -= 16)
            _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
        memcpy(d, s, n);
    }
    static void hfr_stream_fence(void) { _mm_sfence(); }
    #else
    static void hfr_stream_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
    static void hfr_stream_fence(void) {}
    #endif
    """
    void hfr_stream_copy(void* dst, const void* src, size_t n) noexcept nogil
    void hfr_stream_fence() noexcept nogil

cdef extern from *:
    """
    /* float16 <-> float32 with the CPU's F16C instructions (8 at a time, 16 with AVX-512; round to
       nearest even, NaN stays NaN) where the build targets them; otherwise hfr_f16c is 0 and the
       software loops run. */
    #if defined(__F16C__)
    #include <immintrin.h>
    #define hfr_f16c 1
    static void hfr_f16c_widen(float *dst, const uint16_t *src, Py_ssize_t n) {
        Py_ssize_t i = 0;
    #if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    #endif
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
        for (; i < n; i++)
            dst[i] = _cvtsh_ss(src[i]);
    }
    /* dst = xs[0] + ... + xs[k-1] from start on, each widened as it is read and added left to right in float32,
       then / divisor where it is not 1 (avg), rounded once: a sum of any k in one pass, 16 (or 8) at a time */
    static void hfr_f16c_sum_narrow(uint16_t *dst, const uint16_t **xs, Py_ssize_t start, int k, Py_ssize_t n,
                                    float divisor) {
        Py_ssize_t i = 0;
        int j;
    #if defined(__AVX512F__)
        __m512 d16 = _mm512_set1_ps(divisor);
        for (; i + 16 <= n; i += 16) {
            __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(xs[0] + start + i)));
            for (j = 1; j < k; j++)
                s = _mm512_add_ps(s, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(xs[j] + start + i))));
            if (divisor != 1.0f)
                s = _mm512_div_ps(s, d16);
            _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT));
        }
    #endif
        __m256 d = _mm256_set1_ps(divisor);
        for (; i + 8 <= n; i += 8) {
            __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xs[0] + start + i)));
            for (j = 1; j < k; j++)
                s = _mm256_add_ps(s, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xs[j] + start + i))));
            if (divisor != 1.0f)
                s = _mm256_div_ps(s, d);
            _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT));
        }
        for (; i < n; i++) {
            float t = _cvtsh_ss(xs[0][start + i]);
            for (j = 1; j < k; j++)
                t = t + _cvtsh_ss(xs[j][start + i]);
            dst[i] = _cvtss_sh(divisor == 1.0f ? t : t / divisor, _MM_FROUND_TO_NEAREST_INT);
        }
    }
    static void hfr_f16c_narrow(uint16_t *dst, const float *src, Py_ssize_t n) {
        Py_ssize_t i = 0;
    #if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    #endif
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
        for (; i < n; i++)
            dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
    }
    #else
    #define hfr_f16c 0
    static void hfr_f16c_widen(float *dst, const uint16_t *src, Py_ssize_t n) {}
    static void hfr_f16c_sum_narrow(uint16_t *dst, const uint16_t **xs, Py_ssize_t start, int k, Py_ssize_t n,
                                    float divisor) {}
    static void hfr_f16c_narrow(uint16_t *dst, const float *src, Py_ssize_t n) {}
    #endif
    """
    const bint hfr_f16c
    void hfr_f16c_widen(float* dst, const uint16_t* src, Py_ssize_t n) noexcept nogil
    void hfr_f16c_sum_narrow(uint16_t* dst, const uint16_t** xs, Py_ssize_t start, int k, Py_ssize_t n,
                             float divisor) noexcept nogil
    void hfr_f16c_narrow(uint16_t* dst, const float* src, Py_ssize_t n) noexcept nogil

cdef extern from *:
    """
    /* A bfloat16 sum in vectors where the build has AVX2 (hfr_bf16_simd), as hfr_f16c_sum_narrow is float16's:
       dst = xs[0] + ... + xs[k-1] from start on, each input widened as it is read (its elements unpacked into
       the top halves of float32 lanes: each 128-bit lane's first four go to one vector, its last four to
       another, alike for every input, and the pack after the rounding puts them back), added left to right in
       float32, / divisor where it is not 1, and rounded once as stored by _f32_to_bf16's rule (below), 32
       (AVX-512) or 16 elements at a time; the last n % 16 through the same steps on copies padded with zeros. */
    #if defined(__AVX2__)
    #include <immintrin.h>
    #define hfr_bf16_simd 1
    static inline __m256i hfr_bf16_round8(__m256 s) {  /* _f32_to_bf16 of each lane, in its low 16 bits */
        __m256i b = _mm256_castps_si256(s);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
        __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF)),
                                         _mm256_set1_epi32(0x7F800000));
        __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
        return _mm256_blendv_epi8(rounded, quiet, nan);
    }
    /* elements [at, at + 16) of the sum */
    static inline __m256i hfr_bf16_sum16(const uint16_t **xs, Py_ssize_t at, int k, float divisor) {
        const __m256i zero = _mm256_setzero_si256();
        __m256i v = _mm256_loadu_si256((const __m256i *)(xs[0] + at));
        __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
        __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
        int j;
        for (j = 1; j < k; j++) {
            v = _mm256_loadu_si256((const __m256i *)(xs[j] + at));
            lo = _mm256_add_ps(lo, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)));
            hi = _mm256_add_ps(hi, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)));
        }
        if (divisor != 1.0f) {
            lo = _mm256_div_ps(lo, _mm256_set1_ps(divisor));
            hi = _mm256_div_ps(hi, _mm256_set1_ps(divisor));
        }
        return _mm256_packus_epi32(hfr_bf16_round8(lo), hfr_bf16_round8(hi));
    }
    #if defined(__AVX512BW__)
    static inline __m512i hfr_bf16_round16(__m512 s) {
        __m512i b = _mm512_castps_si512(s);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
        return _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    }
    static inline __m512i hfr_bf16_sum32(const uint16_t **xs, Py_ssize_t at, int k, float divisor) {
        const __m512i zero = _mm512_setzero_si512();
        __m512i v = _mm512_loadu_si512((const void *)(xs[0] + at));
        __m512 lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v));
        __m512 hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v));
        int j;
        for (j = 1; j < k; j++) {
            v = _mm512_loadu_si512((const void *)(xs[j] + at));
            lo = _mm512_add_ps(lo, _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)));
            hi = _mm512_add_ps(hi, _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v)));
        }
        if (divisor != 1.0f) {
            lo = _mm512_div_ps(lo, _mm512_set1_ps(divisor));
            hi = _mm512_div_ps(hi, _mm512_set1_ps(divisor));
        }
        return _mm512_packus_epi32(hfr_bf16_round16(lo), hfr_bf16_round16(hi));
    }
    #endif
    static void hfr_bf16_sum_narrow(uint16_t *dst, const uint16_t **xs, Py_ssize_t start, int k, Py_ssize_t n,
                                    float divisor) {
        Py_ssize_t i = 0;
    #if defined(__AVX512BW__)
        for (; i + 32 <= n; i += 32)
            _mm512_storeu_si512((void *)(dst + i), hfr_bf16_sum32(xs, start + i, k, divisor));
    #endif
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(dst + i), hfr_bf16_sum16(xs, start + i, k, divisor));
        if (i < n) {  /* the last n - i, each input's copied into a row of zeros */
            uint16_t rows[k][16], sum[16];
            const uint16_t *padded[k];
            int j;
            for (j = 0; j < k; j++) {
                memset(rows[j], 0, sizeof rows[j]);
                padded[j] = memcpy(rows[j], xs[j] + start + i, (n - i) * sizeof(uint16_t));
            }
            _mm256_storeu_si256((__m256i *)sum, hfr_bf16_sum16(padded, 0, k, divisor));
            memcpy(dst + i, sum, (n - i) * sizeof(uint16_t));
        }
    }
    #else
    #define hfr_bf16_simd 0
    static void hfr_bf16_sum_narrow(uint16_t *dst, const uint16_t **xs, Py_ssize_t start, int k, Py_ssize_t n,
                                    float divisor) {}
    #endif
    """
    const bint hfr_bf16_simd
    void hfr_bf16_sum_narrow(uint16_t* dst, const uint16_t** xs, Py_ssize_t start, int k, Py_ssize_t n,
                             float divisor) noexcept nogil


cdef enum:
    TILE_BYTES = 128 * 1024  # long runs of each input keep the prefetchers streaming (measured: 8 KiB was slower)
    TILE_WORDS = 16384  # TILE_BYTES in 8-byte words

ctypedef struct bf16_t:  # bfloat16: the top 16 bits of a float32
    uint16_t bits

ctypedef struct fp16_t:  # IEEE binary16
    uint16_t bits

ctypedef fused elem_t:  # types combined as they are
    float
    double
    int8_t
    uint8_t
    int32_t
    uint32_t
    int64_t
    uint64_t

ctypedef fused half_t:
    bf16_t
    fp16_t

ctypedef fused any_t:
    float
    double
    int8_t
    uint8_t
    int32_t
    uint32_t
    int64_t
    uint64_t
    bf16_t
    fp16_t

# ---- folding one run of elements into another --------------------------------------------------------------

cdef void _fold(elem_t* acc, const elem_t* x, Py_ssize_t m, int op) noexcept nogil:
    """acc[i] = acc[i] op x[i]. max/min return a NaN of either side, as np.maximum does.

    Two distinct pointers: gcc's runtime overlap check then passes and the vector loop runs (with
    dst[i] = a[i] op b[i] and dst == a, it would find an overlap and fall back to the scalar loop)."""
    cdef Py_ssize_t i
    if op == SUM:
        for i in range(m):
            acc[i] = acc[i] + x[i]
    elif op == PROD:
        for i in range(m):
            acc[i] = acc[i] * x[i]
    elif op == MAX:
        for i in range(m):
            acc[i] = acc[i] if (acc[i] > x[i]) | (acc[i] != acc[i]) else x[i]
    else:
        for i in range(m):
            acc[i] = acc[i] if (acc[i] < x[i]) | (acc[i] != acc[i]) else x[i]


cdef void _combine(elem_t* dst, const elem_t* a, const elem_t* b, Py_ssize_t m, int op,
                   Py_ssize_t divisor) noexcept nogil:
    """dst[i] = a[i] op b[i], then / divisor where it is not 1 (float sums only: avg's last fold): a tile's
    first fold into a dst that is not a, in one pass (a copy of a, then _fold, passes over dst twice: 1.4x
    slower for two inputs in cache). Three distinct pointers, as _fold's two."""
    cdef Py_ssize_t i
    if elem_t is float or elem_t is double:
        if divisor != 1:
            for i in range(m):
                dst[i] = (a[i] + b[i]) / <elem_t>divisor
            return
    if op == SUM:
        for i in range(m):
            dst[i] = a[i] + b[i]
    elif op == PROD:
        for i in range(m):
            dst[i] = a[i] * b[i]
    elif op == MAX:
        for i in range(m):
            dst[i] = a[i] if (a[i] > b[i]) | (a[i] != a[i]) else b[i]
    else:
        for i in range(m):
            dst[i] = a[i] if (a[i] < b[i]) | (a[i] != a[i]) else b[i]


cdef void _sum4(elem_t* dst, const elem_t* a, const elem_t* b, const elem_t* c, const elem_t* e, Py_ssize_t m,
                Py_ssize_t divisor) noexcept nogil:
    """dst[i] = ((a[i] + b[i]) + c[i]) + e[i]: a sum's first four inputs in one pass (dst is none of them), then
    / divisor where it is not 1 (floats: avg's last pass)."""
    cdef Py_ssize_t i
    if elem_t is float or elem_t is double:
        if divisor != 1:
            for i in range(m):
                dst[i] = (((a[i] + b[i]) + c[i]) + e[i]) / <elem_t>divisor
            return
    for i in range(m):
        dst[i] = ((a[i] + b[i]) + c[i]) + e[i]


cdef void _sum8(elem_t* dst, elem_t** xs, Py_ssize_t start, Py_ssize_t m, Py_ssize_t divisor) noexcept nogil:
    """dst[i] = xs[0][start+i] + ... + xs[7][start+i], added left to right: a node of eight ranks' inputs in one
    pass (dst is none of them), then / divisor where it is not 1 (floats: avg's last pass)."""
    cdef const elem_t* a = xs[0] + start
    cdef const elem_t* b = xs[1] + start
    cdef const elem_t* c = xs[2] + start
    cdef const elem_t* d = xs[3] + start
    cdef const elem_t* e = xs[4] + start
    cdef const elem_t* f = xs[5] + start
    cdef const elem_t* g = xs[6] + start
    cdef const elem_t* h = xs[7] + start
    cdef Py_ssize_t i
    if elem_t is float or elem_t is double:
        if divisor != 1:
            for i in range(m):
                dst[i] = (((((((a[i] + b[i]) + c[i]) + d[i]) + e[i]) + f[i]) + g[i]) + h[i]) / <elem_t>divisor
            return
    for i in range(m):
        dst[i] = ((((((a[i] + b[i]) + c[i]) + d[i]) + e[i]) + f[i]) + g[i]) + h[i]


cdef void _sum3_into(elem_t* acc, const elem_t* a, const elem_t* b, const elem_t* c, Py_ssize_t m,
                     Py_ssize_t divisor) noexcept nogil:
    """acc[i] = ((acc[i] + a[i]) + b[i]) + c[i]: three more inputs of a sum in one pass, then / divisor where it
    is not 1 (floats: avg's last pass)."""
    cdef Py_ssize_t i
    if elem_t is float or elem_t is double:
        if divisor != 1:
            for i in range(m):
                acc[i] = (((acc[i] + a[i]) + b[i]) + c[i]) / <elem_t>divisor
            return
    for i in range(m):
        acc[i] = ((acc[i] + a[i]) + b[i]) + c[i]


cdef void _fold_tile(elem_t* dst, elem_t** xs, Py_ssize_t start, int k, Py_ssize_t m, int op,
                     Py_ssize_t divisor) noexcept nogil:
    """dst[:m] = xs[0][start:start+m] op ... op xs[k-1][...] (dst may be xs[0] + start itself), then / divisor
    where it is not 1 (float sums only: avg). The tile is in L2, the inputs mostly not: each pass over it
    reads it back, so a sum folds its inputs eight (a node of eight GPUs' ranks) or four in its first pass and
    three in each pass after (4 inputs: one pass, not four; 7: two; in cache 1.6-1.9x faster on the dev VM
    than one a pass: bench/RESULTS.md); other ops, rare in training, one a pass. The same operations in the
    same order, so the same bits, either way. avg divides in the last pass (in a pass of its own only for one
    input)."""
    cdef int j = 1  # xs[:j] are folded into dst
    if dst != xs[0] + start:
        if op == SUM and k >= 8:
            _sum8(dst, xs, start, m, divisor if k == 8 else 1)
            j = 8
        elif op == SUM and k >= 4:
            _sum4(dst, xs[0] + start, xs[1] + start, xs[2] + start, xs[3] + start, m, divisor if k == 4 else 1)
            j = 4
        elif k >= 2:
            _combine(dst, xs[0] + start, xs[1] + start, m, op, divisor if k == 2 else 1)
            j = 2
        else:
            memcpy(dst, xs[0] + start, m * sizeof(elem_t))
    while op == SUM and j + 3 <= k:
        _sum3_into(dst, xs[j] + start, xs[j + 1] + start, xs[j + 2] + start, m, divisor if j + 3 == k else 1)
        j += 3
    while j < k:
        if elem_t is float or elem_t is double:
            if j == k - 1 and divisor != 1:
                _add_divide(dst, xs[j] + start, m, divisor)
                break
        _fold(dst, xs[j] + start, m, op)
        j += 1
    if elem_t is float or elem_t is double:
        if k == 1 and divisor != 1:
            _divide(dst, m, divisor)


cdef void _divide(floating* acc, Py_ssize_t m, Py_ssize_t divisor) noexcept nogil:
    """acc[i] /= divisor (the last step of avg, in the accumulation type, while the tile is in cache)."""
    cdef floating d = <floating>divisor
    cdef Py_ssize_t i
    for i in range(m):
        acc[i] = acc[i] / d


cdef void _add_divide(floating* acc, const floating* x, Py_ssize_t m, Py_ssize_t divisor) noexcept nogil:
    """acc[i] = (acc[i] + x[i]) / divisor: avg's last fold and its division in one pass over the tile
    (the same two roundings, in the same order, as _fold then _divide)."""
    cdef floating d = <floating>divisor
    cdef Py_ssize_t i
    for i in range(m):
        acc[i] = (acc[i] + x[i]) / d


# ---- float32 <-> half conversions (round to nearest even; NaN stays NaN) -------------------------

cdef inline float _f32(uint32_t bits) noexcept nogil:
    cdef float f
    memcpy(&f, &bits, 4)
    return f


cdef inline uint32_t _bits(float f) noexcept nogil:
    cdef uint32_t b
    memcpy(&b, &f, 4)
    return b


cdef inline float _bf16_to_f32(uint16_t h) noexcept nogil:
    return _f32(<uint32_t>h << 16)


cdef inline uint16_t _f32_to_bf16(float f) noexcept nogil:
    cdef uint32_t b = _bits(f)
    cdef uint32_t rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    cdef uint32_t quiet_nan = (b >> 16) | 0x40
    return <uint16_t>(quiet_nan if (b & 0x7FFFFFFF) > 0x7F800000 else rounded)


cdef inline float _fp16_to_f32(uint16_t h) noexcept nogil:
    cdef uint32_t m = <uint32_t>(h & 0x7FFF) << 13  # exponent and mantissa, in float32 position
    cdef uint32_t e = m & 0x0F800000
    cdef uint32_t normal = m + (112 << 23)  # rebias the exponent: 127 - 15
    cdef uint32_t inf_nan = m + (224 << 23)  # exponent 31 -> 255, mantissa (NaN payload) kept
    # subnormal: m/2^24 computed exactly as (2^-14 + m/2^24) - 2^-14
    cdef uint32_t subnormal = _bits(_f32(m + (113 << 23)) - _f32(113 << 23))
    cdef uint32_t mag = inf_nan if e == 0x0F800000 else (subnormal if e == 0 else normal)
    return _f32(mag | (<uint32_t>(h & 0x8000) << 16))


cdef inline uint16_t _f32_to_fp16(float f) noexcept nogil:
    cdef uint32_t b = _bits(f)
    cdef uint32_t a = b & 0x7FFFFFFF
    cdef uint32_t sign = (b >> 16) & 0x8000
    cdef uint32_t big = 0x7E00 if a > 0x7F800000 else 0x7C00  # NaN -> quiet NaN; >= 2^16 -> inf
    # below 2^-14: adding 0.5f rounds to a multiple of 2^-24, the subnormal step, in float32 RNE
    cdef uint32_t subnormal = _bits(_f32(a) + 0.5) - _bits(0.5)
    # normal: rebias, then round the 13 dropped bits to nearest even (a carry may make it inf)
    cdef uint32_t normal = (a - (112 << 23) + 0xFFF + ((a >> 13) & 1)) >> 13
    cdef uint32_t mag = big if a >= (143 << 23) else (subnormal if a < (113 << 23) else normal)
    return <uint16_t>(mag | sign)


cdef void _sum_half(float* acc, const half_t* x, Py_ssize_t m, Py_ssize_t divisor) noexcept nogil:
    """acc[i] += x[i], widened as it is read (no pass through a scratch tile); with a divisor other than
    1 then divided by it (avg's last fold): the roundings of a widening, then _fold or _add_divide."""
    cdef float d = <float>divisor
    cdef Py_ssize_t i
    if divisor == 1:
        for i in range(m):
            acc[i] = acc[i] + _widened(x[i])
    else:
        for i in range(m):
            acc[i] = (acc[i] + _widened(x[i])) / d


cdef void _sum_half2(float* acc, const half_t* a, const half_t* b, Py_ssize_t m, Py_ssize_t divisor) noexcept nogil:
    """acc[i] = a[i] + b[i], each widened as it is read: a sum's first two inputs in one pass (fewer than four),
    then / divisor where it is not 1 (avg's last pass)."""
    cdef float d = <float>divisor
    cdef Py_ssize_t i
    if divisor == 1:
        for i in range(m):
            acc[i] = _widened(a[i]) + _widened(b[i])
    else:
        for i in range(m):
            acc[i] = (_widened(a[i]) + _widened(b[i])) / d


cdef void _sum_half4(float* acc, const half_t* a, const half_t* b, const half_t* c, const half_t* e, Py_ssize_t m,
                     Py_ssize_t divisor) noexcept nogil:
    """acc[i] = ((a[i] + b[i]) + c[i]) + e[i], each widened as it is read: a sum's first four inputs in one pass,
    with no pass of its own to widen the first; then / divisor where it is not 1 (avg's last pass)."""
    cdef float d = <float>divisor
    cdef Py_ssize_t i
    if divisor == 1:
        for i in range(m):
            acc[i] = ((_widened(a[i]) + _widened(b[i])) + _widened(c[i])) + _widened(e[i])
    else:
        for i in range(m):
            acc[i] = (((_widened(a[i]) + _widened(b[i])) + _widened(c[i])) + _widened(e[i])) / d


cdef void _sum_half3(float* acc, const half_t* a, const half_t* b, const half_t* c, Py_ssize_t m,
                     Py_ssize_t divisor) noexcept nogil:
    """acc[i] = ((acc[i] + a[i]) + b[i]) + c[i], each widened as it is read: three inputs of a sum a pass; then
    / divisor where it is not 1 (avg's last pass), as _sum_half."""
    cdef float d = <float>divisor
    cdef Py_ssize_t i
    if divisor == 1:
        for i in range(m):
            acc[i] = ((acc[i] + _widened(a[i])) + _widened(b[i])) + _widened(c[i])
    else:
        for i in range(m):
            acc[i] = (((acc[i] + _widened(a[i])) + _widened(b[i])) + _widened(c[i])) / d


cdef inline float _widened(half_t h) noexcept nogil:
    if half_t is bf16_t:
        return _bf16_to_f32(h.bits)
    else:
        return _fp16_to_f32(h.bits)


cdef void _widen(float* dst, const half_t* src, Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t i
    if half_t is fp16_t and hfr_f16c:
        hfr_f16c_widen(dst, <const uint16_t*>src, m)
        return
    for i in range(m):
        dst[i] = _widened(src[i])


cdef void _narrow(half_t* dst, const float* src, Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t i
    if half_t is fp16_t and hfr_f16c:
        hfr_f16c_narrow(<uint16_t*>dst, src, m)
        return
    for i in range(m):
        if half_t is bf16_t:
            dst[i].bits = _f32_to_bf16(src[i])
        else:
            dst[i].bits = _f32_to_fp16(src[i])


cdef void _fold_half_tile(float* acc, float* tmp, half_t** xs, Py_ssize_t start, int k, Py_ssize_t m, int op,
                          Py_ssize_t divisor) noexcept nogil:
    """acc[:m] = xs[0][start:start+m] op ... op xs[k-1][...], widened to float32 (tmp: scratch for a widened
    input), then / divisor where it is not 1 (avg). As _fold_tile, a sum's first pass widens and adds four inputs
    (two where it has fewer), each pass after three; avg divides in the last pass (alone only for one input).
    A float16 sum where the build has F16C, and a bfloat16 sum where it has AVX2, take hfr_f16c_sum_narrow and
    hfr_bf16_sum_narrow instead: every input in one pass, 8 to 32 lanes at a time in registers, rounded as stored
    (the same operations; bench/RESULTS.md: in cache 1.2-2x faster for float16, 1.6-2.1x for bfloat16).
    bfloat16 in that shape written as plain loops, for the compiler to vectorise, gained nothing (measured): its
    vectors are written out."""
    cdef int j = 1  # xs[:j] are folded into acc
    if op == SUM and k >= 4:
        _sum_half4(acc, xs[0] + start, xs[1] + start, xs[2] + start, xs[3] + start, m, divisor if k == 4 else 1)
        j = 4
    elif op == SUM and k >= 2:
        _sum_half2(acc, xs[0] + start, xs[1] + start, m, divisor if k == 2 else 1)
        j = 2
    else:
        _widen(acc, xs[0] + start, m)
    while op == SUM and j + 3 <= k:  # avg too: a divisor other than 1 comes only with SUM
        _sum_half3(acc, xs[j] + start, xs[j + 1] + start, xs[j + 2] + start, m, divisor if j + 3 == k else 1)
        j += 3
    while j < k:
        if op == SUM:
            _sum_half(acc, xs[j] + start, m, divisor if j == k - 1 else 1)
        else:
            _widen(tmp, xs[j] + start, m)
            _fold(acc, tmp, m, op)
        j += 1
    if k == 1 and divisor != 1:
        _divide(acc, m, divisor)


# ---- one block, then all blocks -----------------------------------------------------------------

cdef int _reduce_block(any_t* out, any_t** xs, int k, Py_ssize_t lo, Py_ssize_t hi, int op,
                       bint stream, Py_ssize_t divisor) noexcept nogil:
    """out[lo:hi] = xs[0][lo:hi] op ... op xs[k-1][lo:hi], tile by tile; then, for a divisor other
    than 1 (float sums only: avg), divided by it in the accumulation type before the one rounding.

    stream: finish each tile in a scratch tile and copy it out with non-temporal stores, so out's lines
    are not read from memory first (the read-for-ownership a plain store costs) nor left in the cache."""
    cdef uint64_t* scratch = NULL  # two tiles, 8-byte aligned: acc and tmp
    cdef float* acc
    cdef float* tmp
    cdef any_t* dst
    cdef Py_ssize_t start, m
    cdef Py_ssize_t tile = TILE_BYTES // 4 if any_t is bf16_t or any_t is fp16_t else TILE_BYTES // sizeof(any_t)
    cdef bint widened = (any_t is bf16_t or any_t is fp16_t) and not (
        op == SUM and (any_t is fp16_t and hfr_f16c or any_t is bf16_t and hfr_bf16_simd))
    if k == 1 and divisor == 1:
        if out != xs[0] and stream:
            hfr_stream_copy(out + lo, xs[0] + lo, (hi - lo) * sizeof(any_t))
            hfr_stream_fence()
        elif out != xs[0]:
            memcpy(out + lo, xs[0] + lo, (hi - lo) * sizeof(any_t))
        return 0
    if stream or widened:  # a tile is finished in tmp, or widened into acc
        scratch = <uint64_t*>malloc(2 * TILE_BYTES)
        if scratch == NULL:
            return 1
        acc, tmp = <float*>scratch, <float*>(scratch + TILE_WORDS)
    start = lo
    while start < hi:
        m = min(tile, hi - start)
        dst = <any_t*>tmp if stream else out + start
        if (any_t is bf16_t or any_t is fp16_t) and widened:
            _fold_half_tile(acc, tmp, xs, start, k, m, op, divisor)
            _narrow(dst, acc, m)
        elif any_t is fp16_t:  # a float16 sum with F16C: no float32 tile
            hfr_f16c_sum_narrow(<uint16_t*>dst, <const uint16_t**>xs, start, k, m, <float>divisor)
        elif any_t is bf16_t:  # a bfloat16 sum in vectors: no float32 tile
            hfr_bf16_sum_narrow(<uint16_t*>dst, <const uint16_t**>xs, start, k, m, <float>divisor)
        else:
            _fold_tile(dst, xs, start, k, m, op, divisor)
        if stream:
            hfr_stream_copy(out + start, dst, m * sizeof(any_t))
        start += m
    if stream:
        hfr_stream_fence()
    free(scratch)
    return 0

cdef int reduce_block(Kind kind, void* out, void** xs, int k, Py_ssize_t lo, Py_ssize_t hi, int op,
                   bint stream, Py_ssize_t divisor) noexcept nogil:
    """The block_fn of hfr/_simd.pxd: _reduce_block on kind's element type."""
    if kind == F32:
        return _reduce_block(<float*>out, <float**>xs, k, lo, hi, op, stream, divisor)
    elif kind == F64:
        return _reduce_block(<double*>out, <double**>xs, k, lo, hi, op, stream, divisor)
    elif kind == I8:
        return _reduce_block(<int8_t*>out, <int8_t**>xs, k, lo, hi, op, stream, divisor)
    elif kind == U8:
        return _reduce_block(<uint8_t*>out, <uint8_t**>xs, k, lo, hi, op, stream, divisor)
    elif kind == I32:
        return _reduce_block(<int32_t*>out, <int32_t**>xs, k, lo, hi, op, stream, divisor)
    elif kind == U32:
        return _reduce_block(<uint32_t*>out, <uint32_t**>xs, k, lo, hi, op, stream, divisor)
    elif kind == I64:
        return _reduce_block(<int64_t*>out, <int64_t**>xs, k, lo, hi, op, stream, divisor)
    elif kind == U64:
        return _reduce_block(<uint64_t*>out, <uint64_t**>xs, k, lo, hi, op, stream, divisor)
    elif kind == BF16:
        return _reduce_block(<bf16_t*>out, <bf16_t**>xs, k, lo, hi, op, stream, divisor)
    else:
        return _reduce_block(<fp16_t*>out, <fp16_t**>xs, k, lo, hi, op, stream, divisor)



def block_address() -> int:
    """Where reduce_block is: the driver calls it through a block_fn (hfr/_simd.pxd)."""
    cdef block_fn fn = reduce_block
    return <size_t>fn
