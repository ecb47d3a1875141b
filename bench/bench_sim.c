/* bench_sim.c — decode batch-steps per second of the simulator, per model
 * preset, on a generated pool.
 *
 *   bench_sim [--models LIST] [--requests N] [--arrivals N] [--load F]
 *             [--max-decode-tokens T] [--max-prompt-tokens T] [--workload W]
 *             [--policy P] [--seed S] [--repeat R] [--form auto|bits|ids8]
 *             [--direct 0|1]
 *
 * For each model (default: every tracegen preset): generate N requests
 * (workload realistic, output lengths capped at T, prompts capped: prefill
 * selections only set prompt lengths here), serve all of them as the pool,
 * build the pool's compact decode tokens (eldr_sim_tokens_build with --form,
 * timed on its own), then one run of `arrivals` Poisson arrivals at F x the
 * estimated capacity on 8P16D, batch 64, repeated R times (the fastest
 * counts; policy jsq: no fit needed; the step union does not depend on the
 * policy's kind). Prints one table row per model and a line of the result's
 * values (to compare two builds: identical results). With a compact form and
 * --direct 1 (the default), the same runs again with direct_union (the column
 * ids_Ms/s: steps/s reading the selections), checked to give the same result.
 * Times are CPU seconds of the bench's thread (the runs are single-threaded). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eldr/latency.h"
#include "eldr/preset_files.h"
#include "eldr/sim.h"
#include "eldr/tracegen.h"

/* CPU seconds of this thread: the machine is shared, wall time is not ours. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run_model(const char *model, const char *workload, size_t n, size_t arrivals, double load,
                     uint32_t max_dec, uint32_t max_pre, const char *policy, uint64_t seed, int repeat,
                     eldr_sim_tok_form form, int ids_run) {
  eldr_diag d = {{0}};
  eldr_shape shape;
  char canon[128];
  if (eldr_tracegen_model_shape(model, &shape, canon, sizeof canon, &d)) {
    fprintf(stderr, "bench_sim: %s\n", d.msg);
    return 2;
  }
  eldr_tracegen *g = NULL;
  if (eldr_tracegen_new(&shape, canon, workload, seed, &g, &d)) {
    fprintf(stderr, "bench_sim: %s\n", d.msg);
    return 2;
  }
  eldr_tracegen_set_lengths(g, 0, max_dec, max_pre);
  eldr_trace *t = NULL;
  double t0 = cpu_now();
  if (eldr_tracegen_generate(g, n, &t, &d)) {
    fprintf(stderr, "bench_sim: %s\n", d.msg);
    eldr_tracegen_free(g);
    return 1;
  }
  double t_gen = cpu_now() - t0;
  eldr_tracegen_free(g);
  size_t *idx = malloc(n * sizeof *idx);
  if (!idx) return 1;
  size_t ntok = 0;
  for (size_t i = 0; i < n; i++) {
    idx[i] = i;
    ntok += t->req[i].n_decode;
  }
  eldr_latency_model lm;
  const char *hw = !strcmp(model, "llama4-maverick") ? "h200" : "mi300x";
  if (eldr_latency_preset(model, hw, &lm, &d)) {
    fprintf(stderr, "bench_sim: %s\n", d.msg);
    return 2;
  }
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = n};
  eldr_sim_tokens *bits = NULL;
  t0 = cpu_now();
  if (eldr_sim_tokens_build(&pool, form, &bits, &d)) {
    fprintf(stderr, "bench_sim: %s\n", d.msg);
    return 1;
  }
  double t_build = cpu_now() - t0;
  pool.tokens = bits;
  eldr_sim_config c;
  eldr_sim_config_default(&c);
  c.n_requests = arrivals;
  c.seed = seed;
  if (eldr_policy_parse(policy, &c.policy)) {
    fprintf(stderr, "bench_sim: unknown policy '%s'\n", policy);
    return 2;
  }
  c.rate = load * eldr_sim_capacity(&pool, &lm, &c);
  eldr_sim_result r;
  double t_run = 0;
  for (int rep = 0; rep < repeat; rep++) { /* the fastest of repeat identical runs */
    t0 = cpu_now();
    int rc = eldr_sim_run(&pool, &lm, &c, &r, &d);
    double dt = cpu_now() - t0;
    if (rc) {
      fprintf(stderr, "bench_sim: %s: %s\n", model, d.msg);
      return 1;
    }
    if (!rep || dt < t_run) t_run = dt;
  }
  double t_ids = 0;
  c.direct_union = 1;
  eldr_sim_result r2;
  for (int rep = 0; bits && ids_run && rep < repeat; rep++) { /* the same runs reading the selections */
    t0 = cpu_now();
    int rc = eldr_sim_run(&pool, &lm, &c, &r2, &d);
    double dt = cpu_now() - t0;
    if (rc) {
      fprintf(stderr, "bench_sim: %s: %s\n", model, d.msg);
      return 1;
    }
    if (r2.steps != r.steps || r2.tpot_mean != r.tpot_mean || r2.mean_union != r.mean_union) {
      fprintf(stderr, "bench_sim: %s: the direct path's result differs from the bitsets'\n", model);
      return 1;
    }
    if (!rep || dt < t_ids) t_ids = dt;
  }
  char ids[32] = "-";
  if (bits && ids_run) snprintf(ids, sizeof ids, "%.2f", (double)r.steps / t_ids / 1e6);
  printf("%-16s %6zu %7.2f %6.1f %5s %6.2f %7llu %5.1f %6.3f %8.2f %7.2f %8s\n", model, n,
         (double)ntok / 1e6, t_gen,
         !bits ? "ids16" : bits->form == ELDR_SIM_TOK_IDS8 ? "ids8" : "bits", t_build, (unsigned long long)r.steps,
         r.mean_batch, t_run, (double)r.steps / t_run / 1e6, (double)r.token_steps / t_run / 1e6,
         ids);
  fprintf(stderr, "result %s: tpot_mean %.17g tpot_p99 %.17g union %.17g batch %.17g steps %llu\n",
          model, r.tpot_mean, r.tpot_p99, r.mean_union, r.mean_batch,
          (unsigned long long)r.steps);
  eldr_sim_tokens_free(bits);
  free(idx);
  eldr_trace_free(t);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_sim [options]\n\n"
          "Decode batch-steps per second of the simulator, per model preset, on a generated\n"
          "pool (see the top of bench/bench_sim.c). All of it takes about 35 s and 5 GB.\n\n"
          "      --models LIST       comma list of model presets          [every tracegen preset]\n"
          "      --requests N        generated requests (the pool)        [10000]\n"
          "      --arrivals N        Poisson arrivals per run             [5000]\n"
          "      --load F            arrival rate, x estimated capacity   [0.8]\n"
          "      --max-decode-tokens T  cap of the output lengths         [256]\n"
          "      --max-prompt-tokens T  cap of the prompt lengths         [32]\n"
          "      --workload W        realistic | task | language          [realistic]\n"
          "      --policy P          decode policy                        [jsq]\n"
          "      --seed S                                                 [1]\n"
          "      --repeat R          runs per model, the fastest counts   [3]\n"
          "      --form F            auto | bits | ids8 compact tokens    [auto]\n"
          "      --direct 0|1        also run with direct_union           [1]\n"
          "  -h, --help              this help\n");
}

int main(int argc, char **argv) {
  const char *models = "qwen3-30b-a3b,gpt-oss-120b,qwen3-235b-a22b,llama4-maverick,olmoe-1b-7b,deepseek-v3";
  const char *workload = "realistic", *policy = "jsq";
  size_t n = 10000, arrivals = 5000;
  double load = 0.8;
  uint32_t max_dec = 256, max_pre = 32;
  uint64_t seed = 1;
  int repeat = 3, ids_run = 1;
  eldr_sim_tok_form form = ELDR_SIM_TOK_AUTO;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    }
  /* every option takes a value: a lone last one is an error, not dropped */
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) {
      fprintf(stderr, "bench_sim: option %s needs a value (see --help)\n", argv[i]);
      return 2;
    }
    if (!strcmp(argv[i], "--models")) models = argv[i + 1];
    else if (!strcmp(argv[i], "--workload")) workload = argv[i + 1];
    else if (!strcmp(argv[i], "--policy")) policy = argv[i + 1];
    else if (!strcmp(argv[i], "--requests")) n = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--arrivals")) arrivals = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--load")) load = strtod(argv[i + 1], NULL);
    else if (!strcmp(argv[i], "--max-decode-tokens")) max_dec = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--max-prompt-tokens")) max_pre = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--form")) {
      const char *f = argv[i + 1];
      if (!strcmp(f, "auto")) form = ELDR_SIM_TOK_AUTO;
      else if (!strcmp(f, "bits")) form = ELDR_SIM_TOK_BITS;
      else if (!strcmp(f, "ids8")) form = ELDR_SIM_TOK_IDS8;
      else {
        fprintf(stderr, "bench_sim: --form must be auto, bits or ids8, not '%s'\n", f);
        return 2;
      }
    } else if (!strcmp(argv[i], "--direct")) ids_run = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "bench_sim: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (!n || !arrivals || !(load > 0) || repeat < 1) {
    fprintf(stderr, "bench_sim: --requests, --arrivals, --load and --repeat must be > 0\n");
    return 2;
  }
  printf("workload %s, pool = all generated requests, %zu arrivals at %.2f x capacity, 8P16D "
         "batch 64, policy %s\n",
         workload, arrivals, load, policy);
  printf("%-16s %6s %7s %6s %5s %6s %7s %5s %6s %8s %7s %8s\n", "model", "pool", "Mtokens",
         "gen_s", "repr", "repr_s", "steps", "batch", "run_s", "Msteps/s", "Mtok/s", "ids_Ms/s");
  char buf[512];
  snprintf(buf, sizeof buf, "%s", models);
  int rc = 0;
  for (char *sv = NULL, *m = strtok_r(buf, ",", &sv); m; m = strtok_r(NULL, ",", &sv)) {
    rc = run_model(m, workload, n, arrivals, load, max_dec, max_pre, policy, seed, repeat, form,
                   ids_run);
    if (rc) return rc;
    fflush(stdout);
  }
  return 0;
}
