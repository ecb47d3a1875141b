/* cmd_trace.c — `eldr trace gen` (synthetic traces) and `eldr trace stats`. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "figures.h"
#include "eldr/plot.h"
#include "eldr/artifact.h"
#include "eldr/fit.h"
#include "eldr/grow.h"
#include "eldr/readfile.h"
#include "eldr/signature.h"
#include "eldr/trace.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"
#include "eldr/writefile.h"
#include "eldr/tracestats.h"

static const char TRACE_HELP[] =
    "usage: eldr trace <gen|stats|compact|split> [options]   (eldr trace <sub> --help)\n"
    "\n"
    "  gen     write a synthetic expert trace (JSONL) for a model shape and workload\n"
    "  stats   prefill->decode correlation, distinct experts per batching rule,\n"
    "          domain mix and lengths of a trace\n"
    "  compact rewrite traces in the counts form (per-layer expert counts)\n"
    "  split   write the seeded fit / held-out split of a trace (as eldr fit / sim use)\n";

static const char GEN_HELP[] =
    "usage: eldr trace gen --requests N -o FILE [options]\n"
    "       eldr trace gen --from-mooncake FILE -o FILE [options]\n"
    "\n"
    "Generate a synthetic expert-selection trace in the JSONL trace format.\n"
    "\n"
    "      --from-mooncake FILE  arrivals, prompt/output lengths and 512-token block\n"
    "                            structure from a Mooncake trace (timestamp,\n"
    "                            input_length, output_length, hash_ids); each distinct\n"
    "                            block's experts drawn once from the workload; counts\n"
    "                            form; --requests: its first N lines  [off]\n"
    "  -m, --model M             qwen3-30b-a3b | gpt-oss-120b | qwen3-235b-a22b |\n"
    "                            llama4-maverick | olmoe-1b-7b | deepseek-v3 | custom:L,E,K\n"
    "                                                               [qwen3-30b-a3b]\n"
    "  -w, --workload W          realistic (calibrated to real traces) | task |\n"
    "                            language (paper-shaped presets) | custom:FILE (JSON)\n"
    "                                                               [realistic]\n"
    "  -n, --requests N          requests to generate (>= 1)         (required)\n"
    "  -s, --seed N              seed; the same seed gives the same bytes [" ELDR_SEED_DEFAULT_STR "]\n"
    "  -o, --output FILE         trace to write ('-' = stdout)        (required)\n"
    "      --decode-tokens T     every request generates exactly T tokens  [drawn]\n"
    "      --max-decode-tokens T cap of the drawn output lengths, tokens [no cap]\n"
    "      --max-prompt-tokens T cap of the drawn prompt lengths, tokens [no cap]\n"
    "  -j, --jobs N              generator threads (the output does not depend on it)\n"
    "                                                               [2]\n"
    "      --form F              tokens (per-token rows) | counts (per-layer expert\n"
    "                            counts: what eldr serve --record writes) [tokens]\n"
    "  -q, --quiet               no progress on stderr\n"
    "  -h, --help                this help\n"
    "\n"
    "The model and the presets are documented in docs/trace.md.\n";

static const char STATS_HELP[] =
    "usage: eldr trace stats TRACE... [options]\n"
    "\n"
    "TRACE: JSONL files (per-token or counts form), directories of *.jsonl or globs,\n"
    "read as one trace. Counts-form requests have no per-token rows: (b) uses only\n"
    "the requests that have them.\n"
    "\n"
    "(a) median per-request Pearson correlation of prefill vs decode per-expert counts;\n"
    "(b) mean distinct experts per layer per decode step for batches drawn at random,\n"
    "    from one domain, and from one artifact cluster, and the reduction vs random;\n"
    "(c) domain mix, prompt and output lengths, popularity skew.\n"
    "\n"
    "  -a, --artifact FILE   cluster = nearest centroid of the request's signature\n"
    "                                                                   [none]\n"
    "  -b, --batch LIST      batch sizes                                [8,16,32,64]\n"
    "      --batches N       batches drawn per size and rule            [64]\n"
    "      --steps N         decode steps per batch (0 = median output length) [0]\n"
    "  -s, --seed N          batch sampling seed                        [0]\n"
    "      --json            JSON instead of a table\n"
    "  -p, --plot FILE       distinct experts vs batch size, per rule (.png or .svg;\n"
    "                        needs gnuplot)                             [none]\n"
    "      --olmoe-counts F  also report the popularity skew of a per-domain counts\n"
    "                        file (e.g. olmoe-domain-expert-counts.json) for comparison\n"
    "                                                                   [none]\n"
    "  -h, --help            this help\n"
    "\n"
    "Batches are decode batches of B slots under continuous batching: at every step each\n"
    "slot contributes its request's next decode token; a finished request is replaced by\n"
    "the next one drawn by the same rule (random / same domain / same cluster). See\n"
    "docs/trace.md.\n";

/* ------------------------------------------------------------------------ */

/* Generation pipeline: one thread generates requests into a ring of slots,
 * the command's thread writes them in order (same bytes as one thread). */
#define GEN_RING 32
#define GEN_MAX_JOBS 16 /* divides GEN_RING: producer j owns the slots i % GEN_RING with i = j mod jobs */

typedef struct gen_slot {
  int ready; /* 1: filled by the producer, not yet written */
  int rc;
  eldr_tracegen_req q;    /* its arrays are buf's */
  eldr_tracegen_bufs buf; /* the producer generates straight into them */
} gen_slot;

typedef struct gen_pipe {
  eldr_tracegen *g[GEN_MAX_JOBS]; /* one generator per producer (same tables) */
  size_t jobs;
  size_t n;
  gen_slot slot[GEN_RING];
  pthread_mutex_t mu;
  pthread_cond_t cv_ready, cv_free;
  int stop;
  eldr_diag d[GEN_MAX_JOBS];
} gen_pipe;

typedef struct gen_job {
  gen_pipe *p;
  size_t j;
} gen_job;

/* Producer j generates requests j, j + jobs, j + 2 jobs, ... (each a pure
 * function of seed and index, so the bytes do not depend on jobs). */
static void *gen_producer(void *arg) {
  gen_job *job = arg;
  gen_pipe *p = job->p;
  const size_t j = job->j;
  for (size_t i = j; i < p->n; i += p->jobs) {
    gen_slot *s = &p->slot[i % GEN_RING];
    pthread_mutex_lock(&p->mu);
    while (s->ready && !p->stop) pthread_cond_wait(&p->cv_free, &p->mu);
    int stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    if (stop) break;
    int rc = eldr_tracegen_request_into(p->g[j], i, &s->buf, &s->q, &p->d[j]);
    pthread_mutex_lock(&p->mu);
    s->rc = rc;
    s->ready = 1;
    pthread_cond_signal(&p->cv_ready);
    pthread_mutex_unlock(&p->mu);
    if (rc) break;
  }
  return NULL;
}

static void gen_pipe_free(gen_pipe *p) {
  for (size_t j = 1; j < p->jobs; j++) eldr_tracegen_free(p->g[j]); /* g[0] is the caller's */
  for (size_t i = 0; i < GEN_RING; i++) {
    free(p->slot[i].buf.prefill);
    free(p->slot[i].buf.decode);
  }
  pthread_cond_destroy(&p->cv_free);
  pthread_cond_destroy(&p->cv_ready);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* The writer's chunk: lines are batched into about this many bytes, one
 * write each. */
#define GEN_CHUNK ((size_t)4 << 20)

/* n bytes to the output (the outfile, or stdout): 0, or -1 with *err. */
static int gen_put(eldr_outfile *of, int to_stdout, const char *p, size_t n, int *err) {
  if (to_stdout ? eldr_write_all(STDOUT_FILENO, p, n) : eldr_outfile_write(of, p, n, NULL)) {
    *err = errno;
    return -1;
  }
  return 0;
}

/* --from-mooncake: the trace built in memory (cli_mooncake_build), saved
 * whole (eldr_trace_save: a temporary file renamed; '-' = stdout). */
static int trace_gen_mooncake(const char *cmd, const char *path, eldr_tracegen *g, long requests,
                              uint32_t max_dec, const char *out_path, int quiet) {
  eldr_block_table bt;
  eldr_trace *t = cli_mooncake_build(cmd, path, g, requests > 0 ? (size_t)requests : 0, max_dec, quiet, &bt);
  eldr_diag d = {{0}};
  int rc = 0;
  if (!strcmp(out_path, "-")) {
    for (size_t i = 0; i < t->n && !rc; i++) rc = eldr_trace_write_request(stdout, t, &t->req[i]);
    if (!rc && fflush(stdout)) rc = ELDR_EIO;
    if (rc) eldr_diag_fail(&d, rc, "writing to stdout failed");
  } else {
    rc = eldr_trace_save(out_path, t, &d);
  }
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  if (!quiet)
    fprintf(stderr, "eldr trace gen: wrote %zu requests (%s, %zu distinct %u-token blocks, %s) from %s to %s\n",
            t->n, eldr_tracegen_model(g), bt.n_blocks, bt.block_tokens, t->generator, path, out_path);
  eldr_block_table_free(&bt);
  eldr_trace_free(t);
  eldr_tracegen_free(g);
  return 0;
}

static int trace_gen(int argc, char **argv) {
  const char *cmd = "trace gen";
  const char *model = "qwen3-30b-a3b", *workload = "realistic", *out_path = NULL;
  long requests = -1, force_dec = 0, max_dec = 0, max_pre = 0, jobs = 2;
  uint64_t seed = ELDR_SEED_DEFAULT;
  int quiet = 0, counts_form = 0, form_set = 0;
  const char *mooncake = NULL;
  static const struct option lo[] = {
      {"model", required_argument, 0, 'm'},    {"workload", required_argument, 0, 'w'},
      {"form", required_argument, 0, 4},      {"from-mooncake", required_argument, 0, 5},
      {"jobs", required_argument, 0, 'j'},
      {"requests", required_argument, 0, 'n'}, {"seed", required_argument, 0, 's'},
      {"output", required_argument, 0, 'o'},   {"decode-tokens", required_argument, 0, 1},
      {"max-decode-tokens", required_argument, 0, 2},
      {"max-prompt-tokens", required_argument, 0, 3},
      {"quiet", no_argument, 0, 'q'},          {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":m:w:n:s:o:j:qh", lo, NULL)) != -1) {
    switch (c) {
    case 'j': jobs = cli_parse_long(cmd, "--jobs", optarg, 1, GEN_MAX_JOBS); break;
    case 'm': model = optarg; break;
    case 'w': workload = optarg; break;
    case 'n': requests = cli_parse_long(cmd, "--requests", optarg, 1, 100000000L); break;
    case 's': seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 'o': out_path = optarg; break;
    case 1: force_dec = cli_parse_long(cmd, "--decode-tokens", optarg, 1, 1000000); break;
    case 2: max_dec = cli_parse_long(cmd, "--max-decode-tokens", optarg, 1, 1000000); break;
    case 3: max_pre = cli_parse_long(cmd, "--max-prompt-tokens", optarg, 1, 1000000); break;
    case 5: mooncake = optarg; break;
    case 4:
      form_set = 1;
      if (!strcmp(optarg, "counts")) counts_form = 1;
      else if (!strcmp(optarg, "tokens")) counts_form = 0;
      else cli_usage_error(cmd, "--form: unknown '%s' (tokens|counts)", optarg);
      break;
    case 'q': quiet = 1; break;
    case 'h': fputs(GEN_HELP, stdout); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s' (see --help)", argv[optind]);
  if (requests < 0 && !mooncake) cli_usage_error(cmd, "--requests is required (see --help)");
  if (!out_path) cli_usage_error(cmd, "--output is required (see --help)");
  if (mooncake && ((form_set && !counts_form) || force_dec || max_pre))
    cli_usage_error(cmd, "--from-mooncake: the lengths are the trace's and the form is counts "
                         "(--form tokens, --decode-tokens and --max-prompt-tokens do not apply)");

  eldr_diag d = {{0}};
  eldr_shape shape;
  char canon[128];
  if (eldr_tracegen_model_shape(model, &shape, canon, sizeof canon, &d))
    cli_usage_error(cmd, "--model: %s", d.msg);
  eldr_tracegen *g = NULL;
  int rc = eldr_tracegen_new(&shape, canon, workload, seed, &g, &d);
  if (rc) cli_usage_error(cmd, "--workload: %s", d.msg);
  if (mooncake) return trace_gen_mooncake(cmd, mooncake, g, requests, (uint32_t)max_dec, out_path, quiet);
  eldr_tracegen_set_lengths(g, (uint32_t)force_dec, (uint32_t)max_dec, (uint32_t)max_pre);
  eldr_trace *hdr = eldr_tracegen_trace_header(g);
  if (!hdr) cli_fail(cmd, "out of memory");

  /* write to a temporary file next to the output, then rename (a device
   * such as /dev/null is written in place): eldr/writefile.h */
  int to_stdout = !strcmp(out_path, "-");
  eldr_outfile of = {0};
  if (!to_stdout) {
    eldr_diag od = {{0}};
    if (eldr_outfile_open(&of, out_path, &od)) cli_fail(cmd, "%s", od.msg);
  }
  /* lines are formatted into one buffer, written a chunk at a time */
  char *obuf = NULL;
  size_t olen = 0, ocap = 0;
  const int progress = !quiet && requests >= 200;
  /* a generator thread fills a ring of requests while this thread writes */
  gen_pipe *pp = calloc(1, sizeof *pp);
  if (!pp) cli_fail(cmd, "out of memory");
  while (GEN_RING % jobs) jobs--; /* every slot belongs to one producer */
  if ((long)jobs > requests) jobs = requests;
  pp->jobs = (size_t)jobs;
  pp->g[0] = g;
  for (size_t j = 1; j < pp->jobs; j++)
    if ((rc = eldr_tracegen_new(&shape, canon, workload, seed, &pp->g[j], &d)))
      cli_fail(cmd, "--workload: %s", d.msg);
  for (size_t j = 0; j < pp->jobs; j++)
    eldr_tracegen_set_lengths(pp->g[j], (uint32_t)force_dec, (uint32_t)max_dec, (uint32_t)max_pre);
  pp->n = (size_t)requests;
  pthread_mutex_init(&pp->mu, NULL);
  pthread_cond_init(&pp->cv_ready, NULL);
  pthread_cond_init(&pp->cv_free, NULL);
  pthread_t th[GEN_MAX_JOBS];
  gen_job jb[GEN_MAX_JOBS];
  for (size_t j = 0; j < pp->jobs; j++) {
    jb[j] = (gen_job){pp, j};
    if (pthread_create(&th[j], NULL, gen_producer, &jb[j])) cli_fail(cmd, "cannot start a thread");
  }
  const size_t cells = eldr_shape_cells(&shape);
  uint32_t *cnt_pre = counts_form ? malloc(cells * sizeof *cnt_pre) : NULL;
  uint32_t *cnt_dec = counts_form ? malloc(cells * sizeof *cnt_dec) : NULL;
  if (counts_form && (!cnt_pre || !cnt_dec)) cli_fail(cmd, "out of memory");
  const char *fail_msg = NULL;
  char fail_buf[sizeof pp->d[0].msg]; /* the pipe (and its diags) is freed before the message is printed */
  int fail_errno = 0, write_failed = 0;
  for (long i = 0; i < requests && !fail_msg; i++) {
    gen_slot *sl = &pp->slot[(size_t)i % GEN_RING];
    pthread_mutex_lock(&pp->mu);
    while (!sl->ready) pthread_cond_wait(&pp->cv_ready, &pp->mu);
    pthread_mutex_unlock(&pp->mu);
    if (sl->rc) {
      const eldr_diag *pd = &pp->d[(size_t)i % pp->jobs];
      snprintf(fail_buf, sizeof fail_buf, "%s", pd->msg[0] ? pd->msg : eldr_strerror(sl->rc));
      fail_msg = fail_buf;
      break;
    }
    char id[96];
    eldr_tracegen_request_id(g, (size_t)i, sl->q.domain, id, sizeof id);
    eldr_request r = {.id = id,
                      .domain = sl->q.domain,
                      .prompt = NULL,
                      .arrival = -1.0,
                      .n_prefill = sl->q.n_prefill,
                      .n_decode = sl->q.n_decode,
                      .prefill = sl->buf.prefill,
                      .decode = sl->buf.decode,
                      .prefill_gates = NULL};
    if (counts_form) { /* the same request as per-layer counts */
      memset(cnt_pre, 0, cells * sizeof *cnt_pre);
      memset(cnt_dec, 0, cells * sizeof *cnt_dec);
      (void)eldr_counts_accumulate(&shape, sl->q.prefill, ELDR_SEL_U16, sl->q.n_prefill, cnt_pre,
                                   NULL);
      (void)eldr_counts_accumulate(&shape, sl->q.decode, ELDR_SEL_U16, sl->q.n_decode, cnt_dec,
                                   NULL);
      r.prefill = r.decode = NULL;
      r.prefill_counts = cnt_pre;
      r.decode_counts = cnt_dec;
    }
    if ((rc = eldr_trace_format_request(hdr, &r, &obuf, &olen, &ocap)) < 0) {
      write_failed = 1;
      fail_msg = eldr_strerror(rc);
      break;
    }
    if (olen >= GEN_CHUNK || i + 1 == requests) {
      if (gen_put(&of, to_stdout, obuf, olen, &fail_errno)) {
        write_failed = 1;
        fail_msg = "write error";
        break;
      }
      olen = 0;
    }
    pthread_mutex_lock(&pp->mu);
    sl->ready = 0;
    pthread_cond_broadcast(&pp->cv_free); /* several producers may wait */
    pthread_mutex_unlock(&pp->mu);
    if (progress) cli_progress("trace gen: requests", (size_t)i + 1, (size_t)requests, 0);
  }
  pthread_mutex_lock(&pp->mu);
  pp->stop = 1;
  pthread_cond_broadcast(&pp->cv_free);
  pthread_mutex_unlock(&pp->mu);
  for (size_t j = 0; j < pp->jobs; j++) pthread_join(th[j], NULL);
  gen_pipe_free(pp);
  free(obuf);
  free(cnt_pre);
  free(cnt_dec);
  if (fail_msg) {
    if (!to_stdout) eldr_outfile_close(&of, 0, NULL);
    if (fail_errno && !strcmp(fail_msg, "write error"))
      cli_fail(cmd, "writing '%s': %s", out_path, strerror(fail_errno));
    if (write_failed) cli_fail(cmd, "writing '%s': %s", to_stdout ? "stdout" : out_path, fail_msg);
    cli_fail(cmd, "%s", fail_msg);
  }
  if (progress) cli_progress("trace gen: requests", (size_t)requests, (size_t)requests, 1);
  if (to_stdout) {
    if (fflush(stdout)) cli_fail(cmd, "writing stdout: %s", strerror(errno));
  } else {
    eldr_diag od = {{0}};
    if (eldr_outfile_close(&of, 1, &od)) cli_fail(cmd, "writing '%s': %s", out_path, od.msg);
  }
  if (!quiet)
    fprintf(stderr, "eldr trace gen: wrote %ld requests (%s, workload %s, seed %llu) to %s\n",
            requests, canon, workload, (unsigned long long)seed, out_path);
  eldr_trace_free(hdr);
  eldr_tracegen_free(g);
  return 0;
}

/* ------------------------------------------------------------------------ */

static void fmt_num(char *buf, size_t cap, double v, const char *f) {
  if (isnan(v))
    snprintf(buf, cap, "-");
  else
    snprintf(buf, cap, f, v);
}

static void print_table(const char *path, const eldr_trace *t, const eldr_tracestats *s,
                        size_t batches) {
  printf("trace %s: model %s, %u MoE layers, %u experts, top-%u, %zu requests\n", path,
         t->model ? t->model : "?", t->shape.num_layers, t->shape.num_experts, t->shape.top_k,
         s->n_requests);
  char a[32], b[32], c[32], e[32];
  fmt_num(a, sizeof a, s->corr_median, "%.3f");
  fmt_num(b, sizeof b, s->corr_p10, "%.3f");
  fmt_num(c, sizeof c, s->corr_p90, "%.3f");
  fmt_num(e, sizeof e, s->corr_mean, "%.3f");
  printf("\n(a) prefill->decode per-expert Pearson correlation: median %s (p10 %s, p90 %s, "
         "mean %s; %zu requests)\n",
         a, b, c, e, s->n_corr);
  if (!s->n_token_rows) {
    printf("\n(b) distinct experts per layer per decode step: not available (it replays per-token\n"
           "    decode selections; no request has them: counts-form requests carry counts only)\n");
  } else {
    printf("\n(b) distinct experts per layer per decode step (%zu batches of %zu steps per cell%s)\n",
           batches, s->steps, s->n_clusters ? "" : "; no --artifact: no cluster rule");
    if (s->n_token_rows < s->n_requests)
      printf("    (drawn from the %zu requests with per-token decode rows)\n", s->n_token_rows);
  }
  if (s->n_token_rows)
    printf("  %6s %9s %9s %8s %9s %8s\n", "batch", "random", "domain", "fewer", "cluster",
           "fewer");
  for (size_t i = 0; i < s->n_batch && s->n_token_rows; i++) {
    const eldr_tracestats_batch *x = &s->batch[i];
    char r0[32], r1[32], p1[32], r2[32], p2[32];
    fmt_num(r0, sizeof r0, x->distinct[ELDR_BATCH_RANDOM], "%.2f");
    fmt_num(r1, sizeof r1, x->distinct[ELDR_BATCH_DOMAIN], "%.2f");
    fmt_num(p1, sizeof p1, 100 * x->reduction[ELDR_BATCH_DOMAIN], "%.1f%%");
    fmt_num(r2, sizeof r2, x->distinct[ELDR_BATCH_CLUSTER], "%.2f");
    fmt_num(p2, sizeof p2, 100 * x->reduction[ELDR_BATCH_CLUSTER], "%.1f%%");
    printf("  %6zu %9s %9s %8s %9s %8s\n", x->size, r0, r1, p1, r2, p2);
  }
  size_t labelled = s->n_requests - s->n_unlabelled;
  fmt_num(a, sizeof a, 100 * s->domain_top2, "%.1f%%");
  fmt_num(b, sizeof b, 100 * s->domain_top4, "%.1f%%");
  fmt_num(c, sizeof c, s->domain_skew, "%.2fx");
  printf("\n(c) domains: %zu (%zu unlabelled requests); top-2 share %s, top-4 share %s, "
         "largest/smallest %s\n",
         s->n_domains, s->n_unlabelled, a, b, c);
  for (size_t g = 0; g < s->n_domains; g++)
    printf("  %-24s %8zu  %5.1f%%\n", t->domains[g], s->domain_count[g],
           labelled ? 100.0 * (double)s->domain_count[g] / (double)labelled : 0.0);
  const struct {
    const char *n;
    const eldr_tracestats_lens *l;
  } ls[] = {{"prompt tokens", &s->prompt}, {"output tokens", &s->output}};
  for (int i = 0; i < 2; i++)
    printf("  %-14s mean %.1f, median %.0f, p10 %.0f, p90 %.0f, min %u, max %u\n", ls[i].n,
           ls[i].l->mean, ls[i].l->median, ls[i].l->p10, ls[i].l->p90, ls[i].l->min,
           ls[i].l->max);
  fmt_num(a, sizeof a, s->top10_share, "%.3f");
  fmt_num(b, sizeof b, s->top10_share_domain, "%.3f");
  printf("  popularity: the top 10%% of experts take %s of a layer's selections (whole trace), "
         "%s (per domain, mean)\n",
         a, b);
}

typedef struct ref_skew {
  char model[128];
  char names[64][48];
  double shares[64];
  size_t n;
  double mean_domain, overall;
} ref_skew;

static void load_ref(const char *cmd, const char *path, ref_skew *r) {
  eldr_diag d = {{0}};
  char *buf;
  size_t n;
  if (eldr_read_file(path, (size_t)64 << 20, "--olmoe-counts", &buf, &n, &d))
    cli_fail(cmd, "%s", d.msg);
  memset(r, 0, sizeof *r);
  if (eldr_tracestats_domain_counts_skew(buf, n, NULL, r->model, sizeof r->model, r->names,
                                         r->shares, 64, &r->n, &r->mean_domain, &r->overall, &d))
    cli_fail(cmd, "--olmoe-counts: %s: %s", path, d.msg);
  if (r->n > 64) r->n = 64;
  free(buf);
}

static int trace_stats(int argc, char **argv) {
  const char *cmd = "trace stats";
  const char *art_path = NULL, *plot_path = NULL, *ref_path = NULL;
  long *sizes_l = NULL;
  size_t n_sizes = 0;
  long batches = 64, max_steps = 0;
  uint64_t seed = 0;
  int json = 0;
  static const struct option lo[] = {
      {"artifact", required_argument, 0, 'a'}, {"batch", required_argument, 0, 'b'},
      {"batches", required_argument, 0, 1},    {"steps", required_argument, 0, 2},
      {"seed", required_argument, 0, 's'},     {"json", no_argument, 0, 4},
      {"plot", required_argument, 0, 'p'},     {"olmoe-counts", required_argument, 0, 3},
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":a:b:s:p:h", lo, NULL)) != -1) { /* no -j: it is --jobs everywhere */
    switch (c) {
    case 'a': art_path = optarg; break;
    case 'b':
      free(sizes_l);
      n_sizes = cli_parse_long_list(cmd, "--batch", optarg, 1, 100000, &sizes_l);
      break;
    case 1: batches = cli_parse_long(cmd, "--batches", optarg, 1, 1000000); break;
    case 2: max_steps = cli_parse_long(cmd, "--steps", optarg, 0, 100000000L); break;
    case 's': seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 4: json = 1; break;
    case 'p': plot_path = optarg; break;
    case 3: ref_path = optarg; break;
    case 'h': fputs(STATS_HELP, stdout); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind >= argc) cli_usage_error(cmd, "a trace file is required (see --help)");
  cli_trace_inputs tin = {0};
  for (int i = optind; i < argc; i++) cli_trace_add(cmd, &tin, argv[i]);
  cli_trace_expand(cmd, &tin);
  const char *path = tin.label;
  if (plot_path) {
    if (!eldr_plot_terminal(plot_path))
      cli_usage_error(cmd, "--plot: '%s' must end in .png or .svg", plot_path);
  }
  ref_skew ref;
  if (ref_path) load_ref(cmd, ref_path, &ref);

  eldr_diag d = {{0}};
  eldr_trace *t = cli_trace_load(cmd, &tin);
  int rc;

  int *cluster = NULL;
  eldr_artifact *a = NULL;
  if (art_path) {
    if ((rc = eldr_artifact_load(art_path, &a, &d)))
      cli_fail(cmd, "--artifact: %s", eldr_diag_msg(&d, rc));
    if (a->shape.num_layers != t->shape.num_layers ||
        a->shape.num_experts != t->shape.num_experts || a->shape.top_k != t->shape.top_k)
      cli_fail(cmd,
               "--artifact: model shape %u layers/%u experts/top-%u does not match the trace's "
               "%u/%u/%u",
               a->shape.num_layers, a->shape.num_experts, a->shape.top_k, t->shape.num_layers,
               t->shape.num_experts, t->shape.top_k);
    const size_t cells = eldr_shape_cells(&t->shape);
    uint32_t *cs = malloc(cells * sizeof *cs);
    float *gs = malloc(cells * sizeof *gs);
    float *sig = malloc((a->dim ? a->dim : 1) * sizeof *sig);
    cluster = malloc(t->n * sizeof *cluster);
    if (!cs || !gs || !sig || !cluster) cli_fail(cmd, "out of memory");
    for (size_t i = 0; i < t->n; i++) {
      cluster[i] = -1;
      if (eldr_fit_request_signature(a, t, &t->req[i], cs, gs, sig)) continue;
      double best = -INFINITY;
      for (size_t k = 0; k < a->k; k++) {
        double v = eldr_dot(sig, a->centroids + k * a->dim, a->dim);
        if (v > best) {
          best = v;
          cluster[i] = (int)k;
        }
      }
    }
    free(sig);
    free(gs);
    free(cs);
  }

  size_t *sizes = NULL;
  if (n_sizes) {
    sizes = malloc(n_sizes * sizeof *sizes);
    if (!sizes) cli_fail(cmd, "out of memory");
    for (size_t i = 0; i < n_sizes; i++) sizes[i] = (size_t)sizes_l[i];
  }
  eldr_tracestats_opts o;
  eldr_tracestats_opts_default(&o);
  if (sizes) {
    o.batch_sizes = sizes;
    o.n_batch_sizes = n_sizes;
  }
  o.batches = (size_t)batches;
  o.seed = seed;
  o.cluster = cluster;
  o.steps = (size_t)max_steps;
  eldr_tracestats s;
  if ((rc = eldr_tracestats_compute(t, &o, &s, &d))) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  if (plot_path && !s.n_token_rows)
    cli_fail(cmd, "--plot draws (b), which replays per-token decode selections; %s has none "
             "(counts form)", path);

  if (json) {
    char *txt = eldr_tracestats_json(&s, t);
    if (!txt) cli_fail(cmd, "out of memory");
    if (ref_path) {
      /* add the reference as one more top-level field */
      json_t *root = json_loads(txt, 0, NULL);
      if (!root) cli_fail(cmd, "internal error: stats JSON");
      json_t *shares = json_object();
      for (size_t i = 0; i < ref.n; i++)
        json_object_set_new(shares, ref.names[i],
                            isfinite(ref.shares[i]) ? json_real(ref.shares[i]) : json_null());
      json_object_set_new(
          root, "reference",
          json_pack("{s:s,s:s,s:o,s:o,s:o}", "file", ref_path, "model", ref.model,
                    "top10_share_overall",
                    isfinite(ref.overall) ? json_real(ref.overall) : json_null(),
                    "top10_share_per_domain",
                    isfinite(ref.mean_domain) ? json_real(ref.mean_domain) : json_null(),
                    "top10_share_by_domain", shares));
      free(txt);
      txt = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
      json_decref(root);
      if (!txt) cli_fail(cmd, "out of memory");
    }
    printf("%s\n", txt);
    free(txt);
  } else {
    print_table(path, t, &s, (size_t)batches);
    if (ref_path) {
      printf("  reference %s (%s): top-10%% share %.3f (all domains summed), %.3f (per domain, "
             "mean);",
             ref_path, ref.model, ref.overall, ref.mean_domain);
      for (size_t i = 0; i < ref.n; i++) printf(" %s %.3f", ref.names[i], ref.shares[i]);
      printf("\n");
    }
  }
  if (plot_path && (rc = fig_trace_stats(plot_path, &s, &d))) {
    if (rc == ELDR_ENOTFOUND) cli_fail(cmd, "--plot: %s", d.msg);
    cli_fail(cmd, "--plot: gnuplot failed writing '%s' (%s)", plot_path, eldr_diag_msg(&d, rc));
  }
  eldr_tracestats_free(&s);
  free(sizes);
  free(sizes_l);
  free(cluster);
  eldr_artifact_free(a);
  eldr_trace_free(t);
  cli_trace_inputs_free(&tin);
  return 0;
}

int eldr_cmd_trace(int argc, char **argv) {
  if (argc < 2) {
    fputs(TRACE_HELP, stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    fputs(TRACE_HELP, stdout);
    return 0;
  }
  if (!strcmp(argv[1], "gen")) return trace_gen(argc - 1, argv + 1);
  if (!strcmp(argv[1], "stats")) return trace_stats(argc - 1, argv + 1);
  if (!strcmp(argv[1], "compact")) return eldr_cmd_trace_compact(argc - 1, argv + 1);
  if (!strcmp(argv[1], "split")) return eldr_cmd_trace_split(argc - 1, argv + 1);
  cli_usage_error("trace", "unknown subcommand '%s' (gen, stats, compact, split; see eldr trace --help)",
                  argv[1]);
}
