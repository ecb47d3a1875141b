/* rewrite.c — the tree path (jansson) of both PD legs' JSON: client
 * request validation, the prefill-leg rewrite and the decode-leg body for
 * a request the byte editor does not take, the decode reply's fixes
 * (usage, prompt_logprobs, the routed_experts splice) when the byte edits
 * cannot make them, error bodies (docs/serve.md, the wire protocol). The
 * byte path is edit.c; the prefill reply is read by format's
 * eldr/reply.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/routed_experts.h"
#include "serve_internal.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_PRESERVE_ORDER)

static int bad(eldr_diag *d, const char *fmt, const char *field) {
  return eldr_diag_fail(d, ELDR_EINVAL, fmt, field);
}

/* Append s[0..n) to a growing buffer. */
typedef struct sbuf {
  char *p;
  size_t n, cap;
} sbuf;

static int sb_add(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

static int optional_int(json_t *root, const char *key, eldr_diag *d) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return bad(d, "field '%s' must be a non-negative integer", key);
  return 0;
}

static int64_t int_or(json_t *root, const char *key, int64_t dflt) {
  json_t *v = json_object_get(root, key);
  return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

static int num_field(json_t *root, const char *key, double *x) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  *x = json_number_value(v);
  return json_is_number(v) ? 1 : -1;
}

/* What the decode engine would refuse, checked before the prefill leg so
 * that a refused request never holds prefill KV blocks until vLLM's abort
 * timeout. After vLLM's request validators (entrypoints/openai protocol:
 * validate_stream_options, check_logprobs) and SamplingParams._verify_args;
 * messages follow theirs. Types were checked before. */
static int decoder_rules(json_t *root, int stream, eldr_diag *d) {
  json_t *so = json_object_get(root, "stream_options");
  if (so && !json_is_null(so) && !stream)
    return eldr_diag_fail(d, ELDR_EINVAL, "Stream options can only be defined when `stream=True`.");
  json_t *pl = json_object_get(root, "prompt_logprobs");
  if (pl && !json_is_null(pl) && stream)
    return eldr_diag_fail(d, ELDR_EINVAL, "`prompt_logprobs` are not available when `stream=True`.");
  json_t *tl = json_object_get(root, "top_logprobs");
  if (tl && !json_is_null(tl) && json_integer_value(tl) > 0 && json_object_get(root, "messages") &&
      !json_is_true(json_object_get(root, "logprobs")))
    return eldr_diag_fail(d, ELDR_EINVAL, "when using `top_logprobs`, `logprobs` must be set to true.");
  if (int_or(root, "n", 1) < 1) return eldr_diag_fail(d, ELDR_EINVAL, "n must be at least 1, got %lld.", (long long)int_or(root, "n", 1));
  int64_t mx = int_or(root, "max_completion_tokens", int_or(root, "max_tokens", -1));
  if (json_object_get(root, "max_completion_tokens") && json_is_null(json_object_get(root, "max_completion_tokens")))
    mx = int_or(root, "max_tokens", -1);
  /* completions with echo: max_tokens 0 asks for the prompt alone (vLLM's
   * CompletionRequest.to_sampling_params, echo_without_generation; lm-eval's
   * loglikelihood requests) */
  const int echo_only = json_is_true(json_object_get(root, "echo")) && !json_object_get(root, "messages");
  if (mx == 0 && !echo_only) return eldr_diag_fail(d, ELDR_EINVAL, "max_tokens must be at least 1, got 0.");
  int64_t mn = int_or(root, "min_tokens", 0);
  if (mx >= 0 && mn > mx)
    return eldr_diag_fail(d, ELDR_EINVAL, "min_tokens must be less than or equal to max_tokens=%lld, got %lld.",
                          (long long)mx, (long long)mn);
  double x = 0;
  int k = num_field(root, "temperature", &x);
  if (k < 0 || (k && x < 0))
    return eldr_diag_fail(d, ELDR_EINVAL, "temperature must be non-negative, got %g.", x);
  k = num_field(root, "top_p", &x);
  if (k < 0 || (k && !(x > 0 && x <= 1)))
    return eldr_diag_fail(d, ELDR_EINVAL, "top_p must be in (0, 1], got %g.", x);
  return 0;
}

/* Text of a chat message's content: a string, null, or an array of parts
 * ({"type": "text", "text": str} contribute their text; other parts must
 * be objects with a string "type"). */
static int content_text(json_t *content, sbuf *b, eldr_diag *d) {
  if (!content || json_is_null(content)) return 0;
  if (json_is_string(content))
    return sb_add(b, json_string_value(content), json_string_length(content)) ? ELDR_ENOMEM : 0;
  if (!json_is_array(content))
    return bad(d, "field '%s' must be a string, an array of parts or null", "messages[].content");
  size_t i;
  json_t *part;
  json_array_foreach(content, i, part) {
    if (!json_is_object(part) || !json_is_string(json_object_get(part, "type")))
      return bad(d, "field '%s' must be an object with a string 'type'", "messages[].content[]");
    json_t *t = json_object_get(part, "text");
    if (t && !json_is_string(t)) return bad(d, "field '%s' must be a string", "messages[].content[].text");
    if (t && sb_add(b, json_string_value(t), json_string_length(t))) return ELDR_ENOMEM;
  }
  return 0;
}

/* SGLang's native /generate body (managers/io_struct.py, GenerateReqInput
 * and its _validate_inputs / _normalize_*): "text" (a string or a batch of
 * strings) or "input_ids" (token ids, or a batch of id lists), exactly one;
 * "sampling_params" an object (max_new_tokens, n) or one object per batch
 * entry; "return_logprob" a boolean or one per entry. The prompt's text (a
 * batch's joined by newlines, as a completion's) or ids (one id prompt;
 * a batch of id prompts is validated only, as a completion's) into b / out. */
static int generate_prompt(json_t *root, eldr__req *out, sbuf *b, eldr_diag *d) {
  json_t *text = json_object_get(root, "text"), *ids = json_object_get(root, "input_ids");
  if (json_is_null(text)) text = NULL;
  if (json_is_null(ids)) ids = NULL;
  if (json_object_get(root, "input_embeds") && !json_is_null(json_object_get(root, "input_embeds")))
    return bad(d, "field '%s' is not served by the router (give text or input_ids)", "input_embeds");
  if (!text == !ids)
    return eldr_diag_fail(d, ELDR_EINVAL, "exactly one of 'text' and 'input_ids' must be given (GenerateReqInput: "
                                          "\"Either text, input_ids or input_embeds should be provided.\")");
  size_t nb = 1;
  if (text) {
    if (json_is_string(text)) {
      if (sb_add(b, json_string_value(text), json_string_length(text))) return ELDR_ENOMEM;
    } else if (json_is_array(text) && json_array_size(text) > 0) {
      size_t i;
      json_t *e;
      nb = json_array_size(text);
      json_array_foreach(text, i, e) {
        if (!json_is_string(e)) return bad(d, "field '%s' must be a string or a non-empty array of strings", "text");
        if ((i && sb_add(b, "\n", 1)) || sb_add(b, json_string_value(e), json_string_length(e))) return ELDR_ENOMEM;
      }
    } else {
      return bad(d, "field '%s' must be a string or a non-empty array of strings", "text");
    }
  } else {
    const char *msg = "field '%s' must be a non-empty array of token ids (0..2^32-1) or of such arrays";
    size_t n = json_array_size(ids), i, j;
    json_t *e, *x;
    if (!json_is_array(ids) || !n) return bad(d, msg, "input_ids");
    if (json_is_array(json_array_get(ids, 0))) { /* a batch of id prompts: validated only */
      nb = n;
      json_array_foreach(ids, i, e) {
        if (!json_is_array(e) || !json_array_size(e)) return bad(d, msg, "input_ids");
        json_array_foreach(e, j, x) if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                                        json_integer_value(x) > (json_int_t)UINT32_MAX) return bad(d, msg, "input_ids");
      }
    } else {
      if (!(out->ids = malloc(n * sizeof *out->ids))) return ELDR_ENOMEM;
      out->ids_cap = n;
      json_array_foreach(ids, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > (json_int_t)UINT32_MAX)
          return bad(d, msg, "input_ids");
        out->ids[i] = (uint32_t)json_integer_value(e);
      }
      out->n_ids = n;
    }
  }
  json_t *sp = json_object_get(root, "sampling_params");
  if (sp && !json_is_null(sp)) {
    size_t n = json_is_array(sp) ? json_array_size(sp) : 1, i;
    if (!json_is_object(sp) && !(json_is_array(sp) && n == nb))
      return eldr_diag_fail(d, ELDR_EINVAL, "field 'sampling_params' must be an object, or an array of %zu objects "
                                            "(one per batch entry)", nb);
    for (i = 0; i < n; i++) {
      json_t *o = json_is_array(sp) ? json_array_get(sp, i) : sp;
      if (!json_is_object(o)) return bad(d, "field '%s' must be an object", "sampling_params[]");
      json_t *v = json_object_get(o, "max_new_tokens");
      if (v && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) < 0))
        return bad(d, "field '%s' must be a non-negative integer", "sampling_params.max_new_tokens");
      v = json_object_get(o, "n");
      if (v && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) < 1))
        return bad(d, "field '%s' must be a positive integer", "sampling_params.n");
    }
  }
  json_t *lp = json_object_get(root, "return_logprob");
  if (lp && !json_is_null(lp) && !json_is_boolean(lp) && !(json_is_array(lp) && json_array_size(lp) == nb))
    return eldr_diag_fail(d, ELDR_EINVAL, "field 'return_logprob' must be a boolean, or an array of %zu (one per "
                                          "batch entry)", nb);
  return 0;
}

void eldr__req_free(eldr__req *r) {
  if (!r) return;
  json_decref(r->root);
  free(r->text);
  free(r->ids);
  free(r->raw);
  memset(r, 0, sizeof *r);
}

void eldr__req_clear(eldr__req *r) {
  json_decref(r->root);
  r->root = NULL;
  r->stream = r->want_routed_experts = r->prompt_logprobs = r->raw_ok = 0;
  r->text_len = r->n_ids = r->raw_len = 0;
}

int eldr__req_parse(const char *body, size_t len, eldr__api api, eldr__req *out, eldr_diag *d) {
  memset(out, 0, sizeof *out);
  return eldr__req_read(body, len, api, out, d);
}

int eldr__req_read(const char *body, size_t len, eldr__api api, eldr__req *out, eldr_diag *d) {
  eldr__req_clear(out);
  if (!memchr(body, 0, len)) {
    int rc = eldr__req_scan(body, len, api, out);
    if (rc == 0) return 0;
    if (rc == ELDR_ENOMEM) {
      eldr__req_clear(out);
      return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    }
  }
  eldr__req_free(out); /* the tree path: its own allocations */
  return eldr__req_parse_tree(body, len, api, out, d);
}

int eldr__req_parse_tree(const char *body, size_t len, eldr__api api, eldr__req *out, eldr_diag *d) {
  memset(out, 0, sizeof *out);
  out->api = api;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root)
    return eldr_diag_fail(d, ELDR_EPARSE, "invalid JSON body: %s (line %d, column %d)", je.text,
                          je.line, je.column);
  out->root = root;
  sbuf b = {0};
  int rc;
  if (!json_is_object(root)) {
    rc = eldr_diag_fail(d, ELDR_EINVAL, "request body must be a JSON object");
    goto fail;
  }
  json_t *v = json_object_get(root, "stream");
  if (v && !json_is_null(v) && !json_is_boolean(v)) {
    rc = bad(d, "field '%s' must be a boolean", "stream");
    goto fail;
  }
  out->stream = v && json_is_true(v);
  v = json_object_get(root, "return_routed_experts");
  if (v && !json_is_null(v) && !json_is_boolean(v)) {
    rc = bad(d, "field '%s' must be a boolean", "return_routed_experts");
    goto fail;
  }
  out->want_routed_experts = v && json_is_true(v);
  v = json_object_get(root, "prompt_logprobs");
  out->prompt_logprobs = v && !json_is_null(v);
  v = json_object_get(root, "model");
  if (v && !json_is_null(v) && !json_is_string(v)) {
    rc = bad(d, "field '%s' must be a string", "model");
    goto fail;
  }
  v = json_object_get(root, "stream_options");
  if (v && !json_is_null(v) && !json_is_object(v)) {
    rc = bad(d, "field '%s' must be an object", "stream_options");
    goto fail;
  }
  v = json_object_get(root, "kv_transfer_params");
  if (v && !json_is_null(v) && !json_is_object(v)) {
    rc = bad(d, "field '%s' must be an object", "kv_transfer_params");
    goto fail;
  }
  if (api == ELDR__API_GENERATE) {
    if ((rc = generate_prompt(root, out, &b, d))) {
      if (rc == ELDR_ENOMEM) goto nomem;
      goto fail;
    }
  } else if ((rc = optional_int(root, "max_tokens", d)) || (rc = optional_int(root, "max_completion_tokens", d)) ||
      (rc = optional_int(root, "min_tokens", d)) || (rc = optional_int(root, "n", d)) ||
      (rc = optional_int(root, "prompt_logprobs", d)) || (rc = optional_int(root, "top_logprobs", d)) ||
      (rc = decoder_rules(root, out->stream, d)))
    goto fail;
  if (api == ELDR__API_GENERATE) {
    /* read above */
  } else if (api == ELDR__API_COMPLETIONS) {
    json_t *p = json_object_get(root, "prompt");
    if (!p) {
      rc = eldr_diag_fail(d, ELDR_EINVAL, "missing field 'prompt'");
      goto fail;
    }
    if (json_is_string(p)) {
      if (sb_add(&b, json_string_value(p), json_string_length(p))) goto nomem;
    } else if (json_is_array(p) && json_array_size(p) > 0) {
      size_t i, n = json_array_size(p);
      json_t *e;
      if (json_is_integer(json_array_get(p, 0))) { /* token ids */
        out->ids = malloc(n * sizeof *out->ids);
        if (!out->ids) goto nomem;
        out->ids_cap = n;
        json_array_foreach(p, i, e) {
          if (!json_is_integer(e) || json_integer_value(e) < 0 ||
              json_integer_value(e) > (json_int_t)UINT32_MAX) {
            rc = bad(d, "field '%s' must be a string, strings or token ids", "prompt");
            goto fail;
          }
          out->ids[i] = (uint32_t)json_integer_value(e);
        }
        out->n_ids = n;
      } else {
        json_array_foreach(p, i, e) {
          if (json_is_string(e)) {
            if ((i && sb_add(&b, "\n", 1)) || sb_add(&b, json_string_value(e), json_string_length(e)))
              goto nomem;
          } else if (json_is_array(e)) { /* batch of token-id prompts: validate only */
            size_t j;
            json_t *x;
            json_array_foreach(e, j, x) {
              if (!json_is_integer(x)) {
                rc = bad(d, "field '%s' must be a string, strings or token ids", "prompt");
                goto fail;
              }
            }
          } else {
            rc = bad(d, "field '%s' must be a string, strings or token ids", "prompt");
            goto fail;
          }
        }
      }
    } else {
      rc = bad(d, "field '%s' must be a non-empty string, strings or token ids", "prompt");
      goto fail;
    }
  } else {
    json_t *m = json_object_get(root, "messages");
    if (!m) {
      rc = eldr_diag_fail(d, ELDR_EINVAL, "missing field 'messages'");
      goto fail;
    }
    if (!json_is_array(m) || json_array_size(m) == 0) {
      rc = bad(d, "field '%s' must be a non-empty array", "messages");
      goto fail;
    }
    size_t i;
    json_t *msg;
    json_array_foreach(m, i, msg) {
      if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "role"))) {
        rc = bad(d, "field '%s' must be an object with a string 'role'", "messages[]");
        goto fail;
      }
      /* "role: content\n" per message, as the emulated worker tokenizes it */
      json_t *role = json_object_get(msg, "role");
      if (sb_add(&b, json_string_value(role), json_string_length(role)) || sb_add(&b, ": ", 2))
        goto nomem;
      if ((rc = content_text(json_object_get(msg, "content"), &b, d))) goto fail;
      if (sb_add(&b, "\n", 1)) goto nomem;
    }
  }
  if (!b.p && sb_add(&b, "", 0)) goto nomem;
  /* the client's bytes, kept to cut the legs' bodies from (edit.c) */
  if (!(out->raw = malloc(len + 1))) goto nomem;
  out->raw_cap = len + 1;
  memcpy(out->raw, body, len);
  out->raw[len] = 0;
  out->raw_len = len;
  out->raw_ok = !memchr(body, 0, len);
  out->text = b.p;
  out->text_len = b.n;
  out->text_cap = b.cap;
  return 0;
nomem:
  rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
fail:
  free(b.p);
  eldr__req_free(out);
  return rc;
}

static char *dump(json_t *o, size_t *len) {
  char *s = json_dumps(o, DUMP_FLAGS);
  if (s && len) *len = strlen(s);
  return s;
}

char *eldr__prefill_body_tree(const eldr__req *r, size_t *len) {
  json_t *o = json_copy(r->root); /* shallow: only top-level keys change */
  if (!o) return NULL;
  json_t *kv = json_pack("{s:b,s:b,s:n,s:n,s:n,s:n}", "do_remote_decode", 1, "do_remote_prefill", 0,
                         "remote_engine_id", "remote_block_ids", "remote_host", "remote_port");
  int bad_set = !kv;
  bad_set |= json_object_set_new(o, "stream", json_false());
  bad_set |= json_object_set_new(o, "max_tokens", json_integer(1));
  if (json_object_get(o, "max_completion_tokens"))
    bad_set |= json_object_set_new(o, "max_completion_tokens", json_integer(1));
  json_object_del(o, "stream_options");
  json_object_del(o, "min_tokens");
  json_object_del(o, "min_completion_tokens"); /* as vLLM's toy_proxy_server.py: not for the prefill */
  if (kv) bad_set |= json_object_set_new(o, "kv_transfer_params", kv);
  char *s = bad_set ? NULL : dump(o, len);
  json_decref(o);
  return s;
}

char *eldr__decode_body_tree(const eldr__req *r, json_t *kvp, size_t *len) {
  json_t *o = json_copy(r->root);
  if (!o) return NULL;
  /* the client's own kv_transfer_params never reach a decoder: with them
   * it would open its NIXL side channel to a host the client chose */
  json_object_del(o, "kv_transfer_params");
  json_object_del(o, "prompt_logprobs"); /* the prefill computed them; the decoder has no prompt logits */
  if (kvp && json_object_set(o, "kv_transfer_params", kvp)) {
    json_decref(o);
    return NULL;
  }
  char *s = dump(o, len);
  json_decref(o);
  return s;
}

static json_t *choice0_re(json_t *root) {
  json_t *ch = json_object_get(root, "choices");
  json_t *c0 = json_is_array(ch) ? json_array_get(ch, 0) : NULL;
  return json_is_object(c0) ? json_object_get(c0, "routed_experts") : NULL;
}

/* dtype of a base64 npy blob from its header. */
static int blob_dtype(const char *b64, size_t len, eldr_sel_dtype *dt, eldr_diag *d) {
  uint8_t hdr[1024];
  size_t take = len < 1024 ? len : 1024; /* multiple of 4 when truncated */
  size_t n = 0;
  int rc = eldr_b64_decode(b64, take, hdr, sizeof hdr, &n, d);
  if (rc) return rc;
  eldr_npy_info info;
  if ((rc = eldr_npy_parse_header(hdr, n, &info, d))) return rc;
  *dt = info.dtype;
  return 0;
}

/* npy: the prefill rows over the prompt rows of one decode choice's blob. */
static int splice_npy(json_t *c, json_t *re, const uint16_t *psel, size_t prow, const eldr_shape *pshape,
                      int64_t prompt_tokens, eldr_diag *d) {
  const char *db = json_string_value(re);
  size_t dl = json_string_length(re);
  eldr_shape any = {0, 0, 0}, dshape;
  uint16_t *dsel = NULL;
  char *enc = NULL;
  size_t drow = 0, el = 0;
  eldr_sel_dtype dt;
  int rc;
  if ((rc = blob_dtype(db, dl, &dt, d))) return rc;
  if ((rc = eldr_routed_experts_decode(db, dl, &any, &dsel, &drow, &dshape, d))) return rc;
  if (dshape.num_layers != pshape->num_layers || dshape.top_k != pshape->top_k) {
    free(dsel);
    return eldr_diag_fail(d, ELDR_ESHAPE, "prefill and decode routed_experts differ in shape");
  }
  size_t P = prompt_tokens >= 0 ? (size_t)prompt_tokens : prow;
  size_t off = P >= prow ? P - prow : 0;
  size_t rowlen = (size_t)pshape->num_layers * pshape->top_k;
  for (size_t r = 0; r < prow && off + r < drow; r++)
    memcpy(dsel + (off + r) * rowlen, psel + r * rowlen, rowlen * sizeof *dsel);
  eldr_shape es = dshape;
  uint32_t maxid = 0;
  for (size_t k = 0; k < drow * rowlen; k++)
    if (dsel[k] > maxid) maxid = dsel[k];
  if (es.num_experts <= maxid) es.num_experts = maxid + 1;
  /* the expert count only bounds the ids here; dt fixes the wire dtype */
  rc = eldr_routed_experts_encode(dsel, drow, &es, dt, &enc, &el);
  free(dsel);
  if (rc) return rc;
  rc = json_object_set_new(c, "routed_experts", json_stringn(enc, el)) ? ELDR_ENOMEM : 0;
  free(enc);
  return rc;
}

/* lists (PR #38939): the prefill's rows replace the decode list's rows at
 * the same prompt positions. */
static int splice_lists(json_t *dl, json_t *pl, int64_t prompt_tokens, eldr_diag *d) {
  size_t prow = json_array_size(pl), drow = json_array_size(dl);
  size_t P = prompt_tokens >= 0 ? (size_t)prompt_tokens : prow;
  size_t off = P >= prow ? P - prow : 0;
  for (size_t r = 0; r < prow && off + r < drow; r++) {
    json_t *row = json_array_get(pl, r);
    if (!json_is_array(row) || json_array_size(row) != json_array_size(json_array_get(dl, off + r)))
      return eldr_diag_fail(d, ELDR_ESHAPE, "prefill and decode routed_experts differ in shape");
    if (json_array_set(dl, off + r, row)) return ELDR_ENOMEM;
  }
  return 0;
}

/* The prefill's prompt rows spliced into a parsed decode reply (root is
 * changed in place): see eldr__splice_routed_experts. */
static int splice_tree(json_t *root, json_t *proot, eldr_diag *d) {
  json_t *ch = json_object_get(root, "choices");
  if (!json_is_array(ch) || json_array_size(ch) == 0)
    return eldr_diag_fail(d, ELDR_EPARSE, "decode reply has no choices");
  /* vLLM 0.21 and later: the prompt's rows are one top-level value */
  json_t *ppre = json_object_get(proot, "prompt_routed_experts");
  if (ppre && !json_is_null(ppre) && json_object_get(root, "prompt_routed_experts"))
    return json_object_set(root, "prompt_routed_experts", ppre) ? ELDR_ENOMEM : 0;
  json_t *pre = choice0_re(proot);
  if (!pre || json_is_null(pre) || ppre)
    return eldr_diag_fail(d, ELDR_ENOTFOUND, "prefill reply carries no prompt routed_experts to splice");
  int64_t P = -1;
  json_t *pt = json_object_get(json_object_get(proot, "usage"), "prompt_tokens");
  if (json_is_integer(pt) && json_integer_value(pt) >= 0) P = json_integer_value(pt);
  uint16_t *psel = NULL;
  size_t prow = 0;
  eldr_shape any = {0, 0, 0}, pshape;
  int rc = 0, spliced = 0;
  if (json_is_string(pre) &&
      (rc = eldr_routed_experts_decode(json_string_value(pre), json_string_length(pre), &any, &psel, &prow,
                                       &pshape, d)))
    return rc;
  size_t i;
  json_t *c;
  json_array_foreach(ch, i, c) {
    json_t *re = json_is_object(c) ? json_object_get(c, "routed_experts") : NULL;
    if (json_is_string(re) && psel) rc = splice_npy(c, re, psel, prow, &pshape, P, d);
    else if (json_is_array(re) && json_is_array(pre)) rc = splice_lists(re, pre, P, d);
    else if (re && !json_is_null(re)) rc = eldr_diag_fail(d, ELDR_EINVAL, "prefill and decode routed_experts differ in layout");
    else continue;
    if (rc) break;
    spliced++;
  }
  free(psel);
  if (!rc && !spliced) rc = eldr_diag_fail(d, ELDR_ENOTFOUND, "decode reply carries no routed_experts");
  return rc;
}

/* usage as vLLM's router reports a PD request: the prompt's side from the
 * prefill (the decoder received the KV and counts the prompt as cached),
 * the completion from the decoder. 1 when changed. */
static int fix_usage(json_t *root, json_t *proot) {
  json_t *du = json_object_get(root, "usage"), *pu = json_object_get(proot, "usage");
  json_t *pt = json_object_get(pu, "prompt_tokens");
  if (!json_is_object(du) || !json_is_integer(pt)) return 0;
  json_object_set(du, "prompt_tokens", pt);
  json_t *det = json_object_get(pu, "prompt_tokens_details");
  if (json_is_object(det)) json_object_set(du, "prompt_tokens_details", det);
  else if (json_object_get(du, "prompt_tokens_details")) json_object_set_new(du, "prompt_tokens_details", json_null());
  json_t *ct = json_object_get(du, "completion_tokens");
  if (json_is_integer(ct))
    json_object_set_new(du, "total_tokens", json_integer(json_integer_value(pt) + json_integer_value(ct)));
  return 1;
}

/* prompt_logprobs from the prefill (the decoder computed no prompt
 * logits): top level (chat) or per choice (completions). 1 when changed. */
static int fix_prompt_logprobs(json_t *root, json_t *proot) {
  int n = 0;
  json_t *top = json_object_get(proot, "prompt_logprobs");
  if (top && !json_is_null(top)) n += !json_object_set(root, "prompt_logprobs", top);
  json_t *pc = json_object_get(json_array_get(json_object_get(proot, "choices"), 0), "prompt_logprobs");
  if (pc && !json_is_null(pc)) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "choices"), i, c)
      if (json_is_object(c)) n += !json_object_set(c, "prompt_logprobs", pc);
  }
  return n > 0;
}

int eldr__decode_reply_fix(const char *decode_body, size_t len, json_t *proot, const eldr__fix_opts *o,
                           char **out, size_t *out_len, int *spliced, eldr_diag *d) {
  *out = NULL;
  if (spliced) *spliced = 0;
  json_error_t je;
  json_t *root = json_loadb(decode_body, len, 0, &je);
  if (!root) return eldr_diag_fail(d, ELDR_EPARSE, "decode reply is not JSON: %s", je.text);
  if (!json_is_object(root) || !json_is_object(proot)) {
    json_decref(root);
    return eldr_diag_fail(d, ELDR_EPARSE, "decode or prefill reply is not a JSON object");
  }
  int changed = 0, rc = 0;
  if (o->usage) changed |= fix_usage(root, proot);
  if (o->prompt_logprobs) changed |= fix_prompt_logprobs(root, proot);
  if (o->splice && eldr__memmem(decode_body, len, "routed_experts", 14)) {
    rc = splice_tree(root, proot, d);
    if (rc == 0) changed = 1;
    if (spliced) *spliced = rc == 0 ? 1 : rc == ELDR_ENOTFOUND ? 0 : -1;
  }
  if (changed) {
    rc = (*out = dump(root, out_len)) ? 0 : ELDR_ENOMEM;
  } else if (!rc || rc == ELDR_ENOTFOUND) {
    rc = eldr_diag_fail(d, ELDR_ENOTFOUND, "nothing to change in the decode reply");
  }
  json_decref(root);
  return rc;
}

int eldr__splice_routed_experts(const char *decode_body, size_t len, json_t *proot, char **out,
                                size_t *out_len, eldr_diag *d) {
  eldr__fix_opts o = {1, 0, 0};
  int sp = 0;
  int rc = eldr__decode_reply_fix(decode_body, len, proot, &o, out, out_len, &sp, d);
  if (rc == 0 && sp < 0) { /* only the splice was asked: its failure is the result */
    free(*out);
    *out = NULL;
    rc = ELDR_EINVAL;
  }
  return rc;
}

char *eldr__error_json(int status, const char *type, const char *msg, size_t *len) {
  json_t *o = json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg ? msg : "", "type",
                        type ? type : "error", "code", status);
  if (!o) return NULL;
  char *s = dump(o, len);
  json_decref(o);
  return s;
}
