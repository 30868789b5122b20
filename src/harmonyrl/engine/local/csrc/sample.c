/* The uniforms behind the engine's counter-based Gumbel noise (harmonyrl/engine/sampling.py), in one pass.
 *
 * Why C: in torch the hash is ~12 int64 ops over the step's [rows, vocab] grid, about half of a sampling step
 * (169 of 308 us for 32 x 1536 on the 2-core CPU); here it is one loop. It is bit for bit the torch code, which
 * stays the reference (tests/engine/test_sampling.py compares them): the hash is exact 32-bit integer
 * math, and (bits >> 9) + 0.5 scaled by 2^-23 is exact in fp32. The logs that turn u into noise stay in torch,
 * so the noise itself, and every sampled token, is the same with or without this file. The integer loop is
 * built for AVX2 and for any CPU and picked at run time (HARMONYRL_NATIVE_ISA=generic forces the portable one),
 * as decode.c's math is: 15 vs 169 us in torch for 32 x 1536 with AVX2. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x1B873593u;
    return x ^ (x >> 16);
}

/* One row's uniforms, inlined into an AVX2 build (8 lanes of 32-bit multiplies; baseline x86-64 has none) and a
 * portable one; hrl_gumbel_uniform picks at run time, as decode.c does. The same integer math either way. */
static inline __attribute__((always_inline)) void fill_row(uint32_t row, int64_t vocab, float *out) {
    for (int64_t v = 0; v < vocab; v++) {
        const uint32_t bits = mix32(row + (uint32_t)v * 0x9E3779B9u);
        out[v] = ((float)(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
    }
}

typedef void (*row_fn)(uint32_t row, int64_t vocab, float *out);

static void row_generic(uint32_t row, int64_t vocab, float *out) { fill_row(row, vocab, out); }

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void row_avx2(uint32_t row, int64_t vocab, float *out) {
    fill_row(row, vocab, out);
}
#endif

/* u[r, v] for r < rows, v < vocab (row-major, fp32) from keys[r] and counters[r] (their low 32 bits). */
void hrl_gumbel_uniform(const int64_t *keys, const int64_t *counters, int64_t rows, int64_t vocab, float *u,
                        int64_t threads) {
    row_fn fn = row_generic;
#if defined(__x86_64__) && defined(__GNUC__)
    const char *force = getenv("HARMONYRL_NATIVE_ISA"); /* "generic": the portable build, as in decode.c */
    if (__builtin_cpu_supports("avx2") && !(force && strcmp(force, "generic") == 0)) fn = row_avx2;
#endif
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * vocab >= 16384)
    for (int64_t r = 0; r < rows; r++) fn(mix32(mix32((uint32_t)keys[r]) ^ (uint32_t)counters[r]), vocab, u + r * vocab);
}
