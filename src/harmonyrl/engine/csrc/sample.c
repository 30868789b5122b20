/* The uniforms behind the engine's counter-based Gumbel noise (harmonyrl/engine/sampling.py), in one pass.
 *
 * Why C: in torch the hash is ~12 int64 ops over the step's [rows, vocab] grid, about half of a sampling step
 * (167 of 308 us for 32 x 1536 on the 2-core CPU); here it is one loop. It is bit for bit the torch code, which
 * stays the reference (tests/engine/test_sampling_native.py compares them): the hash is exact 32-bit integer
 * math, and (bits >> 9) + 0.5 scaled by 2^-23 is exact in fp32. The logs that turn u into noise stay in torch,
 * so the noise itself, and every sampled token, is the same with or without this file. */
#include <stdint.h>

static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x1B873593u;
    return x ^ (x >> 16);
}

/* u[r, v] for r < rows, v < vocab (row-major, fp32) from keys[r] and counters[r] (their low 32 bits). */
void hrl_gumbel_uniform(const int64_t *keys, const int64_t *counters, int64_t rows, int64_t vocab, float *u,
                        int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * vocab >= 16384)
    for (int64_t r = 0; r < rows; r++) {
        const uint32_t row = mix32(mix32((uint32_t)keys[r]) ^ (uint32_t)counters[r]);
        float *out = u + r * vocab;
        for (int64_t v = 0; v < vocab; v++) {
            const uint32_t bits = mix32(row + (uint32_t)v * 0x9E3779B9u);
            out[v] = ((float)(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
        }
    }
}
