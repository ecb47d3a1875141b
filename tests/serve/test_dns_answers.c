/* test_dns_answers.c — DNS discovery against answers libevent's evdns gets
 * wrong or cuts (issue 26, item 4), from a DNS server of the test's own on
 * loopback that speaks UDP and TCP on one port, as a real one does:
 *
 *   NOERROR with no records (a headless Service with no ready endpoints):
 *     the group empties (evdns's getaddrinfo calls it EAI_FAIL, which kept
 *     the stale workers); SERVFAIL keeps the current workers.
 *   200 addresses: the UDP answer does not fit 512 bytes, so the server
 *     sets TC; the router asks again over TCP and lists all 200.
 *   40 addresses in one UDP answer (a server that sends large UDP answers
 *     without TC): evdns keeps 32 of them, silently; the router sees its
 *     cap reached, asks over TCP and lists all 40. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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

#include "support/fixture.h"
#include "support/serve_fixture.h"

/* ---- a DNS server: UDP and TCP on one loopback port --------------------------- */

enum { ANS_RECORDS, ANS_NXDOMAIN, ANS_SERVFAIL };

typedef struct dns_srv {
  int udp, tcp, port;
  pthread_t th;
  pthread_mutex_t mu;
  _Atomic int stop;
  int mode;       /* ANS_* */
  int n_a;        /* A records: 10.1.<i / 250>.<i % 250 + 1> */
  int udp_big;    /* 1: UDP answers of any size, no TC (as with EDNS0); 0: cut to 512 with TC */
  int udp_q, tcp_q; /* queries seen */
} dns_srv;

/* The answer to query q[0..qn) into out (cap): its length, 0 to ignore. */
static size_t answer(dns_srv *d, const uint8_t *q, size_t qn, uint8_t *out, size_t cap, int udp) {
  if (qn < 17 || (q[2] & 0x80)) return 0;
  size_t i = 12; /* the question: its name, type, class, copied as sent (evdns randomises its case) */
  while (i < qn && q[i]) i += (size_t)q[i] + 1;
  if (i + 5 > qn) return 0;
  size_t qend = i + 5;
  uint16_t qtype = (uint16_t)(q[i + 1] << 8 | q[i + 2]);
  pthread_mutex_lock(&d->mu);
  int mode = d->mode, n = qtype == 1 ? d->n_a : 0, big = d->udp_big;
  pthread_mutex_unlock(&d->mu);
  if (qend > cap) return 0;
  memcpy(out, q, qend);
  out[2] = (uint8_t)(0x80 | (q[2] & 0x01)); /* QR, RD as asked */
  out[3] = (uint8_t)(0x80 | (mode == ANS_NXDOMAIN ? 3 : mode == ANS_SERVFAIL ? 2 : 0)); /* RA, RCODE */
  out[4] = 0, out[5] = 1;
  memset(out + 6, 0, 6);
  if (mode != ANS_RECORDS) return qend;
  size_t o = qend;
  int put = 0;
  for (int k = 0; k < n && o + 16 <= cap; k++, put++) {
    const uint8_t rr[16] = {0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 10, 1, (uint8_t)(k / 250), (uint8_t)(k % 250 + 1)};
    memcpy(out + o, rr, 16);
    o += 16;
  }
  if (udp && !big && o > 512) { /* what a server without EDNS0 does: the question only, TC */
    out[2] |= 0x02;
    return qend;
  }
  out[6] = (uint8_t)(put >> 8), out[7] = (uint8_t)put;
  return o;
}

static void *srv_main(void *arg) {
  dns_srv *d = arg;
  uint8_t q[1024], a[8192];
  while (!d->stop) {
    struct pollfd p[2] = {{d->udp, POLLIN, 0}, {d->tcp, POLLIN, 0}};
    if (poll(p, 2, 50) <= 0) continue;
    if (p[0].revents & POLLIN) {
      struct sockaddr_in from;
      socklen_t fl = sizeof from;
      ssize_t k = recvfrom(d->udp, q, sizeof q, 0, (struct sockaddr *)&from, &fl);
      size_t an = k > 0 ? answer(d, q, (size_t)k, a, sizeof a, 1) : 0;
      if (an) sendto(d->udp, a, an, 0, (struct sockaddr *)&from, fl);
      pthread_mutex_lock(&d->mu);
      d->udp_q++;
      pthread_mutex_unlock(&d->mu);
    }
    if (p[1].revents & POLLIN) { /* one query per connection, answered, closed */
      int c = accept(d->tcp, NULL, NULL);
      if (c < 0) continue;
      struct timeval tv = {2, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      uint8_t lb[2];
      size_t got = 0;
      ssize_t k;
      while (got < 2 && (k = recv(c, lb + got, 2 - got, 0)) > 0) got += (size_t)k;
      size_t qn = got == 2 ? (size_t)(lb[0] << 8 | lb[1]) : 0;
      got = 0;
      while (qn && qn <= sizeof q && got < qn && (k = recv(c, q + got, qn - got, 0)) > 0) got += (size_t)k;
      size_t an = qn && got == qn ? answer(d, q, qn, a + 2, sizeof a - 2, 0) : 0;
      if (an) {
        a[0] = (uint8_t)(an >> 8), a[1] = (uint8_t)an;
        (void)!send(c, a, an + 2, MSG_NOSIGNAL);
      }
      pthread_mutex_lock(&d->mu);
      d->tcp_q++;
      pthread_mutex_unlock(&d->mu);
      close(c);
    }
  }
  return NULL;
}

static void srv_start(dns_srv *d) {
  memset(d, 0, sizeof *d);
  pthread_mutex_init(&d->mu, NULL);
  /* one port for both: TCP's from the kernel, then UDP on it (taken by
   * another test meanwhile: try another) */
  for (int tries = 0; tries < 50; tries++) {
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d->tcp = socket(AF_INET, SOCK_STREAM, 0);
    d->udp = socket(AF_INET, SOCK_DGRAM, 0);
    assert_true(d->tcp >= 0 && d->udp >= 0);
    socklen_t sl = sizeof sa;
    if (bind(d->tcp, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(d->tcp, (struct sockaddr *)&sa, &sl) == 0 &&
        bind(d->udp, (struct sockaddr *)&sa, sizeof sa) == 0) {
      d->port = ntohs(sa.sin_port);
      break;
    }
    close(d->tcp);
    close(d->udp);
  }
  if (!d->port) fail_msg("no port free for both UDP and TCP");
  assert_int_equal(listen(d->tcp, 16), 0);
  assert_int_equal(pthread_create(&d->th, NULL, srv_main, d), 0);
}

static void srv_set(dns_srv *d, int mode, int n_a, int udp_big) {
  pthread_mutex_lock(&d->mu);
  d->mode = mode;
  d->n_a = n_a;
  d->udp_big = udp_big;
  pthread_mutex_unlock(&d->mu);
}

static int srv_count(dns_srv *d, int tcp) {
  pthread_mutex_lock(&d->mu);
  int n = tcp ? d->tcp_q : d->udp_q;
  pthread_mutex_unlock(&d->mu);
  return n;
}

static void srv_stop(dns_srv *d) {
  d->stop = 1;
  pthread_join(d->th, NULL);
  close(d->udp);
  close(d->tcp);
  pthread_mutex_destroy(&d->mu);
}

/* ---- the router ----------------------------------------------------------------- */

/* Decode workers the router lists now (its /metrics). */
static int decoders(int port) {
  tc_resp r;
  if (tc_get(port, "/metrics", &r)) return -1;
  int n = 0;
  for (const char *p = r.body; (p = strstr(p, "eldr_worker_healthy{role=\"decode\"")) != NULL; p++) n++;
  tc_free(&r);
  return n;
}

static int wait_decoders(int port, int want, double timeout_s) {
  int n = -1;
  for (double t0 = fx_now(); fx_now() - t0 < timeout_s; usleep(10000))
    if ((n = decoders(port)) == want) return n;
  return n;
}

static void start(sf_rig *g, dns_srv *d) {
  sf_start(g, 1, NULL, 1, NULL);
  for (size_t i = 0; i < g->c.n_decode; i++) free(g->c.decode[i]); /* decoders come from DNS alone */
  free(g->c.decode);
  g->c.decode = NULL;
  g->c.n_decode = 0;
  g->c.threads = 1;
  char server[64];
  snprintf(server, sizeof server, "127.0.0.1:%d", d->port);
  g->c.dns_server = strdup(server);
  g->c.dns_interval_s = 0.1;
  assert_int_equal(eldr_serve_config_add_dns(&g->c, 1, "svc.eldr.test:8200", NULL), 0);
  sf_run(g);
}

static void test_no_records_empties(void **st) {
  (void)st;
  dns_srv d;
  srv_start(&d);
  srv_set(&d, ANS_RECORDS, 2, 0);
  sf_rig g;
  start(&g, &d);
  assert_int_equal(wait_decoders(g.r.port, 2, 10), 2);
  /* NOERROR, no records: the Service has no ready endpoint */
  srv_set(&d, ANS_RECORDS, 0, 0);
  int empty = wait_decoders(g.r.port, 0, 10);
  /* a server failure says nothing: the list stays */
  srv_set(&d, ANS_RECORDS, 2, 0);
  assert_int_equal(wait_decoders(g.r.port, 2, 10), 2);
  srv_set(&d, ANS_SERVFAIL, 0, 0);
  for (int q = srv_count(&d, 0); srv_count(&d, 0) < q + 6;) usleep(10000); /* several lookups answered */
  int kept = decoders(g.r.port);
  srv_set(&d, ANS_NXDOMAIN, 0, 0);
  int gone = wait_decoders(g.r.port, 0, 10);
  print_message("DNS group: NOERROR without records -> %d decoders (was 2); SERVFAIL -> %d kept; NXDOMAIN -> %d\n",
                empty, kept, gone);
  assert_int_equal(empty, 0);
  assert_int_equal(kept, 2);
  assert_int_equal(gone, 0);
  assert_non_null(strstr(rt_log_text(&g.r), "no A or AAAA records"));
  sf_free(&g);
  srv_stop(&d);
}

static void test_many_addresses(void **st) {
  (void)st;
  dns_srv d;
  srv_start(&d);
  srv_set(&d, ANS_RECORDS, 200, 0); /* UDP: cut, TC set */
  sf_rig g;
  start(&g, &d);
  int n200 = wait_decoders(g.r.port, 200, 20);
  int tcp200 = srv_count(&d, 1);
  srv_set(&d, ANS_RECORDS, 40, 1); /* UDP: all 40, no TC; evdns keeps 32 */
  int n40 = wait_decoders(g.r.port, 40, 20);
  print_message("DNS group of 200 addresses (UDP answer cut with TC): %d decoders, %d TCP queries; of 40 addresses "
                "in one UDP answer (evdns keeps 32): %d decoders\n", n200, tcp200, n40);
  assert_int_equal(n200, 200);
  assert_true(tcp200 >= 2); /* A and AAAA over TCP */
  assert_int_equal(n40, 40);
  sf_free(&g);
  srv_stop(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_records_empties),
      cmocka_unit_test(test_many_addresses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
