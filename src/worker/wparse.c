/* wparse.c — the emulated worker's request parsing (the body checks of
 * /v1/completions and /v1/chat/completions, as vLLM's OpenAI server makes
 * them) and the prompt's tokens and expert selections. */
#include "worker/worker_impl.h"

/* ------------------------------------------------------------- selections */

/* Byte length of the text of the first KV block (first ELDR_BLOCK_TOKENS
 * tokens), so that text-derived selections are seeded by it alone. */
static size_t first_block_len(const char *text, size_t len, const uint32_t *ids, size_t n) {
  if (n < ELDR_BLOCK_TOKENS) return len;
  uint32_t tmp[ELDR_BLOCK_TOKENS + 1];
  size_t lo = 1, hi = len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    size_t m = eldr_tokenize(text, mid, tmp, ELDR_BLOCK_TOKENS + 1);
    int ok = m >= ELDR_BLOCK_TOKENS && !memcmp(tmp, ids, ELDR_BLOCK_TOKENS * sizeof *ids);
    if (ok) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

int eldr__w_tokenize(const char *text, size_t len, uint32_t **ids_out, size_t *n_out) {
  size_t cap = len + 16;
  uint32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return ELDR_ENOMEM;
  size_t n = eldr_tokenize(text, len, ids, cap);
  if (n > cap) {
    uint32_t *t = realloc(ids, n * sizeof *ids);
    if (!t) {
      free(ids);
      return ELDR_ENOMEM;
    }
    ids = t;
    (void)eldr_tokenize(text, len, ids, n);
  }
  *ids_out = ids;
  *n_out = n;
  return 0;
}

/* Prompt selections (n_tok rows) and decode selections (*n_dsel rows, at
 * least 1). rec >= 0: from the trace record, else from the text. */
int eldr__w_selections(const eldr_worker *w, const char *text, size_t len, const uint32_t *ids,
                      size_t n_tok, long rec, uint32_t want_decode, uint16_t **psel,
                      uint16_t **dsel, uint32_t *n_dsel, eldr_diag *d) {
  const size_t LK = w->LK;
  *psel = NULL;
  if (dsel) *dsel = NULL;
  if (rec >= 0) {
    const eldr_request *q = &w->trace->req[rec];
    if (q->n_prefill > 0 && (q->n_decode > 0 || !dsel)) {
      uint16_t *p = malloc((n_tok ? n_tok : 1) * LK * sizeof *p);
      if (!p) return ELDR_ENOMEM;
      for (size_t t = 0; t < n_tok; t++) {
        size_t src = n_tok == q->n_prefill ? t : (t * q->n_prefill) / n_tok;
        memcpy(p + t * LK, q->prefill + src * LK, LK * sizeof *p);
      }
      *psel = p;
      if (dsel) {
        uint16_t *dd = malloc((size_t)q->n_decode * LK * sizeof *dd);
        if (!dd) {
          free(p);
          *psel = NULL;
          return ELDR_ENOMEM;
        }
        memcpy(dd, q->decode, (size_t)q->n_decode * LK * sizeof *dd);
        *dsel = dd;
        *n_dsel = q->n_decode;
      }
      return 0;
    }
    /* a record without selections: fall through to the text */
  }
  /* a prompt given as token ids (SGLang's input_ids; text NULL): seeded by
   * the bytes of its first block's ids */
  size_t seed_len = text ? first_block_len(text, len, ids, n_tok)
                         : (n_tok < ELDR_BLOCK_TOKENS ? n_tok : ELDR_BLOCK_TOKENS) * sizeof *ids;
  if (!text) text = (const char *)ids;
  uint16_t *p = NULL, *dd = NULL;
  int dom = -1;
  /* decode rows are used cyclically (row = token % rows): at most 512 are
   * generated, which bounds the memory of a long max_tokens */
  uint32_t nd = want_decode ? want_decode : 1;
  if (nd > 512) nd = 512;
  int rc = eldr_tracegen_from_text(w->gen, text, seed_len, (uint32_t)n_tok, nd, &p, &dd, &dom, d);
  if (rc < 0) return rc;
  *psel = p;
  if (dsel) {
    *dsel = dd;
    *n_dsel = nd;
  } else {
    free(dd);
  }
  return 0;
}

int eldr_worker_prompt_selections(const eldr_worker *w, const char *text, size_t len,
                                  const char *trace_id, uint16_t **sel, size_t *n_tokens,
                                  eldr_diag *d) {
  *sel = NULL;
  *n_tokens = 0;
  long rec = -1;
  if (trace_id) {
    rec = eldr__w_trace_find(w, trace_id);
    if (rec < 0) return eldr_diag_fail(d, ELDR_ENOTFOUND, "unknown eldr_trace_id '%s'", trace_id);
  }
  uint32_t *ids = NULL;
  size_t n = 0;
  int rc = eldr__w_tokenize(text, len, &ids, &n);
  if (rc < 0) return rc;
  rc = eldr__w_selections(w, text, len, ids, n, rec, 1, sel, NULL, NULL, d);
  free(ids);
  if (rc == 0) *n_tokens = n;
  return rc;
}


/* ------------------------------------------------------- request parsing */

/* Prompt text of a chat request: "role: content\n" per message. */
static int chat_prompt(json_t *msgs, char **out, size_t *out_len, char *err, size_t errcap) {
  if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
    snprintf(err, errcap, "'messages' must be a non-empty array");
    return -1;
  }
  size_t cap = 256, len = 0;
  char *s = malloc(cap);
  if (!s) return -1;
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    if (!json_is_object(m) || !json_is_string(role)) {
      snprintf(err, errcap, "'messages[%zu]' needs a string 'role'", i);
      free(s);
      return -1;
    }
    const char *parts[64];
    size_t plen[64], np = 0;
    if (json_is_string(content)) {
      parts[np] = json_string_value(content);
      plen[np++] = json_string_length(content);
    } else if (json_is_array(content)) {
      size_t j;
      json_t *p;
      json_array_foreach(content, j, p) {
        json_t *t = json_object_get(p, "text");
        if (!json_is_string(t) || np >= 64) {
          snprintf(err, errcap, "'messages[%zu].content[%zu]' must be a text part", i, j);
          free(s);
          return -1;
        }
        parts[np] = json_string_value(t);
        plen[np++] = json_string_length(t);
      }
    } else if (!json_is_null(content) && content) {
      snprintf(err, errcap, "'messages[%zu].content' must be a string or an array of parts", i);
      free(s);
      return -1;
    }
    size_t need = json_string_length(role) + 3;
    for (size_t k = 0; k < np; k++) need += plen[k];
    if (eldr_grow(&s, &cap, len + need + 1, 1, 256)) {
      free(s);
      return -1;
    }
    memcpy(s + len, json_string_value(role), json_string_length(role));
    len += json_string_length(role);
    s[len++] = ':';
    s[len++] = ' ';
    for (size_t k = 0; k < np; k++) {
      memcpy(s + len, parts[k], plen[k]);
      len += plen[k];
    }
    s[len++] = '\n';
  }
  s[len] = 0;
  *out = s;
  *out_len = len;
  return 0;
}

static int get_bool(json_t *o, const char *key, int dflt, int *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return 0;
  }
  if (!json_is_boolean(v)) return -1;
  *out = json_is_true(v);
  return 0;
}


#define FAIL(code, prm, ...)                                                                       \
  do {                                                                                             \
    snprintf(err, errcap, __VA_ARGS__);                                                            \
    *param = (prm);                                                                                \
    status = (code);                                                                               \
    goto done;                                                                                     \
  } while (0)

/* Parse and check a /v1/completions (chat = 0) or /v1/chat/completions body.
 * Returns 0 with *o filled, or an HTTP status (4xx, 500 for memory) with the
 * message in err and the offending field in *param (may be NULL). */
int eldr__w_parse_body(const eldr_worker *w, const char *body, size_t blen, int chat, preq *o,
                      char *err, size_t errcap, const char **param) {
  int status = 0;
  memset(o, 0, sizeof *o);
  o->max_tokens = -1;
  o->rec = -1;
  *param = NULL;
  err[0] = 0;
  json_error_t jerr;
  json_t *j = json_loadb(body, blen, 0, &jerr);
  char *prompt = NULL;
  size_t plen = 0;
  if (!j)
    FAIL(400, NULL, "request body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
         jerr.column);
  if (!json_is_object(j)) FAIL(400, NULL, "request body must be a JSON object");
  json_t *model = json_object_get(j, "model");
  if (model && !json_is_null(model)) {
    if (!json_is_string(model)) {
      FAIL(400, "model", "'model' must be a string");
    }
    if (strcmp(json_string_value(model), w->served)) {
      FAIL(404, "model", "The model `%s` does not exist.", json_string_value(model));
    }
  }
  if (chat) {
    if (chat_prompt(json_object_get(j, "messages"), &prompt, &plen, err, errcap) < 0) {
      if (!err[0]) snprintf(err, errcap, "out of memory");
      *param = "messages";
      status = 400;
      goto done;
    }
  } else {
    json_t *p = json_object_get(j, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
      p = json_array_get(p, 0);
    if (!json_is_string(p)) {
      FAIL(400, "prompt", "'prompt' must be a string (or an array of one string; token-id prompts and "
                 "batched prompts are not supported by the emulator)");
    }
    plen = json_string_length(p);
    prompt = malloc(plen + 1);
    if (!prompt) {
      FAIL(500, NULL, "out of memory");
    }
    memcpy(prompt, json_string_value(p), plen + 1);
  }
  int stream = 0, include_usage = 0;
  if (get_bool(j, "stream", 0, &stream) < 0) {
    FAIL(400, "stream", "'stream' must be a boolean");
  }
  json_t *so = json_object_get(j, "stream_options");
  if (so && !json_is_null(so)) {
    if (!json_is_object(so) || get_bool(so, "include_usage", 0, &include_usage) < 0) {
      FAIL(400, "stream_options", "'stream_options' must be an object with a boolean 'include_usage'");
    }
  }
  /* echo (completions): the reply starts with the prompt; with max_tokens 0
   * it is the prompt alone (vLLM's CompletionRequest.to_sampling_params:
   * echo_without_generation runs one token the reply does not show) */
  int echo = 0;
  if (!chat && get_bool(j, "echo", 0, &echo) < 0) FAIL(400, "echo", "'echo' must be a boolean");
  json_int_t max_tokens = -1;
  const char *mt_keys[2] = {"max_completion_tokens", "max_tokens"};
  for (int k = 0; k < 2; k++) {
    json_t *mt = json_object_get(j, mt_keys[k]);
    if (!mt || json_is_null(mt)) continue;
    if (!json_is_integer(mt) || json_integer_value(mt) < (echo ? 0 : 1)) {
      FAIL(400, mt_keys[k], "'%s' must be an integer >= %d", mt_keys[k], echo ? 0 : 1);
    }
    if (max_tokens < 0) max_tokens = json_integer_value(mt);
  }
  json_t *n = json_object_get(j, "n");
  json_int_t nval = 1;
  if (n && !json_is_null(n)) {
    if (!json_is_integer(n) || json_integer_value(n) < 1 || json_integer_value(n) > MAX_N) {
      FAIL(400, "n", "'n' must be an integer in 1..%d", MAX_N);
    }
    nval = json_integer_value(n);
  }
  long rec = -1;
  json_t *tid = json_object_get(j, "eldr_trace_id");
  /* without a trace the field is ignored, as vLLM ignores a field it does
   * not know (OpenAIBaseModel: extra="allow", entrypoints/openai/protocol.py):
   * `eldr bench load` sends it to any endpoint */
  if (tid && !json_is_null(tid) && w->trace) {
    if (!json_is_string(tid)) {
      FAIL(400, "eldr_trace_id", "'eldr_trace_id' must be a string");
    }
    rec = eldr__w_trace_find(w, json_string_value(tid));
    if (rec < 0) {
      FAIL(404, "eldr_trace_id", "unknown eldr_trace_id '%s' (not in the worker's trace)",
                 json_string_value(tid));
    }
  }
  int remote_decode = 0, remote_prefill = 0;
  json_t *kvp = json_object_get(j, "kv_transfer_params");
  if (kvp && !json_is_null(kvp)) {
    if (!json_is_object(kvp) || get_bool(kvp, "do_remote_decode", 0, &remote_decode) < 0 ||
        get_bool(kvp, "do_remote_prefill", 0, &remote_prefill) < 0) {
      FAIL(400, "kv_transfer_params", "'kv_transfer_params' must be an object with boolean do_remote_decode / do_remote_prefill");
    }
    if (remote_decode && remote_prefill) {
      FAIL(400, "kv_transfer_params", "do_remote_decode and do_remote_prefill cannot both be true");
    }
    if (remote_decode && w->role == ELDR_WORKER_DECODE) {
      FAIL(400, "kv_transfer_params", "do_remote_decode: this worker has role decode and does not produce KV for others");
    }
    if (remote_prefill) {
      if (w->role == ELDR_WORKER_PREFILL) {
        FAIL(400, "kv_transfer_params", "do_remote_prefill: this worker has role prefill and does not pull KV");
      }
      json_t *ids = json_object_get(kvp, "remote_block_ids");
      json_t *eng = json_object_get(kvp, "remote_engine_id");
      json_t *host = json_object_get(kvp, "remote_host");
      json_t *port = json_object_get(kvp, "remote_port");
      json_t *rrid = json_object_get(kvp, "remote_request_id");
      int ok = json_is_array(ids) && json_array_size(ids) <= ELDR__PULL_MAX_IDS &&
               json_is_string(eng) && json_string_length(eng) <= ELDR__PULL_MAX_ID &&
               json_is_string(host) && json_string_length(host) > 0 &&
               json_string_length(host) < sizeof o->remote_host && json_is_string(rrid) &&
               json_string_length(rrid) > 0 && json_string_length(rrid) <= ELDR__PULL_MAX_ID &&
               json_is_integer(port) && json_integer_value(port) > 0 &&
               json_integer_value(port) < 65536;
      size_t i;
      json_t *v;
      if (ok) json_array_foreach(ids, i, v) if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                                                json_integer_value(v) > INT32_MAX) ok = 0;
      if (!ok) {
        FAIL(400, "kv_transfer_params", "do_remote_prefill needs remote_engine_id (string), remote_request_id "
                   "(string of 1..%d bytes), remote_block_ids (array of at most %d non-negative integers), "
                   "remote_host (string) and remote_port (1..65535)", ELDR__PULL_MAX_ID, ELDR__PULL_MAX_IDS);
      }
      json_t *pb = json_pack("{s:O,s:O,s:O}", "remote_request_id", rrid, "remote_engine_id", eng,
                             "remote_block_ids", ids);
      o->pull_body = pb ? json_dumps(pb, JSON_COMPACT) : NULL;
      json_decref(pb);
      if (!o->pull_body) FAIL(500, NULL, "out of memory");
      snprintf(o->remote_host, sizeof o->remote_host, "%s", json_string_value(host));
      o->remote_port = (uint16_t)json_integer_value(port);
    }
  }
  if (nval > 1 && (remote_decode || remote_prefill)) {
    FAIL(400, "n", "'n' > 1 with a PD handoff (kv_transfer_params) is not supported by the emulator");
  }

  o->prompt = prompt;
  o->plen = plen;
  o->stream = stream;
  o->include_usage = include_usage;
  o->remote_decode = remote_decode;
  o->remote_prefill = remote_prefill;
  o->max_tokens = max_tokens;
  o->echo = echo;
  o->rec = rec;
  o->n = (uint32_t)nval;
  prompt = NULL;
done:
  if (status) {
    free(o->pull_body);
    o->pull_body = NULL;
  }
  free(prompt);
  json_decref(j);
  return status;
}
#undef FAIL

int eldr__worker_check_request(const eldr_worker *w, const char *body, size_t len, int chat,
                               char *err, size_t errcap) {
  if (w->sglang) return eldr__sgl_check_request(w, body, len, chat, err, errcap);
  if (chat == SGL_API_GENERATE) {
    snprintf(err, errcap, "/generate is SGLang's native API: served by --engine sglang only");
    return 404;
  }
  preq pq;
  const char *param = NULL;
  int st = eldr__w_parse_body(w, body, len, chat, &pq, err, errcap, &param);
  free(pq.prompt);
  free(pq.pull_body);
  return st;
}
