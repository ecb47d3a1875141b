/* wreply.c — the emulated worker's replies: JSON bodies and OpenAI-style
 * errors, SSE streaming (one chunk per choice per token), the finished reply
 * (choices, usage, kv_transfer_params, routed_experts), the per-request
 * vLLM metrics, and the /metrics, /v1/models and side-channel endpoints. */
#include "worker/worker_impl.h"

#include "eldr/reply_compact.h"

/* ------------------------------------------------------------ HTTP replies */

static void add_json_headers(struct evhttp_request *req, const char *ctype) {
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", ctype);
}

void eldr__w_send_json(struct evhttp_request *req, int code, const char *reason, json_t *body) {
  char *s = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  struct evbuffer *b = evbuffer_new();
  if (s && b) evbuffer_add(b, s, strlen(s));
  add_json_headers(req, "application/json");
  evhttp_send_reply(req, code, reason, b);
  if (b) evbuffer_free(b);
  free(s);
}

/* OpenAI-style error body, as the router sends:
 * {"error": {"message", "type", "param", "code"}}. */
void eldr__w_send_error(struct evhttp_request *req, int code, const char *param, const char *fmt,
                       ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* the same types as the router's errors (OpenAI's names) */
  const char *type = code >= 500 ? "internal_error" : "invalid_request_error";
  const char *reason = code == 404   ? "Not Found"
                       : code == 405 ? "Method Not Allowed"
                       : code == 413 ? "Payload Too Large"
                       : code == 503 ? "Service Unavailable"
                       : code >= 500 ? "Internal Server Error"
                                     : "Bad Request";
  json_t *e = json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", msg, "type", type, "param",
                        param ? json_string(param) : json_null(), "code", code);
  eldr__w_send_json(req, code, reason, e ? e : json_object());
}

/* ---------------------------------------------------------------- replies */

/* Generated token i of choice c: " <word>" from the corpus (consecutive words
 * of real text, starting at a place derived from the request), else " tok<i>".
 * Raw UTF-8, NUL-terminated; at most ELDR__CORPUS_MAX_WORD + 2 bytes. */
void eldr__w_token_text(const wreq *r, uint32_t c, uint32_t i, char *buf, size_t cap) {
  const eldr__corpus *cp = r->w->corpus;
  if (i == 0 && r->sg.first_tok[0]) { /* SGLang's decode: token 0 is the prefill's */
    snprintf(buf, cap, "%s", r->sg.first_tok);
    return;
  }
  if (!cp) {
    snprintf(buf, cap, " tok%u", i);
    return;
  }
  size_t len;
  const char *wd = eldr__corpus_word(cp, r->text_seed + (uint64_t)c * 7919u + i, &len);
  snprintf(buf, cap, " %.*s", (int)len, wd);
}

/* JSON string body of s (corpus words hold no control bytes; escape '"', '\'). */
static void json_esc(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (; *s && o + 3 < cap; s++) {
    if (*s == '"' || *s == '\\') out[o++] = '\\';
    out[o++] = *s;
  }
  out[o] = 0;
}

static const char *finish_reason(const wreq *r) { return r->capped ? "length" : "stop"; }

static void sse_send(wreq *r, const char *data, size_t len) {
  struct evbuffer *b = evbuffer_new();
  if (!b) return;
  evbuffer_add(b, "data: ", 6);
  evbuffer_add(b, data, len);
  evbuffer_add(b, "\n\n", 2);
  evhttp_send_reply_chunk(r->http, b);
  evbuffer_free(b);
}

/* A stream's HTTP head goes out as soon as the request is accepted, before
 * it is queued, prefilled or its KV pulled: vLLM's create_completion returns
 * its StreamingResponse without waiting for the engine
 * (vllm/entrypoints/openai/completion/api_router.py, create_completion;
 * completion/serving.py returns completion_stream_generator unstarted),
 * Starlette's StreamingResponse.stream_response sends http.response.start
 * before it iterates the generator, and uvicorn writes the head on that
 * message. So a queued stream shows its 200 long before its first token. */
void eldr__w_stream_head(wreq *r) {
  if (r->started || !r->http) return;
  struct evkeyvalq *h = evhttp_request_get_output_headers(r->http);
  evhttp_add_header(h, "Content-Type", "text/event-stream");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  evhttp_send_reply_start(r->http, 200, "OK");
  r->started = 1;
}

/* The events that open a stream, with its first token: a chat stream's
 * role deltas (vLLM's chat_completion_stream_generator sends them on its
 * first iteration, the engine's first output). */
void eldr__w_stream_start(wreq *r) {
  if (r->opened || !r->http) return;
  eldr__w_stream_head(r);
  r->opened = 1;
  if (r->chat) {
    for (uint32_t c = 0; c < r->n_choices; c++) {
      char buf[1024];
      int n = snprintf(buf, sizeof buf,
                       "%s%u,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                       "\"finish_reason\":null}]}",
                       r->chunk_head, c);
      if (n > 0 && (size_t)n < sizeof buf) sse_send(r, buf, (size_t)n);
    }
  }
}

/* A stream that fails after its head: an error event in the body a
 * failed request gets (eldr__w_send_error's), then [DONE], as vLLM's stream
 * generators end on an exception (completion_stream_generator: the
 * streaming error response, then "data: [DONE]"). */
void eldr__w_stream_error(wreq *r, int code, const char *msg) {
  json_t *e = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type",
                        code >= 500 ? "internal_error" : "invalid_request_error", "param", "code", code);
  char *s = e ? json_dumps(e, JSON_COMPACT) : NULL;
  if (s) sse_send(r, s, strlen(s));
  free(s);
  json_decref(e);
  sse_send(r, "[DONE]", 6);
  evhttp_send_reply_end(r->http);
}

/* A decode leg's rows as a vLLM decode instance returns them (docs/vllm.md):
 * the prompt's (which it could not compute: the router splices them in a
 * whole reply) then g generated tokens' (malloc'd into *gen, may be NULL
 * for g 0). 0, or -1 (no memory). */
static int decode_rows(const wreq *r, uint32_t g, uint16_t **gen) {
  const size_t LK = r->w->LK;
  *gen = g ? malloc((size_t)g * LK * sizeof **gen) : NULL;
  if (g && !*gen) return -1;
  for (uint32_t i = 0; i < g; i++)
    memcpy(*gen + (size_t)i * LK, r->dsel + (size_t)(i % r->n_dsel) * LK, LK * sizeof **gen);
  return 0;
}

/* The last chunk of a stream with --routed-experts-stream final: the chunk
 * built as a tree, with the whole sequence's rows (P + i, npy) in its
 * choice, as vLLM's /inference/v1/generate final chunk. 0, or -1. */
static int stream_last_with_rows(wreq *r, uint32_t c, uint32_t i, const char *tok_raw, const char *fin) {
  const eldr_worker *w = r->w;
  json_t *ch = r->chat ? json_pack("{s:I,s:{s:s},s:n,s:s}", "index", (json_int_t)c, "delta", "content", tok_raw,
                                   "logprobs", "finish_reason", fin)
                       : json_pack("{s:I,s:s,s:n,s:s,s:n}", "index", (json_int_t)c, "text", tok_raw, "logprobs",
                                   "finish_reason", fin, "stop_reason");
  json_t *body = ch ? json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", r->rid, "object",
                                r->chat ? "chat.completion.chunk" : "text_completion", "created",
                                (json_int_t)w->created, "model", w->served, "choices", ch)
                    : NULL;
  uint16_t *gen = NULL;
  int rc = -1;
  if (body && decode_rows(r, i, &gen) == 0 &&
      eldr_reply_experts_emit_layers(NULL, ch, ELDR_RE_LAYOUT_NPY, r->psel, r->n_prompt, gen, i, &w->shape,
                                     w->re_ids, w->re_hidden) == 0) {
    char *s = json_dumps(body, JSON_COMPACT);
    if (s) {
      sse_send(r, s, strlen(s));
      rc = 0;
    }
    free(s);
  }
  free(gen);
  json_decref(body);
  return rc;
}

/* The first chunk of an echo (completions): the prompt's text and the
 * first token's (the prompt alone with max_tokens 0), built as a tree: the
 * prompt has any length. */
static void stream_echo(wreq *r, uint32_t c, const char *tok_raw, int last) {
  const size_t el = strlen(r->echo), tl = r->echo_only ? 0 : strlen(tok_raw);
  char *text = malloc(el + tl + 1);
  if (!text) return;
  memcpy(text, r->echo, el);
  memcpy(text + el, tok_raw, tl);
  text[el + tl] = 0;
  json_t *ch = json_pack("{s:I,s:s,s:n,s:o,s:n}", "index", (json_int_t)c, "text", text, "logprobs",
                         "finish_reason", last ? json_string(finish_reason(r)) : json_null(), "stop_reason");
  json_t *body = ch ? json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", r->rid, "object", "text_completion", "created",
                                (json_int_t)r->w->created, "model", r->w->served, "choices", ch)
                    : NULL;
  char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
  if (s) sse_send(r, s, strlen(s));
  free(s);
  json_decref(body);
  free(text);
}

/* One streamed token chunk of choice c (last: carries finish_reason). */
void eldr__w_stream_token(wreq *r, uint32_t c, uint32_t i, int last) {
  char raw[64], tok[128], buf[1024], fin[32];
  eldr__w_token_text(r, c, i, raw, sizeof raw);
  if (r->echo && i == 0) { /* vLLM's first delta of an echo: the prompt, then the token */
    stream_echo(r, c, raw, last);
    return;
  }
  if (last && r->w->re_stream && r->remote_prefill && r->psel && r->dsel && r->n_dsel &&
      stream_last_with_rows(r, c, i, raw, finish_reason(r)) == 0)
    return;
  json_esc(raw, tok, sizeof tok);
  if (last) snprintf(fin, sizeof fin, "\"%s\"", finish_reason(r));
  else strcpy(fin, "null");
  int n;
  if (r->chat)
    n = snprintf(buf, sizeof buf,
                 "%s%u,\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":%s}]}",
                 r->chunk_head, c, tok, fin);
  else
    n = snprintf(buf, sizeof buf,
                 "%s%u,\"text\":\"%s\",\"logprobs\":null,\"finish_reason\":%s,\"stop_reason\":null}]}",
                 r->chunk_head, c, tok, fin);
  if (n > 0 && (size_t)n < sizeof buf) sse_send(r, buf, (size_t)n);
}

/* vLLM's UsageInfo: prompt_tokens_details is null unless the server runs
 * with --enable-prompt-tokens-details (then {"cached_tokens": N}). */
static json_t *usage_json(const wreq *r) {
  json_int_t out = (json_int_t)r->emitted * r->n_choices;
  json_t *det = r->w->prompt_details ? json_pack("{s:I}", "cached_tokens", (json_int_t)r->cached)
                                     : json_null();
  return json_pack("{s:I,s:I,s:I,s:o}", "prompt_tokens", (json_int_t)r->n_prompt,
                   "completion_tokens", out, "total_tokens", (json_int_t)r->n_prompt + out,
                   "prompt_tokens_details", det);
}

static void stream_end(wreq *r) {
  if (r->include_usage) {
    json_t *u = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[],s:o}", "id", r->rid, "object",
                          r->chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)r->w->created, "model", r->w->served, "eldr_engine_id",
                          r->w->engine_id, "choices", "usage", usage_json(r));
    char *s = u ? json_dumps(u, JSON_COMPACT) : NULL;
    if (s) sse_send(r, s, strlen(s));
    free(s);
    json_decref(u);
  }
  sse_send(r, "[DONE]", 6);
  evhttp_send_reply_end(r->http);
}

static json_t *kv_params_json(const wreq *r) {
  json_t *ids = json_array();
  for (size_t i = 0; i < r->n_blocks; i++) json_array_append_new(ids, json_integer(r->blocks[i]));
  /* NixlConnectorScheduler.request_finished's fields */
  return json_pack("{s:b,s:b,s:o,s:s,s:s,s:s,s:i,s:i}", "do_remote_prefill", 1, "do_remote_decode", 0,
                   "remote_block_ids", ids, "remote_engine_id", r->w->engine_id, "remote_request_id",
                   r->rid, "remote_host", r->w->host, "remote_port", (int)r->w->port, "tp_size", 1);
}

/* Per-request metrics at its end: finish reason, TPOT, e2e (vLLM records
 * them in IterationStats when a request finishes). */
static void observe_finish(wreq *r) {
  eldr_worker *w = r->w;
  double now = eldr_clock_now();
  w->m.finished[r->capped ? ELDR__FIN_LENGTH : ELDR__FIN_STOP]++;
  if (r->emitted > 1 && r->t_first > 0)
    eldr__hist_observe(&w->m.tpot, (now - r->t_first) / (double)(r->emitted - 1));
  eldr__hist_observe(&w->m.e2e, now - r->t_arrival);
}

void eldr__w_observe_first(wreq *r) {
  r->t_first = eldr_clock_now();
  eldr__hist_observe(&r->w->m.ttft, r->t_first - r->t_arrival);
}

/* The text of choice c (raw UTF-8, malloc'd), or NULL: with echo the
 * prompt first (vLLM's completion serving: prompt_text + output.text, or
 * the prompt alone for max_tokens 0). */
static char *choice_text(const wreq *r, uint32_t c) {
  const size_t el = r->echo ? strlen(r->echo) : 0;
  size_t cap = el + (size_t)r->emitted * (ELDR__CORPUS_MAX_WORD + 2) + 16, off = el;
  char *text = malloc(cap);
  if (!text) return NULL;
  memcpy(text, r->echo ? r->echo : "", el);
  text[el] = 0;
  for (uint32_t i = 0; i < r->emitted && !r->echo_only; i++) {
    char tok[64];
    eldr__w_token_text(r, c, i, tok, sizeof tok);
    size_t l = strlen(tok);
    if (off + l + 1 > cap) break;
    memcpy(text + off, tok, l + 1);
    off += l;
  }
  return text;
}

/* Complete, non-streamed reply (or the tail of a stream) for a finished request. */
void eldr__w_reply_done(wreq *r) {
  eldr_worker *w = r->w;
  w->st.requests_done++;
  observe_finish(r);
  if (r->grp) { /* an SGLang item: its group answers */
    eldr__sgl_item_done(r);
    return;
  }
  if (!r->http) return;
  eldr__w_detach(r);
  if (r->stream) {
    eldr__w_stream_start(r);
    stream_end(r);
    r->http = NULL;
    return;
  }
  json_t *choices = json_array();
  for (uint32_t c = 0; choices && c < r->n_choices; c++) {
    char *text = choice_text(r, c);
    json_t *choice = NULL;
    if (text && r->chat)
      choice = json_pack("{s:I,s:{s:s,s:s},s:n,s:s,s:n}", "index", (json_int_t)c, "message", "role",
                         "assistant", "content", text, "logprobs", "finish_reason",
                         finish_reason(r), "stop_reason");
    else if (text)
      choice = json_pack("{s:I,s:s,s:n,s:s,s:n}", "index", (json_int_t)c, "text", text, "logprobs",
                         "finish_reason", finish_reason(r), "stop_reason");
    free(text);
    if (!choice || json_array_append_new(choices, choice)) {
      json_decref(choices);
      choices = NULL;
    }
  }
  json_t *body = choices ? json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o}", "id", r->rid, "object",
                                     r->chat ? "chat.completion" : "text_completion", "created",
                                     (json_int_t)w->created, "model", w->served, "eldr_engine_id",
                                     w->engine_id, "choices", choices, "usage", usage_json(r))
                         : NULL;
  if (body && r->remote_decode && w->return_re && r->psel) {
    /* vLLM since PR #39917 fills the prefix-cached tokens' rows from its
     * per-block routing cache: every prompt token has a row; before it (and
     * with --routed-experts-prompt computed) only the computed tokens do.
     * The one generated token was never forwarded: no generated rows. */
    uint32_t skip = w->re_computed_only ? r->cached : 0;
    if (w->re_layout != ELDR_RE_LAYOUT_COMPACT) /* compact: the counts go into kv_transfer_params (below) */
      (void)eldr_reply_experts_emit_layers(body, json_array_get(choices, 0), w->re_layout,
                                           r->psel + (size_t)skip * w->LK, r->n_prompt - skip, NULL, 0, &w->shape,
                                           w->re_ids, w->re_hidden);
  }
  if (body && r->remote_prefill && w->re_decode && r->psel && r->dsel && r->n_dsel) {
    /* a vLLM decode instance (docs/vllm.md): rows up to the last forwarded
     * token, P + G - 1: the prompt's (which vLLM could not compute there:
     * the router's splice replaces them) and the generated tokens' */
    uint16_t *gen;
    uint32_t g = r->emitted ? r->emitted - 1 : 0;
    if (decode_rows(r, g, &gen) == 0) /* a decode leg's rows: npy when the prefill sends counts */
      (void)eldr_reply_experts_emit_layers(body, json_array_get(choices, 0),
                                           w->re_layout == ELDR_RE_LAYOUT_COMPACT ? ELDR_RE_LAYOUT_NPY : w->re_layout,
                                           r->psel, r->n_prompt, gen, g, &w->shape, w->re_ids, w->re_hidden);
    free(gen);
  }
  if (body && r->remote_decode) {
    json_t *kv = kv_params_json(r);
    /* the compact form: the prompt's counts next to the handoff, computed here
     * (contrib/vllm-eldr-counts does this inside vLLM) */
    if (kv && w->return_re && r->psel && w->re_layout == ELDR_RE_LAYOUT_COMPACT) {
      uint32_t skip = w->re_computed_only ? r->cached : 0;
      (void)eldr_compact_emit(kv, r->psel + (size_t)skip * w->LK, r->n_prompt - skip, &w->shape, w->re_ids, skip);
    }
    json_object_set_new(body, "kv_transfer_params", kv);
  }
  if (!body) {
    eldr__w_send_error(r->http, 500, NULL, "cannot build the reply");
  } else {
    eldr__w_send_json(r->http, 200, "OK", body);
  }
  r->http = NULL;
}

/* --------------------------------------------------------------- endpoints */

void eldr__w_handle_metrics(eldr_worker *w, struct evhttp_request *req) {
  eldr_worker_stats s;
  eldr_worker_stats_get(w, &s);
  struct evbuffer *b = evbuffer_new();
  if (!b || eldr__wmetrics_render(b, w->served_json, &s, &w->m, w->scale) < 0) {
    if (b) evbuffer_free(b);
    eldr__w_send_error(req, 500, NULL, "out of memory");
    return;
  }
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", "text/plain; version=0.0.4");
  evhttp_send_reply(req, 200, "OK", b);
  evbuffer_free(b);
}

/* The side channel (sidechan.h): a decode worker reads a held request's
 * blocks; they are freed here, as NIXL's completion notification frees them
 * on a vLLM prefill. */
void eldr__w_handle_pull(eldr_worker *w, struct evhttp_request *req) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t len = evbuffer_get_length(in);
  if (len > ELDR__PULL_MAX_BODY) {
    eldr__w_send_error(req, 413, NULL, "pull body of %zu bytes exceeds %d", len, ELDR__PULL_MAX_BODY);
    return;
  }
  eldr__pull *p = malloc(sizeof *p);
  char *body = malloc(len + 1);
  char err[200];
  if (!p || !body) {
    eldr__w_send_error(req, 500, NULL, "out of memory");
  } else if (evbuffer_copyout(in, body, len), eldr__pull_parse(body, len, p, err, sizeof err) < 0) {
    eldr__w_send_error(req, 400, NULL, "%s", err);
  } else if (strcmp(p->engine, w->engine_id)) {
    eldr__w_send_error(req, 404, NULL, "remote_engine_id '%s' is not this engine ('%s')", p->engine, w->engine_id);
  } else {
    int rc = eldr__kvhold_take(w->hold, p);
    if (rc == 0) {
      w->st.kv_pulls_served++;
      eldr__w_prefill_try(w); /* blocks were freed */
      eldr__w_send_json(req, 200, "OK", json_pack("{s:s,s:I}", "remote_request_id", p->rid, "blocks",
                                          (json_int_t)p->n_ids));
    } else if (rc == 404) {
      eldr__w_send_error(req, 404, NULL, "no KV blocks held for request %s (never prefilled here, already "
                 "pulled, or freed after the abort timeout)", p->rid);
    } else if (rc == 409) {
      eldr__w_send_error(req, 409, NULL, "remote_block_ids are not the blocks of request %s", p->rid);
    } else {
      eldr__w_send_error(req, 500, NULL, "out of memory");
    }
  }
  free(body);
  free(p);
}

void eldr__w_handle_models(eldr_worker *w, struct evhttp_request *req) {
  json_t *m = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:s,s:I}]}", "object", "list", "data", "id",
                        w->served, "object", "model", "created", (json_int_t)w->created,
                        "owned_by", "eldr", "root", w->model, "max_model_len",
                        (json_int_t)(eldr__kv_total(w->pkv) * ELDR_BLOCK_TOKENS));
  eldr__w_send_json(req, 200, "OK", m ? m : json_object());
}

