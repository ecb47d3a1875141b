/* test_threads.c — the router's event loops (--threads): the shared
 * in-flight counts a decision reserves by compare-and-swap, so two loops
 * never both take the same idle decoder: under two threads racing over
 * shared slots, and through the real router (two loops, SO_REUSEPORT, a
 * burst of held decode legs over as many idle decoders); /metrics summing
 * every loop; a busy port refused although the loops share theirs; the
 * `threads` key's bounds. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/serve.h"
#include "serve/serve_types.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

/* ---- the reservation itself: two threads, shared slots ------------------------ */

#define NSLOT 2048

typedef struct racer {
  eldr__slot **slots;
  pthread_barrier_t *go;
  int idx;
  size_t picks, lost;
} racer;

/* JSQ over the slots (lowest index among the least loaded), then the
 * reservation; a lost race decides again, as the router does. */
static void *race(void *arg) {
  racer *x = arg;
  static uint32_t seen[2][NSLOT];
  uint32_t *sn = seen[x->idx];
  pthread_barrier_wait(x->go);
  for (size_t done = 0; done < NSLOT / 2;) {
    size_t best = 0;
    for (size_t i = 0; i < NSLOT; i++) {
      sn[i] = x->slots[i]->inflight;
      if (sn[i] < sn[best]) best = i;
    }
    if (eldr__slot_reserve(x->slots[best], sn[best])) {
      done++;
      x->picks++;
    } else {
      x->lost++;
    }
  }
  return NULL;
}

static void test_reserve_two_threads(void **st) {
  (void)st;
  eldr__group *g = eldr__group_new(2);
  assert_non_null(g);
  eldr__slot **slots = calloc(NSLOT, sizeof *slots);
  assert_non_null(slots);
  for (size_t i = 0; i < NSLOT; i++) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%zu", 1000 + i);
    slots[i] = eldr__slot_get(g, ROLE_DECODE, url);
    assert_non_null(slots[i]);
    assert_int_equal(slots[i]->healthy, 1);
  }
  /* a second worker object of the same URL (another loop) shares the slot */
  eldr__slot *again = eldr__slot_get(g, ROLE_DECODE, "http://127.0.0.1:1000");
  assert_ptr_equal(again, slots[0]);
  eldr__slot_put(g, again);
  assert_ptr_not_equal(eldr__slot_get(g, ROLE_PREFILL, "http://127.0.0.1:1000"), slots[0]);
  /* rounds: the threads collide on some picks of most rounds */
  for (int round = 0; round < 8; round++) {
    for (size_t i = 0; i < NSLOT; i++) slots[i]->inflight = 0;
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    racer x[2] = {{slots, &go, 0, 0, 0}, {slots, &go, 1, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, race, &x[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(x[0].picks + x[1].picks, NSLOT);
    /* every decoder taken exactly once: no pick was made twice */
    for (size_t i = 0; i < NSLOT; i++)
      if (slots[i]->inflight != 1) fail_msg("round %d, slot %zu: %u legs", round, i, (unsigned)slots[i]->inflight);
    if (round == 0)
      fprintf(stderr, "reserve: %zu + %zu picks, %zu + %zu lost races\n", x[0].picks, x[1].picks, x[0].lost,
              x[1].lost);
  }
  free(slots);
  eldr__group_free(g); /* frees the slots still held */
}

/* ---- through the router: two loops, a burst over idle decoders ------------------- */

#define ND 16

static void test_burst_one_per_decoder(void **st) {
  (void)st;
  fx_behaviour hang = fx_defaults();
  hang.hang = 1; /* every decode leg stays in flight */
  sf_rig g;
  sf_start(&g, 1, NULL, ND, &hang);
  fx_worker **d = g.d;
  g.c.threads = 2;
  g.c.policy = ELDR_POLICY_JSQ;
  sf_run(&g);
  /* ND clients at once, each on its own connection: the kernel spreads them
   * over both loops' listeners */
  int fd[ND];
  for (int i = 0; i < ND; i++) {
    char req[256];
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 16\r\n\r\n{\"prompt\":\"b%02d\"}", i);
    fd[i] = tc_send_raw(g.r.port, req);
    assert_true(fd[i] >= 0);
  }
  double dl = fx_now() + 10;
  size_t total = 0;
  while (fx_now() < dl) {
    total = 0;
    for (int i = 0; i < ND; i++) total += fx_count(d[i], "/v1/completions");
    if (total >= ND) break;
    usleep(2000); /* polling a condition with a deadline */
  }
  assert_int_equal(total, ND);
  for (int i = 0; i < ND; i++)
    if (fx_count(d[i], "/v1/completions") != 1)
      fail_msg("decoder %d got %zu decode legs of the burst\n%s", i, fx_count(d[i], "/v1/completions"), rt_log_text(&g.r));
  /* both loops took part (a 2^-15 chance that the kernel put all on one) */
  double l0 = rt_metric(g.r.port, "eldr_loop_connections_total{loop=\"0\"}");
  double l1 = rt_metric(g.r.port, "eldr_loop_connections_total{loop=\"1\"}");
  fprintf(stderr, "burst: loop 0 accepted %.0f, loop 1 %.0f connections\n", l0, l1);
  assert_true(l0 >= 1 && l1 >= 1);
  /* the slots' in-flight counts, from whichever loop answers /metrics */
  char series[256];
  for (int i = 0; i < ND; i++) {
    snprintf(series, sizeof series, "eldr_worker_inflight{role=\"decode\",worker=\"%s\"}", fx_url(d[i]));
    assert_int_equal(rt_metric(g.r.port, series), 1);
  }
  for (int i = 0; i < ND; i++) close(fd[i]);
  sf_free(&g);
}

/* /metrics sums every loop's counters, whichever loop serves it. */
static void test_metrics_sum_loops(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  fx_worker *d = g.d[0];
  g.c.threads = 3;
  g.c.policy = ELDR_POLICY_JSQ;
  sf_run(&g);
  const int N = 24; /* one connection each (tc_post closes): spread over the loops */
  for (int i = 0; i < N; i++) {
    tc_resp resp;
    assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
    assert_int_equal(resp.status, 200);
    tc_free(&resp);
  }
  for (int k = 0; k < 3; k++) { /* the same sums from every loop that answers */
    assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}"), N);
    char series[256];
    snprintf(series, sizeof series, "eldr_worker_requests_total{role=\"decode\",worker=\"%s\"}", fx_url(d));
    assert_int_equal(rt_metric(g.r.port, series), N);
    assert_int_equal(rt_metric(g.r.port, "eldr_request_seconds_count"), N);
  }
  double acc = 0;
  int loops_used = 0;
  for (int l = 0; l < 3; l++) {
    char series[64];
    snprintf(series, sizeof series, "eldr_loop_connections_total{loop=\"%d\"}", l);
    double v = rt_metric(g.r.port, series);
    assert_true(v >= 0);
    acc += v;
    loops_used += v > 0;
  }
  assert_true(acc >= N); /* the requests' connections and the /metrics reads */
  fprintf(stderr, "metrics: %d of 3 loops accepted connections\n", loops_used);
  assert_true(loops_used >= 2);
  sf_free(&g);
}

/* SO_REUSEPORT does not let a second router take half of a busy port. */
static void test_port_in_use(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  g.c.threads = 2;
  sf_run(&g);
  g.c.port = g.r.port;
  g.c.log = NULL;
  eldr_server *second = NULL;
  eldr_diag dg = {{0}};
  int rc = eldr_server_new(&g.c, &second, &dg);
  assert_int_not_equal(rc, 0);
  assert_null(second);
  if (!strstr(dg.msg, "Address already in use")) fail_msg("%s", dg.msg);
  tc_resp resp; /* the first one still serves */
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  sf_free(&g);
}

static void test_threads_key(void **st) {
  (void)st;
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  assert_int_equal(c.threads, 0); /* the online cores */
  eldr_diag d = {{0}};
  assert_int_equal(eldr_serve_config_parse(&c, "{\"threads\":4}", 13, &d), 0);
  assert_int_equal(c.threads, 4);
  assert_int_not_equal(eldr_serve_config_parse(&c, "{\"threads\":-1}", 14, &d), 0);
  assert_non_null(strstr(d.msg, "threads"));
  assert_int_not_equal(eldr_serve_config_parse(&c, "{\"threads\":100000}", 18, &d), 0);
  assert_non_null(strstr(d.msg, "threads"));
  eldr_serve_config_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reserve_two_threads),
      cmocka_unit_test(test_burst_one_per_decoder),
      cmocka_unit_test(test_metrics_sum_loops),
      cmocka_unit_test(test_port_in_use),
      cmocka_unit_test(test_threads_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
