/* eldr/serve.h — `eldr serve`: the HTTP router in front of vLLM prefill and
 * decode workers (PD disaggregation with pull-style NIXL KV handoff; wire
 * protocol in docs/serve.md and docs/architecture.md).
 *
 * Per request: prefill worker by prefix hash with a load guard
 * (eldr_policy_prefill); the prefill leg is the client's body rewritten to
 * stream=false / max_tokens=1 / kv_transfer_params{do_remote_decode: true};
 * its reply's routed_experts give the expert signature (completed from the
 * block-granular signature cache for prefix-cached tokens); the decode worker
 * is chosen by eldr_policy_decode over the router's in-flight counts; the
 * decode leg is the original body plus the prefill's kv_transfer_params,
 * relayed to the client byte for byte (SSE when streaming).
 *
 * Threading: cfg.threads libevent loops (eldr_server_run runs the first on
 * the calling thread and one thread per other loop; each accepts on its own
 * SO_REUSEPORT listener and owns its connections and upstream pools; they
 * share the workers' in-flight counts; docs/architecture.md, "Threads").
 * cfg.log may be called from any loop's thread, one call at a time.
 * eldr_server_stop() and eldr_server_reload() may be called from any thread.
 *
 * Ownership: eldr_serve_config owns its strings (init/free);
 * eldr_server_new copies the config; eldr_server_free releases everything.
 */
#ifndef ELDR_SERVE_H
#define ELDR_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/policy.h"

/* One log line (no trailing newline). Called on a loop thread of the
 * server, one call at a time (the server serialises them). */
typedef void (*eldr_serve_log_fn)(void *ctx, const char *line);

#define ELDR_SERVE_MAX_THREADS 256 /* event loops at most */

typedef struct eldr_serve_config {
  char *host;                /* listen address (default "127.0.0.1") */
  int port;                  /* listen port; 0 = any free port (eldr_server_port) */
  char **prefill;            /* worker base URLs "http://host:port" */
  size_t n_prefill;
  char **decode;
  size_t n_decode;
  char **prefill_dns;        /* "NAME:PORT": every A/AAAA address of NAME is a prefill
                              * worker, re-resolved every dns_interval_s (docs/serve.md) */
  size_t n_prefill_dns;
  char **decode_dns;
  size_t n_decode_dns;
  double dns_interval_s;     /* re-resolution of *_dns names and retry of names that
                              * failed to resolve (default 5) */
  char *dns_server;          /* nameserver "IP[:PORT]" instead of /etc/resolv.conf (NULL) */
  char *access_log;          /* JSON line per request to this file ("-": stdout; NULL: off);
                              * opened at start (a reload does not reopen it) */
  char *artifact;            /* routing artifact path, or NULL (load-only routing) */
  eldr_policy_kind policy;   /* decode policy (default ELDR) */
  int pd;                    /* prefill/decode flow (ELDR_PD_*): vLLM's, the decoder chosen
                              * from the prefill's reply (default), or SGLang's, both legs
                              * sent at once with a bootstrap room (docs/sglang.md) */
  int bootstrap_port;        /* pd sglang: the prefill workers' bootstrap server port, sent
                              * as bootstrap_port (SGLang's --disaggregation-bootstrap-port,
                              * default 8998; 0: null, as the gateway sends without one) */
  char **boot_urls;          /* pd sglang: prefill workers whose bootstrap port is not
                              * bootstrap_port (config bootstrap_ports {URL: PORT}; the
                              * gateway's --prefill URL PORT) ... */
  int *boot_ports;           /* ... and their ports (0: null) */
  size_t n_boot;
  double exact_timeout_s;    /* pd sglang-exact: how long the router waits for the
                              * prefill's published expert counts before it picks the
                              * decoder on the prediction / load (default 5) */
  double predict_threshold;  /* pd sglang: the confidence a signature predicted at arrival
                              * needs to be routed on (eldr/predict.h; default 0.5) */
  double tau;                /* band width; < 0 = the artifact's tau (0.1 without one) */
  uint64_t seed;             /* for RANDOM / P2C and generated request ids */
  uint32_t prefill_guard;    /* prefill load guard (in-flight requests), default 4 */
  double connect_timeout_s;  /* TCP connect to a worker; one health check (default 10) */
  double prefill_timeout_s;  /* whole prefill leg (default 120) */
  double decode_timeout_s;   /* whole decode leg (default 1800) */
  double decode_first_byte_timeout_s; /* streaming decode leg: the queue timeout, to its first
                                       * byte; ends that request alone, never the decoder
                                       * (default 600; 0 = off) */
  double decode_idle_timeout_s;       /* streaming decode leg: between reads, the same way
                                       * (default 600; 0 = off) */
  double header_timeout_s;   /* client must send head and body within (default 15) */
  double idle_timeout_s;     /* idle keep-alive client connections closed after (default 120) */
  int retries;               /* extra attempts per leg on another worker (default 2) */
  size_t max_body;           /* client body limit in bytes (default 16 MiB) */
  size_t max_header;         /* client request head limit in bytes (default 32 KiB) */
  double health_interval_s;  /* active health checks (GET /health); 0 = off (default 2) */
  double scrape_interval_s;  /* GET /metrics of every worker: load = the engine's
                              * running + waiting + this replica's legs since; 0 = off
                              * (default; only this replica's legs count) */
  int eject_after;           /* consecutive failures that eject a worker (default 3) */
  size_t sigcache_rows;      /* signature cache capacity in blocks; 0 = off (default 65536) */
  size_t sig_cache_mb;       /* its memory bound in MiB (rows x (masked layers x experts + 32)
                              * bytes); 0 = off (default 256) */
  size_t pool_size;          /* idle upstream connections kept per worker (default 256) */
  char *backend_api_key;     /* sent to workers as "Authorization: Bearer <key>" (NULL: none) */
  int forward_authorization; /* pass the client's Authorization to workers when no
                              * backend key is set (default 0: never forwarded) */
  char *cors_origin;         /* CORS: "*" or a comma-separated list of allowed origins;
                              * answers preflight OPTIONS (NULL: no CORS, default) */
  int splice_routed_experts; /* splice the prefill's prompt rows into the decode reply's
                              * routed_experts when both carry them (default 1) */
  size_t max_connections;    /* open client connections; more get 503 (0 = half the
                              * fd limit, RLIMIT_NOFILE, at start; default 0) */
  size_t stream_buffer;      /* bytes queued to a streaming client above which the
                              * decode leg is not read (default 256 KiB) */
  char *record_dir;          /* --record DIR: one counts-form trace line per sampled
                              * completion request (docs/serve.md, "Recording"; NULL: off);
                              * opened at start (a reload does not move it) */
  double record_sample;      /* fraction of requests recorded, (0, 1] (default 1) */
  uint64_t record_max_bytes; /* a file is closed before it would pass this (default 256 MiB; 0 = no limit) */
  double record_max_seconds; /* a file is closed this long after it opened (default 3600; 0 = no limit) */
  size_t record_queue;       /* records queued for the writer at most (default 1024) */
  size_t record_queue_bytes; /* their memory at most (default 64 MiB) */
  uint32_t record_experts;   /* routed experts per layer when no artifact says (0: the artifact's) */
  size_t decode_max_batch;   /* the footprint policy's decode batch limit per decoder: the
                              * engines' --max-num-seqs (default 256, vLLM's default below
                              * 70 GiB of GPU memory; 1024 on H100/H200/MI300X-class GPUs:
                              * vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults) */
  double fp_own_weight;      /* the footprint policy's own-time weight in its decision
                              * cost (docs/footprint.md, "The own-time weight"), in
                              * (0, 100] (default 1) */
  double fp_home_weight;     /* its home term's weight, [0, 100] (default 0: off;
                              * docs/footprint.md, "The home term") */
  int threads;               /* event loops, each with its own SO_REUSEPORT listener
                              * (docs/architecture.md, "Threads"); 0 = the number of
                              * online cores (default 0); fixed at start (a reload
                              * does not change it) */
  double watch_window_s;     /* sliding window of GET /eldr/status and the drift metrics,
                              * in seconds (default 60; 0 = the last watch_requests) */
  size_t watch_requests;     /* locality decisions kept for that window (default 4096) */
  char *admin_token;         /* POST /admin/reload needs "Authorization: Bearer <token>"
                              * (config file only; NULL: no such endpoint, 404) */
  char **api_keys;           /* clients must send "Authorization: Bearer <one of these>" on
                              * every /v1 path, as vLLM's --api-key (config api_key: a
                              * string or an array; NULL: open, default); compared in
                              * constant time; 401 {"error":"Unauthorized"} otherwise */
  size_t n_api_keys;
  double shutdown_timeout_s; /* SIGTERM/SIGINT: /health 503, listeners closed, requests in
                              * flight finish within this (vLLM's --shutdown-timeout),
                              * then the server stops; a second signal stops it at once
                              * (default 30) */
  double health_timeout_s;   /* one health check (and hang probe) must answer within
                              * this, its own short bound (default 2) */
  double hang_window_s;      /* a worker whose legs in flight made no progress (no byte
                              * from it) for this long is probed; a probe that does not
                              * answer in health_timeout makes it hung: ejected, its legs
                              * ended (default 5; 0 = off; docs/serve.md, Faults) */
  char *bus;                 /* the fleet bus: "nats://HOST:PORT" (NULL: none, default);
                              * replicas share every decoder's requests in flight and
                              * footprint weights (docs/serve.md "A fleet of routers");
                              * fixed at start */
  char *bus_subject;         /* subject prefix (NULL: "eldr.fleet"; messages go to PREFIX.state) */
  char *bus_replica_id;      /* this replica's id on the bus (NULL: HOSTNAME:PORT) */
  double bus_snapshot_s;     /* full-state snapshot (and heartbeat) interval (default 1) */
  double bus_peer_timeout_s; /* a replica silent this long is expired (default 3) */
  int handle_signals;        /* SIGHUP reloads, SIGINT/SIGTERM stop (for the CLI) */
  char *config_path;         /* JSON config re-read on reload (NULL: reload artifact only) */
  char *overrides;           /* JSON object in the config file's syntax applied over the
                              * file on every reload: the command-line flags, which
                              * override the file (NULL: none) */
  eldr_serve_log_fn log;     /* NULL = silent */
  void *log_ctx;
} eldr_serve_config;

/* eldr_serve_config.pd */
/* ELDR_PD_SGLANG_EXACT: SGLang's flow with the prefill's forward-end counts
 * (contrib/sglang-eldr-exact): the decode leg waits for them (docs/sglang.md) */
enum { ELDR_PD_VLLM = 0, ELDR_PD_SGLANG = 1, ELDR_PD_SGLANG_EXACT = 2 };

/* The bootstrap port sent for prefill worker url: its own (boot_urls),
 * else bootstrap_port. */
int eldr_serve_config_boot_port(const eldr_serve_config *c, const char *url);
/* Set prefill worker url's bootstrap port (replacing one set before): 0,
 * ELDR_ERANGE (not 0..65535) or ELDR_ENOMEM. */
int eldr_serve_config_set_boot_port(eldr_serve_config *c, const char *url, long long port, eldr_diag *d);

/* Defaults (no workers). */
void eldr_serve_config_default(eldr_serve_config *c);
void eldr_serve_config_free(eldr_serve_config *c);
/* Deep copy (dst is overwritten, not freed first). 0 or ELDR_ENOMEM. */
int eldr_serve_config_copy(eldr_serve_config *dst, const eldr_serve_config *src);
/* Append a worker URL (validated: http://host[:port][/], port 1..65535). */
int eldr_serve_config_add_worker(eldr_serve_config *c, int decode, const char *url, eldr_diag *d);
/* Append a DNS-discovered worker group "NAME:PORT" (validated). */
int eldr_serve_config_add_dns(eldr_serve_config *c, int decode, const char *hostport, eldr_diag *d);
/* Append a client API key (checked by eldr_serve_config_validate). */
int eldr_serve_config_add_api_key(eldr_serve_config *c, const char *key, eldr_diag *d);
/* Apply a JSON config document over c. Keys (all optional):
 *   host, port, prefill [urls], decode [urls], prefill_dns [NAME:PORT],
 *   decode_dns [NAME:PORT], dns_interval, dns_server, scrape_interval, access_log, artifact, policy, tau, seed,
 *   prefill_guard, connect_timeout, prefill_timeout, decode_timeout,
 *   decode_first_byte_timeout, decode_idle_timeout,
 *   header_timeout, idle_timeout, retries, max_body, max_header,
 *   health_interval, eject_after, sigcache_rows, sig_cache_mb, pool_size, max_connections,
 *   stream_buffer, threads, watch_window, watch_requests, admin_token (string or null),
 *   splice_routed_experts (boolean), backend_api_key (string or null),
 *   forward_authorization (boolean), cors_origin (string or null),
 *   record (directory or null), record_sample, record_max_bytes,
 *   record_max_seconds, record_queue, record_queue_bytes, record_experts,
 *   api_key (string, array of strings, or null), shutdown_timeout,
 *   health_timeout, hang_window, bus (URL or null), bus_subject, bus_replica_id,
 *   bus_snapshot_interval, bus_peer_timeout, decode_max_batch, fp_own_weight, fp_home_weight, pd ("vllm",
 *   "sglang" or "sglang-exact"), bootstrap_port, bootstrap_ports ({prefill URL: port},
 *   replaces the map), predict_threshold, exact_timeout.
 * A "prefill"/"decode" list replaces the current one. Unknown keys and
 * wrong types are errors naming the key. */
int eldr_serve_config_parse(eldr_serve_config *c, const char *json, size_t len, eldr_diag *d);
int eldr_serve_config_load(eldr_serve_config *c, const char *path, eldr_diag *d);
/* At least one prefill and one decode worker (URL or DNS name), sane limits. */
int eldr_serve_config_validate(const eldr_serve_config *c, eldr_diag *d);
/* What `eldr serve --check-config` checks, without starting anything:
 * eldr_serve_config_validate, then the artifact (loads, validates, has a
 * representation the router can serve), then, when resolve is set, every
 * worker host and DNS name resolves (blocking getaddrinfo: for the CLI, not
 * for the loop). Errors name the key, file or host that is wrong. */
int eldr_serve_config_check(const eldr_serve_config *c, int resolve, eldr_diag *d);

/* Split "http://host:port/..." into host (cap bytes) and port (default 80). */
int eldr_serve_parse_url(const char *url, char *host, size_t cap, int *port, eldr_diag *d);
/* Split "NAME:PORT" (port 1..65535 required) into name (cap bytes) and port. */
int eldr_serve_parse_hostport(const char *s, char *host, size_t cap, int *port, eldr_diag *d);

typedef struct eldr_server eldr_server;

/* Create the server: loads the artifact (refused with a message when it is
 * invalid or its shape does not match), binds the listening socket. Sets
 * SIGPIPE to ignored for the process (a write to a client that left must not
 * kill it) and enables libevent's pthread locking.
 * Errors: ELDR_EINVAL (config), artifact load errors, ELDR_EIO (bind). */
int eldr_server_new(const eldr_serve_config *cfg, eldr_server **out, eldr_diag *d);
/* The bound port. */
int eldr_server_port(const eldr_server *s);
/* Run the event loop until eldr_server_stop. 0, or ELDR_EIO. */
int eldr_server_run(eldr_server *s);
/* Ask the loop to exit (any thread). */
void eldr_server_stop(eldr_server *s);
/* Graceful drain (any thread; what the first SIGTERM does): /health answers
 * 503 at once, the listeners are closed, idle keep-alive connections are
 * closed, every response from now on closes its connection, and the loops
 * stop once no request is in flight or cfg.shutdown_timeout_s has passed.
 * A second call stops at once. */
void eldr_server_drain(eldr_server *s);
/* Ask the loop to reload the config file (if any; then overrides over it)
 * and the artifact (any thread). The new state (configuration, artifact,
 * policy, signature buffers, worker list with resolved addresses, pool
 * sizes, health-check timer) is built and checked first and then swapped
 * in whole; a reload that fails changes nothing, is logged with the reason
 * and counted (eldr_reloads_total{result="error"}). In-flight requests
 * continue; a worker dropped from the list finishes its legs, then is
 * freed. POST /admin/reload (with admin_token) runs the same reload on the
 * loop and answers its result. */
void eldr_server_reload(eldr_server *s);
void eldr_server_free(eldr_server *s);

#endif
