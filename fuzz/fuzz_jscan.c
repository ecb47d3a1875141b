/* fuzz_jscan.c — the byte scanner (src/format/jscan.c) against jansson on
 * every input: both accept or both reject (jansson's default decoder, any
 * value at the top level; jansson's one leniency, a NUL byte after a
 * number or literal, is the scanner's reject); on an accepted document every wanted path is
 * found exactly where jansson has a value, and the bytes of its span parse
 * to that value; the members of a top-level object, walked in place, give
 * jansson's keys (the last of a repeated key wins), the elements of a
 * top-level array, walked in place, are jansson's elements, strings decode
 * to jansson's strings and integers to its integers. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/jscan.h"

static const eldr_js_path paths[] = {
    {{"stream", NULL}},
    {{"usage", "prompt_tokens", NULL}},
    {{"usage", "prompt_tokens_details", NULL}},
    {{"choices", "#0", "routed_experts", NULL}},
    {{"choices", "#1", NULL}},
    {{"kv_transfer_params", NULL}},
    {{"#0", NULL}},
    {{"#2", "a", NULL}},
    {{"a", "b", "c", "d", NULL}},
    {{"a", NULL}},
    {{"", NULL}},
    {{"\xc3\xa9", NULL}}, /* "é", also reachable as "\u00e9" */
};
#define NPATHS (sizeof paths / sizeof paths[0])

static json_t *walk(json_t *v, const eldr_js_path *p) {
  for (size_t k = 0; p->c[k] && v; k++) {
    const char *c = p->c[k];
    if (c[0] == '#') v = json_is_array(v) ? json_array_get(v, (size_t)strtoull(c + 1, NULL, 10)) : NULL;
    else v = json_is_object(v) ? json_object_get(v, c) : NULL;
  }
  return v;
}

static int same_type(eldr_js_type t, json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return t == ELDR_JS_OBJECT;
    case JSON_ARRAY: return t == ELDR_JS_ARRAY;
    case JSON_STRING: return t == ELDR_JS_STRING;
    case JSON_INTEGER: return t == ELDR_JS_INTEGER;
    case JSON_REAL: return t == ELDR_JS_REAL;
    case JSON_TRUE: return t == ELDR_JS_TRUE;
    case JSON_FALSE: return t == ELDR_JS_FALSE;
    case JSON_NULL: return t == ELDR_JS_NULL;
  }
  return 0;
}

/* The span's bytes are the value v, by jansson, read in place. */
static void check_value(const char *doc, eldr_js_span sp, json_t *v) {
  if (!same_type(sp.type, v)) abort();
  json_t *again = json_loadb(doc + sp.off, sp.len, JSON_DECODE_ANY, NULL);
  if (!again || !json_equal(again, v)) abort();
  json_decref(again);
  if (sp.type == ELDR_JS_STRING) {
    size_t cap = json_string_length(v), len = 0;
    char *buf = malloc(cap ? cap : 1);
    if (!buf) abort();
    if (eldr_js_string(doc, sp, buf, cap, &len) || len != cap || memcmp(buf, json_string_value(v), len)) abort();
    if (cap && eldr_js_string(doc, sp, buf, cap - 1, &len) != ELDR_EINVAL) abort(); /* bounded */
    free(buf);
  } else if (sp.type == ELDR_JS_INTEGER) {
    int64_t x = 0;
    if (eldr_js_int(doc, sp, &x) || x != (int64_t)json_integer_value(v)) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *doc = malloc(size ? size : 1); /* exactly size bytes: reads past it are caught */
  if (!doc) return 0;
  if (size) memcpy(doc, data, size);
  else doc[0] = 0;
  json_t *tree = json_loadb(doc, size, JSON_DECODE_ANY, NULL);
  eldr_js_span found[NPATHS], root;
  eldr_diag d = {{0}};
  int rc = eldr_js_scan(doc, size, paths, NPATHS, found, &root, &d);
  /* jansson's one leniency: a NUL byte right after a number or a literal
   * is dropped with the look-ahead byte it ungets ("[1\0]" loads as [1]).
   * The scanner follows RFC 8259 and rejects every NUL outside a string
   * (inside one, both reject it); the router falls back to jansson when
   * the scanner refuses a body jansson took. */
  if (tree && size && memchr(doc, 0, size)) {
    if (rc == 0) abort();
    json_decref(tree);
    free(doc);
    return 0;
  }
  if ((rc == 0) != (tree != NULL)) abort();
  if (rc) {
    if (rc != ELDR_EPARSE || !strstr(d.msg, "invalid JSON at byte")) abort();
    free(doc);
    return 0;
  }
  check_value(doc, root, tree);
  for (size_t k = 0; k < NPATHS; k++) {
    json_t *v = walk(tree, &paths[k]);
    if ((found[k].type == ELDR_JS_NONE) != (v == NULL)) abort();
    if (v) check_value(doc, found[k], v);
  }
  if (root.type == ELDR_JS_OBJECT) {
    eldr_js_iter it;
    eldr_js_member m;
    eldr_js_iter_init(&it, doc, root);
    json_t *seen = json_object(); /* key -> the last member's value span, re-read */
    if (!seen) abort();
    while (eldr_js_next(&it, &m)) {
      char key[4096];
      size_t kl = 0;
      if (m.key.len > sizeof key) continue; /* decoded keys are never longer than their text */
      if (eldr_js_string(doc, m.key, key, sizeof key, &kl)) abort();
      if (!json_object_getn(tree, key, kl)) abort();
      if (!eldr_js_key_is(doc, m.key, "stream") != !(kl == 6 && !memcmp(key, "stream", 6))) abort();
      json_t *val = json_loadb(doc + m.value.off, m.value.len, JSON_DECODE_ANY, NULL);
      if (!val || json_object_setn_new(seen, key, kl, val)) abort();
      if (m.off != m.key.off || m.off + m.len != m.value.off + m.value.len) abort();
    }
    /* every key seen once at least, each with its last value */
    if (json_object_size(seen) != json_object_size(tree)) {
      /* a key longer than 4096 bytes was left out above */
      int long_key = 0;
      const char *k;
      json_t *x;
      json_object_foreach(tree, k, x) long_key |= strlen(k) >= 4096 || json_object_get(seen, k) == NULL;
      if (!long_key) abort();
    } else if (!json_equal(seen, tree)) {
      abort();
    }
    json_decref(seen);
    /* written again less "stream", plus one member: within its bound, the
     * same object but for those two (eldr_js_cut) */
    static const char *const drop[] = {"stream", NULL};
    const eldr_js_piece extra[1] = {{"\"eldr_added\":", 13, "[1]", 3}};
    const size_t cap = eldr_js_cut_max(root, extra, 1);
    char *cut = malloc(cap);
    if (!cut) abort();
    const size_t cn = eldr_js_cut(doc, root, drop, extra, 1, cut);
    json_t *ct = cn <= cap ? json_loadb(cut, cn, 0, NULL) : NULL;
    json_t *want = json_deep_copy(tree);
    if (!ct || !want) abort();
    json_object_del(want, "stream");
    json_object_set_new(want, "eldr_added", json_pack("[i]", 1));
    if (!json_equal(ct, want)) abort();
    json_decref(ct);
    json_decref(want);
    free(cut);
    eldr_js_span r2;
    if (eldr_js_root_object(doc, size, &r2) || r2.off != root.off || r2.len != root.len) abort();
  }
  if (root.type == ELDR_JS_ARRAY) { /* the elements, walked in place, are jansson's */
    eldr_js_iter it;
    eldr_js_span v;
    size_t i = 0;
    eldr_js_iter_array(&it, doc, root);
    while (eldr_js_next_elem(&it, &v)) {
      json_t *want = json_array_get(tree, i++);
      json_t *val = json_loadb(doc + v.off, v.len, JSON_DECODE_ANY, NULL);
      if (!want || !val || !json_equal(want, val)) abort();
      json_decref(val);
    }
    if (i != json_array_size(tree)) abort();
  }
  json_decref(tree);
  free(doc);
  return 0;
}
