/* The decode math, included once per instruction set by decode_avx2.c and decode_generic.c with ROWS_FN set
 * to the name of the entry it defines. Why twice: GCC's target_clones only re-targets the cloned function, and
 * helpers inlined into it keep their generic lowering (a splat became eight inserts, GEMMs ran ~5x slower), so
 * the whole body is compiled under the target instead. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model.h"

typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));

#define INLINE static inline __attribute__((always_inline))

INLINE v8 splat(float a) { return (v8){a, a, a, a, a, a, a, a}; }
INLINE v8 vload(const float *p) { return *(const v8 *)p; }
INLINE void vstore(float *p, v8 a) { *(v8 *)p = a; }
INLINE v8 vselect(v8i mask, v8 a, v8 b) { return (v8)((mask & (v8i)a) | (~mask & (v8i)b)); }
INLINE v8 vmin(v8 a, v8 b) { return vselect(a < b, a, b); }
INLINE v8 vmax(v8 a, v8 b) { return vselect(a > b, a, b); }
INLINE float hsum(v8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

/* exp on 8 lanes (Cephes' expf: range reduction by ln 2, degree-6 polynomial; ~1 ulp on [-87.3, 88.3]).
 * Inputs below -87.3 give exp(-87.3) ~ 1e-38: callers only add such terms to sums >= 1. */
INLINE v8 vexp(v8 x) {
    x = vmax(vmin(x, splat(88.3f)), splat(-87.3f));
    v8 n = x * splat(1.44269504088896341f);
    n = (n + splat(12582912.0f)) - splat(12582912.0f); /* round to nearest: 1.5 * 2^23 pushes out the fraction */
    v8 g = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    v8 p = splat(1.9875691500e-4f);
    p = p * g + splat(1.3981999507e-3f);
    p = p * g + splat(8.3334519073e-3f);
    p = p * g + splat(4.1665795894e-2f);
    p = p * g + splat(1.6666665459e-1f);
    p = p * g + splat(5.0000001201e-1f);
    v8 y = p * g * g + g + splat(1.0f);
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    return y * (v8)bits;
}

/* Weights are packed in panels of 16 columns, [ceil(N / 16), K, 16] (zero-padded; biases padded to a multiple
 * of 16), so a tile streams one contiguous K x 16 panel (native.py's pack): row-major [K, N] jumped N floats
 * per k, a new page per step for the LM head. */
#define PANEL 16

/* One panel for rb (<= 4) rows: y[r, 0:cols] = x[r, 0:K] @ panel[K, 16] (+ b), in 2 x rb accumulators. */
INLINE void gemm_tile(const float *x, int64_t ldx, int rb, const float *panel, int64_t K, const float *b, float *y,
                      int64_t ldy, int64_t cols) {
    v8 acc[4][2];
    for (int r = 0; r < 4; r++) {
        acc[r][0] = b ? vload(b) : splat(0.0f);
        acc[r][1] = b ? vload(b + 8) : splat(0.0f);
    }
    for (int64_t k = 0; k < K; k++) {
        v8 w0 = vload(panel + k * PANEL), w1 = vload(panel + k * PANEL + 8);
        for (int r = 0; r < 4; r++) {
            if (r < rb) {
                v8 xr = splat(x[r * ldx + k]);
                acc[r][0] += xr * w0;
                acc[r][1] += xr * w1;
            }
        }
    }
    for (int r = 0; r < rb; r++) {
        if (cols == PANEL) {
            vstore(y + r * ldy, acc[r][0]);
            vstore(y + r * ldy + 8, acc[r][1]);
        } else { /* the last, partial panel */
            float tmp[PANEL];
            vstore(tmp, acc[r][0]);
            vstore(tmp + 8, acc[r][1]);
            memcpy(y + r * ldy, tmp, cols * sizeof(float));
        }
    }
}

/* y[rows, N] = x[rows, K] @ W (+ b), W packed as panels; x rows ldx apart, y rows ldy apart. Panel-outer, so a
 * panel (K x 64 bytes) stays in L1 while every row block reads it. */
INLINE void gemm(const float *x, int64_t ldx, int64_t rows, const float *w, int64_t K, int64_t N, const float *b,
                 float *y, int64_t ldy) {
    for (int64_t n = 0; n < N; n += PANEL) {
        const float *panel = w + n * K, *bn = b ? b + n : NULL;
        int64_t cols = N - n < PANEL ? N - n : PANEL, r = 0;
        for (; r + 4 <= rows; r += 4) gemm_tile(x + r * ldx, ldx, 4, panel, K, bn, y + r * ldy + n, ldy, cols);
        switch (rows - r) { /* constant rb per call keeps each variant's accumulators in registers */
        case 3: gemm_tile(x + r * ldx, ldx, 3, panel, K, bn, y + r * ldy + n, ldy, cols); break;
        case 2: gemm_tile(x + r * ldx, ldx, 2, panel, K, bn, y + r * ldy + n, ldy, cols); break;
        case 1: gemm_tile(x + r * ldx, ldx, 1, panel, K, bn, y + r * ldy + n, ldy, cols); break;
        default: break;
        }
    }
}

INLINE int64_t pad(int64_t n) { return (n + PANEL - 1) / PANEL * PANEL; }

/* HF GptOssRMSNorm: w * (x * rsqrt(mean(x^2) + eps)). */
INLINE void rms_norm(const float *x, const float *w, int64_t n, float eps, float *out) {
    v8 acc = splat(0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += vload(x + i) * vload(x + i);
    float ss = hsum(acc);
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

/* RoPE in place on `heads` vectors of D at one position: x*cos2 + swap_halves(x)*sin2. */
INLINE void rope(float *x, int64_t heads, int64_t d, const float *cos2, const float *sin2) {
    int64_t half = d / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * d;
        for (int64_t i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos2[i] + b * sin2[i];
            v[i + half] = b * cos2[i + half] + a * sin2[i + half];
        }
    }
}

/* [hsum(a[0]), ..., hsum(a[7])]: eight horizontal sums at once (a transpose folded into three rounds of adds). */
INLINE v8 hsum8(const v8 *a) {
    const v8i ev = {0, 8, 2, 10, 4, 12, 6, 14}, od = {1, 9, 3, 11, 5, 13, 7, 15};
    const v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8 b[4], c[2];
    for (int i = 0; i < 4; i++) b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], ev) + __builtin_shuffle(a[2 * i], a[2 * i + 1], od);
    for (int i = 0; i < 2; i++) c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], lo2) + __builtin_shuffle(b[2 * i], b[2 * i + 1], hi2);
    return __builtin_shuffle(c[0], c[1], lo4) + __builtin_shuffle(c[0], c[1], hi4);
}

/* Row of the s-th key read from entry lo (0 <= lo < cap) of a cache of cap entries: a ring wraps to its start. */
INLINE int64_t ring_at(int64_t lo, int64_t s, int64_t cap) { return lo + s < cap ? lo + s : lo + s - cap; }

/* q . k * scale for n keys from entry lo (rows of d floats, in position order) into sc[0 .. n-1]; DC = d / 8. */
INLINE void scores_dc(const float *q, const float *keys, int64_t lo, int64_t n, int64_t cap, float scale, float *sc,
                      const int DC) {
    v8 qv[8];
    for (int c = 0; c < DC; c++) qv[c] = vload(q + 8 * c);
    int64_t s = 0;
    for (; s + 8 <= n; s += 8) {
        v8 acc[8];
        for (int j = 0; j < 8; j++) {
            const float *k = keys + ring_at(lo, s + j, cap) * 8 * DC;
            acc[j] = qv[0] * vload(k);
            for (int c = 1; c < DC; c++) acc[j] += qv[c] * vload(k + 8 * c);
        }
        vstore(sc + s, hsum8(acc) * splat(scale));
    }
    for (; s < n; s++) {
        const float *k = keys + ring_at(lo, s, cap) * 8 * DC;
        v8 acc = qv[0] * vload(k);
        for (int c = 1; c < DC; c++) acc += qv[c] * vload(k + 8 * c);
        sc[s] = hsum(acc) * scale;
    }
}

/* out[0:d] = sum_s p[s] v[ring_at(lo, s)]; two keys per iteration so 2 * DC accumulator chains run independently. */
INLINE void mix_dc(const float *p, const float *values, int64_t lo, int64_t n, int64_t cap, float *out, const int DC) {
    v8 a[8], b[8];
    for (int c = 0; c < DC; c++) a[c] = b[c] = splat(0.0f);
    int64_t s = 0;
    for (; s + 2 <= n; s += 2) {
        const float *v0 = values + ring_at(lo, s, cap) * 8 * DC, *v1 = values + ring_at(lo, s + 1, cap) * 8 * DC;
        v8 p0 = splat(p[s]), p1 = splat(p[s + 1]);
        for (int c = 0; c < DC; c++) {
            a[c] += p0 * vload(v0 + 8 * c);
            b[c] += p1 * vload(v1 + 8 * c);
        }
    }
    if (s < n)
        for (int c = 0; c < DC; c++) a[c] += splat(p[s]) * vload(values + ring_at(lo, s, cap) * 8 * DC + 8 * c);
    for (int c = 0; c < DC; c++) vstore(out + 8 * c, a[c] + b[c]);
}

/* Softmax over sc[0:n] plus one sink logit that joins the denominator and is dropped, in place. */
INLINE void sink_softmax(float *sc, int64_t n, float sink) {
    float m = sink;
    for (int64_t s = 0; s < n; s++) m = sc[s] > m ? sc[s] : m;
    float den = expf(sink - m);
    int64_t s = 0;
    v8 dacc = splat(0.0f);
    for (; s + 8 <= n; s += 8) {
        v8 e = vexp(vload(sc + s) - splat(m));
        vstore(sc + s, e);
        dacc += e;
    }
    for (; s < n; s++) {
        sc[s] = expf(sc[s] - m);
        den += sc[s];
    }
    float inv = 1.0f / (den + hsum(dacc));
    for (s = 0; s < n; s++) sc[s] *= inv;
}

/* Attention of the G query heads sharing one KV head, over n keys of that head's cache of cap entries, in position
 * order from entry lo (a ring wraps): q [G, D] -> out [G, D]; sc: scratch of n floats. HF eager_attention_forward
 * with sinks. */
INLINE void attend_dc(const float *q, int64_t g_heads, const float *keys, const float *values, int64_t lo, int64_t n,
                      int64_t cap, const float *sinks, float *sc, float *out, const int DC) {
    float scale = 1.0f / sqrtf((float)(8 * DC));
    for (int64_t g = 0; g < g_heads; g++) {
        scores_dc(q + g * 8 * DC, keys, lo, n, cap, scale, sc, DC);
        sink_softmax(sc, n, sinks[g]);
        mix_dc(sc, values, lo, n, cap, out + g * 8 * DC, DC);
    }
}

INLINE void attend(const float *q, int64_t g_heads, int64_t d, const float *keys, const float *values, int64_t lo,
                   int64_t n, int64_t cap, const float *sinks, float *sc, float *out) {
    switch (d) { /* constant chunk counts keep q and the accumulators in registers */
    case 8: attend_dc(q, g_heads, keys, values, lo, n, cap, sinks, sc, out, 1); break;
    case 16: attend_dc(q, g_heads, keys, values, lo, n, cap, sinks, sc, out, 2); break;
    case 32: attend_dc(q, g_heads, keys, values, lo, n, cap, sinks, sc, out, 4); break;
    case 64: attend_dc(q, g_heads, keys, values, lo, n, cap, sinks, sc, out, 8); break;
    default: break; /* unreachable: native.py admits head_dim in {8, 16, 32, 64} only */
    }
}

/* Clamped SwiGLU on [gate | up] (2I) -> I: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit). */
INLINE void swiglu(const float *h, int64_t inter, float alpha, float limit, float *out) {
    int64_t i = 0;
    for (; i + 8 <= inter; i += 8) {
        v8 g = vmin(vload(h + i), splat(limit));
        v8 u = vmax(vmin(vload(h + inter + i), splat(limit)), splat(-limit));
        v8 glu = g / (splat(1.0f) + vexp(-(g * splat(alpha))));
        vstore(out + i, (u + splat(1.0f)) * glu);
    }
    for (; i < inter; i++) {
        float g = fminf(h[i], limit), u = fmaxf(fminf(h[inter + i], limit), -limit);
        out[i] = (u + 1.0f) * (g / (1.0f + expf(-(g * alpha))));
    }
}

/* Top-k of a router's logits (ties: lower expert first), softmax over the chosen logits. */
INLINE void route(const float *logits, int64_t experts, int64_t k, int64_t *ids, float *weights) {
    uint64_t taken = 0; /* experts <= 64, checked in Python */
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; e++)
            if (!(taken >> e & 1) && (best < 0 || logits[e] > logits[best])) best = e;
        taken |= 1ull << best;
        ids[j] = best;
    }
    float m = logits[ids[0]], sum = 0.0f;
    for (int64_t j = 0; j < k; j++) sum += (weights[j] = expf(logits[ids[j]] - m));
    for (int64_t j = 0; j < k; j++) weights[j] /= sum;
}

/* Rows [0, n) of this thread (token ids, positions, slots already offset): every layer, then the LM head.
 * Rows of one slot at consecutive positions (a prefill) must come in order: within a layer, a row attends the
 * keys its slot's earlier rows have just written. emit NULL: row r's logits go to logits[r]; else only rows with
 * emit[r] >= 0 get logits, at logits[emit[r]] (a prefill needs its last row's only). */
void ROWS_FN(const hrl_model *m, int64_t n, const int64_t *tok, const int64_t *pos,
                               const int64_t *slot, const int64_t *emit, float *logits, int64_t *routing, hrl_scratch *s) {
    const int64_t hid = m->hidden, H = m->heads, KVH = m->kv_heads, D = m->head_dim, E = m->experts, K = m->top_k;
    const int64_t I = m->inter, QKV = (H + 2 * KVH) * D, G = H / KVH, L = m->layers;
    for (int64_t r = 0; r < n; r++) memcpy(s->x + r * hid, m->embed + tok[r] * hid, hid * sizeof(float));
    int64_t *keep = s->keep; /* after the last layer's key/value writes, the rows that go on (see below) */
    for (int64_t l = 0; l < L; l++) {
        const hrl_layer *ly = &m->layer[l];
        /* A prefill row whose logits nobody reads needs its keys and values at every layer, but nothing after
         * the last layer's: there only the emitting rows go on, moved to the front (row j is the old keep[j]). */
        const int cut = emit && l == L - 1;
        for (int64_t r = 0; r < n; r++) rms_norm(s->x + r * hid, ly->norm_w, hid, (float)m->eps, s->h + r * hid);
        gemm(s->h, hid, n, ly->qkv_w, hid, QKV, ly->qkv_b, s->qkv, QKV);
        int64_t kept = 0;
        for (int64_t r = 0; r < n; r++) {
            float *qkv = s->qkv + r * QKV;
            int64_t p = pos[r];
            rope(qkv, H + KVH, D, m->cos2 + p * D, m->sin2 + p * D); /* q and k heads, adjacent */
            int64_t lo = ly->window > 0 && p - ly->window + 1 > 0 ? p - ly->window + 1 : 0;
            const int64_t cap = ly->cap; /* a sliding layer's ring: position p at p % cap, never more than it keeps */
            for (int64_t kv = 0; kv < KVH; kv++) {
                int64_t base = (slot[r] * KVH + kv) * cap * D;
                memcpy(ly->k_cache + base + p % cap * D, qkv + (H + kv) * D, D * sizeof(float));
                memcpy(ly->v_cache + base + p % cap * D, qkv + (H + KVH + kv) * D, D * sizeof(float));
            }
            if (cut && emit[r] < 0) continue;
            int64_t j = cut ? kept : r;
            if (j != r) memmove(s->x + j * hid, s->x + r * hid, hid * sizeof(float));
            keep[j] = r;
            kept++;
            for (int64_t kv = 0; kv < KVH; kv++) {
                int64_t base = (slot[r] * KVH + kv) * cap * D;
                attend(qkv + kv * G * D, G, D, ly->k_cache + base, ly->v_cache + base, lo % cap, p - lo + 1, cap,
                       ly->sinks + kv * G, s->scores, s->att + j * H * D + kv * G * D);
            }
        }
        const int64_t nl = kept; /* == n except in a prefill's last layer */
        gemm(s->att, H * D, nl, ly->o_w, H * D, hid, ly->o_b, s->tmp, hid);
        for (int64_t i = 0; i < nl * hid; i++) s->x[i] += s->tmp[i];
        for (int64_t r = 0; r < nl; r++) rms_norm(s->x + r * hid, ly->post_w, hid, (float)m->eps, s->h + r * hid);
        gemm(s->h, hid, nl, ly->router_w, hid, E, ly->router_b, s->tmp, E);
        for (int64_t r = 0; r < nl; r++) {
            route(s->tmp + r * E, E, K, s->ids + r * K, s->weights + r * K);
            if (routing)
                for (int64_t j = 0; j < K; j++) routing[(keep[r] * L + l) * K + j] = s->ids[r * K + j];
        }
        memset(s->moe, 0, nl * hid * sizeof(float));
        for (int64_t e = 0; e < E; e++) { /* each expert on the rows routed to it, gathered */
            int64_t cnt = 0;
            for (int64_t r = 0; r < nl; r++)
                for (int64_t j = 0; j < K; j++)
                    if (s->ids[r * K + j] == e) {
                        s->rows_e[cnt] = r * K + j;
                        memcpy(s->hg + cnt * hid, s->h + r * hid, hid * sizeof(float));
                        cnt++;
                    }
            if (!cnt) continue;
            gemm(s->hg, hid, cnt, ly->w1 + e * hid * pad(2 * I), hid, 2 * I, ly->b1 + e * pad(2 * I), s->gu, 2 * I);
            for (int64_t c = 0; c < cnt; c++) swiglu(s->gu + c * 2 * I, I, (float)m->alpha, (float)m->limit, s->act + c * I);
            gemm(s->act, I, cnt, ly->w2 + e * I * pad(hid), I, hid, ly->b2 + e * pad(hid), s->hg, hid);
            for (int64_t c = 0; c < cnt; c++) {
                int64_t r = s->rows_e[c] / K;
                float w = s->weights[s->rows_e[c]];
                for (int64_t i = 0; i < hid; i++) s->moe[r * hid + i] += w * s->hg[c * hid + i];
            }
        }
        for (int64_t i = 0; i < nl * hid; i++) s->x[i] += s->moe[i];
        if (cut) n = nl;
    }
    if (!emit) {
        for (int64_t r = 0; r < n; r++) rms_norm(s->x + r * hid, m->final_w, hid, (float)m->eps, s->h + r * hid);
        gemm(s->h, hid, n, m->lm_w, hid, m->vocab, NULL, logits, m->vocab);
        return;
    }
    for (int64_t r = 0; r < n; r++) { /* the emitting rows, moved to the front; one GEMM row each: same sums */
        rms_norm(s->x + r * hid, m->final_w, hid, (float)m->eps, s->h + r * hid);
        gemm(s->h + r * hid, hid, 1, m->lm_w, hid, m->vocab, NULL, logits + emit[keep[r]] * m->vocab, m->vocab);
    }
}

