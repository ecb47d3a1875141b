/* fuzz_sgl_counts.c — libFuzzer target for the expert counts document a
 * patched SGLang prefill's bootstrap server answers the router with (--pd
 * sglang-exact; serve_internal.h, eldr__sgl_counts_doc: {"room": R,
 * "eldr_expert_counts": {...}}), then its counts object as the signature
 * path reads it (eldr_compact_read: an artifact of 2 MoE layers at model
 * layers 1 and 3, 8 experts, top-2). The input is the reply body; the
 * router asked for room 42. Checks: no crash or out-of-bounds read (ASan);
 * a success is a document jansson reads too, whose room is 42 and whose
 * span is an object inside the input; a failure is EPARSE, EINVAL or
 * ERANGE with a message. Else abort. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "eldr/reply_compact.h"
#include "serve/serve_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *doc = (const char *)data;
  eldr_js_span c = {0, 0, ELDR_JS_NONE};
  eldr_diag d = {{0}};
  int rc = eldr__sgl_counts_doc(doc, size, 42, &c, &d);
  if (rc) {
    if ((rc != ELDR_EPARSE && rc != ELDR_EINVAL && rc != ELDR_ERANGE) || !d.msg[0]) abort();
    return 0;
  }
  if (c.type != ELDR_JS_OBJECT || c.off + c.len > size || c.len < 2 || doc[c.off] != '{' || doc[c.off + c.len - 1] != '}')
    abort();
  json_t *j = json_loadb(doc, size, JSON_DECODE_ANY, NULL);
  if (!json_is_object(j) || json_integer_value(json_object_get(j, "room")) != 42 ||
      !json_is_object(json_object_get(j, ELDR_COMPACT_KEY)))
    abort();
  json_decref(j);
  static const uint32_t ids[2] = {1, 3};
  const eldr_compact_opts o = {2, ids, 8, 2, NULL};
  uint32_t counts[2 * 8] = {0};
  eldr_compact_info ci;
  eldr_re_reason why = ELDR_RE__N;
  rc = eldr_compact_read(doc, c, &o, counts, NULL, &ci, &why, &d);
  if (rc == 0) {
    if (why != ELDR_RE_OK) abort();
    for (size_t i = 0; i < 2 * 8; i++)
      if (counts[i] > ci.tokens && counts[i] != 65535) abort();
  } else if (why == ELDR_RE_OK || why >= ELDR_RE__N || !d.msg[0]) {
    abort();
  }
  return 0;
}
