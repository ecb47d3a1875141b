/* tracestats.c — trace statistics (see eldr/tracestats.h). */
#include "eldr/tracestats.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/batch_union.h"
#include "eldr/counts.h"
#include "eldr/quantile.h"
#include "eldr/rng.h"

static const size_t k_default_sizes[] = {8, 16, 32, 64};

const char *eldr_tracestats_rule_name(int rule) {
  switch (rule) {
  case ELDR_BATCH_RANDOM: return "random";
  case ELDR_BATCH_DOMAIN: return "domain";
  case ELDR_BATCH_CLUSTER: return "cluster";
  }
  return "?";
}

void eldr_tracestats_opts_default(eldr_tracestats_opts *o) {
  memset(o, 0, sizeof *o);
  o->batch_sizes = k_default_sizes;
  o->n_batch_sizes = 4;
  o->batches = 64;
}

double eldr_tracestats_pearson(const uint32_t *a, const uint32_t *b, size_t n) {
  if (n < 2) return NAN;
  double sa = 0, sb = 0;
  for (size_t i = 0; i < n; i++) {
    sa += a[i];
    sb += b[i];
  }
  double ma = sa / (double)n, mb = sb / (double)n;
  double saa = 0, sbb = 0, sab = 0;
  for (size_t i = 0; i < n; i++) {
    double x = a[i] - ma, y = b[i] - mb;
    saa += x * x;
    sbb += y * y;
    sab += x * y;
  }
  if (saa <= 0 || sbb <= 0) return NAN;
  return sab / sqrt(saa * sbb);
}

static int cmp_desc(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a < b) - (a > b);
}

double eldr_tracestats_top_share(const double *counts, size_t n, double frac) {
  if (n == 0) return NAN;
  double *v = malloc(n * sizeof *v);
  if (!v) return NAN;
  memcpy(v, counts, n * sizeof *v);
  qsort(v, n, sizeof *v, cmp_desc);
  size_t top = (size_t)ceil(frac * (double)n - 1e-9);
  if (top < 1) top = 1;
  if (top > n) top = n;
  double s = 0, st = 0;
  for (size_t i = 0; i < n; i++) {
    s += v[i];
    if (i < top) st += v[i];
  }
  free(v);
  return s > 0 ? st / s : NAN;
}

/* Mean over layers of the top-10% share of an L*E matrix. */
static double layer_top10(const double *m, size_t L, size_t E) {
  double acc = 0;
  size_t n = 0;
  for (size_t l = 0; l < L; l++) {
    double s = eldr_tracestats_top_share(m + l * E, E, 0.1);
    if (!isnan(s)) {
      acc += s;
      n++;
    }
  }
  return n ? acc / (double)n : NAN;
}

/* Sort v[0..n) (n > 0) and take its mean, median, p10 and p90. */
static void summarize(double *v, size_t n, double *mean, double *median, double *p10,
                      double *p90) {
  qsort(v, n, sizeof *v, eldr_cmp_double);
  double s = 0;
  for (size_t i = 0; i < n; i++) s += v[i];
  *mean = s / (double)n;
  *median = eldr_quantile_sorted(v, n, 0.5);
  *p10 = eldr_quantile_sorted(v, n, 0.1);
  *p90 = eldr_quantile_sorted(v, n, 0.9);
}

static void lens_summary(double *v, size_t n, eldr_tracestats_lens *out) {
  memset(out, 0, sizeof *out);
  if (n == 0) {
    out->mean = out->median = out->p10 = out->p90 = NAN;
    return;
  }
  summarize(v, n, &out->mean, &out->median, &out->p10, &out->p90);
  out->min = (uint32_t)v[0];
  out->max = (uint32_t)v[n - 1];
}

/* Batch sampler state shared by the rules. */
typedef struct batcher {
  const eldr_trace *t;
  eldr_union *un; /* the step's per-layer expert union */
  size_t steps;   /* decode steps per batch */
  size_t *cur;    /* per slot: request index (SIZE_MAX = idle) */
  uint32_t *pos;  /* per slot: next decode token */
  double sum;     /* distinct counts summed over (step, layer) */
  double samples; /* (step, layer) samples */
} batcher;

/* Decode tokens with per-token rows (0 for a counts-form request: it has
 * counts, not the per-step selections batches need). */
static inline size_t row_tokens(const eldr_request *q) { return q->decode ? q->n_decode : 0; }

/* Draw the next request of a batch's pool: without replacement while the
 * pool lasts (pool[0..*used) are taken), then with replacement. Requests
 * with no decode tokens are skipped. SIZE_MAX when none qualifies. */
static size_t pool_next(const eldr_trace *t, size_t *pool, size_t n, size_t *used, eldr_rng *r) {
  for (size_t tries = 0; tries < n + 8; tries++) {
    size_t pick;
    if (*used < n) {
      size_t k = *used + (size_t)eldr_rng_below(r, n - *used);
      size_t tmp = pool[*used];
      pool[*used] = pool[k];
      pool[k] = tmp;
      pick = pool[(*used)++];
    } else {
      pick = pool[eldr_rng_below(r, n)];
    }
    if (row_tokens(&t->req[pick])) return pick;
  }
  return SIZE_MAX;
}

/* One batch of B slots over b->steps decode steps (continuous batching):
 * slot j starts with pool[j] (pool[0..B) already drawn, *used = B); a slot
 * whose request has finished takes the next request of the pool. */
static void batch_measure(batcher *b, size_t *pool, size_t n, size_t *used, size_t B,
                          eldr_rng *r) {
  const eldr_trace *t = b->t;
  const size_t L = t->shape.num_layers, K = t->shape.top_k;
  for (size_t j = 0; j < B; j++) {
    b->cur[j] = pool[j];
    b->pos[j] = 0;
  }
  for (size_t s = 0; s < b->steps; s++) {
    eldr_union_clear(b->un);
    for (size_t j = 0; j < B; j++) {
      if (b->cur[j] == SIZE_MAX) continue;
      const eldr_request *q = &t->req[b->cur[j]];
      if (b->pos[j] >= row_tokens(q)) {
        b->cur[j] = pool_next(t, pool, n, used, r);
        b->pos[j] = 0;
        if (b->cur[j] == SIZE_MAX) continue;
        q = &t->req[b->cur[j]];
      }
      eldr_union_add_token(b->un, q->decode + (size_t)b->pos[j]++ * L * K);
    }
    b->sum += (double)eldr_union_count(b->un, NULL);
    b->samples += (double)L;
  }
}

/* Group-based rule: labels[i] >= 0 groups requests. Returns drawn batches. */
static size_t run_grouped(batcher *b, const int *labels, size_t n_labels, size_t B,
                          size_t batches, eldr_rng *r, size_t **groups, const size_t *gsize) {
  const eldr_trace *t = b->t;
  size_t eligible = 0;
  for (size_t i = 0; i < t->n; i++)
    if (labels[i] >= 0 && (size_t)labels[i] < n_labels && gsize[labels[i]] >= B) eligible++;
  if (eligible == 0) return 0;
  for (size_t bi = 0; bi < batches; bi++) {
    /* anchor: the j-th eligible request */
    size_t j = (size_t)eldr_rng_below(r, eligible), anchor = 0;
    for (size_t i = 0; i < t->n; i++) {
      if (labels[i] < 0 || (size_t)labels[i] >= n_labels || gsize[labels[i]] < B) continue;
      if (j-- == 0) {
        anchor = i;
        break;
      }
    }
    size_t gi = (size_t)labels[anchor];
    size_t *g = groups[gi];
    size_t n = gsize[gi];
    /* move the anchor to the front, then draw B-1 more without replacement */
    for (size_t i = 0; i < n; i++)
      if (g[i] == anchor) {
        g[i] = g[0];
        g[0] = anchor;
        break;
      }
    size_t used = 1;
    for (size_t i = 1; i < B; i++) {
      size_t k = i + (size_t)eldr_rng_below(r, n - i);
      size_t tmp = g[i];
      g[i] = g[k];
      g[k] = tmp;
      used++;
    }
    batch_measure(b, g, n, &used, B, r);
  }
  return batches;
}

/* Build groups from labels: groups[g] = request indices with label g. */
static int build_groups(const eldr_trace *t, const int *labels, size_t n_labels, size_t ***out,
                        size_t **out_size) {
  size_t *gsize = calloc(n_labels ? n_labels : 1, sizeof *gsize);
  size_t **groups = calloc(n_labels ? n_labels : 1, sizeof *groups);
  if (!gsize || !groups) goto fail;
  for (size_t i = 0; i < t->n; i++)
    if (labels[i] >= 0 && (size_t)labels[i] < n_labels) gsize[labels[i]]++;
  for (size_t g = 0; g < n_labels; g++) {
    groups[g] = malloc((gsize[g] ? gsize[g] : 1) * sizeof **groups);
    if (!groups[g]) goto fail;
    gsize[g] = 0;
  }
  for (size_t i = 0; i < t->n; i++)
    if (labels[i] >= 0 && (size_t)labels[i] < n_labels)
      groups[labels[i]][gsize[labels[i]]++] = i;
  *out = groups;
  *out_size = gsize;
  return 0;
fail:
  if (groups)
    for (size_t g = 0; g < n_labels; g++) free(groups[g]);
  free(groups);
  free(gsize);
  return ELDR_ENOMEM;
}

static void free_groups(size_t **groups, size_t *gsize, size_t n) {
  if (groups)
    for (size_t g = 0; g < n; g++) free(groups[g]);
  free(groups);
  free(gsize);
}

void eldr_tracestats_free(eldr_tracestats *s) {
  if (!s) return;
  free(s->batch);
  free(s->domain_count);
  memset(s, 0, sizeof *s);
}

int eldr_tracestats_compute(const eldr_trace *t, const eldr_tracestats_opts *opts,
                            eldr_tracestats *out, eldr_diag *d) {
  if (!t || !out) return eldr_diag_fail(d, ELDR_EINVAL, "tracestats: argument missing");
  memset(out, 0, sizeof *out);
  if (t->n == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "tracestats: trace has no requests");
  eldr_tracestats_opts o;
  if (opts)
    o = *opts;
  else
    eldr_tracestats_opts_default(&o);
  if (!o.batch_sizes || !o.n_batch_sizes) {
    o.batch_sizes = k_default_sizes;
    o.n_batch_sizes = 4;
  }
  if (!o.batches) o.batches = 64;
  for (size_t i = 0; i < o.n_batch_sizes; i++)
    if (o.batch_sizes[i] == 0)
      return eldr_diag_fail(d, ELDR_EINVAL, "tracestats: batch size 0");

  const eldr_shape *sh = &t->shape;
  const size_t L = sh->num_layers, E = sh->num_experts, cells = L * E;
  const size_t D = t->n_domains, n = t->n;
  int rc = ELDR_ENOMEM;
  uint32_t *cp = malloc(cells * sizeof *cp), *cd = malloc(cells * sizeof *cd);
  double *corr = malloc(n * sizeof *corr);
  double *lens = malloc(n * sizeof *lens);
  double *all = calloc(cells, sizeof *all);
  double *dom = calloc((D ? D : 1) * cells, sizeof *dom);
  size_t *members = malloc(n * sizeof *members);
  int *dom_labels = malloc(n * sizeof *dom_labels);
  eldr_union un;
  if (eldr_union_init(&un, &t->shape)) un.bits = NULL;
  size_t **groups = NULL, *gsize = NULL;
  out->domain_count = calloc(D ? D : 1, sizeof *out->domain_count);
  out->batch = calloc(o.n_batch_sizes, sizeof *out->batch);
  if (!cp || !cd || !corr || !lens || !all || !dom || !members || !dom_labels || !un.bits ||
      !out->domain_count || !out->batch)
    goto done;
  out->n_requests = n;
  out->n_domains = D;
  out->n_batch = o.n_batch_sizes;

  /* (a) correlation and the popularity accumulators, one pass */
  size_t nc = 0;
  for (size_t i = 0; i < n; i++) {
    const eldr_request *r = &t->req[i];
    eldr_trace_request_counts(t, r, 0, cp);
    eldr_trace_request_counts(t, r, 1, cd); /* zeros when the decode selections are unknown */
    out->n_token_rows += row_tokens(r) > 0;
    if (r->n_prefill && r->n_decode && eldr_request_has_decode(r)) {
      double c = eldr_tracestats_pearson(cp, cd, cells);
      if (!isnan(c)) corr[nc++] = c;
    }
    double *dm = (r->domain >= 0 && (size_t)r->domain < D) ? dom + (size_t)r->domain * cells
                                                           : NULL;
    for (size_t c = 0; c < cells; c++) {
      double v = (double)cp[c] + (double)cd[c];
      all[c] += v;
      if (dm) dm[c] += v;
    }
    dom_labels[i] = (r->domain >= 0 && (size_t)r->domain < D) ? r->domain : -1;
    if (dom_labels[i] >= 0)
      out->domain_count[dom_labels[i]]++;
    else
      out->n_unlabelled++;
  }
  out->n_corr = nc;
  if (nc) {
    summarize(corr, nc, &out->corr_mean, &out->corr_median, &out->corr_p10, &out->corr_p90);
  } else {
    out->corr_mean = out->corr_median = out->corr_p10 = out->corr_p90 = NAN;
  }

  /* (c) popularity skew, domain mix, lengths */
  out->top10_share = layer_top10(all, L, E);
  {
    double acc = 0;
    size_t k = 0;
    for (size_t g = 0; g < D; g++) {
      double s = layer_top10(dom + g * cells, L, E);
      if (!isnan(s)) {
        acc += s;
        k++;
      }
    }
    out->top10_share_domain = k ? acc / (double)k : NAN;
  }
  {
    double *sh_v = malloc((D ? D : 1) * sizeof *sh_v);
    if (!sh_v) goto done;
    size_t labelled = n - out->n_unlabelled, present = 0;
    size_t mx = 0, mn = (size_t)-1;
    for (size_t g = 0; g < D; g++) {
      sh_v[g] = labelled ? (double)out->domain_count[g] / (double)labelled : 0;
      if (out->domain_count[g]) {
        present++;
        if (out->domain_count[g] > mx) mx = out->domain_count[g];
        if (out->domain_count[g] < mn) mn = out->domain_count[g];
      }
    }
    qsort(sh_v, D, sizeof *sh_v, cmp_desc);
    out->domain_top2 = labelled ? 0 : NAN;
    out->domain_top4 = labelled ? 0 : NAN;
    for (size_t g = 0; g < D && labelled; g++) {
      if (g < 2) out->domain_top2 += sh_v[g];
      if (g < 4) out->domain_top4 += sh_v[g];
    }
    out->domain_skew = present ? (double)mx / (double)mn : NAN;
    free(sh_v);
  }
  for (size_t i = 0; i < n; i++) lens[i] = t->req[i].n_prefill;
  lens_summary(lens, n, &out->prompt);
  for (size_t i = 0; i < n; i++) lens[i] = t->req[i].n_decode;
  lens_summary(lens, n, &out->output);

  /* (b) batches */
  size_t n_clusters = 0;
  if (o.cluster) {
    for (size_t i = 0; i < n; i++)
      if (o.cluster[i] >= 0 && (size_t)o.cluster[i] + 1 > n_clusters)
        n_clusters = (size_t)o.cluster[i] + 1;
  }
  out->n_clusters = n_clusters;
  size_t max_b = 1;
  for (size_t bi = 0; bi < o.n_batch_sizes; bi++)
    if (o.batch_sizes[bi] > max_b) max_b = o.batch_sizes[bi];
  batcher b = {.t = t, .un = &un, .steps = o.steps};
  if (!b.steps) b.steps = (size_t)llround(out->output.median);
  if (!b.steps) b.steps = 1;
  out->steps = b.steps;
  b.cur = malloc(max_b * sizeof *b.cur);
  b.pos = malloc(max_b * sizeof *b.pos);
  if (!b.cur || !b.pos) {
    free(b.cur);
    free(b.pos);
    goto done;
  }
  for (size_t bi = 0; bi < o.n_batch_sizes; bi++) {
    eldr_tracestats_batch *eb = &out->batch[bi];
    const size_t B = o.batch_sizes[bi];
    eb->size = B;
    for (int rule = 0; rule < ELDR_BATCH__COUNT; rule++) {
      eb->distinct[rule] = NAN;
      eb->reduction[rule] = NAN;
      if (!out->n_token_rows) continue; /* counts form only: no per-step selections */
      uint64_t st = o.seed ^ ((uint64_t)B * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)(rule + 1) << 56);
      eldr_rng r;
      eldr_rng_seed(&r, eldr_splitmix64(&st));
      b.sum = b.samples = 0;
      size_t drawn = 0;
      if (rule == ELDR_BATCH_RANDOM) {
        if (B > n) continue;
        for (size_t i = 0; i < n; i++) members[i] = i;
        for (size_t k = 0; k < o.batches; k++) {
          for (size_t i = 0; i < B; i++) {
            size_t j = i + (size_t)eldr_rng_below(&r, n - i);
            size_t tmp = members[i];
            members[i] = members[j];
            members[j] = tmp;
          }
          size_t used = B;
          batch_measure(&b, members, n, &used, B, &r);
        }
        drawn = o.batches;
      } else {
        const int *labels = rule == ELDR_BATCH_DOMAIN ? dom_labels : o.cluster;
        size_t nl = rule == ELDR_BATCH_DOMAIN ? D : n_clusters;
        if (!labels || !nl) continue;
        if (build_groups(t, labels, nl, &groups, &gsize)) {
          free(b.cur);
          free(b.pos);
          goto done;
        }
        drawn = run_grouped(&b, labels, nl, B, o.batches, &r, groups, gsize);
        free_groups(groups, gsize, nl);
        groups = NULL;
        gsize = NULL;
      }
      eb->drawn[rule] = drawn;
      if (drawn && b.samples > 0) eb->distinct[rule] = b.sum / b.samples;
    }
    for (int rule = 0; rule < ELDR_BATCH__COUNT; rule++)
      if (!isnan(eb->distinct[rule]) && !isnan(eb->distinct[0]) && eb->distinct[0] > 0)
        eb->reduction[rule] = 1.0 - eb->distinct[rule] / eb->distinct[0];
  }
  free(b.cur);
  free(b.pos);
  rc = ELDR_OK;
done:
  eldr_union_free(&un);
  free(dom_labels);
  free(members);
  free(dom);
  free(all);
  free(lens);
  free(corr);
  free(cd);
  free(cp);
  if (rc) {
    eldr_tracestats_free(out);
    return eldr_diag_fail(d, rc, "tracestats: out of memory");
  }
  return rc;
}

/* ------------------------------------------------------------------------ */

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *lens_json(const eldr_tracestats_lens *l) {
  return json_pack("{s:o,s:o,s:o,s:o,s:I,s:I}", "mean", num_or_null(l->mean), "median",
                   num_or_null(l->median), "p10", num_or_null(l->p10), "p90",
                   num_or_null(l->p90), "min", (json_int_t)l->min, "max", (json_int_t)l->max);
}

char *eldr_tracestats_json(const eldr_tracestats *s, const eldr_trace *t) {
  json_t *root = json_object();
  if (!root) return NULL;
  json_object_set_new(root, "requests", json_integer((json_int_t)s->n_requests));
  if (t) {
    json_object_set_new(root, "model", json_string(t->model ? t->model : ""));
    json_object_set_new(root, "num_layers", json_integer(t->shape.num_layers));
    json_object_set_new(root, "num_experts", json_integer(t->shape.num_experts));
    json_object_set_new(root, "top_k", json_integer(t->shape.top_k));
  }
  json_object_set_new(
      root, "correlation",
      json_pack("{s:I,s:o,s:o,s:o,s:o}", "n", (json_int_t)s->n_corr, "median",
                num_or_null(s->corr_median), "mean", num_or_null(s->corr_mean), "p10",
                num_or_null(s->corr_p10), "p90", num_or_null(s->corr_p90)));
  json_t *batches = json_array();
  for (size_t i = 0; i < s->n_batch; i++) {
    const eldr_tracestats_batch *b = &s->batch[i];
    json_t *o = json_object();
    json_object_set_new(o, "size", json_integer((json_int_t)b->size));
    for (int r = 0; r < ELDR_BATCH__COUNT; r++) {
      json_object_set_new(o, eldr_tracestats_rule_name(r),
                          json_pack("{s:o,s:o,s:I}", "distinct", num_or_null(b->distinct[r]),
                                    "reduction", num_or_null(b->reduction[r]), "batches",
                                    (json_int_t)b->drawn[r]));
    }
    json_array_append_new(batches, o);
  }
  json_object_set_new(root, "batches", batches);
  json_object_set_new(root, "clusters", json_integer((json_int_t)s->n_clusters));
  json_object_set_new(root, "steps", json_integer((json_int_t)s->steps));
  json_object_set_new(root, "token_row_requests", json_integer((json_int_t)s->n_token_rows));
  json_t *mix = json_array();
  size_t labelled = s->n_requests - s->n_unlabelled;
  for (size_t g = 0; g < s->n_domains; g++) {
    json_array_append_new(
        mix, json_pack("{s:s,s:I,s:o}", "domain",
                       (t && g < t->n_domains && t->domains[g]) ? t->domains[g] : "?", "requests",
                       (json_int_t)s->domain_count[g], "share",
                       num_or_null(labelled ? (double)s->domain_count[g] / (double)labelled
                                            : NAN)));
  }
  json_object_set_new(root, "domains",
                      json_pack("{s:o,s:I,s:o,s:o,s:o}", "mix", mix, "unlabelled",
                                (json_int_t)s->n_unlabelled, "top2_share",
                                num_or_null(s->domain_top2), "top4_share",
                                num_or_null(s->domain_top4), "skew_max_min",
                                num_or_null(s->domain_skew)));
  json_object_set_new(root, "prompt_tokens", lens_json(&s->prompt));
  json_object_set_new(root, "output_tokens", lens_json(&s->output));
  json_object_set_new(root, "popularity",
                      json_pack("{s:o,s:o}", "top10_share", num_or_null(s->top10_share),
                                "top10_share_per_domain", num_or_null(s->top10_share_domain)));
  char *txt = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
  json_decref(root);
  return txt;
}

/* ------------------------------------------------------------------------ */

int eldr_tracestats_domain_counts_skew(const char *json, size_t len, const char *key,
                                       char *model_out, size_t model_cap, char (*names)[48],
                                       double *shares, size_t cap, size_t *n_out,
                                       double *mean_domain, double *overall, eldr_diag *d) {
  if (!json) return eldr_diag_fail(d, ELDR_EINVAL, "counts: text missing");
  json_error_t jerr;
  json_t *root = json_loadb(json, len, 0, &jerr);
  if (!root) return eldr_diag_fail(d, ELDR_EPARSE, "counts: line %d: %s", jerr.line, jerr.text);
  int rc = ELDR_OK;
  double *sum = NULL, *row = NULL;
  json_t *entry = NULL;
  if (!json_is_object(root)) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "counts: top level must be an object");
    goto out;
  }
  if (key) {
    entry = json_object_get(root, key);
    if (!entry) {
      rc = eldr_diag_fail(d, ELDR_ENOTFOUND, "counts: no entry '%s'", key);
      goto out;
    }
  } else {
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
      if (!entry) entry = v;
      json_t *tk = json_is_object(v) ? json_object_get(v, "top_k") : NULL;
      if (tk && json_is_integer(tk) && json_integer_value(tk) == 8) {
        entry = v;
        break;
      }
    }
    if (!entry) {
      rc = eldr_diag_fail(d, ELDR_EEMPTY, "counts: no entries");
      goto out;
    }
  }
  if (!json_is_object(entry)) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "counts: entry must be an object");
    goto out;
  }
  json_t *je = json_object_get(entry, "num_experts");
  json_t *doms = json_object_get(entry, "domains");
  json_t *jm = json_object_get(entry, "model");
  if (!je || !json_is_integer(je) || json_integer_value(je) < 1 ||
      json_integer_value(je) > ELDR_MAX_EXPERTS) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "counts: field 'num_experts' missing or out of range");
    goto out;
  }
  if (!doms || !json_is_object(doms) || json_object_size(doms) == 0) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "counts: field 'domains' must be a non-empty object");
    goto out;
  }
  if (model_out && model_cap)
    snprintf(model_out, model_cap, "%s", jm && json_is_string(jm) ? json_string_value(jm) : "?");
  const size_t E = (size_t)json_integer_value(je);
  size_t L = 0;
  const char *dn;
  json_t *dv;
  json_object_foreach(doms, dn, dv) {
    if (!json_is_array(dv) || json_array_size(dv) == 0 || json_array_size(dv) > ELDR_MAX_LAYERS) {
      rc = eldr_diag_fail(d, ELDR_EPARSE, "counts: domain '%s' must be a non-empty array of layers",
                          dn);
      goto out;
    }
    if (L == 0) L = json_array_size(dv);
    if (json_array_size(dv) != L) {
      rc = eldr_diag_fail(d, ELDR_ESHAPE, "counts: domain '%s' has %zu layers, expected %zu", dn,
                          json_array_size(dv), L);
      goto out;
    }
  }
  sum = calloc(L * E, sizeof *sum);
  row = malloc(E * sizeof *row);
  if (!sum || !row) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "counts: out of memory");
    goto out;
  }
  size_t nd = 0;
  double acc = 0;
  json_object_foreach(doms, dn, dv) {
    double dom_acc = 0;
    size_t dom_n = 0;
    for (size_t l = 0; l < L; l++) {
      json_t *lr = json_array_get(dv, l);
      if (!json_is_array(lr) || json_array_size(lr) != E) {
        rc = eldr_diag_fail(d, ELDR_ESHAPE, "counts: domain '%s' layer %zu must have %zu counts",
                            dn, l, E);
        goto out;
      }
      for (size_t e = 0; e < E; e++) {
        json_t *c = json_array_get(lr, e);
        if (!json_is_number(c) || json_number_value(c) < 0 || !isfinite(json_number_value(c))) {
          rc = eldr_diag_fail(d, ELDR_EPARSE,
                              "counts: domain '%s' layer %zu expert %zu: not a count >= 0", dn,
                              l, e);
          goto out;
        }
        row[e] = json_number_value(c);
        sum[l * E + e] += row[e];
      }
      double s = eldr_tracestats_top_share(row, E, 0.1);
      if (!isnan(s)) {
        dom_acc += s;
        dom_n++;
      }
    }
    double ds = dom_n ? dom_acc / (double)dom_n : NAN;
    if (nd < cap) {
      if (names) snprintf(names[nd], 48, "%s", dn);
      if (shares) shares[nd] = ds;
    }
    if (!isnan(ds)) acc += ds;
    nd++;
  }
  if (n_out) *n_out = nd;
  if (mean_domain) *mean_domain = nd ? acc / (double)nd : NAN;
  if (overall) *overall = layer_top10(sum, L, E);
out:
  free(row);
  free(sum);
  json_decref(root);
  return rc;
}
