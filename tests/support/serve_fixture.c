/* serve_fixture.c — see serve_fixture.h. */
#include "support/serve_fixture.h"

#include <arpa/inet.h>
#include <event2/dns.h>
#include <event2/dns_struct.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/routed_experts.h"
#include "eldr/tokenize.h"
#include "support/proc.h"
#include "worker/wtest.h"

/* ---- the rig ------------------------------------------------------------------ */

static void urls(sf_rig *g) {
  for (int i = 0; i < g->np; i++) snprintf(g->purl[i], sizeof g->purl[i], "http://127.0.0.1:%d", g->pport[i]);
  for (int i = 0; i < g->nd; i++) snprintf(g->durl[i], sizeof g->durl[i], "http://127.0.0.1:%d", g->dport[i]);
}

static void check_counts(int np, int nd) {
  if (np < 1 || np > SF_MAX || nd < 1 || nd > SF_MAX) fail_msg("sf: %d prefill and %d decode workers (1 to %d each)", np, nd, SF_MAX);
}

void sf_start(sf_rig *g, int np, const fx_behaviour *pb, int nd, const fx_behaviour *db) {
  check_counts(np, nd);
  memset(g, 0, sizeof *g);
  g->np = np;
  g->nd = nd;
  for (int i = 0; i < np; i++) {
    if (!(g->p[i] = fx_start(pb))) fail_msg("sf: fixture prefill worker %d did not start", i);
    g->pport[i] = fx_port(g->p[i]);
  }
  for (int i = 0; i < nd; i++) {
    if (!(g->d[i] = fx_start(db))) fail_msg("sf: fixture decode worker %d did not start", i);
    g->dport[i] = fx_port(g->d[i]);
  }
  urls(g);
  sf_config(g);
}

static int engine(sf_rig *g, int slot, const eldr_worker_config *base, eldr_worker_role role) {
  eldr_worker_config wc = *base;
  wc.role = role;
  wc.port = 0;
  wt_worker *w = calloc(1, sizeof *w);
  eldr_diag d = {{0}};
  if (!w || wt_worker_start(w, &wc, &d) < 0) fail_msg("sf: emulated %s engine: %s", role == ELDR_WORKER_PREFILL ? "prefill" : "decode", d.msg);
  g->engine[slot] = w;
  return w->port;
}

void sf_start_engines(sf_rig *g, int np, const eldr_worker_config *pc, int nd, const eldr_worker_config *dc) {
  check_counts(np, nd);
  memset(g, 0, sizeof *g);
  g->np = np;
  g->nd = nd;
  for (int i = 0; i < np; i++) g->pport[i] = engine(g, i, pc, ELDR_WORKER_PREFILL);
  for (int i = 0; i < nd; i++) g->dport[i] = engine(g, np + i, dc, ELDR_WORKER_DECODE);
  urls(g);
  sf_config(g);
}

static void cfg_reset(sf_rig *g) {
  if (g->have_cfg) eldr_serve_config_free(&g->c);
  eldr_serve_config_default(&g->c);
  g->have_cfg = 1;
}

void sf_config(sf_rig *g) {
  cfg_reset(g);
  g->c.health_interval_s = 0;
  eldr_diag d = {{0}};
  for (int i = 0; i < g->np; i++)
    if (eldr_serve_config_add_worker(&g->c, 0, g->purl[i], &d)) fail_msg("sf: %s: %s", g->purl[i], d.msg);
  for (int i = 0; i < g->nd; i++)
    if (eldr_serve_config_add_worker(&g->c, 1, g->durl[i], &d)) fail_msg("sf: %s: %s", g->durl[i], d.msg);
}

void sf_rewrite(const sf_rig *g, const char *doc) {
  FILE *f = fopen(g->cfgpath, "w");
  if (!f || fputs(doc, f) < 0 || fclose(f)) fail_msg("sf: cannot write %s", g->cfgpath);
}

static void url_list(char *buf, size_t cap, const char (*u)[64], int n) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s\"%s\"", i ? "," : "", u[i]);
}

void sf_write_config(const sf_rig *g, const char *policy, const char *extra) {
  char pl[SF_MAX * 70], dl[SF_MAX * 70], doc[2 * SF_MAX * 70 + 1024];
  url_list(pl, sizeof pl, g->purl, g->np);
  url_list(dl, sizeof dl, g->durl, g->nd);
  int n = snprintf(doc, sizeof doc, "{\"prefill\":[%s],\"decode\":[%s],\"policy\":\"%s\",\"health_interval\":0%s}",
                   pl, dl, policy, extra ? extra : "");
  if (n < 0 || (size_t)n >= sizeof doc) fail_msg("sf: config document too long (%d bytes)", n);
  sf_rewrite(g, doc);
}

void sf_config_file(sf_rig *g, const char *tag, const char *policy, const char *extra) {
  snprintf(g->cfgpath, sizeof g->cfgpath, "/tmp/eldr_test_sf_%d_%s.json", (int)getpid(), tag);
  sf_write_config(g, policy, extra);
  cfg_reset(g);
  eldr_diag d = {{0}};
  if (eldr_serve_config_load(&g->c, g->cfgpath, &d)) fail_msg("sf: %s: %s", g->cfgpath, d.msg);
  g->c.config_path = strdup(g->cfgpath);
}

void sf_run(sf_rig *g) {
  if (g->running) fail_msg("sf: the router is already running");
  if (rt_start(&g->r, &g->c)) fail_msg("sf: the router did not start: %s", rt_log_text(&g->r));
  g->running = 1;
}

void sf_stop(sf_rig *g) {
  if (g->running) rt_stop(&g->r);
  g->running = 0;
  if (g->have_cfg) eldr_serve_config_free(&g->c);
  g->have_cfg = 0;
}

void sf_free(sf_rig *g) {
  sf_stop(g);
  if (g->cfgpath[0]) unlink(g->cfgpath);
  g->cfgpath[0] = 0;
  for (int i = 0; i < SF_MAX; i++) {
    fx_free(g->p[i]);
    fx_free(g->d[i]);
    g->p[i] = g->d[i] = NULL;
  }
  for (int i = 0; i < 2 * SF_MAX; i++) {
    if (!g->engine[i]) continue;
    wt_worker_stop(g->engine[i]);
    free(g->engine[i]);
    g->engine[i] = NULL;
  }
}

/* ---- the router as a child process -------------------------------------------- */

/* The port of a "listening on HOST:PORT" line at the start of buf, or -1. */
static int listening_port(const char *buf) {
  const char *nl = strchr(buf, '\n');
  if (!nl || strncmp(buf, "listening on ", 13)) return -1;
  const char *colon = NULL;
  for (const char *q = buf; q < nl; q++)
    if (*q == ':') colon = q;
  return colon ? atoi(colon + 1) : -1;
}

void sf_child_start(sf_child *ch, long nofile, const char *const *args) {
  static int seq;
  const char *argv[44] = {eldr_test_binary(), "serve"};
  int n = 2;
  for (; args[n - 2]; n++) {
    if (n >= 43) fail_msg("sf: more than 40 arguments");
    argv[n] = args[n - 2];
  }
  argv[n] = NULL;
  memset(ch, 0, sizeof *ch);
  snprintf(ch->logpath, sizeof ch->logpath, "/tmp/eldr_test_sf_%d_child%d.log", (int)getpid(), seq++);
  int pfd[2];
  if (pipe(pfd)) fail_msg("sf: pipe failed");
  pid_t pid = fork();
  if (pid < 0) fail_msg("sf: fork failed");
  if (pid == 0) {
    if (nofile > 0) {
      struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
      if (setrlimit(RLIMIT_NOFILE, &rl)) _exit(120);
    }
    int e = open(ch->logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (e < 0) _exit(121);
    dup2(pfd[1], 1);
    dup2(e, 2);
    close(pfd[0]);
    close(pfd[1]);
    close(e);
    execv(argv[0], (char *const *)argv);
    _exit(122);
  }
  close(pfd[1]);
  ch->pid = pid;
  ch->port = -1;
  char buf[512] = "";
  size_t bl = 0;
  for (double deadline = fx_now() + 20; ch->port < 0 && fx_now() < deadline && bl < sizeof buf - 1;) {
    struct pollfd p = {pfd[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t k = read(pfd[0], buf + bl, sizeof buf - 1 - bl);
    if (k <= 0) break; /* it exited */
    bl += (size_t)k;
    buf[bl] = 0;
    ch->port = listening_port(buf);
  }
  close(pfd[0]);
  if (ch->port <= 0) {
    char log[2048];
    eldr_test_read_into(ch->logpath, log, sizeof log);
    sf_child_kill(ch);
    fail_msg("sf: eldr serve did not say where it listens (stdout '%s'); its log: %s", buf, log);
  }
}

void sf_child_stop(sf_child *ch) {
  if (ch->pid <= 0) fail_msg("sf: no child to stop");
  kill(ch->pid, SIGTERM);
  int st = 0;
  pid_t got = waitpid(ch->pid, &st, 0);
  ch->pid = 0;
  if (got <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) { /* its log says why (a sanitizer's report) */
    char log[4096];
    eldr_test_read_into(ch->logpath, log, sizeof log);
    unlink(ch->logpath);
    fail_msg("sf: eldr serve did not exit cleanly on SIGTERM (wait status %d); its log: %s", st, log);
  }
  unlink(ch->logpath);
}

int sf_child_kill(sf_child *ch) {
  if (ch->pid <= 0) return -1;
  kill(ch->pid, SIGKILL);
  int st = -1;
  if (waitpid(ch->pid, &st, 0) != ch->pid) st = -1;
  ch->pid = 0;
  unlink(ch->logpath);
  return st;
}

/* ---- shared helpers ------------------------------------------------------------- */

char *sf_routed(const eldr_shape *s, size_t n, int e0) {
  size_t LK = (size_t)s->num_layers * s->top_k;
  uint16_t *sel = malloc((n ? n : 1) * LK * sizeof *sel);
  if (!sel) fail_msg("sf: out of memory");
  for (size_t t = 0; t < n; t++)
    for (size_t i = 0; i < LK; i++) sel[t * LK + i] = (uint16_t)(e0 + (int)(i % s->top_k));
  char *out = NULL;
  size_t len;
  int rc = eldr_routed_experts_encode(sel, n, s, ELDR_SEL_U8, &out, &len);
  free(sel);
  if (rc) fail_msg("sf: routed_experts of %zu tokens from expert %d: error %d", n, e0, rc);
  return out;
}

void sf_prefix_prompt(const eldr_shape *s, char *prompt, size_t cap, char **all, char **tail) {
  size_t off = 0;
  prompt[0] = 0;
  for (int i = 0; i < 48 && off < cap; i++) off += (size_t)snprintf(prompt + off, cap - off, "w%d ", i);
  if (off >= cap || eldr_tokenize(prompt, strlen(prompt), NULL, 0) != 48) fail_msg("sf: the 48-token prompt");
  size_t LK = (size_t)s->num_layers * s->top_k;
  uint16_t *sel = malloc(48 * LK * sizeof *sel);
  if (!sel) fail_msg("sf: out of memory");
  for (size_t t = 0; t < 48; t++)
    for (size_t i = 0; i < LK; i++) sel[t * LK + i] = (uint16_t)((t < 32 ? 6 : 0) + (int)(i % s->top_k));
  size_t len;
  int rc = eldr_routed_experts_encode(sel, 48, s, ELDR_SEL_U8, all, &len);
  if (!rc) rc = eldr_routed_experts_encode(sel + 32 * LK, 16, s, ELDR_SEL_U8, tail, &len);
  free(sel);
  if (rc) fail_msg("sf: routed_experts of the prefix prompt: error %d", rc);
}

int sf_served_by(const tc_resp *r) {
  json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
  if (!j) fail_msg("not JSON (status %d): %s", r->status, r->body);
  int port = (int)json_integer_value(json_object_get(j, "served_by"));
  json_decref(j);
  return port;
}

void sf_post_ok(int port, const char *path, const char *body, const char *extra, tc_resp *out) {
  tc_resp r;
  if (tc_post(port, path, body, extra, &r)) fail_msg("POST %s to port %d failed", path, port);
  if (r.status != 200) fail_msg("POST %s: status %d: %s", path, r.status, r.body);
  if (out) *out = r;
  else tc_free(&r);
}

void sf_prefill_homes(int port, fx_worker *const *w, int nw, int n, int *who) {
  if (nw < 1 || nw > 8) fail_msg("sf_prefill_homes: %d workers (1 to 8)", nw);
  for (int i = 0; i < n; i++) {
    size_t before[8];
    for (int k = 0; k < nw; k++) before[k] = fx_count(w[k], "/v1/completions");
    char body[160];
    snprintf(body, sizeof body, "{\"prompt\":\"q%d a b c d e f g h i j k l m n o p q r s\",\"max_tokens\":2}", i);
    sf_post_ok(port, "/v1/completions", body, NULL, NULL);
    who[i] = -1;
    for (int k = 0; k < nw; k++)
      if (fx_count(w[k], "/v1/completions") > before[k]) who[i] = k;
    if (who[i] < 0) fail_msg("prompt %d reached no prefill worker", i);
  }
}

int sf_post_served_by(int port) {
  tc_resp r;
  if (tc_post(port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &r)) fail_msg("POST to port %d failed", port);
  if (r.status != 200) fail_msg("status %d: %s", r.status, r.body);
  int by = sf_served_by(&r);
  tc_free(&r);
  return by;
}

void sf_check_counts(const json_t *counts, const eldr_shape *s, long long tokens) {
  if (json_array_size(counts) != s->num_layers)
    fail_msg("counts: %zu rows, want %u layers", json_array_size(counts), s->num_layers);
  for (size_t l = 0; l < s->num_layers; l++) {
    const json_t *row = json_array_get(counts, l);
    if (json_array_size(row) != s->num_experts)
      fail_msg("counts row %zu: %zu entries, want %u experts", l, json_array_size(row), s->num_experts);
    long long sum = 0;
    for (size_t e = 0; e < s->num_experts; e++) {
      long long v = json_integer_value(json_array_get(row, e));
      if (v < 0 || v > tokens) fail_msg("counts row %zu expert %zu: %lld of %lld tokens", l, e, v, tokens);
      sum += v;
    }
    if (sum != tokens * s->top_k) fail_msg("counts row %zu sums to %lld, want %lld x %u", l, sum, tokens, s->top_k);
  }
}

/* ---- the DNS responder -------------------------------------------------------- */

static void dns_cb(struct evdns_server_request *req, void *arg) {
  sf_dns *d = arg;
  int known = 0;
  pthread_mutex_lock(&d->mu);
  d->queries++;
  for (int i = 0; i < req->nquestions; i++) {
    struct evdns_server_question *q = req->questions[i];
    if (strcasecmp(q->name, d->name)) continue;
    known = 1;
    for (int k = 0; q->type == EVDNS_TYPE_A && k < d->n; k++)
      evdns_server_request_add_a_reply(req, q->name, 1, &d->addr[k], 0);
  }
  pthread_mutex_unlock(&d->mu);
  evdns_server_request_respond(req, known ? 0 : DNS_ERR_NOTEXIST);
}

static void *dns_thread(void *arg) {
  event_base_dispatch(((sf_dns *)arg)->base);
  return NULL;
}

void sf_dns_start(sf_dns *d, const char *name) {
  memset(d, 0, sizeof *d);
  evthread_use_pthreads();
  pthread_mutex_init(&d->mu, NULL);
  d->name = name;
  d->base = event_base_new();
  d->fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!d->base || d->fd < 0 || bind(d->fd, (struct sockaddr *)&sa, sizeof sa))
    fail_msg("sf_dns: no UDP socket on 127.0.0.1");
  socklen_t sl = sizeof sa;
  getsockname(d->fd, (struct sockaddr *)&sa, &sl);
  d->port = ntohs(sa.sin_port);
  evutil_make_socket_nonblocking(d->fd);
  d->sp = evdns_add_server_port_with_base(d->base, d->fd, 0, dns_cb, d);
  if (!d->sp) fail_msg("sf_dns: evdns server port");
  /* keeps the loop alive while there is nothing to answer */
  d->keep = event_new(d->base, -1, EV_PERSIST, NULL, NULL);
  struct timeval tv = {3600, 0};
  event_add(d->keep, &tv);
  if (pthread_create(&d->th, NULL, dns_thread, d)) fail_msg("sf_dns: thread");
}

void sf_dns_answer(sf_dns *d, const char *const *addrs) {
  pthread_mutex_lock(&d->mu);
  d->n = 0;
  for (int i = 0; addrs && addrs[i] && d->n < 8; i++)
    if (inet_pton(AF_INET, addrs[i], &d->addr[d->n]) == 1) d->n++;
  pthread_mutex_unlock(&d->mu);
}

void sf_dns_rename(sf_dns *d, const char *name) {
  pthread_mutex_lock(&d->mu);
  d->name = name;
  pthread_mutex_unlock(&d->mu);
}

void sf_dns_stop(sf_dns *d) {
  event_base_loopexit(d->base, NULL);
  pthread_join(d->th, NULL);
  evdns_close_server_port(d->sp);
  evutil_closesocket(d->fd);
  event_free(d->keep);
  event_base_free(d->base);
  pthread_mutex_destroy(&d->mu);
}

eldr_artifact *sf_halves_artifact(const char *model, const eldr_shape *s, const uint32_t *ids, int idf,
                                  const uint8_t *mask) {
  eldr_artifact *a = eldr_artifact_new(model, s, ids, ELDR_REPR_COUNT, idf, mask, 2);
  if (!a) fail_msg("artifact for %s: out of memory", model);
  if (a->idf)
    for (size_t i = 0; i < eldr_shape_cells(s); i++) a->idf[i] = 1.0f;
  const float v = 1.0f / sqrtf((float)a->dim / 2);
  for (size_t c = 0; c < 2; c++)
    for (size_t j = 0; j < a->dim; j++)
      a->centroids[c * a->dim + j] = (j % s->num_experts) / (s->num_experts / 2) == c ? v : 0.0f;
  a->cluster_sizes[0] = a->cluster_sizes[1] = 1;
  a->tau = 0.1;
  a->fit_n = 2;
  a->fit_balanced = 1;
  return a;
}

char *sf_artifact_save(eldr_artifact *a, const char *tag) {
  char *path = malloc(256);
  if (!path) fail_msg("out of memory");
  snprintf(path, 256, "/tmp/eldr_test_%s_%d.json", tag, (int)getpid());
  eldr_diag d = {{0}};
  if (eldr_artifact_save(path, a, &d) != 0) fail_msg("saving %s: %s", path, d.msg);
  eldr_artifact_free(a);
  return path;
}
