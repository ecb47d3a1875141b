/* test_loops_shared.c — what a two-loop router (threads = 2, real loopback
 * sockets, fixture workers) shares beyond the workers' slots: the
 * signature cache (a prompt prefix whose block rows were stored through one
 * loop completes the signature of a request served by the other; its
 * /metrics lines count the one cache once) and the watch window (the
 * decisions of both loops in one window), and a reload that replaces the
 * cache moves every loop onto the new one. The two requests are forced
 * onto different loops: each goes over a keep-alive connection whose loop
 * is known from the loops' accept counters (serve_types.h) once a first
 * GET /health on it was answered; connections are opened until one lands
 * on the other loop. No sleeps: every wait is on a reply. */
#define _GNU_SOURCE /* strcasestr */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/serve.h"
#include "serve/serve_types.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

static const eldr_shape SH = {4, 8, 2};

/* ---- one keep-alive connection of known loop ---------------------------------- */

/* One response on fd: status, body copied into body (NUL-terminated).
 * 0 or -1 (closed, timed out or malformed). */
static int read_response(int fd, int *status, char *body, size_t cap) {
  static char buf[1 << 16];
  tc_read_until(fd, buf, sizeof buf, "\r\n\r\n");
  char *eoh = strstr(buf, "\r\n\r\n");
  if (!eoh || sscanf(buf, "HTTP/1.1 %d", status) != 1) return -1;
  const char *cl = strcasestr(buf, "\r\nContent-Length:");
  if (!cl || cl > eoh) return -1;
  size_t want = strtoul(cl + 17, NULL, 10), have = strlen(eoh + 4);
  if (want >= cap) return -1;
  memcpy(body, eoh + 4, have);
  while (have < want) { /* the rest of the body */
    ssize_t k = recv(fd, body + have, want - have, 0);
    if (k <= 0) return -1;
    have += (size_t)k;
  }
  body[want] = 0;
  return 0;
}

static uint64_t accepted(const rt_router *r, int loop) { return r->srv->grp->loops[loop]->m.accepted; }

/* A connection to the router served once (GET /health), and the loop that
 * accepted it. -1 on failure. */
static int open_conn(const rt_router *r, int *loop) {
  uint64_t before[2] = {accepted(r, 0), accepted(r, 1)};
  int fd = tc_send_raw(r->port, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  if (fd < 0) return -1;
  int status;
  char body[4096];
  if (read_response(fd, &status, body, sizeof body)) {
    close(fd);
    return -1;
  }
  /* the reply came from the loop that accepted it: its counter moved */
  *loop = accepted(r, 0) != before[0] ? 0 : accepted(r, 1) != before[1] ? 1 : -1;
  if (*loop < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A connection on the loop other than `not` (at most 64 tries: the kernel
 * spreads connections over the two listeners by their addresses). */
static int open_conn_other(const rt_router *r, int not, int *loop) {
  for (int i = 0; i < 64; i++) {
    int fd = open_conn(r, loop);
    assert_true(fd >= 0);
    if (*loop != not) return fd;
    close(fd);
  }
  fail_msg("64 connections all landed on event loop %d", not);
  return -1;
}

/* POST /v1/completions over fd; the decoder that served it (its port). */
static int post_on(int fd, const char *json) {
  char req[4096];
  int n = snprintf(req, sizeof req,
                   "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\n\r\n%s",
                   strlen(json), json);
  assert_true(n > 0 && (size_t)n < sizeof req);
  assert_int_equal(send(fd, req, (size_t)n, 0), n);
  int status;
  static char body[1 << 16];
  assert_int_equal(read_response(fd, &status, body, sizeof body), 0);
  if (status != 200) fail_msg("status %d: %s", status, body);
  json_t *j = json_loads(body, 0, NULL);
  assert_non_null(j);
  int port = (int)json_integer_value(json_object_get(j, "served_by"));
  json_decref(j);
  return port;
}

static double status_window(int port) {
  tc_resp r;
  assert_int_equal(tc_get(port, "/eldr/status", &r), 0);
  assert_int_equal(r.status, 200);
  json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
  assert_non_null(j);
  double n = (double)json_integer_value(json_object_get(json_object_get(j, "window"), "requests"));
  json_decref(j);
  tc_free(&r);
  return n;
}

/* ---- the test ------------------------------------------------------------------- */

/* The prompt of test_serve's test_sigcache_completion (3 blocks; the first
 * 32 tokens on experts 6, 7, the last 16 on 0, 1), its first request through
 * loop A, its second, whose prefill reply carries only the uncached last
 * block, through loop B: the cache completes the signature there (decoder
 * 1, not the partial signature's decoder 0). */
static void test_prefix_stored_on_one_loop_hits_on_the_other(void **st) {
  (void)st;
  char *art = fx_artifact(&SH, "loops_shared");
  char prompt[1024], *all = NULL, *tail = NULL;
  sf_prefix_prompt(&SH, prompt, sizeof prompt, &all, &tail);
  fx_behaviour pb = fx_defaults();
  pb.routed_experts = all;
  pb.prompt_tokens = 48;
  pb.cached_tokens = 0;
  sf_rig g;
  sf_start(&g, 1, &pb, 2, NULL);
  fx_worker *p = g.p[0], *d1 = g.d[1];
  g.c.header_timeout_s = 5;
  g.c.threads = 2;
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(art);
  sf_run(&g);
  rt_router *r = &g.r;
  assert_int_equal(r->srv->grp->n, 2);
  /* one cache and one window for both loops */
  assert_ptr_equal(r->srv->grp->loops[0]->sp.conf.cache, r->srv->grp->loops[1]->sp.conf.cache);
  assert_non_null(r->srv->grp->loops[0]->sp.conf.cache);
  json_t *b = json_pack("{s:s}", "prompt", prompt);
  char *body = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  int la = -1, lb = -1;
  int fa = open_conn(r, &la);
  assert_true(fa >= 0);
  int fb = open_conn_other(r, la, &lb);
  assert_int_not_equal(la, lb);
  /* loop A: every row computed, stored in the cache once the decode leg left */
  assert_int_equal(post_on(fa, body), fx_port(d1));
  assert_int_equal(rt_metric(r->port, "eldr_sigcache_rows"), 3); /* one cache: counted once */
  /* loop B: the engine cached 32 tokens and returns the last 16 only */
  pb.routed_experts = tail;
  pb.cached_tokens = 32;
  fx_set(p, &pb);
  assert_int_equal(post_on(fb, body), fx_port(d1));
  assert_int_equal(rt_metric(r->port, "eldr_sigcache_hits_total"), 2);
  assert_int_equal(rt_metric(r->port, "eldr_sigcache_misses_total"), 0);
  assert_int_equal(rt_metric(r->port, "eldr_signature_blocks_missing_total"), 0);
  assert_int_equal(rt_metric(r->port, "eldr_sigcache_rows"), 3);
  assert_true(rt_metric(r->port, "eldr_sigcache_lock_waits_total") >= 0); /* present */
  /* both decisions, one per loop, in the one window */
  assert_int_equal(status_window(r->port), 2);
  assert_int_equal(rt_metric(r->port, "eldr_watch_requests"), 2);
  close(fa);
  close(fb);
  sf_free(&g);
  free(body);
  free(all);
  free(tail);
  unlink(art);
  free(art);
}

/* A reload that changes the cache's size builds one new cache, and every
 * loop (loop 0 leads, the others follow on their own threads) ends on it. */
static void test_reload_shares_the_new_cache(void **st) {
  (void)st;
  char *art = fx_artifact(&SH, "loops_shared_reload");
  char extra[512];
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  snprintf(extra, sizeof extra, ",\"artifact\":\"%s\"", art);
  sf_config_file(&g, "loops_shared", "eldr", extra);
  g.c.threads = 3;
  sf_run(&g);
  eldr__group *grp = g.r.srv->grp;
  eldr_sigshard *first = eldr_sigshard_ref(grp->loops[0]->sp.conf.cache); /* before any reload */
  for (int i = 1; i < 3; i++) assert_ptr_equal(grp->loops[i]->sp.conf.cache, first);
  snprintf(extra, sizeof extra, ",\"artifact\":\"%s\",\"sigcache_rows\":1024", art);
  sf_write_config(&g, "eldr", extra);
  eldr_server_reload(g.r.srv);
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_reloads_total{result=\"ok\"}", 1, 10), 0);
  /* stop and join the loops (a follower runs its pending reload before it
   * leaves), then read what each committed */
  rt_join(&g.r);
  eldr_sigshard *now = grp->loops[0]->sp.conf.cache;
  assert_non_null(now);
  assert_ptr_not_equal(now, first);
  eldr_sigcache_stats s;
  eldr_sigshard_stats_get(now, &s);
  assert_int_equal(s.capacity, 1024);
  for (int i = 1; i < 3; i++) assert_ptr_equal(grp->loops[i]->sp.conf.cache, now);
  assert_ptr_equal(grp->sigshare.cache, now);
  eldr_sigshard_free(first);
  sf_free(&g);
  unlink(art);
  free(art);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefix_stored_on_one_loop_hits_on_the_other),
      cmocka_unit_test(test_reload_shares_the_new_cache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
