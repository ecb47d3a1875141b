/* test_upstream.c — the router's HTTP client to the workers
 * (src/serve/upstream.c): the reply parser fed in pieces of every size, the
 * body length the router sizes its buffer by, and the resend of a request
 * whose kept-alive connection the worker closed before replying. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/error.h"
#include "eldr/upstream.h"

#include <event2/event.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct upst {
  eldr_up *u;
  long long blen; /* eldr_up_body_length in the head callback */
  int heads, dones, status, err;
  char ctype[128];
  char body[4096];
  size_t n;
} upst;
static void u_head(void *a, int status, const char *ct) {
  upst *s = a;
  s->heads++;
  s->status = status;
  s->blen = s->u ? eldr_up_body_length(s->u) : -2;
  snprintf(s->ctype, sizeof s->ctype, "%s", ct);
}
static void u_data(void *a, const char *p, size_t n) {
  upst *s = a;
  assert_true(s->n + n < sizeof s->body);
  memcpy(s->body + s->n, p, n);
  s->n += n;
}
static void u_done(void *a, int err) {
  upst *s = a;
  s->dones++;
  s->err = err;
}
static const eldr_up_cbs ucbs = {u_head, u_data, u_done};

/* Feed a reply in pieces of every size 1..len; the result must not depend on it. */
static void feed_all(const char *reply, int eof, upst *want) {
  struct event_base *b = event_base_new();
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  size_t len = strlen(reply);
  for (size_t step = 1; step <= len; step++) {
    eldr_up *u = eldr_up_new(b, (struct sockaddr *)&sa, sizeof sa);
    upst s;
    memset(&s, 0, sizeof s);
    s.u = u;
    eldr_up_test_begin(u, &ucbs, &s);
    for (size_t off = 0; off < len && eldr_up_active(u); off += step)
      eldr_up_test_feed(u, reply + off, len - off < step ? len - off : step, 0);
    if (eof && eldr_up_active(u)) eldr_up_test_feed(u, "", 0, 1);
    if (step == 1) *want = s;
    assert_int_equal(s.dones, 1);
    assert_int_equal(s.err, want->err);
    assert_int_equal(s.status, want->status);
    assert_int_equal(s.blen, want->blen);
    assert_int_equal(s.n, want->n);
    assert_memory_equal(s.body, want->body, s.n);
    eldr_up_free(u);
  }
  event_base_free(b);
}

static void test_upstream_parser(void **st) {
  (void)st;
  upst w;
  feed_all("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\":\"bcd\"}", 0, &w);
  assert_int_equal(w.err, 0);
  assert_int_equal(w.status, 200);
  assert_string_equal(w.ctype, "application/json");
  assert_int_equal(w.n, 11);
  assert_int_equal(w.blen, 11); /* the body length the router sizes its buffer by */
  feed_all("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
           "7\r\ndata: 1\r\nA;x=y\r\n\n\ndata: [D\r\n0\r\nTrailer: t\r\n\r\n", 0, &w);
  assert_int_equal(w.err, 0);
  assert_int_equal(w.n, 17);
  assert_memory_equal(w.body, "data: 1\n\ndata: [D", 17);
  assert_int_equal(w.blen, -1); /* chunked: unknown */
  feed_all("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\n{}", 0, &w);
  assert_int_equal(w.status, 503);
  assert_int_equal(w.n, 2);
  assert_int_equal(w.blen, 2);
  feed_all("HTTP/1.0 200 OK\r\n\r\nuntil close", 1, &w);
  assert_int_equal(w.err, 0);
  assert_int_equal(w.n, 11);
  assert_int_equal(w.blen, -1);
  feed_all("HTTP/1.1 204 No Content\r\n\r\n", 0, &w);
  assert_int_equal(w.err, 0);
  assert_int_equal(w.n, 0);
  /* truncated bodies and garbage are errors */
  feed_all("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 1, &w);
  assert_int_equal(w.err, ELDR_EIO);
  feed_all("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", 1, &w);
  assert_int_equal(w.err, ELDR_EIO);
  feed_all("SMTP ready\r\n\r\n", 0, &w);
  assert_int_equal(w.err, ELDR_EPARSE);
  feed_all("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, &w);
  assert_int_equal(w.err, ELDR_EPARSE);
  feed_all("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", 0, &w);
  assert_int_equal(w.err, ELDR_EPARSE);
  feed_all("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 0, &w);
  assert_int_equal(w.err, ELDR_EPARSE);
}


/* A kept-alive connection that the worker closes when the next request
 * arrives: the request is sent again on a fresh connection, once. */
typedef struct stale_srv {
  int lfd;
  int served, dropped;
} stale_srv;

static size_t read_request(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n < cap - 1) {
    ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
    if (k <= 0) return 0;
    n += (size_t)k;
    buf[n] = 0;
    if (strstr(buf, "\r\n\r\n")) return n;
  }
  return n;
}

static void *stale_thread(void *arg) {
  stale_srv *s = arg;
  static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  char buf[4096];
  int c1 = accept(s->lfd, NULL, NULL);
  if (read_request(c1, buf, sizeof buf)) { /* first request: answered, kept alive */
    send(c1, ok, sizeof ok - 1, 0);
    s->served++;
  }
  if (read_request(c1, buf, sizeof buf)) s->dropped++; /* second: dropped unanswered */
  struct linger lg = {1, 0};
  setsockopt(c1, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(c1);
  int c2 = accept(s->lfd, NULL, NULL); /* the resend */
  if (read_request(c2, buf, sizeof buf)) {
    send(c2, ok, sizeof ok - 1, 0);
    s->served++;
  }
  read_request(c2, buf, sizeof buf); /* until the client closes */
  close(c2);
  return NULL;
}

static void stop_loop(void *a, int err) {
  upst *s = a;
  s->dones++;
  s->err = err;
}
static const eldr_up_cbs loop_cbs = {u_head, u_data, stop_loop};

static void run_until_done(struct event_base *b, upst *s, int want) {
  for (int i = 0; i < 100000 && s->dones < want; i++) event_base_loop(b, EVLOOP_ONCE);
}

static void test_upstream_stale_resend(void **st) {
  (void)st;
  stale_srv srv = {0};
  srv.lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(srv.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  socklen_t sl = sizeof sa;
  getsockname(srv.lfd, (struct sockaddr *)&sa, &sl);
  assert_int_equal(listen(srv.lfd, 4), 0);
  pthread_t th;
  pthread_create(&th, NULL, stale_thread, &srv);
  struct event_base *b = event_base_new();
  eldr_up *u = eldr_up_new(b, (struct sockaddr *)&sa, sizeof sa);
  upst s;
  memset(&s, 0, sizeof s);
  static const char req[] = "GET /x HTTP/1.1\r\nHost: h\r\n\r\n";
  struct iovec iov = {(void *)req, sizeof req - 1};
  assert_int_equal(eldr_up_request(u, &iov, 1, &loop_cbs, &s), 0);
  run_until_done(b, &s, 1);
  assert_int_equal(s.err, 0);
  assert_int_equal(s.status, 200);
  assert_false(eldr_up_resent(u)); /* a fresh connection */
  s.n = 0;
  assert_int_equal(eldr_up_request(u, &iov, 1, &loop_cbs, &s), 0);
  run_until_done(b, &s, 2);
  assert_int_equal(s.dones, 2);
  assert_int_equal(s.err, 0);
  assert_int_equal(s.n, 2);
  assert_memory_equal(s.body, "ok", 2);
  assert_true(eldr_up_resent(u)); /* the kept one failed before a reply byte */
  assert_true(eldr_up_sent(u));
  eldr_up_free(u);
  pthread_join(th, NULL);
  assert_int_equal(srv.served, 2);
  assert_int_equal(srv.dropped, 1);
  close(srv.lfd);
  event_base_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_upstream_parser),
      cmocka_unit_test(test_upstream_stale_resend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
