/* reqscan.c — the client's request read by the byte scanner
 * (include/eldr/jscan.h), without building a tree: one validating pass that
 * finds the top-level fields the router needs, the checks of
 * eldr__req_parse_tree on their spans, the prompt text (or token ids)
 * decoded into buffers kept from request to request.
 *
 * It takes only what it can decide is valid exactly as the jansson path
 * would; anything else (an error of any kind, a field of an unexpected
 * type) returns 1 and the jansson path decides, so a client error gets the
 * same status and message as before. fuzz_req_scan checks on arbitrary
 * input that whatever this file accepts, the jansson path accepts with the
 * same fields and the same leg bodies. Loop thread (or any: no state). */
#include <stdlib.h>
#include <string.h>

#include "eldr/jscan.h"
#include "serve_internal.h"

enum {
  F_STREAM, F_RRE, F_MODEL, F_STREAM_OPTIONS, F_KV, F_MAX_TOKENS, F_MAX_COMPLETION_TOKENS, F_MIN_TOKENS, F_N,
  F_PROMPT_LOGPROBS, F_TOP_LOGPROBS, F_LOGPROBS, F_TEMPERATURE, F_TOP_P, F_PROMPT, F_MESSAGES, F__N
};

static const eldr_js_path FIELDS[F__N] = {
    [F_STREAM] = {{"stream", NULL}},
    [F_RRE] = {{"return_routed_experts", NULL}},
    [F_MODEL] = {{"model", NULL}},
    [F_STREAM_OPTIONS] = {{"stream_options", NULL}},
    [F_KV] = {{"kv_transfer_params", NULL}},
    [F_MAX_TOKENS] = {{"max_tokens", NULL}},
    [F_MAX_COMPLETION_TOKENS] = {{"max_completion_tokens", NULL}},
    [F_MIN_TOKENS] = {{"min_tokens", NULL}},
    [F_N] = {{"n", NULL}},
    [F_PROMPT_LOGPROBS] = {{"prompt_logprobs", NULL}},
    [F_TOP_LOGPROBS] = {{"top_logprobs", NULL}},
    [F_LOGPROBS] = {{"logprobs", NULL}},
    [F_TEMPERATURE] = {{"temperature", NULL}},
    [F_TOP_P] = {{"top_p", NULL}},
    [F_PROMPT] = {{"prompt", NULL}},
    [F_MESSAGES] = {{"messages", NULL}},
};

#define ABSENT(t) ((t) == ELDR_JS_NONE || (t) == ELDR_JS_NULL)

/* The value of an integer span (the scanner checked its range). */
static int64_t int_of(const char *doc, eldr_js_span v) {
  int64_t x = 0;
  eldr_js_int(doc, v, &x);
  return x;
}

/* An integer span, or dflt (as int_or in rewrite.c). */
static int64_t int_or(const char *doc, eldr_js_span v, int64_t dflt) {
  return v.type == ELDR_JS_INTEGER ? int_of(doc, v) : dflt;
}

/* A number span's value as jansson gives it: 0 and *x, or 1 (not a
 * number, or a real too long to convert here: the tree path decides). */
static int number(const char *doc, eldr_js_span v, double *x) {
  if (v.type == ELDR_JS_INTEGER) {
    *x = (double)int_of(doc, v);
    return 0;
  }
  if (v.type != ELDR_JS_REAL || v.len >= 64) return 1;
  char b[64];
  memcpy(b, doc + v.off, v.len);
  b[v.len] = 0;
  *x = strtod(b, NULL);
  return 0;
}

/* The text being built: cap was reserved for the whole body, which bounds
 * the decoded prompt (each piece decodes to fewer bytes than its text). */
typedef struct tbuf {
  char *p;
  size_t n, cap;
} tbuf;

static int add(tbuf *t, const char *s, size_t n) {
  if (t->n + n > t->cap) return 1;
  memcpy(t->p + t->n, s, n);
  t->n += n;
  return 0;
}

static int add_string(tbuf *t, const char *doc, eldr_js_span v) {
  size_t len;
  if (eldr_js_string(doc, v, t->p + t->n, t->cap - t->n, &len)) return 1;
  t->n += len;
  return 0;
}

/* What the decode engine would refuse (decoder_rules in rewrite.c), and
 * the fields' types: 0 when all is plainly valid, else 1. */
static int fields_ok(const char *doc, const eldr_js_span *f) {
  eldr_js_type st = f[F_STREAM].type, rre = f[F_RRE].type;
  if (!ABSENT(st) && st != ELDR_JS_TRUE && st != ELDR_JS_FALSE) return 1;
  if (!ABSENT(rre) && rre != ELDR_JS_TRUE && rre != ELDR_JS_FALSE) return 1;
  if (!ABSENT(f[F_MODEL].type) && f[F_MODEL].type != ELDR_JS_STRING) return 1;
  if (!ABSENT(f[F_STREAM_OPTIONS].type) && f[F_STREAM_OPTIONS].type != ELDR_JS_OBJECT) return 1;
  if (!ABSENT(f[F_KV].type) && f[F_KV].type != ELDR_JS_OBJECT) return 1;
  static const int ints[] = {F_MAX_TOKENS, F_MAX_COMPLETION_TOKENS, F_MIN_TOKENS, F_N, F_PROMPT_LOGPROBS,
                             F_TOP_LOGPROBS};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
    eldr_js_span v = f[ints[i]];
    if (ABSENT(v.type)) continue;
    if (v.type != ELDR_JS_INTEGER || int_of(doc, v) < 0) return 1;
  }
  int stream = st == ELDR_JS_TRUE;
  if (!ABSENT(f[F_STREAM_OPTIONS].type) && !stream) return 1;
  if (!ABSENT(f[F_PROMPT_LOGPROBS].type) && stream) return 1;
  if (!ABSENT(f[F_TOP_LOGPROBS].type) && int_of(doc, f[F_TOP_LOGPROBS]) > 0 &&
      f[F_MESSAGES].type != ELDR_JS_NONE && f[F_LOGPROBS].type != ELDR_JS_TRUE)
    return 1;
  if (int_or(doc, f[F_N], 1) < 1) return 1;
  int64_t mx = int_or(doc, f[F_MAX_COMPLETION_TOKENS], int_or(doc, f[F_MAX_TOKENS], -1));
  if (mx == 0) return 1;
  if (mx >= 0 && int_or(doc, f[F_MIN_TOKENS], 0) > mx) return 1;
  double x;
  if (!ABSENT(f[F_TEMPERATURE].type) && (number(doc, f[F_TEMPERATURE], &x) || x < 0)) return 1;
  if (!ABSENT(f[F_TOP_P].type) && (number(doc, f[F_TOP_P], &x) || !(x > 0 && x <= 1))) return 1;
  return 0;
}

/* Completions: a string, strings (joined by '\n'), token ids, or a batch
 * of token-id lists (validated only). */
static int prompt_text(const char *doc, eldr_js_span p, tbuf *t, eldr__req *out) {
  if (p.type == ELDR_JS_STRING) return add_string(t, doc, p);
  if (p.type != ELDR_JS_ARRAY) return 1;
  eldr_js_iter it;
  eldr_js_span e;
  eldr_js_iter_array(&it, doc, p);
  if (!eldr_js_next_elem(&it, &e)) return 1; /* empty */
  if (e.type == ELDR_JS_INTEGER) {            /* token ids: at most one per 2 bytes of the array */
    size_t most = p.len / 2 + 1;
    if (most > out->ids_cap) {
      uint32_t *q = realloc(out->ids, most * sizeof *q);
      if (!q) return ELDR_ENOMEM;
      out->ids = q;
      out->ids_cap = most;
    }
    size_t n = 0;
    do {
      if (e.type != ELDR_JS_INTEGER || n >= out->ids_cap) return 1;
      int64_t x = int_of(doc, e);
      if (x < 0 || x > (int64_t)UINT32_MAX) return 1;
      out->ids[n++] = (uint32_t)x;
    } while (eldr_js_next_elem(&it, &e));
    out->n_ids = n;
    return 0;
  }
  size_t i = 0;
  do {
    if (e.type == ELDR_JS_STRING) {
      if ((i && add(t, "\n", 1)) || add_string(t, doc, e)) return 1;
    } else if (e.type == ELDR_JS_ARRAY) {
      eldr_js_iter in;
      eldr_js_span x;
      eldr_js_iter_array(&in, doc, e);
      while (eldr_js_next_elem(&in, &x))
        if (x.type != ELDR_JS_INTEGER) return 1;
    } else {
      return 1;
    }
    i++;
  } while (eldr_js_next_elem(&it, &e));
  return 0;
}

/* Chat: "role: content\n" per message; content a string, null, or parts. */
static int messages_text(const char *doc, eldr_js_span m, tbuf *t) {
  if (m.type != ELDR_JS_ARRAY) return 1;
  eldr_js_iter it;
  eldr_js_span msg;
  eldr_js_iter_array(&it, doc, m);
  size_t k = 0;
  while (eldr_js_next_elem(&it, &msg)) {
    k++;
    if (msg.type != ELDR_JS_OBJECT) return 1;
    eldr_js_span role = eldr_js_get(doc, msg, "role");
    if (role.type != ELDR_JS_STRING || add_string(t, doc, role) || add(t, ": ", 2)) return 1;
    eldr_js_span c = eldr_js_get(doc, msg, "content");
    if (c.type == ELDR_JS_STRING) {
      if (add_string(t, doc, c)) return 1;
    } else if (c.type == ELDR_JS_ARRAY) {
      eldr_js_iter pi;
      eldr_js_span part;
      eldr_js_iter_array(&pi, doc, c);
      while (eldr_js_next_elem(&pi, &part)) {
        if (part.type != ELDR_JS_OBJECT || eldr_js_get(doc, part, "type").type != ELDR_JS_STRING) return 1;
        eldr_js_span tx = eldr_js_get(doc, part, "text");
        if (tx.type == ELDR_JS_NONE) continue;
        if (tx.type != ELDR_JS_STRING || add_string(t, doc, tx)) return 1;
      }
    } else if (!ABSENT(c.type)) {
      return 1;
    }
    if (add(t, "\n", 1)) return 1;
  }
  return k ? 0 : 1;
}

int eldr__req_scan(const char *body, size_t len, eldr__api api, eldr__req *out) {
  eldr_js_span f[F__N], root;
  if (api == ELDR__API_GENERATE) return 1; /* SGLang's /generate: the tree path reads it */
  if (eldr_js_scan(body, len, FIELDS, F__N, f, &root, NULL) || root.type != ELDR_JS_OBJECT) return 1;
  if (fields_ok(body, f)) return 1;
  /* the text is never longer than the body; raw is the body and its NUL */
  if (len + 1 > out->text_cap) {
    char *q = realloc(out->text, len + 1);
    if (!q) return ELDR_ENOMEM;
    out->text = q;
    out->text_cap = len + 1;
  }
  if (len + 1 > out->raw_cap) {
    char *q = realloc(out->raw, len + 1);
    if (!q) return ELDR_ENOMEM;
    out->raw = q;
    out->raw_cap = len + 1;
  }
  tbuf t = {out->text, 0, out->text_cap - 1};
  out->n_ids = 0;
  int rc = api == ELDR__API_COMPLETIONS ? prompt_text(body, f[F_PROMPT], &t, out) : messages_text(body, f[F_MESSAGES], &t);
  if (rc) {
    out->n_ids = 0;
    return rc;
  }
  out->text[t.n] = 0;
  out->text_len = t.n;
  out->api = api;
  out->stream = f[F_STREAM].type == ELDR_JS_TRUE;
  out->want_routed_experts = f[F_RRE].type == ELDR_JS_TRUE;
  out->prompt_logprobs = !ABSENT(f[F_PROMPT_LOGPROBS].type);
  memcpy(out->raw, body, len);
  out->raw[len] = 0;
  out->raw_len = len;
  out->raw_ok = 1;
  return 0;
}
