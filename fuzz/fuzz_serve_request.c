/* fuzz_serve_request.c — the router's request parsing: an HTTP/1.x request
 * head (bounded parser) followed by a body parsed as a completions or chat
 * request, as the server does for POST /v1/(chat/)completions. Checks: never
 * crashes, never reads out of bounds, a parsed head's length is within the
 * input, errors carry a 4xx/5xx status and a message, a parsed body yields
 * both leg bodies that are valid JSON objects; an accepted head is never an
 * HTTP/1.0 one with Transfer-Encoding; the constant-time token comparison
 * (auth.c) agrees with strcmp on the head's Authorization. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

/* auth.c's comparison (declared in serve_types.h, which needs libevent) */
int eldr__token_equal(const char *given, const char *want);

static void check_body(const char *b, size_t n, eldr__api api) {
  eldr__req r;
  eldr_diag d = {{0}};
  int rc = eldr__req_parse(b, n, api, &r, &d);
  if (rc) {
    if (!d.msg[0] || r.root) abort();
    return;
  }
  if (!r.text || (!r.root && !r.raw_ok) || (r.root && !json_is_object(r.root))) abort();
  eldr__buf pb = {0}, db = {0};
  if (eldr__prefill_body_buf(&r, &pb) || eldr__decode_body_buf(&r, NULL, 0, &db)) abort();
  char *p = pb.p, *q = db.p;
  const size_t pl = pb.n, dl = db.n;
  if (!p || !q || strlen(p) != pl || strlen(q) != dl) abort();
  json_t *pj = json_loadb(p, pl, 0, NULL);
  if (!pj || !json_is_false(json_object_get(pj, "stream"))) abort();
  json_decref(pj);
  free(p);
  free(q);
  eldr__req_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* the head parser must never read past size: give it an exact-size copy */
  char *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  /* the first line as a chunked body's size line */
  {
    size_t ln = 0;
    while (ln < size && buf[ln] != '\r' && buf[ln] != '\n') ln++;
    uint64_t sz = 0;
    if (eldr__http_chunk_size(buf, ln, &sz) == 0 && sz > (1ull << 40)) abort();
  }
  static eldr__http_head h;
  long n = eldr__http_parse_head(buf, size, 4096, &h);
  if (n > 0) {
    if ((size_t)n > size) abort();
    if (h.path[0] != '/') abort();
    if (h.minor == 0 && h.chunked) abort(); /* RFC 9112 6.1: refused */
    const char *keys[] = {"sk-test-key-0001", "x", h.authorization};
    for (size_t i = 0; i < 3; i++) {
      int want = keys[i][0] && h.authorization[0] && !strcmp(h.authorization, keys[i]);
      if (eldr__token_equal(h.authorization, keys[i]) != want) abort();
    }
    size_t rest = size - (size_t)n;
    size_t blen = h.content_length >= 0 && (size_t)h.content_length < rest ? (size_t)h.content_length : rest;
    check_body(buf + n, blen, strstr(h.path, "chat") ? ELDR__API_CHAT : ELDR__API_COMPLETIONS);
  } else if (n < 0) {
    if (h.status < 400 || h.status > 505 || !h.error[0]) abort();
  } else if (size >= 4096) {
    abort(); /* a head that cannot complete within the limit must be refused */
  }
  /* the whole input as a body too */
  check_body(buf, size, (size & 1) ? ELDR__API_CHAT : ELDR__API_COMPLETIONS);
  free(buf);
  return 0;
}
