/* test_cluster.c — integration over real sockets and real processes: the
 * `eldr serve` router in front of 2 prefill and 4 decode `eldr worker`
 * processes (ELDR_BINARY, ephemeral ports, all killed at the end).
 *  1. sequential requests (load allows): every decode choice is the
 *     artifact's nearest centroid for the request's prefill signature;
 *  2. a few seconds of Poisson load: every request completes, every stream
 *     is well-formed SSE with the trace's decode length;
 *  3. fault: a decode worker is SIGKILLed mid-run: every request completes
 *     or ends with a clear error (none hangs), the router ejects the worker
 *     and re-admits it once it is restarted on the same port;
 *  4. reload under load: Poisson load while the artifact file is swapped
 *     six times, the router reloaded by SIGHUP and by POST /admin/reload
 *     in turn: zero failed requests. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/cluster.h"
#include "eldr/http_fetch.h"
#include "eldr/loadgen.h"
#include "eldr/signature.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"
#include "worker/wtest.h"
#include "support/proc.h"

#define NP 2
#define ND 4
#define MODEL "olmoe-1b-7b"

typedef struct cluster {
  char dir[256], fit[300], eval[300], art[300], art_a[300], art_b[300], cfg[300];
  pid_t pw[NP], dw[ND], router;
  int pport[NP], dport[ND], rport;
  eldr_trace *trace; /* eval split */
  eldr_artifact *art_obj;
} cluster;

static cluster C;

static pid_t start_worker(const char *role, int port, int *port_out) {
  char portbuf[16], line[512];
  snprintf(portbuf, sizeof portbuf, "%d", port);
  char *argv[] = {(char *)eldr_test_binary(), "worker", "--role", (char *)role, "--model", MODEL, "--hardware",
                  "h200", "--trace", C.eval, "--port", portbuf, "--time-scale", "1", NULL};
  pid_t pid = wt_spawn(argv, line, sizeof line, 20);
  int p = wt_port_of(line);
  if (p <= 0) {
    wt_kill(pid);
    return -1;
  }
  *port_out = p;
  return pid;
}

#define TOKEN "cluster-test-admin-token-42"

/* ep: also write the expert-parallel placements (next to the artifact). */
static int run_fit(const char *out, const char *seed, int ep) {
  char *argv[] = {(char *)eldr_test_binary(), "fit", "--trace", C.fit, "--decoders", "4", "-o", (char *)out, "-q",
                  "--restarts", "2", "--seed", (char *)seed, ep ? "--ep-size" : NULL, "4", NULL};
  pid_t pid = wt_spawn(argv, NULL, 0, 0);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int cluster_setup(void **state) {
  (void)state;
  memset(&C, 0, sizeof C);
  signal(SIGPIPE, SIG_IGN);
  snprintf(C.dir, sizeof C.dir, "/tmp/eldr-test-cluster-XXXXXX");
  if (!mkdtemp(C.dir)) return -1;
  snprintf(C.fit, sizeof C.fit, "%s/fit.jsonl", C.dir);
  snprintf(C.eval, sizeof C.eval, "%s/eval.jsonl", C.dir);
  snprintf(C.art, sizeof C.art, "%s/art.json", C.dir);
  snprintf(C.art_a, sizeof C.art_a, "%s/art-a.json", C.dir);
  snprintf(C.art_b, sizeof C.art_b, "%s/art-b.json", C.dir);
  snprintf(C.cfg, sizeof C.cfg, "%s/router.json", C.dir);
  FILE *cf = fopen(C.cfg, "w");
  if (!cf) return -1;
  fputs("{\"admin_token\":\"" TOKEN "\"}", cf);
  fclose(cf);
  /* a small synthetic workload: 160 fit + 64 served requests */
  eldr_shape sh;
  char canon[64];
  eldr_tracegen *g = NULL;
  eldr_trace *all = NULL;
  if (eldr_tracegen_model_shape(MODEL, &sh, canon, sizeof canon, NULL) < 0 ||
      eldr_tracegen_new(&sh, canon, "task", 11, &g, NULL) < 0)
    return -1;
  eldr_tracegen_set_lengths(g, 0, 24, 96);
  if (eldr_tracegen_generate(g, 224, &all, NULL) < 0) return -1;
  eldr_tracegen_free(g);
  eldr_trace *fit = eldr_trace_new(all->model, &all->shape, all->layer_ids);
  eldr_trace *ev = eldr_trace_new(all->model, &all->shape, all->layer_ids);
  for (size_t i = 0; i < all->n; i++) {
    const eldr_request *q = &all->req[i];
    if (eldr_trace_append(i < 160 ? fit : ev, q->id, all->domains[q->domain], NULL, -1, q->prefill,
                          q->n_prefill, q->decode, q->n_decode, NULL) < 0)
      return -1;
  }
  eldr_trace_free(all);
  if (eldr_trace_save(C.fit, fit, NULL) < 0 || eldr_trace_save(C.eval, ev, NULL) < 0) return -1;
  eldr_trace_free(fit);
  C.trace = ev;
  if (run_fit(C.art, "1", 1) < 0 || run_fit(C.art_a, "1", 0) < 0 || run_fit(C.art_b, "2", 0) < 0) {
    fprintf(stderr, "eldr fit failed\n");
    return -1;
  }
  if (eldr_artifact_load(C.art, &C.art_obj, NULL) < 0) return -1;
  for (int i = 0; i < NP; i++)
    if ((C.pw[i] = start_worker("prefill", 0, &C.pport[i])) < 0) return -1;
  for (int i = 0; i < ND; i++)
    if ((C.dw[i] = start_worker("decode", 0, &C.dport[i])) < 0) return -1;
  char urls[NP + ND][64];
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)eldr_test_binary();
  argv[n++] = "serve";
  for (int i = 0; i < NP; i++) {
    snprintf(urls[i], sizeof urls[i], "http://127.0.0.1:%d", C.pport[i]);
    argv[n++] = "--prefill";
    argv[n++] = urls[i];
  }
  for (int i = 0; i < ND; i++) {
    snprintf(urls[NP + i], sizeof urls[NP + i], "http://127.0.0.1:%d", C.dport[i]);
    argv[n++] = "--decode";
    argv[n++] = urls[NP + i];
  }
  const char *rest[] = {"--artifact", C.art, "--policy", "eldr", "--port", "0", "--health-interval",
                        "0.2", "--eject-after", "2", "--quiet", "--config", C.cfg, NULL};
  for (int i = 0; rest[i]; i++) argv[n++] = (char *)rest[i];
  argv[n] = NULL;
  char line[512];
  C.router = wt_spawn(argv, line, sizeof line, 20);
  C.rport = wt_port_of(line);
  if (C.rport <= 0) {
    fprintf(stderr, "router did not start: '%s'\n", line);
    return -1;
  }
  return wt_wait_ready(C.rport, "/health", 10);
}

static int cluster_teardown(void **state) {
  (void)state;
  wt_kill(C.router);
  for (int i = 0; i < ND; i++) wt_kill(C.dw[i]);
  for (int i = 0; i < NP; i++) wt_kill(C.pw[i]);
  eldr_trace_free(C.trace);
  eldr_artifact_free(C.art_obj);
  unlink(C.fit);
  unlink(C.eval);
  unlink(C.art);
  unlink(C.art_a);
  unlink(C.art_b);
  unlink(C.cfg);
  rmdir(C.dir);
  return 0;
}

static int all_decoders_idle(double timeout_s) {
  double deadline = wt_now() + timeout_s;
  while (wt_now() < deadline) {
    int idle = 1;
    for (int i = 0; i < ND && idle; i++) {
      char pre[128];
      snprintf(pre, sizeof pre, "eldr_worker_inflight{role=\"decode\",worker=\"http://127.0.0.1:%d\"}",
               C.dport[i]);
      idle = wt_metric(C.rport, pre) == 0;
    }
    if (idle) return 0;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

/* The decoder the artifact assigns record i to when loads are equal. */
static int nearest_decoder(size_t i) {
  const eldr_artifact *a = C.art_obj;
  eldr_sigspec spec = {a->shape, a->repr, a->idf_enabled ? a->idf : NULL, a->mask};
  uint32_t *counts = calloc(eldr_shape_cells(&a->shape), sizeof *counts);
  float *sig = calloc(a->dim, sizeof *sig);
  const eldr_request *q = &C.trace->req[i];
  eldr_counts_accumulate(&a->shape, q->prefill, ELDR_SEL_U16, q->n_prefill, counts, NULL);
  int best = -1;
  if (eldr_signature_build(&spec, counts, NULL, sig) == 0) {
    double bs = -2;
    for (size_t k = 0; k < a->k; k++) {
      double s = eldr_dot(sig, a->centroids + k * a->dim, a->dim);
      if (s > bs) bs = s, best = (int)k;
    }
  }
  free(sig);
  free(counts);
  return best;
}

static int decoder_of_engine(const char *eng) {
  const char *p = strrchr(eng, '-');
  int port = p ? atoi(p + 1) : -1;
  for (int i = 0; i < ND; i++)
    if (C.dport[i] == port) return i;
  return -1;
}

/* One streamed request through the router for record i. */
static int one_request(size_t i, char *engine) {
  char *prompt = eldr_loadgen_prompt(C.trace, i);
  json_t *b = json_pack("{s:s,s:i,s:b,s:s}", "prompt", prompt, "max_tokens",
                        (int)C.trace->req[i].n_decode, "stream", 1, "eldr_trace_id", C.trace->req[i].id);
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  free(prompt);
  wt_resp r;
  int rc = wt_http(C.rport, "POST", "/v1/completions", s, 20, &r);
  free(s);
  if (rc != 0 || r.status != 200) {
    fprintf(stderr, "record %zu: rc %d status %d: %s\n", i, rc, r.status, r.body ? r.body : "");
    wt_resp_free(&r);
    return -1;
  }
  char err[160];
  int tok = wt_sse_check(r.body, err, sizeof err, engine, NULL);
  if (tok < 0) fprintf(stderr, "record %zu: %s\n", i, err);
  wt_resp_free(&r);
  return tok;
}

static void test_decode_choices_follow_artifact(void **state) {
  (void)state;
  int hits[ND] = {0}, n = 0;
  for (size_t i = 0; i < 32; i++) {
    assert_int_equal(all_decoders_idle(10), 0); /* equal (zero) loads: pure locality */
    char eng[48];
    int tok = one_request(i, eng);
    assert_int_equal(tok, C.trace->req[i].n_decode);
    int got = decoder_of_engine(eng), want = nearest_decoder(i);
    assert_true(want >= 0);
    if (got != want) fail_msg("record %zu went to decoder %d, the artifact says %d", i, got, want);
    hits[got]++;
    n++;
  }
  int used = 0;
  for (int k = 0; k < ND; k++) used += hits[k] > 0;
  assert_true(used >= 2); /* the choices are not trivially one decoder */
  assert_int_equal(wt_metric(C.rport, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"),
                   n);
}

static void test_load_every_request_completes(void **state) {
  (void)state;
  eldr_loadgen_config c;
  eldr_loadgen_config_default(&c);
  char target[64];
  snprintf(target, sizeof target, "http://127.0.0.1:%d", C.rport);
  c.target = target;
  c.trace = C.trace;
  c.rate = 25;
  c.duration_s = 3;
  c.drain_s = 20;
  c.timeout_s = 20;
  c.seed = 5;
  eldr_loadgen_result r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_loadgen_run(&c, &r, &d), 0);
  assert_true(r.n >= 30);
  for (size_t i = 0; i < r.n; i++) {
    const eldr_loadgen_rec *q = &r.recs[i];
    if (!q->ok) fail_msg("request %zu (record %zu): %s", i, q->trace_index, q->error);
    assert_int_equal(q->tokens, C.trace->req[q->trace_index].n_decode);
    assert_true(decoder_of_engine(q->engine) >= 0);
  }
  assert_int_equal(r.malformed, 0);
  /* inter-token latency: one gap per token after a stream's first */
  size_t gaps = 0;
  for (size_t i = 0; i < r.n; i++) gaps += r.recs[i].tokens ? r.recs[i].tokens - 1 : 0;
  assert_int_equal(r.n_itl, gaps);
  eldr_loadgen_summary sm;
  assert_int_equal(eldr_loadgen_summarize(&r, &sm), 0);
  if (gaps) assert_true(sm.itl_p99 >= sm.itl_p50 && sm.itl_p50 > 0);
  eldr_loadgen_result_free(&r);
}

typedef struct lg_thread {
  eldr_loadgen_config c;
  eldr_loadgen_result r;
  int rc;
  char target[64];
  pthread_t th;
} lg_thread;

static void *lg_main(void *arg) {
  lg_thread *t = arg;
  t->rc = eldr_loadgen_run(&t->c, &t->r, NULL);
  return NULL;
}

/* Poisson load of the cluster's trace through the router at rate for
 * duration_s (seed 9, 20 s drain and timeout) on a thread; join t->th. */
static void lg_start(lg_thread *t, double rate, double duration_s) {
  memset(t, 0, sizeof *t);
  eldr_loadgen_config_default(&t->c);
  snprintf(t->target, sizeof t->target, "http://127.0.0.1:%d", C.rport);
  t->c.target = t->target;
  t->c.trace = C.trace;
  t->c.rate = rate;
  t->c.duration_s = duration_s;
  t->c.drain_s = 20;
  t->c.timeout_s = 20;
  t->c.seed = 9;
  assert_int_equal(pthread_create(&t->th, NULL, lg_main, t), 0);
}

static void test_fault_decoder_killed_ejected_readmitted(void **state) {
  (void)state;
  const int victim = 1;
  char url[64], healthy[160];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", C.dport[victim]);
  snprintf(healthy, sizeof healthy, "eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", url);
  assert_int_equal(wt_metric(C.rport, healthy), 1);
  lg_thread t;
  lg_start(&t, 25, 4);
  /* kill the victim while it is serving (wait until the router has a
   * decode leg in flight on it) */
  char inflight[160];
  snprintf(inflight, sizeof inflight, "eldr_worker_inflight{role=\"decode\",worker=\"%s\"}", url);
  double deadline = wt_now() + 4;
  while (wt_now() < deadline && !(wt_metric(C.rport, inflight) > 0)) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  kill(C.dw[victim], SIGKILL);
  waitpid(C.dw[victim], NULL, 0);
  C.dw[victim] = -1;
  /* ejected */
  if (wt_wait_metric(C.rport, healthy, 0, 10) < 0) fail_msg("the router did not eject %s", url);
  /* restarted on the same port: re-admitted */
  int port = 0;
  C.dw[victim] = start_worker("decode", C.dport[victim], &port);
  assert_true(C.dw[victim] > 0);
  assert_int_equal(port, C.dport[victim]);
  if (wt_wait_metric(C.rport, healthy, 1, 10) < 0) fail_msg("the router did not re-admit %s", url);
  pthread_join(t.th, NULL);
  assert_int_equal(t.rc, 0);
  size_t ok = 0;
  for (size_t i = 0; i < t.r.n; i++) {
    const eldr_loadgen_rec *q = &t.r.recs[i];
    if (q->ok) {
      ok++;
      continue;
    }
    /* not ok: a clear error, never a hang */
    if (q->timed_out) fail_msg("request %zu hung: %s", i, q->error);
    assert_true(q->error[0] != 0);
  }
  const char *first_err = "";
  for (size_t i = 0; i < t.r.n && !first_err[0]; i++) first_err = t.r.recs[i].error;
  fprintf(stderr, "  fault run: %zu requests, %zu ok, %zu ended with an error (first: %s)\n", t.r.n,
          ok, t.r.n - ok, first_err);
  assert_true(t.r.n >= 40);
  assert_true(ok * 2 >= t.r.n);
  eldr_loadgen_result_free(&t.r);
  /* the re-admitted worker serves again: records the artifact gives it */
  int served = 0;
  for (size_t i = 0; i < C.trace->n && !served; i++) {
    if (nearest_decoder(i) != victim) continue;
    assert_int_equal(all_decoders_idle(10), 0);
    char eng[48];
    assert_int_equal(one_request(i, eng), C.trace->req[i].n_decode);
    served = decoder_of_engine(eng) == victim;
  }
  assert_true(served);
}

/* An expert-parallel worker started with the placement file `eldr fit
 * --ep-size` wrote for decoder 0 serves a request end to end; an EP size
 * the file's 64 physical experts do not split over is refused at start. */
static void test_ep_worker_with_placement(void **state) {
  (void)state;
  assert_non_null(C.art_obj->placement);
  char path[600], line[512];
  snprintf(path, sizeof path, "%s/%s", C.dir, C.art_obj->placement->decoders[0]);
  char *argv[] = {(char *)eldr_test_binary(), "worker", "--role", "both", "--model", MODEL, "--hardware", "h200",
                  "--trace", C.eval, "--port", "0", "--ep-size", "4", "--placement", path, "--corpus", "none", NULL};
  pid_t pid = wt_spawn(argv, line, sizeof line, 20);
  int port = wt_port_of(line);
  assert_true(port > 0);
  assert_non_null(strstr(line, "ep=4 placement=file"));
  json_t *b = json_pack("{s:s,s:i,s:s}", "prompt", "hello", "max_tokens", 4, "eldr_trace_id",
                        C.trace->req[0].id);
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  wt_resp r;
  int rc = wt_http(port, "POST", "/v1/completions", s, 20, &r);
  free(s);
  assert_int_equal(rc, 0);
  assert_int_equal(r.status, 200);
  if (!strstr(r.body, "tok0")) fail_msg("body: %.300s", r.body);
  wt_resp_free(&r);
  wt_kill(pid);
  char *bad[] = {(char *)eldr_test_binary(), "worker", "--model", MODEL, "--port", "0", "--ep-size", "3",
                 "--placement", path, NULL};
  pid = wt_spawn(bad, line, sizeof line, 20);
  if (wt_port_of(line) > 0) { /* it started: never wait on it */
    wt_kill(pid);
    fail_msg("worker started with a placement for another EP size: %s", line);
  }
  int st = 0;
  assert_true(pid > 0 && waitpid(pid, &st, 0) == pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
}

/* 4. Poisson load through the router while the artifact file is replaced
 * (rename, as a deploy does) six times and the router reloads, by SIGHUP
 * and by POST /admin/reload in turn: every request completes. */
static void test_reload_under_load(void **state) {
  (void)state;
  double ok0 = wt_metric(C.rport, "eldr_reloads_total{result=\"ok\"}");
  lg_thread t;
  lg_start(&t, 30, 3.5);
  char tmp[320];
  snprintf(tmp, sizeof tmp, "%s.tmp", C.art);
  for (int i = 0; i < 6; i++) {
    struct timespec ts = {0, 450 * 1000 * 1000};
    nanosleep(&ts, NULL);
    const char *src = i % 2 ? C.art_a : C.art_b;
    FILE *in = fopen(src, "rb"), *out = fopen(tmp, "wb");
    assert_true(in && out);
    char buf[1 << 14];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
    assert_int_equal(rename(tmp, C.art), 0);
    if (i % 2 == 0) {
      assert_int_equal(kill(C.router, SIGHUP), 0);
      assert_int_equal(wt_wait_metric(C.rport, "eldr_reloads_total{result=\"ok\"}", ok0 + i + 1, 10), 0);
    } else {
      char url[64], *body = NULL;
      int st = 0;
      eldr_diag d = {{0}};
      snprintf(url, sizeof url, "http://127.0.0.1:%d", C.rport);
      assert_int_equal(eldr_http_fetch(url, "POST", "/admin/reload", "Authorization: Bearer " TOKEN "\r\n", "", 10,
                                         &st, &body, &d), 0);
      if (st != 200 || !strstr(body, "\"result\":\"ok\"")) fail_msg("reload %d: %d %s", i, st, body);
      free(body);
    }
  }
  pthread_join(t.th, NULL);
  assert_int_equal(t.rc, 0);
  assert_true(t.r.n >= 60);
  for (size_t i = 0; i < t.r.n; i++)
    if (!t.r.recs[i].ok) fail_msg("request %zu of %zu failed across the reloads: %s", i, t.r.n, t.r.recs[i].error);
  assert_int_equal(wt_metric(C.rport, "eldr_reloads_total{result=\"ok\"}"), ok0 + 6);
  assert_int_equal(wt_metric(C.rport, "eldr_reloads_total{result=\"error\"}"), 0);
  print_message("reload under Poisson load: %zu requests, all ok, 6 reloads (3 SIGHUP, 3 POST)\n", t.r.n);
  eldr_loadgen_result_free(&t.r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ep_worker_with_placement),
      cmocka_unit_test(test_decode_choices_follow_artifact),
      cmocka_unit_test(test_load_every_request_completes),
      cmocka_unit_test(test_fault_decoder_killed_ejected_readmitted),
      cmocka_unit_test(test_reload_under_load),
  };
  return cmocka_run_group_tests(tests, cluster_setup, cluster_teardown);
}
