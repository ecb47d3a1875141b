/* lbclient.c — see lbclient.h. Blocking sockets with receive and send
 * timeouts, one thread per client; a small HTTP/1.1 response reader
 * (Content-Length, chunked, or until close). */
#define _GNU_SOURCE
#include "support/lbclient.h"
#include "support/fixture.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>


/* -1 with errno on failure (ECONNREFUSED: nothing listens). */
static int connect_port(int port, double timeout_s) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

typedef struct rbuf {
  char *p;
  size_t n, cap, off; /* bytes [off, n) not consumed */
  int eof;
} rbuf;

/* More bytes: 1, 0 at EOF, -1 on error (errno). */
static int fill(int fd, rbuf *b) {
  if (b->cap - b->n < 16384) {
    size_t cap = b->cap ? b->cap * 2 : 65536;
    char *q = realloc(b->p, cap);
    if (!q) {
      errno = ENOMEM;
      return -1;
    }
    b->p = q;
    b->cap = cap;
  }
  ssize_t k;
  do k = recv(fd, b->p + b->n, b->cap - b->n - 1, 0);
  while (k < 0 && errno == EINTR);
  if (k < 0) return -1;
  if (k == 0) {
    b->eof = 1;
    return 0;
  }
  b->n += (size_t)k;
  b->p[b->n] = 0;
  return 1;
}

/* A line ending at CRLF from b->off: its length, the CRLF consumed; -1 when incomplete. */
static long take_line(rbuf *b, const char **line) {
  char *s = b->p + b->off, *e = memmem(s, b->n - b->off, "\r\n", 2);
  if (!e) return -1;
  *line = s;
  b->off += (size_t)(e - s) + 2;
  return e - s;
}

typedef struct resp {
  int status;
  int conn_close;
  char *body; /* malloc'd, NUL-terminated */
  size_t len;
} resp;

/* Read one response. 0; -2 when nothing at all came (EOF or reset before a
 * byte: a crossed keep-alive close); -1 on another failure (why set). */
static int read_resp(int fd, resp *out, char *why, size_t cap) {
  memset(out, 0, sizeof *out);
  rbuf b = {0};
  int rc = -1;
  char *he = NULL;
  while (!(he = b.p ? strstr(b.p, "\r\n\r\n") : NULL)) {
    int k = fill(fd, &b);
    if (k <= 0) {
      if (b.n == 0 && (k == 0 || errno == ECONNRESET)) rc = -2;
      snprintf(why, cap, "response head: %s after %zu bytes", k == 0 ? "EOF" : strerror(errno), b.n);
      goto out;
    }
  }
  if (sscanf(b.p, "HTTP/1.%*d %d", &out->status) != 1) {
    snprintf(why, cap, "bad status line: %.60s", b.p);
    goto out;
  }
  long long cl = -1;
  int chunked = 0;
  for (char *l = strstr(b.p, "\r\n") + 2; l < he; l = strstr(l, "\r\n") + 2) {
    if (!strncasecmp(l, "Content-Length:", 15)) cl = atoll(l + 15);
    else if (!strncasecmp(l, "Transfer-Encoding:", 18) && strstr(l, "chunked") && strstr(l, "chunked") < strstr(l, "\r\n")) chunked = 1;
    else if (!strncasecmp(l, "Connection:", 11) && strcasestr(l, "close") && strcasestr(l, "close") < strstr(l, "\r\n")) out->conn_close = 1;
  }
  b.off = (size_t)(he - b.p) + 4;
  size_t bcap = 4096, bn = 0;
  char *body = malloc(bcap);
  if (!body) goto out;
  for (;;) {
    if (chunked) {
      const char *line;
      long ll;
      while ((ll = take_line(&b, &line)) < 0)
        if (fill(fd, &b) <= 0) {
          snprintf(why, cap, "chunked body cut after %zu bytes", bn);
          free(body);
          goto out;
        }
      unsigned long sz = strtoul(line, NULL, 16);
      while (b.n - b.off < sz + 2)
        if (fill(fd, &b) <= 0) {
          snprintf(why, cap, "chunk cut after %zu bytes", bn);
          free(body);
          goto out;
        }
      if (sz == 0) break; /* no trailers from the router */
      if (bn + sz + 1 > bcap) {
        while (bn + sz + 1 > bcap) bcap *= 2;
        body = realloc(body, bcap);
      }
      memcpy(body + bn, b.p + b.off, sz);
      bn += sz;
      b.off += sz + 2;
    } else {
      size_t want = cl >= 0 ? (size_t)cl : (size_t)-1;
      while (b.n - b.off < want && !b.eof)
        if (fill(fd, &b) < 0) {
          snprintf(why, cap, "body: %s", strerror(errno));
          free(body);
          goto out;
        }
      size_t have = b.n - b.off;
      if (cl >= 0 && have < (size_t)cl) {
        snprintf(why, cap, "body cut at %zu of %lld bytes", have, cl);
        free(body);
        goto out;
      }
      size_t take = cl >= 0 ? (size_t)cl : have;
      body = realloc(body, take + 1);
      memcpy(body, b.p + b.off, take);
      bn = take;
      if (cl < 0) out->conn_close = 1;
      break;
    }
  }
  body[bn] = 0;
  out->body = body;
  out->len = bn;
  rc = 0;
out:
  free(b.p);
  return rc;
}

/* The answer is what it must be: 0, or -1 with why. */
static int check(const lb_cfg *c, int stream, const resp *r, char *why, size_t cap) {
  if (r->status != 200) {
    snprintf(why, cap, "HTTP %d: %.160s", r->status, r->body);
    return -1;
  }
  if (!stream) {
    if (!strstr(r->body, "\"choices\"")) {
      snprintf(why, cap, "not a completion: %.160s", r->body);
      return -1;
    }
    return 0;
  }
  int tokens = 0;
  for (const char *p = r->body; (p = strstr(p, "\"text\":\"")) != NULL; p += 8)
    if (p[8] != '"') tokens++;
  const char *err = strstr(r->body, "data: {\"error\"");
  if (err || !strstr(r->body, "data: [DONE]") || tokens != c->max_tokens) {
    snprintf(why, cap, "stream: %d of %d tokens, %s: %.120s", tokens, c->max_tokens,
             err ? "error event" : strstr(r->body, "data: [DONE]") ? "done" : "no [DONE]", err ? err : "");
    return -1;
  }
  return 0;
}

static void note(lb_run *r, int ok, int replica, const char *why) {
  pthread_mutex_lock(&r->mu);
  r->st.requests++;
  if (ok) {
    r->st.ok++;
    r->st.per_replica[replica]++;
  } else {
    r->st.failed++;
    if (!r->st.first_error[0]) snprintf(r->st.first_error, sizeof r->st.first_error, "%s", why);
  }
  pthread_mutex_unlock(&r->mu);
}

static void count(lb_run *r, size_t *field) {
  pthread_mutex_lock(&r->mu);
  (*field)++;
  pthread_mutex_unlock(&r->mu);
}

static void *client_main(void *arg) {
  lb_client *cl = arg;
  lb_run *run = cl->run;
  const lb_cfg *c = &run->cfg;
  int conn[LB_MAX_REPLICAS];
  for (int i = 0; i < c->n; i++) conn[i] = -1;
  unsigned next = (unsigned)cl->id;
  for (unsigned i = 0; !run->stop; i++) {
    int stream = c->stream_every && i % (unsigned)c->stream_every == 0;
    char body[160], req[512];
    int bl = snprintf(body, sizeof body, "{\"prompt\":\"client %d request %u\",\"max_tokens\":%d%s}", cl->id, i,
                      c->max_tokens, stream ? ",\"stream\":true" : "");
    int k = (int)(next++ % (unsigned)c->n), ok = 0, tries = 0, fresh_retried = 0;
    char why[256] = "no replica accepted the connection";
    while (tries++ < 4 * c->n) {
      int fd = c->keep_alive ? conn[k] : -1, reused = fd >= 0;
      if (fd < 0 && (fd = connect_port(c->ports[k], c->timeout_s)) < 0) {
        if (errno == ECONNREFUSED) { /* nothing listens there: the balancer tries the next */
          count(run, &run->st.refused_retries);
          k = (k + 1) % c->n;
          continue;
        }
        snprintf(why, sizeof why, "connect to replica %d: %s", k, strerror(errno));
        break;
      }
      conn[k] = -1;
      int rl = snprintf(req, sizeof req,
                        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                        "Content-Length: %d\r\n%s\r\n%s",
                        c->ports[k], bl, c->keep_alive ? "" : "Connection: close\r\n", body);
      resp r;
      int rc = tc_send_all(fd, req, (size_t)rl) ? -2 : read_resp(fd, &r, why, sizeof why);
      if (rc == -2 && reused) { /* the idle connection was closed as the request crossed it */
        close(fd);
        count(run, &run->st.stale_retries);
        continue;
      }
      if (rc == -2 && !fresh_retried) { /* a new connection ended before any response byte: the
                                          * kernel resets what a closing listener's queue still
                                          * held (a SYN that crossed the close); sent again once,
                                          * to the next replica */
        close(fd);
        fresh_retried = 1;
        count(run, &run->st.fresh_retries);
        k = (k + 1) % c->n;
        continue;
      }
      if (rc != 0) {
        if (rc == -2) snprintf(why, sizeof why, "replica %d: connection closed before any response byte (fresh connection)", k);
        close(fd);
        break;
      }
      ok = check(c, stream, &r, why, sizeof why) == 0;
      if (!ok) {
        size_t wl = strlen(why);
        snprintf(why + wl, sizeof why - wl, " (replica %d)", k);
      }
      if (c->keep_alive && !r.conn_close) conn[k] = fd;
      else close(fd);
      free(r.body);
      break;
    }
    note(run, ok, k, why);
  }
  for (int i = 0; i < c->n; i++)
    if (conn[i] >= 0) close(conn[i]);
  return NULL;
}

void lb_start(lb_run *r, const lb_cfg *cfg) {
  memset(r, 0, sizeof *r);
  r->cfg = *cfg;
  if (r->cfg.clients > LB_MAX_CLIENTS) r->cfg.clients = LB_MAX_CLIENTS;
  pthread_mutex_init(&r->mu, NULL);
  for (int i = 0; i < r->cfg.clients; i++) {
    r->arg[i] = (lb_client){r, i};
    if (pthread_create(&r->th[i], NULL, client_main, &r->arg[i]) == 0) r->started++;
  }
}

size_t lb_done(lb_run *r) {
  pthread_mutex_lock(&r->mu);
  size_t n = r->st.requests;
  pthread_mutex_unlock(&r->mu);
  return n;
}

void lb_stop(lb_run *r, lb_stats *out) {
  r->stop = 1;
  for (int i = 0; i < r->started; i++) pthread_join(r->th[i], NULL);
  pthread_mutex_lock(&r->mu);
  *out = r->st;
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_destroy(&r->mu);
}
