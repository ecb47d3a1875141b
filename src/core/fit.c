/* fit.c — trace -> routing artifact (see include/eldr/fit.h). */
#include "eldr/fit.h"
#include "eldr/watch.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eldr/clock.h"
#include "eldr/kmeans.h"
#include "eldr/parallel.h"
#include "eldr/rng.h"
#include "eldr/signature.h"
#include "fit_int.h"

void eldr_fit_opts_default(eldr_fit_opts *o) {
  memset(o, 0, sizeof *o);
  o->tau = 0.1;
  o->repr = -1;
  o->idf = ELDR_FIT_AUTO;
  o->layers = ELDR_FIT_LAYERS_AUTO;
  o->balanced = 1;
  o->restarts = 8;
  o->max_iter = 100;
  o->max_pairs = 200000;
  o->seed = ELDR_SEED_DEFAULT;
  o->rho_sample = 4000;
  o->exact_limit = 5000;
  o->batch = 4096;
  o->epochs = 2;
  o->final_iters = 2;
  o->sig_budget = (size_t)3 << 30;
}

void eldr_fit_report_free(eldr_fit_report *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_cand; i++) free(r->cand[i].steps);
  free(r->cand);
  free(r->perm);
  memset(r, 0, sizeof *r);
}

void eldr_fit_shuffle(size_t *perm, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) perm[i] = i;
  eldr_rng r;
  eldr_rng_seed(&r, seed ^ 0x5b117ULL);
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)eldr_rng_below(&r, i), x = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = x;
  }
}


void eldr_fit_gate_sums(const eldr_trace *t, const eldr_request *r, float *out) {
  const size_t L = t->shape.num_layers, E = t->shape.num_experts, K = t->shape.top_k;
  memset(out, 0, L * E * sizeof *out);
  if (!r->prefill_gates || !r->prefill) return;
  for (size_t tok = 0; tok < r->n_prefill; tok++)
    for (size_t l = 0; l < L; l++)
      for (size_t k = 0; k < K; k++) {
        size_t i = (tok * L + l) * K + k;
        out[l * E + r->prefill[i]] += r->prefill_gates[i];
      }
}

int eldr_fit_request_signature(const eldr_artifact *a, const eldr_trace *t,
                               const eldr_request *r, uint32_t *counts_scratch,
                               float *gates_scratch, float *out) {
  eldr_sigspec spec;
  eldr_artifact_sigspec(a, &spec);
  eldr_trace_request_counts(t, r, 0, counts_scratch);
  const float *gates = NULL;
  if ((a->repr == ELDR_REPR_GATE || a->repr == ELDR_REPR_LOGIT) && gates_scratch &&
      r->prefill_gates) {
    eldr_fit_gate_sums(t, r, gates_scratch);
    gates = gates_scratch;
  }
  return eldr_signature_build(&spec, counts_scratch, gates, out);
}

static void progress(const eldr_fit_opts *o, const char *stage, size_t done, size_t total) {
  if (o->progress) o->progress(o->progress_ctx, stage, done, total);
}

/* Scoring the candidate representations (greedy mask + rho): independent
 * pure computations, spread over up to 2 threads; each candidate's result
 * depends only on its inputs, so the report is the same on any schedule. */
typedef struct rho_jobs {
  const eldr_shape *s;
  const float *idf;
  const uint32_t *pre;
  const float *gates, *decpat;
  size_t n;
  const eldr_pairs_opts *po;
  eldr_fit_candidate *cand;
  size_t n_cand;
  uint8_t *masks;
  const eldr_fit_opts *o;
  pthread_mutex_t lock; /* guards done, rc, failed and progress */
  size_t done;
  int rc;        /* first failure by candidate index */
  size_t failed; /* that candidate */
} rho_jobs;

/* Score candidate c (a parallel-for task). */
static void rho_task(void *arg, size_t c) {
  rho_jobs *j = arg;
  const size_t L = j->s->num_layers, LE = eldr_shape_cells(j->s);
  eldr_fit_candidate *cd = &j->cand[c];
  uint8_t *m = j->masks + c * L;
  int rc = eldr_quality_greedy_mask(j->s, cd->repr, cd->idf ? j->idf : NULL, j->pre, j->gates,
                                    j->decpat, LE, j->n, j->po, cd->steps, m, &cd->rho_mask,
                                    &cd->rho_all);
  if (rc == ELDR_EEMPTY) {
    /* rho is undefined (e.g. every decode pattern or every signature
     * distance is equal): keep all layers, rank this candidate last */
    cd->rho_all = cd->rho_mask = NAN;
    for (size_t l = 0; l < L; l++) cd->steps[l] = (eldr_mask_step){.layer = (int)l, .rho = NAN};
    memset(m, 1, L);
    rc = ELDR_OK;
  }
  pthread_mutex_lock(&j->lock);
  if (rc && (!j->rc || c < j->failed)) {
    j->rc = rc;
    j->failed = c;
  }
  j->done++;
  progress(j->o, "rho", j->done, j->n_cand);
  pthread_mutex_unlock(&j->lock);
}

static int score_candidates(rho_jobs *j) {
  pthread_mutex_init(&j->lock, NULL);
  progress(j->o, "rho", 0, j->n_cand);
  eldr_parallel_for(j->n_cand, 2, rho_task, j);
  pthread_mutex_destroy(&j->lock);
  return j->rc;
}

/* ---- the in-memory trace as a source ------------------------------------ */

/* A source over an in-memory trace (and a subset of its requests, when
 * set): the context trace_each reads, with its count buffers. */
typedef struct trace_ctx {
  const eldr_trace *t;
  const size_t *subset;
  size_t n_subset;
  uint32_t *pre, *dec;
  float *gates;
} trace_ctx;

static int trace_each(void *ctx, eldr_fit_visit visit, void *ud, eldr_diag *d) {
  trace_ctx *c = ctx;
  const eldr_trace *t = c->t;
  const size_t n = c->subset ? c->n_subset : t->n;
  for (size_t i = 0; i < n; i++) {
    const size_t ri = c->subset ? c->subset[i] : i;
    if (ri >= t->n) return eldr_diag_fail(d, ELDR_ERANGE, "subset index %zu >= %zu requests", ri, t->n);
    const eldr_request *r = &t->req[ri];
    eldr_fit_item it = {.n_prefill = r->n_prefill, .prefill = c->pre, .decode = c->dec};
    if (r->n_prefill) {
      eldr_trace_request_counts(t, r, 0, c->pre);
      eldr_trace_request_counts(t, r, 1, c->dec);
      if (eldr_request_is_counts(r) && !r->decode_counts) it.decode = NULL; /* unknown */
      if (r->prefill_gates && r->prefill && c->gates) {
        eldr_fit_gate_sums(t, r, c->gates);
        it.gates = c->gates;
      }
    }
    int rc = visit(ud, &it);
    if (rc) return rc;
  }
  return ELDR_OK;
}

static void trace_source_free(trace_ctx *ctx) {
  free(ctx->pre);
  free(ctx->dec);
  free(ctx->gates);
  memset(ctx, 0, sizeof *ctx);
}

/* Fills src and ctx (released by trace_source_free). */
static int trace_source(const eldr_trace *t, const size_t *subset, size_t n_subset, trace_ctx *ctx,
                        eldr_fit_source *src) {
  memset(ctx, 0, sizeof *ctx);
  memset(src, 0, sizeof *src);
  const size_t LE = eldr_shape_cells(&t->shape);
  ctx->t = t;
  ctx->subset = subset;
  ctx->n_subset = n_subset;
  ctx->pre = malloc(LE * sizeof *ctx->pre);
  ctx->dec = malloc(LE * sizeof *ctx->dec);
  ctx->gates = malloc(LE * sizeof *ctx->gates);
  if (!ctx->pre || !ctx->dec || !ctx->gates) {
    trace_source_free(ctx);
    return ELDR_ENOMEM;
  }
  src->model = t->model;
  src->shape = t->shape;
  src->layer_ids = t->layer_ids;
  src->generator = t->generator;
  src->each = trace_each;
  src->ctx = ctx;
  return ELDR_OK;
}

int eldr_fit(const eldr_trace *t, const eldr_fit_opts *o, eldr_artifact **out,
             eldr_fit_report *report, eldr_diag *d) {
  trace_ctx ctx;
  eldr_fit_source src;
  *out = NULL;
  memset(report, 0, sizeof *report);
  if (trace_source(t, o->subset, o->subset ? o->n_subset : 0, &ctx, &src))
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  int rc = eldr_fit_stream(&src, o, out, report, d);
  trace_source_free(&ctx);
  return rc;
}

/* ---- pass 1: counts, document frequencies, the reservoir sample ---------- */

typedef struct pass1 {
  size_t LE, cap;       /* cells, sample capacity */
  size_t n, skipped, ns; /* usable requests, skipped, sampled */
  size_t with_decode;   /* usable requests carrying decode selections */
  uint32_t *df;         /* LE */
  uint32_t *pre, *dec;  /* cap * LE */
  float *gates;         /* cap * LE (while every request so far had gates) */
  int have_gates;
  eldr_rng rng;
  const eldr_fit_opts *o;
} pass1;

static int pass1_visit(void *ud, const eldr_fit_item *it) {
  pass1 *p = ud;
  const size_t LE = p->LE;
  if (it->n_prefill == 0) {
    p->skipped++;
    return 0;
  }
  const size_t i = p->n++;
  uint32_t dsum = 0;
  for (size_t c = 0; c < LE; c++) {
    p->df[c] += it->prefill[c] != 0;
    if (it->decode) dsum |= it->decode[c];
  }
  p->with_decode += dsum != 0;
  if (!it->gates && p->have_gates) {
    p->have_gates = 0;
    free(p->gates);
    p->gates = NULL;
  }
  if (p->o->progress && (p->n & 1023) == 0) p->o->progress(p->o->progress_ctx, "read", p->n, 0);
  size_t slot = i;
  if (i >= p->cap) { /* reservoir: keep request i with probability cap / (i + 1) */
    slot = (size_t)eldr_rng_below(&p->rng, (uint64_t)i + 1);
    if (slot >= p->cap) return 0;
  } else {
    p->ns++;
  }
  memcpy(p->pre + slot * LE, it->prefill, LE * sizeof *p->pre);
  if (it->decode) memcpy(p->dec + slot * LE, it->decode, LE * sizeof *p->dec);
  else memset(p->dec + slot * LE, 0, LE * sizeof *p->dec);
  if (p->have_gates) memcpy(p->gates + slot * LE, it->gates, LE * sizeof *p->gates);
  return 0;
}

static void pass1_free(pass1 *p) {
  free(p->df);
  free(p->pre);
  free(p->dec);
  free(p->gates);
  memset(p, 0, sizeof *p);
}

/* ---- the footprint priors ------------------------------------------------- */

#define FP_PRIOR_SAMPLE 1024 /* calibration requests the footprint priors are fitted on */

/* Counts of the sampled requests kept for the priors: sample index, L*E
 * prefill and decode counts of each. */
typedef struct fp_keep {
  size_t n, *idx;
  uint32_t *pre, *dec;
} fp_keep;

/* The priors of the footprint policy on the kept requests, each labelled
 * with the centroid nearest to its signature (sigs_s rows, a's final
 * centroids), into a; none (and no error) when no kept request has decode
 * counts. */
static int fit_fp_priors(eldr_artifact *a, const fp_keep *fk, const float *sigs_s,
                         eldr_fit_report *report, eldr_diag *d) {
  const size_t LE = eldr_shape_cells(&a->shape), k = a->k, dim = a->dim;
  int *lab = malloc((fk->n ? fk->n : 1) * sizeof *lab);
  float *prior = malloc((1 + k) * LE * sizeof *prior);
  if (!lab || !prior) {
    free(lab);
    free(prior);
    return eldr_diag_fail(d, ELDR_ENOMEM, "footprint priors: out of memory");
  }
  for (size_t j = 0; j < fk->n; j++) {
    const float *sg = sigs_s + fk->idx[j] * dim;
    double best = -INFINITY;
    lab[j] = -1;
    for (size_t c = 0; c < k; c++) {
      double v = eldr_dot(sg, a->centroids + c * dim, dim);
      if (v > best) best = v, lab[j] = (int)c;
    }
  }
  int rc = eldr_fp_prior_fit(&a->shape, fk->pre, fk->dec, lab, fk->n, k, prior, &report->fp_prior);
  if (rc == ELDR_OK)
    rc = eldr_artifact_set_fp_prior(a, prior, isinf(report->fp_prior.beta) ? 1 : 1 + k,
                                    report->fp_prior.alpha, d);
  else if (rc == ELDR_EEMPTY)
    rc = ELDR_OK;
  else
    rc = eldr_diag_fail(d, rc, "footprint priors: %s", eldr_strerror(rc));
  free(lab);
  free(prior);
  return rc;
}

/* ---- the fit ---------------------------------------------------------------- */

/* One fit's state, phase to phase (each phase reads what the ones before
 * it made; fit_job_free frees whatever a failed phase left). */
typedef struct fit_job {
  const eldr_fit_source *src;
  const eldr_fit_opts *o;
  eldr_fit_report *report;
  eldr_diag *d;
  const eldr_shape *s;
  size_t L, LE;
  pass1 p1;          /* pass 1: the sample's counts, document frequencies */
  size_t n, ns;      /* usable requests, the sample's size */
  int have_gates;    /* every request carries prefill gates */
  float *decpat;     /* ns x LE decode patterns (freed after the sample's signatures) */
  float *idf;        /* LE */
  eldr_pairs_opts po;
  uint8_t *masks;    /* a layer mask per candidate */
  size_t best;       /* the chosen candidate */
  int chosen_by;     /* ELDR_FIT_BY_* */
  eldr_artifact *a;  /* the artifact being fitted */
  fit_rows rows;     /* the rows K-means reads */
  float *sigs_s;     /* ns x dim: the sample's signatures */
  fp_keep fpk;       /* the counts the footprint priors are fitted on */
  size_t *sizes;     /* k cluster sizes */
  int *labels;       /* n labels (exact K-means) */
  float *x;          /* the signature matrix, while K-means needs it */
} fit_job;

static void fit_job_free(fit_job *j) {
  eldr_artifact_free(j->a);
  free(j->masks);
  free(j->labels);
  free(j->sizes);
  free(j->x);
  free(j->sigs_s);
  free(j->idf);
  free(j->decpat);
  pass1_free(&j->p1);
  free(j->fpk.idx);
  free(j->fpk.pre);
  free(j->fpk.dec);
}

/* The options against the source's shape (nothing read yet). */
static int fit_check(const eldr_fit_source *src, const eldr_fit_opts *o, eldr_diag *d) {
  const eldr_shape *s = &src->shape;
  if (o->k < 1) return eldr_diag_fail(d, ELDR_EINVAL, "decoders (k) must be >= 1");
  if (!(o->tau >= 0.0 && o->tau <= 2.0))
    return eldr_diag_fail(d, ELDR_ERANGE, "tau %g out of range [0, 2]", o->tau);
  if (o->repr > ELDR_REPR_LOGIT) return eldr_diag_fail(d, ELDR_EINVAL, "unknown representation");
  if (o->layers == ELDR_FIT_LAYERS_LIST && !o->layer_list_mask)
    return eldr_diag_fail(d, ELDR_EINVAL, "layer list missing");
  if (eldr_shape_validate(s, d)) return ELDR_ERANGE;
  if (o->previous) {
    const eldr_artifact *pv = o->previous;
    if (pv->shape.num_layers != s->num_layers || pv->shape.num_experts != s->num_experts ||
        pv->shape.top_k != s->top_k)
      return eldr_diag_fail(d, ELDR_ESHAPE,
                            "previous artifact has %u layers x %u experts top-%u, the trace %u x %u top-%u",
                            pv->shape.num_layers, pv->shape.num_experts, pv->shape.top_k,
                            s->num_layers, s->num_experts, s->top_k);
    if (pv->k != o->k)
      return eldr_diag_fail(d, ELDR_EINVAL,
                            "previous artifact has %zu centroids, this fit %zu: continuity needs the same number",
                            pv->k, o->k);
  }
  return ELDR_OK;
}

/* 1. Pass 1: every request read once; the sample's counts (and gates) and
 * the document frequencies; the sample's decode patterns and the IDF. */
static int fit_read(fit_job *j) {
  const eldr_fit_opts *o = j->o;
  eldr_fit_report *report = j->report;
  eldr_diag *d = j->d;
  const size_t LE = j->LE;
  double t0 = eldr_clock_now();
  j->p1.LE = LE;
  j->p1.cap = o->rho_sample > o->k ? o->rho_sample : o->k;
  if (j->p1.cap < 2) j->p1.cap = 2;
  j->p1.o = o;
  j->p1.have_gates = 1;
  eldr_rng_seed(&j->p1.rng, o->seed ^ 0x5a3b1e5ULL);
  j->p1.df = calloc(LE, sizeof *j->p1.df);
  j->p1.pre = malloc(j->p1.cap * LE * sizeof *j->p1.pre);
  j->p1.dec = malloc(j->p1.cap * LE * sizeof *j->p1.dec);
  j->p1.gates = malloc(j->p1.cap * LE * sizeof *j->p1.gates);
  if (!j->p1.df || !j->p1.pre || !j->p1.dec || !j->p1.gates) return ELDR_ENOMEM;
  int rc = j->src->each(j->src->ctx, pass1_visit, &j->p1, d);
  report->passes = 1;
  if (rc) return rc;
  j->n = j->p1.n;
  j->ns = j->p1.ns;
  const size_t n = j->n;
  j->have_gates = j->p1.have_gates && n > 0;
  report->skipped_empty = j->p1.skipped;
  if (n < 2 || n < o->k) {
    return eldr_diag_fail(d, ELDR_EEMPTY,
                          "%zu usable requests (with prefill selections) for %zu decoders: need at least max(2, k)",
                          n, o->k);
  }
  if ((o->repr == ELDR_REPR_GATE || o->repr == ELDR_REPR_LOGIT) && !j->have_gates) {
    return eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                          "representation '%s' needs prefill_gates on every request of the trace",
                          eldr_repr_name((eldr_repr)o->repr));
  }
  j->decpat = calloc(j->ns * LE, sizeof *j->decpat);
  j->idf = calloc(LE, sizeof *j->idf);
  if (!j->decpat || !j->idf) return ELDR_ENOMEM;
  eldr_quality_decode_patterns(j->s, j->p1.dec, j->ns, j->decpat);
  for (size_t c = 0; c < LE; c++)
    j->idf[c] = (float)log(((double)n + 1.0) / ((double)j->p1.df[c] + 1.0));
  report->n = n;
  report->sample = j->ns;
  report->seconds_read = eldr_clock_now() - t0;
  return ELDR_OK;
}

/* 2. The candidates (representation x IDF), each scored by rho on the
 * sample, with its greedy layer mask. */
static int fit_score(fit_job *j) {
  const eldr_fit_opts *o = j->o;
  eldr_fit_report *report = j->report;
  eldr_diag *d = j->d;
  const size_t L = j->L;
  double t0;
  eldr_repr reprs[4];
  size_t n_repr = 0;
  if (o->repr >= 0) {
    reprs[n_repr++] = (eldr_repr)o->repr;
  } else {
    reprs[n_repr++] = ELDR_REPR_COUNT;
    reprs[n_repr++] = ELDR_REPR_BINARY;
    if (j->have_gates) {
      reprs[n_repr++] = ELDR_REPR_GATE;
      reprs[n_repr++] = ELDR_REPR_LOGIT;
    }
  }
  int idfs[2];
  size_t n_idf = 0;
  if (o->idf == ELDR_FIT_AUTO) {
    idfs[n_idf++] = 0;
    idfs[n_idf++] = 1;
  } else {
    idfs[n_idf++] = o->idf == ELDR_FIT_ON;
  }
  report->cand = calloc(n_repr * n_idf, sizeof *report->cand);
  j->masks = calloc(n_repr * n_idf * L, 1);
  if (!report->cand || !j->masks) return ELDR_ENOMEM;
  j->po = (eldr_pairs_opts){.max_pairs = o->max_pairs, .seed = o->seed ^ 0x5eedf17ULL};
  t0 = eldr_clock_now();
  for (size_t ri = 0; ri < n_repr; ri++) {
    for (size_t ii = 0; ii < n_idf; ii++) {
      eldr_fit_candidate *cd = &report->cand[report->n_cand];
      cd->repr = reprs[ri];
      cd->idf = idfs[ii];
      cd->steps = calloc(L, sizeof *cd->steps);
      if (!cd->steps) return ELDR_ENOMEM;
      report->n_cand++;
    }
  }
  /* the candidates are independent: score them on up to 2 threads */
  rho_jobs rj = {.s = j->s, .idf = j->idf, .pre = j->p1.pre, .gates = j->have_gates ? j->p1.gates : NULL,
                 .decpat = j->decpat, .n = j->ns, .po = &j->po, .cand = report->cand,
                 .n_cand = report->n_cand, .masks = j->masks, .o = o};
  int rc = score_candidates(&rj);
  if (rc) {
    const eldr_fit_candidate *cd = &report->cand[rj.failed];
    eldr_diag_fail(d, rc, "rho of %s%s: %s", eldr_repr_name(cd->repr), cd->idf ? "-idf" : "",
                   eldr_strerror(rc));
    return rc;
  }
  for (size_t c = 0; c < report->n_cand; c++) {
    eldr_fit_candidate *cd = &report->cand[c];
    uint8_t *m = j->masks + c * L;
    if (isnan(cd->rho_all)) report->rho_undefined++;
    if (o->layers == ELDR_FIT_LAYERS_ALL) {
      memset(m, 1, L);
    } else if (o->layers == ELDR_FIT_LAYERS_LIST) {
      memcpy(m, o->layer_list_mask, L);
    }
    size_t ms = 0;
    for (size_t l = 0; l < L; l++) ms += m[l] != 0;
    cd->mask_size = ms;
  }
  report->seconds_rho = eldr_clock_now() - t0;
  report->with_decode = j->p1.with_decode;
  return ELDR_OK;
}

/* The evidence that chooses (rho, or the caller's named representation and
 * mask) and the chosen candidate. */
static int fit_choose(fit_job *j) {
  const eldr_fit_opts *o = j->o;
  eldr_fit_report *report = j->report;
  eldr_diag *d = j->d;
  /* which evidence chooses: rho, or the caller's named representation and
   * mask; without decode selections rho cannot be measured, and a choice
   * nobody made is refused unless the caller accepts a prefill-only fit */
  const int named = o->repr >= 0 && o->layers != ELDR_FIT_LAYERS_AUTO;
  j->chosen_by = named ? ELDR_FIT_BY_NAMED : ELDR_FIT_BY_RHO;
  if (!j->p1.with_decode) {
    if (!named && !o->prefill_only) {
      return eldr_diag_fail(d, ELDR_EEMPTY,
                          "none of the %zu requests carries decode selections (e.g. recorded streams): rho "
                          "cannot choose the representation and layers; name both (--representation, "
                          "--layers) or pass --prefill-only", j->n);
    }
    if (!named) j->chosen_by = ELDR_FIT_BY_PREFILL_ONLY;
  }

  /* without any defined rho: the count representation, IDF as allowed */
  size_t best = 0;
  for (size_t c = 0; c < report->n_cand; c++)
    if (report->cand[c].repr == ELDR_REPR_COUNT && report->cand[c].idf) best = c;
  double best_rho = -2.0;
  for (size_t c = 0; c < report->n_cand; c++) {
    eldr_fit_candidate *cd = &report->cand[c];
    /* a list mask is measured below for the chosen candidate only: rank by
     * the all-layer rho */
    double r = o->layers == ELDR_FIT_LAYERS_AUTO ? cd->rho_mask : cd->rho_all;
    if (isfinite(r) && r > best_rho + 1e-12) {
      best_rho = r;
      best = c;
    }
  }
  report->chosen = best;
  j->best = best;
  return ELDR_OK;
}

/* 3. The artifact of the chosen candidate, the sample's signatures under
 * it, its rho and interval; the counts the footprint priors will need kept,
 * the rest of the sample's counts freed before the big matrix. */
static int fit_sample_sigs(fit_job *j) {
  const eldr_fit_opts *o = j->o;
  eldr_fit_report *report = j->report;
  eldr_diag *d = j->d;
  const size_t L = j->L, LE = j->LE;
  const size_t best = j->best, n = j->n, ns = j->ns;
  const eldr_fit_candidate *ch = &report->cand[best];
  eldr_artifact *a = j->a = eldr_artifact_new(j->src->model, j->s, j->src->layer_ids, ch->repr, ch->idf, j->masks + best * L, o->k);
  if (!a) return eldr_diag_fail(d, ELDR_ENOMEM, "cannot allocate the artifact");
  if (ch->idf) memcpy(a->idf, j->idf, LE * sizeof *j->idf);
  a->tau = o->tau;
  j->rows = (fit_rows){.src = j->src, .dim = a->dim, .n = n, .ns = ns};
  eldr_artifact_sigspec(a, &j->rows.spec);
  const size_t dim = a->dim;
  float *sigs_s = j->sigs_s = calloc(ns * dim, sizeof *sigs_s);
  if (!sigs_s) return ELDR_ENOMEM;
  for (size_t i = 0; i < ns; i++) {
    int b = eldr_signature_build(&j->rows.spec, j->p1.pre + i * LE, j->have_gates ? j->p1.gates + i * LE : NULL,
                                 sigs_s + i * dim);
    if (b && b != ELDR_EEMPTY) return eldr_diag_fail(d, b, "signature of sampled request %zu: %s", i, eldr_strerror(b));
  }
  if (o->layers == ELDR_FIT_LAYERS_LIST) {
    double r = 0;
    if (eldr_quality_rho(sigs_s, dim, j->decpat, LE, ns, &j->po, &r) == ELDR_OK) report->cand[best].rho_mask = r;
  }
  a->fit_rho = o->layers == ELDR_FIT_LAYERS_ALL ? ch->rho_all : report->cand[best].rho_mask;
  a->fit_chosen_by = j->chosen_by;
  a->fit_decode_n = j->p1.with_decode;
  report->rho_ci.rho = report->rho_ci.se = report->rho_ci.lo = report->rho_ci.hi = NAN;
  if (ns >= 40) { /* 20 jackknife groups of at least 2 requests */
    int q = eldr_quality_rho_ci(sigs_s, dim, j->decpat, LE, ns, &j->po, 20, &report->rho_ci);
    if (q && q != ELDR_EEMPTY) return eldr_diag_fail(d, q, "rho interval: %s", eldr_strerror(q));
    if (q) report->rho_ci.rho = report->rho_ci.se = report->rho_ci.lo = report->rho_ci.hi = NAN;
  }
  /* the footprint priors (below, after K-means) need prefill and decode
   * counts of calibration requests: keep those of at most FP_PRIOR_SAMPLE of
   * the sample (evenly spread: the sample may be in the source's order) */
  j->fpk.n = ns < FP_PRIOR_SAMPLE ? ns : FP_PRIOR_SAMPLE;
  j->fpk.idx = malloc((j->fpk.n ? j->fpk.n : 1) * sizeof *j->fpk.idx);
  j->fpk.pre = malloc((j->fpk.n ? j->fpk.n : 1) * LE * sizeof *j->fpk.pre);
  j->fpk.dec = malloc((j->fpk.n ? j->fpk.n : 1) * LE * sizeof *j->fpk.dec);
  if (!j->fpk.idx || !j->fpk.pre || !j->fpk.dec) return ELDR_ENOMEM;
  for (size_t q = 0; q < j->fpk.n; q++) {
    size_t i = (size_t)((double)q * (double)ns / (double)j->fpk.n);
    j->fpk.idx[q] = i;
    memcpy(j->fpk.pre + q * LE, j->p1.pre + i * LE, LE * sizeof *j->fpk.pre);
    memcpy(j->fpk.dec + q * LE, j->p1.dec + i * LE, LE * sizeof *j->fpk.dec);
  }
  /* the sample's counts are done with: free them before the big matrix */
  free(j->decpat);
  j->decpat = NULL;
  free(j->p1.pre);
  free(j->p1.dec);
  free(j->p1.gates);
  j->p1.pre = j->p1.dec = NULL;
  j->p1.gates = NULL;
  return ELDR_OK;
}

/* 4. Balanced K-means: exact on every row where they fit (or the sample is
 * every request), else mini-batch epochs over the source and an exact end;
 * the artifact's fit fields. */
static int fit_cluster(fit_job *j) {
  const eldr_fit_opts *o = j->o;
  eldr_fit_report *report = j->report;
  eldr_diag *d = j->d;
  const size_t n = j->n, ns = j->ns, dim = j->a->dim;
  eldr_artifact *a = j->a;
  size_t *sizes = j->sizes = calloc(o->k, sizeof *sizes);
  if (!sizes) return ELDR_ENOMEM;
  eldr_kmeans_opts ko = {.k = o->k, .balanced = o->balanced, .restarts = o->restarts,
                         .max_iter = o->max_iter, .seed = o->seed};
  eldr_kmeans_result kr = {0};
  progress(o, "kmeans", 0, 1);
  double t0 = eldr_clock_now();
  const int in_memory = (double)n * (double)dim * sizeof(float) <= (double)o->sig_budget;
  const float *xs = NULL;
  int rc;
  if (n == ns) {
    xs = j->sigs_s; /* the sample is every request, in source order */
  } else if (in_memory && (n <= o->exact_limit || !o->balanced)) {
    j->x = malloc(n * dim * sizeof *j->x);
    if (!j->x) return eldr_diag_fail(d, ELDR_ENOMEM, "signature matrix: %zu x %zu floats", n, dim);
    double tr = eldr_clock_now();
    if ((rc = eldr__fit_build_matrix(&j->rows, j->x, d))) return rc;
    report->seconds_read += eldr_clock_now() - tr;
    report->passes++;
    xs = j->x;
  }
  if (xs) { /* exact: every assignment step on all rows */
    report->mode = "exact";
    j->labels = calloc(n, sizeof *j->labels);
    if (!j->labels) return ELDR_ENOMEM;
    rc = eldr_kmeans_fit(xs, n, dim, &ko, a->centroids, j->labels, sizes, &kr);
    if (rc) return eldr_diag_fail(d, rc, "K-means: %s", eldr_strerror(rc));
  } else {
    /* initial centroids: the exact balanced K-means of (the first rows of)
     * the sample, which is in random order: max(1024, 32 k) rows and at
     * most 30 iterations per restart are plenty for a start that the
     * mini-batch epochs and the exact end refine */
    size_t ni = 32 * o->k > 1024 ? 32 * o->k : 1024;
    if (ni > ns) ni = ns;
    if (ko.max_iter > 30) ko.max_iter = 30;
    int *sl = calloc(ni, sizeof *sl);
    if (!sl) return ELDR_ENOMEM;
    rc = eldr_kmeans_fit(j->sigs_s, ni, dim, &ko, a->centroids, sl, NULL, &kr);
    free(sl);
    if (rc) return eldr_diag_fail(d, rc, "K-means of the sample: %s", eldr_strerror(rc));
    j->rows.sample = j->sigs_s;
    if (in_memory) {
      j->x = malloc(n * dim * sizeof *j->x);
      if (!j->x) return eldr_diag_fail(d, ELDR_ENOMEM, "signature matrix: %zu x %zu floats", n, dim);
      double tr = eldr_clock_now();
      if ((rc = eldr__fit_build_matrix(&j->rows, j->x, d))) return rc;
      report->seconds_read += eldr_clock_now() - tr;
      report->passes++;
      j->rows.x = j->x;
    }
    report->mode = in_memory ? "mini-batch" : "mini-batch (streamed)";
    if (o->previous) { /* continuity: start from the previous partition */
      if ((rc = eldr__fit_warm_start(&j->rows, o, a->centroids, d))) return rc;
      report->passes++;
    }
    int passes = 0;
    rc = eldr__fit_kmeans_scale(&j->rows, o, a->centroids, sizes, &kr.objective, &passes, d);
    report->passes += passes;
    if (rc) return rc;
  }
  report->seconds_kmeans = eldr_clock_now() - t0;
  progress(o, "kmeans", 1, 1);
  report->kmeans_objective = kr.objective;
  report->capacity = (n + o->k - 1) / o->k;
  for (size_t c = 0; c < o->k; c++) a->cluster_sizes[c] = sizes[c];
  free(j->x);
  j->x = NULL;
  a->fit_n = n;
  a->fit_seed = o->seed;
  a->fit_balanced = o->balanced;
  if (j->src->generator) {
    size_t gl = strlen(j->src->generator) + 1;
    if (!(a->trace_generator = malloc(gl))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    memcpy(a->trace_generator, j->src->generator, gl);
  }
  return ELDR_OK;
}

/* 5. Continuity with the previous artifact, the footprint's profile
 * priors, the drift reference; the artifact validated. */
static int fit_complete(fit_job *j) {
  const eldr_fit_opts *o = j->o;
  eldr_fit_report *report = j->report;
  eldr_diag *d = j->d;
  eldr_artifact *a = j->a;
  int rc;
  if (o->previous) {
    rc = eldr__fit_align_previous(j->src, o, a, report, d);
    report->passes++;
    if (rc) return rc;
  }
  /* the footprint policy's profile priors (eldr/fp_prior.h): global, and
   * per cluster of the final centroids */
  if ((rc = fit_fp_priors(a, &j->fpk, j->sigs_s, report, d))) return rc;

  /* the fit-time signature distribution a router's drift score compares
   * with: the sample's (every request up to --rho-sample), against the
   * centroids in their final (aligned) order */
  rc = eldr_drift_ref_compute(a->centroids, a->k, a->dim, j->sigs_s, j->ns, &a->drift_ref);
  if (rc == ELDR_EEMPTY) rc = 0;
  if (rc) return eldr_diag_fail(d, rc, "drift reference: %s", eldr_strerror(rc));

  rc = eldr_artifact_validate(a, d);
  if (rc) eldr_diag_prefix(d, "fitted artifact invalid");
  return rc;

}

int eldr_fit_stream(const eldr_fit_source *src, const eldr_fit_opts *o, eldr_artifact **out,
                    eldr_fit_report *report, eldr_diag *d) {
  *out = NULL;
  memset(report, 0, sizeof *report);
  report->moved = report->moved_unaligned = NAN;
  int rc = fit_check(src, o, d);
  if (rc) return rc;
  fit_job j = {.src = src, .o = o, .report = report, .d = d, .s = &src->shape,
               .L = src->shape.num_layers, .LE = eldr_shape_cells(&src->shape)};
  if (!(rc = fit_read(&j)) && !(rc = fit_score(&j)) && !(rc = fit_choose(&j)) && !(rc = fit_sample_sigs(&j)) &&
      !(rc = fit_cluster(&j)) && !(rc = fit_complete(&j))) {
    *out = j.a;
    j.a = NULL;
  }
  fit_job_free(&j);
  if (rc) {
    eldr_fit_report_free(report);
    if (rc == ELDR_ENOMEM && d && !d->msg[0]) eldr_diag_fail(d, rc, "out of memory");
  }
  return rc;
}
