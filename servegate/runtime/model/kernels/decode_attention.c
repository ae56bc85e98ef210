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
 * sums in float32 whatever the storage type (bfloat16 scores through vdpbf16ps where the CPU has it). A task's arithmetic does not depend on the other tasks or
 * on how many there are, so a sequence gets the same bits at any batch size (batch invariance).
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

/* a tree, not a chain: the adds of one row overlap those of the next */
static inline float hsum(f16v v) {
    f8v a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    f4v b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static void softmax_inplace(float* s, int64_t n) {
    float m = -INFINITY, sum = 0.f;
    for (int64_t i = 0; i < n; i++) m = s[i] > m ? s[i] : m;
    for (int64_t i = 0; i < n; i++) { s[i] = expf(s[i] - m); sum += s[i]; }
    float inv = 1.f / sum;
    for (int64_t i = 0; i < n; i++) s[i] *= inv;
}


/* bfloat16 scores on CPUs with AVX512-BF16: vdpbf16ps multiplies 32 bfloat16 pairs exactly and adds them into 16
 * float32 lanes, one instruction where widening takes four; the products are the same, the sums' order differs. */
#if defined(__AVX512BF16__)
#include <immintrin.h>
enum { DPBF16_bf16 = 1 };
static inline __attribute__((always_inline)) void scores_dpbf16(
    const uint16_t* qb, const uint16_t* kh, const int64_t* tb, int64_t lo, int64_t len, int64_t bs, float scale,
    float softcap, float* s, const int G, const int NC) {
    const int64_t n = len - lo, D = NC * 16;
    const int H = NC / 2;
    __m512bh qr[G][H];
    for (int g = 0; g < G; g++)
        for (int h = 0; h < H; h++) qr[g][h] = (__m512bh)_mm512_loadu_si512(qb + g * D + h * 32);
    for (int64_t t0 = lo - lo % bs; t0 < len; t0 += bs) {
        int64_t a = t0 < lo ? lo : t0, e = t0 + bs < len ? t0 + bs : len;
        const uint16_t* kb = kh + (tb[t0 / bs] * bs - t0) * D;
        for (int64_t t = a; t < e; t++) {
            __m512bh kr[H];
            for (int h = 0; h < H; h++) kr[h] = (__m512bh)_mm512_loadu_si512(kb + t * D + h * 32);
            for (int g = 0; g < G; g++) {
                __m512 x = _mm512_dpbf16_ps(_mm512_setzero_ps(), qr[g][0], kr[0]);
                for (int h = 1; h < H; h++) x = _mm512_dpbf16_ps(x, qr[g][h], kr[h]);
                float dot = _mm512_reduce_add_ps(x) * scale;
                if (softcap > 0.f) dot = tanhf(dot / softcap) * softcap;
                s[g * n + (t - lo)] = dot;
            }
        }
    }
}
#else
enum { DPBF16_bf16 = 0 };
static inline void scores_dpbf16(const uint16_t* qb, const uint16_t* kh, const int64_t* tb, int64_t lo, int64_t len,
    int64_t bs, float scale, float softcap, float* s, const int G, const int NC) {
    (void)qb; (void)kh; (void)tb; (void)lo; (void)len; (void)bs; (void)scale; (void)softcap; (void)s; (void)G; (void)NC;
}
#endif
enum { DPBF16_f32 = 0 };

/* One task. G (query rows per KV head) and NC (head_dim / 16) are constants where the dispatcher inlines
 * it, so the G*NC query and accumulator vectors live in registers; `s` holds G * (len - lo) scores. */
#define DEFINE_TASK(SUFFIX, T, LOADV, STORE1)                                                                  \
static inline __attribute__((always_inline)) void task_##SUFFIX(                                               \
    const T* qb, const T* kh, const T* vh, const int64_t* tb, int64_t lo, int64_t len, int64_t bs,             \
    float scale, float softcap, float* s, T* ob, const int G, const int NC) {                                  \
    const int64_t n = len - lo, D = NC * 16;                                                                    \
    f16v qv[G][NC], av[G][NC];                                                                                  \
    for (int g = 0; g < G; g++)                                                                                 \
        for (int c = 0; c < NC; c++) { qv[g][c] = LOADV(qb + g * D + c * 16); av[g][c] = (f16v){0}; }          \
    if (DPBF16_##SUFFIX && NC % 2 == 0)                                                                         \
        scores_dpbf16((const uint16_t*)qb, (const uint16_t*)kh, tb, lo, len, bs, scale, softcap, s, G, NC);    \
    else                                                                                                        \
    for (int64_t t0 = lo - lo % bs; t0 < len; t0 += bs) { /* one block at a time: its rows are contiguous */   \
        int64_t a = t0 < lo ? lo : t0, e = t0 + bs < len ? t0 + bs : len;                                       \
        const T* kb = kh + (tb[t0 / bs] * bs - t0) * D;                                                         \
        for (int64_t t = a; t < e; t++) {                                                                       \
            f16v kc[NC];                                                                                        \
            for (int c = 0; c < NC; c++) kc[c] = LOADV(kb + t * D + c * 16);                                    \
            for (int g = 0; g < G; g++) {                                                                       \
                f16v x = qv[g][0] * kc[0];                                                                      \
                for (int c = 1; c < NC; c++) x += qv[g][c] * kc[c];                                             \
                float dot = hsum(x) * scale;                                                                    \
                if (softcap > 0.f) dot = tanhf(dot / softcap) * softcap;                                        \
                s[g * n + (t - lo)] = dot;                                                                      \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    for (int g = 0; g < G; g++) softmax_inplace(s + g * n, n);                                                  \
    for (int64_t t0 = lo - lo % bs; t0 < len; t0 += bs) {                                                       \
        int64_t a = t0 < lo ? lo : t0, e = t0 + bs < len ? t0 + bs : len;                                       \
        const T* vb = vh + (tb[t0 / bs] * bs - t0) * D;                                                         \
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
    const int64_t NC = D / 16;                                                                                  \
    int failed = 0;                                                                                             \
    _Pragma("omp parallel num_threads(threads)")                                                                \
    {                                                                                                           \
        float* s = NULL; int64_t held = 0;                                                                      \
        _Pragma("omp for collapse(2) schedule(dynamic, 1) reduction(|:failed)")                                  \
        for (int64_t b = 0; b < B; b++) {                                                                       \
            for (int64_t h = 0; h < Hkv; h++) {                                                                 \
                int64_t lo = first[b], len = lengths[b], need = G * (len - lo);                                 \
                if (need > held) {                                                                              \
                    free(s); s = (float*)malloc(sizeof(float) * need); held = s ? need : 0;                     \
                }                                                                                               \
                if (s == NULL || len <= lo) { failed = 1; continue; }                                           \
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
    return failed ? 2 : 0;                                                                                      \
}

DEFINE_TASK(f32, float, load_f32, store_f32)
DEFINE_TASK(bf16, uint16_t, load_bf16, store_bf16)
