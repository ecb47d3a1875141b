/* conn.c — the router's client side: connections accepted on the listening
 * socket, HTTP/1.1 request heads and bodies read with eldr's own bounded
 * parser (every malformed, oversized or slow request gets a JSON 4xx),
 * dispatch by path, and responses written straight to the socket (whole, or
 * streamed chunked). Keep-alive and pipelining. The socket is read with
 * recv into an input buffer and the head parsed into a head struct, both
 * the loop's spares (bufpool.h) lent while a request's bytes wait: an idle
 * connection holds neither (no allocation, no FIONREAD per read); output
 * goes to the socket at once and only what it did not take waits in an
 * evbuffer for EV_WRITE. Loop thread only. */
#include <event2/buffer.h>
#include <event2/listener.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

/* ---- client responses ----------------------------------------------------- */

static void conn_process(hconn *c);

static const char *reason(int st) {
  switch (st) {
  case 200: return "OK";
  case 204: return "No Content";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
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
  default: return st < 300 ? "OK" : st < 500 ? "Bad Request" : "Internal Server Error";
  }
}

/* CORS (cfg.cors_origin): "*" allows any origin; a list allows its
 * members, echoed with Vary: Origin. Nothing without an Origin header. */
static int cors_allowed(const hconn *c) {
  const char *list = c->s->cfg.cors_origin, *o = c->origin;
  if (!list || !o || !o[0]) return 0;
  if (!strcmp(list, "*")) return 1;
  size_t ol = strlen(o);
  for (const char *p = list; *p;) {
    while (*p == ' ' || *p == ',') p++;
    const char *e = p;
    while (*e && *e != ',' && *e != ' ') e++;
    if ((size_t)(e - p) == ol && !memcmp(p, o, ol)) return 1;
    p = e;
  }
  return 0;
}

/* The response head into buf[0..cap): its length, or 0 when it does not
 * fit (with cap >= head_bound(...) it always does). */
static size_t head_bound(const hconn *c, int status, const char *ctype, const char *extra) {
  const char *rid = !c->r ? "" : c->r->client_reqid[0] ? c->r->client_reqid : c->r->reqid;
  return 256 + strlen(reason(status)) + strlen(ctype ? ctype : "application/json") + strlen(rid) +
         (extra ? strlen(extra) : 0) + (c->origin ? strlen(c->origin) : 0);
}

static size_t format_head(const hconn *c, int status, const char *ctype, long long clen, const char *extra,
                          char *buf, size_t cap) {
  if (head_bound(c, status, ctype, extra) > cap) return 0;
  const char *rid = !c->r ? "" : c->r->client_reqid[0] ? c->r->client_reqid : c->r->reqid;
  char *w = buf;
  w = ELDR__PUT_LIT(w, "HTTP/1.1 ");
  w = eldr__put_u64(w, (uint64_t)(status > 0 ? status : 0));
  *w++ = ' ';
  w = eldr__puts(w, reason(status));
  w = ELDR__PUT_LIT(w, "\r\nContent-Type: ");
  w = eldr__puts(w, ctype ? ctype : "application/json");
  w = ELDR__PUT_LIT(w, "\r\n");
  if (clen >= 0 && status != 204) {
    w = ELDR__PUT_LIT(w, "Content-Length: ");
    w = eldr__put_u64(w, (uint64_t)clen);
    w = ELDR__PUT_LIT(w, "\r\n");
  }
  if (rid[0]) w = ELDR__PUT_LIT(eldr__puts(ELDR__PUT_LIT(w, "X-Request-Id: "), rid), "\r\n");
  if (extra) w = eldr__puts(w, extra);
  if (cors_allowed(c)) {
    if (!strcmp(c->s->cfg.cors_origin, "*")) w = ELDR__PUT_LIT(w, "Access-Control-Allow-Origin: *\r\n");
    else w = ELDR__PUT_LIT(eldr__puts(ELDR__PUT_LIT(w, "Access-Control-Allow-Origin: "), c->origin), "\r\nVary: Origin\r\n");
    w = ELDR__PUT_LIT(w, "Access-Control-Expose-Headers: X-Request-Id\r\n");
  }
  if (c->keep_alive) w = ELDR__PUT_LIT(w, "Connection: keep-alive\r\n\r\n");
  else w = ELDR__PUT_LIT(w, "Connection: close\r\n\r\n");
  return (size_t)(w - buf);
}

static void write_head(hconn *c, int status, const char *ctype, long long clen,
                       const char *extra) {
  struct evbuffer *o = c->out;
  size_t need = head_bound(c, status, ctype, extra);
  struct evbuffer_iovec v;
  if (evbuffer_reserve_space(o, (ev_ssize_t)need, &v, 1) < 1) return; /* out of memory: the client times out */
  v.iov_len = format_head(c, status, ctype, clen, extra, v.iov_base, need);
  evbuffer_commit_space(o, &v, 1);
}

/* Write queued output now; EV_WRITE only while the socket does not take
 * it all (an error is left to the write callback, which closes). */
static void conn_flush(hconn *c) {
  while (evbuffer_get_length(c->out) > 0)
    if (evbuffer_write(c->out, c->fd) <= 0) break;
  if (evbuffer_get_length(c->out) > 0) event_add(c->wev, NULL);
}

static void conn_process(hconn *c);

/* Reading on (again) unless closing or the input bound is reached. */
static void read_resume(hconn *c) {
  if (!c->rsusp || c->state == C_CLOSING) return;
  c->rsusp = 0;
  event_add(c->rev, NULL);
}

/* The deadline as the idle keep-alive bound (a new request may come). */
static void arm_idle(hconn *c, double seconds) {
  struct timeval tv = eldr__tv_of(seconds);
  c->dl_idle = 1;
  evtimer_add(c->deadline, &tv);
}

/* The response is complete: next request or close. */
static void conn_finish(hconn *c) {
  if (c->r) {
    rq *r = c->r;
    c->r = NULL;
    r->c = NULL;
    eldr__rq_free(r);
  }
  if (!c->keep_alive) {
    c->state = C_CLOSING;
    event_del(c->rev);
    if (!c->in_process && evbuffer_get_length(c->out) == 0) eldr__conn_free(c);
    return; /* write callback frees once flushed */
  }
  free(c->origin); /* the response is out: its request's Origin is done with */
  c->origin = NULL;
  c->state = C_HEAD;
  c->resp_chunked = 0;
  arm_idle(c, c->s->cfg.idle_timeout_s);
  read_resume(c);
  if (!c->in_process && c->in.n > c->inoff) conn_process(c);
}

/* A whole response on a connection with nothing queued: head (from the
 * stack) and body in one sendmsg, no copy into the output buffer; only
 * what the socket did not take is queued. 0, or -1: not written (the head
 * does not fit the stack buffer, or output is pending). */
static int send_direct(hconn *c, int status, const char *ctype, const void *body, size_t len, const char *extra) {
  struct evbuffer *o = c->out;
  char head[2048];
  size_t hn;
  if (evbuffer_get_length(o) || !(hn = format_head(c, status, ctype, (long long)len, extra, head, sizeof head)))
    return -1;
  size_t bn = !c->head_only ? len : 0;
  struct iovec iov[2] = {{head, hn}, {(void *)body, bn}};
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = bn ? 2 : 1};
  ssize_t w;
  do w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  size_t done = w > 0 ? (size_t)w : 0; /* an error: queued, the write callback sees it */
  if (done < hn + bn) {
    if (done < hn) evbuffer_add(o, head + done, hn - done);
    size_t bdone = done > hn ? done - hn : 0;
    if (bn > bdone) evbuffer_add(o, (const char *)body + bdone, bn - bdone);
    event_add(c->wev, NULL);
  }
  return 0;
}

void eldr__send_body(hconn *c, int status, const char *ctype, const void *body, size_t len,
                      const char *extra) {
  if (send_direct(c, status, ctype, body, len, extra) == 0) {
    conn_finish(c);
    return;
  }
  write_head(c, status, ctype, (long long)len, extra);
  if (!c->head_only && len) evbuffer_add(c->out, body, len);
  conn_flush(c);
  conn_finish(c);
}

void eldr__send_error(hconn *c, int status, const char *type, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t len = 0;
  char *j = eldr__error_json(status, type, msg, &len);
  const char *path = c->head ? c->head->path : ""; /* 405s are answered from dispatch: the head is there */
  eldr__send_body(c, status, "application/json", j ? j : "{}", j ? len : 2,
            status == 405 ? (path[0] && !strcmp(path, "/health")
                                 ? "Allow: GET, HEAD\r\n"
                                 : (!strcmp(path, "/metrics") || !strcmp(path, "/v1/models") ||
                                  !strcmp(path, "/eldr/status"))
                                       ? "Allow: GET\r\n"
                                       : "Allow: POST\r\n")
                          : NULL);
  free(j);
}

void eldr__stream_start(hconn *c, int status, const char *ctype) {
  if (c->minor >= 1) {
    c->resp_chunked = 1;
    write_head(c, status, ctype, -1, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n");
  } else {
    c->resp_chunked = 2;
    c->keep_alive = 0;
    write_head(c, status, ctype, -1, "Cache-Control: no-cache\r\n");
  }
}

/* A streamed chunk goes from the worker's read buffer to the client's
 * socket in one sendmsg (its size line built on the stack, the data where
 * it lies: no copy, no allocation per chunk), as a whole response does;
 * only what the socket does not take, or a chunk behind bytes still
 * queued, waits in the output evbuffer. */
void eldr__stream_chunk(hconn *c, const char *p, size_t n) {
  if (!n) return;
  struct evbuffer *o = c->out;
  char line[24], *w = line + sizeof line;
  if (c->resp_chunked == 1) { /* the chunk's size line, in hex */
    *--w = '\n';
    *--w = '\r';
    size_t v = n;
    do *--w = "0123456789abcdef"[v & 15], v >>= 4;
    while (v);
  }
  const size_t ln = (size_t)(line + sizeof line - w), tn = c->resp_chunked == 1 ? 2 : 0;
  struct iovec iov[3] = {{w, ln}, {(void *)p, n}, {(void *)"\r\n", tn}};
  size_t done = 0;
  if (!evbuffer_get_length(o)) {
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = tn ? 3 : 2};
    ssize_t sent;
    do sent = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    done = sent > 0 ? (size_t)sent : 0; /* an error: queued, the write callback sees it */
    if (done == ln + n + tn) return;
  }
  for (int i = 0; i < 3; i++) { /* what is left, in order */
    size_t len = iov[i].iov_len, skip = done < len ? done : len;
    done -= skip;
    if (len > skip) evbuffer_add(o, (const char *)iov[i].iov_base + skip, len - skip);
  }
  conn_flush(c);
}

size_t eldr__conn_pending(hconn *c) { return evbuffer_get_length(c->out); }

void eldr__stream_end(hconn *c) {
  if (c->resp_chunked == 1) evbuffer_add(c->out, "0\r\n\r\n", 5);
  conn_flush(c);
  conn_finish(c);
}

/* ---- client connections --------------------------------------------------- */

/* An idle keep-alive connection holds no request head and no input buffer:
 * both are the loop's spares (bufpool.h), taken when a request's bytes
 * arrive and given back once its head is dispatched and its bytes are all
 * consumed (nginx does the same with its header buffers). A loop keeps at
 * most HEAD_SPARES heads and INBUF_SPARES input buffers for the next
 * requests: a few hundred KiB, whatever the number of connections. */
#define INBUF 16384
#define HEAD_SPARES 32
#define INBUF_SPARES 64

void eldr__conn_spares_init(eldr_server *s) {
  eldr__spares_init(&s->heads, sizeof(eldr__http_head), HEAD_SPARES);
  eldr__spares_init(&s->inbufs, INBUF, INBUF_SPARES);
}

static void head_release(hconn *c) {
  eldr__spares_give(&c->s->heads, c->head);
  c->head = NULL;
}

/* The input buffer back to the loop (one grown for a large body is freed). */
static void in_release(hconn *c) {
  if (c->in.cap == INBUF) eldr__spares_give(&c->s->inbufs, c->in.p);
  else free(c->in.p);
  c->in = (eldr__buf){0};
  c->inoff = 0;
}

void eldr__conn_free(hconn *c) {
  eldr_server *s = c->s;
  if (c->r) {
    rq *r = c->r;
    c->r = NULL;
    eldr__rq_abort(r);
  }
  if (c->refusing) s->nrefusing--;
  else s->nconns--;
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  if (c->deadline) event_free(c->deadline);
  if (c->cbody) evbuffer_free(c->cbody);
  event_free(c->rev);
  event_free(c->wev);
  evbuffer_free(c->out);
  evutil_closesocket(c->fd);
  head_release(c);
  in_release(c);
  free(c->origin);
  free(c);
  eldr__fd_reserve_closed(s); /* an fd came free: a paused listener may take the next client */
}

static void dispatch(hconn *c, const char *body, size_t len) {
  eldr_server *s = c->s;
  const char *p = c->head->path;
  eldr__method m = c->head->method;
  int known = 1;
  c->state = C_BUSY;
  if (c->unauth) { /* the body was read (framing kept), never looked at */
    eldr__auth_refuse(c);
    return;
  }
  c->head_only = m == ELDR__M_HEAD;
  if (!strcmp(p, "/v1/completions") || !strcmp(p, "/v1/chat/completions")) {
    if (m != ELDR__M_POST) goto bad_method;
    eldr__handle_completion(c, p[4] == 'c' && p[5] == 'h' ? ELDR__API_CHAT : ELDR__API_COMPLETIONS, body, len);
    return;
  }
  if (!strcmp(p, "/generate")) { /* SGLang's native API: its PD flows only */
    if (m != ELDR__M_POST) goto bad_method;
    if (s->cfg.pd == ELDR_PD_VLLM) {
      s->m.bad[BAD_PATH]++;
      eldr__send_error(c, 404, "invalid_request_error", "/generate (SGLang's native API) is served with --pd sglang or "
                                             "sglang-exact; this router runs vLLM's flow (the OpenAI routes)");
      return;
    }
    eldr__handle_completion(c, ELDR__API_GENERATE, body, len);
    return;
  }
  if (!strcmp(p, "/health")) {
    if (m != ELDR__M_GET && m != ELDR__M_HEAD) goto bad_method;
    eldr__handle_health(c);
    return;
  }
  if (!strcmp(p, "/metrics")) {
    if (m != ELDR__M_GET) goto bad_method;
    eldr__handle_metrics(c);
    return;
  }
  if (!strcmp(p, "/eldr/status")) {
    if (m != ELDR__M_GET) goto bad_method;
    eldr__handle_status(c);
    return;
  }
  if (!strcmp(p, "/admin/reload") && s->cfg.admin_token) { /* no token configured: no endpoint */
    if (m != ELDR__M_POST) goto bad_method;
    eldr__handle_admin_reload(c);
    return;
  }
  if (!strcmp(p, "/v1/models")) {
    if (m != ELDR__M_GET) goto bad_method;
    eldr__handle_models(c);
    return;
  }
  known = 0;
bad_method:
  if (known && m == ELDR__M_OPTIONS && s->cfg.cors_origin) { /* CORS preflight */
    char extra[768];
    snprintf(extra, sizeof extra,
             "Access-Control-Allow-Methods: GET, POST, HEAD, OPTIONS\r\n"
             "Access-Control-Allow-Headers: %s\r\nAccess-Control-Max-Age: 600\r\n",
             c->head->acr_headers[0] ? c->head->acr_headers
                                    : "Authorization, Content-Type, X-Request-Id, traceparent, tracestate, baggage");
    eldr__send_body(c, 204, "text/plain", "", 0, extra);
    return;
  }
  s->m.bad[known ? BAD_METHOD : BAD_PATH]++;
  c->head_only = 0;
  if (known) eldr__send_error(c, 405, "invalid_request_error", "method %s not allowed on %s", c->head->method_name, p);
  else eldr__send_error(c, 404, "invalid_request_error", "unknown path %s", p);
}

static void conn_deadline_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  hconn *c = arg;
  if (c->dl_idle) { /* idle keep-alive connection: closed (bytes since re-arm it as a head bound) */
    c->dl_idle = 0;
    if (c->state == C_HEAD && c->in.n == c->inoff) {
      eldr__conn_free(c);
      return;
    }
  }
  if (c->state != C_HEAD && c->state != C_BODY) return;
  c->s->m.bad[BAD_TIMEOUT]++;
  c->keep_alive = 0;
  c->state = C_BUSY;
  eldr__send_error(c, 408, "invalid_request_error", "request not received within %g s",
             c->s->cfg.header_timeout_s);
}

enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER };
#define CH_LINE_MAX 1024 /* a chunk-size line or a trailer line */

/* Move the chunked body's data from the input to c->cbody as it arrives:
 * 1 when the whole body (and its trailer) was read, 0 when more bytes are
 * needed, -413 above max_body, -400 when malformed (the counters are
 * bumped here). */
static int read_chunked(hconn *c) {
  eldr_server *s = c->s;
  for (;;) {
    const char *in = c->in.p + c->inoff;
    size_t avail = c->in.n - c->inoff;
    if (c->cst == CH_DATA) {
      if (!avail) return 0;
      size_t take = avail < c->cleft ? avail : (size_t)c->cleft;
      if (evbuffer_add(c->cbody, in, take)) return -400;
      c->inoff += take;
      c->cleft -= take;
      if (c->cleft) return 0;
      c->cst = CH_DATA_END;
      continue;
    }
    /* a line ending in CRLF (strict) */
    const char *cr = NULL;
    for (const char *q = in; (q = memchr(q, '\r', avail - (size_t)(q - in))) != NULL; q++)
      if ((size_t)(q - in) + 1 < avail && q[1] == '\n') {
        cr = q;
        break;
      }
    if (!cr) {
      if (avail > CH_LINE_MAX) goto bad;
      return 0;
    }
    size_t n = (size_t)(cr - in);
    if (n > CH_LINE_MAX) goto bad;
    const char *line = in;
    if (c->cst == CH_DATA_END) { /* the CRLF after a chunk's data */
      if (n != 0) goto bad;
      c->cst = CH_SIZE;
    } else if (c->cst == CH_SIZE) {
      uint64_t sz;
      if (eldr__http_chunk_size(line, n, &sz)) goto bad;
      if (sz > s->cfg.max_body || evbuffer_get_length(c->cbody) + sz > s->cfg.max_body) {
        s->m.bad[BAD_TOO_LARGE]++;
        return -413;
      }
      c->cleft = sz;
      c->cst = sz ? CH_DATA : CH_TRAILER;
    } else { /* CH_TRAILER: lines until an empty one */
      c->inoff += n + 2;
      if (n == 0) return 1;
      continue;
    }
    c->inoff += n + 2;
  }
bad:
  s->m.bad[BAD_HEAD]++;
  return -400;
}

/* Consumed input gone: the buffer goes back to the loop until more bytes
 * arrive (one grown for a large body is freed). Not while dispatch may
 * still read a body in it: conn_process calls this after its loop. */
static void in_compact(hconn *c) {
  if (c->inoff < c->in.n) return;
  in_release(c);
}

static void conn_process(hconn *c) {
  eldr_server *s = c->s;
  c->in_process = 1;
  while (c->state == C_HEAD || c->state == C_BODY) {
    size_t avail = c->in.n - c->inoff;
    if (c->state == C_HEAD) {
      if (avail == 0) break;
      if (c->dl_idle || !evtimer_pending(c->deadline, NULL)) { /* the head's bound from its first byte */
        c->dl_idle = 0;
        struct timeval tv = eldr__tv_of(s->cfg.header_timeout_s);
        evtimer_add(c->deadline, &tv);
      }
      size_t look = avail < s->cfg.max_header + 1 ? avail : s->cfg.max_header + 1;
      const char *buf = c->in.p + c->inoff;
      if (!c->head && !(c->head = eldr__spares_take(&s->heads))) {
        evtimer_del(c->deadline);
        c->keep_alive = 0;
        c->state = C_BUSY;
        eldr__send_error(c, 500, "internal_error", "out of memory");
        break;
      }
      long hl = eldr__http_parse_head(buf, look, s->cfg.max_header, c->head);
      if (hl == 0) break;
      if (hl < 0) {
        evtimer_del(c->deadline);
        s->m.bad[c->head->status == 431 ? BAD_TOO_LARGE : BAD_HEAD]++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        eldr__send_error(c, c->head->status, "invalid_request_error", "%s", c->head->error);
        break;
      }
      c->inoff += (size_t)hl;
      c->keep_alive = c->head->keep_alive && !eldr__draining(s); /* draining: the last on this connection */
      c->minor = c->head->minor;
      free(c->origin); /* what the response needs once the head is given back */
      c->origin = c->head->origin[0] ? strdup(c->head->origin) : NULL;
      if (c->refusing) { /* accepted above max_connections: the head read, answered */
        evtimer_del(c->deadline);
        s->m.conn_refused++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        eldr__send_error(c, 503, "server_busy", "the router is at its limit of %zu connections: retry later",
                         s->max_conns);
        break;
      }
      int64_t cl = c->head->content_length;
      /* credentials first: an unauthenticated client learns nothing else
       * (not 411, not 413); a body it sent is read and dropped in dispatch */
      c->unauth = eldr__auth_check(c);
      if (c->unauth && ((c->head->method == ELDR__M_POST && cl < 0 && !c->head->chunked) ||
                        (cl > 0 && (uint64_t)cl > s->cfg.max_body))) {
        evtimer_del(c->deadline);
        if (cl > 0) c->keep_alive = 0; /* a body too large to read stays unread: close */
        eldr__auth_refuse(c);
        break;
      }
      if (c->head->chunked) { /* Node's http, fetch with a stream, requests with a generator, curl -T - */
        if (!c->cbody && !(c->cbody = evbuffer_new())) {
          evtimer_del(c->deadline);
          c->keep_alive = 0;
          c->state = C_BUSY;
          eldr__send_error(c, 500, "internal_error", "out of memory");
          break;
        }
        evbuffer_drain(c->cbody, evbuffer_get_length(c->cbody));
        c->cst = CH_SIZE;
        c->cleft = 0;
        if (c->head->expect_continue) {
          evbuffer_add(c->out, "HTTP/1.1 100 Continue\r\n\r\n", 25);
          conn_flush(c);
        }
        c->state = C_BODY;
        continue;
      }
      if (c->head->method == ELDR__M_POST && cl < 0) {
        evtimer_del(c->deadline);
        s->m.bad[BAD_LENGTH]++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        eldr__send_error(c, 411, "invalid_request_error", "Content-Length required");
        break;
      }
      if (cl > 0 && (uint64_t)cl > s->cfg.max_body) {
        evtimer_del(c->deadline);
        s->m.bad[BAD_TOO_LARGE]++;
        c->keep_alive = 0;
        c->state = C_BUSY;
        eldr__send_error(c, 413, "invalid_request_error", "request body of %lld bytes exceeds the limit of %zu",
                   (long long)cl, s->cfg.max_body);
        break;
      }
      c->body_need = cl > 0 ? (size_t)cl : 0;
      if (c->head->expect_continue && c->body_need) {
        evbuffer_add(c->out, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        conn_flush(c);
      }
      c->state = C_BODY;
      continue;
    }
    /* C_BODY */
    if (c->head->chunked) {
      int rc = read_chunked(c);
      if (rc == 0) break; /* more bytes needed */
      evtimer_del(c->deadline);
      if (rc < 0) { /* answered */
        c->keep_alive = 0;
        c->state = C_BUSY;
        eldr__send_error(c, rc == -413 ? 413 : 400, "invalid_request_error", "%s",
                         rc == -413 ? "chunked request body exceeds the limit" : "malformed chunked request body");
        break;
      }
      size_t blen = evbuffer_get_length(c->cbody);
      const char *body = blen ? (const char *)evbuffer_pullup(c->cbody, -1) : "";
      dispatch(c, body, blen);
      head_release(c); /* dispatched: what the response needs was kept (minor, origin) */
      evbuffer_drain(c->cbody, blen); /* parsed by now: its memory goes back */
      continue;
    }
    if (avail < c->body_need) break;
    evtimer_del(c->deadline);
    const char *body = c->body_need ? c->in.p + c->inoff : "";
    /* the body stays in the input buffer until dispatch has parsed it (no
     * read happens meanwhile: the buffer does not move) */
    size_t blen = c->body_need;
    dispatch(c, body, blen);
    head_release(c);
    c->inoff += blen;
    /* dispatch either answered (state back to C_HEAD / C_CLOSING) or is
     * waiting for upstream (C_BUSY) */
  }
  c->in_process = 0;
  if (c->state != C_BODY) head_release(c); /* a partial head is parsed again from its first byte */
  in_compact(c);
  if (c->state == C_CLOSING && evbuffer_get_length(c->out) == 0) eldr__conn_free(c);
}

/* Input beyond this is not read until the request before it is done: a
 * head, the largest body, and slack for a pipelined head. */
static size_t in_bound(const eldr_server *s) { return s->cfg.max_header + s->cfg.max_body + 65536; }

static void conn_read_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)ev;
  hconn *c = arg;
  if (c->inoff > 0 && c->inoff == c->in.n) c->in.n = c->inoff = 0;
  size_t bound = in_bound(c->s);
  if (c->in.n - c->inoff >= bound) { /* full: wait until the request before is done */
    c->rsusp = 1;
    event_del(c->rev);
    return;
  }
  if (!c->in.p) { /* bytes arrive: a buffer from the loop's spares */
    if (!(c->in.p = eldr__spares_take(&c->s->inbufs))) {
      eldr__conn_free(c); /* out of memory */
      return;
    }
    c->in.cap = INBUF;
  }
  if (c->in.cap - c->in.n < 4096) {
    if (c->inoff > 0) { /* move the unconsumed bytes down */
      memmove(c->in.p, c->in.p + c->inoff, c->in.n - c->inoff);
      c->in.n -= c->inoff;
      c->inoff = 0;
    }
    size_t want = c->in.n + 16384;
    if (c->in.cap - c->in.n < 4096 && eldr__buf_reserve(&c->in, want < bound ? want : bound)) {
      eldr__conn_free(c); /* out of memory */
      return;
    }
  }
  size_t room = c->in.cap - 1 - c->in.n;
  if (room > bound - (c->in.n - c->inoff)) room = bound - (c->in.n - c->inoff);
  if (room == 0) {
    c->rsusp = 1;
    event_del(c->rev);
    return;
  }
  ssize_t n = recv(fd, c->in.p + c->in.n, room, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    if (c->in.n == c->inoff) in_release(c); /* nothing came: not held while waiting */
    return;
  }
  if (n <= 0) { /* EOF or error: a request in flight is aborted (eldr__conn_free) */
    eldr__conn_free(c);
    return;
  }
  c->in.n += (size_t)n;
  if (c->state == C_HEAD || c->state == C_BODY) conn_process(c);
}

static void conn_write_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)ev;
  hconn *c = arg;
  while (evbuffer_get_length(c->out) > 0) {
    int w = evbuffer_write(c->out, fd);
    if (w > 0) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    eldr__conn_free(c); /* the client is gone */
    return;
  }
  if (evbuffer_get_length(c->out) > 0) {
    event_add(c->wev, NULL);
    return;
  }
  if (c->r && c->r->paused) eldr__rq_drained(c->r); /* a paused stream may go on */
  if (c->state == C_CLOSING && !c->in_process) eldr__conn_free(c);
}

/* Connections accepted above max_connections are answered 503 (after their
 * request head, so the client reads the answer instead of a reset); this
 * many at a time, beyond that they are closed at once. */
#define REFUSE_SLACK 64

void eldr__accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg) {
  (void)l;
  (void)sa;
  (void)salen;
  eldr_server *s = arg;
  s->accept_delay_s = 0; /* accept() works again: the next error backs off from the start */
  s->m.accepted++;
  int refusing = s->nconns >= s->max_conns;
  if (refusing && s->nrefusing >= REFUSE_SLACK) {
    s->m.conn_dropped++;
    evutil_closesocket(fd);
    return;
  }
  hconn *c = calloc(1, sizeof *c);
  if (!c) {
    evutil_closesocket(fd);
    return;
  }
  c->s = s;
  c->fd = fd;
  c->rev = event_new(s->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
  c->wev = event_new(s->base, fd, EV_WRITE, conn_write_cb, c);
  c->out = evbuffer_new();
  c->deadline = evtimer_new(s->base, conn_deadline_cb, c);
  if (!c->rev || !c->wev || !c->out || !c->deadline) {
    if (c->rev) event_free(c->rev);
    if (c->wev) event_free(c->wev);
    if (c->out) evbuffer_free(c->out);
    if (c->deadline) event_free(c->deadline);
    evutil_closesocket(fd);
    free(c);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->state = C_HEAD;
  c->refusing = refusing;
  if (refusing) s->nrefusing++;
  else s->nconns++;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  arm_idle(c, refusing ? s->cfg.header_timeout_s : s->cfg.idle_timeout_s);
  event_add(c->rev, NULL); /* EV_WRITE only while output is pending */
  eldr__fd_reserve_accepted(s, fd); /* too few fds left for its legs: the next clients wait */
}
