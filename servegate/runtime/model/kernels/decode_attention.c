/* Decode attention over a paged KV pool: every decoding sequence's one new query attends its context
 * where the blocks lie, one parallel region per layer for the whole batch, with no gather and no copy.
 *
 * Built at first use by servegate/runtime/model/decode_kernel.py (cc -O3 -march=native -fopenmp) and called
 * through ctypes. Layouts (all contiguous):
 *   q, out   [B, Hkv, G, D]  the G query heads that share KV head h are rows h*G .. h*G+G-1 (transformers' GQA)
 *   k, v     [Hkv, S, D]     one layer's pool; slot = block * bs + offset
 *   table    [B, stride]     each sequence's block ids, in order
 *   lengths  [B]             positions 0 .. length-1 are cached (this step's token included)
 *   first    [B]             first visible position (0, or the oldest key a sliding window keeps)
 *
 * Each (sequence, KV head) is one task: its G query rows read each key and value row once, scores and
 * sums in float32 whatever the storage type. Scores are summed 16 keys at a time (sum16) and exponentiated 16 at a
 * time (exp16). Where the CPU has AVX512-BF16, bfloat16 keys and values go through vdpbf16ps, the probabilities
 * rounded to bfloat16 for the values as SDPA's bfloat16 kernel rounds them. A task's arithmetic does not depend on
 * the other tasks or on how many there are, so a sequence gets the same bits at any batch size (batch invariance).
 * Why hand-written: torch has no CPU op that reads a block table; one SDPA call per sequence per layer
 * spends more on its overhead and type conversion than on reading the bytes (benchmarks/README.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 16 floats: GCC lowers it to whatever the build machine has (one AVX-512 register, two AVX2 ones, ...) */
typedef float f16v __attribute__((vector_size(64)));
typedef float f8v __attribute__((vector_size(32)));
typedef float f4v __attribute__((vector_size(16)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

static inline f16v load_f32(const float* p) { f16v v; memcpy(&v, p, sizeof v); return v; }

/* bfloat16 is the top half of a float32: widening is a shift, exact */
static inline f16v load_bf16(const uint16_t* p) {
    u16x16 x; memcpy(&x, p, sizeof x);
    u32x16 w = __builtin_convertvector(x, u32x16) << 16;
    f16v v; memcpy(&v, &w, sizeof v); return v;
}

static inline float store_f32(float x) { return x; }

/* round to nearest even, as torch's float -> bfloat16 conversion does; NaN stays NaN */
static inline uint16_t store_bf16(float f) {
    uint32_t u; memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The sums of 16 vectors at once, lane j the sum of x[j]: four rounds of fold-and-interleave (halves, quarters,
 * pairs, lanes) cost 15 adds and 30 shuffles, where a reduction per vector costs 16 x 8. The rounds are arranged so
 * the lanes come out in key order. */
static inline __attribute__((always_inline)) f16v sum16(const f16v x[16]) {
    f16v y[8], z[4], w[2];
    for (int i = 0; i < 8; i++)
        y[i] = __builtin_shufflevector(x[i], x[i + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + __builtin_shufflevector(x[i], x[i + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        z[i] = __builtin_shufflevector(y[i], y[i + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
             + __builtin_shufflevector(y[i], y[i + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        w[i] = __builtin_shufflevector(z[i], z[i + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
             + __builtin_shufflevector(z[i], z[i + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    return __builtin_shufflevector(w[0], w[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
         + __builtin_shufflevector(w[0], w[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

/* The scores of up to 16 consecutive keys of one query row: x[j] holds key j's products lane by lane. */
static inline __attribute__((always_inline)) void put_scores(f16v x[16], int m, float scale, float softcap, float* s) {
    for (int j = m; j < 16; j++) x[j] = (f16v){0};
    f16v d = sum16(x) * scale;
    if (m == 16 && !(softcap > 0.f)) { memcpy(s, &d, sizeof d); return; }
    for (int j = 0; j < m; j++) s[j] = softcap > 0.f ? tanhf(d[j] / softcap) * softcap : d[j];
}

typedef int32_t i32x16 __attribute__((vector_size(64)));

/* exp of 16 floats at once, x <= 0 (a score less the row's maximum): x = -k ln2 + r with |r| <= ln2 / 2, e^r by
 * Cephes' degree-6 polynomial (within 0.7 ulp over [-87, 0], checked against double precision), times 2^-k put
 * into the exponent. Below -87 the result is about 1e-38, nothing beside the maximum's 1. A NaN stays NaN. */
static inline __attribute__((always_inline)) f16v exp16(f16v x) {
    const f16v lim = (f16v){0} - 87.0f;
    i32x16 low = x < lim;
    x = (f16v)(((i32x16)x & ~low) | ((i32x16)lim & low));
    i32x16 k = __builtin_convertvector(x * -1.44269504088896341f + 0.5f, i32x16); /* floor(-x log2 e + 1/2) >= 0 */
    f16v kf = __builtin_convertvector(k, f16v);
    f16v r = x + kf * 0.693359375f - kf * 2.12194440e-4f; /* x + k ln2, ln2 in two parts */
    f16v p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i32x16 bits = (i32x16)p - (k << 23); /* times 2^-k */
    return (f16v)bits;
}

/* a tree, not a chain: the adds of one row overlap those of the next */
static inline float hsum(f16v v) {
    f8v a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    f4v b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* softmax of one row of scores in place, 16 at a time (the tail padded) */
static void softmax_inplace(float* s, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = s[i] > m ? s[i] : m;
    f16v sum = (f16v){0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        f16v e = exp16(load_f32(s + i) - m);
        memcpy(s + i, &e, sizeof e);
        sum += e;
    }
    if (i < n) {
        float tail[16];
        for (int j = 0; j < 16; j++) tail[j] = i + j < n ? s[i + j] - m : 0.f;
        f16v e = exp16(load_f32(tail));
        for (int j = 0; j < 16; j++) e[j] = i + j < n ? e[j] : 0.f;
        sum += e;
        for (int j = 0; i + j < n; j++) s[i + j] = e[j];
    }
    float inv = 1.f / hsum(sum);
    for (int64_t j = 0; j < n; j++) s[j] *= inv;
}


/* Blocks lie anywhere in the pool, so the hardware prefetcher cannot follow a context from one block to the next,
 * and one block (16 rows of 128-256 bytes) is read faster than memory answers. The kernel asks for blocks itself,
 * into L2, AHEAD blocks before it reads them: a task starts by asking for its first AHEAD blocks of keys and values,
 * the keys' pass asks for the keys AHEAD blocks on and for the values of the block it reads, and the values' pass
 * for the values AHEAD blocks on. Into L2 rather than L1, so that more lines are in flight than L1's miss buffers
 * hold. 1.3-1.8x faster than asking for the next block only (benchmarks/README.md). The task's first values look
 * asked for twice (the keys' pass asks again), but without them float32 ran 0.91-0.97x, bfloat16 1.00x. */
enum { AHEAD = 4 };

static inline __attribute__((always_inline)) void prefetch_block(
    const void* head, const int64_t* tb, int64_t t, int64_t len, int64_t bs, int64_t row_bytes) {
    if (t >= len) return;
    const char* p = (const char*)head + tb[t / bs] * bs * row_bytes;
    for (int64_t i = 0; i < bs * row_bytes; i += 64) __builtin_prefetch(p + i, 0, 1);
}

static inline __attribute__((always_inline)) void prefetch_task(
    const void* kh, const void* vh, const int64_t* tb, int64_t lo, int64_t len, int64_t bs, int64_t row_bytes) {
    for (int64_t j = 0, t0 = lo - lo % bs; j < AHEAD; j++) {
        prefetch_block(kh, tb, t0 + j * bs, len, bs, row_bytes);
        prefetch_block(vh, tb, t0 + j * bs, len, bs, row_bytes);
    }
}

static inline __attribute__((always_inline)) void prefetch_keys_pass(
    const void* kh, const void* vh, const int64_t* tb, int64_t t0, int64_t len, int64_t bs, int64_t row_bytes) {
    prefetch_block(kh, tb, t0 + AHEAD * bs, len, bs, row_bytes);
    prefetch_block(vh, tb, t0, len, bs, row_bytes);
}

static inline __attribute__((always_inline)) void prefetch_values_pass(
    const void* vh, const int64_t* tb, int64_t t0, int64_t len, int64_t bs, int64_t row_bytes) {
    prefetch_block(vh, tb, t0 + AHEAD * bs, len, bs, row_bytes);
}

/* bfloat16 scores on CPUs with AVX512-BF16: vdpbf16ps multiplies 32 bfloat16 pairs exactly and adds them into 16
 * float32 lanes, one instruction where widening takes four; the products are the same, the sums' order differs. */
#if defined(__AVX512BF16__)
#include <immintrin.h>
enum { DPBF16_bf16 = 1 };
static inline __attribute__((always_inline)) void scores_dpbf16(
    const uint16_t* qb, const uint16_t* kh, const uint16_t* vh, const int64_t* tb, int64_t lo, int64_t len,
    int64_t bs, float scale, float softcap, float* s, const int G, const int NC) {
    const int64_t n = len - lo, D = NC * 16;
    const int H = NC / 2;
    __m512bh qr[G][H];
    for (int g = 0; g < G; g++)
        for (int h = 0; h < H; h++) qr[g][h] = (__m512bh)_mm512_loadu_si512(qb + g * D + h * 32);
    for (int64_t t0 = lo - lo % bs; t0 < len; t0 += bs) {
        int64_t a = t0 < lo ? lo : t0, e = t0 + bs < len ? t0 + bs : len;
        const uint16_t* kb = kh + (tb[t0 / bs] * bs - t0) * D;
        prefetch_keys_pass(kh, vh, tb, t0, len, bs, D * 2);
        for (int64_t t1 = a; t1 < e; t1 += 16) {
            const int m = e - t1 < 16 ? (int)(e - t1) : 16;
            f16v x[G][16];
            for (int j = 0; j < m; j++) {
                __m512bh kr[H];
                for (int h = 0; h < H; h++) kr[h] = (__m512bh)_mm512_loadu_si512(kb + (t1 + j) * D + h * 32);
                for (int g = 0; g < G; g++) {
                    __m512 y = _mm512_dpbf16_ps(_mm512_setzero_ps(), qr[g][0], kr[0]);
                    for (int h = 1; h < H; h++) y = _mm512_dpbf16_ps(y, qr[g][h], kr[h]);
                    memcpy(&x[g][j], &y, sizeof y);
                }
            }
            for (int g = 0; g < G; g++) put_scores(x[g], m, scale, softcap, s + g * n + (t1 - lo));
        }
    }
}

/* bfloat16 values the same way: two key positions at a time, their probabilities rounded to bfloat16 as a pair
 * and each value row interleaved with the next (vpunpck*wd), so one vdpbf16ps adds both rows into 16 lanes.
 * The unpacks work within 128-bit lanes: the accumulators hold the head's columns permuted, and `out` takes
 * them back. SDPA's bfloat16 kernel also rounds the probabilities to bfloat16 before multiplying by V. */
static inline __attribute__((always_inline)) void values_dpbf16(
    const uint16_t* vh, const int64_t* tb, int64_t lo, int64_t len, int64_t bs, float* s, float* out,
    const int G, const int NC) {
    const int64_t n = len - lo, D = NC * 16;
    const int H = NC / 2;
    __m512 acc[G][NC];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < NC; c++) acc[g][c] = _mm512_setzero_ps();
    uint16_t* pb = (uint16_t*)(s + G * n); /* the probabilities in bfloat16: the task's buffer has room after s */
    int64_t i = 0;
    for (; i + 16 <= G * n; i += 16)
        _mm256_storeu_si256((__m256i*)(pb + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + i)));
    for (; i < G * n; i++) pb[i] = store_bf16(s[i]);
    for (int64_t t0 = lo - lo % bs; t0 < len; t0 += bs) {
        int64_t a = t0 < lo ? lo : t0, e = t0 + bs < len ? t0 + bs : len;
        const uint16_t* vb = vh + (tb[t0 / bs] * bs - t0) * D;
        prefetch_values_pass(vh, tb, t0, len, bs, D * 2);
        for (int64_t t = a; t < e; t += 2) {
            const int pair = t + 1 < e; /* a block's odd last row goes with a zero probability */
            const uint16_t* r0 = vb + t * D;
            const uint16_t* r1 = pair ? r0 + D : r0;
            __m512bh lo16[H], hi16[H];
            for (int h = 0; h < H; h++) {
                __m512i x0 = _mm512_loadu_si512(r0 + h * 32), x1 = _mm512_loadu_si512(r1 + h * 32);
                lo16[h] = (__m512bh)_mm512_unpacklo_epi16(x0, x1);
                hi16[h] = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
            }
            for (int g = 0; g < G; g++) {
                const uint16_t* p = pb + g * n + (t - lo);
                uint32_t bits = (uint32_t)p[0] | ((uint32_t)(pair ? p[1] : 0) << 16);
                __m512bh pp = (__m512bh)_mm512_set1_epi32((int)bits);
                for (int h = 0; h < H; h++) {
                    acc[g][2 * h] = _mm512_dpbf16_ps(acc[g][2 * h], pp, lo16[h]);
                    acc[g][2 * h + 1] = _mm512_dpbf16_ps(acc[g][2 * h + 1], pp, hi16[h]);
                }
            }
        }
    }
    /* lane j of the low (high) accumulator of 32 columns holds column (j / 4) * 8 + j % 4 (+ 4) */
    for (int g = 0; g < G; g++)
        for (int h = 0; h < H; h++) {
            float l[16], u[16];
            _mm512_storeu_ps(l, acc[g][2 * h]);
            _mm512_storeu_ps(u, acc[g][2 * h + 1]);
            for (int j = 0; j < 16; j++) {
                out[g * D + h * 32 + (j / 4) * 8 + j % 4] = l[j];
                out[g * D + h * 32 + (j / 4) * 8 + 4 + j % 4] = u[j];
            }
        }
}
#else
enum { DPBF16_bf16 = 0 };
static inline void values_dpbf16(const uint16_t* vh, const int64_t* tb, int64_t lo, int64_t len, int64_t bs,
    float* s, float* out, const int G, const int NC) {
    (void)vh; (void)tb; (void)lo; (void)len; (void)bs; (void)s; (void)out; (void)G; (void)NC;
}
static inline void scores_dpbf16(const uint16_t* qb, const uint16_t* kh, const uint16_t* vh, const int64_t* tb,
    int64_t lo, int64_t len, int64_t bs, float scale, float softcap, float* s, const int G, const int NC) {
    (void)qb; (void)kh; (void)vh; (void)tb; (void)lo; (void)len; (void)bs; (void)scale; (void)softcap; (void)s;
    (void)G; (void)NC;
}
#endif
enum { DPBF16_f32 = 0 };

/* Every row's context checked once, before any read: 2 for a row with no visible key, 4 for a context its block
 * table cannot hold or a block outside the pool of S slots; 0 when every row can be read. */
static int unreadable_rows(const int64_t* table, int64_t stride, const int64_t* lengths, const int64_t* first,
    int64_t B, int64_t S, int64_t bs) {
    int failed = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t lo = first[b], len = lengths[b];
        if (len <= lo) { failed |= 2; continue; }
        int bad = len > stride * bs;
        for (int64_t j = lo / bs; !bad && j * bs < len; j++)
            bad = table[b * stride + j] < 0 || (table[b * stride + j] + 1) * bs > S;
        if (bad) failed |= 4;
    }
    return failed;
}

/* One task. G (query rows per KV head) and NC (head_dim / 16) are constants where the dispatcher inlines
 * it, so the G*NC query and accumulator vectors live in registers; `s` holds G * (len - lo) scores. */
#define DEFINE_TASK(SUFFIX, T, LOADV, STORE1)                                                                  \
static inline __attribute__((always_inline)) void task_##SUFFIX(                                               \
    const T* qb, const T* kh, const T* vh, const int64_t* tb, int64_t lo, int64_t len, int64_t bs,             \
    float scale, float softcap, float* s, T* ob, const int G, const int NC) {                                  \
    const int64_t n = len - lo, D = NC * 16;                                                                    \
    prefetch_task(kh, vh, tb, lo, len, bs, D * (int64_t)sizeof(T));                                             \
    f16v qv[G][NC], av[G][NC];                                                                                  \
    for (int g = 0; g < G; g++)                                                                                 \
        for (int c = 0; c < NC; c++) { qv[g][c] = LOADV(qb + g * D + c * 16); av[g][c] = (f16v){0}; }          \
    if (DPBF16_##SUFFIX && NC % 2 == 0)                                                                         \
        scores_dpbf16((const uint16_t*)qb, (const uint16_t*)kh, (const uint16_t*)vh, tb, lo, len, bs, scale,    \
                      softcap, s, G, NC);                                                                       \
    else                                                                                                        \
    for (int64_t t0 = lo - lo % bs; t0 < len; t0 += bs) { /* one block at a time: its rows are contiguous */   \
        int64_t a = t0 < lo ? lo : t0, e = t0 + bs < len ? t0 + bs : len;                                       \
        const T* kb = kh + (tb[t0 / bs] * bs - t0) * D;                                                         \
        prefetch_keys_pass(kh, vh, tb, t0, len, bs, D * (int64_t)sizeof(T));                                    \
        for (int64_t t1 = a; t1 < e; t1 += 16) { /* 16 keys at a time: their sums in one sum16 */               \
            const int m = e - t1 < 16 ? (int)(e - t1) : 16;                                                     \
            f16v x[G][16];                                                                                      \
            for (int j = 0; j < m; j++) {                                                                       \
                f16v kc[NC];                                                                                    \
                for (int c = 0; c < NC; c++) kc[c] = LOADV(kb + (t1 + j) * D + c * 16);                         \
                for (int g = 0; g < G; g++) {                                                                   \
                    f16v y = qv[g][0] * kc[0];                                                                  \
                    for (int c = 1; c < NC; c++) y += qv[g][c] * kc[c];                                         \
                    x[g][j] = y;                                                                                \
                }                                                                                               \
            }                                                                                                   \
            for (int g = 0; g < G; g++) put_scores(x[g], m, scale, softcap, s + g * n + (t1 - lo));            \
        }                                                                                                       \
    }                                                                                                           \
    for (int g = 0; g < G; g++) softmax_inplace(s + g * n, n);                                                  \
    if (DPBF16_##SUFFIX && NC % 2 == 0) {                                                                       \
        float o[G * D];                                                                                         \
        values_dpbf16((const uint16_t*)vh, tb, lo, len, bs, s, o, G, NC);                                      \
        for (int64_t i = 0; i < G * D; i++) ob[i] = STORE1(o[i]);                                               \
        return;                                                                                                 \
    }                                                                                                           \
    for (int64_t t0 = lo - lo % bs; t0 < len; t0 += bs) {                                                       \
        int64_t a = t0 < lo ? lo : t0, e = t0 + bs < len ? t0 + bs : len;                                       \
        const T* vb = vh + (tb[t0 / bs] * bs - t0) * D;                                                         \
        prefetch_values_pass(vh, tb, t0, len, bs, D * (int64_t)sizeof(T));                                      \
        for (int64_t t = a; t < e; t++) {                                                                       \
            f16v vc[NC];                                                                                        \
            for (int c = 0; c < NC; c++) vc[c] = LOADV(vb + t * D + c * 16);                                    \
            for (int g = 0; g < G; g++) {                                                                       \
                float p = s[g * n + (t - lo)];                                                                  \
                for (int c = 0; c < NC; c++) av[g][c] += p * vc[c];                                             \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    for (int g = 0; g < G; g++)                                                                                 \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int l = 0; l < 16; l++) ob[g * D + c * 16 + l] = STORE1(av[g][c][l]);                         \
}                                                                                                               \
                                                                                                                \
int decode_attention_##SUFFIX(const T* q, const T* k, const T* v, const int64_t* table, int64_t stride,        \
        const int64_t* lengths, const int64_t* first, T* out, int64_t B, int64_t Hkv, int64_t G, int64_t D,     \
        int64_t S, int64_t bs, float scale, float softcap, int threads) {                                       \
    if (D % 16 != 0 || G < 1) return 1;                                                                         \
    int failed = unreadable_rows(table, stride, lengths, first, B, S, bs);                                      \
    if (failed) return failed;                                                                                  \
    const int64_t NC = D / 16;                                                                                  \
    _Pragma("omp parallel num_threads(threads)")                                                                \
    {                                                                                                           \
        float* s = NULL; int64_t held = 0;                                                                      \
        _Pragma("omp for collapse(2) schedule(dynamic, 1) reduction(|:failed)")                                 \
        for (int64_t b = 0; b < B; b++) {                                                                       \
            for (int64_t h = 0; h < Hkv; h++) {                                                                 \
                int64_t lo = first[b], len = lengths[b], need = G * (len - lo) * 3 / 2 + 16; /* scores, bf16 */ \
                if (need > held) {                                                                              \
                    free(s); s = (float*)malloc(sizeof(float) * need); held = s ? need : 0;                     \
                }                                                                                               \
                if (s == NULL) { failed |= 2; continue; }                                                       \
                const T* qb = q + (b * Hkv + h) * G * D; T* ob = out + (b * Hkv + h) * G * D;                   \
                const T* kh = k + h * S * D; const T* vh = v + h * S * D;                                       \
                const int64_t* tb = table + b * stride;                                                         \
                switch (G * 100 + NC) { /* common shapes inlined with constants; the rest generic */            \
                case 104: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 1, 4); break;       \
                case 204: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 2, 4); break;       \
                case 304: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 3, 4); break;       \
                case 404: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 4, 4); break;       \
                case 504: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 5, 4); break;       \
                case 604: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 6, 4); break;       \
                case 804: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 8, 4); break;       \
                case 108: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 1, 8); break;       \
                case 208: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 2, 8); break;       \
                case 408: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, 4, 8); break;       \
                default: task_##SUFFIX(qb, kh, vh, tb, lo, len, bs, scale, softcap, s, ob, (int)G, (int)NC);    \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        free(s);                                                                                                \
    }                                                                                                           \
    return failed;                                                                                              \
}

DEFINE_TASK(f32, float, load_f32, store_f32)
DEFINE_TASK(bf16, uint16_t, load_bf16, store_bf16)
