/* serve_types.h — the router's private types and the seams between its
 * files (serve-private; include only from the .c files of src/serve).
 *
 *   conn.c      client connections: HTTP/1.1 request heads and bodies in,
 *               responses (whole, or streamed) out, dispatch by path
 *   accept.c    the listener on and off: accept errors' back-off, the
 *               file descriptor reserve for the upstream legs
 *   proxy.c     one completion request: the prefill leg, the signature and
 *               the decode decision, the decode leg, retries, the relay;
 *               /v1/models passes through the same leg machinery
 *   workers.c   workers: address, idle connection pool, health checks,
 *               ejection, the worker lists a reload swaps
 *   metrics.c   counters and histograms, GET /metrics and GET /health
 *   server.c    lifecycle: create, run, stop, reload (all or nothing), free
 *   sigpath.c   the signature path (sigpath.h)
 *   status.c    the watch (window, drift, live rho, artifact identity):
 *               GET /eldr/status, its /metrics lines, POST /admin/reload
 *
 * The seams form one circle by nature — a connection that ends frees its
 * request (eldr__rq_free / eldr__rq_abort) and a request answers through its
 * connection (eldr__send_*) — so every type and every cross-file function is
 * declared here, once, and no .c file includes another's header.
 *
 * Threads: a server is cfg.threads loops (eldr_server, one per thread,
 * server.c / loops.c); everything here runs on its loop's thread, except
 * what the loops share and say so: slots (atomics, group mutex), each
 * loop's metrics (written by the loop, read by the one rendering
 * /metrics: _Atomic), the group (mutex), the log (serialised), the
 * signature cache (eldr/sigshard.h: a mutex per shard) and the watch
 * window (status.c: its mutex).
 * Ownership: eldr_server owns its workers (all_workers), connections (conns),
 * artifact, policy, signature path; a connection owns its request (c->r); a
 * request owns its buffers and holds one in-flight reference on the worker
 * of its current leg (worker.inflight).
 */
#ifndef ELDR_SERVE_TYPES_H
#define ELDR_SERVE_TYPES_H

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "eldr/artifact.h"
#include "eldr/policy.h"
#include "eldr/serve.h"
#include "bufpool.h"
#include "serve_internal.h"
#include "bus.h"
#include "dnsmsg.h"
#include "record.h"
#include "sigpath.h"
#include "eldr/upstream.h"

/* ---- metrics ---------------------------------------------------------------- */

enum { DEC_LOCALITY, DEC_LOAD, DEC_NONE, DEC__N };
enum { ARR_PREDICTED, ARR_BELOW_THRESHOLD, ARR_NO_PREDICTION, ARR_EXACT, ARR__N };
/* --pd sglang-exact: how the wait for the prefill's published counts ended (sglexact.c) */
enum { SGX_EXACT, SGX_TIMEOUT, SGX_NOT_PUBLISHED, SGX_FAILED, SGX_BAD, SGX_NOT_READ, SGX_ABORTED, SGX__N };
enum { SPF_OK, SPF_NO_EXPERTS, SPF_FAILED, SPF_TIMEOUT, SPF_ABANDONED, SPF__N };
enum { OUT_OK, OUT_CLIENT_ERROR, OUT_UPSTREAM_ERROR, OUT_TIMEOUT, OUT_CANCELLED, OUT_STREAM_ABORTED, OUT__N };
enum { FB_NONE = ELDR__FB_NONE, FB_SHAPE_MISMATCH = ELDR__FB_SHAPE_MISMATCH, FB__N = ELDR__FB__COUNT };
enum { BAD_JSON, BAD_FIELD, BAD_TOO_LARGE, BAD_HEAD, BAD_TIMEOUT, BAD_PATH, BAD_METHOD, BAD_LENGTH, BAD_AUTH, BAD__N };

#define HB 14
/* A loop's counters are written by that loop only and read by whichever
 * loop renders /metrics (it sums every loop's): hence _Atomic (relaxed
 * enough on x86: the increments of a loop's own lines are not contended). */
typedef _Atomic uint64_t ctr;

typedef struct histo {
  double bound[HB];
  ctr n[HB + 1];
  _Atomic double sum;
  ctr count;
} histo;

typedef struct metrics {
  /* by the policy that made the decision (a reload does not relabel them) */
  ctr requests[ELDR_POLICY__COUNT][DEC__N][OUT__N];
  ctr fallback[FB__N];
  ctr bad[BAD__N];
  ctr retries[2];
  ctr resends[3];     /* legs sent again on a fresh connection after a reused one failed
                       * before any reply byte (eldr_up_resent), by kind: prefill, decode, models */
  ctr disconnects;
  ctr no_kv_params;
  ctr re_rejected[ELDR_RE__N]; /* routed_experts rejected, by eldr_re_reason */
  ctr spliced;                 /* decode replies with the prefill's prompt rows spliced in */
  ctr reloads_ok, reloads_err;
  ctr dns_errors, dns_updates; /* failed lookups; DNS group changes applied */
  ctr scrapes[2];              /* worker /metrics reads: ok, failed */
  ctr conn_refused;   /* connections answered 503: at max_connections */
  ctr conn_dropped;   /* connections closed unanswered: far above it */
  ctr accept_errors;  /* accept() failures (EMFILE, ENFILE, ENOBUFS, ...) */
  ctr accept_pauses;  /* listener switched off for the fd reserve (accept.c) */
  ctr accept_paused_loops; /* 1 while it is off (a gauge: summed over the loops) */
  ctr stream_pauses;  /* decode legs paused for a slow streaming client */
  ctr mem_trims;      /* heap trims after large requests */
  ctr accepted;       /* client connections this loop accepted */
  ctr hang_probes[2];  /* hang probes (hang.c): answered, not answered */
  ctr queue_timeouts;  /* streaming decode legs ended by their own queue timeout */
  /* --pd sglang (sglpd.c): decoders chosen at arrival, by signature (ARR_*) */
  ctr arrival[ARR__N];
  /* --pd sglang-exact (sglexact.c): counts polls by end (SGX_*) */
  ctr sgl_exact[SGX__N];
  /* its prefill legs, by end (SPF_*); footprint predictions replaced by the true counts */
  ctr sgl_prefill[5];
  ctr fp_replaced;
  histo sig, decision, request;
  histo exact_wait; /* --pd sglang-exact: the decode leg's wait for the prefill's counts */
} metrics;

/* ---- types ---------------------------------------------------------------- */

enum { ROLE_PREFILL = 0, ROLE_DECODE = 1 };
extern const char *const eldr__role_name[2];

typedef struct worker worker;
typedef struct hconn hconn;
typedef struct rq rq;
typedef struct dns_ticket dns_ticket;
typedef struct eldr__slot eldr__slot;
typedef struct eldr__sglpd eldr__sglpd;
typedef struct eldr__group eldr__group;

/* ---- loops.c: one artifact per load ---------------------------------------------
 * An artifact file is read, parsed and validated once, by the loop that
 * leads a start or a reload (loop 0 at start; the loop whose reload
 * committed); every other loop, and every footprint generation built on
 * it, takes a reference, so all loops run the very artifact the leader
 * validated even when the file changes meanwhile. The artifact is
 * read-only once loaded; the last reference frees it. Any thread. */
typedef struct eldr__art {
  _Atomic size_t refs;
  eldr_artifact *a; /* owned */
} eldr__art;
/* Wrap a loaded artifact (taken; freed on failure): NULL on ENOMEM. */
eldr__art *eldr__art_wrap(eldr_artifact *a);
/* One more reference (NULL: NULL). */
eldr__art *eldr__art_ref(eldr__art *r);
/* One fewer; the last frees the artifact. NULL is a no-op. */
void eldr__art_put(eldr__art *r);
/* Test hook: called on the leading loop's thread after it committed a
 * start's or a reload's configuration and before the other loops are
 * handed it (NULL: none). */
extern void (*eldr__lead_hook)(eldr_server *leader);

/* ---- loops.c: what the loops share ------------------------------------------
 * Every loop has its own worker object per listed URL (its own pool, health
 * check, scrape); the loops' objects of one (role, URL) share a slot: the
 * legs in flight on the worker from all loops (what decisions read, and
 * reserve by compare-and-swap) and its counters. Slots live in the group,
 * found by (role, URL) under the group's mutex when a worker is created,
 * released with the last worker object using them. */
struct eldr__slot {
  _Atomic uint32_t inflight;  /* legs in flight from every loop */
  _Atomic int healthy;        /* admitted: 0 once ejected, until a health check
                               * (loop 0 runs them) re-admits it (starts at 1) */
  _Atomic int fails;          /* consecutive failures, from every loop */
  _Atomic int probed;         /* answered a health check or a leg at least once */
  /* loop 0's last scrape of the worker's /metrics (scrape.c), for every loop */
  _Atomic int scrape_valid;
  _Atomic uint32_t scraped, inflight_at_scrape;
  _Atomic uint32_t hung_gen;  /* times it was found hung: every loop ends the
                               * legs on it that started before */
  /* the hang detector (hang.c): monotonic nanoseconds of the last byte from
   * the worker on any leg, or of a leg started while none was in flight
   * (the clock starts when work arrives); of the last answered health
   * check or probe */
  _Atomic int64_t progress_ns, answered_ns;
  uint64_t key;               /* rendezvous identity: eldr_policy_worker_key(url) */
  ctr requests, ejections, err_connect, err_status, err_timeout, hangs;
  int role;
  size_t refs;                /* worker objects using it (group mutex) */
  eldr__slot *next;           /* group list (group mutex) */
  char url[];
};

/* The slot of (role, url), created at first use: NULL on ENOMEM. Any thread. */
eldr__slot *eldr__slot_get(eldr__group *g, int role, const char *url);
/* One worker object fewer on it; the last frees it. NULL is a no-op. */
void eldr__slot_put(eldr__group *g, eldr__slot *sl);
/* Reserve one leg on sl if its in-flight count is still `seen` (the value
 * the decision read): 1, else 0 (another loop changed it: decide again). */
int eldr__slot_reserve(eldr__slot *sl, uint32_t seen);
/* Rounds of decide-then-reserve before a decision takes its pick anyway. */
#define ELDR__RESERVE_TRIES 16

/* The loops of one server. Created with loop 0 (the public handle), freed
 * after the last loop. mu guards slots and the reload mailboxes; logmu
 * serialises cfg.log; sigshare (its own mutex) holds the signature cache
 * the loops share, watch (mu) the watch window they share (status.c). */
struct eldr__group {
  pthread_mutex_t mu, logmu;
  int n;                   /* loops */
  eldr_server **loops;     /* n; [0] is the handle eldr_server_new returned */
  eldr__slot *slots;
  eldr__sigshare sigshare; /* the signature cache committed last (sigpath.h) */
  struct eldr__watchcore *watch; /* a reference on the watch committed last, or NULL */
  uint64_t reload_gen;     /* reloads committed so far, any loop (mu) */
  _Atomic int draining;    /* drain.c: eldr_server_drain was called */
  eldr__bus *bus;          /* the fleet bus (bus.h), or NULL: --bus not set */
  _Atomic double drain_start, drain_deadline; /* monotonic seconds */
  _Atomic size_t drain_busy, drain_idle; /* connections with a request at its start; idle ones closed */
  double auth_log_t;       /* auth.c: the last refusal logged (mu) */
  uint64_t auth_refused;   /* refusals not logged since (mu) */
};
eldr__group *eldr__group_new(int n);
void eldr__group_free(eldr__group *g);
/* Run loops 1..n-1 on their own threads and loop 0 on this one until
 * loop 0 stops; then stop and join the others. 0, or ELDR_EIO. */
int eldr__group_run(eldr__group *g);
/* Ask one loop to leave its event loop (any thread). */
void eldr__loop_stop(eldr_server *s);

/* Decisions may pick w: admitted (shared), resolved and listed (this loop's). */
#define eldr__worker_up(w) (!(w)->retired && (w)->addrlen != 0 && (w)->slot->healthy)
typedef struct eldr__watchst eldr__watchst;

struct worker {
  eldr_server *s;
  char *url;
  char host[256];
  char hosthdr[300];
  int port;
  int role;
  uint64_t id;         /* unique per server (a retry's "tried" list holds ids) */
  uint32_t inflight;   /* legs in flight; each keeps a retired worker alive */
  int retired;         /* a reload dropped it (this loop's list) */
  eldr__slot *slot;    /* shared with the other loops' worker of this role and URL */
  struct sockaddr_storage addr;
  socklen_t addrlen;
  eldr_up **pool;     /* idle keep-alive connections */
  size_t npool, poolcap;
  eldr_up *hc;        /* health check connection */
  struct event *hc_timer;
  int hc_status;
  int hc_hang;         /* the check in flight is a hang probe (hang.c) */
  int64_t hc_progress; /* the slot's progress_ns when it was made one */
  dns_ticket *dns;            /* lookup of host in flight (resolve.c), or NULL */
  struct event *dns_timer;    /* retry of a host that did not resolve (NULL: numeric host) */
  eldr_up *sc;               /* /metrics scrape connection (scrape.c) */
  char *sc_buf;
  size_t sc_n, sc_cap;
  int sc_status;
  int scrape_valid;           /* scraped is from the last scrape, which succeeded */
  uint32_t scraped;           /* vllm:num_requests_running + waiting */
  double scraped_kv;          /* vllm:kv_cache_usage_perc (-1: absent) */
  uint32_t inflight_at_scrape; /* this replica's in-flight legs when it was sent */
  int bus_di1;                /* the fleet bus's index of this decoder + 1 (0: not looked up) */
  worker *next_all;
};

/* A DNS group (--prefill-dns / --decode-dns NAME:PORT): its addresses are
 * workers "http://IP:PORT" (resolve.c). */
typedef struct dns_group {
  eldr_server *s;
  int role;
  char *spec;              /* "NAME:PORT" as configured */
  char host[256];
  int port;
  char **urls;             /* current addresses as worker URLs, sorted */
  size_t n;
  struct event *timer;     /* re-resolution every dns_interval */
  struct group_query *q;   /* lookup in flight (resolve.c), or NULL */
  int logged_cut;          /* an answer cut at evdns's limit was logged */
  struct dns_group *next;
} dns_group;

enum { LEG_PREFILL, LEG_DECODE, LEG_MODELS };
_Static_assert(LEG_MODELS == 2, "metrics.resends: one counter per leg kind");

typedef struct leg {
  worker *w;
  eldr_up *up;            /* connection of the exchange in flight, or NULL */
  struct event *deadline;
  int kind;
  int streaming, started;
  int sent;                /* the worker may have read the request (eldr_up_sent) */
  int hung_timer;          /* the deadline armed is a first-byte / idle one, not the whole leg's */
  double t_end;            /* the whole leg's deadline (monotonic seconds) */
  uint32_t hung_gen;       /* the worker slot's hung_gen when the leg started */
  int status;              /* reply status (0 until the head arrived) */
  char ctype[128];
  char *buf;               /* reply body (not relayed while streaming) */
  size_t n, cap;
} leg;

#define MAX_TRIED 17
#define MAX_REPLY (512u << 20) /* largest buffered worker reply */

/* The footprint policy's state of one configuration (fpstate.c): refs =
 * 1 while it is the server's + 1 per request holding a ticket on it. pol:
 * FOOTPRINT with fp attached, for on_route / on_end of this generation. */
typedef struct eldr__fpstate {
  eldr_footprint *fp;
  eldr__art *art; /* the artifact it was built from (a reference) */
  eldr_policy pol;
  size_t n;    /* decoders it was built for */
  size_t refs;
} eldr__fpstate;

/* A request's own byte buffers, kept when it goes back to its loop's pool
 * (rq_alloc reuses them: no allocation once warm): the header lines every
 * leg carries (forwarded_lines), the prefill and decode bodies, the decode
 * reply as fixed for the client. proxy.c owns them (sizes, reuse, free). */
typedef struct rq_bufs {
  eldr__buf fwd, pb, db, fix;
} rq_bufs;

struct rq {
  eldr_server *s;
  hconn *c; /* NULL once the client is gone */
  int is_models;
  eldr__req req;
  eldr__prompt prompt; /* the prompt's block hashes, computed once */
  char reqid[40];                       /* the engines' id: a random UUID (both legs) */
  char client_reqid[ELDR__HTTP_REQID_MAX]; /* the client's X-Request-Id ("": none): echoed, logged */
  rq_bufs b;
  rq *pool_next;
  eldr_reply_prefill pr;
  uint64_t tried[MAX_TRIED]; /* worker ids */
  int ntried;
  leg L;
  int decision;
  int policy;         /* the policy of the decision (metrics label) */
  int paused;         /* decode leg not read: the client's output is full */
  eldr__sglpd *pd;    /* --pd sglang: the prefill leg sent beside the decode leg
                       * (sglpd.c; owned), NULL in the vLLM flow */
  int arrival;        /* --pd sglang: how the decoder was chosen at arrival (ARR_*) */
  int exact;          /* --pd sglang-exact: how the counts poll ended (SGX_*; -1 none) */
  double confidence;  /* --pd sglang: the prediction's confidence (-1: none) */
  eldr__slot *reserved; /* the decode decision's pick, its in-flight count taken
                         * for the leg about to start (NULL: none) */
  size_t big;         /* bytes of large buffers it held (trim the heap after) */
  double t0;
  char last_err[200];
  int last_timeout;    /* the last failed leg ran out of time (the answer is then 504, not 502) */
  float *wsig;         /* the signature kept for a live-rho pair (status.c), or NULL */
  struct eldr_re_stream *rs; /* a streamed decode reply's event carrying routed_experts
                                (rechook.c, for the record and the live rho), or NULL */
  uint64_t wsig_hash;  /* the artifact it was built under */
  /* access log (accesslog.c) */
  double al_sim, al_first, al_last; /* similarity; first/last decode byte */
  double al_pf;                     /* the prefill's end: the decode leg's first start (0: none) */
  uint32_t al_events;               /* SSE events relayed */
  char al_decoder[128];
  /* footprint policy: the generation and ticket of the decode leg (fpstate.c) */
  eldr__fpstate *fps;
  uint64_t fp_ticket;
  /* serve --record: the record being built (rechook.c), NULL when not sampled */
  eldr__rec_item *rec;
  /* the fleet bus (busview.c): the decode leg's route was published */
  uint64_t bus_dec;
  int bus_on, bus_w;
};

enum { C_HEAD, C_BODY, C_BUSY, C_CLOSING };

struct hconn {
  eldr_server *s;
  evutil_socket_t fd;
  struct event *rev, *wev; /* read (persistent, on unless suspended); write (only while out is not empty) */
  struct evbuffer *out;    /* what the socket did not take yet */
  eldr__buf in;            /* bytes read, [inoff, in.n) not consumed: a loop's spare
                            * (s->inbufs) taken when bytes arrive, given back once
                            * they are all consumed (an idle connection holds none) */
  size_t inoff;
  int rsusp;               /* reading suspended: the input bound is reached */
  struct event *deadline;  /* idle keep-alive (dl_idle) or the request head/body bound */
  int dl_idle;
  int state;
  int in_process;
  int keep_alive;
  int head_only;
  int resp_chunked; /* 1 = chunked, 2 = raw until close (HTTP/1.0) */
  int refusing;     /* accepted above max_connections: answered 503 */
  int unauth;       /* the head's credentials failed (auth.c): 1 API key, 2 admin token */
  size_t body_need;
  /* a chunked request body: decoded into cbody as it arrives */
  struct evbuffer *cbody;
  int cst;                /* CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER */
  uint64_t cleft;         /* bytes left in the current chunk */
  rq *r;
  hconn *prev, *next;
  /* the request head being read and dispatched: a loop's spare (s->heads)
   * from a request's first byte until its dispatch returned (NULL while
   * idle or while the request waits for its workers); what the response
   * needs of it afterwards is kept below */
  eldr__http_head *head;
  int minor;               /* HTTP/1.<minor> of the request being answered */
  char *origin;            /* its Origin header (CORS; NULL: none), until the response is done */
};

struct eldr_server {
  eldr_serve_config cfg;
  eldr__group *grp;       /* the loops of this server and what they share */
  int loop;               /* this loop's index (0 owns the group and the signals) */
  eldr_serve_config *follow_cfg; /* another loop's reloaded configuration to
                                  * build, or NULL (group mutex) */
  eldr__art *follow_art;         /* the artifact that loop loaded for it (a
                                  * reference, NULL: none) (group mutex) */
  uint64_t follow_gen, cfg_gen;  /* its reload number, and that of the
                                  * configuration this loop runs (group mutex) */
  _Atomic int reload_req;        /* eldr_server_reload asked this loop to lead one */
  struct event_base *base;
  struct evconnlistener *lis;
  struct event *ev_stop, *ev_reload, *ev_health, *ev_scrape, *sig_hup, *sig_int, *sig_term;
  struct event *ev_hung;  /* a worker was found hung: end this loop's legs on it */
  struct event *ev_hang;  /* loop 0: the hang detector's tick (hang.c) */
  struct event *ev_drain; /* drain.c: this loop's part of a drain */
  struct event *ev_drain_tick; /* loop 0: is the drain over yet */
  int port;
  worker **w[2];
  size_t nw[2];
  worker *all_workers;    /* every worker alive: listed, or retired and draining */
  struct evdns_base *dns; /* resolver on the loop (resolve.c) */
  dns_group *groups;
  FILE *access_log;       /* NULL: off (accesslog.c) */
  uint64_t next_worker_id;
  hconn *conns;
  _Atomic size_t nconns;  /* read by the loop rendering /metrics */
  size_t nrefusing, max_conns;
  /* accept() failing (EMFILE...): listener off for a growing delay (accept.c) */
  struct event *ev_accept;
  double accept_delay_s, accept_log_t;
  uint64_t accept_suppressed;
  /* the fd reserve (accept.c): listener off while at most fd_reserve fds
   * are free; ev_accept then asks again after fd_delay_s */
  int fd_limit, fd_reserve, fd_pause_at; /* RLIMIT_NOFILE at start, R, limit - R (INT_MAX: never) */
  int fd_paused;
  double fd_tight_until; /* till then accepts probe the next free fd (0: not tight) */
  double fd_delay_s, fd_log_t;
  uint64_t fd_suppressed;
  /* the heap trimmed once after large requests ended */
  struct event *ev_trim;
  size_t trim_bytes;
  /* locality: recent decisions (1 = fell back to load), routed_experts seen */
  uint8_t recent[256];
  size_t nrecent, irecent;
  double re_seen_t;
  const eldr_artifact *art; /* artref's artifact, or NULL (read-only: other loops use it) */
  eldr__art *artref;      /* the committed configuration's artifact (one reference) */
  _Atomic uint64_t art_hash; /* its text hash (0: none), for any loop's /eldr/status */
  _Atomic uint64_t run_gen;  /* the reload number of the configuration committed (0: the start's) */
  eldr_policy pol, jsq;
  eldr__fpstate *fps;     /* FOOTPRINT with latency coefficients, else NULL (JSQ) */
  int logged_fp;
  int logged_exact;  /* --pd sglang-exact without an artifact or a signature policy (logged once) */
  eldr__sigpath sp;       /* signature extraction, cache, deferred store */
  eldr__busview *bv;      /* this loop's side of the fleet bus, or NULL */
  eldr__watchst *watch;   /* with an artifact: the watch (status.c), else NULL */
  uint32_t *loads;
  uint32_t *seen;         /* in-flight counts the loads were computed from */
  uint64_t *keys;         /* the workers' rendezvous keys (slot->key), as loads */
  uint8_t *healthy;
  size_t loadcap;
  int logged_shape_mismatch, logged_splice;
  /* serve --record (rechook.c): NULL when off */
  eldr__rec *rec;
  char rec_artifact[40];     /* the committed artifact's identity in records */
  uint64_t rec_errors_logged;
  /* requests that ended, kept with their buffers for the next (proxy.c) */
  rq *rq_pool;
  size_t rq_pooled;
  eldr__bufpool bufs;     /* the loop's large reply buffers (bufpool.h) */
  eldr__spares heads, inbufs; /* spare request heads and connection input buffers (conn.c) */
  metrics m;
};

/* ---- small helpers (every file) -------------------------------------------- */

static inline double eldr__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline struct timeval eldr__tv_of(double s) {
  struct timeval tv;
  tv.tv_sec = (time_t)s;
  tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
  return tv;
}

/* One log line through cfg.log (no-op without one). */
void eldr__logf(eldr_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* host:port can be listened on now (a plain bind, closed at once; port 0:
 * yes): what the start checks first. 0 or ELDR_EIO naming the address. */
int eldr__port_check(const char *host, int port, eldr_diag *d);
/* The same for what concerns the whole process and every loop meets alike
 * (a configuration committed, a name resolved): logged by loop 0 only, so
 * that --threads N does not print it N times. */
void eldr__logf_process(eldr_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- conn.c: client connections and responses ------------------------------ */

void eldr__accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                     void *arg);
/* ---- accept.c: the listener on and off -------------------------------------- */

/* accept() failed: listener off for a bounded, growing delay; rate-limited log. */
void eldr__accept_error_cb(struct evconnlistener *l, void *arg);
/* Timer (arg = s): listener back on after an accept error; after a reserve
 * pause, back on when fds are free again, else asked again later. */
void eldr__accept_resume(evutil_socket_t fd, short ev, void *arg);
/* Read RLIMIT_NOFILE and size the reserve for nloops loops (at start). */
void eldr__fd_reserve_init(eldr_server *s, int nloops);
/* accept_cb took fd: at most the reserve left, the listener goes off
 * (the connection itself is served); rate-limited log. */
void eldr__fd_reserve_accepted(eldr_server *s, int fd);
/* A client connection of this loop closed: a paused listener back on when
 * there is room. */
void eldr__fd_reserve_closed(eldr_server *s);
/* The listener is going away (drain, free): no pause, no resume. */
void eldr__fd_reserve_stop(eldr_server *s);
/* The client's output drained below the bound: resume a paused decode leg. */
void eldr__rq_drained(rq *r);
/* A request that held `bytes` (>= 1 MiB) of buffers ended: trim the heap
 * soon (one trim per burst). */
void eldr__mem_note(eldr_server *s, size_t bytes);
/* The loop's spare request heads and input buffers (s->heads, s->inbufs). */
void eldr__conn_spares_init(eldr_server *s);
/* Close the connection; a request still in flight is aborted (eldr__rq_abort). */
void eldr__conn_free(hconn *c);
/* Whole responses; the connection then reads its next request or closes
 * (and frees c->r through eldr__rq_free). */
void eldr__send_body(hconn *c, int status, const char *ctype, const void *body, size_t len,
                     const char *extra);
void eldr__send_error(hconn *c, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A streamed response: head, chunks, end (which finishes as send_body does). */
void eldr__stream_start(hconn *c, int status, const char *ctype);
void eldr__stream_chunk(hconn *c, const char *p, size_t n);
void eldr__stream_end(hconn *c);
/* Bytes queued to the client and not yet written. */
size_t eldr__conn_pending(hconn *c);

/* ---- proxy.c: requests ------------------------------------------------------ */

/* The seams sglpd.c uses (proxy.c): a request's metrics and access-log line
 * at its end; its decode leg released; loads of a role (tried workers
 * excluded) into s->loads / s->healthy / s->keys / s->seen; a client error
 * from a worker (frees r); an SSE error event ending a started stream
 * (frees r); one exchange sent on leg L (its own callbacks; reserved: the
 * slot's in-flight count is already taken); the decode leg started on w;
 * the decode decision on res (NULL: the policy uses no signature; pt the
 * prompt's tokens, 0 unknown), k or < 0; a decode reply that was held,
 * answered (frees r). */
void eldr__rq_finish_metrics(rq *r, int outcome);
void eldr__leg_release(rq *r);
int eldr__fill_loads(eldr_server *s, int role, rq *r, size_t *n);
void eldr__client_upstream_error(rq *r, int status, int outcome, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void eldr__abort_stream(rq *r, int code, const char *type, const char *msg);
int eldr__leg_send(rq *r, leg *L, worker *w, int reserved, const char *method, const char *path, const char *body,
                   size_t len, const eldr_up_cbs *cbs);
int eldr__leg_start(rq *r, worker *w, int kind, const char *method, const char *path, const char *body, size_t len);
int eldr__decide_on(rq *r, const eldr__sigres *res, uint32_t pt);
void eldr__decode_finish(rq *r);

/* ---- sglpd.c: SGLang's prefill/decode flow (--pd sglang) ----------------------
 * Per request: the prefill picked as in the vLLM flow, the decoder at
 * arrival (the predicted signature when usable, else load), a fresh random
 * bootstrap_room per item, both legs sent at once; the decode leg is r->L
 * (relayed as in the vLLM flow), the prefill leg r->pd's own (connection,
 * deadline, buffer). The prefill's reply completes the signature cache and
 * replaces the footprint's prediction; a prefill that fails aborts the
 * decode leg and answers the client with its error. */
/* Start the flow for a read request (answers the client on failure). */
void eldr__sglpd_start(rq *r);
/* The decode leg answered (not an error): 1 when its reply waits for the
 * prefill's (which then calls eldr__decode_finish), 0 to answer now. */
int eldr__sglpd_hold(rq *r);
/* The prefill leg released (aborted if in flight) and r->pd freed. */
void eldr__sglpd_free(rq *r);
/* The decode's whole 200 reply (body[0..n)) as the client gets it: for
 * /generate with the prefill's reply read, its input log probabilities
 * merged in front (eldr__sgl_merge_logprobs) into r->b.fix: 0 and *out /
 * *on set; else 1 (relay the decode's reply as it is). */
int eldr__sglpd_reply(rq *r, const char *body, size_t n, const char **out, size_t *on);

/* --pd sglang-exact: the decoder is chosen once the prefill's forward-end
 * counts arrived (or, past cfg.exact_timeout_s or on any failure, on the
 * prediction or load), then the decode leg is sent. eldr__sglpd_counts:
 * the counts poll ended (result SGX_*; res: the signature of the counts
 * when SGX_EXACT, else NULL): the poll freed, the decision made and the
 * decode leg sent (answers the client on failure). */
void eldr__sglpd_counts(rq *r, int result, const eldr__sigres *res);

/* ---- sglexact.c: the counts poll (--pd sglang-exact) ---------------------------
 * GET /eldr/expert_counts?room=R on the prefill's bootstrap server (pw's
 * address at port bport), bounded by cfg.exact_timeout_s and
 * ELDR__SGL_COUNTS_MAX bytes; its end calls eldr__sglpd_counts once (never
 * from inside eldr__sglx_start). NULL with *why when it could not start
 * (the caller decides without it). _free aborts it. Loop thread. */
typedef struct eldr__sglx eldr__sglx;
extern const char *const eldr__sgx_name[SGX__N];
eldr__sglx *eldr__sglx_start(rq *r, const worker *pw, int bport, uint64_t room, const char **why);
void eldr__sglx_free(eldr__sglx *x);

/* POST /v1/completions and /v1/chat/completions; GET /v1/models. */
void eldr__handle_completion(hconn *c, eldr__api api, const char *body, size_t len);
void eldr__handle_models(hconn *c);
/* Event callback (arg = s): end this loop's legs on workers found hung
 * since they started. */
void eldr__hung_sweep(evutil_socket_t fd, short ev, void *arg);
/* w is hung (hang.c's verdict): ejected (with health checks on; a
 * successful check re-admits it), and every leg in flight on it, on every
 * loop, ends now: a decode leg with 504 (an SSE error event once streaming),
 * a prefill leg retried on another worker or 504. */
void eldr__worker_hung(worker *w, const char *why);
/* ---- rqpool.c: request objects ----------------------------------------------- */
/* Free the loop's pool of ended requests (before its event base). */
void eldr__rq_pool_free(eldr_server *s);
/* A request for the loop: from its pool (buffers reused, every other field
 * zero) or new (with its leg's deadline timer); NULL on ENOMEM. */
rq *eldr__rq_alloc(eldr_server *s);
/* Free r outright, never to the pool (a request that never started). */
void eldr__rq_destroy(rq *r);
/* Release a request (its leg's worker reference and connection included):
 * back to the loop's pool, or freed. */
void eldr__rq_free(rq *r);
/* A leg's deadline timer (arg: the request). */
void eldr__leg_deadline_cb(evutil_socket_t fd, short ev, void *arg);
/* The client left while the request was in flight: count it, free it. */
void eldr__rq_abort(rq *r);

/* ---- resolve.c: names on the loop ------------------------------------------------ */
/* The resolver: /etc/resolv.conf and /etc/hosts, or only server (IP[:PORT]). */
int eldr__dns_init(eldr_server *s, const char *server, eldr_diag *d);
/* Groups and the resolver freed; pending lookups end without effect. */
void eldr__dns_free(eldr_server *s);
/* A new worker's address: a numeric host now; a name is looked up on the
 * loop (the worker stays unhealthy, unlisted in decisions, until it
 * resolves; failures are logged naming the host and retried every
 * dns_interval). 0, ELDR_ENOMEM or ELDR_EINVAL. */
int eldr__worker_resolve_start(worker *w);
void eldr__worker_resolve_stop(worker *w);
/* After a commit: groups of s->cfg created (first lookup started) or kept,
 * the others dropped; timers at s->cfg.dns_interval_s. */
void eldr__dns_sync(eldr_server *s);
/* The group of role named spec, or NULL. */
const dns_group *eldr__dns_group_find(const eldr_server *s, int role, const char *spec);

/* ---- dnstcp.c: a name's A and AAAA records over TCP --------------------------- */
typedef struct eldr__dnstcp eldr__dnstcp;
/* rc[0] / rc[1]: the A / AAAA lookups' ELDR__DNS_* codes (connection
 * failures and the deadline are ELDR__DNS_FAILED), res their records, err
 * the first failure's reason or NULL. The results are freed after it. */
typedef void (*eldr__dnstcp_done)(void *arg, const int *rc, const eldr__dns_addrs *const *res, const char *err);
/* Ask nameserver ns over TCP for name's A and AAAA records, one connection
 * each, within timeout_s; done is called once, from the loop (never from
 * inside this call). NULL when it could not start (no memory, no socket,
 * a name that cannot be encoded). */
eldr__dnstcp *eldr__dnstcp_start(struct event_base *base, const struct sockaddr *ns, socklen_t nslen, const char *name,
                                 double timeout_s, eldr__dnstcp_done done, void *arg);
/* Drop a lookup in flight: no callback. NULL is a no-op. */
void eldr__dnstcp_cancel(eldr__dnstcp *t);

/* ---- scrape.c: load from the engines' /metrics ------------------------------ */
/* The load a decision uses: this replica's in-flight legs, or with a valid
 * scrape, scraped + own legs started - finished since (never less than own). */
uint32_t eldr__worker_load(const worker *w);
/* The same with the in-flight count (all loops) given. */
uint32_t eldr__worker_load_at(const worker *w, uint32_t inflight);
/* Timer callback (arg = s): one GET /metrics per listed, resolved worker. */
void eldr__scrape_tick(evutil_socket_t fd, short ev, void *arg);
/* (Re)arm the timer after a commit at s->cfg.scrape_interval_s (0 = off). */
void eldr__scrape_schedule(eldr_server *s, double old_interval);
/* A worker's scrape connection and buffer released. */
void eldr__scrape_stop(worker *w);
/* Parse one /metrics reply into w (for tests and fuzzing too). */
void eldr__scrape_parse(worker *w, const char *text, size_t len);

/* ---- accesslog.c ------------------------------------------------------------- */
int eldr__access_log_open(eldr_server *s, const char *path, eldr_diag *d);
void eldr__access_log_close(eldr_server *s);
/* The decode decision (w may be NULL), and decode reply bytes as they come. */
void eldr__al_decision(rq *r, const worker *w, double similarity);
void eldr__al_data(rq *r, const char *p, size_t n);
/* One line for a completion request that ended (status: the client's). */
void eldr__access_log(rq *r, int outcome, int status);

/* ---- rechook.c: serve --record ------------------------------------------------ */
/* The recorder of s->cfg.record_dir (none when NULL): 0 or its error. */
int eldr__record_start(eldr_server *s, eldr_diag *d);
/* After a commit: the artifact's identity, new sample fraction and
 * rotation limits; a changed directory is logged (it needs a restart). */
void eldr__record_commit(eldr_server *s);
/* Write what is queued, close, stop (at free). */
void eldr__record_stop(eldr_server *s);
/* The decode decision was made (res: the signature path's result, NULL
 * when the policy does not use one; k: the decoder or < 0): a sampled
 * request's record is started in r->rec. */
void eldr__record_decision(rq *r, const eldr__sigres *res, int k, const eldr_decision *dec);
/* --pd sglang: the prefill's reply body[0..n): the recorded request's
 * prompt counts over every MoE layer of the artifact (SGLang's routed
 * experts read again without the layer mask; only for a sampled request).
 * A reply without usable rows leaves the record to be dropped as
 * no_counts at submit. */
void eldr__record_sglang_prefill(rq *r, const char *body, size_t n);
/* Streamed decode reply bytes as they are relayed: the record's usage,
 * and (for the record or a live-rho pair) the event carrying routed_experts
 * (eldr/reply_stream.h: vLLM's final chunk of a stream that has them). */
void eldr__record_data(rq *r, const char *p, size_t n);
/* The stream ended: its routed_experts event, if any, to the live rho. */
void eldr__record_stream_end(rq *r);
/* Release r->rs. */
void eldr__record_stream_free(rq *r);
/* The request ended with the client's status (TTFT, TPOT noted). */
void eldr__record_finish(rq *r, int status);
/* The request is being freed: its record, with the decode reply's buffer
 * and the prefill reply's tree handed over (not copied), goes to the writer. */
void eldr__record_submit(rq *r);
/* The eldr_record_* series (nothing when recording is off). */
void eldr__record_metrics(eldr_server *s, struct evbuffer *o);

/* ---- fpstate.c: the footprint policy's state --------------------------------- */
/* A new generation (refs 1) when kind is FOOTPRINT and art's artifact
 * carries latency coefficients (and n_decode > 0; it keeps a reference on
 * art), else *out = NULL and 0; from c: the policy, the decoders' batch
 * limit (decode_max_batch), the cost's own-time and home weights
 * (fp_own_weight, fp_home_weight: decoder j's home centroid is the
 * artifact's j mod k, as ELDR maps them); errors name the footprint policy (ELDR_ENOMEM,
 * the latency model's). */
int eldr__fps_new(eldr__art *art, const eldr_serve_config *c, size_t n_decode, eldr__fpstate **out,
                  eldr_diag *d);
/* Drop one reference; the last frees it. NULL is a no-op. */
void eldr__fps_put(eldr__fpstate *f);
/* r was sent to decoder k by p (f's policy attached): its ticket and a
 * reference on f kept with r. No-op when f is NULL or no ticket results. */
void eldr__fps_route(rq *r, eldr__fpstate *f, eldr_policy *p, int k, const eldr_fp_request *fr);
/* r's decode leg ended (any reason): its ticket ended, reference dropped;
 * idempotent. */
void eldr__fps_end(rq *r);
/* Requests in flight on f (all decoders); 0 for NULL. */
size_t eldr__fps_inflight(const eldr__fpstate *f);

/* ---- check.c ------------------------------------------------------------------ */
/* 0, or ELDR_EUNSUPPORTED naming path when the artifact's representation
 * needs gate scores (vLLM's routed_experts carry expert ids only). */
int eldr__artifact_servable(const eldr_artifact *a, const char *path, eldr_diag *d);

/* ---- workers.c --------------------------------------------------------------- */

/* Unlink from s->all_workers (when listed) and free: connections, timer. */
void eldr__worker_free(worker *w);
/* A leg on w is over: its connection back to the pool (or closed); frees a
 * retired worker whose last leg this was. */
void eldr__worker_put(worker *w, eldr_up *u);

/* The worker lists a reload installs, built off to the side: listed workers
 * kept by URL (health, counters, in-flight legs and idle connections
 * stay), new ones created and resolved but not listed, larger idle-pool
 * arrays allocated. */
typedef struct worker_plan {
  worker **w[2];
  size_t nw[2];
  worker *fresh;         /* new workers, chained through next_all */
  eldr_up ***grown[2];  /* per planned worker: its larger pool array, or NULL */
} worker_plan;
int eldr__workers_plan(eldr_server *s, const eldr_serve_config *cfg, worker_plan *p, eldr_diag *d);
void eldr__workers_drop(worker_plan *p);
/* Swap the plan in (cannot fail; s->cfg must already be the new one): new
 * workers listed, pools resized to s->cfg.pool_size, dropped workers
 * retired. p is emptied. */
void eldr__workers_commit(eldr_server *s, worker_plan *p);
/* A connection for a new leg (idle one, or a new one); NULL on ENOMEM. */
eldr_up *eldr__pool_take(worker *w);
void eldr__pool_give(worker *w, eldr_up *u);
/* Count one failure; ejects after eject_after of them (health checks on). */
void eldr__worker_failed(worker *w, const char *why);
/* Active health checks of every listed worker (timer callback; arg = s). */
void eldr__health_tick(evutil_socket_t fd, short ev, void *arg);
/* A health check of w now (its result goes through eldr__hang_probe_done
 * when w->hc_hang); one already in flight is kept. 0, or -1 when none
 * could be sent (no address, no socket). */
int eldr__health_check(worker *w);

/* ---- status.c: the watch ------------------------------------------------------
 * The window of decisions and the live-rho pairs (struct eldr__watchcore)
 * are shared by every loop watching the same artifact text with the same
 * window size: each loop's eldr__watchst holds a reference and its own
 * scratch; the core's mutex guards each append and each render. */
/* The watch for artifact a (NULL: *out NULL, 0), sized by c, on s's loop:
 * the group's core when it fits, else s's running one, else a new one.
 * ELDR_ENOMEM. */
int eldr__watchst_new(eldr_server *s, const eldr_artifact *a, const eldr_serve_config *c, eldr__watchst **out,
                      eldr_diag *d);
void eldr__watchst_free(eldr__watchst *w);
/* Drop one reference on a core (NULL: no-op); any thread. */
void eldr__watchcore_put(struct eldr__watchcore *wc);
/* Install a reload's watch (cannot fail) and offer its core to the other
 * loops: the same artifact text keeps the running window, another replaces
 * it. fresh is taken. */
void eldr__watch_commit(eldr_server *s, eldr__watchst *fresh);
/* The buffer a decision writes every centroid's similarity into, or NULL. */
float *eldr__watch_sims(eldr_server *s);
/* A decision of r was made (sig: its signature, NULL without one). */
void eldr__watch_decision(rq *r, const eldr_decision *dec, const float *sig);
/* r's whole decode reply (a sampled request's generated rows feed the live rho). */
void eldr__watch_decode_reply(rq *r, const char *body, size_t len);
/* The watch's lines of /metrics. */
void eldr__watch_metrics(eldr_server *s, struct evbuffer *o);
void eldr__handle_status(hconn *c);
/* POST /admin/reload (only routed here when admin_token is set). */
void eldr__handle_admin_reload(hconn *c);
/* server.c: reload now, as SIGHUP does (all or nothing, logged and
 * counted): 0, or the error with the reason in d. */
int eldr__reload_now(eldr_server *s, eldr_diag *d);

/* ---- hang.c: the hang detector --------------------------------------------------
 * A worker is hung only when none of its legs in flight made progress (a
 * byte from it) for hang_window AND a health probe does not answer within
 * health_timeout. A leg merely waiting in the engine's queue is never a
 * hang while the engine answers its probe. Loop 0 ticks; progress is the
 * slot's (every loop's legs). */
static inline int64_t eldr__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
/* A byte arrived from the worker (any leg, any loop). */
static inline void eldr__slot_progress(eldr__slot *sl) {
  atomic_store_explicit(&sl->progress_ns, eldr__now_ns(), memory_order_relaxed);
}
/* Timer callback (arg = s, loop 0). */
void eldr__hang_tick(evutil_socket_t fd, short ev, void *arg);
/* (Re)arm the tick after a commit at s->cfg.hang_window_s (0 = off). */
void eldr__hang_schedule(eldr_server *s);
/* A health check or probe of w ended (ok: answered 200). Returns 1 when it
 * was decided here (a hang probe: answered, or a verdict), 0 when it is an
 * ordinary check the caller counts. */
int eldr__hang_probe_done(worker *w, int ok, const char *why);
/* A failed ordinary health check of a worker whose legs progressed within
 * the hang window is not held against it (it is demonstrably serving). */
int eldr__hang_progressing(const worker *w);

/* ---- drain.c: graceful shutdown ------------------------------------------------- */
/* The server is draining (any thread). */
int eldr__draining(const eldr_server *s);
/* The loop's drain events; 0 or ELDR_ENOMEM. */
int eldr__drain_init(eldr_server *s);
/* SIGTERM / SIGINT on loop 0: the first drains, the second stops at once. */
void eldr__drain_signal(evutil_socket_t fd, short ev, void *arg);

/* ---- auth.c: client credentials ------------------------------------------------ */
/* Constant-time equality of a given token and a configured one (the time
 * depends on want's length only); 0 when either is empty. */
int eldr__token_equal(const char *given, const char *want);
/* The credential c's request head needs and lacks: 0 (none needed, or it
 * passes), 1 (an API key on a /v1 path), 2 (the admin token). */
int eldr__auth_check(const hconn *c);
/* Answer c's 401 (c->unauth's kind), count it and log it at a bounded rate. */
void eldr__auth_refuse(hconn *c);

/* ---- metrics.c -------------------------------------------------------------- */

void eldr__metrics_init(metrics *m);
void eldr__histo_add(histo *h, double x);
void eldr__handle_metrics(hconn *c);
void eldr__handle_health(hconn *c);

#endif
