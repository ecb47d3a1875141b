/* cluster.c — the local-cluster supervisor of `eldr demo` (see
 * eldr/cluster.h): children in one process group, readiness by their
 * "listening on" line, /metrics read with the net layer's HTTP client
 * (eldr/http_fetch.h). */
#include "eldr/cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "eldr/child.h"
#include "eldr/clock.h"
#include "eldr/http_fetch.h"

#define MAX_CHILDREN (2 * ELDR_CLUSTER_MAX_WORKERS + 8)

struct eldr_cluster {
  char exe[PATH_MAX];
  char *log_path;
  const volatile int *stop;
  volatile pid_t pgid; /* read by eldr_cluster_kill_async */
  pid_t children[MAX_CHILDREN];
  size_t n;
  char urls[2][ELDR_CLUSTER_MAX_WORKERS][48]; /* prefill, decode worker URLs */
  char boot[ELDR_CLUSTER_MAX_WORKERS][8];      /* SGLang prefills' bootstrap ports */
  size_t n_urls[2];
  char routers[ELDR_CLUSTER_MAX_ROUTERS][48]; /* router replica URLs */
  const char *router_ptrs[ELDR_CLUSTER_MAX_ROUTERS];
  size_t n_routers;
  pid_t natsd;          /* the bus's nats-server, or 0 */
  char bus_url[48];
};

size_t eldr_cluster_routers(const eldr_cluster *c, const char *const **urls) {
  *urls = c->router_ptrs;
  return c->n_routers;
}

static int stopping(const eldr_cluster *c) { return c->stop && *c->stop; }

int eldr_cluster_new(const char *exe, const char *log_path, const volatile int *stop,
                     eldr_cluster **out, eldr_diag *d) {
  eldr_cluster *c = calloc(1, sizeof *c);
  if (!c) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  if (exe) {
    if (strlen(exe) >= sizeof c->exe) {
      free(c);
      return eldr_diag_fail(d, ELDR_EINVAL, "program path too long");
    }
    snprintf(c->exe, sizeof c->exe, "%s", exe);
  } else {
    ssize_t el = readlink("/proc/self/exe", c->exe, sizeof c->exe - 1);
    if (el <= 0) {
      free(c);
      return eldr_diag_fail(d, ELDR_EIO, "cannot find this program's path (/proc/self/exe)");
    }
    c->exe[el] = 0;
  }
  if (log_path && !(c->log_path = strdup(log_path))) {
    free(c);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  c->stop = stop;
  *out = c;
  return 0;
}

void eldr_cluster_kill_async(eldr_cluster *c, int sig) {
  if (c && c->pgid > 0) kill(-c->pgid, sig);
}

static void forget(eldr_cluster *c, pid_t pid) {
  for (size_t i = 0; i < c->n; i++)
    if (c->children[i] == pid) {
      c->children[i] = c->children[--c->n];
      break;
    }
  if (!c->n) c->pgid = 0; /* the group is gone with its last member */
}

void eldr_cluster_stop_all(eldr_cluster *c) {
  if (!c) return;
  eldr_cluster_kill_async(c, SIGTERM);
  while (c->n) {
    pid_t pid = c->children[c->n - 1];
    eldr_child_stop(pid, 5);
    forget(c, pid);
  }
  c->natsd = 0;
  c->n_urls[0] = c->n_urls[1] = 0;
}

void eldr_cluster_free(eldr_cluster *c) {
  if (!c) return;
  eldr_cluster_stop_all(c);
  free(c->log_path);
  free(c);
}

/* Fork `eldr <args...>` into the group; stdout to out_fd (>= 0; other_fd
 * closed in the child) or out_path (NULL: /dev/null). */
static int fork_child(eldr_cluster *c, char *const args[], int out_fd, int other_fd,
                      const char *out_path, pid_t *pid, eldr_diag *d) {
  if (c->n == MAX_CHILDREN) return eldr_diag_fail(d, ELDR_EINVAL, "too many processes");
  char *argv[4 * ELDR_CLUSTER_MAX_WORKERS + 32]; /* the router's: two per worker, a few more */
  size_t n = 0;
  argv[n++] = c->exe;
  for (size_t i = 0; args[i]; i++) {
    if (n + 1 >= sizeof argv / sizeof argv[0]) return eldr_diag_fail(d, ELDR_EINVAL, "too many arguments");
    argv[n++] = args[i];
  }
  argv[n] = NULL;
  eldr_child_opts o;
  eldr_child_opts_default(&o);
  o.stdout_fd = out_fd;
  o.close_fd = other_fd;
  o.stdout_path = out_path;
  o.stdout_null = 1;
  o.stderr_path = c->log_path;
  o.pgid = c->pgid > 0 ? c->pgid : 0;
  o.pdeath_signal = SIGTERM;
  o.default_signals = 1;
  int rc = eldr_child_spawn(argv, &o, pid, NULL, d);
  if (rc) return rc;
  if (c->pgid <= 0) c->pgid = *pid;
  c->children[c->n++] = *pid;
  return 0;
}

int eldr_cluster_spawn(eldr_cluster *c, char *const args[], double timeout_s, char *line,
                       size_t cap, eldr_diag *d) {
  int pfd[2];
  if (pipe(pfd) < 0) return eldr_diag_fail(d, ELDR_EIO, "pipe: %s", strerror(errno));
  fcntl(pfd[0], F_SETFD, FD_CLOEXEC);
  fcntl(pfd[1], F_SETFD, FD_CLOEXEC);
  pid_t pid;
  int rc = fork_child(c, args, pfd[1], pfd[0], NULL, &pid, d);
  close(pfd[1]);
  if (rc) {
    close(pfd[0]);
    return rc;
  }
  size_t n = 0;
  char buf[512];
  line[0] = 0;
  double deadline = eldr_clock_now() + timeout_s;
  int found = 0;
  while (!found && !stopping(c)) {
    double left = deadline - eldr_clock_now();
    if (left <= 0) break;
    struct pollfd p = {pfd[0], POLLIN, 0};
    int pr = poll(&p, 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) break;
    char ch;
    ssize_t k = read(pfd[0], &ch, 1);
    if (k < 0 && errno == EINTR) continue;
    if (k != 1) break;
    if (ch != '\n') {
      if (n + 1 < sizeof buf) buf[n++] = ch;
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
    eldr_child_stop(pid, 5);
    forget(c, pid);
    return eldr_diag_fail(d, ELDR_EIO, "eldr %s did not start (see %s)", args[0],
                          c->log_path ? c->log_path : "its stderr");
  }
  return 0;
}

int eldr_cluster_run(eldr_cluster *c, char *const args[], const char *out_path, int *code,
                     eldr_diag *d) {
  pid_t pid;
  int rc = fork_child(c, args, -1, -1, out_path, &pid, d);
  if (rc) return rc;
  rc = eldr_child_wait(pid, -1, code);
  forget(c, pid);
  return rc ? eldr_diag_fail(d, ELDR_EIO, "eldr %s: lost the child", args[0]) : 0;
}

/* nats-server on a free loopback port, ready once it greets a connection
 * with its INFO line (10 s). */
static int start_natsd(eldr_cluster *c, eldr_diag *d) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &al)) {
    if (fd >= 0) close(fd);
    return eldr_diag_fail(d, ELDR_EIO, "no free port for nats-server");
  }
  close(fd);
  int port = ntohs(a.sin_port);
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  char *argv[] = {"nats-server", "-a", "127.0.0.1", "-p", ps, NULL};
  eldr_child_opts o;
  eldr_child_opts_default(&o);
  o.stdout_null = 1;
  o.stderr_path = c->log_path;
  o.pgid = c->pgid > 0 ? c->pgid : 0;
  o.pdeath_signal = SIGTERM;
  o.default_signals = 1;
  pid_t pid;
  int rc = eldr_child_spawn(argv, &o, &pid, NULL, d);
  if (rc) return rc;
  if (c->pgid <= 0) c->pgid = pid;
  c->children[c->n++] = pid;
  c->natsd = pid;
  for (double end = eldr_clock_now() + 10; eldr_clock_now() < end && !stopping(c);) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char buf[4] = "";
    struct timeval tv = {1, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int ok = s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0 && recv(s, buf, 4, MSG_WAITALL) == 4 &&
             !memcmp(buf, "INFO", 4);
    if (s >= 0) close(s);
    if (ok) {
      snprintf(c->bus_url, sizeof c->bus_url, "nats://127.0.0.1:%d", port);
      return 0;
    }
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
  return eldr_diag_fail(d, ELDR_EIO, "nats-server did not start on 127.0.0.1:%d (is it installed? see %s)", port,
                        c->log_path ? c->log_path : "stderr");
}

int eldr_cluster_kill_bus(eldr_cluster *c) {
  if (!c->natsd) return ELDR_ENOTFOUND;
  kill(c->natsd, SIGKILL);
  eldr_child_stop(c->natsd, 5);
  forget(c, c->natsd);
  c->natsd = 0;
  return 0;
}

int eldr_cluster_up(eldr_cluster *c, const eldr_cluster_spec *s, char *target, size_t cap,
                    eldr_diag *d) {
  if (s->n_prefill < 1 || s->n_prefill > ELDR_CLUSTER_MAX_WORKERS || s->n_decode < 1 ||
      s->n_decode > ELDR_CLUSTER_MAX_WORKERS)
    return eldr_diag_fail(d, ELDR_EINVAL, "1..%d workers of each role", ELDR_CLUSTER_MAX_WORKERS);
  char scalebuf[32], seqbuf[32], seedbuf[32];
  snprintf(scalebuf, sizeof scalebuf, "%g", s->time_scale);
  snprintf(seqbuf, sizeof seqbuf, "%zu", s->max_num_seqs);
  snprintf(seedbuf, sizeof seedbuf, "%llu", (unsigned long long)s->seed);
  double wt = s->worker_timeout_s > 0 ? s->worker_timeout_s : 60;
  double rt = s->router_timeout_s > 0 ? s->router_timeout_s : 30;
  c->n_urls[0] = c->n_urls[1] = 0;
  c->n_routers = 0;
  c->natsd = 0;
  size_t nr = s->n_routers ? s->n_routers : 1;
  if (nr > ELDR_CLUSTER_MAX_ROUTERS)
    return eldr_diag_fail(d, ELDR_EINVAL, "1..%d routers", ELDR_CLUSTER_MAX_ROUTERS);
  char scrapebuf[32];
  snprintf(scrapebuf, sizeof scrapebuf, "%g", s->scrape_interval);
  int sgl = 0;
  if (s->pd && strcmp(s->pd, "vllm")) {
    if (!strcmp(s->pd, "sglang")) sgl = 1;
    else if (!strcmp(s->pd, "sglang-exact")) sgl = 2;
    else return eldr_diag_fail(d, ELDR_EINVAL, "pd '%s' is not vllm, sglang or sglang-exact", s->pd);
  }
  for (int role = 0; role < 2; role++) {
    size_t n = role ? s->n_decode : s->n_prefill;
    for (size_t i = 0; i < n; i++) {
      char line[512];
      char *args[24] = {"worker", "--role", role ? "decode" : "prefill", "--model", (char *)s->model,
                        "--hardware", (char *)s->hardware, "--trace", (char *)s->trace_path, "--port",
                        "0", "--time-scale", scalebuf, "--max-num-seqs", seqbuf,
                        "--enable-prompt-tokens-details", NULL};
      size_t k = 16;
      if (sgl) { /* SGLang engines; a prefill's bootstrap server on a free port */
        args[k++] = "--engine", args[k++] = "sglang";
        if (!role) args[k++] = "--bootstrap-port", args[k++] = "0";
        if (!role && sgl == 2) args[k++] = "--exact";
        args[k] = NULL;
      }
      int rc = eldr_cluster_spawn(c, args, wt, line, sizeof line, d);
      if (rc)
        return eldr_diag_fail(d, rc, "a %s worker did not start (see %s)",
                              role ? "decode" : "prefill", c->log_path ? c->log_path : "stderr");
      const char *u = strstr(line, "http://");
      if (!u) return eldr_diag_fail(d, ELDR_EPARSE, "unexpected worker output: %s", line);
      snprintf(c->urls[role][i], sizeof c->urls[role][i], "%.*s", (int)strcspn(u, " "), u);
      if (sgl && !role) {
        const char *b = strstr(line, " bootstrap=");
        if (!b) return eldr_diag_fail(d, ELDR_EPARSE, "no bootstrap port in: %s", line);
        snprintf(c->boot[i], sizeof c->boot[i], "%.*s", (int)strspn(b + 11, "0123456789"), b + 11);
      }
      c->n_urls[role] = i + 1;
    }
  }
  char *sargs[3 * 2 * ELDR_CLUSTER_MAX_WORKERS + 24];
  size_t na = 0;
  sargs[na++] = "serve";
  for (size_t i = 0; i < s->n_prefill; i++) {
    sargs[na++] = "--prefill", sargs[na++] = c->urls[0][i];
    if (sgl) sargs[na++] = c->boot[i]; /* --prefill URL PORT, as SGLang's gateway takes it */
  }
  for (size_t i = 0; i < s->n_decode; i++) sargs[na++] = "--decode", sargs[na++] = c->urls[1][i];
  if (sgl) sargs[na++] = "--pd", sargs[na++] = (char *)s->pd;
  sargs[na++] = "--artifact";
  sargs[na++] = (char *)s->artifact_path;
  sargs[na++] = "--policy";
  sargs[na++] = (char *)s->policy;
  sargs[na++] = "--seed";
  sargs[na++] = seedbuf;
  sargs[na++] = "--port";
  sargs[na++] = "0";
  sargs[na++] = "--scrape-interval";
  sargs[na++] = scrapebuf;
  sargs[na++] = "--quiet";
  if (s->router_config) {
    sargs[na++] = "--config";
    sargs[na++] = (char *)s->router_config;
  }
  char idbuf[16];
  if (s->bus) {
    int rc = start_natsd(c, d);
    if (rc) return rc;
    sargs[na++] = "--bus";
    sargs[na++] = c->bus_url;
    sargs[na++] = "--bus-replica-id";
    sargs[na++] = idbuf;
  }
  if (s->access_log) {
    sargs[na++] = "--access-log";
    sargs[na++] = (char *)s->access_log;
  }
  sargs[na] = NULL;
  for (size_t k = 0; k < nr; k++) { /* replicas: same workers, same flags */
    char line[512];
    snprintf(idbuf, sizeof idbuf, "r%zu", k);
    int rc = eldr_cluster_spawn(c, sargs, rt, line, sizeof line, d);
    if (rc)
      return eldr_diag_fail(d, rc, "the router did not start (see %s)",
                            c->log_path ? c->log_path : "stderr");
    const char *hp = strstr(line, "127.0.0.1:");
    if (!hp) return eldr_diag_fail(d, ELDR_EPARSE, "unexpected router output: %s", line);
    snprintf(c->routers[k], sizeof c->routers[k], "http://127.0.0.1:%d", atoi(hp + 10));
    c->router_ptrs[k] = c->routers[k];
    c->n_routers = k + 1;
  }
  snprintf(target, cap, "%s", c->routers[0]);
  return 0;
}

/* ---- /metrics over the net layer's HTTP client ------------------------- */

/* The value after the first sample of metric name (its "{" labels or a space). */
static int metric_value(const char *text, const char *name, double *v) {
  size_t ln = strlen(name);
  for (const char *q = strstr(text, name); q; q = strstr(q + 1, name)) {
    if (q != text && q[-1] != '\n') continue;
    if (q[ln] != '{' && q[ln] != ' ') continue;
    const char *sp = strchr(q + ln, ' ');
    if (!sp) return -1;
    char *end = NULL;
    *v = strtod(sp + 1, &end);
    return end == sp + 1 ? -1 : 0;
  }
  return -1;
}

int eldr_cluster_scrape(const char *url, double timeout_s, eldr_decode_counters *acc,
                        eldr_diag *d) {
  int status;
  char *buf;
  int rc = eldr_http_fetch(url, "GET", "/metrics", NULL, NULL, timeout_s, &status, &buf, d);
  if (rc) return rc;
  if (status != 200) {
    free(buf);
    return eldr_diag_fail(d, ELDR_EIO, "%s/metrics: status %d", url, status);
  }
  static const char *names[4] = {"eldr_worker_decode_steps_total", "eldr_worker_decode_batch_sum",
                                 "eldr_worker_decode_union_experts_sum",
                                 "eldr_worker_decode_token_seconds_sum"};
  double v[4];
  for (int i = 0; !rc && i < 4; i++)
    if (metric_value(buf, names[i], &v[i]))
      rc = eldr_diag_fail(d, ELDR_EPARSE, "%s/metrics: no %s", url, names[i]);
  free(buf);
  if (rc) return rc;
  acc->steps += v[0];
  acc->batch_sum += v[1];
  acc->union_sum += v[2];
  acc->token_s += v[3];
  return 0;
}

int eldr_cluster_scrape_decoders(eldr_cluster *c, double timeout_s, eldr_decode_counters *out,
                                 eldr_diag *d) {
  memset(out, 0, sizeof *out);
  int rc = 0;
  for (size_t i = 0; i < c->n_urls[1]; i++) {
    int r = eldr_cluster_scrape(c->urls[1][i], timeout_s, out, d);
    if (r && !rc) rc = r;
  }
  return rc;
}
