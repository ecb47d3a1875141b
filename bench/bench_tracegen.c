/* bench_tracegen.c — time the synthetic trace generator and the trace
 * statistics, and print the statistics the presets are calibrated on.
 *
 *   bench_tracegen [--model M] [--workload W] [--requests N] [--decode-tokens T]
 *                  [--seed S] [--batches B] [--out FILE]
 *
 * Phases timed separately: generation in memory (eldr_tracegen_generate),
 * statistics (eldr_tracestats_compute), and, with --out, writing the JSONL
 * (eldr_trace_save) and loading it back (eldr_trace_load), which belong to
 * the trace format module. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eldr/clock.h"
#include "eldr/trace.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"
#include "eldr/tracestats.h"

/* CPU seconds of this process: the figure to compare on a loaded machine
 * (the generation and the statistics run on the calling thread). */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void print_stats(const eldr_tracestats *s) {
  printf("  correlation median %.3f (p10 %.3f, p90 %.3f, n %zu)\n", s->corr_median, s->corr_p10,
         s->corr_p90, s->n_corr);
  for (size_t i = 0; i < s->n_batch; i++) {
    const eldr_tracestats_batch *b = &s->batch[i];
    printf("  batch %3zu: random %.2f  domain %.2f (%.1f%% fewer)\n", b->size,
           b->distinct[ELDR_BATCH_RANDOM], b->distinct[ELDR_BATCH_DOMAIN],
           100 * b->reduction[ELDR_BATCH_DOMAIN]);
  }
  printf("  domains: top2 %.3f top4 %.3f skew %.2f; prompt median %.0f mean %.1f; output median "
         "%.0f mean %.1f\n",
         s->domain_top2, s->domain_top4, s->domain_skew, s->prompt.median, s->prompt.mean,
         s->output.median, s->output.mean);
  printf("  top-10%% share: overall %.3f, per domain %.3f\n", s->top10_share,
         s->top10_share_domain);
}

int main(int argc, char **argv) {
  const char *model = "qwen3-30b-a3b", *workload = "task", *out = NULL;
  size_t n = 10000, batches = 64;
  uint32_t decode = 128;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!strcmp(argv[i], "--workload")) workload = argv[i + 1];
    else if (!strcmp(argv[i], "--requests")) n = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--decode-tokens")) decode = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--batches")) batches = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
    else {
      fprintf(stderr, "bench_tracegen: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  eldr_diag d = {{0}};
  eldr_shape shape;
  char canon[128];
  if (eldr_tracegen_model_shape(model, &shape, canon, sizeof canon, &d)) {
    fprintf(stderr, "bench_tracegen: %s\n", d.msg);
    return 2;
  }
  eldr_tracegen *g = NULL;
  if (eldr_tracegen_new(&shape, canon, workload, seed, &g, &d)) {
    fprintf(stderr, "bench_tracegen: %s\n", d.msg);
    return 2;
  }
  eldr_tracegen_set_lengths(g, decode, 0, 0);
  double t0 = eldr_clock_now(), c0 = cpu_now();
  eldr_trace *t = NULL;
  if (eldr_tracegen_generate(g, n, &t, &d)) {
    fprintf(stderr, "bench_tracegen: %s\n", d.msg);
    return 1;
  }
  double t1 = eldr_clock_now(), c1 = cpu_now();
  size_t sel = 0;
  for (size_t i = 0; i < t->n; i++) sel += t->req[i].n_prefill + t->req[i].n_decode;
  sel *= (size_t)shape.num_layers * shape.top_k;
  printf("%s %s: %zu requests, %u decode tokens, %zu selections\n", canon, workload, n, decode,
         sel);
  printf("generate (in memory): %.2f s wall, %.2f s CPU (%.1f M selections per CPU second)\n",
         t1 - t0, c1 - c0, (double)sel / (c1 - c0) / 1e6);
  eldr_tracestats_opts o;
  eldr_tracestats_opts_default(&o);
  o.batches = batches;
  o.seed = seed;
  eldr_tracestats s;
  double t2 = eldr_clock_now(), c2 = cpu_now();
  if (eldr_tracestats_compute(t, &o, &s, &d)) {
    fprintf(stderr, "bench_tracegen: %s\n", d.msg);
    return 1;
  }
  double t3 = eldr_clock_now(), c3 = cpu_now();
  printf("stats (in memory): %.2f s wall, %.2f s CPU\n", t3 - t2, c3 - c2);
  print_stats(&s);
  eldr_tracestats_free(&s);
  if (out) {
    double t4 = eldr_clock_now();
    if (eldr_trace_save(out, t, &d)) {
      fprintf(stderr, "bench_tracegen: %s\n", d.msg);
      return 1;
    }
    double t5 = eldr_clock_now();
    eldr_trace *t2r = NULL;
    if (eldr_trace_load(out, &t2r, &d)) {
      fprintf(stderr, "bench_tracegen: %s\n", d.msg);
      return 1;
    }
    double t6 = eldr_clock_now();
    printf("trace save: %.2f s; trace load: %.2f s\n", t5 - t4, t6 - t5);
    eldr_trace_free(t2r);
  }
  eldr_trace_free(t);
  eldr_tracegen_free(g);
  return 0;
}
