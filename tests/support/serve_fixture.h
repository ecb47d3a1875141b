/* serve_fixture.h — a router in front of workers, set up and torn down in one
 * place for the serve integration tests (tests/serve/):
 *   - sf_rig: prefill and decode workers — fixture workers (fx_*, fixture.h)
 *     or emulated engines (eldr_worker on a thread) — a router configuration
 *     naming them (built in memory, or written to a file the router re-reads
 *     on reload), and the router (eldr_server) on a thread of the test;
 *   - sf_child: `eldr serve ARGS` as a child process, as a user starts it;
 *   - sf_dns: a DNS responder on loopback (libevent's evdns server, its own
 *     thread) whose answer a test changes, for worker discovery by DNS;
 *   - small helpers the serve tests share (a POST that must be answered
 *     200, routed_experts text, the decoder that served a reply).
 *
 * Readiness: sf_run returns once eldr_server_new has bound the listener, so
 * a connection made after it is accepted (at worst it waits in the backlog
 * until the loop thread runs); sf_child_start returns once the child printed
 * "listening on HOST:PORT" on stdout, within a 20 s deadline. No sleeps.
 *
 * Ownership: an sf_dns owns its thread, socket and loop (sf_dns_stop).
 * A rig owns its workers, its configuration, its config file and
 * its router; sf_free releases them all (the behaviours passed in are
 * copied). An sf_child owns its process and its log file (sf_child_stop /
 * sf_child_kill reap it and remove the file). Strings returned by sf_routed
 * are malloc'd; the caller frees them.
 * Errors: every failure fails the calling cmocka test with a message naming
 * what failed (fail_msg); nothing returns an error code.
 * Threads: call from the test's thread only. */
#ifndef ELDR_TEST_SERVE_FIXTURE_H
#define ELDR_TEST_SERVE_FIXTURE_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "eldr/artifact.h"
#include "eldr/counts.h"
#include "eldr/serve.h"
#include "eldr/worker.h"
#include "support/fixture.h"

#define SF_MAX 16 /* workers of one role in a rig */

typedef struct sf_rig {
  int np, nd;
  fx_worker *p[SF_MAX], *d[SF_MAX]; /* fixture workers (sf_start), else NULL */
  void *engine[2 * SF_MAX];         /* emulated engines (sf_start_engines), prefill first */
  char purl[SF_MAX][64], durl[SF_MAX][64];
  int pport[SF_MAX], dport[SF_MAX];
  eldr_serve_config c; /* the router's configuration: adjust it before sf_run */
  int have_cfg;
  char cfgpath[256]; /* the config file (sf_config_file), "" when none */
  rt_router r;       /* r.port: the router's port once running; rt_log_text(&r): its log */
  int running;
} sf_rig;

/* np prefill and nd decode fixture workers (behaviours pb and db; NULL:
 * fx_defaults()), then sf_config. */
void sf_start(sf_rig *g, int np, const fx_behaviour *pb, int nd, const fx_behaviour *db);
/* np prefill and nd decode emulated engines (eldr_worker, in process):
 * pc and dc with their role and port (0) set by the rig, then sf_config. */
void sf_start_engines(sf_rig *g, int np, const eldr_worker_config *pc, int nd, const eldr_worker_config *dc);
/* g->c = eldr_serve_config_default with health checks off
 * (health_interval 0) and the rig's workers, prefill then decode, in order
 * (a previous g->c is freed). */
void sf_config(sf_rig *g);
/* g->c read from a config file the rig writes: {"prefill":[...],
 * "decode":[...],"policy":POLICY,"health_interval":0 EXTRA} (extra: "" or
 * ",\"key\":value..."), with config_path set so a reload re-reads it:
 * /tmp/eldr_test_sf_<pid>_<tag>.json. */
void sf_config_file(sf_rig *g, const char *tag, const char *policy, const char *extra);
/* Write the rig's document (as sf_config_file) with another policy and
 * extra keys to its config file (for the next reload). */
void sf_write_config(const sf_rig *g, const char *policy, const char *extra);
/* Replace the config file's text with doc (for the next reload). */
void sf_rewrite(const sf_rig *g, const char *doc);
/* Start the router on g->c (see Readiness). */
void sf_run(sf_rig *g);
/* Stop the router and free g->c; the workers stay (sf_config, adjust,
 * sf_run starts another router over them). */
void sf_stop(sf_rig *g);
/* sf_stop, the workers stopped and freed, the config file removed. */
void sf_free(sf_rig *g);

/* ---- the router as a child process ---------------------------------------- */

typedef struct sf_child {
  pid_t pid;          /* 0 when not running */
  int port;
  char logpath[128];  /* its stderr (the log) */
} sf_child;

/* `eldr serve ARGS` (args NULL-terminated, at most 40) with RLIMIT_NOFILE
 * nofile (0: inherited); stderr to ch->logpath; ready once "listening on
 * HOST:PORT" is read from its stdout (20 s). */
void sf_child_start(sf_child *ch, long nofile, const char *const *args);
/* SIGTERM; the child must exit with status 0. The log is removed. */
void sf_child_stop(sf_child *ch);
/* SIGKILL and reap, if running (a cmocka teardown after a failed test);
 * returns the wait status (-1 when none ran). The log is removed. */
int sf_child_kill(sf_child *ch);

/* ---- a DNS responder -------------------------------------------------------- */

typedef struct sf_dns {
  struct event_base *base;
  struct evdns_server_port *sp;
  int fd;
  int port;           /* its UDP port on 127.0.0.1 (config dns_server "127.0.0.1:PORT") */
  pthread_t th;
  pthread_mutex_t mu;
  const char *name;   /* the one name it knows (borrowed); others: NXDOMAIN */
  uint32_t addr[8];   /* its A records (network order), in answer order */
  int n;
  int queries;
  struct event *keep;
} sf_dns;

/* Answer A queries for name (no records until sf_dns_answer). */
void sf_dns_start(sf_dns *d, const char *name);
/* The A records from now on: the dotted IPv4 addresses of a NULL-terminated
 * list (at most 8), in that order. */
void sf_dns_answer(sf_dns *d, const char *const *addrs);
/* Answer for another name (the old one gets NXDOMAIN). */
void sf_dns_rename(sf_dns *d, const char *name);
void sf_dns_stop(sf_dns *d);

/* ---- shared helpers -------------------------------------------------------- */

/* POST body to path on port (extra: header lines, each ending CRLF, or
 * NULL); the reply must be 200, else the test fails naming the status and
 * body. out: the reply (the caller tc_frees it), or NULL. */
void sf_post_ok(int port, const char *path, const char *body, const char *extra, tc_resp *out);

/* routed_experts text (base64 .npy, uint8) of n tokens each choosing experts
 * e0, e0+1, ..., e0+K-1 on every layer of s. */
char *sf_routed(const eldr_shape *s, size_t n, int e0);
/* The prefix-cache scenario: a 48-token prompt (3 blocks of 16 tokens,
 * "w0 w1 ... w47 ", into prompt, cap >= 1024), *all: routed_experts of its
 * 48 tokens (the first 32 on experts 6, 7, ..., the last 16 on 0, 1, ...),
 * *tail: those of the last block alone (malloc'd, uint8 .npy base64). */
void sf_prefix_prompt(const eldr_shape *s, char *prompt, size_t cap, char **all, char **tail);
/* Send prompts 0..n-1 to the router one at a time (prompt i: 20 words, the
 * first naming i, so each has its own first block and prefix hash);
 * who[i]: the index in w[0..nw) (fixture workers, at most 8) of the
 * prefill worker that received prompt i. Fails when a prompt reached none. */
void sf_prefill_homes(int port, fx_worker *const *w, int nw, int n, int *who);
/* The "served_by" port a fixture decoder puts in a non-streaming reply. */
int sf_served_by(const tc_resp *r);
/* POST a small completion to the router and return the served_by port
 * (the reply must be 200). */
int sf_post_served_by(int port);
/* A record's counts matrix (a JSON array: s->num_layers rows of
 * s->num_experts integers) for `tokens` tokens: every row sums to
 * tokens x top_k and no entry exceeds tokens (a token's experts are
 * distinct). Fails the test naming the row otherwise. */
void sf_check_counts(const json_t *counts, const eldr_shape *s, long long tokens);
/* An artifact that tells the halves of the experts apart: 2 centroids, the
 * lower and the upper half of every layer's experts (unit length), tau
 * 0.1, balanced; for model with shape s at model layers ids (NULL:
 * 0..L-1), IDF on (all 1) when idf, over the layers of mask (NULL: all). */
eldr_artifact *sf_halves_artifact(const char *model, const eldr_shape *s, const uint32_t *ids, int idf,
                                  const uint8_t *mask);
/* a saved (then freed) to /tmp/eldr_test_TAG_PID.json; the path, malloc'd. */
char *sf_artifact_save(eldr_artifact *a, const char *tag);

#endif
