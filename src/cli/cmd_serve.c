/* cmd_serve.c — `eldr serve`: the HTTP router in front of prefill and decode
 * workers. Flags override the config file, also when SIGHUP re-reads it
 * (they travel as the config's overrides); SIGHUP re-reads the config file
 * and the artifact; SIGTERM/SIGINT drain (requests in flight finish within
 * --shutdown-timeout, then exit 0), a second one stops at once. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "eldr/artifact.h"
#include "eldr/serve.h"
#include "eldr/sigcache.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: eldr serve --prefill URL --decode URL [options]\n"
          "\n"
          "The ELDR router: an OpenAI-compatible HTTP endpoint (POST /v1/completions,\n"
          "/v1/chat/completions; GET /health, /metrics, /v1/models, /eldr/status) in\n"
          "front of vLLM prefill and decode workers with pull-style (NIXL) KV handoff.\n"
          "SIGHUP, or POST /admin/reload with the config file's admin_token, reloads;\n"
          "SIGTERM drains (requests in flight finish, then exit 0; a second one: at once).\n"
          "Every flag is also a config file key, spelled as the flag or in snake_case\n"
          "(--prefill-timeout: \"prefill-timeout\" or \"prefill_timeout\"); flags override\n"
          "the file. The one key without a flag: admin_token (a secret; the process list\n"
          "shows every flag). See docs/serve.md.\n"
          "\n"
          "workers\n"
          "      --prefill URL       prefill worker http://host:port; repeatable\n"
          "                          (required: one --prefill or --prefill-dns); in the\n"
          "                          sglang flow URL PORT gives its own bootstrap port\n"
          "                          (config key bootstrap_ports: {URL: PORT})\n"
          "      --decode URL        decode worker http://host:port; repeatable\n"
          "                          (required: one --decode or --decode-dns)\n"
          "      --prefill-dns NAME:PORT  every A/AAAA address of NAME is a prefill worker,\n"
          "                          re-resolved every --dns-interval; repeatable      [none]\n"
          "      --decode-dns NAME:PORT  the same for decode workers (a headless Service)  [none]\n"
          "      --dns-interval S    seconds between re-resolutions of the --*-dns names and\n"
          "                          retries of worker names that did not resolve      [5]\n"
          "      --dns-server IP[:PORT]  nameserver instead of /etc/resolv.conf   [the system's]\n"
          "      --pd FLOW           prefill/decode flow: vllm (the decoder chosen from the\n"
          "                          prefill's reply), sglang (both legs at once with a\n"
          "                          bootstrap room; the decoder chosen at arrival on the\n"
          "                          predicted signature) or sglang-exact (the decode leg\n"
          "                          sent when the patched prefill publishes its counts;\n"
          "                          docs/sglang.md)                           [vllm]\n"
          "      --exact-timeout S   --pd sglang-exact: seconds to wait for the prefill's\n"
          "                          counts, then the prediction / load         [5]\n"
          "      --bootstrap-port N  --pd sglang: the prefill workers' bootstrap port, their\n"
          "                          SGLang disaggregation bootstrap port (0: null)  [8998]\n"
          "routing\n"
          "      --predict-threshold X  --pd sglang: the share of the prompt's tokens the\n"
          "                          signature cache must know to route on the prediction,\n"
          "                          else load                                 [0.5]\n"
          "      --artifact FILE     routing artifact from `eldr fit`        [none: load only]\n"
          "      --policy NAME       decode policy: eldr, footprint, jsq, p2c, rr, random\n"
          "                                                                    [eldr]\n"
          "      --tau X             locality band width in [0, 2]           [the artifact's]\n"
          "      --prefill-guard N   prefill load guard, requests in flight above the least\n"
          "                          loaded worker                             [4]\n"
          "      --sigcache-rows N   signature cache capacity, KV blocks (0 = off)  [65536]\n"
          "      --sig-cache-mb N    signature cache memory bound, MiB: the rows of the\n"
          "                          artifact's masked layers x experts bytes (+32 each)\n"
          "                          that fit (0 = off)                        [256]\n"
          "      --decode-max-batch N  the decoders' batch limit (their vLLM --max-num-seqs),\n"
          "                          footprint's batch model                   [256]\n"
          "      --fp-own-weight W   footprint's own-time weight in its cost, (0, 100]:\n"
          "                          above 1 trades locality for the tail      [1]\n"
          "      --fp-home-weight H  footprint's home term (ELDR's centroids), [0, 100]\n"
          "                                                                    [0: off]\n"
          "      --scrape-interval S  seconds between reads of every worker's /metrics\n"
          "                          (vllm:num_requests_running + waiting), routed on with\n"
          "                          this router's own legs since; for replicas sharing\n"
          "                          workers (0 = off)                         [0]\n"
          "      --no-splice         relay the decoder's routed_experts as sent (config key\n"
          "                          splice_routed_experts: false)\n"
          "                          [off: the prefill's prompt rows spliced in]\n"
          "      --seed N            seed of random and p2c                    [1]\n"
          "listening\n"
          "      --host ADDR         listen address                            [127.0.0.1]\n"
          "      --port N            listen port (0 = any free port)           [8000]\n"
          "      --threads N         event loops, each accepting on its own SO_REUSEPORT\n"
          "                          listener (0 = the CPUs this process may run on:\n"
          "                          affinity and cgroup quota)                [0]\n"
          "      --max-connections N  open client connections, more get 503 (0 = half the\n"
          "                          fd limit)                                 [0]\n"
          "      --max-body BYTES    client body limit, bytes                  [16777216]\n"
          "      --max-header BYTES  client request head limit, bytes          [32768]\n"
          "      --stream-buffer BYTES  bytes queued to a streaming client before the decode\n"
          "                          leg is paused                             [262144]\n"
          "      --cors-origin O     CORS: '*' or comma-separated allowed origins; answers\n"
          "                          preflight OPTIONS                         [off]\n"
          "timeouts and health\n"
          "      --prefill-timeout S  seconds for the whole prefill leg        [120]\n"
          "      --decode-timeout S  seconds for the whole decode leg          [1800]\n"
          "      --decode-first-byte-timeout S  the queue timeout: seconds to a streaming\n"
          "                          decode leg's first token, else that request alone ends\n"
          "                          with 504; the decoder is never ejected for it (0 = off)\n"
          "                                                                    [600]\n"
          "      --decode-idle-timeout S  seconds between tokens of a streaming decode leg,\n"
          "                          the same way (0 = off)                    [600]\n"
          "      --hang-window S     a worker whose legs made no progress for S seconds is\n"
          "                          probed; hung (ejected, its legs ended) only when the\n"
          "                          probe does not answer within --health-timeout (0 = off)\n"
          "                                                                    [5]\n"
          "      --health-timeout S  seconds one health check or hang probe may take  [2]\n"
          "      --shutdown-timeout S  SIGTERM: /health 503, listener closed, requests in\n"
          "                          flight finish within S seconds, then exit 0; a second\n"
          "                          SIGTERM exits at once                     [30]\n"
          "      --header-timeout S  seconds a client has to send its request  [15]\n"
          "      --idle-timeout S    seconds an idle keep-alive client connection is kept\n"
          "                                                                    [120]\n"
          "      --connect-timeout S  seconds for a TCP connect to a worker  [10]\n"
          "      --health-interval S  seconds between active health checks (0 = off)  [2]\n"
          "      --eject-after N     consecutive failures that eject a worker  [3]\n"
          "      --retries N         extra attempts of a leg on another worker  [2]\n"
          "      --pool-size N       idle keep-alive connections kept per worker  [256]\n"
          "fleet (docs/serve.md, A fleet of routers; fixed at start)\n"
          "      --bus URL           share every decoder's requests in flight and footprint\n"
          "                          weights with the other router replicas over NATS\n"
          "                          (nats://HOST:PORT; none = off)            [none]\n"
          "      --bus-subject P     subject prefix                            [eldr.fleet]\n"
          "      --bus-replica-id ID  this replica's id on the bus            [HOSTNAME:PORT]\n"
          "      --bus-snapshot-interval S  seconds between full states sent to the bus  [1]\n"
          "      --bus-peer-timeout S  seconds after which a silent replica is expired  [3]\n"
          "clients' and workers' authorization\n"
          "      --api-key KEY       clients must send \"Authorization: Bearer KEY\" on /v1\n"
          "                          paths (vLLM's --api-key); repeatable, any one admits;\n"
          "                          also $ELDR_API_KEY, kept out of the process list  [none]\n"
          "      --backend-api-key KEY  send \"Authorization: Bearer KEY\" to the workers\n"
          "                          (vLLM --api-key); also $ELDR_BACKEND_API_KEY, kept out\n"
          "                          of the process list                       [none]\n"
          "      --forward-authorization  pass the client's Authorization to the workers\n"
          "                          when no backend key is set                [off]\n"
          "watch, logs and recording\n"
          "      --watch-window S    seconds of decisions in /eldr/status's window  [60]\n"
          "      --watch-requests N  decisions the window holds at most        [4096]\n"
          "      --access-log FILE   one JSON line per request (id, policy, decision,\n"
          "                          decoder, similarity, ttft_ms, tpot_ms, status) to FILE,\n"
          "                          or - for stdout                           [off]\n"
          "      --record DIR        record every sampled request's expert counts, decision\n"
          "                          and latency as trace lines (counts form) for `eldr fit`\n"
          "                          into DIR/record-<UTC>-<seq>.jsonl          [off]\n"
          "      --record-sample F   fraction of requests recorded, (0, 1]     [1]\n"
          "      --record-max-bytes BYTES  start a new file before one would pass this many\n"
          "                          bytes (0 = no limit)                      [268435456]\n"
          "      --record-max-seconds S  start a new file after this many seconds\n"
          "                          (0 = no limit)                            [3600]\n"
          "      --record-experts E  routed experts per layer, for recording without an\n"
          "                          artifact                                  [the artifact's]\n"
          "      --record-queue N    records queued for the writer at most     [1024]\n"
          "      --record-queue-bytes BYTES  bytes of records queued at most   [67108864]\n"
          "  -q, --quiet             no log lines on stderr\n"
          "the run\n"
          "      --config FILE       JSON config (keys as the flags); re-read on SIGHUP\n"
          "                          together with the artifact                [none]\n"
          "      --check-config[=resolve]  check the config (file and flags) and the artifact,\n"
          "                          print a summary and exit; =resolve also checks what the\n"
          "                          start needs on this machine: every worker name resolves,\n"
          "                          the port is free, the access log and the record\n"
          "                          directory can be written\n"
          "  -h, --help              this help\n"
          "\n"
          "Exit status: 0 done; 1 the router could not start or run (a file that cannot\n"
          "be read or written, a port in use); 2 a wrong flag or config value.\n");
}

static void log_stderr(void *ctx, const char *line) {
  (void)ctx;
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  char ts[32];
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  fprintf(stderr, "%s eldr serve: %s\n", ts, line);
}

/* The flags that set one config key: the key's own parser and ranges
 * (eldr_serve_config_parse) read the value, so a flag and its key accept
 * the same values and give the same errors. kind: 'I' integer, 'N' number,
 * 'S' string, 'T' / 'F' a flag without value that sets a boolean key true /
 * false. */
typedef struct flagkey {
  const char *flag, *key;
  char kind;
} flagkey;
static const flagkey FLAGS[] = {
    {"artifact", "artifact", 'S'},
    {"policy", "policy", 'S'},
    {"pd", "pd", 'S'},
    {"bootstrap-port", "bootstrap_port", 'I'},
    {"predict-threshold", "predict_threshold", 'N'},
    {"exact-timeout", "exact_timeout", 'N'},
    {"tau", "tau", 'N'},
    {"host", "host", 'S'},
    {"port", "port", 'I'},
    {"prefill-timeout", "prefill_timeout", 'N'},
    {"decode-timeout", "decode_timeout", 'N'},
    {"decode-first-byte-timeout", "decode_first_byte_timeout", 'N'},
    {"decode-idle-timeout", "decode_idle_timeout", 'N'},
    {"header-timeout", "header_timeout", 'N'},
    {"idle-timeout", "idle_timeout", 'N'},
    {"connect-timeout", "connect_timeout", 'N'},
    {"hang-window", "hang_window", 'N'},
    {"health-timeout", "health_timeout", 'N'},
    {"shutdown-timeout", "shutdown_timeout", 'N'},
    {"bus", "bus", 'S'},
    {"bus-subject", "bus_subject", 'S'},
    {"bus-replica-id", "bus_replica_id", 'S'},
    {"bus-snapshot-interval", "bus_snapshot_interval", 'N'},
    {"bus-peer-timeout", "bus_peer_timeout", 'N'},
    {"health-interval", "health_interval", 'N'},
    {"eject-after", "eject_after", 'I'},
    {"retries", "retries", 'I'},
    {"pool-size", "pool_size", 'I'},
    {"max-body", "max_body", 'I'},
    {"max-header", "max_header", 'I'},
    {"max-connections", "max_connections", 'I'},
    {"threads", "threads", 'I'},
    {"stream-buffer", "stream_buffer", 'I'},
    {"prefill-guard", "prefill_guard", 'I'},
    {"decode-max-batch", "decode_max_batch", 'I'},
    {"fp-own-weight", "fp_own_weight", 'N'},
    {"fp-home-weight", "fp_home_weight", 'N'},
    {"sigcache-rows", "sigcache_rows", 'I'},
    {"sig-cache-mb", "sig_cache_mb", 'I'},
    {"scrape-interval", "scrape_interval", 'N'},
    {"dns-interval", "dns_interval", 'N'},
    {"dns-server", "dns_server", 'S'},
    {"access-log", "access_log", 'S'},
    {"backend-api-key", "backend_api_key", 'S'},
    {"forward-authorization", "forward_authorization", 'T'},
    {"cors-origin", "cors_origin", 'S'},
    {"no-splice", "splice_routed_experts", 'F'},
    {"watch-window", "watch_window", 'N'},
    {"watch-requests", "watch_requests", 'I'},
    {"record", "record", 'S'},
    {"record-sample", "record_sample", 'N'},
    {"record-max-bytes", "record_max_bytes", 'I'},
    {"record-max-seconds", "record_max_seconds", 'N'},
    {"record-experts", "record_experts", 'I'},
    {"record-queue", "record_queue", 'I'},
    {"record-queue-bytes", "record_queue_bytes", 'I'},
};
#define NFLAGS (sizeof FLAGS / sizeof FLAGS[0])

/* The flags handled here rather than through a key. */
enum { O_KEY = 256, O_PREFILL = O_KEY + (int)NFLAGS, O_DECODE, O_PDNS, O_DDNS, O_CONFIG, O_CHECK, O_SEED, O_QUIET, O_HELP, O_APIKEY };

typedef struct serve_args {
  const char *config;
  int check;   /* -1 no check, 0 --check-config, 1 =resolve */
  int quiet;
  json_t *ov;  /* every flag in the config file's syntax: re-applied over the file on each reload */
} serve_args;

/* The JSON value of a flag's text for a key of kind k; NULL with a usage
 * error's message in why when the text is not of that kind. */
static json_t *flag_value(char k, const char *text, const char **why) {
  char *end = NULL;
  errno = 0;
  switch (k) {
  case 'I': {
    long long v = strtoll(text, &end, 10);
    if (!*text || *end || errno) break;
    return json_integer(v);
  }
  case 'N': {
    double v = strtod(text, &end);
    if (!*text || *end || errno || !isfinite(v)) break;
    return json_real(v);
  }
  case 'S': return json_string(text);
  case 'T': return json_true();
  case 'F': return json_false();
  }
  *why = k == 'I' ? "not an integer" : "not a number";
  return NULL;
}

/* Set a flag's key on c through the config parser; also into the overrides. */
static void set_key(const char *cmd, eldr_serve_config *c, json_t *ov, const flagkey *f, const char *text) {
  const char *why = NULL;
  json_t *v = flag_value(f->kind, text ? text : "", &why);
  if (!v) cli_usage_error(cmd, "--%s: '%s' is %s", f->flag, text, why);
  json_t *one = json_pack("{s:O}", f->key, v);
  char *doc = one ? json_dumps(one, JSON_COMPACT) : NULL;
  if (!doc) cli_fail(cmd, "out of memory");
  eldr_diag d = {{0}};
  int rc = eldr_serve_config_parse(c, doc, strlen(doc), &d);
  free(doc);
  json_decref(one);
  if (rc) {
    const char *m = eldr_diag_msg(&d, rc);
    if (!strncmp(m, "config: ", 8)) m += 8;
    cli_usage_error(cmd, "--%s: %s", f->flag, m);
  }
  json_object_set_new(ov, f->key, v);
}

/* --api-key (repeatable): the flags' keys replace the config file's. */
static void add_api_key(const char *cmd, eldr_serve_config *c, json_t *ov, const char *key, int *first) {
  if (!*first) {
    for (size_t i = 0; i < c->n_api_keys; i++) free(c->api_keys[i]);
    free(c->api_keys);
    c->api_keys = NULL;
    c->n_api_keys = 0;
    json_object_set_new(ov, "api_key", json_array());
    *first = 1;
  }
  eldr_diag d = {{0}};
  const int rc = eldr_serve_config_add_api_key(c, key, &d);
  if (rc) cli_usage_error(cmd, "--api-key: %s", eldr_diag_msg(&d, rc));
  json_array_append_new(json_object_get(ov, "api_key"), json_string(key));
}

/* --prefill, --decode, --*-dns: the flags' lists replace the config file's. */
static void add_worker(const char *cmd, eldr_serve_config *c, json_t *ov, int o, const char *val, int *first) {
  const int dec = o == O_DECODE || o == O_DDNS, dns = o == O_PDNS || o == O_DDNS;
  char ***v = dns ? (dec ? &c->decode_dns : &c->prefill_dns) : (dec ? &c->decode : &c->prefill);
  size_t *n = dns ? (dec ? &c->n_decode_dns : &c->n_prefill_dns) : (dec ? &c->n_decode : &c->n_prefill);
  if (!*first) {
    for (size_t i = 0; i < *n; i++) free((*v)[i]);
    free(*v);
    *v = NULL;
    *n = 0;
    *first = 1;
  }
  eldr_diag d = {{0}};
  const int rc = dns ? eldr_serve_config_add_dns(c, dec, val, &d) : eldr_serve_config_add_worker(c, dec, val, &d);
  const char *key = dns ? (dec ? "decode_dns" : "prefill_dns") : (dec ? "decode" : "prefill");
  if (rc) cli_usage_error(cmd, "--%s%s: %s", dec ? "decode" : "prefill", dns ? "-dns" : "", eldr_diag_msg(&d, rc));
  if (!json_object_get(ov, key)) json_object_set_new(ov, key, json_array());
  json_array_append_new(json_object_get(ov, key), json_string(val));
}

/* SGLang's gateway form --prefill URL PORT: a number right after a
 * --prefill's URL is that worker's bootstrap port (config bootstrap_ports).
 * Taken out of argv before getopt (which would permute it away); at most
 * SF_BOOT of them. */
#define MAX_BOOT 256
typedef struct boot_args {
  const char *url[MAX_BOOT], *port[MAX_BOOT];
  int n;
} boot_args;

static int is_port_text(const char *v) { return v && v[0] && strlen(v) <= 6 && strspn(v, "0123456789") == strlen(v); }

static void strip_boot_ports(const char *cmd, int *argc, char **argv, boot_args *b) {
  int w = 1;
  for (int i = 1; i < *argc; i++) {
    argv[w++] = argv[i];
    const char *url = !strcmp(argv[i], "--prefill") && i + 1 < *argc ? argv[i + 1]
                      : !strncmp(argv[i], "--prefill=", 10)       ? argv[i] + 10
                                                                  : NULL;
    if (!url) continue;
    if (!strcmp(argv[i], "--prefill")) argv[w++] = argv[++i];
    if (i + 1 < *argc && is_port_text(argv[i + 1])) {
      if (b->n == MAX_BOOT) cli_usage_error(cmd, "more than %d --prefill URL PORT", MAX_BOOT);
      b->url[b->n] = url;
      b->port[b->n++] = argv[++i];
    }
  }
  argv[w] = NULL;
  *argc = w;
}

static void apply_boot_ports(const char *cmd, eldr_serve_config *c, json_t *ov, const boot_args *b) {
  for (int i = 0; i < b->n; i++) {
    eldr_diag d = {{0}};
    const int rc = eldr_serve_config_set_boot_port(c, b->url[i], atoll(b->port[i]), &d);
    if (rc) cli_usage_error(cmd, "--prefill %s %s: %s", b->url[i], b->port[i], eldr_diag_msg(&d, rc));
    if (!json_object_get(ov, "bootstrap_ports")) json_object_set_new(ov, "bootstrap_ports", json_object());
    json_object_set_new(json_object_get(ov, "bootstrap_ports"), b->url[i], json_integer(atoll(b->port[i])));
  }
}

static void parse(const char *cmd, int argc, char **argv, eldr_serve_config *c, serve_args *a) {
  static boot_args boot; /* static: its size; parse runs once */
  boot.n = 0;
  strip_boot_ports(cmd, &argc, argv, &boot);
  struct option opts[NFLAGS + 12];
  size_t no = 0;
  for (size_t i = 0; i < NFLAGS; i++)
    opts[no++] = (struct option){FLAGS[i].flag, FLAGS[i].kind == 'T' || FLAGS[i].kind == 'F' ? no_argument : required_argument,
                                 0, O_KEY + (int)i};
  const struct option more[] = {{"prefill", required_argument, 0, O_PREFILL},   {"decode", required_argument, 0, O_DECODE},
                                {"prefill-dns", required_argument, 0, O_PDNS}, {"decode-dns", required_argument, 0, O_DDNS},
                                {"config", required_argument, 0, O_CONFIG},     {"check-config", optional_argument, 0, O_CHECK},
                                {"seed", required_argument, 0, O_SEED},         {"quiet", no_argument, 0, O_QUIET},
                                {"help", no_argument, 0, O_HELP},               {"api-key", required_argument, 0, O_APIKEY},
                                {0, 0, 0, 0}};
  for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) opts[no++] = more[i];
  /* pass 1: --help and --config (the file is applied before the other flags) */
  cli_getopt_reset();
  int o;
  while ((o = getopt_long(argc, argv, ":hq", opts, NULL)) != -1) {
    if (o == O_HELP || o == 'h') {
      usage(stdout);
      exit(0);
    }
    if (o == O_CONFIG) a->config = optarg;
    if (o == '?' || o == ':') cli_bad_option(cmd, argc, argv, o);
  }
  eldr_serve_config_default(c);
  if (a->config) {
    eldr_diag d = {{0}};
    const int rc = eldr_serve_config_load(c, a->config, &d);
    if (rc == ELDR_EIO) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc)); /* cannot be read: an input */
    if (rc) cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));      /* a wrong value in it */
    c->config_path = strdup(a->config);
  }
  a->check = -1;
  if (!(a->ov = json_object())) cli_fail(cmd, "out of memory");
  int first[4] = {0, 0, 0, 0}, first_key = 0;
  cli_getopt_reset();
  while ((o = getopt_long(argc, argv, ":hq", opts, NULL)) != -1) {
    if (o >= O_KEY && o < O_KEY + (int)NFLAGS) {
      set_key(cmd, c, a->ov, &FLAGS[o - O_KEY], optarg);
      continue;
    }
    switch (o) {
    case O_PREFILL:
    case O_DECODE:
    case O_PDNS:
    case O_DDNS: add_worker(cmd, c, a->ov, o, optarg, &first[o - O_PREFILL]); break;
    case O_APIKEY: add_api_key(cmd, c, a->ov, optarg, &first_key); break;
    case O_CHECK:
      if (optarg && strcmp(optarg, "resolve")) cli_usage_error(cmd, "--check-config: '%s' is not 'resolve'", optarg);
      a->check = optarg != NULL;
      break;
    case O_SEED:
      c->seed = cli_parse_u64(cmd, "--seed", optarg);
      if (a->config && c->seed > INT64_MAX) cli_usage_error(cmd, "--seed: with --config at most %lld", (long long)INT64_MAX);
      json_object_set_new(a->ov, "seed", json_integer((json_int_t)c->seed));
      break;
    case 'q':
    case O_QUIET: a->quiet = 1; break;
    case O_CONFIG: break;
    default: cli_bad_option(cmd, argc, argv, o);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
  apply_boot_ports(cmd, c, a->ov, &boot);
  if (c->record_dir && !*c->record_dir) cli_usage_error(cmd, "--record: empty directory name");
  const char *envkey = getenv("ELDR_BACKEND_API_KEY");
  if (!c->backend_api_key && envkey && *envkey) {
    c->backend_api_key = strdup(envkey);
    json_object_set_new(a->ov, "backend_api_key", json_string(envkey));
  }
  const char *envckey = getenv("ELDR_API_KEY"); /* a key from the environment stays out of ps */
  if (!c->n_api_keys && envckey && *envckey) {
    eldr_diag d = {{0}};
    const int rc = eldr_serve_config_add_api_key(c, envckey, &d);
    if (rc) cli_usage_error(cmd, "$ELDR_API_KEY: %s", eldr_diag_msg(&d, rc));
    json_t *keys = json_array();
    json_array_append_new(keys, json_string(envckey));
    json_object_set_new(a->ov, "api_key", keys);
  }
  if (json_object_size(a->ov) && !(c->overrides = json_dumps(a->ov, JSON_COMPACT))) cli_fail(cmd, "out of memory");
  if (!c->host) cli_fail(cmd, "out of memory");
}

int eldr_cmd_serve(int argc, char **argv) {
  const char *cmd = "serve";
  eldr_serve_config c;
  serve_args a = {0};
  parse(cmd, argc, argv, &c, &a);
  json_decref(a.ov);
  eldr_diag d = {{0}};
  int rc = eldr_serve_config_validate(&c, &d);
  if (rc) cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));
  if (a.check >= 0) {
    /* the values are right (above): what is left is this machine's (files,
     * names, the port) and the artifact's, an input */
    if ((rc = eldr_serve_config_check(&c, a.check, &d))) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    printf("config ok: %zu prefill, %zu decode worker URLs; %zu prefill, %zu decode DNS names%s; "
           "artifact %s; policy %s; listen %s:%d\n",
           c.n_prefill, c.n_decode, c.n_prefill_dns, c.n_decode_dns, a.check ? " (all resolve)" : "",
           c.artifact ? c.artifact : "none", eldr_policy_name(c.policy), c.host, c.port);
    eldr_artifact *art = NULL;
    if (c.artifact && eldr_artifact_load(c.artifact, &art, &d) == 0) { /* what the signature cache will take */
      size_t rb = eldr_sigcache_row_bytes(&art->shape, art->mask);
      size_t fit = eldr_sigcache_capacity_for(&art->shape, art->mask, c.sig_cache_mb << 20);
      size_t rows = c.sig_cache_mb && c.sigcache_rows ? (fit < c.sigcache_rows ? fit : c.sigcache_rows) : 0;
      printf("signature cache: %zu rows of %zu bytes (%zu of %u layers x %u experts), at most %.1f MiB "
             "(sigcache_rows %zu, sig_cache_mb %zu)\n",
             rows, rb, rb / art->shape.num_experts, art->shape.num_layers, art->shape.num_experts,
             (double)rows * (double)(rb + ELDR_SIGCACHE_ROW_OVERHEAD) / (1 << 20), c.sigcache_rows, c.sig_cache_mb);
      eldr_artifact_free(art);
    }
    eldr_serve_config_free(&c);
    return 0;
  }
  c.handle_signals = 1;
  if (!a.quiet) c.log = log_stderr;
  eldr_server *s = NULL;
  rc = eldr_server_new(&c, &s, &d);
  if (rc) {
    eldr_serve_config_free(&c);
    cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  }
  /* the bound port on stdout, for scripts that start the router on port 0 */
  printf("listening on %s:%d\n", c.host, eldr_server_port(s));
  fflush(stdout);
  rc = eldr_server_run(s);
  eldr_server_free(s);
  eldr_serve_config_free(&c);
  if (rc) cli_fail(cmd, "event loop failed");
  return 0;
}
