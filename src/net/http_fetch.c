/* http_fetch.c — one blocking HTTP/1.1 exchange over the net layer's client
 * (see eldr/http_fetch.h): a private event loop, one eldr_up connection,
 * the reply body gathered up to a bound. */
#include "eldr/http_fetch.h"

#include <event2/event.h>
#include <event2/util.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "eldr/upstream.h"

#define FETCH_MAX (4u << 20)

typedef struct fetch {
  struct event_base *base;
  char *buf;
  size_t n, cap;
  int status, done, err, too_big;
} fetch;

static void on_head(void *arg, int status, const char *ctype) {
  (void)ctype;
  ((fetch *)arg)->status = status;
}

static void on_data(void *arg, const char *p, size_t n) {
  fetch *s = arg;
  if (s->too_big) return;
  if (s->n + n + 1 > s->cap) {
    size_t nc = s->cap ? s->cap : 1 << 16;
    while (nc < s->n + n + 1) nc *= 2;
    char *nb = nc <= FETCH_MAX ? realloc(s->buf, nc) : NULL;
    if (!nb) {
      s->too_big = 1;
      return;
    }
    s->buf = nb;
    s->cap = nc;
  }
  memcpy(s->buf + s->n, p, n);
  s->n += n;
  s->buf[s->n] = 0;
}

static void on_done(void *arg, int err) {
  fetch *s = arg;
  s->done = 1;
  s->err = err;
  event_base_loopbreak(s->base);
}

int eldr_http_fetch(const char *url, const char *method, const char *path, const char *headers, const char *body,
                    double timeout_s, int *status, char **reply, eldr_diag *d) {
  *reply = NULL;
  *status = 0;
  const char *hp = strncmp(url, "http://", 7) ? NULL : url + 7;
  char hostport[128];
  if (!hp || (size_t)snprintf(hostport, sizeof hostport, "%.*s", (int)strcspn(hp, "/"), hp) >=
                 sizeof hostport)
    return eldr_diag_fail(d, ELDR_EINVAL, "'%s' is not http://host:port", url);
  struct sockaddr_storage ss;
  int len = (int)sizeof ss;
  if (evutil_parse_sockaddr_port(hostport, (struct sockaddr *)&ss, &len) < 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "'%s' is not http://host:port", url);
  fetch s = {0};
  s.base = event_base_new();
  eldr_up *u = s.base ? eldr_up_new(s.base, (struct sockaddr *)&ss, (socklen_t)len) : NULL;
  if (!u) {
    if (s.base) event_base_free(s.base);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  eldr_up_set_connect_timeout(u, timeout_s);
  char req[1024];
  size_t bl = body ? strlen(body) : 0;
  int rl = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s", method, path,
                    hostport, headers ? headers : "");
  if (body) rl += snprintf(req + rl, sizeof req - (size_t)rl, "Content-Type: application/json\r\nContent-Length: %zu\r\n", bl);
  rl += snprintf(req + rl, sizeof req - (size_t)rl, "\r\n");
  if (rl >= (int)sizeof req) {
    eldr_up_free(u);
    event_base_free(s.base);
    return eldr_diag_fail(d, ELDR_ERANGE, "%s%s: request head too long", url, path);
  }
  struct iovec iov[2] = {{req, (size_t)rl}, {(void *)body, bl}};
  const eldr_up_cbs cbs = {on_head, on_data, on_done};
  int rc = eldr_up_request(u, iov, bl ? 2 : 1, &cbs, &s);
  if (!rc) {
    struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    event_base_loopexit(s.base, &tv);
    event_base_dispatch(s.base);
    if (!s.done) {
      eldr_up_abort(u);
      rc = eldr_diag_fail(d, ELDR_ETIMEOUT, "%s%s: no reply within %g s", url, path, timeout_s);
    } else if (s.err) {
      rc = eldr_diag_fail(d, s.err, "%s%s: %s", url, path, eldr_strerror(s.err));
    } else if (s.too_big) {
      rc = eldr_diag_fail(d, ELDR_EIO, "%s%s: reply too large", url, path);
    }
  }
  eldr_up_free(u);
  event_base_free(s.base);
  if (rc) {
    free(s.buf);
    return rc;
  }
  *status = s.status;
  *reply = s.buf ? s.buf : calloc(1, 1);
  return *reply ? 0 : eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
}
