/* bench_fit.c — `eldr fit` at scale: wall time, max RSS, balance and rho
 * (with its interval) for 10k, 100k, ... requests x K decoders.
 *
 * Usage: bench_fit [-k K] [--memory-mb M] [N ...]      (default: 10000 100000)
 *        bench_fit --write FILE N    N generated requests as a counts-form
 *                                    trace, to time `eldr fit` end to end
 * Each N runs in a forked child (so max RSS is that run's own), through
 * eldr_fit_stream with the default options (rho sample 4000, mini-batch
 * above 10000 requests, signature budget M MB, default 3072; a smaller M
 * forces the streamed mode that re-reads the input every pass).
 *
 * The input is a BENCH-ONLY COUNTS GENERATOR, not eldr's trace generator:
 * Qwen3-30B-A3B's shape (48 MoE layers x 128 experts, top-8) and the
 * parameters of tracegen's "realistic" workload (domains and their weights,
 * popularity, generalists, domain / request / prefill / decode sds, prompt
 * and output lengths), with its own random tables; per request and layer the
 * counts are the expected top-k selection counts T*K*softmax(logits),
 * capped at T and rounded by systematic sampling to rows summing to exactly
 * T*K (no per-token sampling: that is what makes 1M requests affordable). The generator is a source the fit reads in passes, regenerating
 * request i from (seed, i) on every pass, so the input costs no memory;
 * gen_s is the time of one bare pass, included in wall_s once per pass.
 * Columns: requests, decoders, wall_s (the whole eldr_fit_stream), cpu_s
 * (user + system of the child, the generator's bare pass included), gen_s,
 * rho_s and kmeans_s (the report's stage times), passes, mode, max_rss_mb (getrusage of the child), imbalance (largest
 * cluster / (n/k); the capacity is ceil(n/k)), rho and its 95% interval.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eldr/clock.h"
#include "eldr/fit.h"
#include "eldr/rng.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"

enum { L = 48, E = 128, K = 8, LE = L * E, NT = 1 << 16 };

typedef struct gen {
  eldr_tracegen_workload w;
  uint64_t seed;
  size_t n;
  float *explogit;     /* domains * LE: exp(domain logits) */
  double cum[ELDR_TRACEGEN_MAX_DOMAINS];
  float normal[NT];    /* a table of N(0, 1) draws, indexed by 16 random bits */
  float er[NT], ep[NT], ed[NT]; /* exp(sd * N(0,1)) for the request, prefill, decode sds */
  uint32_t pre[LE], dec[LE];
  float r[LE], p[LE];
  int passes;
  uint32_t layer_ids[L];
} gen;

static inline uint64_t mix(uint64_t *s) { return eldr_splitmix64(s); }

static uint32_t draw_len(const eldr_tracegen_length *len, double z) {
  double v = len->median * exp(len->sigma * z);
  if (v < len->min) v = len->min;
  if (v > len->max) v = len->max;
  return (uint32_t)v;
}

/* counts of T tokens, top-K per layer, from unnormalised probabilities x
 * (LE): the expected counts c_e = T K p_e, capped at T (the excess spread
 * over the others in proportion, water-filling), rounded by systematic
 * sampling (one uniform per layer: counts are floor(C_e + u) - floor(C_{e-1}
 * + u) of the cumulative sums), so each row sums to exactly T K and no entry
 * passes T: a valid counts-form row. */
static void counts_of(gen *g, const float *x, uint32_t T, uint64_t *st, uint32_t *out) {
  (void)g;
  for (size_t l = 0; l < L; l++) {
    const float *w = x + l * E;
    double c[E];
    unsigned char capped[E] = {0};
    double mass = (double)T * K;
    for (int round = 0; round <= K; round++) {
      double sum = 0.0;
      for (size_t e = 0; e < E; e++) sum += capped[e] ? 0.0 : w[e];
      int over = 0;
      for (size_t e = 0; e < E; e++) {
        c[e] = capped[e] ? (double)T : w[e] * mass / sum;
        if (!capped[e] && c[e] > T) over = 1;
      }
      if (!over) break;
      for (size_t e = 0; e < E; e++)
        if (!capped[e] && c[e] > T) {
          capped[e] = 1;
          mass -= T;
        }
    }
    const double u = (double)(mix(st) >> 11) * 0x1p-53;
    double cum = 0.0;
    long prev = (long)floor(u);
    for (size_t e = 0; e < E; e++) {
      cum += c[e];
      long now = (long)floor(cum + u);
      if (e + 1 == E) now = (long)T * K + (long)floor(u); /* exact total despite rounding */
      long v = now - prev;
      out[l * E + e] = v < 0 ? 0 : v > (long)T ? T : (uint32_t)v;
      prev = now;
    }
  }
}

static int gen_each(void *ctx, eldr_fit_visit visit, void *ud, eldr_diag *d) {
  (void)d;
  gen *g = ctx;
  const int want_decode = g->passes++ == 0; /* only the first pass uses decode counts */
  const eldr_tracegen_workload *w = &g->w;
  for (size_t i = 0; i < g->n; i++) {
    uint64_t st = g->seed ^ (0x9e3779b97f4a7c15ULL * (i + 1));
    double u = (double)(mix(&st) >> 11) * 0x1p-53;
    size_t dom = 0;
    while (dom + 1 < w->n_domains && u > g->cum[dom]) dom++;
    const float *lg = g->explogit + dom * LE;
    const uint32_t tp = draw_len(&w->prompt, g->normal[mix(&st) & (NT - 1)]);
    const uint32_t td = draw_len(&w->output, g->normal[mix(&st) & (NT - 1)]);
    for (size_t c = 0; c < LE; c++) {
      uint64_t b = mix(&st);
      const float rq = lg[c] * g->er[b & (NT - 1)];
      g->p[c] = rq * g->ep[(b >> 16) & (NT - 1)];
      g->r[c] = rq * g->ed[(b >> 32) & (NT - 1)]; /* decode */
    }
    counts_of(g, g->p, tp, &st, g->pre);
    if (want_decode) counts_of(g, g->r, td, &st, g->dec);
    eldr_fit_item it = {.n_prefill = tp, .prefill = g->pre, .decode = want_decode ? g->dec : NULL};
    int rc = visit(ud, &it);
    if (rc) return rc;
  }
  return 0;
}

static int gen_init(gen *g, size_t n, uint64_t seed) {
  memset(g, 0, sizeof *g);
  if (eldr_tracegen_workload_preset("realistic", &g->w, NULL)) return -1;
  eldr_tracegen_realistic_for_shape(&g->w, K, E);
  g->n = n;
  g->seed = seed;
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  for (size_t i = 0; i < NT; i++) g->normal[i] = (float)eldr_rng_normal(&r);
  for (size_t i = 0; i < NT; i++) {
    g->er[i] = (float)exp(g->w.request_sd * g->normal[i]);
    g->ep[i] = (float)exp(g->w.prefill_sd * g->normal[(i * 7919 + 1) & (NT - 1)]);
    g->ed[i] = (float)exp(g->w.decode_sd * g->normal[(i * 104729 + 3) & (NT - 1)]);
  }
  const eldr_tracegen_workload *w = &g->w;
  double tot = 0.0;
  for (size_t dd = 0; dd < w->n_domains; dd++) tot += w->domain_weight[dd];
  double acc = 0.0;
  for (size_t dd = 0; dd < w->n_domains; dd++) g->cum[dd] = (acc += w->domain_weight[dd] / tot);
  g->explogit = malloc(w->n_domains * LE * sizeof *g->explogit);
  float *G = malloc(LE * sizeof *G);
  if (!g->explogit || !G) return -1;
  for (size_t c = 0; c < LE; c++) G[c] = (float)(w->pop_sd * eldr_rng_normal(&r));
  for (size_t l = 0; l < L; l++) /* generalists: the first few experts of a random rotation */
    for (uint32_t x = 0; x < w->generalists; x++) G[l * E + (x * 37 + l * 11) % E] += (float)w->generalist_boost;
  for (size_t dd = 0; dd < w->n_domains; dd++)
    for (size_t c = 0; c < LE; c++)
      g->explogit[dd * LE + c] = (float)exp(G[c] + w->domain_sd * eldr_rng_normal(&r));
  free(G);
  for (uint32_t l = 0; l < L; l++) g->layer_ids[l] = l;
  return 0;
}

static int count_visit(void *ud, const eldr_fit_item *it) {
  (*(size_t *)ud) += it->n_prefill > 0;
  return 0;
}

/* --write: the generated requests as a counts-form trace (eldr fit's input) */
typedef struct writer {
  gen *g;
  FILE *f;
  size_t i;
  char *buf;
  size_t len, cap;
  uint32_t ntok[2];
} writer;

static int write_visit(void *ud, const eldr_fit_item *it) {
  writer *w = ud;
  char id[32];
  snprintf(id, sizeof id, "r%zu", w->i++);
  const eldr_shape sh = {L, E, K};
  uint32_t dt = 0;
  for (size_t e = 0; e < E; e++) dt += it->decode[e];
  eldr_counts_line ln = {.id = id, .model = "Qwen3-30B-A3B", .shape = &sh, .layer_ids = w->g->layer_ids,
                         .generator = "bench_fit counts generator (realistic parameters)",
                         .arrival = -1, .prefill_tokens = it->n_prefill, .decode_tokens = dt / K,
                         .prefill_counts = it->prefill, .decode_counts = it->decode};
  eldr_diag d = {{0}};
  w->len = 0;
  int rc = eldr_trace_format_counts(&ln, &w->buf, &w->len, &w->cap, &d);
  if (rc) {
    fprintf(stderr, "bench_fit: %s: %s\n", id, eldr_diag_msg(&d, rc));
    return rc;
  }
  return fwrite(w->buf, 1, w->len, w->f) == w->len ? 0 : ELDR_EIO;
}

static int write_trace(const char *path, size_t n) {
  static gen g;
  if (gen_init(&g, n, 1)) return 1;
  writer w = {.g = &g, .f = fopen(path, "w")};
  if (!w.f) {
    perror(path);
    return 1;
  }
  int rc = gen_each(&g, write_visit, &w, NULL);
  if (fclose(w.f) != 0) rc = 1;
  free(w.buf);
  free(g.explogit);
  return rc ? 1 : 0;
}

static void run_one(size_t n, size_t k, size_t mem_mb) {
  static gen g;
  if (gen_init(&g, n, 1)) {
    fprintf(stderr, "bench_fit: generator setup failed\n");
    exit(1);
  }
  eldr_fit_source src = {.model = "Qwen3-30B-A3B", .shape = {L, E, K}, .layer_ids = g.layer_ids,
                         .generator = "bench_fit counts generator (realistic parameters)",
                         .each = gen_each, .ctx = &g};
  /* one bare pass: the generator's own cost */
  size_t seen = 0;
  double t0 = eldr_clock_now();
  gen_each(&g, count_visit, &seen, NULL);
  const double gen_s = eldr_clock_now() - t0;
  g.passes = 0;
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  o.k = k;
  o.sig_budget = mem_mb << 20;
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  eldr_diag d = {{0}};
  t0 = eldr_clock_now();
  int rc = eldr_fit_stream(&src, &o, &a, &rep, &d);
  const double wall = eldr_clock_now() - t0;
  if (rc) {
    fprintf(stderr, "bench_fit: %s\n", eldr_diag_msg(&d, rc));
    exit(1);
  }
  size_t mx = 0;
  for (size_t c = 0; c < a->k; c++) mx = a->cluster_sizes[c] > mx ? a->cluster_sizes[c] : mx;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                     (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
  printf("%9zu %4zu %8.1f %7.1f %7.1f %7.1f %7.1f %6d %-22s %10.0f %9.4f %7.4f [%.4f, %.4f] mask %zu/%d\n",
         n, k, wall, cpu, gen_s, rep.seconds_rho, rep.seconds_kmeans, rep.passes, rep.mode, (double)ru.ru_maxrss / 1024.0,
         (double)mx / ((double)rep.n / (double)k), a->fit_rho, rep.rho_ci.lo, rep.rho_ci.hi,
         rep.cand[rep.chosen].mask_size, L);
  fflush(stdout);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  free(g.explogit);
}

int main(int argc, char **argv) {
  size_t k = 16, mem_mb = 3072, sizes[16], ns = 0;
  const char *write_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-k") && i + 1 < argc) k = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--write") && i + 1 < argc) write_path = argv[++i];
    else if (!strcmp(argv[i], "--memory-mb") && i + 1 < argc) mem_mb = strtoul(argv[++i], NULL, 10);
    else if (ns < 16 && atol(argv[i]) > 0) sizes[ns++] = strtoul(argv[i], NULL, 10);
    else {
      fprintf(stderr, "usage: bench_fit [-k K] [--memory-mb M] [N ...] | --write FILE N\n");
      return 2;
    }
  }
  if (write_path) return ns == 1 ? write_trace(write_path, sizes[0]) : 2;
  if (!ns) {
    sizes[ns++] = 10000;
    sizes[ns++] = 100000;
  }
  printf("bench_fit: Qwen3-30B-A3B shape (48 x 128, top-8), bench-only counts generator, "
         "signature budget %zu MB\n", mem_mb);
  printf("%9s %4s %8s %7s %7s %7s %7s %6s %-22s %10s %9s %7s %s\n", "requests", "k", "wall_s", "cpu_s", "gen_s",
         "rho_s", "kmeans_s", "passes", "mode", "max_rss_mb", "imbalance", "rho", "rho 95% (jackknife)");
  for (size_t i = 0; i < ns; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      run_one(sizes[i], k, mem_mb);
      _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "bench_fit: run with %zu requests failed\n", sizes[i]);
      return 1;
    }
  }
  return 0;
}
