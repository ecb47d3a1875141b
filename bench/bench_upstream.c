/* bench_upstream.c — the one upstream the data-plane benchmarks put behind
 * every proxy (eldr, nginx, HAProxy): a cheap HTTP/1.1 server on one
 * libevent loop, keep-alive, Content-Length request bodies, that answers
 *
 *   a body with "do_remote_prefill":true   (eldr's decode leg)
 *        "stream":true  -> the token stream below
 *        otherwise      -> a short completion
 *   a body with "stream":true              (a client's streaming request
 *                                           relayed by a one-leg proxy)
 *                         -> the token stream below
 *   anything else                          (eldr's prefill leg, or a client's
 *                                           request relayed by nginx / HAProxy)
 *                         -> the prefill reply: a short completion with
 *                            kv_transfer_params, or with --prefill-tokens T
 *                            vLLM's reply carrying routed_experts of T prompt
 *                            tokens (base64 .npy, T x layers x top-k u1: at
 *                            4096 x 48 x 8 a 2.1 MB body), sent from one
 *                            buffer by reference (no copy per request)
 *   GET anything          -> 200 {}
 *
 * The token stream is vLLM's completions stream: --stream-tokens N events
 * "data: {...,"choices":[{"index":0,"text":" tNNN",...}]}\n\n", one HTTP
 * chunk each, --token-interval-ms apart, then (when the request asked for
 * stream_options.include_usage) a usage event, then "data: [DONE]\n\n" and
 * the last chunk. Each token's text carries the CLOCK_MONOTONIC time (ns)
 * it was sent at, so a client on this machine reads each event's latency
 * through the proxy (bench_sse).
 *
 * usage: bench_upstream [--port N] [--prefill-tokens T] [--layers L] [--experts E]
 *          [--topk K] [--seed S] [--stream-tokens N] [--token-interval-ms X]
 * Prints "listening on PORT" once it accepts; runs until killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "eldr/rng.h"
#include "eldr/routed_experts.h"

typedef struct conn conn;

static struct event_base *base;
static char *prefill_resp, *decode_resp;
static size_t prefill_resp_len, decode_resp_len;
static long stream_tokens = 64;
static double token_interval_s = 0.02;

struct conn {
  evutil_socket_t fd;
  struct event *rev, *wev, *tick;
  struct evbuffer *out;
  char *in;
  size_t n, cap;
  /* a stream in progress */
  int streaming, usage;
  long sent;
  int closing;
};

static double mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void conn_free(conn *c) {
  event_free(c->rev);
  event_free(c->wev);
  event_free(c->tick);
  evbuffer_free(c->out);
  close(c->fd);
  free(c->in);
  free(c);
}

/* Write what is queued; EV_WRITE while the socket does not take it all. */
static int flush(conn *c) {
  while (evbuffer_get_length(c->out)) {
    int w = evbuffer_write(c->out, c->fd);
    if (w > 0) continue;
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) break;
    return -1;
  }
  if (evbuffer_get_length(c->out)) event_add(c->wev, NULL);
  return 0;
}

static void chunk(conn *c, const char *p, size_t n) {
  evbuffer_add_printf(c->out, "%zx\r\n", n);
  evbuffer_add(c->out, p, n);
  evbuffer_add(c->out, "\r\n", 2);
}

static void process(conn *c);

static void tick_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  conn *c = arg;
  char ev_[512];
  if (c->sent < stream_tokens) {
    int n = snprintf(ev_, sizeof ev_,
                     "data: {\"id\":\"cmpl-b\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
                     "\"choices\":[{\"index\":0,\"text\":\" t%.0f\",\"logprobs\":null,\"finish_reason\":%s,"
                     "\"stop_reason\":null}]}\n\n",
                     mono_ns(), c->sent + 1 == stream_tokens ? "\"length\"" : "null");
    chunk(c, ev_, (size_t)n);
    c->sent++;
  }
  if (c->sent == stream_tokens) {
    if (c->usage) {
      int n = snprintf(ev_, sizeof ev_,
                       "data: {\"id\":\"cmpl-b\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
                       "\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":%ld,"
                       "\"completion_tokens\":%ld,\"prompt_tokens_details\":null}}\n\n",
                       12 + stream_tokens, stream_tokens);
      chunk(c, ev_, (size_t)n);
    }
    chunk(c, "data: [DONE]\n\n", 14);
    evbuffer_add(c->out, "0\r\n\r\n", 5);
    c->streaming = 0;
  }
  if (flush(c)) {
    conn_free(c);
    return;
  }
  if (c->streaming) {
    struct timeval tv = {(time_t)token_interval_s, (suseconds_t)((token_interval_s - (time_t)token_interval_s) * 1e6)};
    evtimer_add(c->tick, &tv);
  } else {
    process(c); /* a pipelined request */
  }
}

static void respond(conn *c, const char *body, size_t blen) {
  if (c->streaming) {
    c->streaming = 1;
    c->sent = 0;
    c->usage = memmem(body, blen, "\"include_usage\":true", 20) != NULL;
    evbuffer_add_printf(c->out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                                "Transfer-Encoding: chunked\r\n\r\n");
    static const struct timeval zero = {0, 0};
    evtimer_add(c->tick, &zero); /* the first token on the next loop turn */
  }
}

static void process(conn *c) {
  while (!c->streaming) {
    char *he = memmem(c->in, c->n, "\r\n\r\n", 4);
    if (!he) return;
    size_t hl = (size_t)(he - c->in) + 4, bl = 0;
    for (char *p = c->in; p < he; p++) /* Content-Length, any case */
      if ((*p == '\n') && !strncasecmp(p + 1, "content-length:", 15)) bl = strtoul(p + 16, NULL, 10);
    if (c->n < hl + bl) return;
    const char *body = c->in + hl;
    if (!strncmp(c->in, "GET ", 4)) {
      evbuffer_add(c->out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", 70);
    } else if (memmem(body, bl, "\"do_remote_prefill\":true", 24)) {
      if (memmem(body, bl, "\"stream\":true", 13)) c->streaming = 1;
      else evbuffer_add_reference(c->out, decode_resp, decode_resp_len, NULL, NULL);
    } else if (memmem(body, bl, "\"stream\":true", 13)) {
      c->streaming = 1;
    } else {
      evbuffer_add_reference(c->out, prefill_resp, prefill_resp_len, NULL, NULL);
    }
    if (c->streaming) respond(c, body, bl);
    memmove(c->in, c->in + hl + bl, c->n - hl - bl);
    c->n -= hl + bl;
    if (flush(c)) {
      conn_free(c);
      return;
    }
  }
}

static void read_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)ev;
  conn *c = arg;
  if (c->cap - c->n < 4096) {
    size_t cap = c->cap ? c->cap * 2 : 16384;
    char *q = realloc(c->in, cap);
    if (!q) {
      conn_free(c);
      return;
    }
    c->in = q;
    c->cap = cap;
  }
  ssize_t r = recv(fd, c->in + c->n, c->cap - c->n, 0);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (r <= 0) {
    conn_free(c);
    return;
  }
  c->n += (size_t)r;
  process(c);
}

static void write_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  conn *c = arg;
  if (flush(c)) conn_free(c);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int sl, void *arg) {
  (void)l;
  (void)sa;
  (void)sl;
  (void)arg;
  conn *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  evutil_make_socket_nonblocking(fd);
  c->fd = fd;
  c->rev = event_new(base, fd, EV_READ | EV_PERSIST, read_cb, c);
  c->wev = event_new(base, fd, EV_WRITE, write_cb, c);
  c->tick = evtimer_new(base, tick_cb, c);
  c->out = evbuffer_new();
  event_add(c->rev, NULL);
}

/* The prefill reply vLLM sends with routed_experts for T prompt tokens. */
static char *prefill_body(long T, long L, long E, long K, uint64_t seed, size_t *len) {
  static const char small[] =
      "{\"id\":\"cmpl-p\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
      "\"text\":\"x\",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],\"usage\":"
      "{\"prompt_tokens\":12,\"total_tokens\":13,\"completion_tokens\":1,\"prompt_tokens_details\":null},"
      "\"kv_transfer_params\":{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_engine_id\":\"e0\","
      "\"remote_block_ids\":[1,2,3],\"remote_host\":\"127.0.0.1\",\"remote_port\":5600}}";
  if (T == 0) {
    *len = sizeof small - 1;
    return strdup(small);
  }
  eldr_shape sh = {(uint32_t)L, (uint32_t)E, (uint32_t)K};
  uint16_t *sel = malloc((size_t)(T * L * K) * sizeof *sel);
  if (!sel) return NULL;
  eldr_rng rng;
  eldr_rng_seed(&rng, seed);
  for (long t = 0; t < T; t++) /* skewed per-layer popularity, distinct ids per row (as bench route) */
    for (long l = 0; l < L; l++) {
      uint16_t *row = sel + (t * L + l) * K;
      for (long k = 0; k < K; k++) {
        uint16_t e;
        int dup;
        do {
          double u = eldr_rng_uniform(&rng);
          e = (uint16_t)((double)E * u * u);
          dup = 0;
          for (long j = 0; j < k; j++) dup |= row[j] == e;
        } while (dup);
        row[k] = e;
      }
    }
  char *b64 = NULL;
  size_t blen = 0;
  int rc = eldr_routed_experts_encode(sel, (size_t)T, &sh, E > 256 ? ELDR_SEL_U16LE : ELDR_SEL_U8, &b64, &blen);
  free(sel);
  if (rc) return NULL;
  size_t cap = blen + 1024;
  char *o = malloc(cap);
  if (!o) return NULL;
  int n = snprintf(o, cap,
                   "{\"id\":\"cmpl-p\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
                   "\"text\":\"x\",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null,"
                   "\"routed_experts\":\"%s\"}],\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld,"
                   "\"completion_tokens\":1,\"prompt_tokens_details\":null},"
                   "\"kv_transfer_params\":{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
                   "\"remote_engine_id\":\"e0\",\"remote_block_ids\":[1,2,3],\"remote_host\":\"127.0.0.1\","
                   "\"remote_port\":5600}}",
                   b64, T, T + 1);
  free(b64);
  *len = (size_t)n;
  return o;
}

static char *with_head(const char *body, size_t blen, size_t *len) {
  size_t cap = blen + 256;
  char *o = malloc(cap);
  if (!o) return NULL;
  int h = snprintf(o, cap, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n", blen);
  memcpy(o + h, body, blen);
  *len = (size_t)h + blen;
  return o;
}

int main(int argc, char **argv) {
  int port = 0;
  long T = 0, L = 48, E = 128, K = 8;
  uint64_t seed = 1;
  for (int i = 1; i < argc; i += 2) { /* flag, value */
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) goto usage;
    if (!strcmp(a, "--port")) port = atoi(v);
    else if (!strcmp(a, "--prefill-tokens")) T = atol(v);
    else if (!strcmp(a, "--layers")) L = atol(v);
    else if (!strcmp(a, "--experts")) E = atol(v);
    else if (!strcmp(a, "--topk")) K = atol(v);
    else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--stream-tokens")) stream_tokens = atol(v);
    else if (!strcmp(a, "--token-interval-ms")) token_interval_s = atof(v) / 1000;
    else goto usage;
  }
  if (T < 0 || L < 1 || E < 1 || K < 1 || K > E || stream_tokens < 1 || token_interval_s < 0) goto usage;
  signal(SIGPIPE, SIG_IGN);
  size_t pl;
  char *pb = prefill_body(T, L, E, K, seed, &pl);
  static const char dec[] = "{\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":"
                            "[{\"index\":0,\"text\":\" a short answer\",\"logprobs\":null,\"finish_reason\":\"stop\","
                            "\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":16,"
                            "\"completion_tokens\":4,\"prompt_tokens_details\":null}}";
  if (!pb || !(prefill_resp = with_head(pb, pl, &prefill_resp_len)) ||
      !(decode_resp = with_head(dec, sizeof dec - 1, &decode_resp_len))) {
    fprintf(stderr, "bench_upstream: cannot build the replies\n");
    return 1;
  }
  free(pb);
  base = event_base_new();
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct evconnlistener *lis = evconnlistener_new_bind(base, accept_cb, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                                       1024, (struct sockaddr *)&sa, sizeof sa);
  if (!lis) {
    fprintf(stderr, "bench_upstream: cannot listen on port %d: %s\n", port, strerror(errno));
    return 1;
  }
  socklen_t sl = sizeof sa;
  getsockname(evconnlistener_get_fd(lis), (struct sockaddr *)&sa, &sl);
  printf("listening on %d\nprefill reply %zu bytes\n", ntohs(sa.sin_port), prefill_resp_len);
  fflush(stdout);
  event_base_dispatch(base);
  return 0;
usage:
  fprintf(stderr, "usage: bench_upstream [--port N] [--prefill-tokens T] [--layers L] [--experts E] [--topk K] "
                  "[--seed S] [--stream-tokens N] [--token-interval-ms X]\n");
  return 2;
}
