/* fixture.c — see fixture.h. */
#include "support/fixture.h"

#include <math.h>

#include "eldr/artifact.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "eldr/clock.h"

double fx_now(void) { return eldr_clock_now(); }

const char *const fx_default_chunks[] = {
    "data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"Hello\"}]}\n\n",
    "data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\" wor",
    "ld\"}]}\n\ndata: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"!\",\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
};
const size_t fx_default_n_chunks = sizeof fx_default_chunks / sizeof fx_default_chunks[0];

struct fx_worker {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct event_base *base;
  struct evhttp *http;
  struct evhttp_bound_socket *bound; /* the listener (NULL once closed: keepalive_die) */
  struct event *ev_stop;
  int port;
  char url[64];
  fx_behaviour b;
  fx_record *rec;
  size_t nrec, caprec;
  struct evhttp_request **hung; /* loop thread only */
  size_t nhung, caphung;
  size_t stream_sent;            /* under mu */
  void **bigs;                   /* big_stream states, freed with the fixture (loop thread) */
  size_t nbigs, capbigs;
  struct evhttp_request **stall; /* streams held open (loop thread only) */
  size_t nstall, capstall;
  struct fx_conn *conns;         /* open connections with completions requests (loop thread only) */
  size_t nconns, capconns;
  size_t conns_seen;             /* under mu */
  int stopped;
};

/* A connection's completions requests answered so far (keepalive_requests). */
typedef struct fx_conn {
  struct evhttp_connection *c;
  size_t answered;
} fx_conn;

static void conn_closed(struct evhttp_connection *c, void *arg) {
  fx_worker *w = arg;
  for (size_t i = 0; i < w->nconns; i++)
    if (w->conns[i].c == c) {
      w->conns[i] = w->conns[--w->nconns];
      return;
    }
}

/* c's entry, made (and counted) the first time c carries a completions request. */
static fx_conn *conn_of(fx_worker *w, struct evhttp_connection *c) {
  for (size_t i = 0; i < w->nconns; i++)
    if (w->conns[i].c == c) return &w->conns[i];
  if (w->nconns == w->capconns) {
    w->capconns = w->capconns ? 2 * w->capconns : 16;
    w->conns = realloc(w->conns, w->capconns * sizeof *w->conns);
  }
  evhttp_connection_set_closecb(c, conn_closed, w);
  pthread_mutex_lock(&w->mu);
  w->conns_seen++;
  pthread_mutex_unlock(&w->mu);
  w->conns[w->nconns] = (fx_conn){c, 0};
  return &w->conns[w->nconns++];
}

/* End req's connection without a reply: a FIN, or (reset) a RST (connect
 * to AF_UNSPEC aborts a TCP connection and keeps the descriptor, which
 * libevent still owns and closes). */
static void drop_connection(struct evhttp_request *req, int reset) {
  int fd = bufferevent_getfd(evhttp_connection_get_bufferevent(evhttp_request_get_connection(req)));
  if (reset) {
    struct sockaddr un = {.sa_family = AF_UNSPEC};
    connect(fd, &un, sizeof un);
  } else {
    shutdown(fd, SHUT_RDWR);
  }
  evhttp_send_reply(req, 500, "X", NULL); /* fails on the dead socket; frees req */
}

static void record(fx_worker *w, struct evhttp_request *req, const char *path) {
  fx_record r;
  memset(&r, 0, sizeof r);
  enum evhttp_cmd_type t = evhttp_request_get_command(req);
  snprintf(r.method, sizeof r.method, "%s", t == EVHTTP_REQ_GET ? "GET" : t == EVHTTP_REQ_POST ? "POST" : "OTHER");
  snprintf(r.path, sizeof r.path, "%s", path);
  struct evkeyvalq *h = evhttp_request_get_input_headers(req);
  const char *v = evhttp_find_header(h, "X-Request-Id");
  if (v) snprintf(r.request_id, sizeof r.request_id, "%s", v);
  v = evhttp_find_header(h, "Authorization");
  if (v) snprintf(r.authorization, sizeof r.authorization, "%s", v);
  if ((v = evhttp_find_header(h, "traceparent"))) snprintf(r.traceparent, sizeof r.traceparent, "%s", v);
  if ((v = evhttp_find_header(h, "tracestate"))) snprintf(r.tracestate, sizeof r.tracestate, "%s", v);
  if ((v = evhttp_find_header(h, "baggage"))) snprintf(r.baggage, sizeof r.baggage, "%s", v);
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  r.body_len = evbuffer_get_length(in);
  r.body = malloc(r.body_len + 1);
  evbuffer_copyout(in, r.body, r.body_len);
  r.body[r.body_len] = 0;
  pthread_mutex_lock(&w->mu);
  if (w->nrec == w->caprec) {
    w->caprec = w->caprec ? 2 * w->caprec : 64;
    w->rec = realloc(w->rec, w->caprec * sizeof *w->rec);
  }
  w->rec[w->nrec++] = r;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void reply_json(struct evhttp_request *req, int status, json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT);
  struct evbuffer *b = evbuffer_new();
  evbuffer_add(b, s, strlen(s));
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
  evhttp_send_reply(req, status, "X", b);
  evbuffer_free(b);
  free(s);
  json_decref(o);
}

typedef struct stream_state {
  struct evhttp_request *req;
  struct event *ev;
} stream_state;

static void kill_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  stream_state *st = arg;
  struct evhttp_connection *c = evhttp_request_get_connection(st->req);
  struct bufferevent *bev = evhttp_connection_get_bufferevent(c);
  /* reset the connection mid-body: the router sees a truncated chunked reply */
  struct linger lg = {1, 0};
  setsockopt(bufferevent_getfd(bev), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  shutdown(bufferevent_getfd(bev), SHUT_RDWR);
  evhttp_send_reply_end(st->req); /* lets libevent notice and free the request */
  event_free(st->ev);
  free(st);
}

/* A stream_bytes stream: the next piece once the previous one was written. */
typedef struct big_stream {
  fx_worker *w;
  struct evhttp_request *req;
  size_t left;
} big_stream;

static void big_next(struct evhttp_connection *conn, void *arg) {
  (void)conn;
  big_stream *bs = arg;
  if (!bs->left) {
    if (bs->req) evhttp_send_reply_end(bs->req);
    bs->req = NULL; /* the state itself is freed with the fixture */
    return;
  }
  static char piece[65536];
  if (!piece[0]) { /* SSE events of 64 bytes */
    for (size_t i = 0; i < sizeof piece; i += 64) {
      memset(piece + i, 'x', 64);
      memcpy(piece + i, "data: ", 6);
      piece[i + 62] = '\n';
      piece[i + 63] = '\n';
    }
  }
  size_t n = bs->left < sizeof piece ? bs->left : sizeof piece;
  bs->left -= n;
  pthread_mutex_lock(&bs->w->mu);
  bs->w->stream_sent += n;
  pthread_mutex_unlock(&bs->w->mu);
  struct evbuffer *o = evbuffer_new();
  evbuffer_add(o, piece, n);
  evhttp_send_reply_chunk_with_cb(bs->req, o, big_next, bs);
  evbuffer_free(o);
}

size_t fx_stream_sent(fx_worker *w) {
  pthread_mutex_lock(&w->mu);
  size_t n = w->stream_sent;
  pthread_mutex_unlock(&w->mu);
  return n;
}

static void handle(struct evhttp_request *req, void *arg) {
  fx_worker *w = arg;
  const char *uri = evhttp_request_get_uri(req);
  char path[128];
  snprintf(path, sizeof path, "%s", uri);
  char *q = strchr(path, '?');
  if (q) *q = 0;
  record(w, req, path);
  pthread_mutex_lock(&w->mu);
  fx_behaviour b = w->b;
  pthread_mutex_unlock(&w->mu);
  if (!strcmp(path, "/health")) {
    evhttp_send_reply(req, b.health_status ? b.health_status : 200, "X", NULL);
    return;
  }
  if (!strcmp(path, "/metrics") && b.metrics_text) {
    struct evbuffer *o = evbuffer_new();
    evbuffer_add(o, b.metrics_text, strlen(b.metrics_text));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", o);
    evbuffer_free(o);
    return;
  }
  if (!strcmp(path, "/v1/models")) {
    reply_json(req, 200, json_pack("{s:s,s:[{s:s,s:s}]}", "object", "list", "data", "id", "fixture-model", "object", "model"));
    return;
  }
  if (strcmp(path, "/v1/completions") && strcmp(path, "/v1/chat/completions")) {
    evhttp_send_reply(req, 404, "Not Found", NULL);
    return;
  }
  if (b.hang) { /* answered only when the fixture stops */
    if (w->nhung == w->caphung) {
      w->caphung = w->caphung ? 2 * w->caphung : 16;
      w->hung = realloc(w->hung, w->caphung * sizeof *w->hung);
    }
    w->hung[w->nhung++] = req;
    return;
  }
  fx_conn *fc = conn_of(w, evhttp_request_get_connection(req));
  if (b.keepalive_requests > 0 && fc->answered >= (size_t)b.keepalive_requests) {
    if (b.keepalive_die && w->bound) {
      evhttp_del_accept_socket(w->http, w->bound);
      w->bound = NULL;
    }
    drop_connection(req, b.keepalive_reset);
    return;
  }
  fc->answered++;
  if (b.partial_reply) {
    int fd = bufferevent_getfd(evhttp_connection_get_bufferevent(evhttp_request_get_connection(req)));
    size_t n = strlen(b.partial_reply);
    if (send(fd, b.partial_reply, n, MSG_NOSIGNAL) != (ssize_t)n) fprintf(stderr, "fixture: partial reply not sent\n");
    drop_connection(req, 0);
    return;
  }
  if (b.close_without_reply) {
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evhttp_request_get_connection(req));
    struct linger lg = {1, 0};
    setsockopt(bufferevent_getfd(bev), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    shutdown(bufferevent_getfd(bev), SHUT_RDWR);
    evhttp_send_reply(req, 500, "X", NULL); /* fails on the dead socket; frees req */
    return;
  }
  if (b.raw_reply) {
    struct evbuffer *o = evbuffer_new();
    evbuffer_add(o, b.raw_reply, strlen(b.raw_reply));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, b.status ? b.status : 200, "X", o);
    evbuffer_free(o);
    return;
  }
  if (b.status && b.status != 200) {
    reply_json(req, b.status, json_pack("{s:{s:s,s:i}}", "error", "message", "fixture failure", "code", b.status));
    return;
  }
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t n = evbuffer_get_length(in);
  json_t *body = json_loadb((const char *)evbuffer_pullup(in, -1), n, 0, NULL);
  json_t *kv = json_object_get(body, "kv_transfer_params");
  int prefill = json_is_true(json_object_get(kv, "do_remote_decode"));
  int stream = json_is_true(json_object_get(body, "stream"));
  json_decref(body);
  if (prefill) {
    json_t *choice = json_pack("{s:i,s:s,s:s}", "index", 0, "text", "x", "finish_reason", "length");
    if (b.routed_experts) json_object_set_new(choice, "routed_experts", json_string(b.routed_experts));
    json_t *o = json_pack("{s:s,s:s,s:[o]}", "id", "cmpl-prefill", "object", "text_completion", "choices", choice);
    if (b.prompt_tokens >= 0) {
      json_t *u = json_pack("{s:I,s:i,s:I}", "prompt_tokens", (json_int_t)b.prompt_tokens, "completion_tokens", 1,
                            "total_tokens", (json_int_t)b.prompt_tokens + 1);
      if (b.cached_tokens >= 0)
        json_object_set_new(u, "prompt_tokens_details", json_pack("{s:I}", "cached_tokens", (json_int_t)b.cached_tokens));
      json_object_set_new(o, "usage", u);
    }
    if (!b.no_kv_params)
      json_object_set_new(o, "kv_transfer_params",
                          json_pack("{s:b,s:b,s:s,s:[i,i,i],s:s,s:i,s:i}", "do_remote_prefill", 1,
                                    "do_remote_decode", 0, "remote_engine_id", w->url,
                                    "remote_block_ids", 3, 5, 8, "remote_host", "127.0.0.1",
                                    "remote_port", w->port, "tp_size", 1));
    reply_json(req, 200, o);
    return;
  }
  if (stream && b.stream_bytes) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/event-stream");
    evhttp_send_reply_start(req, 200, "OK");
    big_stream *bs = calloc(1, sizeof *bs);
    if (w->nbigs == w->capbigs) {
      w->capbigs = w->capbigs ? 2 * w->capbigs : 8;
      w->bigs = realloc(w->bigs, w->capbigs * sizeof *w->bigs);
    }
    w->bigs[w->nbigs++] = bs;
    bs->w = w;
    bs->req = req;
    bs->left = b.stream_bytes;
    big_next(NULL, bs);
    return;
  }
  if (stream) {
    const char *const *ch = b.chunks ? b.chunks : fx_default_chunks;
    size_t nc = b.chunks ? b.n_chunks : fx_default_n_chunks;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/event-stream");
    evhttp_send_reply_start(req, 200, "OK");
    size_t upto = b.die_after_chunks > 0 && (size_t)b.die_after_chunks < nc ? (size_t)b.die_after_chunks : nc;
    for (size_t i = 0; i < upto; i++) {
      struct evbuffer *o = evbuffer_new();
      evbuffer_add(o, ch[i], strlen(ch[i]));
      evhttp_send_reply_chunk(req, o);
      evbuffer_free(o);
    }
    if (b.stall_after_chunks > 0 && (size_t)b.stall_after_chunks < nc) {
      for (size_t i = 0; i < (size_t)b.stall_after_chunks; i++) {
        struct evbuffer *o = evbuffer_new();
        evbuffer_add(o, ch[i], strlen(ch[i]));
        evhttp_send_reply_chunk(req, o);
        evbuffer_free(o);
      }
      /* held: ended when the fixture stops (libevent detaches it from its
       * connection if the client leaves; ending it then frees it) */
      if (w->nstall == w->capstall) {
        w->capstall = w->capstall ? 2 * w->capstall : 16;
        w->stall = realloc(w->stall, w->capstall * sizeof *w->stall);
      }
      w->stall[w->nstall++] = req;
      return;
    }
    if (upto < nc) { /* die once the chunks are on the wire */
      stream_state *st = calloc(1, sizeof *st);
      st->req = req;
      st->ev = evtimer_new(w->base, kill_cb, st);
      struct timeval tv = {0, 20000};
      evtimer_add(st->ev, &tv);
      return;
    }
    evhttp_send_reply_end(req);
    return;
  }
  json_t *choice = json_pack("{s:i,s:s,s:s}", "index", 0, "text", "Hello world!", "finish_reason", "stop");
  if (b.decode_routed_experts) json_object_set_new(choice, "routed_experts", json_string(b.decode_routed_experts));
  reply_json(req, 200, json_pack("{s:s,s:s,s:[o],s:i}", "id", "cmpl-decode", "object", "text_completion",
                                 "choices", choice, "served_by", w->port));
}

static void stop_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  fx_worker *w = arg;
  /* a request whose client left is detached by libevent but still ours: a
   * reply frees it (and is sent if the client is still there) */
  for (size_t i = 0; i < w->nhung; i++) evhttp_send_reply(w->hung[i], 503, "Stopping", NULL);
  w->nhung = 0;
  for (size_t i = 0; i < w->nstall; i++) evhttp_send_reply_end(w->stall[i]);
  w->nstall = 0;
  for (size_t i = 0; i < w->nbigs; i++) { /* stream_bytes streams still going: likewise */
    big_stream *bs = w->bigs[i];
    if (bs->req) evhttp_send_reply_end(bs->req);
    bs->req = NULL;
    bs->left = 0;
  }
  event_base_loopexit(w->base, NULL);
}

static void *fx_thread(void *arg) {
  fx_worker *w = arg;
  event_base_dispatch(w->base);
  return NULL;
}

fx_worker *fx_start(const fx_behaviour *b) { return fx_start_port(b, 0); }

fx_worker *fx_start_port(const fx_behaviour *b, int port) { return fx_start_addr(b, "127.0.0.1", port); }

fx_worker *fx_start_addr(const fx_behaviour *b, const char *addr, int port) {
  static int threads_on;
  if (!threads_on) {
    evthread_use_pthreads();
    signal(SIGPIPE, SIG_IGN); /* libevent's writes to a client that left */
    threads_on = 1;
  }
  fx_worker *w = calloc(1, sizeof *w);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  if (b) w->b = *b;
  else {
    w->b.prompt_tokens = -1;
    w->b.cached_tokens = -1;
  }
  w->base = event_base_new();
  w->http = evhttp_new(w->base);
  evhttp_set_gencb(w->http, handle, w);
  evhttp_set_allowed_methods(w->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
  struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(w->http, addr, (ev_uint16_t)port);
  if (!bs) {
    fx_free(w);
    return NULL;
  }
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&sa, &sl);
  w->bound = bs;
  w->port = ntohs(sa.sin_port);
  snprintf(w->url, sizeof w->url, "http://%s:%d", addr, w->port);
  w->ev_stop = event_new(w->base, -1, 0, stop_cb, w);
  pthread_create(&w->th, NULL, fx_thread, w);
  return w;
}

void fx_stop(fx_worker *w) {
  if (!w || w->stopped) return;
  event_active(w->ev_stop, EV_TIMEOUT, 0);
  pthread_join(w->th, NULL);
  evhttp_free(w->http); /* closes the listener and every connection */
  w->http = NULL;
  w->stopped = 1;
}

void fx_free(fx_worker *w) {
  if (!w) return;
  fx_stop(w);
  if (w->ev_stop) event_free(w->ev_stop);
  if (w->http) evhttp_free(w->http);
  event_base_free(w->base);
  for (size_t i = 0; i < w->nrec; i++) free(w->rec[i].body);
  free(w->rec);
  free(w->hung);
  free(w->stall);
  free(w->conns);
  for (size_t i = 0; i < w->nbigs; i++) free(w->bigs[i]);
  free(w->bigs);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

int fx_port(const fx_worker *w) { return w->port; }
const char *fx_url(const fx_worker *w) { return w->url; }

void fx_set(fx_worker *w, const fx_behaviour *b) {
  pthread_mutex_lock(&w->mu);
  w->b = *b;
  pthread_mutex_unlock(&w->mu);
}

static size_t count_locked(fx_worker *w, const char *path) {
  size_t n = 0;
  for (size_t i = 0; i < w->nrec; i++) n += !path || !strcmp(w->rec[i].path, path);
  return n;
}

size_t fx_connections(fx_worker *w) {
  pthread_mutex_lock(&w->mu);
  size_t n = w->conns_seen;
  pthread_mutex_unlock(&w->mu);
  return n;
}

size_t fx_count(fx_worker *w, const char *path) {
  pthread_mutex_lock(&w->mu);
  size_t n = count_locked(w, path);
  pthread_mutex_unlock(&w->mu);
  return n;
}

int fx_wait(fx_worker *w, const char *path, size_t n, double timeout_s) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  double t = dl.tv_sec + dl.tv_nsec * 1e-9 + timeout_s;
  dl.tv_sec = (time_t)t;
  dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
  pthread_mutex_lock(&w->mu);
  int rc = 0;
  while (count_locked(w, path) < n) {
    if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT) {
      rc = count_locked(w, path) >= n ? 0 : -1;
      break;
    }
  }
  pthread_mutex_unlock(&w->mu);
  return rc;
}

int fx_get(fx_worker *w, const char *path, long i, fx_record *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&w->mu);
  long k = -1, want = i;
  if (i < 0) want = (long)count_locked(w, path) - 1;
  int rc = -1;
  for (size_t j = 0; j < w->nrec; j++) {
    if (path && strcmp(w->rec[j].path, path)) continue;
    if (++k == want) {
      *out = w->rec[j];
      out->body = malloc(out->body_len + 1);
      memcpy(out->body, w->rec[j].body, out->body_len + 1);
      rc = 0;
      break;
    }
  }
  pthread_mutex_unlock(&w->mu);
  return rc;
}

void fx_record_free(fx_record *r) {
  free(r->body);
  r->body = NULL;
}

/* ---- test client ---------------------------------------------------------- */

void tc_free(tc_resp *r) {
  free(r->head);
  free(r->body);
  memset(r, 0, sizeof *r);
}

int tc_header(const tc_resp *r, const char *name, char *buf, size_t cap) {
  if (!r->head) return -1;
  size_t nl = strlen(name);
  const char *p = strchr(r->head, '\n');
  while (p && *++p) {
    if (!strncasecmp(p, name, nl) && p[nl] == ':') {
      const char *v = p + nl + 1;
      while (*v == ' ') v++;
      size_t n = strcspn(v, "\r\n");
      if (n >= cap) n = cap - 1;
      memcpy(buf, v, n);
      buf[n] = 0;
      return 0;
    }
    p = strchr(p, '\n');
  }
  return -1;
}

/* Read until the predicate on the buffer is satisfied, EOF or the deadline. */
static int read_more(int fd, char **buf, size_t *len, size_t *cap, double deadline, int *eof) {
  if (*len + 65536 > *cap) {
    *cap = (*len + 65536) * 2;
    *buf = realloc(*buf, *cap);
  }
  double left = deadline - fx_now();
  if (left <= 0) return -1;
  struct pollfd pf = {fd, POLLIN, 0};
  int pr = poll(&pf, 1, (int)(left * 1000) + 1);
  if (pr <= 0) return -1;
  ssize_t n = recv(fd, *buf + *len, *cap - *len - 1, 0);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return 0;
    *eof = 1; /* reset counts as close */
    return 0;
  }
  if (n == 0) *eof = 1;
  *len += (size_t)n;
  (*buf)[*len] = 0;
  return 0;
}

int tc_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int tc_send_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

int tc_raw(int port, const char *raw, size_t len, double timeout_s, tc_resp *out) {
  memset(out, 0, sizeof *out);
  int fd = tc_connect(port);
  if (fd < 0) return -1;
  size_t off = 0;
  while (off < len) {
    ssize_t n = send(fd, raw + off, len - off, MSG_NOSIGNAL);
    if (n <= 0) break; /* the server may answer and close early (e.g. 413) */
    off += (size_t)n;
  }
  double deadline = fx_now() + timeout_s;
  char *buf = NULL;
  size_t bl = 0, cap = 0;
  int eof = 0, rc = -1;
  char *he = NULL;
  while (!(he = strstr(buf ? buf : "", "\r\n\r\n"))) {
    if (eof || read_more(fd, &buf, &bl, &cap, deadline, &eof)) goto out;
  }
  size_t hl = (size_t)(he - buf) + 4;
  out->head = malloc(hl + 1);
  memcpy(out->head, buf, hl);
  out->head[hl] = 0;
  if (sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1) goto out;
  char v[64];
  long long clen = -1;
  if (tc_header(out, "Content-Length", v, sizeof v) == 0) clen = atoll(v);
  if (out->status == 204 || out->status == 304) clen = 0; /* never a body */
  out->chunked = tc_header(out, "Transfer-Encoding", v, sizeof v) == 0 && !strcasecmp(v, "chunked");
  if (out->chunked) {
    size_t pos = hl;
    char *body = malloc(1);
    size_t blen = 0;
    for (;;) {
      /* offsets, not pointers: read_more may move buf (realloc) */
      char *le;
      while (!(le = strstr(buf + pos, "\r\n"))) {
        if (eof || read_more(fd, &buf, &bl, &cap, deadline, &eof)) {
          free(body);
          goto out;
        }
      }
      size_t sz = strtoul(buf + pos, NULL, 16);
      size_t data = (size_t)(le - buf) + 2, need = data + sz + 2;
      while (bl < need) {
        if (eof || read_more(fd, &buf, &bl, &cap, deadline, &eof)) {
          free(body);
          goto out;
        }
      }
      if (sz == 0) break;
      body = realloc(body, blen + sz + 1);
      memcpy(body + blen, buf + data, sz);
      blen += sz;
      pos = need;
    }
    body[blen] = 0;
    out->body = body;
    out->body_len = blen;
  } else if (clen >= 0) {
    while (bl < hl + (size_t)clen)
      if (eof || read_more(fd, &buf, &bl, &cap, deadline, &eof)) goto out;
    out->body = malloc((size_t)clen + 1);
    memcpy(out->body, buf + hl, (size_t)clen);
    out->body[clen] = 0;
    out->body_len = (size_t)clen;
  } else { /* until close */
    while (!eof)
      if (read_more(fd, &buf, &bl, &cap, deadline, &eof)) goto out;
    out->body_len = bl - hl;
    out->body = malloc(out->body_len + 1);
    memcpy(out->body, buf + hl, out->body_len);
    out->body[out->body_len] = 0;
  }
  /* did the server close? (short wait: the close follows the response at once) */
  if (!eof && tc_header(out, "Connection", v, sizeof v) == 0 && !strcasecmp(v, "close")) {
    double dl2 = fx_now() + 2.0;
    while (!eof && read_more(fd, &buf, &bl, &cap, dl2, &eof) == 0) {
    }
  }
  out->closed = eof;
  rc = 0;
out:
  free(buf);
  close(fd);
  if (rc) tc_free(out);
  return rc;
}

int tc_post(int port, const char *path, const char *body, const char *extra, tc_resp *out) {
  return tc_post_within(port, path, body, extra, 20, out);
}

int tc_post_within(int port, const char *path, const char *body, const char *extra, double timeout_s,
                   tc_resp *out) {
  size_t bl = strlen(body);
  size_t cap = bl + strlen(path) + (extra ? strlen(extra) : 0) + 256;
  char *raw = malloc(cap);
  int n = snprintf(raw, cap,
                   "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\n%s\r\n%s",
                   path, bl, extra ? extra : "", body);
  int rc = tc_raw(port, raw, (size_t)n, timeout_s, out);
  free(raw);
  return rc;
}

int tc_get(int port, const char *path, tc_resp *out) {
  char raw[512];
  int n = snprintf(raw, sizeof raw, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
  return tc_raw(port, raw, (size_t)n, 20, out);
}

/* ---- router in a thread ---------------------------------------------------- */

static void rt_log(void *ctx, const char *line) {
  rt_router *r = ctx;
  pthread_mutex_lock(&r->log_mu);
  int n = snprintf(r->log + r->loglen, sizeof r->log - r->loglen, "%s\n", line);
  if (n > 0 && r->loglen + (size_t)n < sizeof r->log) r->loglen += (size_t)n;
  pthread_mutex_unlock(&r->log_mu);
}

const char *rt_log_text(rt_router *r) {
  pthread_mutex_lock(&r->log_mu);
  memcpy(r->log_copy, r->log, sizeof r->log);
  pthread_mutex_unlock(&r->log_mu);
  r->log_copy[sizeof r->log_copy - 1] = 0;
  return r->log_copy;
}

static void *rt_thread(void *arg) {
  rt_router *r = arg;
  eldr_server_run(r->srv);
  return NULL;
}

int tc_send_raw(int port, const char *req) {
  int fd = tc_connect(port);
  if (fd < 0) return -1;
  if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
    close(fd);
    return -1;
  }
  return fd;
}

void tc_read_until(int fd, char *buf, size_t cap, const char *until) {
  size_t got = 0;
  buf[0] = 0;
  double dl = fx_now() + 10;
  while (!strstr(buf, until) && fx_now() < dl) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 200) <= 0) continue;
    ssize_t k = recv(fd, buf + got, cap - 1 - got, 0);
    if (k <= 0) break;
    got += (size_t)k;
    buf[got] = 0;
  }
}

int rt_start(rt_router *r, eldr_serve_config *cfg) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->log_mu, NULL);
  cfg->port = 0;
  cfg->log = rt_log;
  cfg->log_ctx = r;
  eldr_diag d = {{0}};
  int rc = eldr_server_new(cfg, &r->srv, &d);
  if (rc) {
    fprintf(stderr, "rt_start: %s\n", eldr_diag_msg(&d, rc));
    return rc;
  }
  r->port = eldr_server_port(r->srv);
  pthread_t *t = malloc(sizeof *t);
  pthread_create(t, NULL, rt_thread, r);
  r->thread = t;
  return 0;
}

void rt_join(rt_router *r) {
  if (!r->srv || !r->thread) return;
  eldr_server_stop(r->srv);
  pthread_join(*(pthread_t *)r->thread, NULL);
  free(r->thread);
  r->thread = NULL;
}

void rt_stop(rt_router *r) {
  if (!r->srv) return;
  rt_join(r);
  eldr_server_free(r->srv);
  r->srv = NULL;
}

double rt_metric(int port, const char *series) {
  tc_resp m;
  if (tc_get(port, "/metrics", &m) || m.status != 200) {
    tc_free(&m);
    return -1;
  }
  double v = -1;
  size_t sl = strlen(series);
  for (const char *p = m.body; p && *p;) {
    if (!strncmp(p, series, sl) && p[sl] == ' ') {
      v = atof(p + sl + 1);
      break;
    }
    p = strchr(p, '\n');
    if (p) p++;
  }
  tc_free(&m);
  return v;
}

int rt_wait_metric(int port, const char *series, double v, double timeout_s) {
  double dl = fx_now() + timeout_s;
  while (fx_now() < dl) {
    if (rt_metric(port, series) >= v) return 0;
    struct pollfd none;
    poll(&none, 0, 5); /* polling interval of a condition wait, not a timing assumption */
  }
  return -1;
}

int rt_wait_metric_le(int port, const char *series, double v, double timeout_s) {
  double dl = fx_now() + timeout_s;
  while (fx_now() < dl) {
    double x = rt_metric(port, series);
    if (x >= 0 && x <= v) return 0;
    struct pollfd none;
    poll(&none, 0, 5);
  }
  return -1;
}

char *fx_artifact(const eldr_shape *s, const char *tag) {
  eldr_artifact *a = eldr_artifact_new("fixture", s, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  if (!a) abort();
  for (size_t c = 0; c < 2; c++)
    for (size_t l = 0; l < s->num_layers; l++)
      for (size_t e = 0; e < s->num_experts; e++)
        a->centroids[c * a->dim + l * s->num_experts + e] = (e / (s->num_experts / 2) == c) ? 1.0f : 0.0f;
  for (size_t c = 0; c < 2; c++) {
    double n = 0;
    for (size_t j = 0; j < a->dim; j++) n += a->centroids[c * a->dim + j] * a->centroids[c * a->dim + j];
    for (size_t j = 0; j < a->dim; j++) a->centroids[c * a->dim + j] /= (float)sqrt(n);
    a->cluster_sizes[c] = 1;
  }
  a->tau = 0.1;
  a->fit_n = 2;
  a->fit_balanced = 1;
  char *path = malloc(256);
  if (!path) abort();
  snprintf(path, 256, "/tmp/eldr_test_%d_%s.json", (int)getpid(), tag);
  eldr_diag d = {{0}};
  if (eldr_artifact_save(path, a, &d)) abort();
  eldr_artifact_free(a);
  return path;
}
