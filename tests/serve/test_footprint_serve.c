/* test_footprint_serve.c — the footprint decode policy through the real
 * router (eldr_server over loopback sockets, fixture workers): decisions
 * by footprint where JSQ would choose otherwise, the state's in-flight count
 * back to zero when every decode leg has ended (finished or the client
 * gone), a reload while footprint tickets are in flight, and the JSQ
 * fallback (said once) for an artifact without latency coefficients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "eldr/artifact.h"
#include "eldr/latency.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

static const eldr_shape SH = {4, 8, 2};

static char *routed(size_t n, int e0) { return sf_routed(&SH, n, e0); }

/* A 2-centroid artifact; with_latency: the OLMoE/H200 preset's coefficients
 * on this shape. */
static char *make_artifact(int with_latency, const char *tag) {
  eldr_artifact *a = eldr_artifact_new("fixture", &SH, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  assert_non_null(a);
  for (size_t c = 0; c < 2; c++) {
    for (size_t l = 0; l < SH.num_layers; l++)
      for (size_t e = 0; e < SH.num_experts; e++)
        a->centroids[c * a->dim + l * SH.num_experts + e] = (e / 4 == c) ? 0.25f : 0.0f;
    a->cluster_sizes[c] = 1;
  }
  a->tau = 0.1;
  a->fit_n = 2;
  a->fit_balanced = 1;
  eldr_diag d = {{0}};
  if (with_latency) {
    eldr_latency_model m;
    assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "h200", &m, &d), 0);
    m.shape = SH;
    assert_int_equal(eldr_artifact_set_latency(a, &m, &d), 0);
  }
  char *path = malloc(256);
  snprintf(path, 256, "/tmp/eldr_test_fpserve_%d_%s.json", (int)getpid(), tag);
  assert_int_equal(eldr_artifact_save(path, a, &d), 0);
  eldr_artifact_free(a);
  return path;
}

static const char *STREAM =
    "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 28\r\n\r\n{\"prompt\":\"a\",\"stream\":true}";

/* A streaming request held open after its first chunk: its decode leg (and
 * footprint ticket) stays in flight until the fd is closed. */
static int held_stream(int port) {
  int fd = tc_send_raw(port, STREAM);
  assert_true(fd >= 0);
  char buf[8192];
  tc_read_until(fd, buf, sizeof buf, "data:");
  if (strncmp(buf, "HTTP/1.1 200", 12) || !strstr(buf, "data:")) fail_msg("stream: [%s]", buf);
  return fd;
}

static void test_footprint_decides_and_drains(void **st) {
  (void)st;
  char *art = make_artifact(1, "lat");
  char *lo = routed(5, 0), *hi = routed(5, 6);
  fx_behaviour pb = fx_defaults(), hold = fx_defaults();
  pb.routed_experts = lo;
  hold.stall_after_chunks = 1;
  sf_rig g;
  sf_start(&g, 1, &pb, 2, &hold);
  fx_worker *p = g.p[0], *d0 = g.d[0], *d1 = g.d[1];
  g.c.threads = 1; /* the footprint state is per loop */
  g.c.policy = ELDR_POLICY_FOOTPRINT;
  g.c.artifact = strdup(art);
  sf_run(&g);
  const char *inflight = "eldr_footprint_inflight";
  assert_int_equal(rt_metric(g.r.port, inflight), 0);
  /* A (experts 0,1) on decoder 0 (tie: lower index), B (experts 6,7) on
   * decoder 1 (the empty one), both held in flight */
  int fa = held_stream(g.r.port);
  assert_int_equal(fx_count(d0, "/v1/completions"), 1);
  pb.routed_experts = hi;
  fx_set(p, &pb);
  int fb = held_stream(g.r.port);
  assert_int_equal(fx_count(d1, "/v1/completions"), 1);
  assert_int_equal(rt_metric(g.r.port, inflight), 2);
  /* C (experts 6,7), loads 1 and 1: JSQ takes decoder 0 (lower index);
   * footprint takes decoder 1, whose live experts C shares */
  for (int i = 0; i < 2; i++) {
    assert_int_equal(sf_post_served_by(g.r.port), fx_port(d1));
  }
  /* and C with experts 0,1 goes to decoder 0 */
  pb.routed_experts = lo;
  fx_set(p, &pb);
  assert_int_equal(sf_post_served_by(g.r.port), fx_port(d0));
  assert_int_equal(rt_metric(g.r.port, inflight), 2); /* the finished ones ended */
  assert_int_equal(
      rt_metric(g.r.port, "eldr_requests_total{policy=\"footprint\",decision=\"locality\",outcome=\"ok\"}"), 3);
  /* a reload while A and B hold tickets on the old state: the new one
   * starts empty, the old one lives until they end */
  eldr_server_reload(g.r.srv);
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_reloads_total{result=\"ok\"}", 1, 10), 0);
  assert_int_equal(rt_metric(g.r.port, inflight), 0);
  int fc = held_stream(g.r.port); /* on the new state */
  assert_int_equal(rt_metric(g.r.port, inflight), 1);
  close(fa); /* clients gone: their decode legs end */
  close(fb);
  close(fc);
  assert_int_equal(rt_wait_metric_le(g.r.port, inflight, 0, 10), 0);
  assert_int_equal(rt_wait_metric(g.r.port,
                                  "eldr_requests_total{policy=\"footprint\",decision=\"locality\",outcome=\"cancelled\"}",
                                  3, 10), 0);
  assert_int_equal(rt_metric(g.r.port, inflight), 0);
  sf_stop(&g);
  assert_null(strstr(rt_log_text(&g.r), "runs as JSQ"));
  sf_free(&g);
  unlink(art);
  free(art);
  free(lo);
  free(hi);
}

/* Without latency coefficients: JSQ, said once, decisions by load, no state. */
static void test_footprint_without_latency_is_jsq(void **st) {
  (void)st;
  char *art = make_artifact(0, "nolat");
  char *hi = routed(5, 6);
  fx_behaviour pb = fx_defaults();
  pb.routed_experts = hi;
  sf_rig g;
  sf_start(&g, 1, &pb, 2, NULL);
  fx_worker *d0 = g.d[0];
  g.c.threads = 1; /* the footprint state is per loop */
  g.c.policy = ELDR_POLICY_FOOTPRINT;
  g.c.artifact = strdup(art);
  sf_run(&g);
  tc_resp resp;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
    assert_int_equal(resp.status, 200);
    assert_int_equal(sf_served_by(&resp), fx_port(d0)); /* JSQ: both idle, lower index */
    tc_free(&resp);
  }
  assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"footprint\",decision=\"load\",outcome=\"ok\"}"), 2);
  assert_int_equal((long)rt_metric(g.r.port, "eldr_footprint_inflight"), -1);
  sf_stop(&g);
  const char *m = strstr(rt_log_text(&g.r), "carries no latency coefficients");
  assert_non_null(m);
  assert_null(strstr(m + 1, "carries no latency coefficients"));
  assert_non_null(strstr(rt_log_text(&g.r), "runs as JSQ"));
  sf_free(&g);
  unlink(art);
  free(art);
  free(hi);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_footprint_decides_and_drains),
      cmocka_unit_test(test_footprint_without_latency_is_jsq),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
