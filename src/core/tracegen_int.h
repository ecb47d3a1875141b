/* tracegen_int.h — private seams of the trace generator (eldr/tracegen.h).
 * Not installed.
 *
 *   tracegen.c          the generator object: model tables, request i = f(seed, i),
 *                       traces, text -> request
 *   tracegen_shape.c    model shape presets         tracegen_workload.c  workloads
 *   tracegen_text.c     text -> domain classifier
 *   tracegen_phase.c    per request and phase: normals, softmax, alias tables
 *   tracegen_sample.c   K distinct experts per token and layer from the alias tables
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

/* Working memory of one request (L*E cells). */
typedef struct tracegen_scratch {
  float *logit;    /* L*E request logits R */
  float *prob;     /* L*E normalised probabilities of the current phase */
  float *aprob;    /* L*E alias acceptance (construction) */
  uint32_t *col;   /* L*E alias columns: low 16 bits the acceptance threshold t (a 16-bit
                    * u is kept <=> u < t <=> u / 65536 < aprob), high 16 bits the alias */
  uint32_t *mark;  /* E stamps: mark[e] == stamp <=> e already taken for this token and layer */
  uint32_t stamp;
  uint32_t *small, *large; /* E work lists for alias construction */
} tracegen_scratch;

int tracegen_scratch_init(tracegen_scratch *s, const eldr_shape *sh);
void tracegen_scratch_free(tracegen_scratch *s);

/* v[0..n) = (or += when add) scale * N(0, 1): Box-Muller, both outputs used,
 * two 64-bit draws per pair. */
void tracegen_fill_normal(eldr_rng *r, float *v, size_t n, float scale, int add);

/* One phase of a request: s->prob = per-layer softmax(s->logit + sd * N(0, 1))
 * and the Vose alias tables (s->col) of each layer. */
void tracegen_build_phase(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r, double sd);

/* ntok tokens into out (ntok * L * K): per token and layer, K distinct
 * experts sampled without replacement from s->prob via the alias tables. */
void tracegen_sample_tokens(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r,
                            uint32_t ntok, uint16_t *out);

#endif
