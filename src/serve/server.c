/* server.c — the eldr router: client-facing HTTP/1.1 on bufferevents (own
 * bounded parser, so that every malformed, oversized or slow request gets a
 * JSON 4xx), upstream legs over eldr's own HTTP/1.1 client (upstream.c) on per-worker pools
 * of keep-alive connections, health checks, metrics, reload. One event loop.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <xxhash.h>

#include "eldr/artifact.h"
#include "eldr/policy.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "eldr/sigcache.h"
#include "eldr/signature.h"
#include "serve_internal.h"
#include "upstream.h"

/* ---- metrics -------------------------------------------------------------- */

enum { DEC_LOCALITY, DEC_LOAD, DEC_NONE, DEC__N };
static const char *const dec_name[DEC__N] = {"locality", "load", "none"};
enum { OUT_OK, OUT_CLIENT_ERROR, OUT_UPSTREAM_ERROR, OUT_TIMEOUT, OUT_CANCELLED, OUT_STREAM_ABORTED, OUT__N };
static const char *const out_name[OUT__N] = {"ok", "client_error", "upstream_error",
                                             "timeout", "cancelled", "stream_aborted"};
enum { FB_NONE = ELDR__FB_NONE, FB_SHAPE_MISMATCH = ELDR__FB_SHAPE_MISMATCH, FB__N = ELDR__FB__COUNT };
static const char *const fb_name[FB__N] = {"no_routed_experts", "malformed", "no_artifact",
                                           "shape_mismatch", "empty_signature"};
enum { BAD_JSON, BAD_FIELD, BAD_TOO_LARGE, BAD_HEAD, BAD_TIMEOUT, BAD_PATH, BAD_METHOD, BAD_LENGTH, BAD__N };
static const char *const bad_name[BAD__N] = {"malformed_json", "invalid_field", "body_too_large",
                                             "malformed_head", "timeout", "unknown_path",
                                             "method_not_allowed", "length_required"};

#define HB 14
typedef struct histo {
  double bound[HB];
  uint64_t n[HB + 1];
  double sum;
  uint64_t count;
} histo;

static void histo_init(histo *h, const double *b) {
  memset(h, 0, sizeof *h);
  memcpy(h->bound, b, sizeof h->bound);
}
static void histo_add(histo *h, double x) {
  int i = 0;
  while (i < HB && x > h->bound[i]) i++;
  h->n[i]++;
  h->sum += x;
  h->count++;
}

typedef struct metrics {
  uint64_t requests[DEC__N][OUT__N];
  uint64_t fallback[FB__N];
  uint64_t bad[BAD__N];
  uint64_t retries[2];
  uint64_t disconnects;
  uint64_t no_kv_params;
  uint64_t reloads_ok, reloads_err;
  histo sig, decision, request;
} metrics;

/* ---- types ---------------------------------------------------------------- */

enum { ROLE_PREFILL = 0, ROLE_DECODE = 1 };
static const char *const role_name[2] = {"prefill", "decode"};

typedef struct worker worker;
typedef struct hconn hconn;
typedef struct rq rq;

struct worker {
  eldr_server *s;
  char *url;
  char host[256];
  char hosthdr[300];
  int port;
  int role;
  uint32_t inflight;
  int healthy, fails, retired;
  uint64_t ejections, requests, err_connect, err_status, err_timeout;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  eldr__up **pool;
  size_t npool;
  eldr__up *hc;        /* health check connection */
  struct event *hc_timer;
  int hc_status;
  worker *next_all;
};

enum { LEG_PREFILL, LEG_DECODE, LEG_MODELS };

typedef struct leg {
  worker *w;
  eldr__up *up;            /* connection of the exchange in flight, or NULL */
  struct event *deadline;
  int kind;
  int streaming, started;
  int status;              /* reply status (0 until the head arrived) */
  char ctype[128];
  char *buf;               /* reply body (not relayed while streaming) */
  size_t n, cap;
} leg;

#define MAX_TRIED 17
#define MAX_REPLY (512u << 20) /* largest buffered worker reply */

struct rq {
  eldr_server *s;
  hconn *c; /* NULL once the client is gone */
  int is_models;
  eldr__req req;
  uint64_t prefix_hash;
  char reqid[ELDR__HTTP_REQID_MAX + 32];
  char *auth;
  char *pbody, *dbody;
  size_t plen, dlen;
  eldr__prefill_reply pr;
  char *re_copy; /* owned copy of pr.routed_experts for the splice */
  worker *tried[MAX_TRIED];
  int ntried;
  leg L;
  int decision;
  double t0;
  char last_err[200];
};

enum { C_HEAD, C_BODY, C_BUSY, C_CLOSING };

struct hconn {
  eldr_server *s;
  struct bufferevent *bev;
  struct event *deadline;
  int state;
  int in_process;
  int keep_alive;
  int head_only;
  int resp_chunked; /* 1 = chunked, 2 = raw until close (HTTP/1.0) */
  size_t body_need;
  rq *r;
  hconn *prev, *next;
  eldr__http_head head;
};

struct eldr_server {
  eldr_serve_config cfg;
  struct event_base *base;
  struct evconnlistener *lis;
  struct event *ev_stop, *ev_reload, *ev_health, *sig_hup, *sig_int, *sig_term;
  int port;
  worker **w[2];
  size_t nw[2];
  worker *all_workers;
  hconn *conns;
  eldr_artifact *art;
  eldr_policy pol, jsq;
  eldr_sigcache *cache;
  eldr__sigctx sc; /* signature extraction state and scratch (loop thread) */
  eldr__sigres pend; /* block rows to store once the decode leg is sent */
  int pend_on;
  struct event *ev_store;
  uint32_t *loads;
  uint8_t *healthy;
  size_t loadcap;
  uint64_t idstate;
  int logged_shape_mismatch, logged_splice;
  metrics m;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct timeval tv_of(double s) {
  struct timeval tv;
  tv.tv_sec = (time_t)s;
  tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
  return tv;
}

__attribute__((format(printf, 2, 3))) static void logf_(eldr_server *s, const char *fmt, ...) {
  if (!s->cfg.log) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->cfg.log(s->cfg.log_ctx, line);
}

/* ---- client responses ----------------------------------------------------- */

static void conn_free(hconn *c);
static void conn_process(hconn *c);
static void rq_free(rq *r);
static void rq_abort(rq *r);

static const char *reason(int st) {
  switch (st) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 411: return "Length Required";
  case 413: return "Payload Too Large";
  case 414: return "URI Too Long";
  case 417: return "Expectation Failed";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 505: return "HTTP Version Not Supported";
  default: return st < 300 ? "OK" : st < 500 ? "Client Error" : "Server Error";
  }
}

static void write_head(hconn *c, int status, const char *ctype, long long clen,
                       const char *extra) {
  struct evbuffer *o = bufferevent_get_output(c->bev);
  evbuffer_add_printf(o, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n", status, reason(status),
                      ctype ? ctype : "application/json");
  if (clen >= 0) evbuffer_add_printf(o, "Content-Length: %lld\r\n", clen);
  if (c->r && c->r->reqid[0]) evbuffer_add_printf(o, "X-Request-Id: %s\r\n", c->r->reqid);
  if (extra) evbuffer_add(o, extra, strlen(extra));
  evbuffer_add_printf(o, "Connection: %s\r\n\r\n", c->keep_alive ? "keep-alive" : "close");
}

/* Write queued output now: saves a loop round and an epoll_ctl pair per
 * response. EV_WRITE stays disabled unless the socket did not take it all. */
static void conn_flush(hconn *c) {
  struct evbuffer *o = bufferevent_get_output(c->bev);
  while (evbuffer_get_length(o) > 0)
    if (evbuffer_write(o, bufferevent_getfd(c->bev)) <= 0) break;
  if (evbuffer_get_length(o) > 0) bufferevent_enable(c->bev, EV_WRITE);
}

/* The response is complete: next request or close. */
static void conn_finish(hconn *c) {
  if (c->r) {
    rq *r = c->r;
    c->r = NULL;
    r->c = NULL;
    rq_free(r);
  }
  if (!c->keep_alive) {
    c->state = C_CLOSING;
    bufferevent_disable(c->bev, EV_READ);
    if (!c->in_process && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) conn_free(c);
    return; /* write callback frees once flushed */
  }
  c->state = C_HEAD;
  c->resp_chunked = 0;
  struct timeval idle = tv_of(c->s->cfg.idle_timeout_s);
  bufferevent_set_timeouts(c->bev, &idle, NULL);
  bufferevent_enable(c->bev, EV_READ);
  if (!c->in_process && evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) conn_process(c);
}

static void send_body(hconn *c, int status, const char *ctype, const void *body, size_t len,
                      const char *extra) {
  write_head(c, status, ctype, (long long)len, extra);
  if (!c->head_only && len) bufferevent_write(c->bev, body, len);
  conn_flush(c);
  conn_finish(c);
}

static void send_error(hconn *c, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(hconn *c, int status, const char *type, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t len = 0;
  char *j = eldr__error_json(status, type, msg, &len);
  send_body(c, status, "application/json", j ? j : "{}", j ? len : 2,
            status == 405 ? (c->head.path[0] && !strcmp(c->head.path, "/health")
                                 ? "Allow: GET, HEAD\r\n"
                                 : (!strcmp(c->head.path, "/metrics") || !strcmp(c->head.path, "/v1/models"))
                                       ? "Allow: GET\r\n"
                                       : "Allow: POST\r\n")
                          : NULL);
  free(j);
}

static void start_stream(hconn *c, int status, const char *ctype) {
  if (c->head.minor >= 1) {
    c->resp_chunked = 1;
    write_head(c, status, ctype, -1, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n");
  } else {
    c->resp_chunked = 2;
    c->keep_alive = 0;
    write_head(c, status, ctype, -1, "Cache-Control: no-cache\r\n");
  }
}

static void stream_chunk(hconn *c, const char *p, size_t n) {
  if (!n) return;
  struct evbuffer *o = bufferevent_get_output(c->bev);
  if (c->resp_chunked == 1) evbuffer_add_printf(o, "%zx\r\n", n);
  evbuffer_add(o, p, n);
  if (c->resp_chunked == 1) evbuffer_add(o, "\r\n", 2);
  conn_flush(c);
}

static void stream_end(hconn *c) {
  if (c->resp_chunked == 1) bufferevent_write(c->bev, "0\r\n\r\n", 5);
  conn_flush(c);
  conn_finish(c);
}

/* ---- workers ----------------------------------------------------------------- */

static void health_timeout_cb(evutil_socket_t fd, short ev, void *arg);

static worker *worker_new(eldr_server *s, const char *url, int role) {
  worker *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->s = s;
  w->role = role;
  w->healthy = 1;
  w->url = strdup(url);
  w->pool = calloc(s->cfg.pool_size ? s->cfg.pool_size : 1, sizeof *w->pool);
  w->hc_timer = evtimer_new(s->base, health_timeout_cb, w);
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  char port[16];
  if (!w->url || !w->pool || !w->hc_timer ||
      eldr_serve_parse_url(url, w->host, sizeof w->host, &w->port, NULL) ||
      (snprintf(port, sizeof port, "%d", w->port), getaddrinfo(w->host, port, &hints, &ai)) || !ai ||
      ai->ai_addrlen > sizeof w->addr) {
    if (ai) freeaddrinfo(ai);
    if (w->hc_timer) event_free(w->hc_timer);
    free(w->url);
    free(w->pool);
    free(w);
    return NULL;
  }
  memcpy(&w->addr, ai->ai_addr, ai->ai_addrlen);
  w->addrlen = (socklen_t)ai->ai_addrlen;
  freeaddrinfo(ai);
  snprintf(w->hosthdr, sizeof w->hosthdr, strchr(w->host, ':') ? "[%s]:%d" : "%s:%d", w->host, w->port);
  w->next_all = s->all_workers;
  s->all_workers = w;
  return w;
}

static void worker_free(worker *w) {
  for (size_t i = 0; i < w->npool; i++) eldr__up_free(w->pool[i]);
  eldr__up_free(w->hc);
  event_free(w->hc_timer);
  free(w->pool);
  free(w->url);
  free(w);
}

static eldr__up *pool_take(worker *w) {
  if (w->npool) return w->pool[--w->npool];
  eldr__up *u = eldr__up_new(w->s->base, (struct sockaddr *)&w->addr, w->addrlen);
  if (u) eldr__up_set_connect_timeout(u, w->s->cfg.connect_timeout_s);
  return u;
}

static void pool_give(worker *w, eldr__up *u) {
  if (!u) return;
  if (!w->retired && w->npool < w->s->cfg.pool_size && !eldr__up_active(u)) {
    w->pool[w->npool++] = u;
    return;
  }
  eldr__up_free(u); /* deferred by the connection itself inside its callbacks */
}

static void worker_failed(worker *w, const char *why) {
  w->fails++;
  if (w->s->cfg.health_interval_s > 0 && w->healthy && w->fails >= w->s->cfg.eject_after) {
    w->healthy = 0;
    w->ejections++;
    logf_(w->s, "%s worker %s ejected after %d consecutive failures (%s)", role_name[w->role],
          w->url, w->fails, why);
  }
}

static void health_result(worker *w, int ok, const char *why) {
  evtimer_del(w->hc_timer);
  if (ok) {
    w->fails = 0;
    if (!w->healthy && !w->retired) {
      w->healthy = 1;
      logf_(w->s, "%s worker %s re-admitted", role_name[w->role], w->url);
    }
  } else {
    worker_failed(w, why);
  }
}

static void hc_head(void *arg, int status, const char *ctype) {
  (void)ctype;
  ((worker *)arg)->hc_status = status;
}
static void hc_data(void *arg, const char *p, size_t n) {
  (void)arg;
  (void)p;
  (void)n;
}
static void hc_done(void *arg, int err) {
  worker *w = arg;
  health_result(w, err == 0 && w->hc_status == 200, err ? "health check failed" : "health check status");
}
static const eldr__up_cbs hc_cbs = {hc_head, hc_data, hc_done};

static void health_timeout_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  worker *w = arg;
  if (!w->hc || !eldr__up_active(w->hc)) return;
  eldr__up_abort(w->hc);
  health_result(w, 0, "health check timed out");
}

static void health_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) {
      worker *w = s->w[role][i];
      if (!w->hc) w->hc = eldr__up_new(s->base, (struct sockaddr *)&w->addr, w->addrlen);
      if (!w->hc || eldr__up_active(w->hc)) continue;
      char req[400];
      int n = snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: %s\r\n\r\n", w->hosthdr);
      struct iovec iov = {req, (size_t)n};
      w->hc_status = 0;
      if (eldr__up_request(w->hc, &iov, 1, &hc_cbs, w) == 0) {
        struct timeval tv = tv_of(s->cfg.connect_timeout_s);
        evtimer_add(w->hc_timer, &tv);
      }
    }
}

/* ---- request lifecycle ---------------------------------------------------- */

static void rq_finish_metrics(rq *r, int outcome) {
  if (r->is_models) return; /* completions only */
  r->s->m.requests[r->decision][outcome]++;
  histo_add(&r->s->m.request, now_s() - r->t0);
}

/* The leg's exchange is over (or is dropped): connection back to the pool. */
static void leg_release(rq *r) {
  leg *L = &r->L;
  if (L->deadline) event_del(L->deadline);
  if (L->up && eldr__up_active(L->up)) eldr__up_abort(L->up); /* the worker sees us leave */
  if (L->w) {
    L->w->inflight--;
    pool_give(L->w, L->up);
  }
  L->w = NULL;
  L->up = NULL;
}

static void rq_free(rq *r) {
  if (!r) return;
  leg_release(r);
  if (r->L.deadline) event_free(r->L.deadline);
  free(r->L.buf);
  eldr__req_free(&r->req);
  eldr__prefill_reply_free(&r->pr);
  free(r->re_copy);
  free(r->auth);
  free(r->pbody);
  free(r->dbody);
  free(r);
}

/* Client went away while the request was in flight. */
static void rq_abort(rq *r) {
  r->s->m.disconnects++;
  rq_finish_metrics(r, OUT_CANCELLED);
  r->c = NULL;
  rq_free(r);
}

static int was_tried(const rq *r, const worker *w) {
  for (int i = 0; i < r->ntried; i++)
    if (r->tried[i] == w) return 1;
  return 0;
}

/* loads / healthy arrays of a role, tried workers excluded. */
static int fill_loads(eldr_server *s, int role, rq *r, size_t *n) {
  size_t k = s->nw[role];
  if (k > s->loadcap) {
    uint32_t *l = realloc(s->loads, k * sizeof *l);
    if (l) s->loads = l;
    uint8_t *h = realloc(s->healthy, k);
    if (h) s->healthy = h;
    if (!l || !h) return ELDR_ENOMEM;
    s->loadcap = k;
  }
  for (size_t i = 0; i < k; i++) {
    worker *w = s->w[role][i];
    s->loads[i] = w->inflight;
    s->healthy[i] = (uint8_t)(w->healthy && !was_tried(r, w));
  }
  *n = k;
  return 0;
}

static void leg_head_cb(void *arg, int status, const char *ctype);
static void leg_data_cb(void *arg, const char *p, size_t n);
static void leg_done_cb(void *arg, int err);
static const eldr__up_cbs leg_cbs = {leg_head_cb, leg_data_cb, leg_done_cb};
static void leg_deadline_cb(evutil_socket_t fd, short ev, void *arg);
static void start_prefill(rq *r);
static void start_decode(rq *r, int retry);

static int leg_start(rq *r, worker *w, int kind, const char *method, const char *path,
                     const char *body, size_t len) {
  leg *L = &r->L;
  eldr_server *s = r->s;
  L->kind = kind;
  L->started = 0;
  L->status = 0;
  L->ctype[0] = 0;
  L->n = 0;
  L->streaming = kind == LEG_DECODE && r->req.stream;
  eldr__up *up = pool_take(w);
  if (!up) return ELDR_ENOMEM;
  char head[ELDR__HTTP_AUTH_MAX + ELDR__HTTP_REQID_MAX + 512];
  int hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, w->hosthdr);
  if (body)
    hn += snprintf(head + hn, sizeof head - (size_t)hn,
                   "Content-Type: application/json\r\nContent-Length: %zu\r\n", len);
  if (r->reqid[0]) hn += snprintf(head + hn, sizeof head - (size_t)hn, "X-Request-Id: %s\r\n", r->reqid);
  if (r->auth) hn += snprintf(head + hn, sizeof head - (size_t)hn, "Authorization: %s\r\n", r->auth);
  hn += snprintf(head + hn, sizeof head - (size_t)hn, "\r\n");
  struct iovec iov[2] = {{head, (size_t)hn}, {(void *)body, body ? len : 0}};
  if (eldr__up_request(up, iov, body ? 2 : 1, &leg_cbs, r) != 0) {
    pool_give(w, up);
    return ELDR_EIO;
  }
  L->w = w;
  L->up = up;
  w->inflight++;
  w->requests++;
  if (r->ntried < MAX_TRIED) r->tried[r->ntried++] = w;
  double t = kind == LEG_PREFILL ? s->cfg.prefill_timeout_s
             : kind == LEG_DECODE ? s->cfg.decode_timeout_s
                                  : s->cfg.connect_timeout_s;
  struct timeval tv = tv_of(t);
  event_add(L->deadline, &tv);
  return 0;
}

static void client_upstream_error(rq *r, int status, int outcome, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void client_upstream_error(rq *r, int status, int outcome, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rq_finish_metrics(r, outcome);
  send_error(r->c, status, status == 504 ? "timeout" : "upstream_error", "%s", msg);
}

/* The current leg failed (connect, reset, 5xx, bad reply or timeout). */
static void leg_failed(rq *r, int timeout, const char *why) {
  eldr_server *s = r->s;
  int kind = r->L.kind;
  snprintf(r->last_err, sizeof r->last_err, "%s", why);
  if (kind == LEG_MODELS) {
    client_upstream_error(r, timeout ? 504 : 502, timeout ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
                          "model list: %s", why);
    return;
  }
  int attempts = r->ntried;
  if (attempts <= s->cfg.retries) {
    s->m.retries[kind == LEG_DECODE]++;
    logf_(s, "request %s: %s leg failed (%s), retrying on another worker", r->reqid,
          role_name[kind == LEG_DECODE], why);
    if (kind == LEG_PREFILL) start_prefill(r);
    else start_decode(r, 1);
    return;
  }
  client_upstream_error(r, timeout ? 504 : 502, timeout ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
                        "%s failed after %d attempt%s: %s", role_name[kind == LEG_DECODE],
                        attempts, attempts == 1 ? "" : "s", why);
}

/* A started stream cannot be retried: end it with an SSE error event. */
static void abort_stream(rq *r, int code, const char *type, const char *msg) {
  char ev[256];
  int n = snprintf(ev, sizeof ev, "data: {\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":%d}}\n\n",
                   msg, type, code);
  stream_chunk(r->c, ev, (size_t)n);
  rq_finish_metrics(r, OUT_STREAM_ABORTED);
  stream_end(r->c);
}

static void leg_deadline_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  rq *r = arg;
  leg *L = &r->L;
  worker *w = L->w;
  if (w) {
    w->err_timeout++;
    worker_failed(w, "timeout");
  }
  int started = L->started;
  leg_release(r); /* aborts the exchange */
  if (started) {
    abort_stream(r, 504, "timeout", "decode timed out");
    return;
  }
  leg_failed(r, 1, "timed out");
}

static void leg_head_cb(void *arg, int status, const char *ctype) {
  rq *r = arg;
  r->L.status = status;
  snprintf(r->L.ctype, sizeof r->L.ctype, "%s", ctype);
}

static void leg_data_cb(void *arg, const char *p, size_t n) {
  rq *r = arg;
  leg *L = &r->L;
  if (L->streaming && L->status == 200) { /* relay as it arrives */
    if (!L->started) {
      start_stream(r->c, 200, L->ctype[0] ? L->ctype : "text/event-stream");
      L->started = 1;
    }
    stream_chunk(r->c, p, n);
    return;
  }
  if (L->n + n > MAX_REPLY) { /* a worker gone mad: not buffered without end */
    worker *w = L->w;
    w->err_status++;
    worker_failed(w, "reply too large");
    leg_release(r);
    client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "worker reply exceeds %u MiB", MAX_REPLY >> 20);
    return;
  }
  if (L->n + n + 1 > L->cap) {
    size_t cap = L->cap ? L->cap : 4096;
    while (cap < L->n + n + 1) cap *= 2;
    char *q = realloc(L->buf, cap);
    if (!q) {
      leg_release(r);
      client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "out of memory for the worker's reply");
      return;
    }
    L->buf = q;
    L->cap = cap;
  }
  memcpy(L->buf + L->n, p, n);
  L->n += n;
  L->buf[L->n] = 0;
}

/* Relay the buffered upstream reply to the client (frees r). */
static void relay(rq *r) {
  leg *L = &r->L;
  int code = L->status;
  rq_finish_metrics(r, code < 400 ? OUT_OK : code < 500 ? OUT_CLIENT_ERROR : OUT_UPSTREAM_ERROR);
  send_body(r->c, code, L->ctype[0] ? L->ctype : "application/json", L->n ? L->buf : "", L->n, NULL);
}

static void on_prefill_reply(rq *r);
static void on_decode_reply(rq *r);

static void leg_done_cb(void *arg, int err) {
  rq *r = arg;
  leg *L = &r->L;
  worker *w = L->w;
  if (L->deadline) event_del(L->deadline);
  if (err) { /* connection refused / reset / EOF mid-reply / not HTTP / connect timeout */
    if (w) {
      if (err == ELDR_ETIMEOUT) w->err_timeout++;
      else w->err_connect++;
      worker_failed(w, err == ELDR_EPARSE ? "malformed reply" : err == ELDR_ETIMEOUT ? "connect timeout" : "connection failed");
    }
    int started = L->started;
    leg_release(r);
    if (started) {
      abort_stream(r, 502, "upstream_error", "decode worker failed mid-stream");
      return;
    }
    leg_failed(r, err == ELDR_ETIMEOUT,
               err == ELDR_EPARSE     ? "malformed HTTP reply from worker"
               : err == ELDR_ETIMEOUT ? "connect to worker timed out"
                                      : "connection to worker failed");
    return;
  }
  if (L->status >= 500) {
    w->err_status++;
    worker_failed(w, "5xx reply");
  } else {
    w->fails = 0;
  }
  if (L->kind == LEG_MODELS) {
    leg_release(r);
    relay(r);
    return;
  }
  if (L->kind == LEG_PREFILL) {
    on_prefill_reply(r);
    return;
  }
  on_decode_reply(r);
}

static void on_decode_reply(rq *r) {
  leg *L = &r->L;
  eldr_server *s = r->s;
  int code = L->status;
  leg_release(r);
  if (L->started) { /* streaming relay done */
    rq_finish_metrics(r, OUT_OK);
    stream_end(r->c);
    return;
  }
  if (code >= 500) {
    char why[64];
    snprintf(why, sizeof why, "worker answered HTTP %d", code);
    leg_failed(r, 0, why);
    return;
  }
  if (code == 200 && L->streaming) { /* empty streaming body */
    start_stream(r->c, 200, L->ctype[0] ? L->ctype : "text/event-stream");
    rq_finish_metrics(r, OUT_OK);
    stream_end(r->c);
    return;
  }
  if (code == 200 && r->req.want_routed_experts && r->pr.routed_experts) {
    char *spliced = NULL;
    size_t sl = 0;
    eldr_diag d = {{0}};
    if (eldr__splice_routed_experts(L->n ? L->buf : "", L->n, r->pr.routed_experts, r->pr.routed_experts_len,
                                    r->pr.prompt_tokens, &spliced, &sl, &d) == 0) {
      rq_finish_metrics(r, OUT_OK);
      send_body(r->c, 200, "application/json", spliced, sl, NULL); /* frees r */
      free(spliced);
      return;
    }
    if (!s->logged_splice++)
      logf_(s, "request %s: routed_experts not spliced (relayed as the decoder sent them; logged once): %s",
            r->reqid, d.msg);
  }
  relay(r); /* frees r */
}

/* ---- signature and decision ----------------------------------------------- */

static void flush_store(eldr_server *s) {
  if (!s->pend_on) return;
  s->pend_on = 0;
  eldr__sig_store(&s->sc, &s->pend);
}

static void store_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  flush_store(arg);
}

static int decide(rq *r, int *fallback) {
  eldr_server *s = r->s;
  *fallback = FB_NONE;
  eldr__sigres res;
  int have = 0;
  if (s->cfg.policy == ELDR_POLICY_ELDR) {
    flush_store(s);
    double t0 = now_s();
    eldr__sig_extract(&s->sc, r->pr.routed_experts, r->pr.routed_experts_len, r->pr.prompt_tokens,
                      r->req.text, r->req.text_len, r->req.ids, r->req.n_ids, &res);
    histo_add(&s->m.sig, now_s() - t0);
    have = 1;
    *fallback = res.fallback;
    if (res.fallback != FB_NONE) {
      s->m.fallback[res.fallback]++;
      if (res.fallback == FB_SHAPE_MISMATCH) {
        if (!s->logged_shape_mismatch++) logf_(s, "%s: routing by load only (logged once)", res.diag.msg);
      } else if (res.diag.msg[0]) {
        logf_(s, "request %s: %s", r->reqid, res.diag.msg);
      }
    }
  }
  size_t n;
  if (fill_loads(s, ROLE_DECODE, r, &n)) return ELDR_ENOMEM;
  double t1 = now_s();
  eldr_route_req rr = {have ? res.sig : NULL, -1};
  eldr_decision dec;
  int k = eldr_policy_decode(&s->pol, s->loads, s->healthy, n, &rr, &dec);
  histo_add(&s->m.decision, now_s() - t1);
  r->decision = (have && res.sig && k >= 0 && dec.fallback == ELDR_FALLBACK_NONE) ? DEC_LOCALITY : DEC_LOAD;
  /* remember the rows of the blocks this prefill computed: deferred until the
   * decode leg is on its way (flushed first if another extraction comes) */
  if (have && res.fallback == FB_NONE && res.nblocks > 0) {
    s->pend = res;
    s->pend_on = 1;
    static const struct timeval zero = {0, 0};
    event_add(s->ev_store, &zero);
  }
  if (!r->re_copy) { /* borrowed from the prefill reply's buffer: gone after this callback */
    r->pr.routed_experts = NULL;
    r->pr.routed_experts_len = 0;
  }
  return k;
}

static void on_prefill_reply(rq *r) {
  eldr_server *s = r->s;
  leg *L = &r->L;
  int code = L->status;
  if (code >= 500) {
    char why[64];
    snprintf(why, sizeof why, "worker answered HTTP %d", code);
    leg_release(r);
    leg_failed(r, 0, why);
    return;
  }
  if (code != 200) { /* the worker refused the request itself: relay */
    leg_release(r);
    relay(r); /* frees r */
    return;
  }
  eldr_diag d = {{0}};
  if (eldr__prefill_reply_parse(L->n ? L->buf : "", L->n, &r->pr, &d) != 0) {
    worker *w = L->w;
    w->err_status++;
    worker_failed(w, "bad reply");
    leg_release(r);
    leg_failed(r, 0, d.msg);
    return;
  }
  /* routed_experts may borrow from the leg's buffer, which the decode reply
   * reuses: the splice needs its own copy; the decision (below, synchronous) not */
  if (r->req.want_routed_experts && r->pr.routed_experts) {
    r->re_copy = malloc(r->pr.routed_experts_len + 1);
    if (r->re_copy) memcpy(r->re_copy, r->pr.routed_experts, r->pr.routed_experts_len);
    r->pr.routed_experts = r->re_copy;
    if (!r->re_copy) r->pr.routed_experts_len = 0;
  }
  leg_release(r);
  if (!r->pr.kv_transfer_params) s->m.no_kv_params++;
  start_decode(r, 0);
}

static void start_decode(rq *r, int retry) {
  eldr_server *s = r->s;
  if (!retry) {
    r->ntried = 0;
    int fb;
    int k = decide(r, &fb);
    r->dbody = eldr__decode_body(&r->req, r->pr.kv_transfer_params, &r->dlen);
    if (!r->dbody) {
      client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
      return;
    }
    if (k < 0) {
      r->decision = DEC_NONE;
      client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy decode worker");
      return;
    }
    if (leg_start(r, s->w[ROLE_DECODE][k], LEG_DECODE, "POST", r->req.api == ELDR__API_CHAT ? "/v1/chat/completions" : "/v1/completions", r->dbody, r->dlen) == 0)
      return;
    leg_failed(r, 0, "could not send to decode worker");
    return;
  }
  /* retry: shortest queue among the untried healthy decoders, same kv_transfer_params */
  size_t n;
  if (fill_loads(s, ROLE_DECODE, r, &n)) {
    client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
    return;
  }
  eldr_route_req rr = {NULL, -1};
  int k = eldr_policy_decode(&s->jsq, s->loads, s->healthy, n, &rr, NULL);
  if (k < 0) {
    client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "decode failed (%s) and no other healthy decode worker",
                          r->last_err);
    return;
  }
  if (leg_start(r, s->w[ROLE_DECODE][k], LEG_DECODE, "POST",
                r->req.api == ELDR__API_CHAT ? "/v1/chat/completions" : "/v1/completions",
                r->dbody, r->dlen) != 0)
    leg_failed(r, 0, "could not send to decode worker");
}

static void start_prefill(rq *r) {
  eldr_server *s = r->s;
  size_t n;
  if (fill_loads(s, ROLE_PREFILL, r, &n)) {
    client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
    return;
  }
  int k = eldr_policy_prefill(r->prefix_hash, s->loads, s->healthy, n, s->cfg.prefill_guard);
  if (k < 0) {
    if (r->ntried == 0) client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy prefill worker");
    else client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "prefill failed (%s) and no other healthy prefill worker", r->last_err);
    return;
  }
  if (leg_start(r, s->w[ROLE_PREFILL][k], LEG_PREFILL, "POST",
                r->req.api == ELDR__API_CHAT ? "/v1/chat/completions" : "/v1/completions",
                r->pbody, r->plen) != 0)
    leg_failed(r, 0, "could not send to prefill worker");
}

static rq *rq_new(hconn *c) {
  rq *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->s = c->s;
  r->c = c;
  r->t0 = now_s();
  r->decision = DEC_NONE;
  r->L.deadline = evtimer_new(c->s->base, leg_deadline_cb, r);
  if (!r->L.deadline) {
    free(r);
    return NULL;
  }
  if (c->head.request_id[0]) snprintf(r->reqid, sizeof r->reqid, "%s", c->head.request_id);
  else snprintf(r->reqid, sizeof r->reqid, "eldr-%016llx",
                (unsigned long long)eldr_splitmix64(&c->s->idstate));
  if (c->head.authorization[0]) r->auth = strdup(c->head.authorization);
  c->r = r;
  return r;
}

static void handle_completion(hconn *c, eldr__api api, const char *body, size_t len) {
  eldr_server *s = c->s;
  rq *r = rq_new(c);
  if (!r) {
    send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  eldr_diag d = {{0}};
  int rc = eldr__req_parse(body, len, api, &r->req, &d);
  if (rc) {
    s->m.bad[rc == ELDR_EPARSE ? BAD_JSON : BAD_FIELD]++;
    rq_finish_metrics(r, OUT_CLIENT_ERROR);
    send_error(c, rc == ELDR_ENOMEM ? 500 : 400, "invalid_request_error", "%s", eldr_diag_msg(&d, rc));
    return;
  }
  /* prefix hash: the first block of the prompt's tokens (cache affinity) */
  size_t ntok = r->req.n_ids;
  const uint32_t *ids = r->req.ids;
  if (!ids) {
    uint32_t first[ELDR_BLOCK_TOKENS];
    ntok = eldr_tokenize(r->req.text, r->req.text_len, first, ELDR_BLOCK_TOKENS);
    if (ntok >= ELDR_BLOCK_TOKENS) eldr_block_hashes(first, ELDR_BLOCK_TOKENS, 0, &r->prefix_hash);
    else r->prefix_hash = XXH64(r->req.text, r->req.text_len, 0);
  } else if (ntok >= ELDR_BLOCK_TOKENS) {
    eldr_block_hashes(ids, ELDR_BLOCK_TOKENS, 0, &r->prefix_hash);
  } else {
    r->prefix_hash = XXH64(ids, ntok * sizeof *ids, 0);
  }
  r->pbody = eldr__prefill_body(&r->req, &r->plen);
  if (!r->pbody) {
    rq_finish_metrics(r, OUT_UPSTREAM_ERROR);
    send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  start_prefill(r);
}

/* ---- metrics and health endpoints ----------------------------------------- */

static void render_histo(struct evbuffer *o, const char *name, const char *help, const histo *h) {
  evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int i = 0; i < HB; i++) {
    cum += h->n[i];
    evbuffer_add_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bound[i], (unsigned long long)cum);
  }
  cum += h->n[HB];
  evbuffer_add_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                      (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->count);
}

static void handle_metrics(hconn *c) {
  eldr_server *s = c->s;
  metrics *m = &s->m;
  struct evbuffer *o = evbuffer_new();
  if (!o) {
    send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  evbuffer_add_printf(o, "# HELP eldr_requests_total Completion requests by decode decision and outcome.\n"
                         "# TYPE eldr_requests_total counter\n");
  for (int d = 0; d < DEC__N; d++)
    for (int k = 0; k < OUT__N; k++)
      evbuffer_add_printf(o, "eldr_requests_total{policy=\"%s\",decision=\"%s\",outcome=\"%s\"} %llu\n",
                          eldr_policy_name(s->cfg.policy), dec_name[d], out_name[k],
                          (unsigned long long)m->requests[d][k]);
  evbuffer_add_printf(o, "# HELP eldr_fallback_total Decisions made by load only, by reason.\n"
                         "# TYPE eldr_fallback_total counter\n");
  for (int f = 0; f < FB__N; f++)
    evbuffer_add_printf(o, "eldr_fallback_total{reason=\"%s\"} %llu\n", fb_name[f],
                        (unsigned long long)m->fallback[f]);
  evbuffer_add_printf(o, "# HELP eldr_bad_requests_total Client requests refused, by reason.\n"
                         "# TYPE eldr_bad_requests_total counter\n");
  for (int b = 0; b < BAD__N; b++)
    evbuffer_add_printf(o, "eldr_bad_requests_total{reason=\"%s\"} %llu\n", bad_name[b],
                        (unsigned long long)m->bad[b]);
  evbuffer_add_printf(o, "# HELP eldr_retries_total Upstream legs retried on another worker.\n"
                         "# TYPE eldr_retries_total counter\n"
                         "eldr_retries_total{leg=\"prefill\"} %llu\neldr_retries_total{leg=\"decode\"} %llu\n",
                      (unsigned long long)m->retries[0], (unsigned long long)m->retries[1]);
  evbuffer_add_printf(o, "# HELP eldr_client_disconnects_total Clients gone before their response.\n"
                         "# TYPE eldr_client_disconnects_total counter\neldr_client_disconnects_total %llu\n",
                      (unsigned long long)m->disconnects);
  evbuffer_add_printf(o, "# HELP eldr_prefill_without_kv_params_total Prefill replies without kv_transfer_params.\n"
                         "# TYPE eldr_prefill_without_kv_params_total counter\neldr_prefill_without_kv_params_total %llu\n",
                      (unsigned long long)m->no_kv_params);
  evbuffer_add_printf(o, "# HELP eldr_sigcache_tokenizer_mismatch_total Prompts whose token count differs from the engine's.\n"
                         "# TYPE eldr_sigcache_tokenizer_mismatch_total counter\neldr_sigcache_tokenizer_mismatch_total %llu\n",
                      (unsigned long long)s->sc.tokenizer_mismatch);
  evbuffer_add_printf(o, "# HELP eldr_signature_blocks_missing_total Prefix-cached blocks whose row was not in the signature cache.\n"
                         "# TYPE eldr_signature_blocks_missing_total counter\neldr_signature_blocks_missing_total %llu\n",
                      (unsigned long long)s->sc.blocks_missing);
  eldr_sigcache_stats cs;
  eldr_sigcache_stats_get(s->cache, &cs);
  evbuffer_add_printf(o, "# HELP eldr_sigcache_rows Block rows held by the signature cache.\n"
                         "# TYPE eldr_sigcache_rows gauge\neldr_sigcache_rows %zu\n"
                         "# TYPE eldr_sigcache_hits_total counter\neldr_sigcache_hits_total %llu\n"
                         "# TYPE eldr_sigcache_misses_total counter\neldr_sigcache_misses_total %llu\n"
                         "# TYPE eldr_sigcache_evictions_total counter\neldr_sigcache_evictions_total %llu\n",
                      cs.rows, (unsigned long long)cs.hits, (unsigned long long)cs.misses,
                      (unsigned long long)cs.evictions);
  evbuffer_add_printf(o, "# HELP eldr_reloads_total Configuration/artifact reloads.\n"
                         "# TYPE eldr_reloads_total counter\neldr_reloads_total{result=\"ok\"} %llu\n"
                         "eldr_reloads_total{result=\"error\"} %llu\n",
                      (unsigned long long)m->reloads_ok, (unsigned long long)m->reloads_err);
  evbuffer_add_printf(o, "# HELP eldr_artifact_loaded Whether a routing artifact is loaded.\n"
                         "# TYPE eldr_artifact_loaded gauge\neldr_artifact_loaded %d\n", s->art != NULL);
  static const char *const wm[][3] = {
      {"eldr_worker_inflight", "gauge", "Requests in flight per worker (router-tracked)."},
      {"eldr_worker_healthy", "gauge", "1 when the worker is admitted, 0 when ejected."},
      {"eldr_worker_requests_total", "counter", "Upstream legs sent per worker."},
      {"eldr_worker_ejections_total", "counter", "Times the worker was ejected."},
  };
  for (int q = 0; q < 4; q++) {
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s %s\n", wm[q][0], wm[q][2], wm[q][0], wm[q][1]);
    for (int role = 0; role < 2; role++)
      for (size_t i = 0; i < s->nw[role]; i++) {
        worker *w = s->w[role][i];
        unsigned long long v = q == 0 ? w->inflight : q == 1 ? (unsigned long long)w->healthy
                               : q == 2 ? w->requests : w->ejections;
        evbuffer_add_printf(o, "%s{role=\"%s\",worker=\"%s\"} %llu\n", wm[q][0], role_name[role], w->url, v);
      }
  }
  evbuffer_add_printf(o, "# HELP eldr_upstream_errors_total Failed upstream legs by worker and kind.\n"
                         "# TYPE eldr_upstream_errors_total counter\n");
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) {
      worker *w = s->w[role][i];
      evbuffer_add_printf(o, "eldr_upstream_errors_total{role=\"%s\",worker=\"%s\",kind=\"connect\"} %llu\n"
                             "eldr_upstream_errors_total{role=\"%s\",worker=\"%s\",kind=\"status\"} %llu\n"
                             "eldr_upstream_errors_total{role=\"%s\",worker=\"%s\",kind=\"timeout\"} %llu\n",
                          role_name[role], w->url, (unsigned long long)w->err_connect, role_name[role],
                          w->url, (unsigned long long)w->err_status, role_name[role], w->url,
                          (unsigned long long)w->err_timeout);
    }
  render_histo(o, "eldr_signature_seconds", "Signature extraction (decode, counts, cache, build).", &m->sig);
  render_histo(o, "eldr_decision_seconds", "Decode routing decision.", &m->decision);
  render_histo(o, "eldr_request_seconds", "Completion request latency at the router.", &m->request);
  size_t n = evbuffer_get_length(o);
  send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", evbuffer_pullup(o, -1), n, NULL);
  evbuffer_free(o);
}

static void handle_health(hconn *c) {
  eldr_server *s = c->s;
  size_t h[2] = {0, 0};
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) h[role] += s->w[role][i]->healthy != 0;
  int ok = h[0] > 0 && h[1] > 0;
  char b[256];
  int n = snprintf(b, sizeof b,
                   "{\"status\":\"%s\",\"prefill_healthy\":%zu,\"prefill_total\":%zu,"
                   "\"decode_healthy\":%zu,\"decode_total\":%zu,\"artifact\":%s}",
                   ok ? "ok" : "unavailable", h[0], s->nw[0], h[1], s->nw[1], s->art ? "true" : "false");
  send_body(c, ok ? 200 : 503, "application/json", b, (size_t)n, NULL);
}

static void handle_models(hconn *c) {
  eldr_server *s = c->s;
  rq *r = rq_new(c);
  if (!r) {
    send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  r->is_models = 1;
  for (int role = 1; role >= 0; role--)
    for (size_t i = 0; i < s->nw[role]; i++)
      if (s->w[role][i]->healthy) {
        if (leg_start(r, s->w[role][i], LEG_MODELS, "GET", "/v1/models", NULL, 0) == 0) return;
      }
  client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy worker to list models");
}

/* ---- client connections --------------------------------------------------- */

static void conn_free(hconn *c) {
  eldr_server *s = c->s;
  if (c->r) {
    rq *r = c->r;
    c->r = NULL;
    rq_abort(r);
  }
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  if (c->deadline) event_free(c->deadline);
  bufferevent_free(c->bev);
  free(c);
}

static void dispatch(hconn *c, const char *body, size_t len) {
  eldr_server *s = c->s;
  const char *p = c->head.path;
  eldr__method m = c->head.method;
  int known = 1;
  c->state = C_BUSY;
  c->head_only = m == ELDR__M_HEAD;
  if (!strcmp(p, "/v1/completions") || !strcmp(p, "/v1/chat/completions")) {
    if (m != ELDR__M_POST) goto bad_method;
    handle_completion(c, p[4] == 'c' && p[5] == 'h' ? ELDR__API_CHAT : ELDR__API_COMPLETIONS, body, len);
    return;
  }
  if (!strcmp(p, "/health")) {
    if (m != ELDR__M_GET && m != ELDR__M_HEAD) goto bad_method;
    handle_health(c);
    return;
  }
  if (!strcmp(p, "/metrics")) {
    if (m != ELDR__M_GET) goto bad_method;
    handle_metrics(c);
    return;
  }
  if (!strcmp(p, "/v1/models")) {
    if (m != ELDR__M_GET) goto bad_method;
    handle_models(c);
    return;
  }
  known = 0;
bad_method:
  s->m.bad[known ? BAD_METHOD : BAD_PATH]++;
  c->head_only = 0;
  if (known) send_error(c, 405, "invalid_request_error", "method %s not allowed on %s", c->head.method_name, p);
  else send_error(c, 404, "invalid_request_error", "unknown path %s", p);
}

static void conn_deadline_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  hconn *c = arg;
  if (c->state != C_HEAD && c->state != C_BODY) return;
  c->s->m.bad[BAD_TIMEOUT]++;
  c->keep_alive = 0;
  c->state = C_BUSY;
  send_error(c, 408, "invalid_request_error", "request not received within %g s",
             c->s->cfg.header_timeout_s);
}

static void conn_process(hconn *c) {
  eldr_server *s = c->s;
  struct evbuffer *in = bufferevent_get_input(c->bev);
  c->in_process = 1;
  while (c->state == C_HEAD || c->state == C_BODY) {
    size_t avail = evbuffer_get_length(in);
    if (c->state == C_HEAD) {
      if (avail == 0) break;
      if (!evtimer_pending(c->deadline, NULL)) {
        struct timeval tv = tv_of(s->cfg.header_timeout_s);
        evtimer_add(c->deadline, &tv);
        bufferevent_set_timeouts(c->bev, NULL, NULL);
      }
      size_t look = avail < s->cfg.max_header + 1 ? avail : s->cfg.max_header + 1;
      const char *buf = (const char *)evbuffer_pullup(in, (ev_ssize_t)look);
      long hl = eldr__http_parse_head(buf, look, s->cfg.max_header, &c->head);
      if (hl == 0) break;
      if (hl < 0) {
        evtimer_del(c->deadline);
        s->m.bad[c->head.status == 431 ? BAD_TOO_LARGE : BAD_HEAD]++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        send_error(c, c->head.status, "invalid_request_error", "%s", c->head.error);
        break;
      }
      evbuffer_drain(in, (size_t)hl);
      c->keep_alive = c->head.keep_alive;
      if (c->head.chunked) {
        evtimer_del(c->deadline);
        s->m.bad[BAD_LENGTH]++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        send_error(c, 411, "invalid_request_error", "chunked request bodies are not supported: send Content-Length");
        break;
      }
      int64_t cl = c->head.content_length;
      if (c->head.method == ELDR__M_POST && cl < 0) {
        evtimer_del(c->deadline);
        s->m.bad[BAD_LENGTH]++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        send_error(c, 411, "invalid_request_error", "Content-Length required");
        break;
      }
      if (cl > 0 && (uint64_t)cl > s->cfg.max_body) {
        evtimer_del(c->deadline);
        s->m.bad[BAD_TOO_LARGE]++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        send_error(c, 413, "invalid_request_error", "request body of %lld bytes exceeds the limit of %zu",
                   (long long)cl, s->cfg.max_body);
        break;
      }
      c->body_need = cl > 0 ? (size_t)cl : 0;
      if (c->head.expect_continue && c->body_need) {
        bufferevent_write(c->bev, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        conn_flush(c);
      }
      c->state = C_BODY;
      continue;
    }
    /* C_BODY */
    if (avail < c->body_need) break;
    evtimer_del(c->deadline);
    const char *body = c->body_need ? (const char *)evbuffer_pullup(in, (ev_ssize_t)c->body_need) : "";
    /* the body stays in the input buffer until dispatch has parsed it */
    size_t blen = c->body_need;
    dispatch(c, body, blen);
    evbuffer_drain(in, blen);
    /* dispatch either answered (state back to C_HEAD / C_CLOSING) or is
     * waiting for upstream (C_BUSY) */
  }
  c->in_process = 0;
  if (c->state == C_CLOSING && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) conn_free(c);
}

static void conn_read_cb(struct bufferevent *bev, void *arg) {
  (void)bev;
  hconn *c = arg;
  if (c->state == C_HEAD || c->state == C_BODY) conn_process(c);
}

static void conn_write_cb(struct bufferevent *bev, void *arg) {
  (void)bev;
  hconn *c = arg;
  bufferevent_disable(c->bev, EV_WRITE); /* drained: back to direct writes */
  if (c->state == C_CLOSING && !c->in_process) conn_free(c);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg) {
  (void)bev;
  hconn *c = arg;
  if (what & BEV_EVENT_TIMEOUT) { /* idle keep-alive connection */
    if (c->state == C_HEAD && evbuffer_get_length(bufferevent_get_input(c->bev)) == 0) {
      conn_free(c);
      return;
    }
    bufferevent_enable(c->bev, EV_READ);
    return;
  }
  if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
    if (c->state == C_HEAD || c->state == C_BODY) {
      /* a complete request may still sit in the buffer without an answer
       * only if it arrived with the FIN; a half-close client gets nothing */
    }
    conn_free(c);
  }
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg) {
  (void)l;
  (void)sa;
  (void)salen;
  eldr_server *s = arg;
  hconn *c = calloc(1, sizeof *c);
  if (!c) {
    evutil_closesocket(fd);
    return;
  }
  c->s = s;
  c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
  c->deadline = evtimer_new(s->base, conn_deadline_cb, c);
  if (!c->bev || !c->deadline) {
    if (c->bev) bufferevent_free(c->bev);
    else evutil_closesocket(fd);
    if (c->deadline) event_free(c->deadline);
    free(c);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->state = C_HEAD;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
  bufferevent_setwatermark(c->bev, EV_READ, 0, s->cfg.max_header + s->cfg.max_body + 65536);
  struct timeval idle = tv_of(s->cfg.idle_timeout_s);
  bufferevent_set_timeouts(c->bev, &idle, NULL);
  bufferevent_enable(c->bev, EV_READ); /* EV_WRITE only while output is pending */
}

/* ---- artifact, workers, reload --------------------------------------------- */

static int set_workers(eldr_server *s, const eldr_serve_config *cfg) {
  worker **nv[2] = {NULL, NULL};
  size_t nn[2] = {cfg->n_prefill, cfg->n_decode};
  char **urls[2] = {cfg->prefill, cfg->decode};
  for (int role = 0; role < 2; role++) {
    nv[role] = calloc(nn[role] ? nn[role] : 1, sizeof *nv[role]);
    if (!nv[role]) goto fail;
    for (size_t i = 0; i < nn[role]; i++) {
      worker *w = NULL;
      for (size_t j = 0; j < s->nw[role] && !w; j++)
        if (!strcmp(s->w[role][j]->url, urls[role][i])) w = s->w[role][j];
      for (size_t j = 0; j < i && w; j++) /* a URL listed twice gets two workers */
        if (nv[role][j] == w) w = NULL;
      if (!w) w = worker_new(s, urls[role][i], role);
      if (!w) goto fail;
      w->retired = 0;
      nv[role][i] = w;
    }
  }
  for (int role = 0; role < 2; role++) {
    for (size_t j = 0; j < s->nw[role]; j++) {
      worker *w = s->w[role][j];
      int kept = 0;
      for (size_t i = 0; i < nn[role]; i++) kept |= nv[role][i] == w;
      if (!kept) {
        w->retired = 1;
        w->healthy = 0;
        for (size_t i = 0; i < w->npool; i++) eldr__up_free(w->pool[i]);
        w->npool = 0;
      }
    }
    free(s->w[role]);
    s->w[role] = nv[role];
    s->nw[role] = nn[role];
  }
  return 0;
fail:
  free(nv[0]);
  free(nv[1]);
  return ELDR_ENOMEM;
}

/* Load and check an artifact against what the server knows. */
static int load_artifact(eldr_server *s, const char *path, eldr_artifact **out, eldr_diag *d) {
  *out = NULL;
  if (!path) return 0;
  eldr_artifact *a = NULL;
  int rc = eldr_artifact_load(path, &a, d);
  if (rc) return rc;
  if (a->repr == ELDR_REPR_GATE || a->repr == ELDR_REPR_LOGIT) {
    rc = eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                        "artifact %s uses the '%s' representation, which needs gate scores; vLLM's "
                        "routed_experts carry expert ids only (refit with count or binary)",
                        path, eldr_repr_name(a->repr));
    eldr_artifact_free(a);
    return rc;
  }
  if (s->sc.observed_L && ((int)a->shape.num_layers != s->sc.observed_L || (int)a->shape.top_k != s->sc.observed_K)) {
    rc = eldr_diag_fail(d, ELDR_ESHAPE,
                        "artifact %s is for %u MoE layers x top-%u but the workers' routed_experts "
                        "are %d layers x top-%d: refused",
                        path, a->shape.num_layers, a->shape.top_k, s->sc.observed_L, s->sc.observed_K);
    eldr_artifact_free(a);
    return rc;
  }
  *out = a;
  return 0;
}

/* Install artifact a (may be NULL) and the policy. */
static int install(eldr_server *s, eldr_artifact *a, const eldr_serve_config *cfg, eldr_diag *d) {
  double tau = cfg->tau >= 0 ? cfg->tau : a ? a->tau : 0.1;
  eldr_policy np;
  int rc = eldr_policy_init(&np, cfg->policy, tau, cfg->seed, a ? a->centroids : NULL, a ? a->k : 0,
                            a ? a->dim : 0, 1);
  if (rc) return eldr_diag_fail(d, rc, "policy %s cannot be initialised (tau %g)", eldr_policy_name(cfg->policy), tau);
  uint32_t *counts = NULL, *bs = NULL;
  float *sig = NULL;
  eldr_sigcache *cache = NULL;
  if (a) {
    size_t cells = eldr_shape_cells(&a->shape);
    counts = malloc(cells * sizeof *counts);
    bs = malloc(cells * sizeof *bs);
    sig = malloc((a->dim ? a->dim : 1) * sizeof *sig);
    if (cfg->sigcache_rows) {
      /* rows hold the masked layers only: keep them while shape and mask stay */
      if (s->cache && s->art && !memcmp(eldr_sigcache_shape(s->cache), &a->shape, sizeof a->shape) &&
          !memcmp(s->art->mask, a->mask, a->shape.num_layers)) {
        cache = s->cache;
      } else {
        cache = eldr_sigcache_new(&a->shape, cfg->sigcache_rows);
        if (cache && eldr_sigcache_set_layer_mask(cache, a->mask)) {
          eldr_sigcache_free(cache);
          cache = NULL;
        }
      }
    }
    if (!counts || !bs || !sig || (cfg->sigcache_rows && !cache)) {
      free(counts);
      free(bs);
      free(sig);
      if (cache != s->cache) eldr_sigcache_free(cache);
      return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the artifact's buffers");
    }
  }
  s->pend_on = 0; /* rows of the old shape: drop */
  if (s->cache != cache) eldr_sigcache_free(s->cache);
  s->cache = cache;
  free(s->sc.counts);
  free(s->sc.scratch);
  free(s->sc.sig);
  s->sc.counts = counts;
  s->sc.scratch = bs;
  s->sc.sig = sig;
  s->sc.cache = cache;
  eldr_artifact_free(s->art);
  s->art = a;
  s->sc.shape = a ? &a->shape : NULL;
  if (a) eldr_artifact_sigspec(a, &s->sc.spec);
  s->pol = np;
  s->logged_shape_mismatch = 0;
  if (a && a->k != cfg->n_decode)
    logf_(s, "artifact has %zu centroids for %zu decode workers: decoder i uses centroid i %% %zu",
          a->k, cfg->n_decode, a->k);
  return 0;
}

static void do_reload(eldr_server *s) {
  eldr_serve_config nc;
  eldr_diag d = {{0}};
  eldr_artifact *a = NULL;
  int rc = eldr_serve_config_copy(&nc, &s->cfg);
  if (rc) goto fail_nocfg;
  if (nc.config_path && (rc = eldr_serve_config_load(&nc, nc.config_path, &d))) goto fail;
  if ((rc = eldr_serve_config_validate(&nc, &d))) goto fail;
  if ((rc = load_artifact(s, nc.artifact, &a, &d))) goto fail;
  if ((rc = install(s, a, &nc, &d))) {
    eldr_artifact_free(a);
    goto fail;
  }
  if ((rc = set_workers(s, &nc))) goto fail;
  if (nc.port != s->cfg.port || strcmp(nc.host, s->cfg.host))
    logf_(s, "reload: listen address changes need a restart (still %s:%d)", s->cfg.host, s->port);
  nc.log = s->cfg.log;
  nc.log_ctx = s->cfg.log_ctx;
  eldr_serve_config_free(&s->cfg);
  s->cfg = nc;
  s->m.reloads_ok++;
  logf_(s, "reloaded: %zu prefill, %zu decode workers, artifact %s, policy %s", s->nw[0], s->nw[1],
        s->art ? s->cfg.artifact : "none", eldr_policy_name(s->cfg.policy));
  return;
fail:
  eldr_serve_config_free(&nc);
fail_nocfg:
  s->m.reloads_err++;
  logf_(s, "reload failed, keeping the running configuration: %s", eldr_diag_msg(&d, rc));
}

static void reload_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  do_reload(arg);
}

static void stop_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  event_base_loopexit(s->base, NULL);
}

/* ---- public API ------------------------------------------------------------ */

int eldr_server_new(const eldr_serve_config *cfg, eldr_server **out, eldr_diag *d) {
  *out = NULL;
  int rc = eldr_serve_config_validate(cfg, d);
  if (rc) return rc;
  static int threads_on;
  if (!threads_on) {
    evthread_use_pthreads();
    threads_on = 1;
  }
  signal(SIGPIPE, SIG_IGN);
  eldr_server *s = calloc(1, sizeof *s);
  if (!s) return ELDR_ENOMEM;
  if ((rc = eldr_serve_config_copy(&s->cfg, cfg))) {
    free(s);
    return rc;
  }
  s->idstate = cfg->seed ^ 0x5eed0fe1d7ull;
  static const double sig_b[HB] = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 1e-1};
  static const double req_b[HB] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5, 1, 5, 30};
  histo_init(&s->m.sig, sig_b);
  histo_init(&s->m.decision, sig_b);
  histo_init(&s->m.request, req_b);
  /* the changelist coalesces the EV_WRITE add/delete pairs of a loop
   * iteration into at most one epoll_ctl */
  struct event_config *ec = event_config_new();
  if (ec) {
    event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    s->base = event_base_new_with_config(ec);
    event_config_free(ec);
  }
  if (!s->base) s->base = event_base_new();
  if (!s->base) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "cannot create the event loop");
    goto fail;
  }
  eldr_artifact *a = NULL;
  if ((rc = load_artifact(s, cfg->artifact, &a, d))) goto fail;
  if ((rc = set_workers(s, cfg))) goto fail;
  if ((rc = install(s, a, cfg, d))) {
    eldr_artifact_free(a);
    goto fail;
  }
  eldr_policy_init(&s->jsq, ELDR_POLICY_JSQ, 0, cfg->seed, NULL, 0, 0, 1);
  /* listen */
  struct evutil_addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_NUMERICSERV;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", cfg->port);
  if (evutil_getaddrinfo(cfg->host, portstr, &hints, &ai) != 0 || !ai) {
    rc = eldr_diag_fail(d, ELDR_EINVAL, "cannot resolve listen address %s", cfg->host);
    goto fail;
  }
  s->lis = evconnlistener_new_bind(s->base, accept_cb, s,
                                   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                   1024, ai->ai_addr, (int)ai->ai_addrlen);
  evutil_freeaddrinfo(ai);
  if (!s->lis) {
    rc = eldr_diag_fail(d, ELDR_EIO, "cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(errno));
    goto fail;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(evconnlistener_get_fd(s->lis), (struct sockaddr *)&ss, &sl);
  s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
  s->ev_stop = event_new(s->base, -1, 0, stop_cb, s);
  s->ev_reload = event_new(s->base, -1, 0, reload_cb, s);
  s->ev_store = evtimer_new(s->base, store_cb, s);
  if (!s->ev_stop || !s->ev_reload || !s->ev_store) {
    rc = ELDR_ENOMEM;
    goto fail;
  }
  if (cfg->health_interval_s > 0) {
    s->ev_health = event_new(s->base, -1, EV_PERSIST, health_tick, s);
    struct timeval tv = tv_of(cfg->health_interval_s);
    if (!s->ev_health || event_add(s->ev_health, &tv)) {
      rc = ELDR_ENOMEM;
      goto fail;
    }
  }
  if (cfg->handle_signals) {
    s->sig_hup = evsignal_new(s->base, SIGHUP, reload_cb, s);
    s->sig_int = evsignal_new(s->base, SIGINT, stop_cb, s);
    s->sig_term = evsignal_new(s->base, SIGTERM, stop_cb, s);
    if (!s->sig_hup || !s->sig_int || !s->sig_term || event_add(s->sig_hup, NULL) ||
        event_add(s->sig_int, NULL) || event_add(s->sig_term, NULL)) {
      rc = ELDR_ENOMEM;
      goto fail;
    }
  }
  *out = s;
  return 0;
fail:
  eldr_server_free(s);
  return rc;
}

int eldr_server_port(const eldr_server *s) { return s ? s->port : -1; }

int eldr_server_run(eldr_server *s) {
  logf_(s, "eldr serve listening on %s:%d (%zu prefill, %zu decode workers, policy %s, artifact %s)",
        s->cfg.host, s->port, s->nw[0], s->nw[1], eldr_policy_name(s->cfg.policy),
        s->art ? s->cfg.artifact : "none");
  return event_base_dispatch(s->base) < 0 ? ELDR_EIO : 0;
}

void eldr_server_stop(eldr_server *s) {
  if (s && s->ev_stop) event_active(s->ev_stop, EV_TIMEOUT, 0);
}

void eldr_server_reload(eldr_server *s) {
  if (s && s->ev_reload) event_active(s->ev_reload, EV_TIMEOUT, 0);
}

void eldr_server_free(eldr_server *s) {
  if (!s) return;
  while (s->conns) conn_free(s->conns);
  if (s->lis) evconnlistener_free(s->lis);
  struct event *evs[] = {s->ev_stop, s->ev_reload, s->ev_health, s->sig_hup, s->sig_int, s->sig_term, s->ev_store};
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
    if (evs[i]) event_free(evs[i]);
  while (s->all_workers) {
    worker *w = s->all_workers;
    s->all_workers = w->next_all;
    worker_free(w);
  }
  free(s->w[0]);
  free(s->w[1]);
  /* run deferred connection frees */
  if (s->base) {
    for (int i = 0; i < 4; i++) event_base_loop(s->base, EVLOOP_NONBLOCK);
    event_base_free(s->base);
  }
  eldr_sigcache_free(s->cache);
  eldr_artifact_free(s->art);
  free(s->sc.counts);
  free(s->sc.scratch);
  free(s->sc.sig);
  eldr__sigctx_free_scratch(&s->sc);
  free(s->loads);
  free(s->healthy);
  eldr_serve_config_free(&s->cfg);
  free(s);
}
