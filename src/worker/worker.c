/* worker.c — the emulated vLLM-compatible MoE engine (see eldr/worker.h).
 *
 * One event loop: the HTTP server, the prefill engine (a timer per batch) and
 * the decode engine (a step timer) all run in the caller's event_base.
 * Request lifecycle:
 *   parse -> [prefill queue -> prefill batch] -> (prefill leg: reply)
 *         -> decode queue (KV admission) -> [pull timer] -> ready -> running
 *         -> one token per step -> reply end.
 * Every wreq is on the `all` list until freed, so eldr_worker_free can end
 * the requests still open.
 */
#include "eldr/worker.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "eldr/batch_union.h"
#include "eldr/clock.h"
#include "eldr/grow.h"
#include "eldr/latency.h"
#include "eldr/routed_experts.h"
#include "eldr/sigcache.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"
#include "worker/kvcache.h"
#include "worker/worker_internal.h"

#define DEFAULT_KV_BLOCKS 4096
#define DEFAULT_MAX_SEQS 256
#define DEFAULT_BATCH_TOKENS 8192
#define DEFAULT_MAX_TOKENS 16
#define MAX_BODY (32 * 1024 * 1024)

enum rstate { RS_NEW, RS_PREFILL_Q, RS_PREFILLING, RS_DECODE_Q, RS_PULLING, RS_READY,
              RS_RUNNING, RS_DONE };

typedef struct wreq wreq;
struct wreq {
  eldr_worker *w;
  wreq *all_prev, *all_next; /* every live request */
  wreq *qnext;               /* prefill / decode / ready queues */
  struct evhttp_request *http;
  enum rstate state;
  int chat, stream, include_usage, started, gone;
  int remote_decode;  /* prefill leg: reply after prefill with kv_transfer_params */
  int remote_prefill; /* decode leg: pull the KV instead of computing it */
  int capped;         /* output length limited by max_tokens */
  char rid[160];
  char *chunk_head;   /* escaped JSON prefix shared by every stream chunk */
  uint32_t n_prompt, n_out, emitted, n_dsel;
  uint32_t *ids;
  uint64_t *hashes;
  size_t n_full;      /* full blocks of the prompt */
  int32_t *blocks;
  size_t n_blocks;
  uint32_t cached;    /* prompt tokens served from the prefix cache */
  uint16_t *psel, *dsel;
  struct event *pull_ev;
};

typedef struct rqueue {
  wreq *head, *tail;
  size_t n;
} rqueue;

struct eldr_worker {
  struct event_base *base;
  struct evhttp *http;
  uint16_t port;
  eldr_worker_role role;
  char model[64], served[128], engine_id[96], host[64];
  char *served_json, *engine_json; /* JSON-escaped, quoted */
  eldr_latency_model lm;
  const eldr_placement *placement; /* EP: borrowed or own_placement, else NULL */
  eldr_placement *own_placement;
  eldr_ep_tally ep;
  eldr_shape shape;
  size_t LK, LE;
  const eldr_trace *trace;
  size_t *trace_index; /* open addressing over trace ids: index + 1 */
  size_t trace_mask;
  eldr_tracegen *gen;
  double scale;
  size_t max_seqs, max_batched_tokens;
  int return_re;
  eldr_re_layout re_layout;
  eldr__kv *pkv, *dkv; /* prefill-side (prefix caching) and decode-side pools */
  /* prefill engine */
  rqueue prefill_q;
  wreq **pbatch;
  size_t n_pbatch;
  struct event *prefill_ev;
  int prefilling;
  /* decode engine */
  rqueue decode_q, ready_q;
  size_t n_pulling;
  wreq **running;
  size_t n_running;
  struct event *step_ev;
  int stepping;
  eldr_union un;     /* the decode step's per-layer expert union */
  uint32_t *unions;  /* its per-layer counts */
  uint32_t *rowbuf; /* counts rows for sigcache registration (one block) */
  double step_end;  /* planned end of the current / last decode step (monotonic s) */
  wreq *all;
  uint64_t seq;
  time_t created;
  eldr_worker_stats st;
};

static double now_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec;
}

/* ---------------------------------------------------------------- utilities */

const char *eldr_worker_role_name(eldr_worker_role r) {
  switch (r) {
  case ELDR_WORKER_PREFILL: return "prefill";
  case ELDR_WORKER_DECODE: return "decode";
  case ELDR_WORKER_BOTH: return "both";
  }
  return "?";
}

int eldr_worker_role_parse(const char *name, eldr_worker_role *out) {
  if (!name) return ELDR_EINVAL;
  if (!strcmp(name, "prefill")) *out = ELDR_WORKER_PREFILL;
  else if (!strcmp(name, "decode")) *out = ELDR_WORKER_DECODE;
  else if (!strcmp(name, "both")) *out = ELDR_WORKER_BOTH;
  else return ELDR_EINVAL;
  return 0;
}

void eldr_worker_config_default(eldr_worker_config *c) {
  memset(c, 0, sizeof *c);
  c->role = ELDR_WORKER_BOTH;
  c->model = "qwen3-30b-a3b";
  c->hardware = "h200";
  c->time_scale = 1.0;
  c->return_routed_experts = 1;
  c->routed_experts_layout = ELDR_RE_LAYOUT_NPY;
}

static char *json_quote(const char *s) {
  json_t *j = json_string(s);
  if (!j) return NULL;
  char *out = json_dumps(j, JSON_ENCODE_ANY);
  json_decref(j);
  return out;
}

static uint64_t str_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

static long trace_find(const eldr_worker *w, const char *id) {
  if (!w->trace_index) return -1;
  for (size_t i = str_hash(id) & w->trace_mask;; i = (i + 1) & w->trace_mask) {
    size_t v = w->trace_index[i];
    if (!v) return -1;
    if (!strcmp(w->trace->req[v - 1].id, id)) return (long)(v - 1);
  }
}

static void tv_of(double s, struct timeval *tv) {
  if (!(s > 0)) s = 0;
  if (s > 1e6) s = 1e6;
  tv->tv_sec = (time_t)s;
  tv->tv_usec = (suseconds_t)((s - (double)tv->tv_sec) * 1e6);
}

static void q_push(rqueue *q, wreq *r) {
  r->qnext = NULL;
  if (q->tail) q->tail->qnext = r;
  else q->head = r;
  q->tail = r;
  q->n++;
}

static wreq *q_pop(rqueue *q) {
  wreq *r = q->head;
  if (!r) return NULL;
  q->head = r->qnext;
  if (!q->head) q->tail = NULL;
  r->qnext = NULL;
  q->n--;
  return r;
}

/* ------------------------------------------------------------ HTTP replies */

static void add_json_headers(struct evhttp_request *req, const char *ctype) {
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", ctype);
}

static void send_json(struct evhttp_request *req, int code, const char *reason, json_t *body) {
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
static void send_error(struct evhttp_request *req, int code, const char *param, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));
static void send_error(struct evhttp_request *req, int code, const char *param, const char *fmt,
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
  send_json(req, code, reason, e ? e : json_object());
}

/* --------------------------------------------------------- request objects */

static void conn_closed(struct evhttp_connection *c, void *arg);

static void req_detach_closecb(wreq *r) {
  if (!r->http) return;
  struct evhttp_connection *c = evhttp_request_get_connection(r->http);
  if (c) evhttp_connection_set_closecb(c, NULL, NULL);
}

static void req_free(wreq *r) {
  eldr_worker *w = r->w;
  if (r->all_prev) r->all_prev->all_next = r->all_next;
  else w->all = r->all_next;
  if (r->all_next) r->all_next->all_prev = r->all_prev;
  if (r->pull_ev) event_free(r->pull_ev);
  if (r->blocks) {
    eldr__kv *kv = (r->state == RS_PREFILLING || r->state == RS_PREFILL_Q) ? w->pkv : w->dkv;
    eldr__kv_release(kv, r->blocks, r->n_blocks);
  }
  free(r->blocks);
  free(r->chunk_head);
  free(r->ids);
  free(r->hashes);
  free(r->psel);
  free(r->dsel);
  free(r);
}

/* End the HTTP exchange of r (if any) and free r. */
static void req_abort(wreq *r, int code, const char *msg) {
  if (r->http) {
    req_detach_closecb(r);
    if (r->started) evhttp_send_reply_end(r->http);
    else send_error(r->http, code, NULL, "%s", msg);
    r->http = NULL;
  }
  req_free(r);
}

static void conn_closed(struct evhttp_connection *c, void *arg) {
  (void)c;
  wreq *r = arg;
  r->gone = 1; /* the request object stays ours until we end it */
  r->w->st.requests_cancelled++;
}

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

static int tokenize_all(const char *text, size_t len, uint32_t **ids_out, size_t *n_out) {
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
static int selections(const eldr_worker *w, const char *text, size_t len, const uint32_t *ids,
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
  size_t seed_len = first_block_len(text, len, ids, n_tok);
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
    rec = trace_find(w, trace_id);
    if (rec < 0) return eldr_diag_fail(d, ELDR_ENOTFOUND, "unknown eldr_trace_id '%s'", trace_id);
  }
  uint32_t *ids = NULL;
  size_t n = 0;
  int rc = tokenize_all(text, len, &ids, &n);
  if (rc < 0) return rc;
  rc = selections(w, text, len, ids, n, rec, 1, sel, NULL, NULL, d);
  free(ids);
  if (rc == 0) *n_tokens = n;
  return rc;
}

/* ---------------------------------------------------------------- replies */

static void token_text(char *buf, size_t cap, uint32_t i) { snprintf(buf, cap, " tok%u", i); }

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

static void stream_start(wreq *r) {
  if (r->started || !r->http) return;
  struct evkeyvalq *h = evhttp_request_get_output_headers(r->http);
  evhttp_add_header(h, "Content-Type", "text/event-stream");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  evhttp_send_reply_start(r->http, 200, "OK");
  r->started = 1;
  if (r->chat) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "%s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                     "\"finish_reason\":null}]}",
                     r->chunk_head);
    if (n > 0 && (size_t)n < sizeof buf) sse_send(r, buf, (size_t)n);
  }
}

/* One streamed token chunk (last: carries finish_reason). */
static void stream_token(wreq *r, uint32_t i, int last) {
  char tok[32], buf[1024], fin[32];
  token_text(tok, sizeof tok, i);
  if (last) snprintf(fin, sizeof fin, "\"%s\"", finish_reason(r));
  else strcpy(fin, "null");
  int n;
  if (r->chat)
    n = snprintf(buf, sizeof buf,
                 "%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":%s}]}",
                 r->chunk_head, tok, fin);
  else
    n = snprintf(buf, sizeof buf,
                 "%s\"text\":\"%s\",\"logprobs\":null,\"finish_reason\":%s,\"stop_reason\":null}]}",
                 r->chunk_head, tok, fin);
  if (n > 0 && (size_t)n < sizeof buf) sse_send(r, buf, (size_t)n);
}

static json_t *usage_json(const wreq *r) {
  return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", (json_int_t)r->n_prompt,
                   "completion_tokens", (json_int_t)r->emitted, "total_tokens",
                   (json_int_t)(r->n_prompt + r->emitted), "prompt_tokens_details",
                   "cached_tokens", (json_int_t)r->cached);
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
  return json_pack("{s:b,s:b,s:s,s:o,s:s,s:i,s:i}", "do_remote_prefill", 1, "do_remote_decode", 0,
                   "remote_engine_id", r->w->engine_id, "remote_block_ids", ids, "remote_host",
                   r->w->host, "remote_port", (int)r->w->port, "tp_size", 1);
}

/* Complete, non-streamed reply (or the tail of a stream) for a finished request. */
static void reply_done(wreq *r) {
  eldr_worker *w = r->w;
  w->st.requests_done++;
  if (!r->http) return;
  req_detach_closecb(r);
  if (r->stream) {
    if (!r->started) stream_start(r);
    stream_end(r);
    r->http = NULL;
    return;
  }
  size_t cap = (size_t)r->emitted * 12 + 1;
  char *text = malloc(cap);
  if (!text) {
    send_error(r->http, 500, NULL, "out of memory");
    r->http = NULL;
    return;
  }
  size_t off = 0;
  text[0] = 0;
  for (uint32_t i = 0; i < r->emitted; i++) {
    char tok[32];
    token_text(tok, sizeof tok, i);
    size_t l = strlen(tok);
    if (off + l + 1 > cap) break;
    memcpy(text + off, tok, l + 1);
    off += l;
  }
  json_t *choice;
  if (r->chat)
    choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:s,s:n}", "index", 0, "message", "role",
                       "assistant", "content", text, "logprobs", "finish_reason",
                       finish_reason(r), "stop_reason");
  else
    choice = json_pack("{s:i,s:s,s:n,s:s,s:n}", "index", 0, "text", text, "logprobs",
                       "finish_reason", finish_reason(r), "stop_reason");
  free(text);
  json_t *body = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o],s:o}", "id", r->rid, "object",
                           r->chat ? "chat.completion" : "text_completion", "created",
                           (json_int_t)w->created, "model", w->served, "eldr_engine_id",
                           w->engine_id, "choices", choice, "usage", usage_json(r));
  if (body && r->remote_decode && w->return_re && r->psel)
    /* vLLM covers the tokens it computed: prompt rows after the cached prefix
     * (the one generated token was never forwarded: no generated rows) */
    (void)eldr_reply_experts_emit(body, choice, w->re_layout, r->psel + (size_t)r->cached * w->LK,
                                  r->n_prompt - r->cached, NULL, 0, &w->shape);
  if (body && r->remote_decode) json_object_set_new(body, "kv_transfer_params", kv_params_json(r));
  if (!body) {
    send_error(r->http, 500, NULL, "cannot build the reply");
  } else {
    send_json(r->http, 200, "OK", body);
  }
  r->http = NULL;
}

/* ---------------------------------------------------------- decode engine */

static void step_start(eldr_worker *w);
static void decode_admit(eldr_worker *w);

static void pull_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  wreq *r = arg;
  eldr_worker *w = r->w;
  w->n_pulling--;
  if (r->gone) {
    req_abort(r, 499, "client closed the connection");
    decode_admit(w);
    return;
  }
  r->state = RS_READY;
  q_push(&w->ready_q, r);
  if (!w->stepping) step_start(w);
}

/* Move decode-queue requests that get KV blocks (FIFO) into pulling/ready. */
static void decode_admit(eldr_worker *w) {
  while (w->decode_q.head) {
    wreq *r = w->decode_q.head;
    if (r->gone) {
      q_pop(&w->decode_q);
      req_abort(r, 499, "client closed the connection");
      continue;
    }
    if (w->n_running + w->ready_q.n + w->n_pulling >= w->max_seqs) break;
    size_t need = (r->n_prompt + r->n_out + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
    int32_t *b = malloc(need * sizeof *b);
    if (!b) break;
    if (eldr__kv_alloc(w->dkv, NULL, 0, need, b) < 0) {
      free(b);
      break;
    }
    q_pop(&w->decode_q);
    r->blocks = b;
    r->n_blocks = need;
    if (r->remote_prefill) {
      r->state = RS_PULLING;
      r->pull_ev = evtimer_new(w->base, pull_done, r);
      if (!r->pull_ev) {
        req_abort(r, 500, "cannot create a timer");
        continue;
      }
      struct timeval tv;
      tv_of(eldr_latency_kv_transfer(&w->lm, r->n_prompt) * w->scale, &tv);
      w->n_pulling++;
      evtimer_add(r->pull_ev, &tv);
    } else {
      r->state = RS_READY;
      q_push(&w->ready_q, r);
    }
  }
  if (!w->stepping && w->ready_q.n) step_start(w);
}

static void step_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  eldr_worker *w = arg;
  w->stepping = 0;
  size_t keep = 0;
  for (size_t i = 0; i < w->n_running; i++) {
    wreq *r = w->running[i];
    if (r->gone) {
      req_abort(r, 499, "client closed the connection");
      continue;
    }
    uint32_t t = r->emitted++;
    w->st.generation_tokens++;
    int last = r->emitted >= r->n_out;
    if (r->stream && r->http) {
      if (!r->started) stream_start(r);
      stream_token(r, t, last);
    }
    if (last) {
      r->state = RS_DONE;
      reply_done(r);
      req_free(r);
      continue;
    }
    w->running[keep++] = r;
  }
  w->n_running = keep;
  decode_admit(w);
  step_start(w);
}

/* EP step time: the batch's current tokens tallied per EP rank. */
static double ep_step(eldr_worker *w, double ctx) {
  eldr_ep_tally_begin(&w->ep);
  for (size_t i = 0; i < w->n_running; i++) {
    const wreq *r = w->running[i];
    eldr_ep_tally_add(&w->ep, w->placement, r->dsel + (size_t)(r->emitted % r->n_dsel) * w->LK,
                      (uint32_t)i);
  }
  eldr_ep_tally_end(&w->ep);
  return eldr_latency_step_ep(&w->lm, w->n_running, w->ep.rank_experts, w->ep.rank_tokens,
                              w->placement->ep_size, ctx);
}

static void step_start(eldr_worker *w) {
  if (w->stepping) return;
  while (w->ready_q.head && w->n_running < w->max_seqs) {
    wreq *r = q_pop(&w->ready_q);
    if (r->gone) {
      req_abort(r, 499, "client closed the connection");
      continue;
    }
    r->state = RS_RUNNING;
    w->running[w->n_running++] = r;
  }
  if (!w->n_running) return;
  const uint32_t L = w->shape.num_layers;
  eldr_union_clear(&w->un);
  double ctx = 0;
  for (size_t i = 0; i < w->n_running; i++) {
    const wreq *r = w->running[i];
    const uint16_t *row = r->dsel + (size_t)(r->emitted % r->n_dsel) * w->LK;
    eldr_union_add_token(&w->un, row);
    ctx += (double)r->n_prompt + r->emitted;
  }
  double mean_union = (double)eldr_union_count(&w->un, w->unions);
  double dur = (w->placement ? ep_step(w, ctx) : eldr_latency_step(&w->lm, w->n_running, w->unions, ctx)) *
               w->scale;
  w->st.union_sum += mean_union / L;
  w->st.batch_sum += w->n_running;
  w->st.token_seconds += dur * (double)w->n_running;
  w->st.steps++;
  w->st.step_seconds += dur;
  /* back-to-back steps are timed from the previous step's planned end, so
   * event-loop latency does not accumulate into the emulated step times */
  double now = eldr_clock_now();
  double start = (w->step_end > now - dur && w->step_end <= now) ? w->step_end : now;
  w->step_end = start + dur;
  struct timeval tv;
  tv_of(w->step_end - now, &tv);
  w->stepping = 1;
  evtimer_add(w->step_ev, &tv);
}

/* --------------------------------------------------------- prefill engine */

static void prefill_try(eldr_worker *w);

static void prefill_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  eldr_worker *w = arg;
  w->prefilling = 0;
  const size_t LE = w->LE, LK = w->LK;
  for (size_t i = 0; i < w->n_pbatch; i++) {
    wreq *r = w->pbatch[i];
    /* register the computed full blocks with their signature rows */
    size_t hit = r->cached / ELDR_BLOCK_TOKENS;
    for (size_t b = hit; b < r->n_full; b++) {
      memset(w->rowbuf, 0, LE * sizeof *w->rowbuf);
      (void)eldr_counts_accumulate(&w->shape, r->psel + b * ELDR_BLOCK_TOKENS * LK, ELDR_SEL_U16,
                                   ELDR_BLOCK_TOKENS, w->rowbuf, NULL);
      eldr__kv_register(w->pkv, r->blocks, r->hashes, b, b + 1, w->rowbuf, LE);
    }
    w->st.prompt_tokens += r->n_prompt;
    w->st.cached_tokens += r->cached;
    if (r->gone) {
      req_abort(r, 499, "client closed the connection");
      continue;
    }
    if (r->remote_decode) {
      /* the prefill leg: one token, kv_transfer_params; blocks stay cached */
      r->emitted = 1;
      r->capped = 1;
      if (r->stream) {
        stream_start(r);
        stream_token(r, 0, 1);
      }
      reply_done(r);
      eldr__kv_release(w->pkv, r->blocks, r->n_blocks);
      free(r->blocks);
      r->blocks = NULL;
      r->state = RS_DONE;
      req_free(r);
      continue;
    }
    /* local: the first token comes out of the prefill */
    eldr__kv_release(w->pkv, r->blocks, r->n_blocks);
    free(r->blocks);
    r->blocks = NULL;
    r->n_blocks = 0;
    r->emitted = 1;
    w->st.generation_tokens++;
    if (r->stream) {
      stream_start(r);
      stream_token(r, 0, r->n_out <= 1);
    }
    if (r->n_out <= 1) {
      r->state = RS_DONE;
      reply_done(r);
      req_free(r);
      continue;
    }
    r->state = RS_DECODE_Q;
    q_push(&w->decode_q, r);
  }
  w->n_pbatch = 0;
  decode_admit(w);
  prefill_try(w);
}

static void prefill_try(eldr_worker *w) {
  if (w->prefilling) return;
  size_t tokens = 0;
  w->n_pbatch = 0;
  while (w->prefill_q.head && w->n_pbatch < w->max_seqs) {
    wreq *r = w->prefill_q.head;
    if (r->gone) {
      q_pop(&w->prefill_q);
      req_abort(r, 499, "client closed the connection");
      continue;
    }
    /* prefix hit, leaving at least one token to compute (like vLLM) */
    size_t hit = eldr__kv_match(w->pkv, r->hashes, r->n_full);
    size_t max_hit = (r->n_prompt - 1) / ELDR_BLOCK_TOKENS;
    if (hit > max_hit) hit = max_hit;
    size_t compute = r->n_prompt - hit * ELDR_BLOCK_TOKENS;
    if (w->n_pbatch > 0 && tokens + compute > w->max_batched_tokens) break;
    size_t total = (r->n_prompt + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
    int32_t *b = malloc(total * sizeof *b);
    if (!b) break;
    if (eldr__kv_alloc(w->pkv, r->hashes, hit, total, b) < 0) {
      free(b);
      break; /* wait for blocks to be released */
    }
    q_pop(&w->prefill_q);
    w->st.prefix_queries += r->n_full;
    w->st.prefix_hits += hit;
    r->blocks = b;
    r->n_blocks = total;
    r->cached = (uint32_t)(hit * ELDR_BLOCK_TOKENS);
    r->state = RS_PREFILLING;
    w->pbatch[w->n_pbatch++] = r;
    tokens += compute;
  }
  if (!w->n_pbatch) return;
  struct timeval tv;
  tv_of(eldr_latency_prefill(&w->lm, tokens) * w->scale, &tv);
  w->prefilling = 1;
  evtimer_add(w->prefill_ev, &tv);
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

/* A parsed completion request (prompt malloc'd, owned by the caller). */
typedef struct preq {
  char *prompt;
  size_t plen;
  int stream, include_usage, remote_decode, remote_prefill;
  json_int_t max_tokens; /* -1 = not given */
  long rec;              /* trace record, -1 = derive from the text */
} preq;

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
static int parse_body(const eldr_worker *w, const char *body, size_t blen, int chat, preq *o,
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
  json_int_t max_tokens = -1;
  const char *mt_keys[2] = {"max_completion_tokens", "max_tokens"};
  for (int k = 0; k < 2; k++) {
    json_t *mt = json_object_get(j, mt_keys[k]);
    if (!mt || json_is_null(mt)) continue;
    if (!json_is_integer(mt) || json_integer_value(mt) < 1) {
      FAIL(400, mt_keys[k], "'%s' must be an integer >= 1", mt_keys[k]);
    }
    if (max_tokens < 0) max_tokens = json_integer_value(mt);
  }
  json_t *n = json_object_get(j, "n");
  if (n && !json_is_null(n) && (!json_is_integer(n) || json_integer_value(n) != 1)) {
    FAIL(400, "n", "'n' must be 1 (the emulator returns one choice)");
  }
  long rec = -1;
  json_t *tid = json_object_get(j, "eldr_trace_id");
  if (tid && !json_is_null(tid)) {
    if (!json_is_string(tid)) {
      FAIL(400, "eldr_trace_id", "'eldr_trace_id' must be a string");
    }
    if (!w->trace) {
      FAIL(400, "eldr_trace_id", "'eldr_trace_id' given but this worker was started without --trace");
    }
    rec = trace_find(w, json_string_value(tid));
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
      int ok = json_is_array(ids) && json_is_string(eng) && json_is_string(host) &&
               json_is_integer(port) && json_integer_value(port) > 0 &&
               json_integer_value(port) < 65536;
      size_t i;
      json_t *v;
      if (ok) json_array_foreach(ids, i, v) if (!json_is_integer(v) || json_integer_value(v) < 0) ok = 0;
      if (!ok) {
        FAIL(400, "kv_transfer_params", "do_remote_prefill needs remote_engine_id (string), remote_block_ids (array "
                   "of non-negative integers), remote_host (string) and remote_port (1..65535)");
      }
    }
  }

  o->prompt = prompt;
  o->plen = plen;
  o->stream = stream;
  o->include_usage = include_usage;
  o->remote_decode = remote_decode;
  o->remote_prefill = remote_prefill;
  o->max_tokens = max_tokens;
  o->rec = rec;
  prompt = NULL;
done:
  free(prompt);
  json_decref(j);
  return status;
}
#undef FAIL

int eldr__worker_check_request(const eldr_worker *w, const char *body, size_t len, int chat,
                               char *err, size_t errcap) {
  preq pq;
  const char *param = NULL;
  int st = parse_body(w, body, len, chat, &pq, err, errcap, &param);
  free(pq.prompt);
  return st;
}

static void handle_completion(eldr_worker *w, struct evhttp_request *req, int chat) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t blen = evbuffer_get_length(in);
  char *body = malloc(blen + 1);
  if (!body) {
    send_error(req, 500, NULL, "out of memory");
    return;
  }
  evbuffer_copyout(in, body, blen);
  body[blen] = 0;
  preq pq;
  const char *param = NULL;
  char err[320];
  int status = parse_body(w, body, blen, chat, &pq, err, sizeof err, &param);
  free(body);
  if (status) {
    send_error(req, status, param, "%s", err);
    return;
  }
  char *prompt = pq.prompt;
  size_t plen = pq.plen;
  const int stream = pq.stream, include_usage = pq.include_usage;
  const int remote_decode = pq.remote_decode, remote_prefill = pq.remote_prefill;
  const json_int_t max_tokens = pq.max_tokens;
  const long rec = pq.rec;
  wreq *r = NULL;

  r = calloc(1, sizeof *r);
  if (!r) {
    send_error(req, 500, NULL, "out of memory");
    goto out;
  }
  r->w = w;
  r->chat = chat;
  r->stream = stream;
  r->include_usage = stream && include_usage;
  r->remote_decode = remote_decode;
  r->remote_prefill = remote_prefill;
  r->all_next = w->all;
  if (w->all) w->all->all_prev = r;
  w->all = r;
  size_t ntok = 0;
  if (tokenize_all(prompt, plen, &r->ids, &ntok) < 0) {
    send_error(req, 500, NULL, "out of memory");
    goto fail;
  }
  if (ntok == 0) {
    send_error(req, 400, chat ? "messages" : "prompt", "the prompt is empty (0 tokens)");
    goto fail;
  }
  if (ntok > UINT32_MAX / 2) {
    send_error(req, 400, "prompt", "the prompt is too long (%zu tokens)", ntok);
    goto fail;
  }
  r->n_prompt = (uint32_t)ntok;
  /* output length: the record's decode length or max_tokens (default 16), capped */
  uint32_t want = DEFAULT_MAX_TOKENS;
  if (rec >= 0 && w->trace->req[rec].n_decode > 0) want = w->trace->req[rec].n_decode;
  else if (max_tokens > 0) want = max_tokens > 1 << 20 ? 1 << 20 : (uint32_t)max_tokens;
  r->n_out = want;
  if (max_tokens > 0 && (json_int_t)r->n_out >= max_tokens) {
    r->n_out = (uint32_t)max_tokens;
    r->capped = 1;
  }
  if (remote_decode) {
    r->n_out = 1;
    r->capped = 1;
  }
  size_t pblocks = (ntok + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
  size_t dblocks = (ntok + r->n_out + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
  if ((!remote_prefill && pblocks > eldr__kv_total(w->pkv)) ||
      (!remote_decode && dblocks > eldr__kv_total(w->dkv))) {
    send_error(req, 400, chat ? "messages" : "prompt",
               "this request needs %zu tokens of KV cache (prompt %zu + output %u), more than "
               "the worker's %zu blocks of %d tokens",
               remote_decode ? ntok : ntok + r->n_out, ntok, remote_decode ? 0 : r->n_out,
               remote_decode ? eldr__kv_total(w->pkv) : eldr__kv_total(w->dkv), ELDR_BLOCK_TOKENS);
    goto fail;
  }
  r->n_full = ntok / ELDR_BLOCK_TOKENS;
  r->hashes = malloc((r->n_full ? r->n_full : 1) * sizeof *r->hashes);
  if (!r->hashes) {
    send_error(req, 500, NULL, "out of memory");
    goto fail;
  }
  (void)eldr_block_hashes(r->ids, ntok, ELDR_BLOCK_HASH_SEED, r->hashes);
  eldr_diag d = {{0}};
  if (selections(w, prompt, plen, r->ids, ntok, rec, r->n_out, &r->psel,
                 remote_decode ? NULL : &r->dsel, &r->n_dsel, &d) < 0) {
    send_error(req, 500, NULL, "cannot derive expert selections: %s", d.msg);
    goto fail;
  }
  if (!remote_decode && (!r->dsel || r->n_dsel == 0)) {
    send_error(req, 500, NULL, "no decode selections for this request");
    goto fail;
  }
  /* ids and escaped chunk prefix */
  const char *xrid = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Request-Id");
  if (xrid && *xrid) snprintf(r->rid, sizeof r->rid, "%s-%.80s", chat ? "chatcmpl" : "cmpl", xrid);
  else snprintf(r->rid, sizeof r->rid, "%s-%s-%llu", chat ? "chatcmpl" : "cmpl", w->engine_id,
                (unsigned long long)++w->seq);
  char *qrid = json_quote(r->rid);
  if (qrid) {
    size_t cap = strlen(qrid) + strlen(w->served_json) + strlen(w->engine_json) + 160;
    r->chunk_head = malloc(cap);
    if (r->chunk_head)
      snprintf(r->chunk_head, cap,
               "{\"id\":%s,\"object\":\"%s\",\"created\":%lld,\"model\":%s,\"eldr_engine_id\":%s,"
               "\"choices\":[{\"index\":0,",
               qrid, chat ? "chat.completion.chunk" : "text_completion", (long long)w->created,
               w->served_json, w->engine_json);
    free(qrid);
  }
  if (!r->chunk_head) {
    send_error(req, 500, NULL, "out of memory");
    goto fail;
  }
  /* the connection may close while we work: keep the request, mark it gone */
  r->http = req;
  struct evhttp_connection *c = evhttp_request_get_connection(req);
  if (c) evhttp_connection_set_closecb(c, conn_closed, r);
  if (remote_prefill) {
    free(r->psel);
    r->psel = NULL;
    r->state = RS_DECODE_Q;
    q_push(&w->decode_q, r);
    decode_admit(w);
  } else {
    r->state = RS_PREFILL_Q;
    q_push(&w->prefill_q, r);
    prefill_try(w);
  }
  r = NULL;
  goto out;
fail:
  w->st.requests_failed++;
  req_free(r);
out:
  free(prompt);
}

/* --------------------------------------------------------------- endpoints */

static void metrics_line(struct evbuffer *b, eldr_worker *w, const char *name, const char *type,
                         const char *help, double v) {
  evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=%s} %.17g\n", name, help,
                      name, type, name, w->served_json, v);
}

static void handle_metrics(eldr_worker *w, struct evhttp_request *req) {
  eldr_worker_stats s;
  eldr_worker_stats_get(w, &s);
  struct evbuffer *b = evbuffer_new();
  if (!b) {
    evhttp_send_error(req, 500, "out of memory");
    return;
  }
  double usage = s.kv_blocks_total ? (double)s.kv_blocks_used / (double)s.kv_blocks_total : 0;
  metrics_line(b, w, "vllm:num_requests_running", "gauge", "Requests in the decode batch.",
               (double)s.running);
  metrics_line(b, w, "vllm:num_requests_waiting", "gauge", "Requests waiting (prefill, KV admission, KV pull).",
               (double)s.waiting);
  metrics_line(b, w, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage, 1 = 100 percent.", usage);
  metrics_line(b, w, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = 100 percent.", usage);
  metrics_line(b, w, "vllm:prompt_tokens_total", "counter", "Prompt tokens processed.",
               (double)s.prompt_tokens);
  metrics_line(b, w, "vllm:generation_tokens_total", "counter", "Generated tokens.",
               (double)s.generation_tokens);
  metrics_line(b, w, "vllm:prefix_cache_queries_total", "counter", "Prefix-cache queries, in tokens.",
               (double)s.prefix_queries * ELDR_BLOCK_TOKENS);
  metrics_line(b, w, "vllm:prefix_cache_hits_total", "counter", "Prefix-cache hits, in tokens.",
               (double)s.prefix_hits * ELDR_BLOCK_TOKENS);
  metrics_line(b, w, "vllm:request_success_total", "counter", "Finished requests.",
               (double)s.requests_done);
  metrics_line(b, w, "eldr_worker_requests_failed_total", "counter", "Rejected requests.",
               (double)s.requests_failed);
  metrics_line(b, w, "eldr_worker_requests_cancelled_total", "counter", "Client disconnects.",
               (double)s.requests_cancelled);
  metrics_line(b, w, "eldr_worker_decode_steps_total", "counter", "Decode steps run.", (double)s.steps);
  metrics_line(b, w, "eldr_worker_decode_step_seconds_total", "counter",
               "Emulated decode step time (scaled).", s.step_seconds);
  metrics_line(b, w, "eldr_worker_decode_union_experts_sum", "counter",
               "Sum over steps of the mean per-layer expert union.", s.union_sum);
  metrics_line(b, w, "eldr_worker_decode_batch_sum", "counter",
               "Sum over steps of the decode batch size.", (double)s.batch_sum);
  metrics_line(b, w, "eldr_worker_decode_token_seconds_sum", "counter",
               "Sum over steps of batch size x step time (scaled).", s.token_seconds);
  metrics_line(b, w, "eldr_worker_time_scale", "gauge", "Emulated durations are model time x this.",
               w->scale);
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", "text/plain; version=0.0.4");
  evhttp_send_reply(req, 200, "OK", b);
  evbuffer_free(b);
}

static void handle_models(eldr_worker *w, struct evhttp_request *req) {
  json_t *m = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:s,s:I}]}", "object", "list", "data", "id",
                        w->served, "object", "model", "created", (json_int_t)w->created,
                        "owned_by", "eldr", "root", w->model, "max_model_len",
                        (json_int_t)(eldr__kv_total(w->pkv) * ELDR_BLOCK_TOKENS));
  send_json(req, 200, "OK", m ? m : json_object());
}

static void on_request(struct evhttp_request *req, void *arg) {
  eldr_worker *w = arg;
  const char *uri = evhttp_request_get_uri(req);
  const struct evhttp_uri *pu = evhttp_request_get_evhttp_uri(req);
  const char *path = pu ? evhttp_uri_get_path(pu) : NULL;
  if (!path) path = uri ? uri : "";
  enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
  int is_get = cmd == EVHTTP_REQ_GET, is_post = cmd == EVHTTP_REQ_POST;
  if (!strcmp(path, "/health")) {
    if (!is_get) {
      send_error(req, 405, NULL, "%s allows GET only", path);
      return;
    }
    evhttp_send_reply(req, 200, "OK", NULL);
  } else if (!strcmp(path, "/metrics")) {
    if (!is_get) send_error(req, 405, NULL, "%s allows GET only", path);
    else handle_metrics(w, req);
  } else if (!strcmp(path, "/v1/models")) {
    if (!is_get) send_error(req, 405, NULL, "%s allows GET only", path);
    else handle_models(w, req);
  } else if (!strcmp(path, "/v1/completions") || !strcmp(path, "/v1/chat/completions")) {
    if (!is_post) send_error(req, 405, NULL, "%s allows POST only", path);
    else handle_completion(w, req, path[4] == 'c' && path[5] == 'h');
  } else {
    send_error(req, 404, NULL, "no route for %s", path);
  }
}

/* ------------------------------------------------------------- lifecycle */

/* Expert parallelism: the placement (given, else linear) and the tally. */
static int ep_setup(eldr_worker *w, const eldr_worker_config *cfg, eldr_diag *d) {
  const eldr_placement *p = cfg->placement;
  int rc;
  if (!p) {
    if ((rc = eldr_placement_linear(w->shape.num_layers, w->shape.num_experts, cfg->ep_size, 0,
                                    &w->own_placement, d)) < 0)
      return rc;
    p = w->own_placement;
  }
  if (p->num_layers != w->shape.num_layers || p->num_experts != w->shape.num_experts ||
      p->ep_size != cfg->ep_size || !p->ncopies)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "worker: placement of %u layers x %u experts over %u ranks does not fit "
                          "model '%s' (%u x %u) with EP %u",
                          p->num_layers, p->num_experts, p->ep_size, cfg->model, w->shape.num_layers,
                          w->shape.num_experts, cfg->ep_size);
  w->placement = p;
  return eldr_ep_tally_init(&w->ep, w->shape.num_layers, w->shape.top_k, p->ep_size,
                            p->num_physical, d);
}

int eldr_worker_new(struct event_base *base, const eldr_worker_config *cfg, eldr_worker **out,
                    eldr_diag *d) {
  *out = NULL;
  if (!base || !cfg || !cfg->model || !cfg->hardware)
    return eldr_diag_fail(d, ELDR_EINVAL, "worker: base, model and hardware are required");
  if (!(cfg->time_scale > 0) || !isfinite(cfg->time_scale))
    return eldr_diag_fail(d, ELDR_EINVAL, "worker: time_scale must be > 0 (got %g)", cfg->time_scale);
  eldr_worker *w = calloc(1, sizeof *w);
  if (!w) return ELDR_ENOMEM;
  int rc = 0;
  w->base = base;
  w->role = cfg->role;
  w->scale = cfg->time_scale;
  w->return_re = cfg->return_routed_experts;
  w->re_layout = cfg->routed_experts_layout ? cfg->routed_experts_layout : ELDR_RE_LAYOUT_NPY;
  w->max_seqs = cfg->max_num_seqs ? cfg->max_num_seqs : DEFAULT_MAX_SEQS;
  w->max_batched_tokens = cfg->max_batched_tokens ? cfg->max_batched_tokens : DEFAULT_BATCH_TOKENS;
  w->created = (time_t)now_wall();
  snprintf(w->model, sizeof w->model, "%s", cfg->model);
  snprintf(w->served, sizeof w->served, "%s",
           cfg->served_model_name ? cfg->served_model_name : cfg->model);
  snprintf(w->host, sizeof w->host, "%s", cfg->host ? cfg->host : "127.0.0.1");
  rc = cfg->ep_size ? eldr_latency_preset_ep(cfg->model, cfg->hardware,
                                              cfg->tp ? cfg->tp : cfg->ep_size, cfg->ep_size, &w->lm, d)
                     : eldr_latency_preset(cfg->model, cfg->hardware, &w->lm, d);
  if (rc < 0) goto fail;
  char canon[64];
  rc = eldr_tracegen_model_shape(cfg->model, &w->shape, canon, sizeof canon, d);
  if (rc < 0) goto fail;
  if (memcmp(&w->shape, &w->lm.shape, sizeof w->shape)) {
    rc = eldr_diag_fail(d, ELDR_ESHAPE, "worker: latency preset shape of '%s' differs from the trace generator's",
                        cfg->model);
    goto fail;
  }
  w->LK = (size_t)w->shape.num_layers * w->shape.top_k;
  w->LE = eldr_shape_cells(&w->shape);
  if (cfg->trace) {
    const eldr_shape *ts = &cfg->trace->shape;
    if (ts->num_layers != w->shape.num_layers || ts->num_experts != w->shape.num_experts ||
        ts->top_k != w->shape.top_k) {
      rc = eldr_diag_fail(d, ELDR_ESHAPE,
                          "worker: trace shape (%u layers, %u experts, top-%u) differs from model "
                          "'%s' (%u, %u, top-%u); pass --model matching the trace",
                          ts->num_layers, ts->num_experts, ts->top_k, cfg->model,
                          w->shape.num_layers, w->shape.num_experts, w->shape.top_k);
      goto fail;
    }
    w->trace = cfg->trace;
    size_t cap = 16;
    while (cap < 2 * cfg->trace->n + 2) cap <<= 1;
    w->trace_index = calloc(cap, sizeof *w->trace_index);
    if (!w->trace_index) {
      rc = ELDR_ENOMEM;
      goto fail;
    }
    w->trace_mask = cap - 1;
    for (size_t i = 0; i < cfg->trace->n; i++) {
      if (trace_find(w, cfg->trace->req[i].id) >= 0) continue; /* first wins */
      size_t s = str_hash(cfg->trace->req[i].id) & w->trace_mask;
      while (w->trace_index[s]) s = (s + 1) & w->trace_mask;
      w->trace_index[s] = i + 1;
    }
  }
  rc = eldr_tracegen_new(&w->shape, canon, "task", cfg->seed, &w->gen, d);
  if (rc < 0) goto fail;
  if (cfg->ep_size && (rc = ep_setup(w, cfg, d)) < 0) goto fail;
  size_t kvb = cfg->kv_blocks ? cfg->kv_blocks : DEFAULT_KV_BLOCKS;
  w->pkv = eldr__kv_new(kvb, &w->shape);
  w->dkv = eldr__kv_new(kvb, NULL);
  w->pbatch = calloc(w->max_seqs, sizeof *w->pbatch);
  w->running = calloc(w->max_seqs, sizeof *w->running);
  if (eldr_union_init(&w->un, &w->shape)) w->un.bits = NULL;
  w->unions = calloc(w->shape.num_layers, sizeof *w->unions);
  w->rowbuf = calloc(w->LE, sizeof *w->rowbuf);
  w->prefill_ev = evtimer_new(base, prefill_done, w);
  w->step_ev = evtimer_new(base, step_done, w);
  w->http = evhttp_new(base);
  if (!w->pkv || !w->dkv || !w->pbatch || !w->running || !w->un.bits || !w->unions || !w->rowbuf ||
      !w->prefill_ev || !w->step_ev || !w->http) {
    rc = ELDR_ENOMEM;
    goto fail;
  }
  evhttp_set_max_body_size(w->http, MAX_BODY);
  evhttp_set_timeout(w->http, 600);
  evhttp_set_allowed_methods(w->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                          EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD);
  evhttp_set_gencb(w->http, on_request, w);
  struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(w->http, w->host, cfg->port);
  if (!bs) {
    rc = eldr_diag_fail(d, ELDR_EIO, "worker: cannot listen on %s:%u (in use or not a local address)",
                        w->host, (unsigned)cfg->port);
    goto fail;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET) w->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6) w->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  }
  if (cfg->engine_id) snprintf(w->engine_id, sizeof w->engine_id, "%.80s", cfg->engine_id);
  else snprintf(w->engine_id, sizeof w->engine_id, "eldr-%s-%u", eldr_worker_role_name(w->role),
                (unsigned)w->port);
  w->served_json = json_quote(w->served);
  w->engine_json = json_quote(w->engine_id);
  if (!w->served_json || !w->engine_json) {
    rc = ELDR_ENOMEM;
    goto fail;
  }
  *out = w;
  return 0;
fail:
  eldr_worker_free(w);
  return rc < 0 ? rc : ELDR_ENOMEM;
}

void eldr_worker_free(eldr_worker *w) {
  if (!w) return;
  while (w->all) {
    wreq *r = w->all;
    if (r->state == RS_PULLING) w->n_pulling--;
    req_abort(r, 503, "the worker is shutting down");
  }
  if (w->http) evhttp_free(w->http);
  if (w->step_ev) event_free(w->step_ev);
  if (w->prefill_ev) event_free(w->prefill_ev);
  eldr_ep_tally_free(&w->ep);
  eldr_placement_free(w->own_placement);
  free(w->rowbuf);
  free(w->unions);
  eldr_union_free(&w->un);
  free(w->running);
  free(w->pbatch);
  eldr__kv_free(w->dkv);
  eldr__kv_free(w->pkv);
  eldr_tracegen_free(w->gen);
  free(w->trace_index);
  free(w->served_json);
  free(w->engine_json);
  free(w);
}

uint16_t eldr_worker_port(const eldr_worker *w) { return w->port; }

void eldr_worker_stats_get(const eldr_worker *w, eldr_worker_stats *s) {
  *s = w->st;
  s->running = w->n_running;
  s->waiting = w->prefill_q.n + w->n_pbatch + w->decode_q.n + w->n_pulling + w->ready_q.n;
  s->kv_blocks_used = eldr__kv_used(w->pkv) + eldr__kv_used(w->dkv);
  s->kv_blocks_total = eldr__kv_total(w->pkv) + eldr__kv_total(w->dkv);
}
