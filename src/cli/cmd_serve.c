/* cmd_serve.c — `eldr serve`: the HTTP router in front of prefill and decode
 * workers. Flags override the config file, also when SIGHUP re-reads it
 * (they travel as the config's overrides); SIGHUP re-reads the config file
 * and the artifact; SIGINT/SIGTERM stop. */
#include <getopt.h>
#include <jansson.h>
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
          "SIGHUP, or POST /admin/reload with the config file's admin_token, reloads.\n"
          "See docs/serve.md.\n"
          "\n"
          "  --prefill URL         prefill worker http://host:port (repeatable)\n"
          "  --decode URL          decode worker http://host:port (repeatable)\n"
          "  --prefill-dns NAME:PORT  every A/AAAA address of NAME is a prefill worker;\n"
          "                        re-resolved every --dns-interval (repeatable)\n"
          "  --decode-dns NAME:PORT   the same for decode workers (a headless Service)\n"
          "  --dns-interval S      re-resolution of --*-dns names and retry of worker names\n"
          "                        that did not resolve (default 5)\n"
          "  --dns-server IP[:PORT]  nameserver to use instead of /etc/resolv.conf\n"
          "  --access-log FILE     one JSON line per request (id, policy, decision, decoder,\n"
          "                        similarity, ttft_ms, tpot_ms, status) to FILE, or - for stdout\n"
          "  --record DIR          record every sampled request's expert counts, decision\n"
          "                        and latency as trace lines (counts form) for `eldr fit`\n"
          "                        into DIR/record-<UTC>-<seq>.jsonl (docs/serve.md, Recording)\n"
          "  --record-sample F     fraction of requests recorded, (0, 1] (default 1)\n"
          "  --record-max-bytes N  start a new file before one would pass N bytes\n"
          "                        (default 268435456; 0 = no limit)\n"
          "  --record-max-seconds S  start a new file after S seconds (default 3600; 0 = no limit)\n"
          "  --record-experts E    routed experts per layer, for recording without an artifact\n"
          "  --scrape-interval S   read every worker's /metrics (vllm:num_requests_running +\n"
          "                        waiting) this often and route on it plus this router's own\n"
          "                        legs since; for replicas sharing workers (0 = off, default)\n"
          "  --artifact FILE       routing artifact from `eldr fit` (without: load-only routing)\n"
          "  --policy NAME         decode policy: eldr (default), jsq, p2c, rr, random\n"
          "  --tau X               locality band width in [0, 2] (default: the artifact's)\n"
          "  --host ADDR           listen address (default 127.0.0.1)\n"
          "  --port N              listen port (default 8000; 0 = any free port)\n"
          "  --config FILE         JSON config (keys as in docs/serve.md); flags override it;\n"
          "                        re-read on SIGHUP together with the artifact\n"
          "  --prefill-timeout S   whole prefill leg (default 120)\n"
          "  --decode-timeout S    whole decode leg (default 1800)\n"
          "  --decode-first-byte-timeout S  streaming decode leg: the reply's head within S,\n"
          "                        else the decoder is ejected as hung (default 30; 0 = off)\n"
          "  --decode-idle-timeout S  streaming decode leg: at most S between reads (default 30)\n"
          "  --header-timeout S    client must send its request within (default 15)\n"
          "  --connect-timeout S   TCP connect to a worker and one health check (default 10)\n"
          "  --health-interval S   active health checks, 0 = off (default 2)\n"
          "  --eject-after N       consecutive failures that eject a worker (default 3)\n"
          "  --retries N           extra attempts of a leg on another worker (default 2)\n"
          "  --max-body BYTES      client body limit (default 16777216)\n"
          "  --max-connections N   open client connections, more get 503 (default 0: half the fd limit)\n"
          "  --threads N           event loops, each accepting on its own SO_REUSEPORT listener\n"
          "                        (default 0: the number of online cores)\n"
          "  --stream-buffer BYTES bytes queued to a streaming client before the decode leg\n"
          "                        is paused (default 262144)\n"
          "  --prefill-guard N     prefill load guard in requests (default 4)\n"
          "  --sigcache-rows N     signature cache capacity in KV blocks, 0 = off (default 65536)\n"
          "  --sig-cache-mb N      signature cache memory bound in MiB: rows of the artifact's masked\n"
          "                        layers x experts bytes (+32 each) that fit, 0 = off (default 256)\n"
          "  --backend-api-key KEY send \"Authorization: Bearer KEY\" to the workers (vLLM --api-key);\n"
          "                        also from $ELDR_BACKEND_API_KEY (kept out of the process list)\n"
          "  --forward-authorization  pass the client's Authorization to the workers when no\n"
          "                        backend key is set (default: never forwarded)\n"
          "  --cors-origin O       CORS: '*' or comma-separated allowed origins; answers\n"
          "                        preflight OPTIONS (default: no CORS)\n"
          "  --no-splice           relay the decoder's routed_experts as sent (default: the\n"
          "                        prefill's prompt rows spliced in when both carry them)\n"
          "  --seed N              seed for random/p2c (default 1)\n"
          "  --check-config[=resolve]  check the config (file and flags) and the artifact,\n"
          "                        print a summary and exit 0 (2 naming what is wrong);\n"
          "                        =resolve also resolves every worker name\n"
          "  --quiet               no log lines on stderr\n"
          "  -h, --help            this text\n");
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

int eldr_cmd_serve(int argc, char **argv) {
  const char *cmd = "serve";
  enum {
    O_PREFILL = 256, O_DECODE, O_ARTIFACT, O_POLICY, O_TAU, O_HOST, O_PORT, O_CONFIG, O_PT, O_DT,
    O_HT, O_CT, O_HI, O_EJ, O_RETRIES, O_MAXBODY, O_GUARD, O_SCR, O_SCMB, O_SEED, O_NOSPLICE, O_DFB, O_DIDLE, O_APIKEY, O_FWDAUTH, O_CORS, O_QUIET, O_HELP,
    O_PDNS, O_DDNS, O_DNSI, O_DNSS, O_CHECK, O_SCRAPE, O_ALOG,
    O_MAXCONN, O_STREAMBUF, O_REC, O_RECSAMPLE, O_RECBYTES, O_RECSECS, O_RECEXP, O_THREADS
  };
  static const struct option opts[] = {
      {"prefill", required_argument, 0, O_PREFILL}, {"decode", required_argument, 0, O_DECODE},
      {"artifact", required_argument, 0, O_ARTIFACT}, {"policy", required_argument, 0, O_POLICY},
      {"tau", required_argument, 0, O_TAU}, {"host", required_argument, 0, O_HOST},
      {"port", required_argument, 0, O_PORT}, {"config", required_argument, 0, O_CONFIG},
      {"prefill-timeout", required_argument, 0, O_PT}, {"decode-timeout", required_argument, 0, O_DT},
      {"header-timeout", required_argument, 0, O_HT}, {"connect-timeout", required_argument, 0, O_CT},
      {"health-interval", required_argument, 0, O_HI}, {"eject-after", required_argument, 0, O_EJ},
      {"retries", required_argument, 0, O_RETRIES}, {"max-body", required_argument, 0, O_MAXBODY},
      {"prefill-guard", required_argument, 0, O_GUARD}, {"sigcache-rows", required_argument, 0, O_SCR},
      {"sig-cache-mb", required_argument, 0, O_SCMB},
      {"seed", required_argument, 0, O_SEED}, {"quiet", no_argument, 0, O_QUIET},
      {"help", no_argument, 0, O_HELP}, {"prefill-dns", required_argument, 0, O_PDNS},
      {"decode-dns", required_argument, 0, O_DDNS}, {"dns-interval", required_argument, 0, O_DNSI},
      {"dns-server", required_argument, 0, O_DNSS}, {"check-config", optional_argument, 0, O_CHECK},
      {"scrape-interval", required_argument, 0, O_SCRAPE}, {"access-log", required_argument, 0, O_ALOG},
      {"no-splice", no_argument, 0, O_NOSPLICE}, {"backend-api-key", required_argument, 0, O_APIKEY},
      {"forward-authorization", no_argument, 0, O_FWDAUTH}, {"cors-origin", required_argument, 0, O_CORS},
      {"decode-first-byte-timeout", required_argument, 0, O_DFB}, {"decode-idle-timeout", required_argument, 0, O_DIDLE},
      {"max-connections", required_argument, 0, O_MAXCONN},
      {"stream-buffer", required_argument, 0, O_STREAMBUF}, {"record", required_argument, 0, O_REC},
      {"record-sample", required_argument, 0, O_RECSAMPLE}, {"record-max-bytes", required_argument, 0, O_RECBYTES},
      {"record-max-seconds", required_argument, 0, O_RECSECS}, {"record-experts", required_argument, 0, O_RECEXP},
      {"threads", required_argument, 0, O_THREADS}, {0, 0, 0, 0}};
  /* pass 1: --help and --config (the file is applied before the other flags) */
  const char *config = NULL;
  cli_getopt_reset();
  int o;
  while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    if (o == O_HELP || o == 'h') {
      usage(stdout);
      return 0;
    }
    if (o == O_CONFIG) config = optarg;
    if (o == '?' || o == ':') cli_bad_option(cmd, argc, argv, o);
  }
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  eldr_diag d = {{0}};
  if (config) {
    int rc = eldr_serve_config_load(&c, config, &d);
    if (rc) cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));
    c.config_path = strdup(config);
  }
  int quiet = 0, cli_prefill = 0, cli_decode = 0, cli_pdns = 0, cli_ddns = 0, check = -1;
  /* every flag also goes into ov, in the config file's syntax: re-applied
   * over the file on each reload */
  json_t *ov = json_object();
  if (!ov) cli_fail(cmd, "out of memory");
#define OV(key, value) json_object_set_new(ov, key, value)
  cli_getopt_reset();
  while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    int rc = 0;
    switch (o) {
    case O_PREFILL:
    case O_DECODE: {
      int dec = o == O_DECODE;
      int *first = dec ? &cli_decode : &cli_prefill;
      if (!*first) { /* flags replace the config file's list */
        char ***v = dec ? &c.decode : &c.prefill;
        size_t *n = dec ? &c.n_decode : &c.n_prefill;
        for (size_t i = 0; i < *n; i++) free((*v)[i]);
        free(*v);
        *v = NULL;
        *n = 0;
        *first = 1;
      }
      rc = eldr_serve_config_add_worker(&c, dec, optarg, &d);
      if (rc) cli_usage_error(cmd, "--%s: %s", dec ? "decode" : "prefill", eldr_diag_msg(&d, rc));
      const char *k = dec ? "decode" : "prefill";
      if (!json_object_get(ov, k)) json_object_set_new(ov, k, json_array());
      json_array_append_new(json_object_get(ov, k), json_string(optarg));
      break;
    }
    case O_PDNS:
    case O_DDNS: {
      int dec = o == O_DDNS;
      int *first = dec ? &cli_ddns : &cli_pdns;
      char ***v = dec ? &c.decode_dns : &c.prefill_dns;
      size_t *n = dec ? &c.n_decode_dns : &c.n_prefill_dns;
      if (!*first) { /* flags replace the config file's list */
        for (size_t i = 0; i < *n; i++) free((*v)[i]);
        free(*v);
        *v = NULL;
        *n = 0;
        *first = 1;
      }
      rc = eldr_serve_config_add_dns(&c, dec, optarg, &d);
      if (rc) cli_usage_error(cmd, "--%s: %s", dec ? "decode-dns" : "prefill-dns", eldr_diag_msg(&d, rc));
      const char *k = dec ? "decode_dns" : "prefill_dns";
      if (!json_object_get(ov, k)) json_object_set_new(ov, k, json_array());
      json_array_append_new(json_object_get(ov, k), json_string(optarg));
      break;
    }
    case O_ALOG:
      free(c.access_log);
      c.access_log = strdup(optarg);
      OV("access_log", json_string(optarg));
      break;
    case O_REC:
      if (!*optarg) cli_usage_error(cmd, "--record: empty directory name");
      free(c.record_dir);
      c.record_dir = strdup(optarg);
      OV("record", json_string(optarg));
      break;
    case O_RECSAMPLE:
      c.record_sample = cli_parse_double(cmd, "--record-sample", optarg, 0, 1);
      if (!(c.record_sample > 0)) cli_usage_error(cmd, "--record-sample: must be in (0, 1]");
      OV("record_sample", json_real(c.record_sample));
      break;
    case O_RECBYTES: c.record_max_bytes = (uint64_t)cli_parse_long(cmd, "--record-max-bytes", optarg, 0, 1l << 50); OV("record_max_bytes", json_integer((json_int_t)c.record_max_bytes)); break;
    case O_RECSECS: c.record_max_seconds = cli_parse_double(cmd, "--record-max-seconds", optarg, 0, 86400 * 366); OV("record_max_seconds", json_real(c.record_max_seconds)); break;
    case O_RECEXP: c.record_experts = (uint32_t)cli_parse_long(cmd, "--record-experts", optarg, 1, ELDR_MAX_EXPERTS); OV("record_experts", json_integer((json_int_t)c.record_experts)); break;
    case O_SCRAPE:
      c.scrape_interval_s = cli_parse_double(cmd, "--scrape-interval", optarg, 0, 3600);
      if (c.scrape_interval_s > 0 && c.scrape_interval_s < 0.01) cli_usage_error(cmd, "--scrape-interval: 0 (off) or >= 0.01");
      OV("scrape_interval", json_real(c.scrape_interval_s));
      break;
    case O_DNSI: c.dns_interval_s = cli_parse_double(cmd, "--dns-interval", optarg, 0.01, 86400); OV("dns_interval", json_real(c.dns_interval_s)); break;
    case O_DNSS:
      free(c.dns_server);
      c.dns_server = strdup(optarg);
      OV("dns_server", json_string(optarg));
      break;
    case O_CHECK:
      if (optarg && strcmp(optarg, "resolve")) cli_usage_error(cmd, "--check-config: '%s' is not 'resolve'", optarg);
      check = optarg != NULL;
      break;
    case O_ARTIFACT:
      free(c.artifact);
      c.artifact = strdup(optarg);
      OV("artifact", json_string(optarg));
      break;
    case O_POLICY: {
      eldr_policy_kind k;
      if (eldr_policy_parse(optarg, &k) || k == ELDR_POLICY_DOMAIN)
        cli_usage_error(cmd, "--policy: '%s' is not one of eldr, jsq, p2c, rr, random", optarg);
      c.policy = k;
      OV("policy", json_string(optarg));
      break;
    }
    case O_TAU: c.tau = cli_parse_double(cmd, "--tau", optarg, 0, 2); OV("tau", json_real(c.tau)); break;
    case O_HOST:
      free(c.host);
      c.host = strdup(optarg);
      OV("host", json_string(optarg));
      break;
    case O_PORT: c.port = (int)cli_parse_long(cmd, "--port", optarg, 0, 65535); OV("port", json_integer((json_int_t)c.port)); break;
    case O_CONFIG: break;
    case O_PT: c.prefill_timeout_s = cli_parse_double(cmd, "--prefill-timeout", optarg, 0.001, 86400); OV("prefill_timeout", json_real(c.prefill_timeout_s)); break;
    case O_DT: c.decode_timeout_s = cli_parse_double(cmd, "--decode-timeout", optarg, 0.001, 86400); OV("decode_timeout", json_real(c.decode_timeout_s)); break;
    case O_HT: c.header_timeout_s = cli_parse_double(cmd, "--header-timeout", optarg, 0.001, 86400); OV("header_timeout", json_real(c.header_timeout_s)); break;
    case O_CT: c.connect_timeout_s = cli_parse_double(cmd, "--connect-timeout", optarg, 0.001, 86400); OV("connect_timeout", json_real(c.connect_timeout_s)); break;
    case O_HI: c.health_interval_s = cli_parse_double(cmd, "--health-interval", optarg, 0, 86400); OV("health_interval", json_real(c.health_interval_s)); break;
    case O_EJ: c.eject_after = (int)cli_parse_long(cmd, "--eject-after", optarg, 1, 1000); OV("eject_after", json_integer((json_int_t)c.eject_after)); break;
    case O_RETRIES: c.retries = (int)cli_parse_long(cmd, "--retries", optarg, 0, 16); OV("retries", json_integer((json_int_t)c.retries)); break;
    case O_MAXBODY: c.max_body = (size_t)cli_parse_long(cmd, "--max-body", optarg, 1, 1l << 34); OV("max_body", json_integer((json_int_t)c.max_body)); break;
    case O_MAXCONN: c.max_connections = (size_t)cli_parse_long(cmd, "--max-connections", optarg, 0, 1l << 24); OV("max_connections", json_integer((json_int_t)c.max_connections)); break;
    case O_THREADS: c.threads = (int)cli_parse_long(cmd, "--threads", optarg, 0, ELDR_SERVE_MAX_THREADS); OV("threads", json_integer((json_int_t)c.threads)); break;
    case O_STREAMBUF: c.stream_buffer = (size_t)cli_parse_long(cmd, "--stream-buffer", optarg, 4096, 1l << 30); OV("stream_buffer", json_integer((json_int_t)c.stream_buffer)); break;
    case O_GUARD: c.prefill_guard = (uint32_t)cli_parse_long(cmd, "--prefill-guard", optarg, 0, 1000000); OV("prefill_guard", json_integer((json_int_t)c.prefill_guard)); break;
    case O_SCR: c.sigcache_rows = (size_t)cli_parse_long(cmd, "--sigcache-rows", optarg, 0, 1l << 26); OV("sigcache_rows", json_integer((json_int_t)c.sigcache_rows)); break;
    case O_SCMB: c.sig_cache_mb = (size_t)cli_parse_long(cmd, "--sig-cache-mb", optarg, 0, 1l << 20); OV("sig_cache_mb", json_integer((json_int_t)c.sig_cache_mb)); break;
    case O_SEED:
      c.seed = cli_parse_u64(cmd, "--seed", optarg);
      if (config && c.seed > INT64_MAX) cli_usage_error(cmd, "--seed: with --config at most %lld", (long long)INT64_MAX);
      OV("seed", json_integer((json_int_t)c.seed));
      break;
    case O_DFB: c.decode_first_byte_timeout_s = cli_parse_double(cmd, "--decode-first-byte-timeout", optarg, 0, 86400); OV("decode_first_byte_timeout", json_real(c.decode_first_byte_timeout_s)); break;
    case O_DIDLE: c.decode_idle_timeout_s = cli_parse_double(cmd, "--decode-idle-timeout", optarg, 0, 86400); OV("decode_idle_timeout", json_real(c.decode_idle_timeout_s)); break;
    case O_APIKEY: /* also in the overrides: a reload re-applies it over the file */
      free(c.backend_api_key);
      c.backend_api_key = strdup(optarg);
      OV("backend_api_key", json_string(optarg));
      break;
    case O_FWDAUTH: c.forward_authorization = 1; OV("forward_authorization", json_true()); break;
    case O_CORS:
      free(c.cors_origin);
      c.cors_origin = strdup(optarg);
      OV("cors_origin", json_string(optarg));
      break;
    case O_NOSPLICE: c.splice_routed_experts = 0; OV("splice_routed_experts", json_false()); break;
    case O_QUIET: quiet = 1; break;
    default: cli_bad_option(cmd, argc, argv, o);
    }
    (void)rc;
  }
  const char *envkey = getenv("ELDR_BACKEND_API_KEY");
  if (!c.backend_api_key && envkey && *envkey) {
    c.backend_api_key = strdup(envkey);
    OV("backend_api_key", json_string(envkey));
  }
  if (json_object_size(ov) && !(c.overrides = json_dumps(ov, JSON_COMPACT))) cli_fail(cmd, "out of memory");
  json_decref(ov);
#undef OV
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
  if (!c.host) cli_fail(cmd, "out of memory");
  int rc = eldr_serve_config_validate(&c, &d);
  if (rc) cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));
  if (check >= 0) {
    if ((rc = eldr_serve_config_check(&c, check, &d))) cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));
    printf("config ok: %zu prefill, %zu decode worker URLs; %zu prefill, %zu decode DNS names%s; "
           "artifact %s; policy %s; listen %s:%d\n",
           c.n_prefill, c.n_decode, c.n_prefill_dns, c.n_decode_dns, check ? " (all resolve)" : "",
           c.artifact ? c.artifact : "none", eldr_policy_name(c.policy), c.host, c.port);
    eldr_artifact *a = NULL;
    if (c.artifact && eldr_artifact_load(c.artifact, &a, &d) == 0) { /* what the signature cache will take */
      size_t rb = eldr_sigcache_row_bytes(&a->shape, a->mask);
      size_t fit = eldr_sigcache_capacity_for(&a->shape, a->mask, c.sig_cache_mb << 20);
      size_t rows = c.sig_cache_mb && c.sigcache_rows ? (fit < c.sigcache_rows ? fit : c.sigcache_rows) : 0;
      printf("signature cache: %zu rows of %zu bytes (%zu of %u layers x %u experts), at most %.1f MiB "
             "(sigcache_rows %zu, sig_cache_mb %zu)\n",
             rows, rb, rb / a->shape.num_experts, a->shape.num_layers, a->shape.num_experts,
             (double)rows * (double)(rb + ELDR_SIGCACHE_ROW_OVERHEAD) / (1 << 20), c.sigcache_rows, c.sig_cache_mb);
      eldr_artifact_free(a);
    }
    eldr_serve_config_free(&c);
    return 0;
  }
  c.handle_signals = 1;
  if (!quiet) c.log = log_stderr;
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
