/* upstream.c — the HTTP/1.1 client connection (see eldr/upstream.h). */
#include "eldr/upstream.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "eldr/error.h"

#define HEAD_MAX (64 * 1024)

enum { S_HEAD, S_BODY_CL, S_CHUNK_SIZE, S_CHUNK_DATA, S_CHUNK_CRLF, S_TRAILER, S_UNTIL_CLOSE };

struct eldr_up {
  struct event_base *base;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  int fd;
  struct event *rev, *wev, *fail_ev, *cto_ev;
  struct timeval cto; /* connect timeout; 0 = none */
  int connecting;
  char *out;               /* the request of the exchange (kept for a resend) */
  size_t outn, outoff, outcap;
  int reused;              /* the exchange started on an already open connection */
  int resent;              /* ... which failed before any reply byte: sent again on a fresh one */
  int replied;             /* a byte of the reply arrived (no resend after it) */
  int wrote;               /* request bytes reached a connected socket: the stale one's too (a
                            * worker that read the request and died looks like a stale close) */
  char *in;
  size_t inn, inoff, incap;
  /* exchange */
  int active;
  const eldr_up_cbs *cbs;
  void *arg;
  int st;
  int status;
  int conn_close;
  long long remain;
  int pending_err; /* failure to report from fail_ev */
  int paused;      /* rev not armed: the consumer is full */
  int in_cb, dead;
};

static void on_read(evutil_socket_t fd, short ev, void *arg);
static void on_write(evutil_socket_t fd, short ev, void *arg);
static void on_fail(evutil_socket_t fd, short ev, void *arg);
static void on_connect_timeout(evutil_socket_t fd, short ev, void *arg);

void eldr_up_set_connect_timeout(eldr_up *u, double seconds) {
  u->cto.tv_sec = (time_t)seconds;
  u->cto.tv_usec = (suseconds_t)((seconds - (double)u->cto.tv_sec) * 1e6);
}

eldr_up *eldr_up_new(struct event_base *base, const struct sockaddr *addr, socklen_t len) {
  if (len > sizeof(struct sockaddr_storage)) return NULL;
  eldr_up *u = calloc(1, sizeof *u);
  if (!u) return NULL;
  u->base = base;
  memcpy(&u->addr, addr, len);
  u->addrlen = len;
  u->fd = -1;
  u->fail_ev = evtimer_new(base, on_fail, u);
  u->cto_ev = evtimer_new(base, on_connect_timeout, u);
  if (!u->fail_ev || !u->cto_ev) {
    if (u->fail_ev) event_free(u->fail_ev);
    if (u->cto_ev) event_free(u->cto_ev);
    free(u);
    return NULL;
  }
  return u;
}

static void close_fd(eldr_up *u) {
  if (u->rev) event_free(u->rev);
  if (u->wev) event_free(u->wev);
  u->rev = u->wev = NULL;
  if (u->fd >= 0) close(u->fd);
  u->fd = -1;
  u->connecting = 0;
  event_del(u->cto_ev);
  u->outoff = 0;
  u->inn = u->inoff = 0;
}

static void really_free(eldr_up *u) {
  close_fd(u);
  event_free(u->fail_ev);
  event_free(u->cto_ev);
  free(u->out);
  free(u->in);
  free(u);
}

void eldr_up_free(eldr_up *u) {
  if (!u) return;
  u->active = 0;
  if (u->in_cb) {
    u->dead = 1;
    close_fd(u);
    return;
  }
  really_free(u);
}

int eldr_up_sent(const eldr_up *u) { return u->wrote; }

int eldr_up_resent(const eldr_up *u) { return u->resent; }

int eldr_up_active(const eldr_up *u) { return u->active; }

long long eldr_up_body_length(const eldr_up *u) { return u->st == S_BODY_CL ? u->remain : -1; }

void eldr_up_pause(eldr_up *u, int on) {
  if (on == u->paused) return;
  u->paused = on;
  if (!u->rev) return;
  if (on) event_del(u->rev);
  else event_add(u->rev, NULL);
}

size_t eldr_up_trim(eldr_up *u, size_t keep) {
  if (u->active) return 0;
  size_t freed = 0;
  if (u->outcap > keep) {
    freed += u->outcap;
    free(u->out);
    u->out = NULL;
    u->outcap = u->outn = u->outoff = 0;
  }
  if (u->incap > keep && u->inoff == u->inn) {
    freed += u->incap;
    free(u->in);
    u->in = NULL;
    u->incap = u->inn = u->inoff = 0;
  }
  return freed;
}

void eldr_up_abort(eldr_up *u) {
  if (!u->active) return;
  u->active = 0;
  event_del(u->fail_ev);
  close_fd(u);
}

/* Close and report err to the exchange (if any). */
static void fail(eldr_up *u, int err) {
  close_fd(u);
  if (!u->active) return;
  u->active = 0;
  u->in_cb++;
  u->cbs->done(u->arg, err);
  u->in_cb--;
}

static void on_connect_timeout(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_up *u = arg;
  if (!u->connecting) return;
  fail(u, ELDR_ETIMEOUT);
  if (u->dead && !u->in_cb) really_free(u);
}

static void on_fail(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_up *u = arg;
  fail(u, u->pending_err);
  if (u->dead && !u->in_cb) really_free(u);
}

static void fail_later(eldr_up *u, int err) {
  close_fd(u);
  u->pending_err = err;
  static const struct timeval zero = {0, 0};
  event_add(u->fail_ev, &zero);
}

/* 0, -1 (the connection failed) or -2 (no socket: the router is out of fds
 * or memory, not the worker's fault). */
static int open_socket(eldr_up *u) {
  int fd = socket(u->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM ? -2 : -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  u->fd = fd;
  u->rev = event_new(u->base, fd, EV_READ | EV_PERSIST, on_read, u);
  u->wev = event_new(u->base, fd, EV_WRITE, on_write, u);
  if (!u->rev || !u->wev) return -1;
  if (connect(fd, (struct sockaddr *)&u->addr, u->addrlen) != 0) {
    if (errno != EINPROGRESS) return -1;
    u->connecting = 1;
    event_add(u->wev, NULL);
    if (u->cto.tv_sec || u->cto.tv_usec) event_add(u->cto_ev, &u->cto);
  }
  event_add(u->rev, NULL);
  return 0;
}

/* Write what is queued; 0 or -1 (connection broken). */
static int flush_out(eldr_up *u) {
  while (u->outoff < u->outn) {
    ssize_t n = send(u->fd, u->out + u->outoff, u->outn - u->outoff, MSG_NOSIGNAL);
    if (n > 0) {
      u->outoff += (size_t)n;
      u->wrote = 1;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      event_add(u->wev, NULL);
      return 0;
    }
    return -1;
  }
  return 0;
}

/* A kept-alive connection the worker closed (its keep-alive timeout or
 * request limit) while the request went out: it failed (EOF, reset, a
 * broken pipe) before any byte of a reply. The worker most likely did not
 * take the request (one that read it and died looks the same: wrote stays
 * set), so it is sent once more on a fresh connection, as HTTP clients and
 * proxies do with a reused connection; never after a reply byte, never
 * when the connection was fresh, at most once. 1 if resent (or that
 * resend's failure reported). */
static int try_resend(eldr_up *u) {
  if (!u->active || !u->reused || u->resent || u->replied) return 0;
  close_fd(u);
  u->resent = 1;
  u->reused = 0; /* wrote stays: bytes reached the stale socket, whose worker may have read them */
  if (open_socket(u) != 0) {
    fail(u, ELDR_EIO);
    return 1;
  }
  if (!u->connecting && flush_out(u) != 0) fail(u, ELDR_EIO);
  return 1;
}

/* Idle sockets keep their read event armed, so a worker's close is seen
 * (and the socket dropped) at the next loop turn. A close the loop has not
 * seen yet when the next request goes out (one that crossed it) is the
 * resend's case above: no socket is peeked before reuse. */

/* A request is under way: the reply parser at the start of a head. */
static void begin_reply(eldr_up *u, const eldr_up_cbs *cbs, void *arg) {
  u->active = 1;
  u->cbs = cbs;
  u->arg = arg;
  u->st = S_HEAD;
  u->replied = 0;
  u->status = 0;
  u->conn_close = 0;
  u->remain = 0;
  u->inn = u->inoff = 0;
}

int eldr_up_request(eldr_up *u, const struct iovec *iov, int iovcnt, const eldr_up_cbs *cbs,
                     void *arg) {
  if (u->active || u->dead) return ELDR_EINVAL;
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
  if (total > u->outcap) {
    char *p = realloc(u->out, total);
    if (!p) return ELDR_ENOMEM;
    u->out = p;
    u->outcap = total;
  }
  u->outn = 0;
  u->outoff = 0;
  for (int i = 0; i < iovcnt; i++) {
    memcpy(u->out + u->outn, iov[i].iov_base, iov[i].iov_len);
    u->outn += iov[i].iov_len;
  }
  begin_reply(u, cbs, arg);
  if (u->paused) eldr_up_pause(u, 0);
  u->resent = 0;
  u->wrote = 0;
  u->reused = u->fd >= 0;
  int orc;
  if (u->fd < 0 && (orc = open_socket(u)) != 0) {
    fail_later(u, orc == -2 ? ELDR_ENOMEM : ELDR_EIO);
    return 0;
  }
  if (!u->connecting && flush_out(u) != 0) {
    /* a stale kept-alive socket: resend on a fresh one (reported later if that fails too) */
    if (u->reused) {
      close_fd(u);
      u->reused = 0;
      u->resent = 1;
      if (open_socket(u) == 0 && (u->connecting || flush_out(u) == 0)) return 0;
    }
    fail_later(u, ELDR_EIO);
  }
  return 0;
}

static void on_write(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_up *u = arg;
  if (u->connecting) {
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(u->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
      fail(u, ELDR_EIO);
      if (u->dead && !u->in_cb) really_free(u);
      return;
    }
    u->connecting = 0;
    event_del(u->cto_ev);
  }
  if (flush_out(u) != 0) {
    if (!try_resend(u)) fail(u, ELDR_EIO);
    if (u->dead && !u->in_cb) really_free(u);
  }
}

/* The reply is complete: reset to idle, then tell the caller. */
static void complete(eldr_up *u) {
  if (u->conn_close || u->inoff < u->inn) close_fd(u); /* leftovers: not ours to keep */
  if (u->paused) eldr_up_pause(u, 0); /* idle: watch for the worker closing it */
  u->inn = u->inoff = 0;
  u->active = 0;
  u->in_cb++;
  u->cbs->done(u->arg, 0);
  u->in_cb--;
}

static int deliver(eldr_up *u, const char *p, size_t n) {
  if (!n) return 0;
  u->in_cb++;
  u->cbs->data(u->arg, p, n);
  u->in_cb--;
  return u->active && !u->dead ? 0 : -1;
}

/* Parse the head in in[inoff..inn); returns 1 done, 0 need more, -1 error. */
static int parse_head(eldr_up *u) {
  char *b = u->in + u->inoff;
  size_t n = u->inn - u->inoff;
  char *e = NULL;
  for (size_t i = 3; i < n; i++)
    if (b[i] == '\n' && b[i - 1] == '\r' && b[i - 2] == '\n' && b[i - 3] == '\r') {
      e = b + i + 1;
      break;
    }
  if (!e) return n > HEAD_MAX ? -1 : 0;
  if (n < 12 || memcmp(b, "HTTP/1.", 7) || b[8] != ' ' || b[9] < '1' || b[9] > '5' ||
      b[10] < '0' || b[10] > '9' || b[11] < '0' || b[11] > '9')
    return -1;
  int status = (b[9] - '0') * 100 + (b[10] - '0') * 10 + (b[11] - '0');
  int http10 = b[7] == '0';
  long long clen = -1;
  int chunked = 0, close_hdr = 0, keep_hdr = 0;
  char ctype[128] = "";
  char *line = memchr(b, '\n', (size_t)(e - b)) + 1;
  while (line < e - 2) {
    char *le = memchr(line, '\n', (size_t)(e - line));
    size_t ll = (size_t)(le - line);
    if (ll && line[ll - 1] == '\r') ll--;
    char *colon = memchr(line, ':', ll);
    if (colon) {
      size_t nl = (size_t)(colon - line);
      char *v = colon + 1;
      char *ve = line + ll;
      while (v < ve && (*v == ' ' || *v == '\t')) v++;
      while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
      size_t vl = (size_t)(ve - v);
      if (nl == 14 && !strncasecmp(line, "Content-Length", 14)) {
        clen = 0;
        if (vl == 0 || vl > 15) return -1;
        for (size_t k = 0; k < vl; k++) {
          if (v[k] < '0' || v[k] > '9') return -1;
          clen = clen * 10 + (v[k] - '0');
        }
      } else if (nl == 17 && !strncasecmp(line, "Transfer-Encoding", 17)) {
        chunked = vl >= 7 && !strncasecmp(ve - 7, "chunked", 7);
        if (!chunked) return -1;
      } else if (nl == 12 && !strncasecmp(line, "Content-Type", 12)) {
        size_t c = vl < sizeof ctype - 1 ? vl : sizeof ctype - 1;
        memcpy(ctype, v, c);
        ctype[c] = 0;
      } else if (nl == 10 && !strncasecmp(line, "Connection", 10)) {
        for (size_t k = 0; k + 5 <= vl; k++)
          if (!strncasecmp(v + k, "close", 5)) close_hdr = 1;
        for (size_t k = 0; k + 10 <= vl; k++)
          if (!strncasecmp(v + k, "keep-alive", 10)) keep_hdr = 1;
      }
    }
    line = le + 1;
  }
  u->inoff += (size_t)(e - b);
  if (status < 200) return 2; /* 1xx: another head follows */
  u->status = status;
  u->conn_close = close_hdr || (http10 && !keep_hdr);
  if (chunked) u->st = S_CHUNK_SIZE;
  else if (clen >= 0) {
    u->st = S_BODY_CL;
    u->remain = clen;
  } else if (status == 204 || status == 304) {
    u->st = S_BODY_CL;
    u->remain = 0;
  } else {
    u->st = S_UNTIL_CLOSE;
    u->conn_close = 1;
  }
  u->in_cb++;
  u->cbs->head(u->arg, status, ctype);
  u->in_cb--;
  return 1;
}

/* Run the reply parser over the buffered bytes. Returns -1 once the exchange
 * ended (completed, failed or aborted by a callback), else 0. */
static int parse(eldr_up *u) {
  for (;;) {
    if (!u->active || u->dead) return -1;
    char *b = u->in + u->inoff;
    size_t n = u->inn - u->inoff;
    switch (u->st) {
    case S_HEAD: {
      int r = parse_head(u);
      if (r < 0) {
        fail(u, ELDR_EPARSE);
        return -1;
      }
      if (r == 0) return 0;
      if (r == 2) continue;
      if (!u->active || u->dead) return -1;
      if (u->st == S_BODY_CL && u->remain == 0) {
        complete(u);
        return -1;
      }
      continue;
    }
    case S_BODY_CL: {
      size_t take = (size_t)u->remain < n ? (size_t)u->remain : n;
      if (!take) return 0;
      u->inoff += take;
      u->remain -= (long long)take;
      if (deliver(u, b, take)) return -1;
      if (u->remain == 0) {
        complete(u);
        return -1;
      }
      continue;
    }
    case S_UNTIL_CLOSE:
      if (!n) return 0;
      u->inoff += n;
      if (deliver(u, b, n)) return -1;
      continue;
    case S_CHUNK_SIZE: {
      char *le = memchr(b, '\n', n);
      if (!le) {
        if (n > 1024) {
          fail(u, ELDR_EPARSE);
          return -1;
        }
        return 0;
      }
      long long sz = 0;
      size_t k = 0, digits = 0;
      for (; b + k < le; k++) {
        char c = b[k];
        int v = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
        if (v < 0) break;
        if (++digits > 15) break;
        sz = sz * 16 + v;
      }
      if (!digits || digits > 15 || (b[k] != '\r' && b[k] != ';' && b[k] != '\n' && b[k] != ' ')) {
        fail(u, ELDR_EPARSE);
        return -1;
      }
      u->inoff += (size_t)(le - b) + 1;
      if (sz == 0) u->st = S_TRAILER;
      else {
        u->st = S_CHUNK_DATA;
        u->remain = sz;
      }
      continue;
    }
    case S_CHUNK_DATA: {
      size_t take = (size_t)u->remain < n ? (size_t)u->remain : n;
      if (!take) return 0;
      u->inoff += take;
      u->remain -= (long long)take;
      if (u->remain == 0) u->st = S_CHUNK_CRLF;
      if (deliver(u, b, take)) return -1;
      continue;
    }
    case S_CHUNK_CRLF:
      if (n < 2) {
        if (n == 1 && b[0] == '\n') {
          u->inoff++;
          u->st = S_CHUNK_SIZE;
          continue;
        }
        return 0;
      }
      if (b[0] == '\r' && b[1] == '\n') u->inoff += 2;
      else if (b[0] == '\n') u->inoff += 1;
      else {
        fail(u, ELDR_EPARSE);
        return -1;
      }
      u->st = S_CHUNK_SIZE;
      continue;
    case S_TRAILER: {
      char *le = memchr(b, '\n', n);
      if (!le) return n > HEAD_MAX ? (fail(u, ELDR_EPARSE), -1) : 0;
      size_t ll = (size_t)(le - b);
      u->inoff += ll + 1;
      if (ll == 0 || (ll == 1 && b[0] == '\r')) {
        complete(u);
        return -1;
      }
      continue;
    }
    }
  }
}

static void on_read(evutil_socket_t fd, short ev, void *arg) {
  (void)ev;
  eldr_up *u = arg;
  if (u->inoff == u->inn) u->inn = u->inoff = 0;
  if (u->incap - u->inn < 16384) {
    if (u->inoff > 0) { /* compact */
      memmove(u->in, u->in + u->inoff, u->inn - u->inoff);
      u->inn -= u->inoff;
      u->inoff = 0;
    }
    if (u->incap - u->inn < 16384) {
      size_t cap = u->incap ? u->incap * 2 : 65536;
      char *p = realloc(u->in, cap);
      if (!p) {
        fail(u, ELDR_EIO);
        if (u->dead && !u->in_cb) really_free(u);
        return;
      }
      u->in = p;
      u->incap = cap;
    }
  }
  ssize_t n = recv(fd, u->in + u->inn, u->incap - u->inn, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (!u->active) { /* idle: the worker closed (or talked out of turn): drop it */
    close_fd(u);
    return;
  }
  if (n <= 0) {
    if (n == 0 && u->st == S_UNTIL_CLOSE) {
      u->conn_close = 1;
      complete(u);
    } else if (!try_resend(u)) {
      fail(u, ELDR_EIO);
    }
    if (u->dead && !u->in_cb) really_free(u);
    return;
  }
  u->inn += (size_t)n;
  u->replied = 1;
  u->in_cb++;
  parse(u);
  u->in_cb--;
  if (u->dead && !u->in_cb) really_free(u);
}

void eldr_up_test_begin(eldr_up *u, const eldr_up_cbs *cbs, void *arg) {
  begin_reply(u, cbs, arg);
}

void eldr_up_test_feed(eldr_up *u, const char *p, size_t n, int eof) {
  if (!u->active) return;
  if (u->inoff == u->inn) u->inn = u->inoff = 0;
  if (u->incap - u->inn < n + 1) {
    if (u->inoff) {
      memmove(u->in, u->in + u->inoff, u->inn - u->inoff);
      u->inn -= u->inoff;
      u->inoff = 0;
    }
    size_t cap = u->incap ? u->incap : 1024;
    while (cap - u->inn < n + 1) cap *= 2;
    char *q = realloc(u->in, cap);
    if (!q) return;
    u->in = q;
    u->incap = cap;
  }
  memcpy(u->in + u->inn, p, n);
  u->inn += n;
  if (n) u->replied = 1;
  u->in_cb++;
  parse(u);
  if (eof && u->active && !u->dead) {
    if (u->st == S_UNTIL_CLOSE) {
      u->conn_close = 1;
      complete(u);
    } else {
      fail(u, ELDR_EIO);
    }
  }
  u->in_cb--;
  if (u->dead && !u->in_cb) really_free(u);
}
