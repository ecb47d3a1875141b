/* fixture.h — test support for the router's integration tests:
 *  - fx_worker: a small vLLM-PD-speaking HTTP server (libevent, own thread,
 *    loopback, port 0) that records every request it receives and whose
 *    behaviour the test sets (status, routed_experts, SSE chunks, faults);
 *  - tc_*: a blocking HTTP/1.1 test client over a real socket;
 *  - rt_*: the router (eldr_server) running in a thread.
 * Waiting is on conditions with deadlines, never on sleeps. */
#ifndef ELDR_TEST_FIXTURE_H
#define ELDR_TEST_FIXTURE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/serve.h"

typedef struct fx_behaviour {
  int status;              /* completions status (0 = 200) */
  int close_without_reply; /* drop the connection instead of answering */
  int hang;                /* never answer completions */
  int health_status;       /* /health status (0 = 200) */
  const char *routed_experts; /* prefill reply choices[0].routed_experts (NULL: omitted) */
  const char *decode_routed_experts; /* decode reply choices[0].routed_experts */
  long long prompt_tokens; /* usage.prompt_tokens (-1: no usage) */
  long long cached_tokens; /* usage.prompt_tokens_details.cached_tokens (-1: omitted) */
  int no_kv_params;        /* prefill reply without kv_transfer_params */
  const char *const *chunks; /* decode streaming body pieces (NULL: a default stream) */
  size_t n_chunks;
  int die_after_chunks;    /* > 0: streaming decode: reset the connection after that many */
  int stall_after_chunks;  /* > 0: streaming decode: send that many, then hold the rest */
  const char *raw_reply;   /* completions reply body verbatim (status from .status) */
  const char *metrics_text; /* GET /metrics reply (Prometheus text); NULL: 404 */
  size_t stream_bytes;     /* > 0: streaming decode: that many bytes of SSE events, each
                            * 64 KiB piece sent once the previous one was written */
  int keepalive_requests;  /* > 0: a connection that answered that many completions requests
                            * reads the next one and closes unanswered: a keep-alive limit
                            * (nginx's keepalive_requests) or timeout whose close crossed the
                            * client's next request; FIN, or a reset with keepalive_reset */
  int keepalive_reset;
  int keepalive_die;       /* ... and the listener closes with it: the worker died on the
                            * request it read (a new connection is refused) */
  const char *partial_reply; /* completions: these bytes of a reply sent raw, then the
                              * connection closed (FIN): a worker failing mid-reply */
} fx_behaviour;

/* Defaults: 200, no routed_experts, no usage. */
static inline fx_behaviour fx_defaults(void) {
  fx_behaviour b = {0};
  b.prompt_tokens = -1;
  b.cached_tokens = -1;
  return b;
}

typedef struct fx_record {
  char method[8];
  char path[128];
  char request_id[256];
  char authorization[256];
  char traceparent[128], tracestate[600], baggage[1024];
  char *body;
  size_t body_len;
} fx_record;

typedef struct fx_worker fx_worker;

fx_worker *fx_start(const fx_behaviour *b);
/* Same on a given port (e.g. to bring a killed worker back). NULL if busy. */
fx_worker *fx_start_port(const fx_behaviour *b, int port);
/* On an IPv4 address of this host (127.0.0.2 is loopback too); NULL when it cannot bind. */
fx_worker *fx_start_addr(const fx_behaviour *b, const char *addr, int port);
void fx_stop(fx_worker *w); /* closes the socket and joins; records stay readable */
void fx_free(fx_worker *w);
int fx_port(const fx_worker *w);
const char *fx_url(const fx_worker *w);
void fx_set(fx_worker *w, const fx_behaviour *b); /* replace the behaviour (thread-safe) */
size_t fx_count(fx_worker *w, const char *path); /* requests received on path (NULL: all) */
size_t fx_connections(fx_worker *w); /* connections that carried a completions request */
size_t fx_stream_sent(fx_worker *w); /* bytes of stream_bytes streams written so far */
/* Wait until fx_count(w, path) >= n; 0 or -1 after timeout_s. */
int fx_wait(fx_worker *w, const char *path, size_t n, double timeout_s);
/* Copy of the i-th record on path (i < 0: the last); 0 or -1. Free with fx_record_free. */
int fx_get(fx_worker *w, const char *path, long i, fx_record *out);
void fx_record_free(fx_record *r);

/* The default streaming decode body the fixture sends (concatenated). */
extern const char *const fx_default_chunks[];
extern const size_t fx_default_n_chunks;

typedef struct tc_resp {
  int status;
  char *head;    /* status line and headers */
  char *body;    /* de-chunked body, NUL-terminated */
  size_t body_len;
  int chunked;
  int closed;    /* the server closed the connection after the response */
} tc_resp;

/* Write all n bytes to fd (no SIGPIPE, EINTR retried): 0, or -1 when the
 * peer closed or the send failed. */
int tc_send_all(int fd, const char *p, size_t n);
/* Send raw bytes to 127.0.0.1:port and read one response. 0, or -1 on
 * connection failure / timeout / malformed response. */
int tc_raw(int port, const char *raw, size_t len, double timeout_s, tc_resp *out);
/* POST path with a JSON body (extra: additional header lines, each ending CRLF, or NULL). */
int tc_post(int port, const char *path, const char *body, const char *extra, tc_resp *out);
/* tc_post with the response awaited up to timeout_s (tc_post: 20 s) after the request was sent. */
int tc_post_within(int port, const char *path, const char *body, const char *extra, double timeout_s,
                   tc_resp *out);
int tc_get(int port, const char *path, tc_resp *out);
void tc_free(tc_resp *r);
/* Value of a response header (case-insensitive) copied into buf; 0 or -1. */
int tc_header(const tc_resp *r, const char *name, char *buf, size_t cap);

/* A TCP connection to 127.0.0.1:port (nothing sent); -1 on failure. */
int tc_connect(int port);
/* A raw client connection to 127.0.0.1:port with req already sent; -1 on failure. */
int tc_send_raw(int port, const char *req);
/* Read until the text contains `until` or the peer closes (deadline 10 s). */
void tc_read_until(int fd, char *buf, size_t cap, const char *until);

/* Router in a thread. */
typedef struct rt_router {
  eldr_server *srv;
  int port;
  void *thread;
  pthread_mutex_t log_mu; /* taken by the log callback (the router's threads) and rt_log_text */
  char log[8192];         /* written by the router's threads: read it with rt_log_text */
  size_t loglen;
  char log_copy[8192];
} rt_router;
/* The router's log so far, copied under the lock its log callback takes
 * (the router may be writing it from its threads); valid until the next
 * call on r. */
const char *rt_log_text(rt_router *r);
/* Start with cfg (port forced to 0); 0 or error. */
int rt_start(rt_router *r, eldr_serve_config *cfg);
/* Stop the router's loops and join its thread; r->srv stays, to be
 * inspected (what each loop committed), until rt_stop frees it. */
void rt_join(rt_router *r);
/* rt_join if still running, then free the server (r->srv NULL). */
void rt_stop(rt_router *r);
/* Value of one metric line (exact series text before the value) from GET /metrics; -1 if absent. */
double rt_metric(int port, const char *series);
/* Wait until rt_metric(port, series) >= v. */
int rt_wait_metric(int port, const char *series, double v, double timeout_s);
/* Wait until rt_metric(port, series) <= v (and present). */
int rt_wait_metric_le(int port, const char *series, double v, double timeout_s);

double fx_now(void);

/* A routing artifact of shape s with 2 centroids (the lower half of every
 * layer's experts, the upper half), saved under /tmp (tag names the file);
 * the path (malloc'd). Aborts on failure. */
char *fx_artifact(const eldr_shape *s, const char *tag);

#endif
