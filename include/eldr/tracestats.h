/* eldr/tracestats.h — statistics of an expert trace that tell whether
 * expert-locality routing can pay on it.
 *
 * (a) Prefill -> decode predictability: per request, the Pearson correlation
 *     between its prefill and its decode per-(layer, expert) count vectors
 *     (L*E entries); the median over requests that have both (requests with
 *     no prefill or no decode tokens, or a constant vector, are skipped).
 * (b) Distinct experts per layer per decode step, for decode batches of B
 *     slots under continuous batching, each batch filled by a rule:
 *       random  - requests drawn uniformly from the whole trace;
 *       domain  - an anchor request drawn uniformly among requests whose
 *                 domain has >= B labelled requests; every other request of
 *                 the batch comes from the anchor's domain;
 *       cluster - the same with cluster labels (e.g. nearest artifact
 *                 centroid) instead of domains.
 *     Requests are drawn without replacement within a batch while its pool
 *     lasts (then with replacement). At decode step s (0 <= s < steps) every
 *     slot contributes the next decode token of its request; a slot whose
 *     request has finished takes the next request drawn by the same rule
 *     (requests without decode tokens are skipped, and so are requests in
 *     the counts form: they have no per-step selections; with none left,
 *     every (b) figure is NAN and n_token_rows is 0). steps defaults to the
 *     median output length of the trace, so with equal output lengths a
 *     batch is exactly B requests decoding in lockstep. For each step and
 *     layer the number of distinct experts selected by the batch is
 *     counted; the statistic is the mean over (step, layer) samples of all
 *     drawn batches. Reduction = 1 - rule / random.
 * (c) Domain mix (counts, shares, top-2/top-4 share, max/min skew), prompt
 *     and output length summaries, and the popularity skew: per layer, the
 *     share of all selections taken by the top 10% of experts (ceil(E/10)),
 *     averaged over layers; "overall" on the whole trace and "per domain"
 *     averaged over domains.
 *
 * Ownership: eldr_tracestats owns its arrays; eldr_tracestats_free releases.
 * Deterministic for opts.seed.
 */
#ifndef ELDR_TRACESTATS_H
#define ELDR_TRACESTATS_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/trace_model.h"

enum { ELDR_BATCH_RANDOM = 0, ELDR_BATCH_DOMAIN, ELDR_BATCH_CLUSTER, ELDR_BATCH__COUNT };

/* "random", "domain", "cluster". */
const char *eldr_tracestats_rule_name(int rule);

typedef struct eldr_tracestats_opts {
  const size_t *batch_sizes; /* NULL: 8, 16, 32, 64 */
  size_t n_batch_sizes;
  size_t batches;      /* batches drawn per (size, rule); 0: 64 */
  uint64_t seed;
  const int *cluster;  /* t->n labels (>= 0, or < 0 for none), or NULL: no cluster rule */
  size_t steps;        /* decode steps per batch; 0: median output length */
} eldr_tracestats_opts;

typedef struct eldr_tracestats_lens {
  double mean, median, p10, p90;
  uint32_t min, max;
} eldr_tracestats_lens;

typedef struct eldr_tracestats_batch {
  size_t size;
  double distinct[ELDR_BATCH__COUNT];  /* NAN when the rule could not be formed */
  double reduction[ELDR_BATCH__COUNT]; /* 1 - distinct/distinct[random]; NAN when n/a */
  size_t drawn[ELDR_BATCH__COUNT];     /* batches drawn */
} eldr_tracestats_batch;

typedef struct eldr_tracestats {
  size_t n_requests;
  /* (a) */
  size_t n_corr;
  double corr_median, corr_mean, corr_p10, corr_p90; /* NAN when n_corr == 0 */
  /* (b) */
  size_t n_token_rows;          /* requests with per-token decode rows (0: (b) n/a) */
  eldr_tracestats_batch *batch; /* n_batch entries */
  size_t n_batch;
  size_t n_clusters;            /* distinct cluster labels (0 without) */
  size_t steps;                 /* decode steps per batch used */
  /* (c) */
  size_t n_domains;             /* = t->n_domains */
  size_t *domain_count;         /* n_domains entries */
  size_t n_unlabelled;
  double domain_top2, domain_top4, domain_skew; /* shares of labelled; max/min count */
  eldr_tracestats_lens prompt, output;
  double top10_share;            /* whole trace, prefill + decode */
  double top10_share_domain;     /* mean over domains with selections; NAN if none */
} eldr_tracestats;

void eldr_tracestats_opts_default(eldr_tracestats_opts *o);

/* Compute everything. Errors: ELDR_EEMPTY (no requests), ELDR_EINVAL (a
 * batch size of 0), ELDR_ENOMEM. */
int eldr_tracestats_compute(const eldr_trace *t, const eldr_tracestats_opts *o,
                            eldr_tracestats *out, eldr_diag *d);
void eldr_tracestats_free(eldr_tracestats *s);

/* Pearson correlation of two count vectors; NAN if either is constant. */
double eldr_tracestats_pearson(const uint32_t *a, const uint32_t *b, size_t n);

/* Share of sum(counts[0..n)) taken by the ceil(frac*n) largest entries
 * (NAN if the sum is 0). */
double eldr_tracestats_top_share(const double *counts, size_t n, double frac);

/* Popularity skew of a per-domain counts file such as
 * ../shared/traces/olmoe-domain-expert-counts.json:
 *   {"<model key>": {"model": str, "num_experts": E, "top_k": K,
 *    "layers": [..], "domains": {"<name>": [[E counts] per layer], ...}}, ...}
 * For the entry `key` (NULL: the first entry whose top_k is 8, else the
 * first), fills the per-domain mean over layers of the top-10% share, their
 * mean (*mean_domain), and the share of the summed counts of all domains
 * (*overall). names/shares: caller arrays of cap entries (may be NULL);
 * *n_out = domains found. model_out (optional, model_cap) gets the name. */
int eldr_tracestats_domain_counts_skew(const char *json, size_t len, const char *key,
                                       char *model_out, size_t model_cap, char (*names)[48],
                                       double *shares, size_t cap, size_t *n_out,
                                       double *mean_domain, double *overall, eldr_diag *d);

/* JSON object of the statistics (malloc'd NUL-terminated; caller frees;
 * NULL on allocation failure). domain names are taken from t. */
char *eldr_tracestats_json(const eldr_tracestats *s, const eldr_trace *t);

#endif
