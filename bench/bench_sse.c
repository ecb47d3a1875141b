/* bench_sse.c — the token-stream load generator of bench/dataplane.sh: N
 * keep-alive connections, each sending streaming completion requests one
 * after another ("stream":true, with --usage also
 * "stream_options":{"include_usage":true}) and reading the SSE reply
 * (chunked, or Content-Length / until close) to its end. bench_upstream
 * writes the CLOCK_MONOTONIC time (ns) it sent each token into the token's
 * text (" t<ns>"), so the time from the upstream's send to this client's
 * read is each token's latency through whatever lies between (a proxy, or
 * nothing). Prints one line:
 *   tokens N requests R errors E p50_us X p90_us Y p99_us Z max_us W
 * Only tokens read after the first tenth of --duration count (warm-up).
 *
 * usage: bench_sse --port P [--conns N] [--duration S] [--usage] [--path /v1/completions]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_net.h"

enum { HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, BODY_CL, BODY_CLOSE, DONE };

typedef struct conn {
  int fd;
  char in[65536];
  size_t n;
  int st;
  long long left;   /* chunk or body bytes left */
  char ev[256];     /* the tail of the body that may hold a token's text cut by a read */
  size_t evn;
  int status;
} conn;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double *lat;
static size_t nlat, latcap;
static unsigned long long tokens, requests, errors;
static int counting;

static char req[1024];
static size_t reqlen;

static int send_req(conn *c) {
  c->st = HEAD;
  c->evn = 0;
  return send(c->fd, req, reqlen, MSG_NOSIGNAL) == (ssize_t)reqlen ? 0 : -1;
}

/* Body bytes: tokens " t<digits>" found, each a latency. A token's text may
 * be cut by a chunk or a read: the last bytes are kept and scanned with the
 * next. */
static void body(conn *c, const char *p, size_t n) {
  double t = now_ns();
  while (n) {
    size_t take = n < sizeof c->ev - c->evn ? n : sizeof c->ev - c->evn;
    memcpy(c->ev + c->evn, p, take);
    c->evn += take;
    p += take;
    n -= take;
    size_t i = 0, keep = 0;
    for (; i + 2 < c->evn; i++) {
      if (c->ev[i] != ' ' || c->ev[i + 1] != 't' || c->ev[i + 2] < '0' || c->ev[i + 2] > '9') continue;
      size_t j = i + 2;
      double v = 0;
      while (j < c->evn && c->ev[j] >= '0' && c->ev[j] <= '9') v = v * 10 + (c->ev[j++] - '0');
      if (j == c->evn) { /* the number may go on in the next bytes */
        keep = i;
        break;
      }
      tokens += counting;
      if (counting) {
        if (nlat == latcap) {
          latcap = latcap ? latcap * 2 : 1 << 16;
          lat = realloc(lat, latcap * sizeof *lat);
        }
        lat[nlat++] = (t - v) / 1e3;
      }
      i = j - 1;
    }
    if (!keep) keep = c->evn > 2 ? c->evn - 2 : 0; /* " t" may be cut */
    memmove(c->ev, c->ev + keep, c->evn - keep);
    c->evn -= keep;
  }
}

/* Parse what is in c->in; 1 when the response ended, -1 on error. */
static int parse(conn *c) {
  size_t off = 0;
  int ret = 0;
  while (off < c->n && c->st != DONE) {
    char *b = c->in + off;
    size_t n = c->n - off;
    if (c->st == HEAD) {
      char *e = memmem(b, n, "\r\n\r\n", 4);
      if (!e) break;
      c->status = atoi(b + 9);
      long long cl = -1;
      int chunked = 0;
      for (char *q = b; q < e; q++) {
        if (*q != '\n') continue;
        if (!strncasecmp(q + 1, "content-length:", 15)) cl = atoll(q + 16);
        if (!strncasecmp(q + 1, "transfer-encoding:", 18) && memmem(q, (size_t)(e - q), "chunked", 7)) chunked = 1;
      }
      off += (size_t)(e - b) + 4;
      if (chunked) c->st = CHUNK_SIZE;
      else if (cl >= 0) {
        c->st = BODY_CL;
        c->left = cl;
        if (!cl) c->st = DONE;
      } else c->st = BODY_CLOSE;
      continue;
    }
    if (c->st == CHUNK_SIZE) {
      char *e = memmem(b, n, "\r\n", 2);
      if (!e) break;
      c->left = strtoll(b, NULL, 16);
      off += (size_t)(e - b) + 2;
      c->st = c->left ? CHUNK_DATA : CHUNK_CRLF;
      if (!c->left) c->left = -1; /* the last chunk: its CRLF ends the body */
      continue;
    }
    if (c->st == CHUNK_DATA || c->st == BODY_CL || c->st == BODY_CLOSE) {
      size_t take = c->st == BODY_CLOSE || (long long)n < c->left ? n : (size_t)c->left;
      body(c, b, take);
      off += take;
      if (c->st != BODY_CLOSE) c->left -= (long long)take;
      if (c->st == CHUNK_DATA && !c->left) c->st = CHUNK_CRLF;
      if (c->st == BODY_CL && !c->left) c->st = DONE;
      continue;
    }
    if (c->st == CHUNK_CRLF) {
      if (n < 2) break;
      off += 2;
      c->st = c->left == -1 ? DONE : CHUNK_SIZE;
      continue;
    }
  }
  memmove(c->in, c->in + off, c->n - off);
  c->n -= off;
  if (c->st == DONE) {
    requests += counting;
    if (c->status != 200) errors++;
    ret = 1;
  }
  return ret;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int port = 0, nconn = 16, usage = 0;
  double duration = 5;
  const char *path = "/v1/completions";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--port") && i + 1 < argc) port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--conns") && i + 1 < argc) nconn = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--duration") && i + 1 < argc) duration = atof(argv[++i]);
    else if (!strcmp(argv[i], "--path") && i + 1 < argc) path = argv[++i];
    else if (!strcmp(argv[i], "--usage")) usage = 1;
    else {
      fprintf(stderr, "usage: bench_sse --port P [--conns N] [--duration S] [--usage] [--path P]\n");
      return 2;
    }
  }
  if (!port || nconn < 1 || nconn > 4096 || duration <= 0) {
    fprintf(stderr, "bench_sse: --port is required; --conns 1..4096; --duration > 0\n");
    return 2;
  }
  char b[512];
  int bl = snprintf(b, sizeof b, "{\"model\":\"m\",\"prompt\":\"Hello, how are you today?\",\"max_tokens\":1000,"
                                 "\"stream\":true%s}",
                    usage ? ",\"stream_options\":{\"include_usage\":true}" : "");
  reqlen = (size_t)snprintf(req, sizeof req,
                            "POST %s HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                            path, bl, b);
  conn *cs = calloc((size_t)nconn, sizeof *cs);
  struct pollfd *pf = calloc((size_t)nconn, sizeof *pf);
  for (int i = 0; i < nconn; i++) {
    if ((cs[i].fd = bench_connect_loopback(port)) < 0 || send_req(&cs[i])) {
      perror("bench_sse: connect");
      return 1;
    }
    pf[i].fd = cs[i].fd;
    pf[i].events = POLLIN;
  }
  double t0 = now_ns(), warm = t0 + duration * 0.1e9, end = t0 + duration * 1e9, tw = 0;
  for (double t; (t = now_ns()) < end;) {
    if (!counting && t >= warm) {
      counting = 1;
      tw = t;
    }
    if (poll(pf, (nfds_t)nconn, 100) <= 0) continue;
    for (int i = 0; i < nconn; i++) {
      if (!pf[i].revents) continue;
      conn *c = &cs[i];
      ssize_t r = recv(c->fd, c->in + c->n, sizeof c->in - c->n, 0);
      if (r <= 0) {
        fprintf(stderr, "bench_sse: connection closed by the server\n");
        return 1;
      }
      c->n += (size_t)r;
      if (parse(c) == 1 && send_req(c)) {
        fprintf(stderr, "bench_sse: send failed\n");
        return 1;
      }
    }
  }
  double el = (now_ns() - tw) / 1e9;
  qsort(lat, nlat, sizeof *lat, cmpd);
  double p50 = nlat ? lat[nlat / 2] : 0, p90 = nlat ? lat[(size_t)((double)(nlat - 1) * 0.9)] : 0,
         p99 = nlat ? lat[(size_t)((double)(nlat - 1) * 0.99)] : 0, mx = nlat ? lat[nlat - 1] : 0;
  printf("tokens %llu requests %llu errors %llu seconds %.3f p50_us %.1f p90_us %.1f p99_us %.1f max_us %.1f\n", tokens,
         requests, errors, el, p50, p90, p99, mx);
  return 0;
}
