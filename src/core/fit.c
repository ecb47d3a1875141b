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
}

void eldr_fit_report_free(eldr_fit_report *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_cand; i++) free(r->cand[i].steps);
  free(r->cand);
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


/* Gate sums of a request's prefill: out (L*E, zeroed here). */
static void request_gate_sums(const eldr_trace *t, const eldr_request *r, float *out) {
  const size_t L = t->shape.num_layers, E = t->shape.num_experts, K = t->shape.top_k;
  memset(out, 0, L * E * sizeof *out);
  if (!r->prefill_gates) return;
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
    request_gate_sums(t, r, gates_scratch);
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

int eldr_fit(const eldr_trace *t, const eldr_fit_opts *o, eldr_artifact **out,
             eldr_fit_report *report, eldr_diag *d) {
  int rc = ELDR_OK;
  *out = NULL;
  memset(report, 0, sizeof *report);
  const eldr_shape *s = &t->shape;
  const size_t L = s->num_layers, E = s->num_experts, LE = L * E;
  const size_t n_all = o->subset ? o->n_subset : t->n;

  if (o->k < 1) return eldr_diag_fail(d, ELDR_EINVAL, "decoders (k) must be >= 1");
  if (!(o->tau >= 0.0 && o->tau <= 2.0))
    return eldr_diag_fail(d, ELDR_ERANGE, "tau %g out of range [0, 2]", o->tau);
  if (o->repr > ELDR_REPR_LOGIT) return eldr_diag_fail(d, ELDR_EINVAL, "unknown representation");
  if (o->layers == ELDR_FIT_LAYERS_LIST && !o->layer_list_mask)
    return eldr_diag_fail(d, ELDR_EINVAL, "layer list missing");

  uint32_t *pre = NULL, *dec = NULL;
  float *gates = NULL, *decpat = NULL, *idf = NULL, *sigs = NULL;
  size_t *idx = NULL, *sizes = NULL;
  int *labels = NULL;
  eldr_artifact *a = NULL;

  /* 1. requests with prefill selections */
  idx = malloc((n_all ? n_all : 1) * sizeof *idx);
  if (!idx) { rc = ELDR_ENOMEM; goto fail; }
  size_t n = 0;
  int have_gates = 1;
  for (size_t i = 0; i < n_all; i++) {
    size_t ri = o->subset ? o->subset[i] : i;
    if (ri >= t->n) { rc = eldr_diag_fail(d, ELDR_ERANGE, "subset index %zu >= %zu requests", ri, t->n); goto fail; }
    if (t->req[ri].n_prefill == 0) { report->skipped_empty++; continue; }
    if (!t->req[ri].prefill_gates) have_gates = 0;
    idx[n++] = ri;
  }
  if (n < 2 || n < o->k) {
    rc = eldr_diag_fail(d, ELDR_EEMPTY,
                        "%zu usable requests (with prefill selections) for %zu decoders: need at least max(2, k)",
                        n, o->k);
    goto fail;
  }
  if ((o->repr == ELDR_REPR_GATE || o->repr == ELDR_REPR_LOGIT) && !have_gates) {
    rc = eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                        "representation '%s' needs prefill_gates on every request of the trace",
                        eldr_repr_name((eldr_repr)o->repr));
    goto fail;
  }

  pre = calloc(n * LE, sizeof *pre);
  dec = calloc(n * LE, sizeof *dec);
  decpat = calloc(n * LE, sizeof *decpat);
  idf = calloc(LE, sizeof *idf);
  if (have_gates) gates = calloc(n * LE, sizeof *gates);
  if (!pre || !dec || !decpat || !idf || (have_gates && !gates)) { rc = ELDR_ENOMEM; goto fail; }
  for (size_t i = 0; i < n; i++) {
    const eldr_request *r = &t->req[idx[i]];
    eldr_trace_request_counts(t, r, 0, pre + i * LE);
    eldr_trace_request_counts(t, r, 1, dec + i * LE);
    if (gates) request_gate_sums(t, r, gates + i * LE);
  }
  eldr_quality_decode_patterns(s, dec, n, decpat);
  eldr_idf_compute(s, pre, n, idf);
  report->n = n;

  /* 2. candidates */
  eldr_repr reprs[4];
  size_t n_repr = 0;
  if (o->repr >= 0) {
    reprs[n_repr++] = (eldr_repr)o->repr;
  } else {
    reprs[n_repr++] = ELDR_REPR_COUNT;
    reprs[n_repr++] = ELDR_REPR_BINARY;
    if (have_gates) {
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
  if (!report->cand) { rc = ELDR_ENOMEM; goto fail; }
  eldr_pairs_opts po = {.max_pairs = o->max_pairs, .seed = o->seed ^ 0x5eedf17ULL};
  uint8_t *masks = calloc(n_repr * n_idf * L, 1);
  if (!masks) { rc = ELDR_ENOMEM; goto fail; }
  double t0 = eldr_clock_now();
  for (size_t ri = 0; ri < n_repr; ri++) {
    for (size_t ii = 0; ii < n_idf; ii++) {
      eldr_fit_candidate *cd = &report->cand[report->n_cand];
      cd->repr = reprs[ri];
      cd->idf = idfs[ii];
      cd->steps = calloc(L, sizeof *cd->steps);
      if (!cd->steps) { free(masks); rc = ELDR_ENOMEM; goto fail; }
      report->n_cand++;
    }
  }
  /* the candidates are independent: score them on up to 2 threads */
  rho_jobs rj = {.s = s, .idf = idf, .pre = pre, .gates = gates, .decpat = decpat, .n = n,
                 .po = &po, .cand = report->cand, .n_cand = report->n_cand, .masks = masks,
                 .o = o};
  rc = score_candidates(&rj);
  if (rc) {
    free(masks);
    const eldr_fit_candidate *cd = &report->cand[rj.failed];
    eldr_diag_fail(d, rc, "rho of %s%s: %s", eldr_repr_name(cd->repr), cd->idf ? "-idf" : "",
                   eldr_strerror(rc));
    goto fail;
  }
  for (size_t c = 0; c < report->n_cand; c++) {
    eldr_fit_candidate *cd = &report->cand[c];
    uint8_t *m = masks + c * L;
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

  /* rho of the mask the fit will actually use (all / list) */
  /* without any defined rho: the count representation, IDF as allowed */
  size_t best = 0;
  for (size_t c = 0; c < report->n_cand; c++)
    if (report->cand[c].repr == ELDR_REPR_COUNT && report->cand[c].idf) best = c;
  double best_rho = -2.0;
  for (size_t c = 0; c < report->n_cand; c++) {
    eldr_fit_candidate *cd = &report->cand[c];
    double r = o->layers == ELDR_FIT_LAYERS_ALL ? cd->rho_all : cd->rho_mask;
    if (o->layers == ELDR_FIT_LAYERS_LIST) {
      /* measured below for the chosen candidate only; rank by all-layer rho */
      r = cd->rho_all;
    }
    if (isfinite(r) && r > best_rho + 1e-12) {
      best_rho = r;
      best = c;
    }
  }
  report->chosen = best;
  const eldr_fit_candidate *ch = &report->cand[best];

  /* 3. artifact + signatures under the chosen spec */
  a = eldr_artifact_new(t->model, s, t->layer_ids, ch->repr, ch->idf, masks + best * L, o->k);
  free(masks);
  if (!a) { rc = eldr_diag_fail(d, ELDR_ENOMEM, "cannot allocate the artifact"); goto fail; }
  if (ch->idf) memcpy(a->idf, idf, LE * sizeof *idf);
  a->tau = o->tau;
  eldr_sigspec spec;
  eldr_artifact_sigspec(a, &spec);
  const size_t dim = a->dim;
  sigs = calloc(n * dim, sizeof *sigs);
  if (!sigs) { rc = ELDR_ENOMEM; goto fail; }
  for (size_t i = 0; i < n; i++) {
    int b = eldr_signature_build(&spec, pre + i * LE, gates ? gates + i * LE : NULL, sigs + i * dim);
    if (b && b != ELDR_EEMPTY) { rc = eldr_diag_fail(d, b, "signature of request %zu: %s", idx[i], eldr_strerror(b)); goto fail; }
  }
  if (o->layers == ELDR_FIT_LAYERS_LIST) {
    double r = 0;
    const size_t ddim = LE;
    int q = eldr_quality_rho(sigs, dim, decpat, ddim, n, &po, &r);
    if (q == ELDR_OK) report->cand[best].rho_mask = r;
  }
  a->fit_rho = o->layers == ELDR_FIT_LAYERS_ALL ? ch->rho_all : report->cand[best].rho_mask;

  /* 4. K-means */
  labels = calloc(n, sizeof *labels);
  sizes = calloc(o->k, sizeof *sizes);
  if (!labels || !sizes) { rc = ELDR_ENOMEM; goto fail; }
  eldr_kmeans_opts ko = {.k = o->k, .balanced = o->balanced, .restarts = o->restarts,
                         .max_iter = o->max_iter, .seed = o->seed};
  eldr_kmeans_result kr;
  progress(o, "kmeans", 0, 1);
  t0 = eldr_clock_now();
  rc = eldr_kmeans_fit(sigs, n, dim, &ko, a->centroids, labels, sizes, &kr);
  report->seconds_kmeans = eldr_clock_now() - t0;
  progress(o, "kmeans", 1, 1);
  if (rc) { eldr_diag_fail(d, rc, "K-means: %s", eldr_strerror(rc)); goto fail; }
  report->kmeans_objective = kr.objective;
  report->capacity = (n + o->k - 1) / o->k;
  for (size_t c = 0; c < o->k; c++) a->cluster_sizes[c] = sizes[c];
  /* the fit-time signature distribution a router's drift score compares with */
  rc = eldr_drift_ref_compute(a->centroids, a->k, dim, sigs, n, &a->drift_ref);
  if (rc == ELDR_EEMPTY) rc = 0;
  if (rc) { eldr_diag_fail(d, rc, "drift reference: %s", eldr_strerror(rc)); goto fail; }
  a->fit_n = n;
  a->fit_seed = o->seed;
  a->fit_balanced = o->balanced;
  if (t->generator) {
    size_t gl = strlen(t->generator) + 1;
    if (!(a->trace_generator = malloc(gl))) {
      rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
      goto fail;
    }
    memcpy(a->trace_generator, t->generator, gl);
  }

  rc = eldr_artifact_validate(a, d);
  if (rc) { eldr_diag_prefix(d, "fitted artifact invalid"); goto fail; }

  *out = a;
  a = NULL;

fail:
  eldr_artifact_free(a);
  free(labels);
  free(sizes);
  free(sigs);
  free(gates);
  free(idf);
  free(decpat);
  free(dec);
  free(pre);
  free(idx);
  if (rc) {
    eldr_fit_report_free(report);
    if (rc == ELDR_ENOMEM && d && !d->msg[0]) eldr_diag_fail(d, rc, "out of memory");
  }
  return rc;
}
