/* sgl_req.c — the emulated SGLang engine's HTTP requests (sgl.h): an
 * OpenAI-format body, or a native /generate body (GenerateReqInput), read
 * as SGLang's serving layer reads it (a batch of
 * prompts, n samples, the bootstrap fields normalised as
 * GenerateReqInput._normalize_bootstrap_params does), its B x n items, and
 * the replies in SGLang's format (serving_completions.py / serving_chat.py:
 * choices with matched_stop, usage summed per prompt, "sglext" with the
 * first item's routed_experts, errors as ErrorResponse). */
#include "worker/worker_impl.h"

#include <errno.h>
#include <event2/bufferevent.h>

#include "eldr/reply_sglang.h"

/* ------------------------------------------------------------ the request */

typedef struct sparsed {
  char **prompts;           /* NULL entries: a prompt given as token ids */
  size_t *plens;
  uint32_t **pids;          /* /generate's input_ids: per prompt, else NULL */
  size_t *pnids;
  int as_list;              /* /generate: the reply is a list (a batch, or n > 1) */
  int return_lp;            /* /generate: return_logprob (true, or true for any entry) */
  uint32_t nprompts, n;
  int stream, include_usage, return_re;
  json_int_t max_tokens;
  long rec;
  int has_boot;
  uint64_t rooms[SGL_MAX_ITEMS];
  char hosts[SGL_MAX_ITEMS][256];
  int ports[SGL_MAX_ITEMS]; /* -1: null */
  char rid[80];
} sparsed;

static void sparsed_free(sparsed *p) {
  for (uint32_t i = 0; p->prompts && i < p->nprompts; i++) free(p->prompts[i]);
  for (uint32_t i = 0; p->pids && i < p->nprompts; i++) free(p->pids[i]);
  free(p->prompts);
  free(p->plens);
  free(p->pids);
  free(p->pnids);
}

/* SGLang's ErrorResponse (entrypoints/openai/protocol.py): a top-level object. */
static void sgl_error(struct evhttp_request *req, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sgl_error(struct evhttp_request *req, int code, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *type = code == 404 ? "NotFoundError" : code >= 500 ? "InternalServerError" : "BadRequestError";
  json_t *e = json_pack("{s:s,s:s,s:s,s:n,s:i}", "object", "error", "message", msg, "type", type, "param", "code", code);
  eldr__w_send_json(req, code, code >= 500 ? "Internal Server Error" : code == 404 ? "Not Found" : "Bad Request",
                    e ? e : json_object());
}

static int get_bool_f(json_t *o, const char *key, int *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return -1;
  *out = json_is_true(v);
  return 0;
}

/* A bootstrap field of item i of num (prompts x n): a scalar applies to all
 * (a room r gives r + i), a list is repeated n times (entry i). */
static json_t *nth(json_t *v, uint32_t i, uint32_t n, uint32_t *listlen) {
  (void)n;
  *listlen = 0;
  if (!json_is_array(v)) return v;
  *listlen = (uint32_t)json_array_size(v);
  return *listlen ? json_array_get(v, i % *listlen) : NULL;
}

/* 0, or an HTTP status with the message in err. */
static int sgl_parse(const eldr_worker *w, const char *body, size_t blen, int chat, sparsed *o, char *err,
                     size_t errcap) {
  memset(o, 0, sizeof *o);
  o->max_tokens = -1;
  o->rec = -1;
  o->n = 1;
  json_error_t je;
  json_t *j = json_loadb(body, blen, 0, &je);
  int st = 400;
#define BAD(...)                                                                                                       \
  do {                                                                                                               \
    snprintf(err, errcap, __VA_ARGS__);                                                                              \
    goto fail;                                                                                                       \
  } while (0)
  if (!j) BAD("request body is not valid JSON: %s", je.text);
  if (!json_is_object(j)) BAD("request body must be a JSON object");
  const int gen = chat == SGL_API_GENERATE;
  json_t *sp = NULL; /* /generate: the (first) sampling_params object */
  if (gen) {
    /* GenerateReqInput (io_struct.py): text or input_ids, one prompt or a list */
    json_t *t = json_object_get(j, "text"), *ids = json_object_get(j, "input_ids");
    if (json_is_null(t)) t = NULL;
    if (json_is_null(ids)) ids = NULL;
    if (!t == !ids) BAD("Either text, input_ids or input_embeds should be provided.");
    json_t *list = t ? (json_is_array(t) ? t : NULL) : (json_is_array(json_array_get(ids, 0)) ? ids : NULL);
    size_t np = list ? json_array_size(list) : 1;
    if (!np) BAD("'%s' must not be an empty list", t ? "text" : "input_ids");
    if (np > SGL_MAX_ITEMS) BAD("a batch of %zu prompts; the emulator takes at most %d", np, SGL_MAX_ITEMS);
    o->as_list = list != NULL;
    o->prompts = calloc(np, sizeof *o->prompts);
    o->plens = calloc(np, sizeof *o->plens);
    o->pids = calloc(np, sizeof *o->pids);
    o->pnids = calloc(np, sizeof *o->pnids);
    if (!o->prompts || !o->plens || !o->pids || !o->pnids) {
      st = 500;
      BAD("out of memory");
    }
    for (size_t i = 0; i < np; i++) {
      o->nprompts++; /* counted first: sparsed_free frees what entry i holds when it fails */
      json_t *e = list ? json_array_get(list, i) : t ? t : ids;
      if (t) {
        if (!json_is_string(e)) BAD("'text' must be a string or a list of strings");
        o->plens[i] = json_string_length(e);
        if (!(o->prompts[i] = malloc(o->plens[i] + 1))) {
          st = 500;
          BAD("out of memory");
        }
        memcpy(o->prompts[i], json_string_value(e), o->plens[i] + 1);
        continue;
      }
      size_t n = json_array_size(e);
      if (!json_is_array(e) || !n) BAD("'input_ids' must be a non-empty list of token ids, or a list of such lists");
      if (!(o->pids[i] = malloc(n * sizeof **o->pids))) {
        st = 500;
        BAD("out of memory");
      }
      for (size_t k = 0; k < n; k++) {
        json_t *x = json_array_get(e, k);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (json_int_t)UINT32_MAX)
          BAD("'input_ids' must hold token ids (integers in 0..2^32-1)");
        o->pids[i][k] = (uint32_t)json_integer_value(x);
      }
      o->pnids[i] = n;
    }
    json_t *spv = json_object_get(j, "sampling_params");
    if (spv && !json_is_null(spv)) {
      if (json_is_array(spv) && json_array_size(spv) != np)
        BAD("'sampling_params' has %zu entries for %zu prompts", json_array_size(spv), np);
      sp = json_is_array(spv) ? json_array_get(spv, 0) : spv;
      if (!json_is_object(sp)) BAD("'sampling_params' must be an object or a list of objects");
    }
    json_t *mt = sp ? json_object_get(sp, "max_new_tokens") : NULL;
    o->max_tokens = 128; /* SamplingParams' default max_new_tokens */
    if (mt && !json_is_null(mt)) {
      if (!json_is_integer(mt) || json_integer_value(mt) < 1)
        BAD("'sampling_params.max_new_tokens' must be a positive integer (0 is not supported by the emulator)");
      o->max_tokens = json_integer_value(mt);
    }
  } else if (chat) {
    o->prompts = calloc(1, sizeof *o->prompts);
    o->plens = calloc(1, sizeof *o->plens);
    if (!o->prompts || !o->plens) {
      st = 500;
      BAD("out of memory");
    }
    /* the vLLM parser's chat prompt ("role: content\n" per message) */
    preq pq;
    const char *param = NULL;
    json_t *msgs = json_object_get(j, "messages");
    if (!msgs) BAD("'messages' is required for /v1/chat/completions");
    json_t *m = json_pack("{s:O}", "messages", msgs);
    char *mb = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    if (!mb) {
      st = 500;
      BAD("out of memory");
    }
    int s2 = eldr__w_parse_body(w, mb, strlen(mb), 1, &pq, err, errcap, &param);
    free(mb);
    if (s2) {
      st = s2;
      goto fail;
    }
    free(pq.pull_body);
    o->prompts[0] = pq.prompt;
    o->plens[0] = pq.plen;
    o->nprompts = 1;
  } else {
    json_t *p = json_object_get(j, "prompt");
    size_t np = json_is_array(p) ? json_array_size(p) : 1;
    if (json_is_array(p) && (!np || !json_is_string(json_array_get(p, 0))))
      BAD("'prompt' must be a string or an array of strings (token-id prompts are not supported by the emulator)");
    if (!json_is_array(p) && !json_is_string(p)) BAD("'prompt' must be a string or an array of strings");
    if (np > SGL_MAX_ITEMS) BAD("a batch of %zu prompts; the emulator takes at most %d", np, SGL_MAX_ITEMS);
    o->prompts = calloc(np, sizeof *o->prompts);
    o->plens = calloc(np, sizeof *o->plens);
    if (!o->prompts || !o->plens) {
      st = 500;
      BAD("out of memory");
    }
    for (size_t i = 0; i < np; i++) {
      json_t *s = json_is_array(p) ? json_array_get(p, i) : p;
      if (!json_is_string(s)) BAD("'prompt[%zu]' must be a string", i);
      o->plens[i] = json_string_length(s);
      if (!(o->prompts[i] = malloc(o->plens[i] + 1))) {
        st = 500;
        BAD("out of memory");
      }
      memcpy(o->prompts[i], json_string_value(s), o->plens[i] + 1);
      o->nprompts++;
    }
  }
  if (get_bool_f(j, "stream", &o->stream) < 0) BAD("'stream' must be a boolean");
  if (gen) { /* /generate has no OpenAI fields: sampling_params.n, rid */
    if (get_bool_f(j, "return_routed_experts", &o->return_re) < 0) BAD("'return_routed_experts' must be a boolean");
    json_t *lp = json_object_get(j, "return_logprob");
    if (json_is_array(lp)) {
      if (json_array_size(lp) != o->nprompts) BAD("'return_logprob' has %zu entries for %u prompts", json_array_size(lp), o->nprompts);
      for (size_t i = 0; i < json_array_size(lp); i++) {
        if (!json_is_boolean(json_array_get(lp, i))) BAD("'return_logprob' must be a boolean or a list of them");
        o->return_lp |= json_is_true(json_array_get(lp, i));
      }
    } else if (get_bool_f(j, "return_logprob", &o->return_lp) < 0) {
      BAD("'return_logprob' must be a boolean or a list of them");
    }
    json_t *nv = sp ? json_object_get(sp, "n") : NULL;
    if (nv && !json_is_null(nv)) {
      if (!json_is_integer(nv) || json_integer_value(nv) < 1 || json_integer_value(nv) > MAX_N)
        BAD("'sampling_params.n' must be an integer in 1..%d", MAX_N);
      o->n = (uint32_t)json_integer_value(nv);
      if (o->n > 1) o->as_list = 1; /* parallel sampling makes a batch */
    }
    goto common;
  }
  json_t *so = json_object_get(j, "stream_options");
  if (so && !json_is_null(so) && (!json_is_object(so) || get_bool_f(so, "include_usage", &o->include_usage) < 0))
    BAD("'stream_options' must be an object with a boolean 'include_usage'");
  if (get_bool_f(j, "return_routed_experts", &o->return_re) < 0) BAD("'return_routed_experts' must be a boolean");
  int echo = 0;
  if (get_bool_f(j, "echo", &echo) < 0 || echo) BAD("'echo' is not supported by the emulator's SGLang engine");
  const char *mt_keys[2] = {"max_completion_tokens", "max_tokens"};
  for (int k = 0; k < 2; k++) {
    json_t *mt = json_object_get(j, mt_keys[k]);
    if (!mt || json_is_null(mt)) continue;
    if (!json_is_integer(mt) || json_integer_value(mt) < 1) BAD("'%s' must be a positive integer", mt_keys[k]);
    if (o->max_tokens < 0) o->max_tokens = json_integer_value(mt);
  }
  json_t *n = json_object_get(j, "n");
  if (n && !json_is_null(n)) {
    if (!json_is_integer(n) || json_integer_value(n) < 1 || json_integer_value(n) > MAX_N)
      BAD("'n' must be an integer in 1..%d", MAX_N);
    o->n = (uint32_t)json_integer_value(n);
  }
common:;
  uint32_t num = o->nprompts * o->n;
  if (num > SGL_MAX_ITEMS) BAD("%u prompts x n %u = %u items; the emulator takes at most %d", o->nprompts, o->n, num, SGL_MAX_ITEMS);
  json_t *tid = json_object_get(j, "eldr_trace_id");
  if (tid && !json_is_null(tid) && w->trace) {
    if (!json_is_string(tid)) BAD("'eldr_trace_id' must be a string");
    o->rec = eldr__w_trace_find(w, json_string_value(tid));
    if (o->rec < 0) {
      st = 404;
      BAD("unknown eldr_trace_id '%s' (not in the worker's trace)", json_string_value(tid));
    }
  }
  json_t *rid = json_object_get(j, "rid");
  if (rid && !json_is_null(rid)) {
    if (!json_is_string(rid) || json_string_length(rid) == 0 || json_string_length(rid) > 64)
      BAD("'rid' must be a string of 1..64 bytes");
    snprintf(o->rid, sizeof o->rid, "%s", json_string_value(rid));
  }
  /* the bootstrap fields (the gateway's inject_bootstrap_into_value) */
  json_t *bh = json_object_get(j, "bootstrap_host"), *bp = json_object_get(j, "bootstrap_port"),
         *br = json_object_get(j, "bootstrap_room");
  o->has_boot = br && !json_is_null(br);
  if (o->has_boot) {
    for (uint32_t i = 0; i < num; i++) {
      uint32_t ln;
      json_t *r = nth(br, i, o->n, &ln);
      if (json_is_array(br) && (uint64_t)ln * o->n < num)
        BAD("'bootstrap_room' has %u entries for %u prompts x n %u (SGLang indexes past its end)", ln, o->nprompts, o->n);
      if (!json_is_integer(r) || json_integer_value(r) < 0)
        BAD("'bootstrap_room' must be an integer in 0..2^63-1 or an array of them");
      uint64_t v = (uint64_t)json_integer_value(r);
      if (!json_is_array(br)) {
        if (v > SGL_MAX_ROOM - i) BAD("'bootstrap_room' + item index exceeds 2^63-1");
        v += i;
      }
      o->rooms[i] = v;
      for (uint32_t k = 0; k < i; k++)
        if (o->rooms[k] == v)
          BAD("items %u and %u share bootstrap_room %llu (SGLang would leave the later one waiting for its KV "
              "until SGLANG_DISAGGREGATION_WAITING_TIMEOUT)", k, i, (unsigned long long)v);
      json_t *h = nth(bh, i, o->n, &ln);
      json_t *pt = nth(bp, i, o->n, &ln);
      if (h && !json_is_null(h)) {
        if (!json_is_string(h) || json_string_length(h) == 0 || json_string_length(h) >= sizeof o->hosts[0])
          BAD("'bootstrap_host' must be a host name of 1..255 bytes");
        snprintf(o->hosts[i], sizeof o->hosts[i], "%s", json_string_value(h));
      }
      o->ports[i] = -1;
      if (pt && !json_is_null(pt)) {
        if (!json_is_integer(pt) || json_integer_value(pt) < 1 || json_integer_value(pt) > 65535)
          BAD("'bootstrap_port' must be a port (1..65535) or null");
        o->ports[i] = (int)json_integer_value(pt);
      }
    }
  }
  if (w->role == ELDR_WORKER_PREFILL && !o->has_boot)
    BAD("bootstrap_room should not be None: a prefill worker in PD mode serves only requests a PD router "
        "sent with bootstrap_host, bootstrap_port and bootstrap_room");
  if (w->role == ELDR_WORKER_DECODE) {
    if (!o->has_boot) BAD("a decode worker in PD mode needs bootstrap_host, bootstrap_port and bootstrap_room");
    for (uint32_t i = 0; i < num; i++)
      if (!o->hosts[i][0] || o->ports[i] < 0)
        BAD("item %u: bootstrap_host and bootstrap_port are needed to reach the prefill's bootstrap server", i);
  }
  json_decref(j);
  return 0;
fail:
#undef BAD
  json_decref(j);
  sparsed_free(o);
  memset(o, 0, sizeof *o);
  return st;
}

int eldr__sgl_check_request(const eldr_worker *w, const char *body, size_t len, int chat, char *err, size_t errcap) {
  sparsed o;
  int st = sgl_parse(w, body, len, chat, &o, err, errcap);
  if (!st) sparsed_free(&o);
  return st;
}

/* ------------------------------------------------------------ groups */

static void group_unlink(sgl_group *g) {
  sgl_group **pp = &g->w->groups;
  while (*pp && *pp != g) pp = &(*pp)->next;
  if (*pp) *pp = g->next;
}

static void group_free(sgl_group *g) {
  group_unlink(g);
  for (uint32_t i = 0; g->texts && i < g->nitems; i++) free(g->texts[i]);
  free(g->texts);
  free(g->text_len);
  free(g->text_cap);
  free(g->items);
  free(g->emitted);
  free(g->n_prompt);
  free(g->capped);
  free(g->fail_msg);
  free(g->re_b64);
  for (uint32_t p = 0; g->lp_ids && p < g->nprompts; p++) free(g->lp_ids[p]);
  free(g->lp_ids);
  free(g->lp_n);
  free(g);
}

/* Free g once it answered and every item is gone. */
static void group_maybe_free(sgl_group *g) {
  if ((g->replied || g->gone) && !g->live && !g->busy) group_free(g);
}

static void sse(struct evhttp_request *req, const char *s, size_t n) {
  struct evbuffer *b = evbuffer_new();
  if (!b) return;
  evbuffer_add(b, "data: ", 6);
  evbuffer_add(b, s, n);
  evbuffer_add(b, "\n\n", 2);
  evhttp_send_reply_chunk(req, b);
  evbuffer_free(b);
}

static void sse_json(struct evhttp_request *req, json_t *v) {
  char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
  if (s) sse(req, s, strlen(s));
  free(s);
  json_decref(v);
}

static void group_conn_closed(struct evhttp_connection *c, void *arg) {
  (void)c;
  sgl_group *g = arg;
  g->gone = 1;
  g->http = NULL;
  g->w->st.requests_cancelled++;
  /* every item leaves at its next turn; waits on peers end now */
  g->busy = 1;
  for (uint32_t i = 0; i < g->nitems; i++)
    if (g->items[i]) {
      g->items[i]->gone = 1;
      eldr__sgl_item_client_gone(g->items[i]);
    }
  g->busy = 0;
  group_maybe_free(g);
}

static void group_detach(sgl_group *g) {
  if (!g->http) return;
  struct evhttp_connection *c = evhttp_request_get_connection(g->http);
  if (c) evhttp_connection_set_closecb(c, NULL, NULL);
}

static json_t *usage_of(const sgl_group *g) {
  /* UsageProcessor: prompt tokens once per prompt, completion tokens of every item */
  json_int_t pt = 0, ct = 0;
  for (uint32_t i = 0; i < g->nitems; i++) ct += g->emitted[i];
  for (uint32_t p = 0; p < g->nprompts; p++) pt += g->n_prompt[p];
  return json_pack("{s:I,s:I,s:I,s:n,s:i}", "prompt_tokens", pt, "total_tokens", pt + ct, "completion_tokens", ct,
                   "prompt_tokens_details", "reasoning_tokens", 0);
}

static json_t *head_of(const sgl_group *g, const char *object) {
  return json_pack("{s:s,s:s,s:I,s:s}", "id", g->rid, "object", object, "created", (json_int_t)g->w->created,
                   "model", g->w->served);
}

static void group_reply(sgl_group *g) {
  eldr_worker *w = g->w;
  if (g->replied) return;
  g->replied = 1;
  if (!g->http) return;
  group_detach(g);
  if (g->stream) {
    if (!g->started) {
      struct evkeyvalq *h = evhttp_request_get_output_headers(g->http);
      evhttp_add_header(h, "Content-Type", "text/event-stream");
      evhttp_send_reply_start(g->http, 200, "OK");
      g->started = 1;
    }
    if (g->fail_code && g->gen) { /* http_server.py stream_results: {"error": {"message": ...}} */
      sse_json(g->http, json_pack("{s:{s:s}}", "error", "message", g->fail_msg ? g->fail_msg : "aborted"));
    } else if (g->gen) { /* every item's tokens went out with their own chunks */
    } else if (g->fail_code) { /* serving_completions: an abort with a status is an error chunk */
      json_t *e = json_pack("{s:s,s:s,s:s,s:n,s:i}", "object", "error", "message", g->fail_msg ? g->fail_msg : "aborted",
                            "type", g->fail_code >= 500 ? "InternalServerError" : "BadRequestError", "param", "code",
                            g->fail_code);
      sse_json(g->http, e);
    } else {
      if (g->return_re && g->re_b64) {
        json_t *c = head_of(g, g->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(c, "choices", json_array());
        json_object_set_new(c, "sglext", json_pack("{s:s}", "routed_experts", g->re_b64));
        sse_json(g->http, c);
      }
      if (g->include_usage) {
        json_t *c = head_of(g, g->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(c, "choices", json_array());
        json_object_set_new(c, "usage", usage_of(g));
        sse_json(g->http, c);
      }
    }
    sse(g->http, "[DONE]", 6);
    evhttp_send_reply_end(g->http);
    g->http = NULL;
    return;
  }
  if (g->fail_code) {
    if (g->gen) eldr__sgl_gen_error(g->http, g->fail_code, g->fail_msg ? g->fail_msg : "aborted");
    else sgl_error(g->http, g->fail_code, "%s", g->fail_msg ? g->fail_msg : "aborted");
    g->http = NULL;
    return;
  }
  if (g->gen) { /* one item, or a list of them */
    json_t *body = g->as_list ? json_array() : eldr__sgl_gen_item(g, 0, 1);
    for (uint32_t i = 0; g->as_list && body && i < g->nitems; i++) {
      json_t *it = eldr__sgl_gen_item(g, i, 1);
      if (!it || json_array_append_new(body, it)) {
        json_decref(body);
        body = NULL;
      }
    }
    if (body) eldr__w_send_json(g->http, 200, "OK", body);
    else eldr__sgl_gen_error(g->http, 500, "cannot build the reply");
    g->http = NULL;
    return;
  }
  json_t *body = head_of(g, g->chat ? "chat.completion" : "text_completion");
  json_t *choices = json_array();
  for (uint32_t i = 0; body && choices && i < g->nitems; i++) {
    const char *fin = g->capped[i] ? "length" : "stop";
    const char *text = g->texts[i] ? g->texts[i] : "";
    json_t *c = g->chat ? json_pack("{s:I,s:{s:s,s:s,s:n,s:n},s:n,s:s,s:n}", "index", (json_int_t)i, "message", "role",
                                    "assistant", "content", text, "reasoning_content", "tool_calls", "logprobs",
                                    "finish_reason", fin, "matched_stop")
                        : json_pack("{s:I,s:s,s:n,s:s,s:n}", "index", (json_int_t)i, "text", text, "logprobs",
                                    "finish_reason", fin, "matched_stop");
    if (c) json_array_append_new(choices, c);
  }
  if (body) {
    json_object_set_new(body, "choices", choices);
    json_object_set_new(body, "usage", usage_of(g));
    json_object_set_new(body, "metadata", json_pack("{s:s}", "weight_version", "default"));
    if (g->return_re && g->re_b64) json_object_set_new(body, "sglext", json_pack("{s:s}", "routed_experts", g->re_b64));
    eldr__w_send_json(g->http, 200, "OK", body);
  } else {
    json_decref(choices);
    sgl_error(g->http, 500, "cannot build the reply");
  }
  g->http = NULL;
  (void)w;
}

static void group_check(sgl_group *g, const wreq *except) {
  if (g->done == g->nitems || (g->fail_code && !g->stream) || (g->fail_code && g->started)) {
    int was = g->replied;
    group_reply(g);
    if (g->fail_code && !was && !g->busy) { /* one item failed: the request did; the others stop */
      g->busy = 1;
      for (uint32_t i = 0; i < g->nitems; i++)
        if (g->items[i] && g->items[i] != except) {
          g->items[i]->gone = 1;
          eldr__sgl_item_client_gone(g->items[i]);
        }
      g->busy = 0;
      group_maybe_free(g);
    }
  }
}

/* ------------------------------------------------------------ items */

static void keep_rows(sgl_group *g, const wreq *r);

void eldr__sgl_token(wreq *r, uint32_t t, int last) {
  sgl_group *g = r->grp;
  if (!g) return;
  char raw[64];
  eldr__w_token_text(r, 0, t, raw, sizeof raw);
  g->emitted[r->gidx] = t + 1;
  if (last) g->capped[r->gidx] = (uint8_t)r->capped;
  if (!g->stream || g->gen) { /* /generate streams the whole text so far */
    size_t l = strlen(raw);
    if (eldr_grow(&g->texts[r->gidx], &g->text_cap[r->gidx], g->text_len[r->gidx] + l + 1, 1, 64) == 0) {
      memcpy(g->texts[r->gidx] + g->text_len[r->gidx], raw, l + 1);
      g->text_len[r->gidx] += l;
    }
    if (!g->stream) return;
  }
  if (!g->http || g->fail_code) return;
  if (!g->started) {
    struct evkeyvalq *h = evhttp_request_get_output_headers(g->http);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_send_reply_start(g->http, 200, "OK");
    g->started = 1;
  }
  if (g->gen) {
    if (last) keep_rows(g, r); /* the capturer's rows go with the item's last chunk */
    sse_json(g->http, eldr__sgl_gen_item(g, r->gidx, last));
    return;
  }
  json_t *c = head_of(g, g->chat ? "chat.completion.chunk" : "text_completion");
  const char *fin = last ? (r->capped ? "length" : "stop") : NULL;
  json_t *ch;
  if (g->chat) {
    json_t *delta = t == 0 ? json_pack("{s:s,s:s}", "role", "assistant", "content", raw) : json_pack("{s:s}", "content", raw);
    ch = json_pack("{s:I,s:o,s:n,s:o,s:n}", "index", (json_int_t)r->gidx, "delta", delta, "logprobs", "finish_reason",
                   fin ? json_string(fin) : json_null(), "matched_stop");
  } else {
    ch = json_pack("{s:I,s:s,s:n,s:o,s:n}", "index", (json_int_t)r->gidx, "text", raw, "logprobs", "finish_reason",
                   fin ? json_string(fin) : json_null(), "matched_stop");
  }
  if (c && ch) json_object_set_new(c, "choices", json_pack("[o]", ch));
  else json_decref(ch);
  sse_json(g->http, c);
}

/* The first item's rows in SGLang's form, at its end: get_routed_experts
 * returns the rows of the sequence's first seqlen - 1 tokens. A prefill's
 * are the prompt's (seqlen = prompt + its one token); a decode's cover the
 * prompt too, but it never ran the prompt (rows 0: the capturer's buffer
 * as zeroed) and ran its output tokens 0..G-2; a local request's are the
 * prompt's and those. */
static void keep_rows(sgl_group *g, const wreq *r) {
  const eldr_worker *w = g->w;
  if (!g->return_re || g->re_b64 || r->gidx != 0 || !r->psel || !w->return_re) return;
  uint32_t gen = r->sg.role == 1 || !r->emitted || !r->dsel ? 0 : r->emitted - 1;
  size_t rows = (size_t)r->n_prompt + gen, LK = w->LK;
  uint16_t *sel = calloc(rows ? rows * LK : 1, sizeof *sel);
  if (!sel) return;
  if (r->sg.role != 2) memcpy(sel, r->psel, (size_t)r->n_prompt * LK * sizeof *sel);
  for (uint32_t i = 0; i < gen; i++)
    memcpy(sel + ((size_t)r->n_prompt + i) * LK, r->dsel + (size_t)(i % r->n_dsel) * LK, LK * sizeof *sel);
  (void)eldr_sglang_experts_emit(sel, rows, &w->shape, w->re_ids, w->re_hidden, &g->re_b64, NULL);
  free(sel);
}

void eldr__sgl_item_done(wreq *r) {
  sgl_group *g = r->grp;
  if (!g) return;
  keep_rows(g, r);
  g->done++;
  g->emitted[r->gidx] = r->emitted;
  g->capped[r->gidx] = (uint8_t)r->capped;
  group_check(g, r);
}

void eldr__sgl_item_fail(wreq *r, int code, const char *msg) {
  sgl_group *g = r->grp;
  if (!g) return;
  if (!g->fail_code) {
    g->fail_code = code;
    g->fail_msg = strdup(msg ? msg : "aborted");
  }
  g->done++;
  group_check(g, r); /* r itself is freed by its caller */
}

/* From eldr__w_req_free: the item leaves its group. */
void eldr__sgl_item_release(wreq *r) {
  sgl_group *g = r->grp;
  if (!g) return;
  eldr__sgl_item_cleanup(r);
  g->items[r->gidx] = NULL;
  r->grp = NULL;
  g->live--;
  group_maybe_free(g);
}

void eldr__sgl_handle(eldr_worker *w, struct evhttp_request *req, int chat /* SGL_API_* */) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t blen = evbuffer_get_length(in);
  char *body = malloc(blen + 1);
  if (!body) {
    sgl_error(req, 500, "out of memory");
    return;
  }
  evbuffer_copyout(in, body, blen);
  body[blen] = 0;
  sparsed p;
  char err[600];
  int st = sgl_parse(w, body, blen, chat, &p, err, sizeof err);
  free(body);
  if (st) {
    w->st.requests_failed++;
    if (chat == SGL_API_GENERATE) eldr__sgl_gen_error(req, st, err);
    else sgl_error(req, st, "%s", err);
    return;
  }
  uint32_t num = p.nprompts * p.n;
  sgl_group *g = calloc(1, sizeof *g);
  if (g) {
    g->w = w;
    g->nitems = num;
    g->items = calloc(num, sizeof *g->items);
    g->emitted = calloc(num, sizeof *g->emitted);
    g->n_prompt = calloc(p.nprompts, sizeof *g->n_prompt);
    g->capped = calloc(num, 1);
    g->texts = calloc(num, sizeof *g->texts);
    g->text_len = calloc(num, sizeof *g->text_len);
    g->text_cap = calloc(num, sizeof *g->text_cap);
  }
  if (!g || !g->items || !g->emitted || !g->n_prompt || !g->capped || !g->texts || !g->text_len || !g->text_cap) {
    if (g) group_free(g);
    sparsed_free(&p);
    sgl_error(req, 500, "out of memory");
    return;
  }
  g->chat = chat == SGL_API_CHAT;
  g->gen = chat == SGL_API_GENERATE;
  g->as_list = p.as_list;
  g->return_lp = p.return_lp;
  if (g->return_lp && (!(g->lp_ids = calloc(p.nprompts, sizeof *g->lp_ids)) || !(g->lp_n = calloc(p.nprompts, sizeof *g->lp_n))))
    g->return_lp = 0; /* out of memory: the reply goes without them */
  g->stream = p.stream;
  g->include_usage = p.stream && p.include_usage;
  g->return_re = p.return_re;
  g->nprompts = p.nprompts;
  g->n = p.n;
  if (p.rid[0]) snprintf(g->rid, sizeof g->rid, "%s", p.rid);
  else {
    uint64_t sq = ++w->seq;
    snprintf(g->rid, sizeof g->rid, "%016llx%08llx", (unsigned long long)(sq * 0x9e3779b97f4a7c15ull ^ (uint64_t)w->port),
             (unsigned long long)sq);
  }
  g->next = w->groups;
  w->groups = g;
  /* the items, batch-major: item i is prompt i % B, sample i / B */
  const char *fail = NULL;
  int fail_code = 500;
  for (uint32_t i = 0; i < num && !fail; i++) {
    uint32_t pi = i % p.nprompts;
    wreq *r = calloc(1, sizeof *r);
    if (!r) {
      fail = "out of memory";
      break;
    }
    r->w = w;
    r->grp = g;
    r->gidx = i;
    g->items[i] = r;
    g->live++;
    r->t_arrival = eldr_clock_now();
    r->n_choices = 1;
    r->chat = g->chat;
    r->stream = 0; /* the group streams */
    r->all_next = w->all;
    if (w->all) w->all->all_prev = r;
    w->all = r;
    size_t ntok = 0;
    if (p.pids && p.pids[pi]) { /* /generate's input_ids: the tokens as given */
      if ((r->ids = malloc(p.pnids[pi] * sizeof *r->ids))) memcpy(r->ids, p.pids[pi], p.pnids[pi] * sizeof *r->ids);
      ntok = p.pnids[pi];
      if (!r->ids) {
        fail = "out of memory";
        break;
      }
    } else if (eldr__w_tokenize(p.prompts[pi], p.plens[pi], &r->ids, &ntok) < 0) {
      fail = "out of memory";
      break;
    }
    if (ntok == 0 || ntok > UINT32_MAX / 2) {
      fail = ntok ? "the prompt is too long" : "the prompt is empty (0 tokens)";
      fail_code = 400;
      break;
    }
    r->n_prompt = (uint32_t)ntok;
    g->n_prompt[pi] = (uint32_t)ntok;
    if (g->return_lp && !g->lp_ids[pi] && (g->lp_ids[pi] = malloc(ntok * sizeof **g->lp_ids))) {
      memcpy(g->lp_ids[pi], r->ids, ntok * sizeof **g->lp_ids);
      g->lp_n[pi] = (uint32_t)ntok;
    }
    uint32_t want = DEFAULT_MAX_TOKENS;
    if (p.rec >= 0 && w->trace->req[p.rec].n_decode > 0) want = w->trace->req[p.rec].n_decode;
    else if (p.max_tokens > 0) want = p.max_tokens > 1 << 20 ? 1 << 20 : (uint32_t)p.max_tokens;
    r->n_out = want;
    if (p.max_tokens > 0 && (json_int_t)r->n_out >= p.max_tokens) {
      r->n_out = (uint32_t)p.max_tokens;
      r->capped = 1;
    }
    r->sg.role = w->role == ELDR_WORKER_PREFILL ? 1 : w->role == ELDR_WORKER_DECODE ? 2 : 0;
    if (r->sg.role == 1) { /* _process_req: max_new_tokens = 1 */
      r->n_out = 1;
      r->capped = 1;
      r->remote_decode = 1;
    }
    if (r->sg.role == 2) r->remote_prefill = 1;
    size_t pblocks = (ntok + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
    size_t dblocks = (ntok + r->n_out + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
    if ((r->sg.role != 2 && pblocks > eldr__kv_total(w->pkv)) || (r->sg.role != 1 && dblocks > eldr__kv_total(w->dkv))) {
      fail = "this request needs more KV cache than the worker has";
      fail_code = 400;
      break;
    }
    r->n_full = ntok / ELDR_BLOCK_TOKENS;
    if (!(r->hashes = malloc((r->n_full ? r->n_full : 1) * sizeof *r->hashes))) {
      fail = "out of memory";
      break;
    }
    (void)eldr_block_hashes(r->ids, ntok, ELDR_BLOCK_HASH_SEED, r->hashes);
    eldr_diag d = {{0}};
    if (eldr__w_selections(w, p.prompts[pi], p.plens[pi], r->ids, ntok, p.rec, r->n_out, &r->psel,
                           r->sg.role == 1 ? NULL : &r->dsel, &r->n_dsel, &d) < 0) {
      fail = "cannot derive expert selections";
      break;
    }
    snprintf(r->rid, sizeof r->rid, "%s_%u", g->rid, i);
    r->text_seed = ((uint64_t)r->gidx * 0x9e3779b97f4a7c15ull) ^ w->seq ^ (uint64_t)w->port << 32;
    if (p.has_boot) {
      r->sg.has_room = 1;
      r->sg.room = p.rooms[i];
      snprintf(r->sg.boot_host, sizeof r->sg.boot_host, "%s", p.hosts[i]);
      r->sg.boot_port = p.ports[i] > 0 ? (uint16_t)p.ports[i] : 0;
    }
  }
  sparsed_free(&p);
  if (fail) {
    w->st.requests_failed++;
    if (g->gen) eldr__sgl_gen_error(req, fail_code, fail);
    else sgl_error(req, fail_code, "%s", fail);
    g->replied = 1;
    g->busy = 1;
    for (uint32_t i = 0; i < num; i++)
      if (g->items[i]) eldr__w_req_free(g->items[i]);
    g->busy = 0;
    group_maybe_free(g);
    return;
  }
  g->http = req;
  struct evhttp_connection *c = evhttp_request_get_connection(req);
  if (c) evhttp_connection_set_closecb(c, group_conn_closed, g);
  /* into the engine: the prefill side waits for its decode (or runs at
   * once, --exact), the decode side handshakes first, local items prefill */
  g->busy = 1;
  for (uint32_t i = 0; i < num; i++) {
    wreq *r = g->items[i];
    if (r) eldr__sgl_item_start(r);
  }
  g->busy = 0;
  group_maybe_free(g);
}

/* 1 when the peer of req's connection closed it: evhttp notices a closed
 * client only when it writes, and an SGLang request that waits for its KV
 * writes nothing. SGLang itself checks a waiting request's client
 * (tokenizer_manager's _wait_one_response: every 4 s, request.is_disconnected;
 * a stream's disconnect at once). */
int eldr__sgl_peer_closed(struct evhttp_request *req) {
  struct evhttp_connection *c = req ? evhttp_request_get_connection(req) : NULL;
  struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
  evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
  if (fd < 0) return 0;
  char ch;
  ssize_t k = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
  return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void eldr__sgl_sweep(eldr_worker *w) {
  for (sgl_group *g = w->groups, *next; g; g = next) {
    next = g->next;
    if (g->http && !g->replied && eldr__sgl_peer_closed(g->http)) {
      struct evhttp_connection *c = evhttp_request_get_connection(g->http);
      if (c) evhttp_connection_set_closecb(c, NULL, NULL);
      group_conn_closed(c, g); /* may free g */
      if (c) evhttp_connection_free(c); /* the unanswered request goes with it */
    }
  }
}

void eldr__sgl_groups_free(eldr_worker *w) {
  while (w->groups) {
    sgl_group *g = w->groups;
    group_detach(g);
    if (g->http && !g->replied) {
      if (g->started) evhttp_send_reply_end(g->http);
      else sgl_error(g->http, 503, "the worker is shutting down");
    }
    g->http = NULL;
    g->replied = 1;
    group_free(g);
  }
}
