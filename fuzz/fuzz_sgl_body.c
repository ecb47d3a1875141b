/* fuzz_sgl_body.c — libFuzzer target for the SGLang leg body the router
 * builds from a client's body (serve_internal.h, eldr__sgl_items and
 * eldr__sgl_leg_body). Input: fuzz_body.h's split (the first byte picks
 * the API, 'g' SGLang's /generate; the rest is the client's body). Checks: no crash, no leak, no
 * read past the body; an error names itself; a success is a JSON object
 * whose bootstrap_host / _port / _room are the router's alone (a scalar
 * each for one item, else arrays of the item count, every room the one
 * given), whatever bootstrap fields the client sent. With 'g' (/generate)
 * and a newline, also the merge of a prefill's input log probabilities
 * into a decode's reply (merge, below). Else abort. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_body.h"

static int ours(json_t *v, const char *host, int port, const uint64_t *rooms, uint32_t n, int k) {
  for (uint32_t i = 0; i < n; i++) {
    json_t *e = n == 1 ? v : json_array_get(v, i);
    if (!e) return 0;
    if (k == 0 && (!json_is_string(e) || strcmp(json_string_value(e), host))) return 0;
    if (k == 1 && json_integer_value(e) != port) return 0;
    if (k == 2 && (!json_is_integer(e) || (uint64_t)json_integer_value(e) != rooms[i])) return 0;
  }
  return n == 1 ? !json_is_array(v) : json_is_array(v) && json_array_size(v) == n;
}

/* The body read as a prefill's reply and a decode's, split at its first
 * newline: their input log probabilities merged (eldr__sgl_merge_logprobs)
 * or left (1); a merge is JSON of the decode's shape. */
static void merge(const char *b, size_t n) {
  const char *nl = memchr(b, '\n', n);
  if (!nl) return;
  eldr__buf out = {0};
  eldr_diag d = {{0}};
  size_t pn = (size_t)(nl - b);
  int rc = eldr__sgl_merge_logprobs(b, pn, nl + 1, n - pn - 1, &out, &d);
  if (rc == 0) {
    json_t *j = json_loadb(out.p, out.n, 0, NULL), *q = json_loadb(nl + 1, n - pn - 1, 0, NULL);
    if (!j || !q || json_typeof(j) != json_typeof(q) || (json_is_array(j) && json_array_size(j) != json_array_size(q)))
      abort();
    json_decref(j);
    json_decref(q);
  } else if (rc != 1 && !d.msg[0]) {
    abort();
  }
  eldr__buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_fuzz_body in;
  if (eldr_fuzz_body_split(data, size, &in)) return 0;
  if (in.api == ELDR__API_GENERATE) merge(in.body, in.len);
  uint32_t items = 0;
  eldr_diag d = {{0}};
  int rc = eldr__sgl_items(in.body, in.len, in.api, &items, &d);
  if (rc) {
    if (!d.msg[0]) abort();
    return 0;
  }
  if (!items || items > ELDR__SGL_MAX_ITEMS) abort();
  uint64_t rooms[ELDR__SGL_MAX_ITEMS];
  for (uint32_t i = 0; i < items; i++) rooms[i] = 0x7000000000000000ull + i * 977;
  eldr__buf b = {0};
  if (eldr__sgl_leg_body(in.body, in.len, in.api, "10.1.2.3", 8998, rooms, items, &b, &d) != 0) {
    if (!d.msg[0]) abort(); /* only memory may fail now */
    eldr__buf_free(&b);
    return 0;
  }
  json_t *j = json_loadb(b.p, b.n, 0, NULL);
  const char *k[3] = {"bootstrap_host", "bootstrap_port", "bootstrap_room"};
  if (!json_is_object(j)) abort();
  for (int i = 0; i < 3; i++)
    if (!ours(json_object_get(j, k[i]), "10.1.2.3", 8998, rooms, items, i)) abort();
  json_decref(j);
  /* the prefill's body: the same fields, and a whole reply with the rows */
  if (eldr__sgl_prefill_body(in.body, in.len, in.api, "10.1.2.3", 8998, rooms, items, &b, &d) != 0) {
    if (!d.msg[0]) abort();
    eldr__buf_free(&b);
    return 0;
  }
  j = json_loadb(b.p, b.n, 0, NULL);
  if (!json_is_object(j) || !json_is_false(json_object_get(j, "stream")) ||
      !json_is_true(json_object_get(j, "return_routed_experts")) || json_object_get(j, "stream_options"))
    abort();
  for (int i = 0; i < 3; i++)
    if (!ours(json_object_get(j, k[i]), "10.1.2.3", 8998, rooms, items, i)) abort();
  json_decref(j);
  eldr__buf_free(&b);
  return 0;
}
