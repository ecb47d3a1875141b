/* cmd_demo.c — `eldr demo`: a whole xPyD cluster on loopback. Generates (or
 * loads) a trace, fits an artifact on one split, then for every policy starts
 * P prefill and D decode `eldr worker` processes and an `eldr serve` router
 * (subprocesses of this binary, on ephemeral ports), drives the other split
 * at a Poisson rate through the router with the load generator, stops them,
 * and prints TPOT p50/p99 and TTFT p50 per policy with ELDR's change against
 * the best load balancer — next to `eldr sim` on the same configuration.
 *
 * Every child runs in one process group of its own, with a parent-death
 * signal; SIGINT/SIGTERM/SIGHUP, failure and normal exit all kill that group. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "figures.h"
#include "eldr/plot.h"
#include "eldr/fit.h"
#include "eldr/loadgen.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"

static const char *CMD = "demo";

/* ---- child processes ---------------------------------------------------- */

#define MAX_CHILDREN 256
static volatile pid_t g_pgid = 0;
static volatile int g_stop = 0;
static pid_t g_children[MAX_CHILDREN];
static size_t g_nchildren;
static char g_exe[PATH_MAX];
static char g_tmp[PATH_MAX];
static int g_keep = 0;

static void kill_group(int sig) {
  if (g_pgid > 0) kill(-g_pgid, sig);
}

static void on_signal(int sig) {
  if (g_stop) { /* second signal: leave now */
    kill_group(SIGKILL);
    _exit(128 + sig);
  }
  g_stop = sig;
  kill_group(SIGTERM);
  static const char msg[] = "\neldr demo: interrupted, stopping every process it started\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Reap one child (bounded wait), SIGKILL if it does not exit. */
static void stop_child(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  double deadline = now_s() + 5;
  while (now_s() < deadline) {
    pid_t r = waitpid(pid, NULL, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) goto reaped;
    sleep_s(0.01);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
reaped:
  for (size_t i = 0; i < g_nchildren; i++)
    if (g_children[i] == pid) {
      g_children[i] = g_children[--g_nchildren];
      break;
    }
  if (!g_nchildren) g_pgid = 0; /* the group is gone with its last member */
}

static void stop_all_children(void) {
  kill_group(SIGTERM);
  while (g_nchildren) stop_child(g_children[g_nchildren - 1]);
}

static void cleanup(void) {
  stop_all_children();
  if (!g_tmp[0] || g_keep) return;
  /* the work directory holds only plain files the demo wrote */
  DIR *dir = opendir(g_tmp);
  if (dir) {
    struct dirent *e;
    char p[PATH_MAX + 300];
    while ((e = readdir(dir))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(p, sizeof p, "%s/%s", g_tmp, e->d_name);
      unlink(p);
    }
    closedir(dir);
  }
  rmdir(g_tmp);
}

_Noreturn static void demo_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void demo_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "eldr demo: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  /* a failure keeps the work directory (its processes.log says why) */
  if (!g_stop && g_tmp[0] && !g_keep) {
    g_keep = 1;
    fprintf(stderr, "eldr demo: work directory kept for inspection: %s\n", g_tmp);
  }
  cleanup();
  exit(g_stop ? 128 + g_stop : 1);
}

/* Fork `eldr <args...>` into the demo's process group (parent-death signal,
 * default signal dispositions) and register it. Its stdout goes to out_fd
 * when >= 0 (other_fd, if >= 0, is closed in the child), else to out_path
 * (or /dev/null); its stderr is appended to log_path (or inherited). */
static pid_t fork_child(char *const args[], int out_fd, int other_fd, const char *out_path,
                        const char *log_path) {
  if (g_nchildren == MAX_CHILDREN) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    setpgid(0, g_pgid > 0 ? g_pgid : 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    if (out_fd >= 0) {
      dup2(out_fd, 1);
      close(out_fd);
      if (other_fd >= 0) close(other_fd);
    } else {
      int of = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (of >= 0) dup2(of, 1);
    }
    if (log_path) {
      int lf = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (lf >= 0) dup2(lf, 2);
    }
    size_t n = 0;
    while (args[n]) n++;
    char **argv = calloc(n + 2, sizeof *argv);
    if (!argv) _exit(127);
    argv[0] = g_exe;
    for (size_t i = 0; i < n; i++) argv[i + 1] = args[i];
    execv(g_exe, argv);
    _exit(127);
  }
  if (g_pgid <= 0) g_pgid = pid;
  setpgid(pid, g_pgid);
  g_children[g_nchildren++] = pid;
  return pid;
}

/* Start `eldr <args...>` in the demo's process group. With line != NULL its
 * stdout is a pipe and the first line containing "listening on" is returned
 * (within timeout_s); stderr goes to log_path (or is inherited). */
static pid_t spawn(char *const args[], const char *log_path, char *line, size_t cap,
                   double timeout_s) {
  int pfd[2] = {-1, -1};
  if (line && pipe(pfd) < 0) return -1;
  pid_t pid = fork_child(args, pfd[1], pfd[0], NULL, log_path);
  if (pid < 0) {
    if (line) {
      close(pfd[0]);
      close(pfd[1]);
    }
    return -1;
  }
  if (!line) return pid;
  close(pfd[1]);
  size_t n = 0;
  char buf[512];
  line[0] = 0;
  double deadline = now_s() + timeout_s;
  int found = 0;
  while (!found && !g_stop) {
    double left = deadline - now_s();
    if (left <= 0) break;
    struct pollfd p = {pfd[0], POLLIN, 0};
    int pr = poll(&p, 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) break;
    char c;
    ssize_t k = read(pfd[0], &c, 1);
    if (k < 0 && errno == EINTR) continue;
    if (k != 1) break;
    if (c != '\n') {
      if (n + 1 < sizeof buf) buf[n++] = c;
      continue;
    }
    buf[n] = 0;
    if (strstr(buf, "listening on")) {
      snprintf(line, cap, "%s", buf);
      found = 1;
    }
    n = 0;
  }
  close(pfd[0]);
  if (!found) {
    stop_child(pid);
    return -1;
  }
  return pid;
}

/* Run `eldr <args...>` to completion; its stdout into out_path (or /dev/null). */
static int run_child(char *const args[], const char *out_path, const char *log_path) {
  pid_t pid = fork_child(args, -1, -1, out_path, log_path);
  if (pid < 0) return -1;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  for (size_t i = 0; i < g_nchildren; i++)
    if (g_children[i] == pid) {
      g_children[i] = g_children[--g_nchildren];
      break;
    }
  if (!g_nchildren) g_pgid = 0; /* the group is gone with its last member */
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- the run ------------------------------------------------------------ */

typedef struct prow {
  const char *policy;
  eldr_loadgen_summary s; /* seconds of wall time (scaled) */
  size_t sent, ok, failed;
  double sim_tpot_p50, sim_tpot_p99, sim_ttft_p50, sim_tpot_mean; /* ms of model time; NaN if absent */
  double batch, uni, sim_batch, sim_uni;            /* mean decode batch / per-layer union */
  double tok_ms; /* mean model step time per generated token on the decoders (ms) */
} prow;

/* GET http://127.0.0.1:port/metrics (bounded wait) and add the decode-step
 * counters of an eldr worker: steps, sum of batch sizes, sum of unions. */
static int scrape_worker(const char *url, double *steps, double *batch_sum, double *union_sum,
                         double *token_s) {
  const char *hp = strstr(url, "127.0.0.1:");
  if (!hp) return -1;
  int port = atoi(hp + 10);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char req[128];
  int rl = snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 || send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) {
    close(fd);
    return -1;
  }
  static char buf[1 << 16];
  size_t n = 0;
  double deadline = now_s() + 5;
  while (n + 1 < sizeof buf && now_s() < deadline) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
    if (k <= 0) break;
    n += (size_t)k;
  }
  close(fd);
  buf[n] = 0;
  const char *names[4] = {"eldr_worker_decode_steps_total{", "eldr_worker_decode_batch_sum{",
                          "eldr_worker_decode_union_experts_sum{",
                          "eldr_worker_decode_token_seconds_sum{"};
  double *out[4] = {steps, batch_sum, union_sum, token_s};
  for (int i = 0; i < 4; i++) {
    const char *q = strstr(buf, names[i]);
    const char *sp = q ? strchr(q, ' ') : NULL;
    if (!sp) return -1;
    *out[i] += strtod(sp + 1, NULL);
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: eldr demo [options]\n\n"
          "A whole PD-disaggregated cluster on this machine: P prefill and D decode `eldr worker`\n"
          "processes (emulated vLLM engines timed by the latency model) behind an `eldr serve`\n"
          "router, on loopback. It generates a trace, fits an artifact on one split, drives the\n"
          "other split at a Poisson rate through the router under each policy in turn (workers\n"
          "and router restarted for each), and prints TPOT p50/p99 and TTFT p50 per policy and\n"
          "ELDR's change against the best load balancer, next to `eldr sim` on the same\n"
          "configuration. Emulated time runs --time-scale times slower than the modelled GPU so\n"
          "that a small machine keeps up; the table reports model time (wall time / scale).\n\n"
          "options:\n"
          "  --model M          model preset (default qwen3-30b-a3b)\n"
          "  --hardware H       hardware preset (default h200)\n"
          "  --workload W       generated workload: task (default) or language\n"
          "  --trace T          use this JSONL trace instead of generating one (the model preset\n"
          "                     is taken from its shape unless --model is given)\n"
          "  --fit-requests N   generated requests to fit on (default 400)\n"
          "  --eval-requests N  generated requests to replay (default 200)\n"
          "  --fit-fraction F   with --trace: fraction fitted on, seeded split (default 0.6)\n"
          "  --max-decode N     cap generated output lengths (default 64)\n"
          "  --prefill P        prefill workers (default 2)\n"
          "  --decode D         decode workers (default 4)\n"
          "  --max-num-seqs B   decode batch limit per worker (default 64)\n"
          "  --rate R           arrivals per second of model time (default 100)\n"
          "  --time-scale S     emulated durations = model time x S (default 8)\n"
          "  --duration S       wall seconds of arrivals per policy (default 20)\n"
          "  --policies LIST    comma list of eldr, random, rr, jsq, p2c (default all five)\n"
          "  --seed N           seed of the trace, split, fit and arrivals (default 1)\n"
          "  --no-sim           do not run `eldr sim` for comparison\n"
          "  --plot FILE        write a bar chart with gnuplot (FILE ends in .png or .svg)\n"
          "  --keep             keep the work directory (traces, artifact, logs)\n"
          "  --help             this text\n\n"
          "Ctrl-C stops every process the demo started.\n");
}

static const char *preset_for_shape(const eldr_shape *s) {
  static const char *presets[] = {"qwen3-30b-a3b", "gpt-oss-120b", "qwen3-235b-a22b",
                                  "llama4-maverick", "olmoe-1b-7b"};
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
    eldr_shape p;
    if (eldr_tracegen_model_shape(presets[i], &p, NULL, 0, NULL) == 0 &&
        p.num_layers == s->num_layers && p.num_experts == s->num_experts && p.top_k == s->top_k)
      return presets[i];
  }
  return NULL;
}

static int save_subset(const eldr_trace *t, const size_t *idx, size_t n, const char *path,
                       eldr_diag *d) {
  eldr_trace *o = eldr_trace_new(t->model, &t->shape, t->layer_ids);
  if (!o) return ELDR_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const eldr_request *q = &t->req[idx[i]];
    const char *dom = q->domain >= 0 ? t->domains[q->domain] : NULL;
    if (eldr_trace_append(o, q->id, dom, q->prompt, q->arrival, q->prefill, q->n_prefill, q->decode,
                          q->n_decode, q->prefill_gates) < 0) {
      eldr_trace_free(o);
      return ELDR_ENOMEM;
    }
  }
  int rc = eldr_trace_save(path, o, d);
  eldr_trace_free(o);
  return rc;
}

static void progress_cb(void *ctx, size_t sent, size_t done, double el) {
  const char *pol = ctx;
  if (!cli_stderr_tty()) return;
  fprintf(stderr, "\r  %-6s %4.0f s: %zu sent, %zu done   ", pol, el, sent, done);
  fflush(stderr);
}

static double pct(double x, double base) { return (x / base - 1.0) * 100.0; }

int eldr_cmd_demo(int argc, char **argv) {
  const char *model = NULL, *hardware = "h200", *workload = "task", *trace_path = NULL;
  const char *plot = NULL, *policies_arg = "eldr,random,rr,jsq,p2c";
  long n_fit = 400, n_eval = 200, max_decode = 64, P = 2, D = 4, max_seqs = 64;
  double fit_fraction = 0.6, rate = 100, scale = 8, duration = 20;
  uint64_t seed = 1;
  int do_sim = 1;
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'},       {"hardware", required_argument, 0, 'H'},
      {"workload", required_argument, 0, 'w'},    {"trace", required_argument, 0, 't'},
      {"fit-requests", required_argument, 0, 'f'}, {"eval-requests", required_argument, 0, 'e'},
      {"fit-fraction", required_argument, 0, 'F'}, {"max-decode", required_argument, 0, 'x'},
      {"prefill", required_argument, 0, 'P'},     {"decode", required_argument, 0, 'D'},
      {"max-num-seqs", required_argument, 0, 'B'}, {"rate", required_argument, 0, 'r'},
      {"time-scale", required_argument, 0, 's'},  {"duration", required_argument, 0, 'd'},
      {"policies", required_argument, 0, 'p'},    {"seed", required_argument, 0, 'S'},
      {"no-sim", no_argument, 0, 'N'},            {"plot", required_argument, 0, 'o'},
      {"keep", no_argument, 0, 'k'},              {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  cli_getopt_reset();
  int o;
  while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (o) {
    case 'm': model = optarg; break;
    case 'H': hardware = optarg; break;
    case 'w': workload = optarg; break;
    case 't': trace_path = optarg; break;
    case 'f': n_fit = cli_parse_long(CMD, "--fit-requests", optarg, 8, 1000000); break;
    case 'e': n_eval = cli_parse_long(CMD, "--eval-requests", optarg, 1, 1000000); break;
    case 'F': fit_fraction = cli_parse_double(CMD, "--fit-fraction", optarg, 0.05, 0.95); break;
    case 'x': max_decode = cli_parse_long(CMD, "--max-decode", optarg, 1, 1 << 20); break;
    case 'P': P = cli_parse_long(CMD, "--prefill", optarg, 1, 32); break;
    case 'D': D = cli_parse_long(CMD, "--decode", optarg, 1, 64); break;
    case 'B': max_seqs = cli_parse_long(CMD, "--max-num-seqs", optarg, 1, 4096); break;
    case 'r': rate = cli_parse_double(CMD, "--rate", optarg, 0.01, 1e5); break;
    case 's': scale = cli_parse_double(CMD, "--time-scale", optarg, 0.01, 1000); break;
    case 'd': duration = cli_parse_double(CMD, "--duration", optarg, 0.5, 3600); break;
    case 'p': policies_arg = optarg; break;
    case 'S': seed = cli_parse_u64(CMD, "--seed", optarg); break;
    case 'N': do_sim = 0; break;
    case 'o':
      if (!eldr_plot_terminal(optarg)) cli_usage_error(CMD, "--plot: '%s' must end in .png or .svg", optarg);
      plot = optarg;
      break;
    case 'k': g_keep = 1; break;
    case 'h': usage(stdout); return 0;
    default: cli_bad_option(CMD, argc, argv, o);
    }
  }
  if (optind < argc) cli_usage_error(CMD, "unexpected argument '%s' (see --help)", argv[optind]);
  /* policies */
  const char *known[] = {"eldr", "random", "rr", "jsq", "p2c"};
  const char *pols[8];
  size_t npol = 0;
  {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", policies_arg);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
      size_t k = 0;
      while (k < 5 && strcmp(tok, known[k])) k++;
      if (k == 5) cli_usage_error(CMD, "--policies: unknown policy '%s' (eldr, random, rr, jsq, p2c)", tok);
      for (size_t j = 0; j < npol; j++)
        if (pols[j] == known[k]) cli_usage_error(CMD, "--policies: '%s' given twice", tok);
      if (npol < 8) pols[npol++] = known[k];
    }
  }
  if (!npol) cli_usage_error(CMD, "--policies: empty list");
  ssize_t el = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
  if (el <= 0) cli_fail(CMD, "cannot find this program's path (/proc/self/exe)");
  g_exe[el] = 0;

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  const double t_start = now_s();
  snprintf(g_tmp, sizeof g_tmp, "%s/eldr-demo-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_tmp)) {
    g_tmp[0] = 0;
    cli_fail(CMD, "cannot create a work directory: %s", strerror(errno));
  }
  char fit_path[PATH_MAX + 32], eval_path[PATH_MAX + 32], art_path[PATH_MAX + 32],
      log_path[PATH_MAX + 32], sim_path[PATH_MAX + 32];
  snprintf(fit_path, sizeof fit_path, "%s/fit.jsonl", g_tmp);
  snprintf(eval_path, sizeof eval_path, "%s/eval.jsonl", g_tmp);
  snprintf(art_path, sizeof art_path, "%s/artifact.json", g_tmp);
  snprintf(log_path, sizeof log_path, "%s/processes.log", g_tmp);
  snprintf(sim_path, sizeof sim_path, "%s/sim.json", g_tmp);
  fprintf(stderr, "eldr demo: work directory %s%s\n", g_tmp, g_keep ? " (kept)" : "");

  /* 1. the trace and its two splits */
  eldr_diag d = {{0}};
  eldr_trace *all = NULL;
  size_t *idx = NULL, nfit = 0, neval = 0;
  if (trace_path) {
    fprintf(stderr, "eldr demo: [1/4] loading %s\n", trace_path);
    int rc = eldr_trace_load(trace_path, &all, &d);
    if (rc < 0) demo_fail("--trace: %s", eldr_diag_msg(&d, rc));
    if (all->n < 4) demo_fail("--trace: %zu requests; need at least 4 to split", all->n);
    if (!model) model = preset_for_shape(&all->shape);
    if (!model)
      demo_fail("--trace: no model preset has its shape (%u layers, %u experts, top-%u); pass --model",
                all->shape.num_layers, all->shape.num_experts, all->shape.top_k);
    /* seeded random split */
    idx = malloc(all->n * sizeof *idx);
    if (!idx) demo_fail("out of memory");
    eldr_fit_shuffle(idx, all->n, seed); /* the split eldr fit and eldr sim use */
    nfit = (size_t)(fit_fraction * (double)all->n);
    if (nfit < 2) nfit = 2;
    if (nfit > all->n - 1) nfit = all->n - 1;
    neval = all->n - nfit;
  } else {
    if (!model) model = "qwen3-30b-a3b";
    fprintf(stderr, "eldr demo: [1/4] generating %ld + %ld requests (%s, workload %s, seed %llu)\n",
            n_fit, n_eval, model, workload, (unsigned long long)seed);
    eldr_shape sh;
    char canon[64];
    int rc = eldr_tracegen_model_shape(model, &sh, canon, sizeof canon, &d);
    if (rc < 0) demo_fail("--model: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen *g = NULL;
    rc = eldr_tracegen_new(&sh, canon, workload, seed, &g, &d);
    if (rc < 0) demo_fail("--workload: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen_set_lengths(g, 0, (uint32_t)max_decode, 0);
    rc = eldr_tracegen_generate(g, (size_t)(n_fit + n_eval), &all, &d);
    eldr_tracegen_free(g);
    if (rc < 0) demo_fail("trace generation: %s", eldr_diag_msg(&d, rc));
    idx = malloc(all->n * sizeof *idx);
    if (!idx) demo_fail("out of memory");
    for (size_t i = 0; i < all->n; i++) idx[i] = i;
    nfit = (size_t)n_fit;
    neval = (size_t)n_eval;
  }
  if (save_subset(all, idx, nfit, fit_path, &d) < 0 || save_subset(all, idx + nfit, neval, eval_path, &d) < 0)
    demo_fail("cannot write the trace splits: %s", d.msg);
  free(idx);
  eldr_trace_free(all);
  eldr_trace *eval = NULL;
  if (eldr_trace_load(eval_path, &eval, &d) < 0) demo_fail("cannot re-read %s: %s", eval_path, d.msg);

  /* 2. fit */
  fprintf(stderr, "eldr demo: [2/4] fitting the artifact on %zu requests for %ld decoders\n", nfit, D);
  char dbuf[32], seedbuf[32];
  snprintf(dbuf, sizeof dbuf, "%ld", D);
  snprintf(seedbuf, sizeof seedbuf, "%llu", (unsigned long long)seed);
  {
    char *args[] = {"fit", "--trace", fit_path, "--decoders", dbuf, "-o", art_path, "--seed", seedbuf,
                    "-q", NULL};
    int rc = run_child(args, NULL, log_path);
    if (g_stop) demo_fail("interrupted");
    if (rc != 0) demo_fail("eldr fit failed (exit %d); see %s", rc, log_path);
  }

  /* 3. one cluster per policy */
  const double lg_rate = rate / scale;
  fprintf(stderr,
          "eldr demo: [3/4] %ld prefill + %ld decode workers (%s on %s, time scale %g) and the "
          "router, %.3g req/s of model time (%.3g req/s wall) for %g s per policy\n",
          P, D, model, hardware, scale, rate, lg_rate, duration);
  prow rows[8];
  memset(rows, 0, sizeof rows);
  size_t sched_n = 0, *sched_idx = NULL;
  double *sched_t = NULL;
  char scalebuf[32], seqbuf[32];
  snprintf(scalebuf, sizeof scalebuf, "%g", scale);
  snprintf(seqbuf, sizeof seqbuf, "%ld", max_seqs);
  for (size_t pi = 0; pi < npol && !g_stop; pi++) {
    rows[pi].policy = pols[pi];
    rows[pi].sim_tpot_p50 = rows[pi].sim_tpot_p99 = rows[pi].sim_ttft_p50 = NAN;
    rows[pi].sim_batch = rows[pi].sim_uni = rows[pi].sim_tpot_mean = NAN;
    /* workers */
    char urls[2][64][48];
    for (int role = 0; role < 2; role++) {
      long n = role ? D : P;
      for (long i = 0; i < n; i++) {
        char line[512];
        char *args[] = {"worker", "--role", role ? "decode" : "prefill", "--model", (char *)model,
                        "--hardware", (char *)hardware, "--trace", eval_path, "--port", "0",
                        "--time-scale", scalebuf, "--max-num-seqs", seqbuf, NULL};
        if (spawn(args, log_path, line, sizeof line, 60) < 0)
          demo_fail("a %s worker did not start (see %s)", role ? "decode" : "prefill", log_path);
        const char *u = strstr(line, "http://");
        if (!u) demo_fail("unexpected worker output: %s", line);
        snprintf(urls[role][i], sizeof urls[role][i], "%.*s", (int)strcspn(u, " "), u);
      }
    }
    /* the router */
    char *sargs[2 * 64 + 2 * 32 + 16];
    size_t na = 0;
    sargs[na++] = "serve";
    for (long i = 0; i < P; i++) sargs[na++] = "--prefill", sargs[na++] = urls[0][i];
    for (long i = 0; i < D; i++) sargs[na++] = "--decode", sargs[na++] = urls[1][i];
    sargs[na++] = "--artifact";
    sargs[na++] = art_path;
    sargs[na++] = "--policy";
    sargs[na++] = (char *)pols[pi];
    sargs[na++] = "--seed";
    sargs[na++] = seedbuf;
    sargs[na++] = "--port";
    sargs[na++] = "0";
    sargs[na++] = "--quiet";
    sargs[na] = NULL;
    char line[512];
    pid_t sp = spawn(sargs, log_path, line, sizeof line, 30);
    if (sp < 0) demo_fail("the router did not start (see %s)", log_path);
    const char *hp = strstr(line, "127.0.0.1:");
    if (!hp) demo_fail("unexpected router output: %s", line);
    char target[64];
    snprintf(target, sizeof target, "http://127.0.0.1:%d", atoi(hp + 10));
    /* the load */
    eldr_loadgen_config lc;
    eldr_loadgen_config_default(&lc);
    lc.target = target;
    lc.trace = eval;
    lc.rate = lg_rate;
    lc.duration_s = duration;
    lc.seed = seed;
    lc.drain_s = 120;
    lc.timeout_s = 60;
    lc.stop = &g_stop;
    lc.progress = progress_cb;
    lc.progress_ctx = (void *)pols[pi];
    eldr_loadgen_result r;
    int rc = eldr_loadgen_run(&lc, &r, &d);
    if (cli_stderr_tty()) fprintf(stderr, "\r%60s\r", "");
    if (rc < 0) demo_fail("load generator: %s", eldr_diag_msg(&d, rc));
    eldr_loadgen_summarize(&r, &rows[pi].s);
    if (pi == 0 && r.n) { /* the schedule the simulator replays */
      sched_n = r.n;
      sched_idx = malloc(r.n * sizeof *sched_idx);
      sched_t = malloc(r.n * sizeof *sched_t);
      if (!sched_idx || !sched_t) demo_fail("out of memory");
      for (size_t i = 0; i < r.n; i++) {
        sched_idx[i] = r.recs[i].trace_index;
        sched_t[i] = r.recs[i].send_s / scale;
      }
    }
    rows[pi].sent = r.n;
    rows[pi].ok = r.ok;
    rows[pi].failed = r.n - r.ok;
    double steps = 0, bsum = 0, usum = 0, tsum = 0;
    int scraped = 1;
    for (long i = 0; i < D; i++)
      if (scrape_worker(urls[1][i], &steps, &bsum, &usum, &tsum) < 0) scraped = 0;
    rows[pi].tok_ms = scraped && bsum > 0 ? tsum / bsum / scale * 1e3 : NAN;
    rows[pi].batch = scraped && steps > 0 ? bsum / steps : NAN;
    rows[pi].uni = scraped && steps > 0 ? usum / steps : NAN;
    fprintf(stderr,
            "  %-6s %zu requests, %zu ok; TPOT p50 %.3f ms, mean %.3f ms; decoders' model time per "
            "token %.3f ms\n",
            pols[pi], r.n, r.ok, rows[pi].s.tpot_p50 / scale * 1e3, rows[pi].s.tpot_mean / scale * 1e3,
            rows[pi].tok_ms);
    if (r.n > r.ok) {
      for (size_t i = 0; i < r.n; i++)
        if (!r.recs[i].ok) {
          fprintf(stderr, "    first failure: %s\n", r.recs[i].error);
          break;
        }
    }
    eldr_loadgen_result_free(&r);
    stop_all_children();
  }
  if (g_stop) demo_fail("interrupted");
  size_t sent_per_policy = rows[0].sent;

  /* 4. the simulator on the same configuration */
  int have_sim = 0;
  if (do_sim && sched_n > 0) {
    /* the same load as the demo: the requests it sent, in its order, at the
     * times it sent them (model time), replayed with --arrivals trace */
    char sent_path[PATH_MAX + 32];
    snprintf(sent_path, sizeof sent_path, "%s/sent.jsonl", g_tmp);
    eldr_trace *sent = eldr_trace_new(eval->model, &eval->shape, eval->layer_ids);
    if (!sent) demo_fail("out of memory");
    for (size_t i = 0; i < sched_n; i++) {
      const eldr_request *q = &eval->req[sched_idx[i]];
      char id[360];
      snprintf(id, sizeof id, "%.300s#%zu", q->id, i);
      const char *dom = q->domain >= 0 ? eval->domains[q->domain] : NULL;
      if (eldr_trace_append(sent, id, dom, NULL, sched_t[i], q->prefill, q->n_prefill, q->decode,
                            q->n_decode, q->prefill_gates) < 0)
        demo_fail("out of memory");
    }
    if (eldr_trace_save(sent_path, sent, &d) < 0) demo_fail("cannot write %s: %s", sent_path, d.msg);
    eldr_trace_free(sent);
    fprintf(stderr,
            "eldr demo: [4/4] eldr sim on the same configuration and the same %zu arrivals "
            "(request and time)\n",
            sched_n);
    char pbuf[16], polbuf[128];
    snprintf(pbuf, sizeof pbuf, "%ld", P);
    snprintf(polbuf, sizeof polbuf, "%s", policies_arg);
    char *args[] = {"sim", "--trace", sent_path, "--artifact", art_path, "--arrivals", "trace",
                    "--prefill", pbuf, "--decode", dbuf, "--max-batch", seqbuf, "--model",
                    (char *)model, "--hardware", (char *)hardware, "--policies", polbuf, "--seed",
                    seedbuf, "--json", "-q", NULL};
    int rc = run_child(args, sim_path, log_path);
    if (g_stop) demo_fail("interrupted");
    json_t *j = rc == 0 ? json_load_file(sim_path, 0, NULL) : NULL;
    json_t *srows = json_object_get(j, "rows");
    size_t i;
    json_t *row;
    json_array_foreach(srows, i, row) {
      const char *pol = json_string_value(json_object_get(row, "policy"));
      for (size_t k = 0; pol && k < npol; k++)
        if (!strcmp(pol, rows[k].policy)) {
          rows[k].sim_tpot_p50 = json_number_value(json_object_get(row, "tpot_p50_ms"));
          rows[k].sim_tpot_p99 = json_number_value(json_object_get(row, "tpot_p99_ms"));
          rows[k].sim_ttft_p50 = json_number_value(json_object_get(row, "ttft_p50_ms"));
          rows[k].sim_tpot_mean = json_number_value(json_object_get(row, "tpot_mean_ms"));
          rows[k].sim_batch = json_number_value(json_object_get(row, "mean_batch"));
          rows[k].sim_uni = json_number_value(json_object_get(row, "mean_union"));
          have_sim = 1;
        }
    }
    json_decref(j);
    if (!have_sim) fprintf(stderr, "eldr demo: eldr sim gave no result (exit %d); see %s\n", rc, log_path);
  }

  /* the table: model time (wall / scale), ms */
  printf("\neldr demo: %ldP%ldD, %s on %s, %zu requests per policy at %g req/s (model time; "
         "realised %.4g), max %s seqs per decoder\n",
         P, D, model, hardware, sent_per_policy, rate, (double)sent_per_policy / (duration / scale),
         seqbuf);
  printf("times are model time in ms = wall time / %g (the workers ran %gx slower than the "
         "modelled GPU)\n\n",
         scale, scale);
  printf("%-8s %8s %8s %8s %8s %8s %6s %6s |%8s %8s %8s %8s %6s %6s\n", "", "", "demo", "", "", "",
         "", "", "sim", "", "", "", "", "");
  printf("%-8s %8s %8s %8s %8s %8s %6s %6s |%8s %8s %8s %8s %6s %6s\n", "policy", "ok/sent",
         "TPOT p50", "TPOT p99", "mean", "TTFT p50", "batch", "union", "TPOT p50", "TPOT p99", "mean",
         "TTFT p50", "batch", "union");
  int eldr_i = -1;
  for (size_t k = 0; k < npol; k++) {
    const prow *w = &rows[k];
    char okb[32];
    snprintf(okb, sizeof okb, "%zu/%zu", w->ok, w->sent);
    printf("%-8s %8s %8.3f %8.3f %8.3f %8.2f %6.2f %6.2f |%8.3f %8.3f %8.3f %8.2f %6.2f %6.2f\n",
           w->policy, okb, w->s.tpot_p50 / scale * 1e3, w->s.tpot_p99 / scale * 1e3,
           w->s.tpot_mean / scale * 1e3, w->s.ttft_p50 / scale * 1e3, w->batch, w->uni,
           w->sim_tpot_p50, w->sim_tpot_p99, w->sim_tpot_mean, w->sim_ttft_p50, w->sim_batch,
           w->sim_uni);
    if (!strcmp(w->policy, "eldr")) eldr_i = (int)k;
  }
  /* ELDR against the best load balancer, per metric (smaller is better) */
  enum { M_P50, M_P99, M_MEAN, M_TTFT, M_N };
  const char *mname[M_N] = {"TPOT p50", "TPOT p99", "TPOT mean", "TTFT p50"};
  for (int src = 0; src < 2 && eldr_i >= 0; src++) {
    if (src == 1 && !have_sim) break;
    printf(src ? "eldr sim, same configuration:  " : "\nELDR vs the best load balancer:");
    for (int m = 0; m < M_N; m++) {
      double ev = 0, best = INFINITY;
      const char *bp = NULL;
      for (size_t k = 0; k < npol; k++) {
        const prow *w = &rows[k];
        double v = src == 0 ? (m == M_P50    ? w->s.tpot_p50
                               : m == M_P99  ? w->s.tpot_p99
                               : m == M_MEAN ? w->s.tpot_mean
                                             : w->s.ttft_p50)
                            : (m == M_P50    ? w->sim_tpot_p50
                               : m == M_P99  ? w->sim_tpot_p99
                               : m == M_MEAN ? w->sim_tpot_mean
                                             : w->sim_ttft_p50);
        if ((int)k == eldr_i) ev = v;
        else if (!isnan(v) && v < best) best = v, bp = w->policy;
      }
      if (bp && !isnan(ev)) printf(" %s %+.1f%% (vs %s)%s", mname[m], pct(ev, best), bp, m + 1 < M_N ? "," : "");
    }
    printf("\n");
  }
  printf("(negative = ELDR faster; total %.0f s)\n", now_s() - t_start);

  if (plot) {
    const char *names[8];
    double p50[8], mean[8], p99[8];
    for (size_t k = 0; k < npol; k++) {
      names[k] = rows[k].policy;
      p50[k] = rows[k].s.tpot_p50 / scale * 1e3;
      mean[k] = rows[k].s.tpot_mean / scale * 1e3;
      p99[k] = rows[k].s.tpot_p99 / scale * 1e3;
    }
    char title[256];
    snprintf(title, sizeof title, "eldr demo: %ldP%ldD %s on %s, %g req/s (model time, scale %g)", P,
             D, model, hardware, rate, scale);
    int rc = fig_demo(plot, title, npol, names, p50, mean, p99, &d);
    if (rc)
      fprintf(stderr, "eldr demo: --plot: %s\n", eldr_diag_msg(&d, rc));
    else
      fprintf(stderr, "eldr demo: plot written to %s\n", plot);
  }
  free(sched_idx);
  free(sched_t);
  eldr_trace_free(eval);
  cleanup();
  return 0;
}
