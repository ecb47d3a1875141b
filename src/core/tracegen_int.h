/* tracegen_int.h — private seams of the trace generator (eldr/tracegen.h).
 * Not installed.
 *
 *   tracegen.c          the generator object: model tables, request i = f(seed, i),
 *                       traces, text -> request
 *   tracegen_shape.c    model shape presets         tracegen_workload.c  workloads
 *   tracegen_text.c     text -> domain classifier
 *   tracegen_normal.c   Gaussian noise: a ziggurat with its own exp/log
 *   tracegen_phase.c    per request and phase: noise, softmax, alias tables
 *   tracegen_sample.c   K distinct experts per token and layer from the alias tables
 *   tracegen_sample_avx2.c  the same draws, eight lanes at a time (x86-64 AVX2)
 *   tracegen_sample_avx512.c  the same draws, two layers' lanes at a time (AVX-512F)
 *
 * Ownership: a tracegen_scratch is owned by its user (one generator, or one
 * eldr_tracegen_from_text call); nothing here is thread-safe on a shared
 * scratch. Errors: only tracegen_scratch_init fails (ELDR_ENOMEM). The
 * sampling functions are deterministic functions of the rng state: the bytes
 * of every trace depend on the exact sequence of draws they make. */
#ifndef ELDR_TRACEGEN_INT_H
#define ELDR_TRACEGEN_INT_H

#include <stdint.h>
#include <stdio.h>

#include "eldr/counts.h"
#include "eldr/rng.h"

static inline void tracegen_copy_str(char *dst, size_t cap, const char *src) {
  if (!dst || !cap) return;
  snprintf(dst, cap, "%s", src);
}

/* The ziggurat's tables (tracegen_normal.c): 128 layers. */
typedef struct tracegen_zig {
  uint32_t k[128]; /* a 24-bit magnitude j < k[i] is accepted at once */
  double w[128];   /* the normal is j * w[i] */
  double f[128];   /* exp(-x_i^2 / 2) at the layers' edges (wedge test) */
} tracegen_zig;

void tracegen_zig_init(tracegen_zig *z);

/* Working memory of one request (L*E cells). */
typedef struct tracegen_scratch {
  tracegen_zig zig; /* read-only after tracegen_scratch_init */
  float *logit;    /* L*E request logits R */
  float *prob;     /* L*E normalised probabilities of the current phase */
  float *aprob;    /* L*E alias acceptance (construction) */
  uint32_t *col;   /* L*E alias columns: low 16 bits the acceptance threshold t (a 16-bit
                    * u is kept <=> u < t <=> u / 65536 < aprob), high 16 bits the alias */
  uint32_t *mark;  /* E stamps of tracegen_draw_rest: mark[e] == stamp <=> e taken */
  uint32_t stamp;
  uint32_t *lmark; /* TRACEGEN_LANES * E stamps of the portable sampler's lanes */
  uint32_t lstamp;
  uint32_t *small, *large; /* 2 * E work lists for alias construction (two layers) */
} tracegen_scratch;

int tracegen_scratch_init(tracegen_scratch *s, const eldr_shape *sh);
void tracegen_scratch_free(tracegen_scratch *s);

/* v[0..n) = (or += when add) scale * N(0, 1): the ziggurat, two candidates
 * per 64-bit draw (an odd n uses the low half of one more draw); the rare
 * slow path draws more. No C library math: the same numbers everywhere. */
void tracegen_fill_normal(const tracegen_zig *z, eldr_rng *r, float *v, size_t n, float scale,
                          int add);

/* One phase of a request: s->prob = per-layer softmax(s->logit + sd * N(0, 1))
 * and the Vose alias tables (s->col) of each layer. */
void tracegen_build_phase(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r, double sd);
/* The same with the logits multiplied by `scale` first (an inverse
 * temperature: > 1 sharper); scale 1 is tracegen_build_phase. */
void tracegen_build_phase_scaled(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r, double sd,
                                 float scale);

/* ntok tokens into out (ntok * L * K): per token and layer, K distinct
 * experts sampled without replacement from s->prob via the alias tables
 * (the stream is defined in tracegen_sample.c). */
void tracegen_sample_tokens(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r,
                            uint32_t ntok, uint16_t *out);

#define TRACEGEN_LANES 8 /* tokens of a layer filled side by side */

/* The four lane streams of layer l of a phase with key `key`. */
void tracegen_lane_seed(uint64_t key, uint32_t l, eldr_rng ls[4]);

/* One exact draw from the mass of layer l's pl (E experts) not taken by
 * token t's o[0..k), from an rng seeded by (key, l, t, k). */
uint32_t tracegen_draw_rest(tracegen_scratch *s, const float *pl, uint32_t E, const uint16_t *o,
                            uint32_t k, uint64_t key, uint32_t l, uint32_t t);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TRACEGEN_AVX2 1
/* tracegen_sample_tokens's layers with AVX2 (num_experts <= 256;
 * eldr_cpu_has(ELDR_CPU_AVX2); (ntok + 8) * L * K < 2^31): the phase's key. */
void tracegen_sample_avx2(const eldr_shape *sh, tracegen_scratch *s, uint64_t key, uint32_t ntok,
                          uint16_t *out);
#define TRACEGEN_AVX512 1
/* The same with AVX-512F, two layers per step (the same conditions, and
 * eldr_cpu_has(ELDR_CPU_AVX512)). */
void tracegen_sample_avx512(const eldr_shape *sh, tracegen_scratch *s, uint64_t key,
                            uint32_t ntok, uint16_t *out);
#endif


#endif
