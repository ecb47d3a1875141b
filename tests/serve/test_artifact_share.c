/* test_artifact_share.c — one artifact per start and per reload, shared by
 * every event loop (issue: with --threads N each follower loop parsed the
 * artifact file again after the leader committed, so a file rewritten in
 * that window left the loops on different artifacts while the reload
 * answered ok).
 *
 * A router with four loops over fixture workers, its artifact named in a
 * config file. The window is opened on purpose by eldr__lead_hook, which
 * runs on the leading loop right after its commit and before the other
 * loops are handed the configuration: the hook renames another artifact
 * over the file. Every loop must still run the artifact the leader loaded
 * (GET /eldr/status "loops": every loop's reload number and artifact hash),
 * at start and after a reload. A second case rewrites the file from a
 * thread while reloads run back to back, as an operator's deploy would.
 * Waits are on the status document (a deadline, no sleeps). */
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/serve.h"
#include "serve/serve_types.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

#define LOOPS 4
static const eldr_shape SH = {4, 8, 2};

/* The fixture artifact with tau = 0.1 + i / 100 (another text, another
 * hash) at /tmp/eldr_test_<pid>_share<i>.json; its hash in *hash. */
static char *variant(int i, uint64_t *hash) {
  char tag[32];
  snprintf(tag, sizeof tag, "share%d", i);
  char *path = fx_artifact(&SH, tag);
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  if (eldr_artifact_load(path, &a, &d)) fail_msg("%s", d.msg);
  a->tau = 0.1 + i / 100.0;
  if (eldr_artifact_save(path, a, &d)) fail_msg("%s", d.msg);
  eldr_artifact_free(a);
  if (eldr_artifact_load(path, &a, &d)) fail_msg("%s", d.msg);
  *hash = a->text_hash;
  eldr_artifact_free(a);
  return path;
}

/* Copy src over dst by rename (a whole file at every instant). */
static void install(const char *src, const char *dst) {
  char tmp[300], buf[1 << 16];
  snprintf(tmp, sizeof tmp, "%s.tmp", dst);
  FILE *in = fopen(src, "rb"), *out = fopen(tmp, "wb");
  if (!in || !out) fail_msg("cannot copy %s to %s", src, tmp);
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
  fclose(in);
  if (fclose(out) || rename(tmp, dst)) fail_msg("cannot install %s", dst);
}

static const char *g_dst;              /* the artifact file the router's config names */
static const char *_Atomic g_next;     /* what the hook installs there (once), or NULL */
static _Atomic int g_hook_calls;

static void hook(eldr_server *leader) {
  (void)leader;
  g_hook_calls++;
  const char *next = atomic_exchange(&g_next, NULL);
  if (next) install(next, g_dst);
}

static json_t *status_json(int port) {
  tc_resp r;
  assert_int_equal(tc_get(port, "/eldr/status", &r), 0);
  assert_int_equal(r.status, 200);
  json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
  if (!j) fail_msg("not JSON: %s", r.body);
  tc_free(&r);
  return j;
}

/* Wait (10 s) until every loop runs reload number gen, then check that all
 * of them route by the artifact of hash want. */
static void expect_loops(int port, long long gen, uint64_t want) {
  char wants[20];
  snprintf(wants, sizeof wants, "%016llx", (unsigned long long)want);
  double end = fx_now() + 10;
  for (;;) {
    json_t *s = status_json(port);
    json_t *loops = json_object_get(s, "loops");
    assert_int_equal(json_array_size(loops), LOOPS);
    int settled = 1;
    for (size_t i = 0; i < LOOPS; i++)
      settled &= json_integer_value(json_object_get(json_array_get(loops, i), "reload")) == gen;
    if (settled) {
      char split[256] = "";
      int same = 1;
      for (size_t i = 0; i < LOOPS; i++) {
        const char *h = json_string_value(json_object_get(json_array_get(loops, i), "artifact_hash"));
        same &= h && !strcmp(h, wants);
        size_t k = strlen(split);
        snprintf(split + k, sizeof split - k, " loop %zu: %s", i, h ? h : "none");
      }
      json_decref(s);
      if (!same) fail_msg("loops on different artifacts (want %s):%s", wants, split);
      return;
    }
    json_decref(s);
    if (fx_now() > end) fail_msg("the loops did not all take reload %lld within 10 s", gen);
  }
}

static void rig_start(sf_rig *g, const char *art) {
  sf_start(g, 1, NULL, 2, NULL);
  char keys[512];
  snprintf(keys, sizeof keys, ",\"artifact\":\"%s\",\"threads\":%d", art, LOOPS);
  sf_config_file(g, "share", "eldr", keys);
  g->c.threads = LOOPS;
  sf_run(g);
}

/* The file is replaced between the leader's load and the other loops':
 * at start (loop 0 loaded it, loops 1-3 start after the hook) and on a
 * reload (the leader committed, the followers build after the hook). */
static void test_window(void **st) {
  (void)st;
  uint64_t h[4];
  char *v[4];
  for (int i = 0; i < 4; i++) v[i] = variant(i, &h[i]);
  char dst[256];
  snprintf(dst, sizeof dst, "/tmp/eldr_test_%d_share_live.json", (int)getpid());
  install(v[0], dst);
  g_dst = dst;
  g_next = v[1];
  g_hook_calls = 0;
  eldr__lead_hook = hook;
  sf_rig g;
  memset(&g, 0, sizeof g);
  rig_start(&g, dst);
  assert_int_equal(g_hook_calls, 1);
  expect_loops(g.r.port, 0, h[0]); /* every loop on what loop 0 loaded, not on v1 */
  assert_int_equal(sf_post_served_by(g.r.port) > 0, 1);

  install(v[2], dst); /* the reload's artifact; the hook swaps in v3 right after the leader's commit */
  g_next = v[3];
  eldr_server_reload(g.r.srv);
  expect_loops(g.r.port, 1, h[2]);
  assert_int_equal(g_hook_calls, 2);
  assert_int_equal(rt_metric(g.r.port, "eldr_reloads_total{result=\"ok\"}"), 1);
  assert_int_equal(sf_post_served_by(g.r.port) > 0, 1);
  eldr__lead_hook = NULL;
  sf_free(&g);
  for (int i = 0; i < 4; i++) {
    unlink(v[i]);
    free(v[i]);
  }
  unlink(dst);
}

/* ---- reloads while a deploy rewrites the file ---------------------------------- */

typedef struct flipper {
  const char *a, *b, *dst;
  _Atomic int stop;
  _Atomic long flips;
} flipper;

static void *flip_main(void *arg) {
  flipper *f = arg;
  while (!f->stop) install(f->flips++ % 2 ? f->a : f->b, f->dst);
  return NULL;
}

/* 24 reloads while a thread installs one artifact then the other as fast
 * as it can: each reload ends with every loop on one artifact, one of the
 * two. */
static void test_reloads_while_rewritten(void **st) {
  (void)st;
  uint64_t ha, hb;
  char *a = variant(5, &ha), *b = variant(6, &hb);
  char dst[256];
  snprintf(dst, sizeof dst, "/tmp/eldr_test_%d_share_flip.json", (int)getpid());
  install(a, dst);
  sf_rig g;
  memset(&g, 0, sizeof g);
  rig_start(&g, dst);
  flipper f = {a, b, dst, 0, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, flip_main, &f), 0);
  int on_b = 0;
  for (long gen = 1; gen <= 24; gen++) {
    long before = f.flips;
    eldr_server_reload(g.r.srv);
    /* settled: then every loop's hash is the first's */
    double end = fx_now() + 10;
    for (;;) {
      json_t *s = status_json(g.r.port);
      json_t *loops = json_object_get(s, "loops");
      long long lo = -1;
      int settled = 1;
      for (size_t i = 0; i < LOOPS; i++) {
        long long r = json_integer_value(json_object_get(json_array_get(loops, i), "reload"));
        settled &= i == 0 ? (lo = r) >= gen : r == lo;
      }
      if (settled) {
        const char *h0 = json_string_value(json_object_get(json_array_get(loops, 0), "artifact_hash"));
        assert_non_null(h0);
        for (size_t i = 1; i < LOOPS; i++) {
          const char *h = json_string_value(json_object_get(json_array_get(loops, i), "artifact_hash"));
          if (!h || strcmp(h, h0)) fail_msg("reload %ld: loop 0 on %s, loop %zu on %s", gen, h0, i, h ? h : "none");
        }
        on_b += strtoull(h0, NULL, 16) == hb;
        gen = lo;
        json_decref(s);
        break;
      }
      json_decref(s);
      if (fx_now() > end) fail_msg("reload %ld did not settle within 10 s", gen);
    }
    while (f.flips < before + 2) sched_yield(); /* the file changed in between */
  }
  f.stop = 1;
  pthread_join(th, NULL);
  printf("24 reloads while the file was rewritten %ld times: every loop on one artifact each time "
         "(%d on the second)\n", f.flips, on_b);
  sf_free(&g);
  unlink(a);
  unlink(b);
  unlink(dst);
  free(a);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window),
      cmocka_unit_test(test_reloads_while_rewritten),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
