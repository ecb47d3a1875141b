/* loadgen.c — Poisson trace replay over HTTP with SSE checking and
 * TTFT/TPOT measurement (see eldr/loadgen.h). */
#include "eldr/loadgen.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eldr/clock.h"
#include "eldr/grow.h"
#include "eldr/quantile.h"
#include "eldr/rng.h"

void eldr_loadgen_config_default(eldr_loadgen_config *c) {
  memset(c, 0, sizeof *c);
  c->rate = 1.0;
  c->duration_s = 10.0;
  c->drain_s = 60.0;
  c->timeout_s = 60.0;
  c->stream = 1;
  c->send_trace_id = 1;
}


char *eldr_loadgen_prompt(const eldr_trace *t, size_t i) {
  const eldr_request *q = &t->req[i];
  if (q->prompt && q->prompt[0]) return strdup(q->prompt);
  size_t n = q->n_prefill ? q->n_prefill : 1;
  char *s = malloc(n * 5 + 1);
  if (!s) return NULL;
  /* words of 3-4 lower-case letters: one token each for eldr's tokenizer;
   * seeded by the record id, so every record's prompt is its own */
  uint64_t st = 0x6c6f616467656eULL;
  for (const char *p = q->id; *p; p++) st = (st ^ (unsigned char)*p) * 0x100000001b3ULL;
  size_t off = 0;
  for (size_t w = 0; w < n; w++) {
    uint64_t h = eldr_splitmix64(&st);
    int len = 3 + (int)(h & 1);
    if (w) s[off++] = ' ';
    for (int k = 0; k < len; k++) {
      s[off++] = (char)('a' + (h >> (8 + 5 * k)) % 26);
    }
  }
  s[off] = 0;
  return s;
}

typedef struct lg lg;

typedef struct lreq {
  lg *g;
  size_t idx; /* in recs */
  struct evhttp_connection *conn;
  struct evhttp_request *req;
  struct evbuffer *buf; /* SSE bytes not yet parsed */
  double t_send, t_first, t_last;
  int done_seen, finished, malformed;
  eldr_sse_state sse;
  size_t nbody;
  char *body; /* non-stream body */
  size_t body_cap;
} lreq;

struct lg {
  const eldr_loadgen_config *c;
  struct event_base *base;
  struct {
    char host[256], path_prefix[256];
    int port;
  } tg[ELDR_LOADGEN_MAX_TARGETS]; /* the targets; request i uses tg[i % ntg] */
  size_t ntg;
  eldr_rng rng;
  struct event *arrival_ev, *tick_ev, *drain_ev;
  double last_progress;
  double t0, next_arrival;
  size_t next_rec, range_first, range_n;
  size_t sent, completed, open;
  int arrivals_over;
  lreq **open_reqs;
  size_t open_cap;
  eldr_loadgen_result *res;
  char **prompts; /* cached per trace record (lazily) */
};

static void set_error(eldr_loadgen_rec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(eldr_loadgen_rec *r, const char *fmt, ...) {
  if (r->error[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->error, sizeof r->error, fmt, ap);
  va_end(ap);
}

static void free_conn_cb(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  evhttp_connection_free(arg);
}

static void maybe_finish_loop(lg *g) {
  if (g->arrivals_over && g->open == 0) event_base_loopexit(g->base, NULL);
}

static void lreq_close(lreq *q) {
  lg *g = q->g;
  eldr_loadgen_rec *r = &g->res->recs[q->idx];
  if (!r->ok && !r->error[0]) set_error(r, "incomplete response");
  if (r->ok) g->res->ok++;
  else if (r->timed_out) g->res->timed_out++;
  else g->res->failed++;
  if (q->malformed) g->res->malformed++;
  g->res->tokens += r->tokens;
  for (size_t i = 0; i < g->open; i++)
    if (g->open_reqs[i] == q) {
      g->open_reqs[i] = g->open_reqs[--g->open];
      break;
    }
  g->completed++;
  if (q->conn) event_base_once(g->base, -1, EV_TIMEOUT, free_conn_cb, q->conn, NULL);
  if (q->buf) evbuffer_free(q->buf);
  free(q->body);
  free(q);
  maybe_finish_loop(g);
}

static void sse_fail(eldr_sse_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sse_fail(eldr_sse_state *st, const char *fmt, ...) {
  st->malformed = 1;
  if (st->error[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->error, sizeof st->error, fmt, ap);
  va_end(ap);
}

void eldr_sse_event(eldr_sse_state *st, const char *ev, size_t len) {
  const char *data = NULL;
  size_t dlen = 0;
  const char *p = ev, *end = ev + len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    size_t ll = (size_t)(le - p);
    if (ll && p[ll - 1] == '\r') ll--;
    if (ll >= 5 && !memcmp(p, "data:", 5)) {
      if (data) { /* multi-line data is legal SSE but never sent by vLLM */
        sse_fail(st, "SSE event with several data lines");
        return;
      }
      data = p + 5;
      dlen = ll - 5;
      if (dlen && *data == ' ') data++, dlen--;
    } else if (ll && p[0] != ':') {
      sse_fail(st, "SSE line is not 'data:' (%.*s)", (int)(ll < 40 ? ll : 40), p);
      return;
    }
    p = nl ? nl + 1 : end;
  }
  if (!data) return; /* comment-only event */
  if (st->done) {
    sse_fail(st, "SSE data after [DONE]");
    return;
  }
  if (dlen == 6 && !memcmp(data, "[DONE]", 6)) {
    st->done = 1;
    return;
  }
  json_error_t jerr;
  json_t *j = json_loadb(data, dlen, 0, &jerr);
  if (!json_is_object(j)) {
    sse_fail(st, "SSE data is not a JSON object: %.100s", j ? "wrong type" : jerr.text);
    json_decref(j);
    return;
  }
  json_t *err = json_object_get(j, "error");
  if (err) {
    json_t *m = json_is_object(err) ? json_object_get(err, "message") : err;
    sse_fail(st, "error event: %.120s", json_is_string(m) ? json_string_value(m) : "(no message)");
  }
  json_t *eng = json_object_get(j, "eldr_engine_id");
  if (json_is_string(eng) && !st->engine[0])
    snprintf(st->engine, sizeof st->engine, "%s", json_string_value(eng));
  json_t *ch = json_object_get(j, "choices");
  if (json_is_array(ch) && json_array_size(ch) > 0) {
    json_t *c0 = json_array_get(ch, 0);
    json_t *text = json_object_get(c0, "text");
    json_t *delta = json_object_get(c0, "delta");
    if (!text && json_is_object(delta)) text = json_object_get(delta, "content");
    if (json_is_string(text) && json_string_length(text) > 0) st->tokens++;
  }
  json_decref(j);
}

/* Handle one SSE event of request q: check it, time its tokens. */
static void sse_event(lreq *q, const char *ev, size_t len) {
  eldr_loadgen_rec *r = &q->g->res->recs[q->idx];
  uint32_t before = q->sse.tokens;
  eldr_sse_event(&q->sse, ev, len);
  if (q->sse.tokens > before) {
    double now = eldr_clock_now();
    if (!before) q->t_first = now;
    else if (!eldr_grow(&q->g->res->itl, &q->g->res->itl_cap, q->g->res->n_itl + 1,
                        sizeof *q->g->res->itl, 1024)) /* a gap lost to memory is just not counted */
      q->g->res->itl[q->g->res->n_itl++] = now - q->t_last;
    q->t_last = now;
  }
  r->tokens = q->sse.tokens;
  if (q->sse.engine[0] && !r->engine[0]) snprintf(r->engine, sizeof r->engine, "%s", q->sse.engine);
  if (q->sse.malformed && !r->error[0]) set_error(r, "%s", q->sse.error);
  q->malformed = q->sse.malformed;
  q->done_seen = q->sse.done;
}

static void on_chunk(struct evhttp_request *req, void *arg) {
  lreq *q = arg;
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  if (!q->g->c->stream || evhttp_request_get_response_code(req) != 200) {
    size_t n = evbuffer_get_length(in);
    if (eldr_grow(&q->body, &q->body_cap, q->nbody + n + 1, 1, 256)) return;
    evbuffer_remove(in, q->body + q->nbody, n);
    q->nbody += n;
    q->body[q->nbody] = 0;
    return;
  }
  evbuffer_add_buffer(q->buf, in);
  for (;;) {
    struct evbuffer_ptr pos = evbuffer_search(q->buf, "\n\n", 2, NULL);
    size_t seplen = 2;
    struct evbuffer_ptr pos2 = evbuffer_search(q->buf, "\r\n\r\n", 4, NULL);
    if (pos2.pos >= 0 && (pos.pos < 0 || pos2.pos < pos.pos)) {
      pos = pos2;
      seplen = 4;
    }
    if (pos.pos < 0) break;
    size_t len = (size_t)pos.pos;
    char stackbuf[2048];
    char *ev = len < sizeof stackbuf ? stackbuf : malloc(len + 1);
    if (!ev) return;
    evbuffer_remove(q->buf, ev, len);
    evbuffer_drain(q->buf, seplen);
    sse_event(q, ev, len);
    if (ev != stackbuf) free(ev);
  }
}

static void on_done(struct evhttp_request *req, void *arg) {
  lreq *q = arg;
  lg *g = q->g;
  eldr_loadgen_rec *r = &g->res->recs[q->idx];
  double now = eldr_clock_now();
  q->req = NULL;
  if (!req || evhttp_request_get_response_code(req) == 0) {
    if (!r->timed_out) set_error(r, "no response (connection refused, reset or timed out)");
    if (!r->error[0]) set_error(r, "timed out");
    lreq_close(q);
    return;
  }
  r->status = evhttp_request_get_response_code(req);
  on_chunk(req, q); /* whatever is left in the input buffer */
  r->e2e_s = now - q->t_send;
  if (r->status != 200) {
    const char *msg = NULL;
    json_t *j = q->body ? json_loadb(q->body, q->nbody, 0, NULL) : NULL;
    json_t *e = j ? json_object_get(j, "error") : NULL;
    json_t *m = json_is_object(e) ? json_object_get(e, "message") : json_object_get(j, "message");
    if (json_is_string(m)) msg = json_string_value(m);
    set_error(r, "HTTP %d: %.120s", r->status, msg ? msg : (q->body ? q->body : ""));
    json_decref(j);
    lreq_close(q);
    return;
  }
  if (g->c->stream) {
    if (evbuffer_get_length(q->buf) > 0) {
      q->malformed = 1;
      set_error(r, "SSE stream ends with an unterminated event");
    }
    if (!q->done_seen) set_error(r, "SSE stream ended without data: [DONE]");
    if (r->tokens) {
      r->ttft_s = q->t_first - q->t_send;
      if (r->tokens >= 2) r->tpot_s = (q->t_last - q->t_first) / (r->tokens - 1);
    }
    r->ok = q->done_seen && !q->malformed && r->tokens > 0;
    if (r->ok == 0 && r->tokens == 0) set_error(r, "stream carried no tokens");
  } else {
    json_error_t jerr;
    json_t *j = q->body ? json_loadb(q->body, q->nbody, 0, &jerr) : NULL;
    json_t *u = json_object_get(json_object_get(j, "usage"), "completion_tokens");
    json_t *eng = json_object_get(j, "eldr_engine_id");
    if (json_is_string(eng)) snprintf(r->engine, sizeof r->engine, "%s", json_string_value(eng));
    if (!json_is_object(j) || !json_is_array(json_object_get(j, "choices"))) {
      set_error(r, "reply is not a completion object");
      q->malformed = 1;
    } else {
      r->tokens = json_is_integer(u) ? (uint32_t)json_integer_value(u) : 0;
      r->ttft_s = r->e2e_s; /* without streaming the first token arrives with the last */
      r->ok = 1;
    }
    json_decref(j);
  }
  lreq_close(q);
}

static void on_error(enum evhttp_request_error err, void *arg) {
  lreq *q = arg;
  eldr_loadgen_rec *r = &q->g->res->recs[q->idx];
  switch (err) {
  case EVREQ_HTTP_TIMEOUT: r->timed_out = 1; set_error(r, "timed out"); break;
  case EVREQ_HTTP_EOF: set_error(r, "connection closed before the response ended"); break;
  case EVREQ_HTTP_INVALID_HEADER: set_error(r, "invalid HTTP response header"); break;
  case EVREQ_HTTP_BUFFER_ERROR: set_error(r, "connection error (refused or reset)"); break;
  case EVREQ_HTTP_REQUEST_CANCEL: set_error(r, "cancelled"); break;
  case EVREQ_HTTP_DATA_TOO_LONG: set_error(r, "response too long"); break;
  }
}

static char *build_body(lg *g, size_t ri) {
  const eldr_loadgen_config *c = g->c;
  const eldr_request *q = &c->trace->req[ri];
  if (!g->prompts[ri]) g->prompts[ri] = eldr_loadgen_prompt(c->trace, ri);
  if (!g->prompts[ri]) return NULL;
  uint32_t mt = q->n_decode ? q->n_decode : 16;
  if (c->max_tokens && mt > c->max_tokens) mt = c->max_tokens;
  json_t *b = json_object();
  if (c->model) json_object_set_new(b, "model", json_string(c->model));
  if (c->chat)
    json_object_set_new(b, "messages",
                        json_pack("[{s:s,s:s}]", "role", "user", "content", g->prompts[ri]));
  else
    json_object_set_new(b, "prompt", json_string(g->prompts[ri]));
  json_object_set_new(b, "max_tokens", json_integer(mt));
  json_object_set_new(b, "ignore_eos", json_true());
  json_object_set_new(b, "stream", json_boolean(c->stream));
  if (c->stream) json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
  if (c->send_trace_id) json_object_set_new(b, "eldr_trace_id", json_string(q->id));
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  return s;
}

static void send_one(lg *g) {
  const eldr_loadgen_config *c = g->c;
  size_t ri = g->range_first + g->next_rec % g->range_n;
  g->next_rec++;
  size_t idx = g->res->n++;
  eldr_loadgen_rec *r = &g->res->recs[idx];
  memset(r, 0, sizeof *r);
  r->trace_index = ri;
  r->ttft_s = r->tpot_s = r->e2e_s = -1;
  g->sent++;
  lreq *q = calloc(1, sizeof *q);
  char *body = build_body(g, ri);
  if (!q || !body) {
    free(q);
    free(body);
    set_error(r, "out of memory");
    g->res->failed++;
    g->completed++;
    return;
  }
  q->g = g;
  q->idx = idx;
  q->buf = evbuffer_new();
  const char *thost = g->tg[idx % g->ntg].host, *tprefix = g->tg[idx % g->ntg].path_prefix;
  int tport = g->tg[idx % g->ntg].port;
  q->conn = evhttp_connection_base_new(g->base, NULL, thost, (unsigned short)tport);
  q->req = evhttp_request_new(on_done, q);
  if (!q->buf || !q->conn || !q->req) {
    if (q->req) evhttp_request_free(q->req);
    if (q->conn) evhttp_connection_free(q->conn);
    if (q->buf) evbuffer_free(q->buf);
    free(q);
    free(body);
    set_error(r, "cannot create the HTTP request");
    g->res->failed++;
    g->completed++;
    return;
  }
  struct timeval tv = {(time_t)c->timeout_s,
                       (suseconds_t)((c->timeout_s - floor(c->timeout_s)) * 1e6)};
  evhttp_connection_set_timeout_tv(q->conn, &tv);
  evhttp_connection_set_retries(q->conn, 0);
  evhttp_request_set_chunked_cb(q->req, on_chunk);
  evhttp_request_set_error_cb(q->req, on_error);
  struct evkeyvalq *h = evhttp_request_get_output_headers(q->req);
  char hostport[300];
  snprintf(hostport, sizeof hostport, "%s:%d", thost, tport);
  evhttp_add_header(h, "Host", hostport);
  evhttp_add_header(h, "Content-Type", "application/json");
  evhttp_add_header(h, "Connection", "close");
  if (c->stream) evhttp_add_header(h, "Accept", "text/event-stream");
  char rid[64];
  snprintf(rid, sizeof rid, "lg-%llx-%zu", (unsigned long long)c->seed, idx);
  evhttp_add_header(h, "X-Request-Id", rid);
  evbuffer_add(evhttp_request_get_output_buffer(q->req), body, strlen(body));
  free(body);
  char path[300];
  snprintf(path, sizeof path, "%s%s", tprefix,
           c->chat ? "/v1/chat/completions" : "/v1/completions");
  q->t_send = eldr_clock_now();
  r->send_s = q->t_send - g->t0;
  if (eldr_grow(&g->open_reqs, &g->open_cap, g->open + 1, sizeof *g->open_reqs, 64)) {
    set_error(r, "out of memory");
    evhttp_request_free(q->req);
    evhttp_connection_free(q->conn);
    evbuffer_free(q->buf);
    free(q);
    g->res->failed++;
    g->completed++;
    return;
  }
  g->open_reqs[g->open++] = q;
  if (evhttp_make_request(q->conn, q->req, EVHTTP_REQ_POST, path) != 0) {
    /* the request was freed by libevent */
    q->req = NULL;
    set_error(r, "cannot send the request");
    lreq_close(q);
  }
}

static void schedule_arrival(lg *g);

static void on_arrival(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  lg *g = arg;
  double now = eldr_clock_now() - g->t0;
  /* send every arrival that is due (timers may fire late under load) */
  while (!g->arrivals_over && g->next_arrival <= now) {
    send_one(g);
    g->next_arrival += eldr_rng_exponential(&g->rng, g->c->rate);
    if (g->next_arrival >= g->c->duration_s ||
        (g->c->max_requests && g->sent >= g->c->max_requests))
      g->arrivals_over = 1;
  }
  if (g->arrivals_over) {
    struct timeval tv = {(time_t)g->c->drain_s,
                         (suseconds_t)((g->c->drain_s - floor(g->c->drain_s)) * 1e6)};
    evtimer_add(g->drain_ev, &tv);
    maybe_finish_loop(g);
    return;
  }
  schedule_arrival(g);
}

static void schedule_arrival(lg *g) {
  double wait = g->next_arrival - (eldr_clock_now() - g->t0);
  if (wait < 0) wait = 0;
  struct timeval tv = {(time_t)wait, (suseconds_t)((wait - floor(wait)) * 1e6)};
  evtimer_add(g->arrival_ev, &tv);
}

static void on_drain(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  lg *g = arg;
  /* cancel what is still open: timed out */
  while (g->open) {
    lreq *q = g->open_reqs[0];
    eldr_loadgen_rec *r = &g->res->recs[q->idx];
    r->timed_out = 1;
    set_error(r, "still open %.1f s after the last arrival (drain limit)", g->c->drain_s);
    if (q->req) evhttp_cancel_request(q->req);
    q->req = NULL;
    lreq_close(q);
  }
  event_base_loopexit(g->base, NULL);
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  lg *g = arg;
  double now = eldr_clock_now();
  if (g->c->stop && *g->c->stop) {
    event_base_loopexit(g->base, NULL); /* the open requests are cancelled after the loop */
    return;
  }
  if (g->c->progress && now - g->last_progress >= 1.0) {
    g->last_progress = now;
    g->c->progress(g->c->progress_ctx, g->sent, g->completed, now - g->t0);
  }
}

/* "http://host[:port][/prefix]" into its parts (the prefix without trailing '/'). */
static int parse_target(const char *target, char *host_out, size_t host_cap, int *port,
                        char *prefix, size_t prefix_cap, eldr_diag *d) {
  struct evhttp_uri *u = target ? evhttp_uri_parse(target) : NULL;
  const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL;
  const char *host = u ? evhttp_uri_get_host(u) : NULL;
  if (!u || !scheme || strcmp(scheme, "http") || !host || !*host) {
    if (u) evhttp_uri_free(u);
    return eldr_diag_fail(d, ELDR_EINVAL, "loadgen: target '%s' is not an http://host[:port] URL",
                          target ? target : "");
  }
  snprintf(host_out, host_cap, "%s", host);
  *port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : 80;
  const char *path = evhttp_uri_get_path(u);
  snprintf(prefix, prefix_cap, "%s", path ? path : "");
  size_t pl = strlen(prefix);
  while (pl && prefix[pl - 1] == '/') prefix[--pl] = 0;
  evhttp_uri_free(u);
  return 0;
}

int eldr_loadgen_target_check(const char *target, eldr_diag *d) {
  char host[256], prefix[512];
  int port;
  return parse_target(target, host, sizeof host, &port, prefix, sizeof prefix, d);
}

int eldr_loadgen_run(const eldr_loadgen_config *c, eldr_loadgen_result *res, eldr_diag *d) {
  memset(res, 0, sizeof *res);
  if (!c || (!c->target && !c->n_targets) || !c->trace || c->trace->n == 0 ||
      c->n_targets > ELDR_LOADGEN_MAX_TARGETS)
    return eldr_diag_fail(d, ELDR_EINVAL, "loadgen: a target and a non-empty trace are required");
  if (!(c->rate > 0) || !isfinite(c->rate) || !(c->duration_s > 0) || !isfinite(c->duration_s) ||
      c->duration_s > 86400)
    return eldr_diag_fail(d, ELDR_EINVAL, "loadgen: rate and duration must be > 0 (duration <= 1 day)");
  if (c->first >= c->trace->n)
    return eldr_diag_fail(d, ELDR_EINVAL, "loadgen: first record %zu beyond the trace's %zu", c->first,
                          c->trace->n);
  lg g;
  memset(&g, 0, sizeof g);
  g.c = c;
  g.ntg = c->n_targets ? c->n_targets : 1;
  for (size_t i = 0; i < g.ntg; i++) {
    int prc = parse_target(c->n_targets ? c->targets[i] : c->target, g.tg[i].host, sizeof g.tg[i].host,
                           &g.tg[i].port, g.tg[i].path_prefix, sizeof g.tg[i].path_prefix, d);
    if (prc) return prc;
  }

  g.range_first = c->first;
  g.range_n = c->count && c->first + c->count <= c->trace->n ? c->count : c->trace->n - c->first;
  /* arrivals: count them first (the schedule is fixed by the seed) */
  eldr_rng_seed(&g.rng, c->seed);
  eldr_rng probe = g.rng;
  size_t n_arr = 0;
  for (double t = eldr_rng_exponential(&probe, c->rate); t < c->duration_s;
       t += eldr_rng_exponential(&probe, c->rate)) {
    n_arr++;
    if (c->max_requests && n_arr >= c->max_requests) break;
    if (n_arr > 10000000) break;
  }
  res->recs = calloc(n_arr ? n_arr : 1, sizeof *res->recs);
  g.prompts = calloc(c->trace->n, sizeof *g.prompts);
  g.base = event_base_new();
  int rc = 0;
  if (!res->recs || !g.prompts || !g.base) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  g.res = res;
  g.arrival_ev = evtimer_new(g.base, on_arrival, &g);
  g.drain_ev = evtimer_new(g.base, on_drain, &g);
  g.tick_ev = event_new(g.base, -1, EV_PERSIST, on_tick, &g);
  if (!g.arrival_ev || !g.drain_ev || !g.tick_ev) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  g.t0 = eldr_clock_now();
  g.last_progress = g.t0;
  if (c->progress || c->stop) {
    struct timeval tick = {0, 100000};
    event_add(g.tick_ev, &tick);
  }
  g.next_arrival = eldr_rng_exponential(&g.rng, c->rate);
  if (n_arr == 0) {
    g.arrivals_over = 1;
  } else {
    schedule_arrival(&g);
    event_base_dispatch(g.base);
  }
  res->wall_s = eldr_clock_now() - g.t0;
out:
  /* anything still open (loop ended early) is cancelled */
  while (g.open) {
    lreq *q = g.open_reqs[0];
    res->recs[q->idx].timed_out = 1;
    if (q->req) evhttp_cancel_request(q->req);
    q->req = NULL;
    struct evhttp_connection *conn = q->conn;
    q->conn = NULL;
    lreq_close(q);
    evhttp_connection_free(conn);
  }
  if (g.base) {
    /* run the deferred connection frees */
    event_base_loop(g.base, EVLOOP_NONBLOCK);
    event_base_loop(g.base, EVLOOP_NONBLOCK);
  }
  if (g.arrival_ev) event_free(g.arrival_ev);
  if (g.drain_ev) event_free(g.drain_ev);
  if (g.tick_ev) event_free(g.tick_ev);
  if (g.base) event_base_free(g.base);
  if (g.prompts)
    for (size_t i = 0; i < c->trace->n; i++) free(g.prompts[i]);
  free(g.prompts);
  free(g.open_reqs);
  if (rc < 0) eldr_loadgen_result_free(res);
  return rc;
}

void eldr_loadgen_result_free(eldr_loadgen_result *r) {
  if (!r) return;
  free(r->recs);
  free(r->itl);
  memset(r, 0, sizeof *r);
}


int eldr_loadgen_summarize(const eldr_loadgen_result *r, eldr_loadgen_summary *s) {
  memset(s, 0, sizeof *s);
  double *tt = malloc((r->n ? r->n : 1) * sizeof *tt);
  double *tp = malloc((r->n ? r->n : 1) * sizeof *tp);
  double *ee = malloc((r->n ? r->n : 1) * sizeof *ee);
  if (!tt || !tp || !ee) {
    free(tt);
    free(tp);
    free(ee);
    return ELDR_ENOMEM;
  }
  size_t nt = 0, np = 0;
  double st = 0, sp = 0, se = 0;
  for (size_t i = 0; i < r->n; i++) {
    const eldr_loadgen_rec *q = &r->recs[i];
    if (!q->ok) continue;
    if (q->ttft_s >= 0) {
      tt[nt] = q->ttft_s;
      se += q->e2e_s;
      ee[nt++] = q->e2e_s;
      st += q->ttft_s;
    }
    if (q->tpot_s >= 0) {
      tp[np++] = q->tpot_s;
      sp += q->tpot_s;
    }
  }
  s->n_ok = r->ok;
  s->n_tpot = np;
  s->ttft_mean = nt ? st / (double)nt : NAN;
  s->tpot_mean = np ? sp / (double)np : NAN;
  s->ttft_p50 = eldr_quantile(tt, nt, 0.50);
  s->ttft_p90 = eldr_quantile(tt, nt, 0.90);
  s->ttft_p99 = eldr_quantile(tt, nt, 0.99);
  s->tpot_p50 = eldr_quantile(tp, np, 0.50);
  s->tpot_p90 = eldr_quantile(tp, np, 0.90);
  s->tpot_p99 = eldr_quantile(tp, np, 0.99);
  s->e2e_p50 = eldr_quantile(ee, nt, 0.50);
  s->e2e_p90 = eldr_quantile(ee, nt, 0.90);
  s->e2e_p99 = eldr_quantile(ee, nt, 0.99);
  s->e2e_mean = nt ? se / (double)nt : NAN;
  s->throughput_rps = r->wall_s > 0 ? (double)r->ok / r->wall_s : 0;
  s->tokens_per_s = r->wall_s > 0 ? (double)r->tokens / r->wall_s : 0;
  s->itl_p50 = s->itl_p99 = NAN;
  double *it = r->n_itl ? malloc(r->n_itl * sizeof *it) : NULL;
  if (it) {
    memcpy(it, r->itl, r->n_itl * sizeof *it);
    s->itl_p50 = eldr_quantile(it, r->n_itl, 0.50);
    s->itl_p99 = eldr_quantile_sorted(it, r->n_itl, 0.99);
    free(it);
  }
  free(tt);
  free(tp);
  free(ee);
  return 0;
}
