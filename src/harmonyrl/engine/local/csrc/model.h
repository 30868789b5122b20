/* The structs shared by decode.c (entry, buffers) and kernels.h (the math); see decode.c. */
#ifndef HRL_MODEL_H
#define HRL_MODEL_H
#include <stdint.h>

typedef struct {
    const float *norm_w, *post_w;     /* [hidden] */
    /* weights [in, out] packed as panels (see gemm); biases padded to pad(out) */
    const float *qkv_w, *qkv_b;       /* [hidden, (H + 2 KVH) D], [(H + 2 KVH) D] or NULL */
    const float *o_w, *o_b;           /* [H D, hidden], [hidden] or NULL */
    const float *sinks;               /* [H] (-inf: no sink) */
    const float *router_w, *router_b; /* [hidden, E], [E] */
    const float *w1, *b1;             /* E x [hidden, 2I] gate columns then up columns, E x [2I] */
    const float *w2, *b2;             /* E x [I, hidden], E x [hidden] */
    float *k_cache, *v_cache;         /* [slots, KVH, cap, D]; position p at p % cap */
    int64_t window;                   /* sliding layers keep keys in (pos - window, pos]; 0: full attention */
    int64_t cap;                      /* positions kept per slot: max_seq, or a sliding layer's ring (its window) */
} hrl_layer;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, experts, top_k, inter, vocab, layers, max_seq;
    double eps, alpha, limit;
    const float *embed;            /* [V, hidden] */
    const float *final_w;          /* [hidden] */
    const float *lm_w;             /* [hidden, V], packed */
    const float *cos2, *sin2;      /* [max_seq, D]: [cos, cos] and [-sin, sin] (see forward.py's _rope) */
    const hrl_layer *layer;        /* [layers] */
} hrl_model;

typedef struct { /* one thread's buffers, sized for its rows */
    float *x, *h, *qkv, *att, *tmp, *moe, *gu, *act, *hg, *scores, *weights;
    int64_t *ids, *rows_e, *keep;
} hrl_scratch;

/* Rows [0, n) of this thread through every layer, then the LM head; kernels.h, compiled per instruction set. */
typedef void (*hrl_rows_fn)(const hrl_model *m, int64_t n, const int64_t *tok, const int64_t *pos, const int64_t *slot,
                            const int64_t *emit, float *logits, int64_t *routing, hrl_scratch *s);
void hrl_rows_avx2(const hrl_model *, int64_t, const int64_t *, const int64_t *, const int64_t *, const int64_t *,
                   float *, int64_t *, hrl_scratch *);
void hrl_rows_generic(const hrl_model *, int64_t, const int64_t *, const int64_t *, const int64_t *, const int64_t *,
                      float *, int64_t *, hrl_scratch *);
#endif
