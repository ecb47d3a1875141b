/* test_client.c — the serve tests' own HTTP client (tests/support/fixture.c,
 * tc_raw), against a raw server on loopback that writes its reply in pieces
 * the test chooses: a chunked body whose chunk is larger than the client's
 * first buffer arrives whole and unchanged (the client grows its buffer while
 * the chunk is read: it read the chunk through a pointer into the buffer it
 * had before, freed by the growth; under ThreadSanitizer, with other threads
 * allocating, a long stream came back short). */
#include <netinet/in.h>
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

typedef struct raw_server {
  int lfd, port;
  const char *const *pieces; /* written in turn, NULL-terminated */
  pthread_t th;
} raw_server;

/* One connection: read the request head, write each piece, close. */
static void *raw_main(void *arg) {
  raw_server *s = arg;
  int fd = accept(s->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  char buf[4096];
  size_t n = 0;
  while (n < sizeof buf - 1) {
    ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
    if (k <= 0) break;
    n += (size_t)k;
    buf[n] = 0;
    if (strstr(buf, "\r\n\r\n")) break;
  }
  for (size_t i = 0; s->pieces[i]; i++)
    if (tc_send_all(fd, s->pieces[i], strlen(s->pieces[i]))) break;
  close(fd);
  return NULL;
}

static void raw_start(raw_server *s, const char *const *pieces) {
  memset(s, 0, sizeof *s);
  s->pieces = pieces;
  s->lfd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(s->lfd >= 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(s->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(s->lfd, 4), 0);
  socklen_t sl = sizeof sa;
  assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&sa, &sl), 0);
  s->port = ntohs(sa.sin_port);
  assert_int_equal(pthread_create(&s->th, NULL, raw_main, s), 0);
}

static void raw_join(raw_server *s) {
  pthread_join(s->th, NULL);
  close(s->lfd);
}

/* A chunk of n bytes: its size line then n bytes of a pattern that tells
 * every position apart (so a byte read from anywhere else shows). */
static char *pattern(size_t n) {
  char *p = malloc(n + 1);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (char)('a' + (i * 7 + i / 26) % 26);
  p[n] = 0;
  return p;
}

static void test_chunk_larger_than_the_first_buffer(void **st) {
  (void)st;
  /* the client's first buffer holds 128 KiB: this chunk needs it grown
   * twice, after the chunk's size line was found */
  const size_t sizes[] = {300000, 1 << 20};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    char *data = pattern(n);
    char head[256], size_line[32];
    snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    snprintf(size_line, sizeof size_line, "%zx\r\n", n);
    const char *pieces[] = {head, size_line, data, "\r\n5\r\nhello\r\n0\r\n\r\n", NULL};
    raw_server s;
    raw_start(&s, pieces);
    tc_resp r;
    assert_int_equal(tc_raw(s.port, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", 27, 20, &r), 0);
    raw_join(&s);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    assert_int_equal(r.body_len, n + 5);
    size_t bad = 0;
    while (bad < n && r.body[bad] == data[bad]) bad++;
    if (bad < n) fail_msg("chunk of %zu bytes: byte %zu differs", n, bad);
    assert_memory_equal(r.body + n, "hello", 5);
    print_message("a chunk of %zu bytes (the first buffer holds 131072): whole and unchanged\n", n);
    tc_free(&r);
    free(data);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_larger_than_the_first_buffer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
