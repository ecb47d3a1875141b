/* bench_signature — signature build (router hot path) and greedy layer-mask
 * selection (offline), on synthetic data, with a baseline in the same run:
 *   build:  eldr_signature_build vs a plain double-precision reference loop
 *   greedy: eldr_quality_greedy_mask vs the slow path (build every
 *           signature + eldr_quality_rho) timed on a few masks and scaled to
 *           the L(L+1)/2 masks greedy evaluates.
 * Usage: bench_signature [--quick] [--trace T.jsonl]
 *   --quick: skip the n=10000 case; --trace: also time the greedy search on a
 *   real trace (all pairs), e.g. ../shared/traces/llama4-mmlu-dev.jsonl.
 * Times are thread CPU time (see now_s).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eldr/quality.h"
#include "eldr/rng.h"
#include "eldr/signature.h"
#include "eldr/trace.h"

/* Thread CPU time: all of this is single-threaded, and on a shared machine
 * CPU time is far steadier than wall time (it excludes time descheduled). */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "bench_signature: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

/* Synthetic requests: D domains, each with 16 preferred experts per layer;
 * a token picks from its domain's set with probability p_l (layer-dependent:
 * a few informative layers, the rest weak), else uniformly. */
typedef struct synth {
  eldr_shape s;
  size_t n;
  uint32_t *pre, *dec_counts;
  float *dec;
} synth;

static void pick(eldr_rng *r, uint32_t E, uint32_t K, const uint16_t *pref, double p, uint32_t *row) {
  for (uint32_t k = 0; k < K; k++) {
    uint32_t e = eldr_rng_uniform(r) < p ? pref[eldr_rng_below(r, 16)] : (uint32_t)eldr_rng_below(r, E);
    row[e]++;
  }
}

static void synth_make(synth *sy, size_t n, uint32_t L, uint32_t E, uint32_t K, int tp, int td,
                       uint64_t seed) {
  enum { D = 8 };
  sy->s = (eldr_shape){L, E, K};
  sy->n = n;
  const size_t cells = (size_t)L * E;
  sy->pre = calloc(n * cells, sizeof *sy->pre);
  sy->dec_counts = calloc(n * cells, sizeof *sy->dec_counts);
  sy->dec = xmalloc(n * cells * sizeof *sy->dec);
  if (!sy->pre || !sy->dec_counts) {
    fprintf(stderr, "bench_signature: out of memory\n");
    exit(1);
  }
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  uint16_t *pref = xmalloc((size_t)D * L * 16 * sizeof *pref);
  for (size_t x = 0; x < (size_t)D * L * 16; x++) pref[x] = (uint16_t)eldr_rng_below(&r, E);
  double *p = xmalloc(L * sizeof *p);
  for (uint32_t l = 0; l < L; l++) p[l] = (l % 7 == 3) ? 0.7 : 0.1 + 0.2 * eldr_rng_uniform(&r);
  for (size_t i = 0; i < n; i++) {
    const size_t d = eldr_rng_below(&r, D);
    const int np = 1 + (int)eldr_rng_below(&r, (uint64_t)(2 * tp));
    for (uint32_t l = 0; l < L; l++) {
      const uint16_t *pf = pref + (d * L + l) * 16;
      for (int t = 0; t < np; t++) pick(&r, E, K, pf, p[l], sy->pre + i * cells + (size_t)l * E);
      for (int t = 0; t < td; t++) pick(&r, E, K, pf, 0.6, sy->dec_counts + i * cells + (size_t)l * E);
    }
  }
  eldr_quality_decode_patterns(&sy->s, sy->dec_counts, n, sy->dec);
  free(p);
  free(pref);
}

static void synth_free(synth *sy) {
  free(sy->pre);
  free(sy->dec_counts);
  free(sy->dec);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Plain reference: double arithmetic, one pass per step. */
static int ref_build(const eldr_sigspec *sp, const uint32_t *c, float *out) {
  const size_t L = sp->shape.num_layers, E = sp->shape.num_experts;
  size_t k = 0;
  double ss = 0;
  for (size_t l = 0; l < L; l++) {
    if (sp->mask && !sp->mask[l]) continue;
    for (size_t e = 0; e < E; e++, k++) {
      double v = sp->repr == ELDR_REPR_BINARY ? (c[l * E + e] > 0) : (double)c[l * E + e];
      if (sp->idf) v *= sp->idf[l * E + e];
      out[k] = (float)v;
      ss += v * v;
    }
  }
  if (ss == 0) return ELDR_EEMPTY;
  const double inv = 1.0 / sqrt(ss);
  for (size_t x = 0; x < k; x++) out[x] = (float)(out[x] * inv);
  return 0;
}

static void bench_build(void) {
  enum { L = 48, E = 128, NREQ = 64, ITERS = 200000, BLOCKS = 40 };
  synth sy;
  synth_make(&sy, NREQ, L, E, 8, 128, 1, 1);
  float *idf = xmalloc((size_t)L * E * sizeof *idf);
  eldr_idf_compute(&sy.s, sy.pre, NREQ, idf);
  float *out = xmalloc((size_t)L * E * sizeof *out);
  uint8_t half[L];
  for (int l = 0; l < L; l++) half[l] = (uint8_t)(l % 2);
  struct {
    const char *name;
    eldr_sigspec sp;
  } cases[] = {
      {"count+IDF, all 48 layers", {sy.s, ELDR_REPR_COUNT, idf, NULL}},
      {"binary+IDF, all 48 layers", {sy.s, ELDR_REPR_BINARY, idf, NULL}},
      {"count, no IDF, all layers", {sy.s, ELDR_REPR_COUNT, NULL, NULL}},
      {"count+IDF, 24-layer mask", {sy.s, ELDR_REPR_COUNT, idf, half}},
  };
  printf("signature build, L=%d E=%d (%d floats); best (median) of %d blocks of %d builds, "
         "per build:\n",
         L, E, L * E, BLOCKS, ITERS / BLOCKS);
  volatile float sink = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double best[2] = {1e9, 1e9}, med[2];
    double blk[2][BLOCKS];
    for (int b = 0; b < BLOCKS; b++)
      for (int pass = 0; pass < 2; pass++) {
        const double t0 = now_s();
        for (int it = 0; it < ITERS / BLOCKS; it++) {
          const uint32_t *cnt = sy.pre + (size_t)(it % NREQ) * L * E;
          if (pass == 0)
            (void)eldr_signature_build(&cases[c].sp, cnt, NULL, out);
          else
            (void)ref_build(&cases[c].sp, cnt, out);
          sink += out[it % 64];
        }
        blk[pass][b] = (now_s() - t0) / (ITERS / BLOCKS);
        if (blk[pass][b] < best[pass]) best[pass] = blk[pass][b];
      }
    for (int pass = 0; pass < 2; pass++) {
      qsort(blk[pass], BLOCKS, sizeof blk[pass][0], cmp_double);
      med[pass] = blk[pass][BLOCKS / 2];
    }
    printf("  %-27s %6.3f (%6.3f) us   reference loop %6.3f (%6.3f) us   ratio %.2fx\n",
           cases[c].name, best[0] * 1e6, med[0] * 1e6, best[1] * 1e6, med[1] * 1e6,
           best[1] / best[0]);
  }
  (void)sink;
  free(out);
  free(idf);
  synth_free(&sy);
}

static void bench_greedy(size_t n, uint32_t L, uint32_t K, int tp, int td, size_t max_pairs,
                         int slow_masks) {
  const uint32_t E = 128;
  synth sy;
  double t0 = now_s();
  synth_make(&sy, n, L, E, K, tp, td, 7);
  const double t_gen = now_s() - t0;
  const size_t cells = (size_t)L * E;
  float *idf = xmalloc(cells * sizeof *idf);
  eldr_idf_compute(&sy.s, sy.pre, n, idf);
  eldr_pairs_opts po = {max_pairs, 1};
  const size_t T = n * (n - 1) / 2, P = (max_pairs == 0 || T <= max_pairs) ? T : max_pairs;
  eldr_mask_step *steps = xmalloc(L * sizeof *steps);
  uint8_t *best = xmalloc(L);
  double best_rho = 0, all_rho = 0;
  t0 = now_s();
  int rc = eldr_quality_greedy_mask(&sy.s, ELDR_REPR_COUNT, idf, sy.pre, NULL, sy.dec, cells, n,
                                    &po, steps, best, &best_rho, &all_rho);
  const double t_greedy = now_s() - t0;
  if (rc) {
    fprintf(stderr, "greedy failed: %s\n", eldr_strerror(rc));
    exit(1);
  }
  size_t nbest = 0;
  for (uint32_t l = 0; l < L; l++) nbest += best[l];
  printf("greedy mask, n=%zu L=%u E=%u top-%u, %zu pairs (count+IDF): %.3f s "
         "(%u masks; data generation %.1f s)\n",
         n, L, E, K, P, t_greedy, L * (L + 1) / 2, t_gen);
  printf("  rho: first layer %d -> %.4f, best %zu layers -> %.4f, all layers %.4f\n",
         steps[0].layer, steps[0].rho, nbest, best_rho, all_rho);

  /* Slow path on the first `slow_masks` prefixes of the greedy order. */
  float *sigs = xmalloc(n * cells * sizeof *sigs);
  uint8_t *mask = calloc(L, 1);
  double t_slow = 0, max_diff = 0;
  for (int k = 0; k < slow_masks && k < (int)L; k++) {
    mask[steps[k].layer] = 1;
    eldr_sigspec sp = {sy.s, ELDR_REPR_COUNT, idf, mask};
    const size_t dim = eldr_signature_dim(&sp);
    t0 = now_s();
    for (size_t i = 0; i < n; i++)
      (void)eldr_signature_build(&sp, sy.pre + i * cells, NULL, sigs + i * dim);
    double rho = 0;
    rc = eldr_quality_rho(sigs, dim, sy.dec, cells, n, &po, &rho);
    t_slow += now_s() - t0;
    if (rc == 0 && fabs(rho - steps[k].rho) > max_diff) max_diff = fabs(rho - steps[k].rho);
  }
  const double per_mask = t_slow / slow_masks;
  const double est = per_mask * L * (L + 1) / 2;
  printf("  slow path (build + eldr_quality_rho): %.1f ms per mask (mean of %d) -> %.1f s for "
         "the same search (est.), ratio %.0fx; max |rho diff| on those masks %.2g\n",
         per_mask * 1e3, slow_masks, est, est / t_greedy, max_diff);
  free(mask);
  free(sigs);
  free(best);
  free(steps);
  free(idf);
  synth_free(&sy);
}

static void bench_trace(const char *path) {
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  const int lrc = eldr_trace_load(path, &t, &d);
  if (lrc != 0) {
    fprintf(stderr, "bench_signature: %s\n", eldr_diag_msg(&d, lrc));
    exit(1);
  }
  const eldr_shape *s = &t->shape;
  const size_t n = t->n, L = s->num_layers, cells = eldr_shape_cells(s);
  uint32_t *pre = xmalloc(n * cells * sizeof *pre), *dc = xmalloc(n * cells * sizeof *dc);
  float *dec = xmalloc(n * cells * sizeof *dec), *idf = xmalloc(cells * sizeof *idf);
  eldr_mask_step *steps = xmalloc(L * sizeof *steps);
  uint8_t *best = xmalloc(L);
  for (size_t i = 0; i < n; i++) {
    eldr_trace_request_counts(t, &t->req[i], 0, pre + i * cells);
    eldr_trace_request_counts(t, &t->req[i], 1, dc + i * cells);
  }
  eldr_quality_decode_patterns(s, dc, n, dec);
  eldr_idf_compute(s, pre, n, idf);
  printf("greedy mask on %s: n=%zu L=%zu E=%u top-%u, all %zu pairs:\n", path, n, L,
         s->num_experts, s->top_k, n * (n - 1) / 2);
  for (int repr = ELDR_REPR_COUNT; repr <= ELDR_REPR_BINARY; repr++)
    for (int use_idf = 0; use_idf <= 1; use_idf++) {
      double best_rho = 0, all_rho = 0;
      const double t0 = now_s();
      const int rc = eldr_quality_greedy_mask(s, (eldr_repr)repr, use_idf ? idf : NULL, pre, NULL,
                                              dec, cells, n, NULL, steps, best, &best_rho,
                                              &all_rho);
      const double el = now_s() - t0;
      if (rc) {
        fprintf(stderr, "greedy failed: %s\n", eldr_strerror(rc));
        exit(1);
      }
      size_t nb = 0;
      for (size_t l = 0; l < L; l++) nb += best[l];
      printf("  %-10s %.3f s   rho all layers %.4f, best mask (%2zu layers) %.4f\n",
             use_idf ? (repr == ELDR_REPR_COUNT ? "count-idf" : "binary-idf")
                     : eldr_repr_name((eldr_repr)repr),
             el, all_rho, nb, best_rho);
    }
  free(best);
  free(steps);
  free(idf);
  free(dec);
  free(dc);
  free(pre);
  eldr_trace_free(t);
}

int main(int argc, char **argv) {
  int quick = 0;
  const char *trace = NULL;
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--quick") == 0) {
      quick = 1;
    } else if (strcmp(argv[a], "--trace") == 0 && a + 1 < argc) {
      trace = argv[++a];
    } else {
      fprintf(stderr, "usage: bench_signature [--quick] [--trace T.jsonl]\n");
      return 2;
    }
  }
  bench_build();
  if (trace) bench_trace(trace);
  bench_greedy(259, 24, 1, 16, 128, 0, 4);
  bench_greedy(5000, 48, 8, 32, 32, 200000, 3);
  if (!quick) bench_greedy(10000, 48, 8, 32, 32, 200000, 2);
  return 0;
}
