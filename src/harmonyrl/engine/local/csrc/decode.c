/* One fused GPT-OSS decode step for the embedded engine: embedding -> L x (RMSNorm, qkv, RoPE, cache write,
 * sink attention, o_proj, RMSNorm, top-k router, clamped-SwiGLU experts) -> final norm -> LM head, fp32.
 *
 * Why C: at the sizes this engine serves on a CPU, a decode step in eager torch is ~200 small kernels whose
 * issue cost (Python, dispatcher, allocation) is as large as their arithmetic (docs/engine-performance.md).
 * Here a step is one call. Rows are independent within a step, so each OpenMP thread runs its contiguous
 * share of rows through every layer with no barrier; GEMMs are register-tiled (4 rows x 16 columns) over
 * weights packed in 16-column panels (by harmonyrl/engine/native.py), written with GCC vector types rather than
 * intrinsics. The math (kernels.h) is compiled twice, for AVX2 + FMA and for any CPU, and picked at run time.
 *
 * Same math as transformers' GptOss modules (tests/engine/test_native.py compares them); the results differ
 * from the eager path only in fp32 summation order and the exp polynomial (~1e-6 relative).
 * No Python API besides PyInit__decode, which exists only so that setuptools builds this as an ordinary
 * extension module: harmonyrl/engine/native.py loads it with ctypes. */
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "model.h"

/* The AVX2 + FMA build of the math where the CPU has it, else the portable one. HARMONYRL_NATIVE_ISA=generic
 * forces the portable one (so tests cover it on AVX2 machines too). */
static hrl_rows_fn rows_fn(void) {
    const char *force = getenv("HARMONYRL_NATIVE_ISA");
    if (force && strcmp(force, "generic") == 0) return hrl_rows_generic;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return hrl_rows_avx2;
#endif
    return hrl_rows_generic;
}

/* "avx2" or "generic": which build rows_fn picks here (native.py reports it). */
const char *hrl_isa(void) { return rows_fn() == hrl_rows_generic ? "generic" : "avx2"; }

static int alloc_scratch(const hrl_model *m, int64_t n, hrl_scratch *s) {
    const int64_t hid = m->hidden, HD = m->heads * m->head_dim, QKV = (m->heads + 2 * m->kv_heads) * m->head_dim;
    const int64_t I = m->inter, nk = n * m->top_k, E = m->experts;
    memset(s, 0, sizeof(*s));
    s->x = malloc(n * hid * sizeof(float));
    s->h = malloc(n * hid * sizeof(float));
    s->qkv = malloc(n * QKV * sizeof(float));
    s->att = malloc(n * HD * sizeof(float));
    s->tmp = malloc(n * (hid > E ? hid : E) * sizeof(float));
    s->moe = malloc(n * hid * sizeof(float));
    s->gu = malloc(nk * 2 * I * sizeof(float));
    s->act = malloc(nk * I * sizeof(float));
    s->hg = malloc(nk * hid * sizeof(float));
    s->scores = malloc(m->max_seq * sizeof(float));
    s->weights = malloc(nk * sizeof(float));
    s->ids = malloc(nk * sizeof(int64_t));
    s->rows_e = malloc(nk * sizeof(int64_t));
    s->keep = malloc(n * sizeof(int64_t));
    return s->x && s->h && s->qkv && s->att && s->tmp && s->moe && s->gu && s->act && s->hg && s->scores &&
           s->weights && s->ids && s->rows_e && s->keep;
}

static void free_scratch(hrl_scratch *s) {
    void *all[] = {s->x, s->h, s->qkv, s->att, s->tmp, s->moe, s->gu, s->act, s->hg, s->scores, s->weights, s->ids,
                   s->rows_e, s->keep};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
}

/* One step for `rows` rows: tokens, positions, slots [rows] -> logits, routing [rows, L, k] (NULL: not recorded).
 * Keys/values of each row's token are written at its slot and position first. A decode step has one row per
 * slot; a prefill has a run of rows per slot (its tokens, in position order), which one thread takes whole, so
 * every row's arithmetic is the same whatever else shares the call (a row's results are batch-invariant).
 * emit NULL: logits [rows, V]; else logits [count of emit[r] >= 0, V], row r's at emit[r].
 * Returns 0, or -1 if a thread could not allocate its buffers (nothing is then valid). */
static int64_t slot_run_start(int64_t at, int64_t rows, const int64_t *slots) {
    while (at > 0 && at < rows && slots[at] == slots[at - 1]) at++; /* move a split out of a slot's run */
    return at;
}

int hrl_decode(const hrl_model *m, int64_t rows, const int64_t *tokens, const int64_t *pos, const int64_t *slots,
               const int64_t *emit, float *logits, int64_t *routing, int64_t threads) {
    int failed = 0;
    hrl_rows_fn run = rows_fn();
    if (threads > rows) threads = rows;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
#ifdef _OPENMP
        int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        int64_t t = 0, nt = 1;
#endif
        int64_t lo = slot_run_start(rows * t / nt, rows, slots), hi = slot_run_start(rows * (t + 1) / nt, rows, slots);
        hrl_scratch s;
        if (hi > lo) {
            if (alloc_scratch(m, hi - lo, &s))
                run(m, hi - lo, tokens + lo, pos + lo, slots + lo, emit ? emit + lo : NULL,
                    emit ? logits : logits + lo * m->vocab, routing ? routing + lo * m->layers * m->top_k : NULL, &s);
            else
                failed = 1;
            free_scratch(&s);
        }
    }
    return failed ? -1 : 0;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode", "C decode step (loaded with ctypes)", -1, NULL};
PyMODINIT_FUNC PyInit__decode(void) { return PyModule_Create(&module); }
