/* eldr/cluster.h — a local xPyD cluster of eldr processes, supervised: the
 * P prefill and D decode `eldr worker` processes and the `eldr serve`
 * router of `eldr demo`, started from this program's own binary on
 * ephemeral loopback ports, each one ready when it prints its "listening on"
 * line; one-shot children (`eldr fit`, `eldr sim`) run to completion; the
 * decoders' step counters are read from their /metrics with the net layer's
 * HTTP client (eldr/http_fetch.h).
 *
 * Every child runs in one process group of the supervisor's, with a
 * parent-death signal (SIGTERM) and default signal dispositions, its stderr
 * appended to the log file. eldr_cluster_kill_async() may be called from a
 * signal handler (it only reads the group id and calls kill(2)).
 *
 * Errors: 0, or ELDR_EIO (a child could not start or did not become ready:
 * d names which and points at the log), ELDR_ETIMEOUT, ELDR_ENOMEM,
 * ELDR_EINVAL. Nothing is printed.
 * Ownership: the cluster copies the exe and log paths; URLs it hands out
 * stay valid until the next eldr_cluster_up / eldr_cluster_stop_all.
 * Threads: one thread drives a cluster; blocking calls (bounded by their
 * timeouts) run on it.
 */
#ifndef ELDR_CLUSTER_H
#define ELDR_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "eldr/error.h"

#define ELDR_CLUSTER_MAX_WORKERS 64 /* per role */

typedef struct eldr_cluster eldr_cluster;

/* exe: the eldr binary (NULL: this program, /proc/self/exe); log_path: the
 * children's stderr (NULL: inherited). stop: when non-NULL and set (e.g. by
 * a signal handler), waits for readiness end early with ELDR_EIO. */
int eldr_cluster_new(const char *exe, const char *log_path, const volatile int *stop,
                     eldr_cluster **out, eldr_diag *d);
/* Stops every child and frees. NULL is a no-op. */
void eldr_cluster_free(eldr_cluster *c);

/* Send sig to every child (async-signal-safe). */
void eldr_cluster_kill_async(eldr_cluster *c, int sig);
/* SIGTERM every child, SIGKILL what is left after 5 s, reap them all. */
void eldr_cluster_stop_all(eldr_cluster *c);

/* Start `eldr <args...>` and wait up to timeout_s for the stdout line that
 * contains "listening on"; the line goes to line[0..cap). On failure the
 * child is stopped. */
int eldr_cluster_spawn(eldr_cluster *c, char *const args[], double timeout_s, char *line,
                       size_t cap, eldr_diag *d);
/* Run `eldr <args...>` to completion, stdout into out_path (NULL:
 * /dev/null); *code = its exit status (128 + signal if killed). */
int eldr_cluster_run(eldr_cluster *c, char *const args[], const char *out_path, int *code,
                     eldr_diag *d);

/* One cluster of the demo. */
typedef struct eldr_cluster_spec {
  size_t n_prefill, n_decode;   /* 1..ELDR_CLUSTER_MAX_WORKERS each */
  const char *model, *hardware; /* worker presets */
  const char *trace_path;       /* the workers' trace */
  double time_scale;
  size_t max_num_seqs;
  const char *artifact_path;    /* the router's */
  const char *policy;
  uint64_t seed;
  double worker_timeout_s, router_timeout_s; /* readiness waits (default 60, 30 when 0) */
  size_t n_routers;             /* router replicas in front of the same workers
                                 * (0 or 1: one; at most ELDR_CLUSTER_MAX_ROUTERS) */
  double scrape_interval;       /* the routers' --scrape-interval (0: off) */
  const char *router_config;    /* the routers' --config FILE (NULL: none) */
  int bus;                      /* 1: a nats-server on a free loopback port and every
                                 * router on it (--bus, replica ids r0, r1, ...) */
  const char *access_log;       /* the routers' --access-log FILE (NULL: none) */
  const char *pd;               /* the prefill/decode flow: NULL or "vllm" (vLLM
                                 * engines, NIXL pull), "sglang" or "sglang-exact"
                                 * (SGLang engines, each prefill with its own
                                 * bootstrap port; -exact: prefills with --exact;
                                 * the routers get --pd and --prefill URL PORT) */
} eldr_cluster_spec;

#define ELDR_CLUSTER_MAX_ROUTERS 8

/* The routers of the running cluster: *urls = their "http://127.0.0.1:PORT"
 * (valid until the next eldr_cluster_up / eldr_cluster_stop_all); returns
 * how many. */
size_t eldr_cluster_routers(const eldr_cluster *c, const char *const **urls);

/* Start the workers, then (with s->bus) nats-server, then the router(s)
 * in front of them; target = the (first) router's "http://127.0.0.1:PORT".
 * nats-server is found on PATH (Debian's package nats-server). */
int eldr_cluster_up(eldr_cluster *c, const eldr_cluster_spec *s, char *target, size_t cap,
                    eldr_diag *d);

/* The decoders' step counters summed over the decode workers of the
 * running cluster (GET /metrics on each, timeout_s each). */
typedef struct eldr_decode_counters {
  double steps;     /* decode steps */
  double batch_sum; /* sum of batch sizes over steps */
  double union_sum; /* sum of per-layer expert unions over steps */
  double token_s;   /* model seconds per token, summed */
} eldr_decode_counters;
/* The running cluster's nats-server: SIGKILL it (the bus lost mid-run);
 * 0, or ELDR_ENOTFOUND when there is none. */
int eldr_cluster_kill_bus(eldr_cluster *c);

int eldr_cluster_scrape_decoders(eldr_cluster *c, double timeout_s, eldr_decode_counters *out,
                                 eldr_diag *d);

/* GET <url>/metrics (url "http://host:port") with eldr_http_fetch and
 * add the decode counters of an eldr worker to *acc. ELDR_EPARSE when a
 * counter is missing. */
int eldr_cluster_scrape(const char *url, double timeout_s, eldr_decode_counters *acc,
                        eldr_diag *d);

#endif
