/* lbclient.h — a closed-loop load generator that spreads requests over
 * router replicas the way a load balancer in front of them does, for the
 * rolling-restart tests (tests/serve/test_drain.c).
 *
 * Each client thread sends requests back to back, replica after replica
 * (round robin), over real sockets, and checks every answer: HTTP 200 and,
 * for a stream, SSE events ending in "data: [DONE]" with the expected
 * number of token events and no error event. It retries only what a load
 * balancer may retry without knowing the request's effect:
 *   - a connection refused (nothing listens: a replica restarting) is made
 *     to the next replica (counted in refused_retries);
 *   - with keep_alive, a request on a reused idle connection that failed
 *     before any byte of a response (the server closed the idle connection
 *     as the request crossed it: RFC 9112 9.3.1) is sent again on a fresh
 *     connection (stale_retries), as HTTP clients and eldr's own upstream
 *     client do;
 *   - once per request, a new connection that ended before any response
 *     byte is made to the next replica (fresh_retries): a listener that
 *     closes resets the handshakes its queue still holds, whatever the
 *     server does (eldr's drain accepts its backlog first, but a SYN can
 *     cross the close), and HAProxy's `retry-on conn-failure
 *     empty-response` (bench/rolling_restart.sh) retries the same.
 * Anything else is a failed request, kept with its reason.
 *
 * Ownership: lb_run owns its threads and sockets; the caller's config and
 * stats outlive it. Errors: the stats say what failed; nothing aborts.
 * Threads: lb_start spawns cfg->clients threads; lb_stop (any thread)
 * ends them after their current request and joins them. */
#ifndef ELDR_TEST_LBCLIENT_H
#define ELDR_TEST_LBCLIENT_H

#include <pthread.h>
#include <stddef.h>

#define LB_MAX_REPLICAS 8
#define LB_MAX_CLIENTS 64

typedef struct lb_cfg {
  int ports[LB_MAX_REPLICAS]; /* replicas on 127.0.0.1 */
  int n;
  int clients;        /* concurrent closed-loop clients */
  int keep_alive;     /* reuse a connection per replica (else one per request) */
  int max_tokens;     /* each request's max_tokens; a stream must carry exactly that many */
  int stream_every;   /* request i of a client streams when i % stream_every == 0 (0: never) */
  double timeout_s;   /* one request's bound (answer complete) */
} lb_cfg;

typedef struct lb_stats {
  size_t requests, ok, failed;
  size_t refused_retries, stale_retries, fresh_retries;
  size_t per_replica[LB_MAX_REPLICAS]; /* answered 200, by replica index */
  char first_error[256];
} lb_stats;

typedef struct lb_run lb_run;
typedef struct lb_client {
  lb_run *run;
  int id;
} lb_client;

struct lb_run {
  lb_cfg cfg;
  pthread_t th[LB_MAX_CLIENTS];
  lb_client arg[LB_MAX_CLIENTS];
  int started;
  _Atomic int stop;
  pthread_mutex_t mu;
  lb_stats st;
};

/* Start cfg->clients client threads (the config is copied). */
void lb_start(lb_run *r, const lb_cfg *cfg);
/* Requests answered so far (ok + failed). */
size_t lb_done(lb_run *r);
/* Stop after the requests in progress, join; the totals into *out. */
void lb_stop(lb_run *r, lb_stats *out);

#endif
