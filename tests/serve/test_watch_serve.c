/* test_watch_serve.c — the router's watch over real loopback sockets
 * against fixture workers (tests/support): GET /eldr/status and the
 * eldr_centroid_* / eldr_signature_drift / eldr_artifact_* lines of
 * /metrics (drift unknown without a fit-time reference, ok on the fit-time
 * mix, stale past the threshold after the mix shifts), the live rho of
 * sampled prefill/decode pairs, POST /admin/reload (404 without a token,
 * 401 on a wrong or missing one, the reload's result as JSON), and zero
 * failed requests while the artifact is swapped by SIGHUP and by POST under
 * a steady load from closed-loop clients. Waits are on conditions with
 * deadlines. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "eldr/watch.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

static const eldr_shape SH = {4, 8, 2};
#define TOKEN "s3cret-admin-token-0123"
#define AUTH "Authorization: Bearer " TOKEN "\r\n"

static char *routed(size_t n, int e0) { return sf_routed(&SH, n, e0); }

static json_t *status_json(int port) {
  tc_resp r;
  assert_int_equal(tc_get(port, "/eldr/status", &r), 0);
  assert_int_equal(r.status, 200);
  json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
  if (!j) fail_msg("not JSON: %s", r.body);
  tc_free(&r);
  return j;
}

static const char *drift_state(json_t *st) {
  return json_string_value(json_object_get(json_object_get(st, "drift"), "state"));
}

static int post_status(int port, const char *extra) {
  tc_resp r;
  if (tc_post(port, "/v1/completions", "{\"prompt\":\"a b c\"}", extra, &r)) return -1;
  int s = r.status;
  tc_free(&r);
  return s;
}

typedef struct rig {
  sf_rig s;
  fx_behaviour pb;   /* the prefill worker's (send_mix changes it) */
  const char *extra; /* the config keys past the artifact */
} rig;

/* The config keys past the workers and the policy, on artifact art. */
static const char *rig_keys(const rig *g, const char *art, char *buf, size_t cap) {
  snprintf(buf, cap, ",\"artifact\":\"%s\"%s", art, g->extra);
  return buf;
}

/* The rig's config file, now naming artifact art (for the next reload). */
static void rig_write(const rig *g, const char *art) {
  char keys[1024];
  sf_write_config(&g->s, "eldr", rig_keys(g, art, keys, sizeof keys));
}

/* A router with one prefill and nd decoders, policy eldr on artifact art;
 * extra: more config keys. The config is a file (re-read on reloads). */
/* threads: 2 for tests that count what the watch saw (its window is
 * shared: the counts are every loop's), 0 (one loop per core) for the
 * reload tests */
static void rig_start_n(rig *g, int nd, const char *art, const char *extra, int signals, int threads) {
  memset(g, 0, sizeof *g);
  g->pb = fx_defaults();
  g->pb.prompt_tokens = 3;
  g->extra = extra;
  sf_start(&g->s, 1, &g->pb, nd, NULL);
  char keys[1024];
  sf_config_file(&g->s, "watch", "eldr", rig_keys(g, art, keys, sizeof keys));
  g->s.c.header_timeout_s = 5;
  g->s.c.handle_signals = signals;
  g->s.c.threads = threads;
  sf_run(&g->s);
}

static void rig_start(rig *g, const char *art, const char *extra, int signals, int threads) {
  rig_start_n(g, 2, art, extra, signals, threads);
}

static void rig_stop(rig *g) { sf_free(&g->s); }

/* Prefill replies select experts e0, e0+1: send n requests. */
static void send_mix(rig *g, const char *re, int n) {
  g->pb.routed_experts = re;
  fx_set(g->s.p[0], &g->pb);
  for (int i = 0; i < n; i++) assert_int_equal(post_status(g->s.r.port, NULL), 200);
}

/* The artifact at src plus a fit-time reference (nearest share 1/2, 1/2,
 * every best similarity in bin `bin`), saved at dst. */
static void with_ref(const char *src, const char *dst, int bin) {
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  if (eldr_artifact_load(src, &a, &d)) fail_msg("%s", d.msg);
  a->drift_ref = eldr_drift_ref_new(a->k);
  a->drift_ref->n = 1000;
  a->drift_ref->nearest_share[0] = a->drift_ref->nearest_share[1] = 0.5;
  a->drift_ref->sim_hist[bin] = 1;
  free(a->created);
  a->created = strdup("2026-11-30T00:00:00Z");
  if (eldr_artifact_save(dst, a, &d)) fail_msg("%s", d.msg);
  eldr_artifact_free(a);
}

static uint64_t file_hash(const char *path) {
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  if (eldr_artifact_load(path, &a, &d)) fail_msg("%s", d.msg);
  uint64_t h = a->text_hash;
  eldr_artifact_free(a);
  return h;
}

static void test_status_and_drift(void **st) {
  (void)st;
  char *art = fx_artifact(&SH, "watch_a"), art2[256];
  snprintf(art2, sizeof art2, "/tmp/eldr_test_%d_watch_ref.json", (int)getpid());
  char *lo = routed(3, 0), *hi = routed(3, 6);
  rig g;
  rig_start(&g, art, ",\"watch_window\":0,\"watch_requests\":100,\"admin_token\":\"" TOKEN "\"", 0, 2);
  int port = g.s.r.port;
  for (int i = 0; i < 30; i++) {
    send_mix(&g, lo, 1);
    send_mix(&g, hi, 1);
  }
  json_t *s = status_json(port);
  json_t *a = json_object_get(s, "artifact");
  char want[20];
  snprintf(want, sizeof want, "%016llx", (unsigned long long)file_hash(art));
  assert_string_equal(json_string_value(json_object_get(a, "hash")), want);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "window"), "requests")), 60);
  json_t *c0 = json_array_get(json_object_get(s, "centroids"), 0);
  assert_true(fabs(json_real_value(json_object_get(c0, "share")) - 0.5) < 1e-9);
  assert_true(fabs(json_real_value(json_object_get(c0, "capacity_share")) - 0.5) < 1e-9);
  /* experts {0,1} against the centroid of experts 0-3: cos = 1/sqrt(2) */
  double ms = json_real_value(json_object_get(s, "mean_similarity"));
  assert_true(fabs(ms - sqrt(0.5)) < 1e-4);
  assert_string_equal(drift_state(s), "unknown"); /* fixture artifacts carry no reference */
  assert_non_null(strstr(json_string_value(json_object_get(json_object_get(s, "drift"), "why_unknown")), "drift_ref"));
  json_decref(s);
  assert_true(isnan(rt_metric(port, "eldr_signature_drift")));
  assert_int_equal(rt_metric(port, "eldr_centroid_capacity_share{centroid=\"1\"}"), 0.5);

  /* the same artifact with a reference: POST /admin/reload with the token */
  with_ref(art, art2, eldr_watch_sim_bin((float)sqrt(0.5)));
  rig_write(&g, art2);
  tc_resp r;
  assert_int_equal(tc_post(port, "/admin/reload", "", AUTH, &r), 0);
  assert_int_equal(r.status, 200);
  json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(j, "result")), "ok");
  snprintf(want, sizeof want, "%016llx", (unsigned long long)file_hash(art2));
  assert_string_equal(json_string_value(json_object_get(j, "hash")), want);
  json_decref(j);
  tc_free(&r);
  s = status_json(port); /* another artifact: a fresh window */
  assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "window"), "requests")), 0);
  json_decref(s);
  for (int i = 0; i < 50; i++) {
    send_mix(&g, lo, 1);
    send_mix(&g, hi, 1);
  }
  s = status_json(port);
  assert_string_equal(drift_state(s), "ok");
  double score = json_real_value(json_object_get(json_object_get(s, "drift"), "score"));
  assert_true(score < 1e-9);
  assert_true(json_real_value(json_object_get(json_object_get(s, "artifact"), "age_seconds")) > 0);
  json_decref(s);
  /* the mix shifts: every request nearest centroid 0 */
  send_mix(&g, lo, 100);
  s = status_json(port);
  assert_string_equal(drift_state(s), "stale");
  score = json_real_value(json_object_get(json_object_get(s, "drift"), "score"));
  json_decref(s);
  /* JS([1, 0], [1/2, 1/2]) = 1 - 0.75 log2(4/3) - ... : computed by the core, checked here against it */
  double one[2] = {1, 0}, half[2] = {0.5, 0.5};
  assert_true(fabs(score - eldr_js_divergence(one, half, 2)) < 1e-9);
  assert_true(score > ELDR_DRIFT_THRESHOLD);
  assert_true(fabs(rt_metric(port, "eldr_signature_drift") - score) < 1e-6);
  assert_int_equal(rt_metric(port, "eldr_centroid_share{centroid=\"0\"}"), 1);
  rig_stop(&g);
  unlink(art);
  unlink(art2);
  free(art);
  free(lo);
  free(hi);
}

/* Decoders returning routed_experts: sampled (signature, decode rows)
 * pairs give a live rho; here the decode rows follow the prompt's. */
static void test_live_rho(void **st) {
  (void)st;
  char *art = fx_artifact(&SH, "watch_rho");
  char *lo = routed(3, 0), *hi = routed(3, 6), *dlo = routed(5, 0), *dhi = routed(5, 6);
  rig g;
  rig_start(&g, art, "", 0, 2);
  fx_behaviour db = fx_defaults();
  for (int i = 0; i < 6; i++) {
    int up = i % 2;
    db.decode_routed_experts = up ? dhi : dlo;
    fx_set(g.s.d[0], &db);
    fx_set(g.s.d[1], &db);
    send_mix(&g, up ? hi : lo, 1);
  }
  json_t *s = status_json(g.s.r.port);
  json_t *rho = json_object_get(s, "rho");
  assert_int_equal(json_integer_value(json_object_get(rho, "pairs")), 6);
  assert_true(json_real_value(json_object_get(rho, "live")) > 0.99);
  json_decref(s);
  assert_int_equal(rt_metric(g.s.r.port, "eldr_live_rho_pairs"), 6);
  rig_stop(&g);
  unlink(art);
  free(art);
  free(lo);
  free(hi);
  free(dlo);
  free(dhi);
}

static void test_admin_reload_auth(void **st) {
  (void)st;
  char *art = fx_artifact(&SH, "watch_auth");
  rig g;
  rig_start(&g, art, "", 0, 0); /* no admin_token: no endpoint */
  tc_resp r;
  assert_int_equal(tc_post(g.s.r.port, "/admin/reload", "", AUTH, &r), 0);
  assert_int_equal(r.status, 404);
  tc_free(&r);
  rig_stop(&g);
  rig_start(&g, art, ",\"admin_token\":\"" TOKEN "\"", 0, 0);
  int port = g.s.r.port;
  assert_int_equal(tc_post(port, "/admin/reload", "", NULL, &r), 0);
  assert_int_equal(r.status, 401);
  char h[64];
  assert_int_equal(tc_header(&r, "WWW-Authenticate", h, sizeof h), 0);
  tc_free(&r);
  const char *wrong[] = {"Authorization: Bearer s3cret-admin-token-0124\r\n", "Authorization: Bearer s3cret\r\n",
                         "Authorization: Bearer " TOKEN "x\r\n", "Authorization: Basic " TOKEN "\r\n"};
  for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
    assert_int_equal(tc_post(port, "/admin/reload", "", wrong[i], &r), 0);
    assert_int_equal(r.status, 401);
    tc_free(&r);
  }
  assert_int_equal(rt_metric(port, "eldr_reloads_total{result=\"ok\"}"), 0);
  tc_resp g2; /* credentials first: without them a wrong method is not even named */
  assert_int_equal(tc_get(port, "/admin/reload", &g2), 0);
  assert_int_equal(g2.status, 401);
  tc_free(&g2);
  const char *get = "GET /admin/reload HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n";
  assert_int_equal(tc_raw(port, get, strlen(get), 10, &g2), 0);
  assert_int_equal(g2.status, 405);
  tc_free(&g2);
  /* a reload that fails (the artifact is no longer valid): 500, the
   * reason, nothing changed, requests go on */
  FILE *f = fopen(art, "w");
  fputs("{\"format\":\"eldr-artifact\"", f);
  fclose(f);
  assert_int_equal(tc_post(port, "/admin/reload", "", AUTH, &r), 0);
  assert_int_equal(r.status, 500);
  json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(j, "result")), "error");
  assert_non_null(strstr(json_string_value(json_object_get(j, "error")), art));
  json_decref(j);
  tc_free(&r);
  assert_int_equal(rt_metric(port, "eldr_reloads_total{result=\"error\"}"), 1);
  char *lo = routed(3, 0);
  send_mix(&g, lo, 3);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"), 3);
  rig_stop(&g);
  unlink(art);
  free(art);
  free(lo);
}

/* ---- zero failed requests through artifact swaps under load ------------------ */

typedef struct load {
  int port;
  volatile int stop;
  pthread_mutex_t mu;
  long ok, failed, first_bad;
} load;

static void *client(void *arg) {
  load *l = arg;
  while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) {
    int s = post_status(l->port, NULL);
    pthread_mutex_lock(&l->mu);
    if (s == 200) l->ok++;
    else {
      l->failed++;
      if (!l->first_bad) l->first_bad = s;
    }
    pthread_mutex_unlock(&l->mu);
  }
  return NULL;
}

static long load_ok(load *l) {
  pthread_mutex_lock(&l->mu);
  long n = l->ok;
  pthread_mutex_unlock(&l->mu);
  return n;
}

/* Wait until the clients completed `more` requests beyond now. */
static void wait_progress(load *l, long more) {
  long want = load_ok(l) + more;
  double dl = fx_now() + 20;
  while (load_ok(l) < want && fx_now() < dl) {
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_true(load_ok(l) >= want);
}

static void test_reload_under_load(void **st) {
  (void)st;
  char *a = fx_artifact(&SH, "swap_a"), b[256], live[256];
  snprintf(b, sizeof b, "/tmp/eldr_test_%d_swap_b.json", (int)getpid());
  snprintf(live, sizeof live, "/tmp/eldr_test_%d_swap_live.json", (int)getpid());
  with_ref(a, b, 14); /* another text: another hash */
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cp %s %s", a, live);
  assert_int_equal(system(cmd), 0);
  char *lo = routed(3, 0);
  rig g;
  rig_start(&g, live, ",\"admin_token\":\"" TOKEN "\"", 1, 0);
  g.pb.routed_experts = lo;
  fx_set(g.s.p[0], &g.pb);
  load l = {.port = g.s.r.port};
  pthread_mutex_init(&l.mu, NULL);
  enum { CLIENTS = 4, SWAPS = 6 };
  pthread_t th[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) assert_int_equal(pthread_create(&th[i], NULL, client, &l), 0);
  wait_progress(&l, 50);
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", live);
  for (int i = 0; i < SWAPS; i++) {
    /* the new artifact replaces the file atomically, as a deploy would */
    snprintf(cmd, sizeof cmd, "cp %s %s && mv %s %s", i % 2 ? a : b, tmp, tmp, live);
    assert_int_equal(system(cmd), 0);
    if (i % 2 == 0) {
      kill(getpid(), SIGHUP);
      assert_int_equal(rt_wait_metric(g.s.r.port, "eldr_reloads_total{result=\"ok\"}", i + 1, 10), 0);
    } else {
      tc_resp r;
      assert_int_equal(tc_post(g.s.r.port, "/admin/reload", "", AUTH, &r), 0);
      if (r.status != 200) fail_msg("reload %d: %d %s", i, r.status, r.body);
      tc_free(&r);
    }
    json_t *s = status_json(g.s.r.port);
    char want[20];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)file_hash(i % 2 ? a : b));
    assert_string_equal(json_string_value(json_object_get(json_object_get(s, "artifact"), "hash")), want);
    json_decref(s);
    wait_progress(&l, 30); /* requests flow between swaps */
  }
  __atomic_store_n(&l.stop, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < CLIENTS; i++) pthread_join(th[i], NULL);
  assert_int_equal(rt_metric(g.s.r.port, "eldr_reloads_total{result=\"ok\"}"), SWAPS);
  assert_int_equal(rt_metric(g.s.r.port, "eldr_reloads_total{result=\"error\"}"), 0);
  if (l.failed) fail_msg("%ld of %ld requests failed (first status %ld)", l.failed, l.failed + l.ok, l.first_bad);
  print_message("reload under load: %ld requests, 0 failed, %d swaps (SIGHUP and POST)\n", l.ok, SWAPS);
  double served = rt_metric(g.s.r.port, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}");
  assert_true(served >= (double)l.ok);
  rig_stop(&g);
  unlink(a);
  unlink(b);
  unlink(live);
  free(a);
  free(lo);
  pthread_mutex_destroy(&l.mu);
}

/* K = 2 centroids in front of D = 3 decoders: decoders 0 and 2 share
 * centroid 0 (capacity 2/3), decoder 1 has centroid 1; a request near
 * centroid 0 goes to the less loaded of 0 and 2, never to 1. */
static void test_k_ne_d(void **st) {
  (void)st;
  char *art = fx_artifact(&SH, "watch_knd");
  char *lo = routed(3, 0), *hi = routed(3, 6);
  rig g;
  rig_start_n(&g, 3, art, "", 0, 2);
  int port = g.s.r.port;
  send_mix(&g, lo, 4);
  assert_int_equal(fx_count(g.s.d[1], "/v1/completions"), 0);
  assert_int_equal(fx_count(g.s.d[0], "/v1/completions") + fx_count(g.s.d[2], "/v1/completions"), 4);
  send_mix(&g, hi, 2);
  assert_int_equal(fx_count(g.s.d[1], "/v1/completions"), 2);
  double c0 = rt_metric(port, "eldr_centroid_capacity_share{centroid=\"0\"}");
  assert_true(fabs(c0 - 2.0 / 3) < 1e-5);
  assert_true(fabs(rt_metric(port, "eldr_centroid_share{centroid=\"0\"}") - 4.0 / 6) < 1e-5);
  sf_stop(&g.s);
  assert_non_null(strstr(rt_log_text(&g.s.r), "decoder i uses centroid i % 2"));
  rig_stop(&g);
  unlink(art);
  free(art);
  free(lo);
  free(hi);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_and_drift),
      cmocka_unit_test(test_live_rho),
      cmocka_unit_test(test_k_ne_d),
      cmocka_unit_test(test_admin_reload_auth),
      cmocka_unit_test(test_reload_under_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
