/* tracegen.c — the synthetic trace generator object (see eldr/tracegen.h,
 * docs/trace.md): the model tables of a seed, request i as a pure function
 * of (seed, i), traces, and a request from a prompt text. The sampling
 * kernels are tracegen_phase.c and tracegen_sample.c; shapes, workloads and
 * the text classifier have files of their own (tracegen_int.h lists them). */
#include "eldr/tracegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "eldr/grow.h"
#include "eldr/parallel.h"
#include "eldr/rng.h"
#include "tracegen_int.h"

struct eldr_tracegen {
  eldr_shape shape;
  char model[128];
  uint32_t *layer_ids;
  eldr_tracegen_workload w;
  uint64_t seed;
  float *dom_logit; /* D*L*E: pop + generalist + domain */
  double cum_weight[ELDR_TRACEGEN_MAX_DOMAINS];
  uint32_t force_decode, max_decode, max_prompt;
  tracegen_scratch sc;
  eldr_tracegen_bufs own; /* eldr_tracegen_request's */
};

static uint32_t draw_length(eldr_rng *r, const eldr_tracegen_length *l) {
  double x = exp(log(l->median) + l->sigma * eldr_rng_normal(r));
  if (!(x < 4e9)) x = 4e9;
  uint32_t n = (uint32_t)llround(x);
  if (n < l->min) n = l->min;
  if (n > l->max) n = l->max;
  return n;
}

int eldr_tracegen_new_workload(const eldr_shape *shape, const char *model_name,
                               const eldr_tracegen_workload *w, uint64_t seed,
                               eldr_tracegen **out, eldr_diag *d) {
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: out missing");
  *out = NULL;
  int rc = eldr_shape_validate(shape, d);
  if (rc) return rc;
  if (shape->num_experts > 65536)
    return eldr_diag_fail(d, ELDR_ERANGE, "tracegen: num_experts %u > 65536",
                          shape->num_experts);
  if ((rc = eldr_tracegen_workload_validate(w, d))) return rc;
  if (w->generalists >= shape->num_experts && w->generalists > 0)
    return eldr_diag_fail(d, ELDR_ERANGE, "workload: generalists %u must be < num_experts %u",
                          w->generalists, shape->num_experts);
  eldr_tracegen *g = calloc(1, sizeof *g);
  if (!g) return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  g->shape = *shape;
  g->w = *w;
  g->seed = seed;
  tracegen_copy_str(g->model, sizeof g->model, model_name ? model_name : "custom");
  const size_t L = shape->num_layers, E = shape->num_experts, D = w->n_domains;
  const size_t cells = L * E;
  g->layer_ids = malloc(L * sizeof *g->layer_ids);
  g->dom_logit = malloc(D * cells * sizeof *g->dom_logit);
  float *pop = malloc(cells * sizeof *pop);
  uint32_t *perm = malloc(E * sizeof *perm);
  if (!g->layer_ids || !g->dom_logit || !pop || !perm || tracegen_scratch_init(&g->sc, shape)) {
    free(pop);
    free(perm);
    eldr_tracegen_free(g);
    return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  }
  eldr_tracegen_layer_ids(model_name, shape, g->layer_ids);
  /* model tables: global popularity, generalists, per-domain preferences */
  uint64_t st = seed ^ 0x7472616365676e31ULL; /* "tracegn1" */
  eldr_rng r;
  eldr_rng_seed(&r, eldr_splitmix64(&st));
  tracegen_fill_normal(&g->sc.zig, &r, pop, cells, (float)w->pop_sd, 0);
  for (size_t l = 0; l < L; l++) {
    for (size_t e = 0; e < E; e++) perm[e] = (uint32_t)e;
    for (size_t j = 0; j < w->generalists; j++) { /* partial Fisher-Yates */
      size_t k = j + (size_t)eldr_rng_below(&r, E - j);
      uint32_t t = perm[j];
      perm[j] = perm[k];
      perm[k] = t;
      pop[l * E + perm[j]] += (float)w->generalist_boost;
    }
  }
  for (size_t dm = 0; dm < D; dm++) {
    float *dl = g->dom_logit + dm * cells;
    tracegen_fill_normal(&g->sc.zig, &r, dl, cells, (float)w->domain_sd, 0);
    for (size_t c = 0; c < cells; c++) dl[c] += pop[c];
  }
  double acc = 0;
  for (size_t dm = 0; dm < D; dm++) acc += w->domain_weight[dm];
  double run = 0;
  for (size_t dm = 0; dm < D; dm++) {
    run += w->domain_weight[dm] / acc;
    g->cum_weight[dm] = run;
  }
  g->cum_weight[D - 1] = 1.0;
  free(pop);
  free(perm);
  *out = g;
  return ELDR_OK;
}

void eldr_tracegen_free(eldr_tracegen *g) {
  if (!g) return;
  free(g->own.decode);
  free(g->own.prefill);
  tracegen_scratch_free(&g->sc);
  free(g->dom_logit);
  free(g->layer_ids);
  free(g);
}

void eldr_tracegen_set_lengths(eldr_tracegen *g, uint32_t force_decode, uint32_t max_decode,
                               uint32_t max_prompt) {
  g->force_decode = force_decode;
  g->max_decode = max_decode;
  g->max_prompt = max_prompt;
}

size_t eldr_tracegen_domains(const eldr_tracegen *g) { return g->w.n_domains; }
const eldr_tracegen_workload *eldr_tracegen_get_workload(const eldr_tracegen *g) { return &g->w; }
const eldr_shape *eldr_tracegen_shape(const eldr_tracegen *g) { return &g->shape; }
const char *eldr_tracegen_model(const eldr_tracegen *g) { return g->model; }
const uint32_t *eldr_tracegen_layer_ids_of(const eldr_tracegen *g) { return g->layer_ids; }


/* Generate a request of domain dm with rng r into pre/dec. With drift the
 * decode logits are kept (s->logit becomes Q) and walk on segment by
 * segment; the first segment's tokens are those the model without drift
 * would draw (the same normals, the same key). */
static void gen_core(const eldr_tracegen *g, tracegen_scratch *s, eldr_rng *r, int dm,
                     uint32_t n_pre, uint32_t n_dec, uint16_t *pre, uint16_t *dec) {
  const size_t cells = eldr_shape_cells(&g->shape);
  memcpy(s->logit, g->dom_logit + (size_t)dm * cells, cells * sizeof *s->logit);
  if (g->w.request_sd > 0) tracegen_fill_normal(&s->zig, r, s->logit, cells, (float)g->w.request_sd, 1);
  tracegen_build_phase(&g->shape, s, r, g->w.prefill_sd);
  tracegen_sample_tokens(&g->shape, s, r, n_pre, pre);
  if (!(g->w.decode_drift_sd > 0) && !(g->w.decode_sharpen > 0)) {
    tracegen_build_phase(&g->shape, s, r, g->w.decode_sd);
    tracegen_sample_tokens(&g->shape, s, r, n_dec, dec);
    return;
  }
  if (g->w.decode_sd > 0) tracegen_fill_normal(&s->zig, r, s->logit, cells, (float)g->w.decode_sd, 1);
  const size_t per = (size_t)g->shape.num_layers * g->shape.top_k;
  uint32_t start = 0, end = g->w.drift_tokens ? g->w.drift_tokens : 16;
  for (int seg = 0; start < n_dec; seg++) {
    if (seg && g->w.decode_drift_sd > 0)
      tracegen_fill_normal(&s->zig, r, s->logit, cells, (float)g->w.decode_drift_sd, 1);
    const float beta = (float)(1.0 + g->w.decode_sharpen / (double)((uint64_t)1 << (seg < 62 ? seg : 62)));
    tracegen_build_phase_scaled(&g->shape, s, r, 0, beta);
    const uint32_t stop = end < n_dec ? end : n_dec;
    tracegen_sample_tokens(&g->shape, s, r, stop - start, dec + (size_t)start * per);
    start = stop;
    end = end > UINT32_MAX / 4 ? UINT32_MAX : 4 * end;
  }
}

static int ensure_buf(uint16_t **buf, size_t *cap, uint32_t ntok, size_t per_tok) {
  return eldr_grow(buf, cap, ntok ? ntok : 1, per_tok * sizeof **buf, 1);
}

int eldr_tracegen_request(eldr_tracegen *g, size_t index, eldr_tracegen_req *out, eldr_diag *d) {
  if (!g) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  return eldr_tracegen_request_into(g, index, &g->own, out, d);
}

/* Request `index` with scratch s (g is only read: several threads may
 * generate from one g, each with its own s and b). */
/* The stream of request index: its first draw picks the domain. */
static void request_rng(const eldr_tracegen *g, size_t index, eldr_rng *r) {
  uint64_t st = g->seed ^ ((uint64_t)index * 0xd1b54a32d192ed03ULL);
  st = eldr_splitmix64(&st) ^ 0x5265717565737421ULL;
  eldr_rng_seed(r, eldr_splitmix64(&st));
}

static int domain_of(const eldr_tracegen *g, double u) {
  int dm = 0;
  while ((size_t)dm + 1 < g->w.n_domains && u >= g->cum_weight[dm]) dm++;
  return dm;
}

/* sized: NULL, or {domain index, prompt tokens, output tokens} overriding
 * what request index would draw (eldr_tracegen_request_sized). */
static int request_with(const eldr_tracegen *g, tracegen_scratch *s, size_t index, eldr_tracegen_bufs *b,
                        eldr_tracegen_req *out, const size_t *sized, eldr_diag *d) {
  eldr_rng r;
  request_rng(g, index, &r);
  int dm = domain_of(g, eldr_rng_uniform(&r));
  uint32_t n_pre = draw_length(&r, &g->w.prompt);
  uint32_t n_dec = draw_length(&r, &g->w.output);
  if (g->max_prompt && n_pre > g->max_prompt) n_pre = g->max_prompt;
  if (g->max_decode && n_dec > g->max_decode) n_dec = g->max_decode;
  if (g->force_decode) n_dec = g->force_decode;
  if (sized) {
    eldr_rng rd;
    request_rng(g, sized[0], &rd);
    dm = domain_of(g, eldr_rng_uniform(&rd));
    n_pre = (uint32_t)sized[1];
    n_dec = (uint32_t)sized[2];
  }
  const size_t per = (size_t)g->shape.num_layers * g->shape.top_k;
  if (ensure_buf(&b->prefill, &b->prefill_cap, n_pre, per) ||
      ensure_buf(&b->decode, &b->decode_cap, n_dec, per))
    return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory (%u + %u tokens)", n_pre,
                          n_dec);
  gen_core(g, s, &r, dm, n_pre, n_dec, b->prefill, b->decode);
  out->domain = dm;
  out->n_prefill = n_pre;
  out->n_decode = n_dec;
  out->prefill = b->prefill;
  out->decode = b->decode;
  return ELDR_OK;
}

int eldr_tracegen_request_into(eldr_tracegen *g, size_t index, eldr_tracegen_bufs *b,
                               eldr_tracegen_req *out, eldr_diag *d) {
  if (!g || !b || !out) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  return request_with(g, &g->sc, index, b, out, NULL, d);
}

int eldr_tracegen_request_sized(eldr_tracegen *g, size_t index, size_t domain_index, uint32_t n_prefill,
                                uint32_t n_decode, eldr_tracegen_bufs *b, eldr_tracegen_req *out,
                                eldr_diag *d) {
  if (!g || !b || !out) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  const size_t sized[3] = {domain_index, n_prefill, n_decode};
  return request_with(g, &g->sc, index, b, out, sized, d);
}

eldr_trace *eldr_tracegen_trace_header(const eldr_tracegen *g) {
  eldr_trace *t = eldr_trace_new(g->model, &g->shape, g->layer_ids);
  if (!t) return NULL;
  char gen[ELDR_TRACEGEN_NAME_MAX + 64];
  eldr_tracegen_provenance(g, gen, sizeof gen);
  if (eldr_trace_set_generator(t, gen)) {
    eldr_trace_free(t);
    return NULL;
  }
  for (size_t i = 0; i < g->w.n_domains; i++) {
    if (eldr_trace_domain_intern(t, g->w.domain_names[i]) < 0) {
      eldr_trace_free(t);
      return NULL;
    }
  }
  return t;
}

void eldr_tracegen_provenance(const eldr_tracegen *g, char *buf, size_t cap) {
  snprintf(buf, cap, "eldr-tracegen workload=%s seed=%llu", g->w.name,
           (unsigned long long)g->seed);
}

void eldr_tracegen_request_id(const eldr_tracegen *g, size_t index, int domain, char *buf,
                              size_t cap) {
  const char *dn = domain >= 0 && (size_t)domain < g->w.n_domains ? g->w.domain_names[domain]
                                                                  : "req";
  snprintf(buf, cap, "%s/%zu", dn, index);
}

/* eldr_tracegen_generate's chunks: GEN_CHUNK requests at a time, worker t
 * generating those with index = t (mod threads) into the chunk's slots with
 * its own scratch; the caller then appends them in index order, so the
 * trace does not depend on the thread count. */
#define GEN_CHUNK 128
#define GEN_THREADS_MAX 16

typedef struct gen_chunk {
  const eldr_tracegen *g;
  size_t base, count;
  unsigned threads;
  tracegen_scratch sc[GEN_THREADS_MAX];
  eldr_tracegen_bufs buf[GEN_CHUNK];
  eldr_tracegen_req q[GEN_CHUNK];
  int rc[GEN_CHUNK];
  eldr_diag d[GEN_CHUNK];
} gen_chunk;

static void gen_chunk_task(void *ctx, size_t t) {
  gen_chunk *c = ctx;
  for (size_t k = t; k < c->count; k += c->threads)
    c->rc[k] = request_with(c->g, &c->sc[t], c->base + k, &c->buf[k], &c->q[k], NULL, &c->d[k]);
}

int eldr_tracegen_generate(eldr_tracegen *g, size_t n, eldr_trace **out, eldr_diag *d) {
  if (!g || !out) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  *out = NULL;
  if (n == 0) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: zero requests");
  unsigned threads = eldr_parallel_cores();
  if (threads > GEN_THREADS_MAX) threads = GEN_THREADS_MAX;
  if (n < 2 * GEN_CHUNK) threads = 1; /* small traces: not worth the threads */
  eldr_trace *t = eldr_tracegen_trace_header(g);
  gen_chunk *c = calloc(1, sizeof *c);
  unsigned inited = 0;
  int rc = ELDR_OK;
  if (!t || !c) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
    goto done;
  }
  for (; inited < threads; inited++)
    if (tracegen_scratch_init(&c->sc[inited], &g->shape)) {
      rc = eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
      goto done;
    }
  c->g = g;
  c->threads = threads;
  for (size_t base = 0; base < n && rc == ELDR_OK; base += GEN_CHUNK) {
    c->base = base;
    c->count = n - base < GEN_CHUNK ? n - base : GEN_CHUNK;
    if (threads > 1) eldr_parallel_for(threads, threads, gen_chunk_task, c);
    else gen_chunk_task(c, 0);
    for (size_t k = 0; k < c->count && rc == ELDR_OK; k++) {
      size_t i = base + k;
      if (c->rc[k]) {
        rc = c->rc[k];
        if (d) *d = c->d[k];
        break;
      }
      const eldr_tracegen_req *rq = &c->q[k];
      char id[96];
      eldr_tracegen_request_id(g, i, rq->domain, id, sizeof id);
      int ar = eldr_trace_append(t, id, g->w.domain_names[rq->domain], NULL, -1.0, rq->prefill,
                                 rq->n_prefill, rq->decode, rq->n_decode, NULL);
      if (ar < 0) rc = eldr_diag_fail(d, ar, "tracegen: appending request %zu: %s", i, eldr_strerror(ar));
    }
  }
done:
  if (c) {
    for (unsigned k = 0; k < inited; k++) tracegen_scratch_free(&c->sc[k]);
    for (size_t k = 0; k < GEN_CHUNK; k++) {
      free(c->buf[k].prefill);
      free(c->buf[k].decode);
    }
    free(c);
  }
  if (rc != ELDR_OK) {
    eldr_trace_free(t);
    return rc;
  }
  *out = t;
  return ELDR_OK;
}

int eldr_tracegen_from_text(const eldr_tracegen *g, const char *text, size_t len,
                            uint32_t n_prefill, uint32_t n_decode, uint16_t **prefill,
                            uint16_t **decode, int *domain, eldr_diag *d) {
  if (!g || !prefill || !decode)
    return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  *prefill = NULL;
  *decode = NULL;
  if (!text && len) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: text missing");
  const size_t per = (size_t)g->shape.num_layers * g->shape.top_k;
  if ((uint64_t)n_prefill + n_decode > (64u << 20) / per + 1)
    return eldr_diag_fail(d, ELDR_ERANGE, "tracegen: %u + %u tokens is too many", n_prefill,
                          n_decode);
  int dm = eldr_tracegen_text_domain(text ? text : "", len, g->w.n_domains);
  tracegen_scratch s;
  if (tracegen_scratch_init(&s, &g->shape))
    return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  uint16_t *pre = malloc((n_prefill ? n_prefill : 1) * per * sizeof *pre);
  uint16_t *dec = malloc((n_decode ? n_decode : 1) * per * sizeof *dec);
  if (!pre || !dec) {
    free(dec);
    free(pre);
    tracegen_scratch_free(&s);
    return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  }
  uint64_t h = XXH64(text ? text : "", len, g->seed ^ 0x66726f6d74657874ULL);
  eldr_rng r;
  eldr_rng_seed(&r, h);
  gen_core(g, &s, &r, dm, n_prefill, n_decode, pre, dec);
  tracegen_scratch_free(&s);
  *prefill = pre;
  *decode = dec;
  if (domain) *domain = dm;
  return ELDR_OK;
}
