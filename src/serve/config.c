/* config.c — eldr serve configuration: defaults, worker URLs, JSON file. */
#include <errno.h>
#include <event2/util.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "eldr/serve.h"
#include "eldr/predict.h"

static char *xstrdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

void eldr_serve_config_default(eldr_serve_config *c) {
  memset(c, 0, sizeof *c);
  c->host = xstrdup("127.0.0.1");
  c->port = 8000;
  c->policy = ELDR_POLICY_ELDR;
  c->tau = -1;
  c->seed = 1;
  c->prefill_guard = 4;
  c->connect_timeout_s = 10;
  c->prefill_timeout_s = 120;
  c->decode_timeout_s = 1800;
  c->decode_first_byte_timeout_s = 600;
  c->decode_idle_timeout_s = 600;
  c->shutdown_timeout_s = 30;
  c->health_timeout_s = 2;
  c->hang_window_s = 5;
  c->header_timeout_s = 15;
  c->idle_timeout_s = 120;
  c->retries = 2;
  c->max_body = 16u << 20;
  c->max_header = 32u << 10;
  c->health_interval_s = 2;
  c->eject_after = 3;
  c->sigcache_rows = 65536;
  c->sig_cache_mb = 256;
  c->pool_size = 256;
  c->dns_interval_s = 5;
  c->splice_routed_experts = 1;
  c->max_connections = 0;
  c->stream_buffer = 256u << 10;
  c->record_sample = 1;
  c->record_max_bytes = 256u << 20;
  c->record_max_seconds = 3600;
  c->record_queue = 1024;
  c->record_queue_bytes = 64u << 20;
  c->watch_window_s = 60;
  c->watch_requests = 4096;
  c->bus_snapshot_s = 1;
  c->bus_peer_timeout_s = 3;
  c->decode_max_batch = 256;
  c->fp_own_weight = 1;
  c->pd = ELDR_PD_VLLM;
  c->bootstrap_port = 8998; /* SGLang's --disaggregation-bootstrap-port default (server_args.py) */
  c->predict_threshold = ELDR_PREDICT_THRESHOLD_DEFAULT;
  c->exact_timeout_s = 5;
}

static void free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

void eldr_serve_config_free(eldr_serve_config *c) {
  if (!c) return;
  free(c->host);
  free_list(c->prefill, c->n_prefill);
  free_list(c->decode, c->n_decode);
  free_list(c->prefill_dns, c->n_prefill_dns);
  free_list(c->decode_dns, c->n_decode_dns);
  free(c->dns_server);
  free(c->access_log);
  free(c->artifact);
  free(c->config_path);
  free(c->overrides);
  free(c->backend_api_key);
  free(c->cors_origin);
  free(c->record_dir);
  free(c->admin_token);
  free(c->bus);
  free(c->bus_subject);
  free(c->bus_replica_id);
  free_list(c->api_keys, c->n_api_keys);
  free_list(c->boot_urls, c->n_boot);
  free(c->boot_ports);
  memset(c, 0, sizeof *c);
}

static int copy_list(char ***dst, char **src, size_t n) {
  *dst = NULL;
  if (!n) return 0;
  *dst = calloc(n, sizeof **dst);
  if (!*dst) return -1;
  for (size_t i = 0; i < n; i++)
    if (!((*dst)[i] = xstrdup(src[i]))) return -1;
  return 0;
}

int eldr_serve_config_copy(eldr_serve_config *dst, const eldr_serve_config *src) {
  *dst = *src;
  dst->host = xstrdup(src->host);
  dst->artifact = xstrdup(src->artifact);
  dst->config_path = xstrdup(src->config_path);
  dst->overrides = xstrdup(src->overrides);
  dst->dns_server = xstrdup(src->dns_server);
  dst->access_log = xstrdup(src->access_log);
  dst->backend_api_key = xstrdup(src->backend_api_key);
  dst->cors_origin = xstrdup(src->cors_origin);
  dst->record_dir = xstrdup(src->record_dir);
  dst->admin_token = xstrdup(src->admin_token);
  dst->bus = xstrdup(src->bus);
  dst->bus_subject = xstrdup(src->bus_subject);
  dst->bus_replica_id = xstrdup(src->bus_replica_id);
  dst->prefill = dst->decode = dst->prefill_dns = dst->decode_dns = dst->api_keys = dst->boot_urls = NULL;
  dst->boot_ports = NULL;
  int bad = (src->host && !dst->host) || (src->artifact && !dst->artifact) ||
            (src->dns_server && !dst->dns_server) || (src->access_log && !dst->access_log) ||
            (src->config_path && !dst->config_path) || (src->overrides && !dst->overrides) ||
            (src->backend_api_key && !dst->backend_api_key) || (src->cors_origin && !dst->cors_origin) ||
            (src->record_dir && !dst->record_dir) ||
            (src->admin_token && !dst->admin_token) || (src->bus && !dst->bus) ||
            (src->bus_subject && !dst->bus_subject) || (src->bus_replica_id && !dst->bus_replica_id);
  bad |= copy_list(&dst->prefill, src->prefill, src->n_prefill);
  bad |= copy_list(&dst->decode, src->decode, src->n_decode);
  bad |= copy_list(&dst->prefill_dns, src->prefill_dns, src->n_prefill_dns);
  bad |= copy_list(&dst->decode_dns, src->decode_dns, src->n_decode_dns);
  bad |= copy_list(&dst->api_keys, src->api_keys, src->n_api_keys);
  bad |= copy_list(&dst->boot_urls, src->boot_urls, src->n_boot);
  if (src->n_boot && (dst->boot_ports = malloc(src->n_boot * sizeof *dst->boot_ports)))
    memcpy(dst->boot_ports, src->boot_ports, src->n_boot * sizeof *dst->boot_ports);
  bad |= src->n_boot && !dst->boot_ports;
  if (bad) {
    eldr_serve_config_free(dst);
    return ELDR_ENOMEM;
  }
  return 0;
}

int eldr_serve_parse_url(const char *url, char *host, size_t cap, int *port, eldr_diag *d) {
  if (!url || strncasecmp(url, "http://", 7))
    return eldr_diag_fail(d, ELDR_EINVAL, "worker URL '%s' must start with http://",
                          url ? url : "(null)");
  const char *h = url + 7, *e = h;
  if (*h == '[') { /* [v6]:port */
    e = strchr(h, ']');
    if (!e) return eldr_diag_fail(d, ELDR_EINVAL, "worker URL '%s': unterminated IPv6 address", url);
    h++;
  } else {
    while (*e && *e != ':' && *e != '/') e++;
  }
  size_t hl = (size_t)(e - h);
  if (hl == 0 || hl >= cap)
    return eldr_diag_fail(d, ELDR_EINVAL, "worker URL '%s': bad host", url);
  memcpy(host, h, hl);
  host[hl] = 0;
  if (*e == ']') e++;
  *port = 80;
  if (*e == ':') {
    char *end;
    errno = 0;
    long p = strtol(e + 1, &end, 10);
    if (errno || end == e + 1 || p < 1 || p > 65535 || (*end && *end != '/'))
      return eldr_diag_fail(d, ELDR_EINVAL, "worker URL '%s': bad port", url);
    *port = (int)p;
    e = end;
  }
  if (*e && strcmp(e, "/"))
    return eldr_diag_fail(d, ELDR_EINVAL, "worker URL '%s' must not have a path", url);
  return 0;
}

int eldr_serve_parse_hostport(const char *str, char *host, size_t cap, int *port, eldr_diag *d) {
  const char *colon = str ? strrchr(str, ':') : NULL;
  if (!colon || colon == str)
    return eldr_diag_fail(d, ELDR_EINVAL, "DNS name '%s' must be NAME:PORT", str ? str : "(null)");
  size_t hl = (size_t)(colon - str);
  if (hl >= cap || memchr(str, '/', hl) || memchr(str, ':', hl))
    return eldr_diag_fail(d, ELDR_EINVAL, "DNS name '%s': bad name", str);
  char *end;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (errno || end == colon + 1 || *end || p < 1 || p > 65535)
    return eldr_diag_fail(d, ELDR_EINVAL, "DNS name '%s': bad port", str);
  memcpy(host, str, hl);
  host[hl] = 0;
  *port = (int)p;
  return 0;
}

static int append(char ***v, size_t *n, const char *s) {
  char **nv = realloc(*v, (*n + 1) * sizeof **v);
  if (!nv) return ELDR_ENOMEM;
  *v = nv;
  if (!(nv[*n] = xstrdup(s))) return ELDR_ENOMEM;
  (*n)++;
  return 0;
}

int eldr_serve_config_add_worker(eldr_serve_config *c, int decode, const char *url,
                                 eldr_diag *d) {
  char host[256];
  int port, rc = eldr_serve_parse_url(url, host, sizeof host, &port, d);
  if (rc) return rc;
  char ***v = decode ? &c->decode : &c->prefill;
  size_t *n = decode ? &c->n_decode : &c->n_prefill;
  if ((rc = append(v, n, url))) return rc;
  size_t ul = strlen(url);
  if (ul > 7 && (*v)[*n - 1][ul - 1] == '/') (*v)[*n - 1][ul - 1] = 0;
  return 0;
}

int eldr_serve_config_add_api_key(eldr_serve_config *c, const char *key, eldr_diag *d) {
  if (!key) return eldr_diag_fail(d, ELDR_EINVAL, "api_key: missing");
  return append(&c->api_keys, &c->n_api_keys, key) ? eldr_diag_fail(d, ELDR_ENOMEM, "out of memory") : 0;
}

/* api_key: a string, an array of strings (any one admits), or null (off);
 * replaces the current keys, or nothing changes. */
static int set_api_keys(eldr_serve_config *c, json_t *v, eldr_diag *d) {
  eldr_serve_config tmp;
  memset(&tmp, 0, sizeof tmp);
  int rc = 0;
  if (json_is_string(v)) {
    rc = eldr_serve_config_add_api_key(&tmp, json_string_value(v), d);
  } else if (json_is_array(v)) {
    size_t i;
    json_t *u;
    json_array_foreach(v, i, u) {
      if (!json_is_string(u)) {
        rc = eldr_diag_fail(d, ELDR_EINVAL, "config: 'api_key[%zu]' must be a string", i);
        break;
      }
      if ((rc = eldr_serve_config_add_api_key(&tmp, json_string_value(u), d))) break;
    }
  } else if (!json_is_null(v)) {
    rc = eldr_diag_fail(d, ELDR_EINVAL, "config: 'api_key' must be a string, an array of strings or null");
  }
  if (!rc) {
    free_list(c->api_keys, c->n_api_keys);
    c->api_keys = tmp.api_keys;
    c->n_api_keys = tmp.n_api_keys;
    tmp.api_keys = NULL;
    tmp.n_api_keys = 0;
  }
  eldr_serve_config_free(&tmp);
  return rc;
}

int eldr_serve_config_add_dns(eldr_serve_config *c, int decode, const char *hostport, eldr_diag *d) {
  char host[256];
  int port, rc = eldr_serve_parse_hostport(hostport, host, sizeof host, &port, d);
  if (rc) return rc;
  return decode ? append(&c->decode_dns, &c->n_decode_dns, hostport)
                : append(&c->prefill_dns, &c->n_prefill_dns, hostport);
}

static int get_num(json_t *v, const char *key, double lo, double hi, double *out, eldr_diag *d) {
  if (!json_is_number(v))
    return eldr_diag_fail(d, ELDR_EINVAL, "config: '%s' must be a number", key);
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return eldr_diag_fail(d, ELDR_ERANGE, "config: '%s' = %g out of range [%g, %g]", key, x, lo, hi);
  *out = x;
  return 0;
}

static int get_int(json_t *v, const char *key, long long lo, long long hi, long long *out,
                   eldr_diag *d) {
  if (!json_is_integer(v))
    return eldr_diag_fail(d, ELDR_EINVAL, "config: '%s' must be an integer", key);
  long long x = json_integer_value(v);
  if (x < lo || x > hi)
    return eldr_diag_fail(d, ELDR_ERANGE, "config: '%s' = %lld out of range [%lld, %lld]", key, x,
                          lo, hi);
  *out = x;
  return 0;
}

static int set_str(char **dst, json_t *v, const char *key, eldr_diag *d) {
  if (!json_is_string(v))
    return eldr_diag_fail(d, ELDR_EINVAL, "config: '%s' must be a string", key);
  char *s = xstrdup(json_string_value(v));
  if (!s) return ELDR_ENOMEM;
  free(*dst);
  *dst = s;
  return 0;
}

/* "prefill", "decode" (URLs), "prefill_dns", "decode_dns" (NAME:PORT):
 * the list replaces the current one, or nothing changes. */
int eldr_serve_config_boot_port(const eldr_serve_config *c, const char *url) {
  for (size_t i = 0; url && i < c->n_boot; i++)
    if (!strcmp(c->boot_urls[i], url)) return c->boot_ports[i];
  return c->bootstrap_port;
}

int eldr_serve_config_set_boot_port(eldr_serve_config *c, const char *url, long long port, eldr_diag *d) {
  if (port < 0 || port > 65535)
    return eldr_diag_fail(d, ELDR_ERANGE, "bootstrap port %lld of %s out of range 0..65535", port, url);
  for (size_t i = 0; i < c->n_boot; i++)
    if (!strcmp(c->boot_urls[i], url)) {
      c->boot_ports[i] = (int)port;
      return 0;
    }
  char **u = realloc(c->boot_urls, (c->n_boot + 1) * sizeof *u);
  if (u) c->boot_urls = u;
  int *p = realloc(c->boot_ports, (c->n_boot + 1) * sizeof *p);
  if (p) c->boot_ports = p;
  char *dup = u && p ? xstrdup(url) : NULL;
  if (!dup) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  c->boot_urls[c->n_boot] = dup;
  c->boot_ports[c->n_boot++] = (int)port;
  return 0;
}

/* "bootstrap_ports": {prefill URL: port}, replacing the map. */
static int set_boot_ports(eldr_serve_config *c, json_t *v, eldr_diag *d) {
  if (!json_is_object(v)) return eldr_diag_fail(d, ELDR_EINVAL, "config: 'bootstrap_ports' must be an object {prefill URL: port}");
  free_list(c->boot_urls, c->n_boot);
  free(c->boot_ports);
  c->boot_urls = NULL;
  c->boot_ports = NULL;
  c->n_boot = 0;
  const char *url;
  json_t *pv;
  json_object_foreach(v, url, pv) {
    if (!json_is_integer(pv))
      return eldr_diag_fail(d, ELDR_EINVAL, "config: 'bootstrap_ports' of %s must be an integer port", url);
    int rc = eldr_serve_config_set_boot_port(c, url, json_integer_value(pv), d);
    if (rc) return rc;
  }
  return 0;
}

static int set_list(eldr_serve_config *c, const char *key, json_t *v, eldr_diag *d) {
  int dec = key[0] == 'd', dns = strstr(key, "_dns") != NULL, rc = 0;
  if (!json_is_array(v))
    return eldr_diag_fail(d, ELDR_EINVAL, "config: '%s' must be an array of %s", key, dns ? "NAME:PORT" : "URLs");
  eldr_serve_config tmp;
  memset(&tmp, 0, sizeof tmp);
  size_t i;
  json_t *u;
  json_array_foreach(v, i, u) {
    if (!json_is_string(u)) {
      rc = eldr_diag_fail(d, ELDR_EINVAL, "config: '%s[%zu]' must be a string", key, i);
      break;
    }
    rc = dns ? eldr_serve_config_add_dns(&tmp, dec, json_string_value(u), d)
             : eldr_serve_config_add_worker(&tmp, dec, json_string_value(u), d);
    if (rc) {
      eldr_diag_prefix(d, "config: '%s[%zu]'", key, i);
      break;
    }
  }
  char ***dst = dns ? (dec ? &c->decode_dns : &c->prefill_dns) : (dec ? &c->decode : &c->prefill);
  size_t *dn = dns ? (dec ? &c->n_decode_dns : &c->n_prefill_dns) : (dec ? &c->n_decode : &c->n_prefill);
  char ***src = dns ? (dec ? &tmp.decode_dns : &tmp.prefill_dns) : (dec ? &tmp.decode : &tmp.prefill);
  size_t *sn = dns ? (dec ? &tmp.n_decode_dns : &tmp.n_prefill_dns) : (dec ? &tmp.n_decode : &tmp.n_prefill);
  if (!rc) {
    free_list(*dst, *dn);
    *dst = *src;
    *dn = *sn;
    *src = NULL;
    *sn = 0;
  }
  eldr_serve_config_free(&tmp);
  return rc;
}

int eldr_serve_config_parse(eldr_serve_config *c, const char *json, size_t len, eldr_diag *d) {
  json_error_t je;
  json_t *root = json_loadb(json, len, 0, &je);
  if (!root)
    return eldr_diag_fail(d, ELDR_EPARSE, "config: invalid JSON at line %d: %s", je.line, je.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "config: top level must be an object");
    goto out;
  }
  const char *raw;
  json_t *v;
  json_object_foreach(root, raw, v) {
    /* a key spelled as its flag ("prefill-timeout") is the snake_case key */
    char kb[64];
    const char *key = raw;
    if (strchr(raw, '-') && strlen(raw) < sizeof kb) {
      for (size_t i = 0; (kb[i] = raw[i] == '-' ? '_' : raw[i]); i++) {}
      key = kb;
    }
    double x = 0;     /* set by get_num/get_int on success; initialised so */
    long long n = 0;  /* -O3's inliner sees no maybe-uninitialized path */
    if (!strcmp(key, "host")) rc = set_str(&c->host, v, key, d);
    else if (!strcmp(key, "artifact")) rc = json_is_null(v) ? (free(c->artifact), c->artifact = NULL, 0) : set_str(&c->artifact, v, key, d);
    else if (!strcmp(key, "port")) { if (!(rc = get_int(v, key, 0, 65535, &n, d))) c->port = (int)n; }
    else if (!strcmp(key, "prefill") || !strcmp(key, "decode") || !strcmp(key, "prefill_dns") ||
             !strcmp(key, "decode_dns")) {
      if ((rc = set_list(c, key, v, d))) break;
    } else if (!strcmp(key, "policy")) {
      eldr_policy_kind k;
      if (!json_is_string(v) || eldr_policy_parse(json_string_value(v), &k) ||
          k == ELDR_POLICY_DOMAIN)
        rc = eldr_diag_fail(d, ELDR_EINVAL, "config: 'policy' must be one of eldr, footprint, jsq, p2c, rr, random");
      else c->policy = k;
    } else if (!strcmp(key, "tau")) { if (!(rc = get_num(v, key, 0, 2, &x, d))) c->tau = x; }
    else if (!strcmp(key, "seed")) { if (!(rc = get_int(v, key, 0, INT64_MAX, &n, d))) c->seed = (uint64_t)n; }
    else if (!strcmp(key, "prefill_guard")) { if (!(rc = get_int(v, key, 0, 1000000, &n, d))) c->prefill_guard = (uint32_t)n; }
    else if (!strcmp(key, "connect_timeout")) { if (!(rc = get_num(v, key, 0.001, 86400, &x, d))) c->connect_timeout_s = x; }
    else if (!strcmp(key, "prefill_timeout")) { if (!(rc = get_num(v, key, 0.001, 86400, &x, d))) c->prefill_timeout_s = x; }
    else if (!strcmp(key, "decode_timeout")) { if (!(rc = get_num(v, key, 0.001, 86400, &x, d))) c->decode_timeout_s = x; }
    else if (!strcmp(key, "decode_first_byte_timeout")) { if (!(rc = get_num(v, key, 0, 86400, &x, d))) c->decode_first_byte_timeout_s = x; }
    else if (!strcmp(key, "decode_idle_timeout")) { if (!(rc = get_num(v, key, 0, 86400, &x, d))) c->decode_idle_timeout_s = x; }
    else if (!strcmp(key, "header_timeout")) { if (!(rc = get_num(v, key, 0.001, 86400, &x, d))) c->header_timeout_s = x; }
    else if (!strcmp(key, "idle_timeout")) { if (!(rc = get_num(v, key, 0.001, 86400, &x, d))) c->idle_timeout_s = x; }
    else if (!strcmp(key, "health_interval")) { if (!(rc = get_num(v, key, 0, 86400, &x, d))) c->health_interval_s = x; }
    else if (!strcmp(key, "retries")) { if (!(rc = get_int(v, key, 0, 16, &n, d))) c->retries = (int)n; }
    else if (!strcmp(key, "eject_after")) { if (!(rc = get_int(v, key, 1, 1000, &n, d))) c->eject_after = (int)n; }
    else if (!strcmp(key, "max_body")) { if (!(rc = get_int(v, key, 1, 1ll << 34, &n, d))) c->max_body = (size_t)n; }
    else if (!strcmp(key, "max_header")) { if (!(rc = get_int(v, key, 256, 1 << 24, &n, d))) c->max_header = (size_t)n; }
    else if (!strcmp(key, "sigcache_rows")) { if (!(rc = get_int(v, key, 0, 1 << 26, &n, d))) c->sigcache_rows = (size_t)n; }
    else if (!strcmp(key, "sig_cache_mb")) { if (!(rc = get_int(v, key, 0, 1 << 20, &n, d))) c->sig_cache_mb = (size_t)n; }
    else if (!strcmp(key, "scrape_interval")) { if (!(rc = get_num(v, key, 0, 3600, &x, d))) c->scrape_interval_s = x; }
    else if (!strcmp(key, "dns_interval")) { if (!(rc = get_num(v, key, 0.01, 86400, &x, d))) c->dns_interval_s = x; }
    else if (!strcmp(key, "access_log")) rc = json_is_null(v) ? (free(c->access_log), c->access_log = NULL, 0) : set_str(&c->access_log, v, key, d);
    else if (!strcmp(key, "dns_server")) rc = json_is_null(v) ? (free(c->dns_server), c->dns_server = NULL, 0) : set_str(&c->dns_server, v, key, d);
    else if (!strcmp(key, "pool_size")) { if (!(rc = get_int(v, key, 0, 1 << 16, &n, d))) c->pool_size = (size_t)n; }
    else if (!strcmp(key, "backend_api_key")) rc = json_is_null(v) ? (free(c->backend_api_key), c->backend_api_key = NULL, 0) : set_str(&c->backend_api_key, v, key, d);
    else if (!strcmp(key, "cors_origin")) rc = json_is_null(v) ? (free(c->cors_origin), c->cors_origin = NULL, 0) : set_str(&c->cors_origin, v, key, d);
    else if (!strcmp(key, "admin_token")) rc = json_is_null(v) ? (free(c->admin_token), c->admin_token = NULL, 0) : set_str(&c->admin_token, v, key, d);
    else if (!strcmp(key, "watch_window")) { if (!(rc = get_num(v, key, 0, 86400, &x, d))) c->watch_window_s = x; }
    else if (!strcmp(key, "watch_requests")) { if (!(rc = get_int(v, key, 1, 1 << 22, &n, d))) c->watch_requests = (size_t)n; }
    else if (!strcmp(key, "forward_authorization")) {
      if (!json_is_boolean(v)) rc = eldr_diag_fail(d, ELDR_EINVAL, "config: '%s' must be true or false", key);
      else c->forward_authorization = json_is_true(v);
    }
    else if (!strcmp(key, "pd")) {
      const char *pv = json_is_string(v) ? json_string_value(v) : "";
      if (!strcmp(pv, "vllm")) c->pd = ELDR_PD_VLLM;
      else if (!strcmp(pv, "sglang")) c->pd = ELDR_PD_SGLANG;
      else if (!strcmp(pv, "sglang-exact")) c->pd = ELDR_PD_SGLANG_EXACT;
      else rc = eldr_diag_fail(d, ELDR_EINVAL, "config: 'pd' must be \"vllm\", \"sglang\" or \"sglang-exact\"");
    }
    else if (!strcmp(key, "bootstrap_port")) { if (!(rc = get_int(v, key, 0, 65535, &n, d))) c->bootstrap_port = (int)n; }
    else if (!strcmp(key, "bootstrap_ports")) rc = set_boot_ports(c, v, d);
    else if (!strcmp(key, "exact_timeout")) { if (!(rc = get_num(v, key, 0.001, 3600, &x, d))) c->exact_timeout_s = x; }
    else if (!strcmp(key, "predict_threshold")) { if (!(rc = get_num(v, key, 0, 1, &x, d))) c->predict_threshold = x; }
    else if (!strcmp(key, "splice_routed_experts")) {
      if (!json_is_boolean(v)) rc = eldr_diag_fail(d, ELDR_EINVAL, "config: '%s' must be true or false", key);
      else c->splice_routed_experts = json_is_true(v);
    }
    else if (!strcmp(key, "max_connections")) { if (!(rc = get_int(v, key, 0, 1 << 24, &n, d))) c->max_connections = (size_t)n; }
    else if (!strcmp(key, "threads")) { if (!(rc = get_int(v, key, 0, ELDR_SERVE_MAX_THREADS, &n, d))) c->threads = (int)n; }
    else if (!strcmp(key, "stream_buffer")) { if (!(rc = get_int(v, key, 4096, 1ll << 30, &n, d))) c->stream_buffer = (size_t)n; }
    else if (!strcmp(key, "record")) rc = json_is_null(v) ? (free(c->record_dir), c->record_dir = NULL, 0) : set_str(&c->record_dir, v, key, d);
    else if (!strcmp(key, "record_sample")) { if (!(rc = get_num(v, key, 1e-6, 1, &x, d))) c->record_sample = x; }
    else if (!strcmp(key, "record_max_bytes")) { if (!(rc = get_int(v, key, 0, 1ll << 50, &n, d))) c->record_max_bytes = (uint64_t)n; }
    else if (!strcmp(key, "record_max_seconds")) { if (!(rc = get_num(v, key, 0, 86400 * 366, &x, d))) c->record_max_seconds = x; }
    else if (!strcmp(key, "record_queue")) { if (!(rc = get_int(v, key, 1, 1 << 24, &n, d))) c->record_queue = (size_t)n; }
    else if (!strcmp(key, "record_queue_bytes")) { if (!(rc = get_int(v, key, 1 << 16, 1ll << 40, &n, d))) c->record_queue_bytes = (size_t)n; }
    else if (!strcmp(key, "fp_own_weight")) {
      if (!(rc = get_num(v, key, 0, 100, &x, d))) {
        if (x > 0) c->fp_own_weight = x;
        else rc = eldr_diag_fail(d, ELDR_ERANGE, "config: 'fp_own_weight' = %g must be above 0 (1: the default cost)", x);
      }
    }
    else if (!strcmp(key, "fp_home_weight")) { if (!(rc = get_num(v, key, 0, 100, &x, d))) c->fp_home_weight = x; }
    else if (!strcmp(key, "decode_max_batch")) { if (!(rc = get_int(v, key, 1, 1 << 20, &n, d))) c->decode_max_batch = (size_t)n; }
    else if (!strcmp(key, "record_experts")) { if (!(rc = get_int(v, key, 0, ELDR_MAX_EXPERTS, &n, d))) c->record_experts = (uint32_t)n; }
    else if (!strcmp(key, "api_key")) rc = set_api_keys(c, v, d);
    else if (!strcmp(key, "shutdown_timeout")) { if (!(rc = get_num(v, key, 0, 86400, &x, d))) c->shutdown_timeout_s = x; }
    else if (!strcmp(key, "health_timeout")) { if (!(rc = get_num(v, key, 0.001, 3600, &x, d))) c->health_timeout_s = x; }
    else if (!strcmp(key, "hang_window")) { if (!(rc = get_num(v, key, 0, 86400, &x, d))) c->hang_window_s = x; }
    else if (!strcmp(key, "bus")) /* null or "none": off (the flag's --bus none) */
      rc = json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), "none")) ? (free(c->bus), c->bus = NULL, 0)
                                                                                            : set_str(&c->bus, v, key, d);
    else if (!strcmp(key, "bus_subject")) rc = set_str(&c->bus_subject, v, key, d);
    else if (!strcmp(key, "bus_replica_id")) rc = set_str(&c->bus_replica_id, v, key, d);
    else if (!strcmp(key, "bus_snapshot_interval")) { if (!(rc = get_num(v, key, 0.01, 3600, &x, d))) c->bus_snapshot_s = x; }
    else if (!strcmp(key, "bus_peer_timeout")) { if (!(rc = get_num(v, key, 0.03, 86400, &x, d))) c->bus_peer_timeout_s = x; }
    else rc = eldr_diag_fail(d, ELDR_EINVAL, "config: unknown key '%s'", raw);
    if (rc) break;
  }
out:
  json_decref(root);
  return rc;
}

int eldr_serve_config_load(eldr_serve_config *c, const char *path, eldr_diag *d) {
  FILE *f = fopen(path, "rb");
  if (!f) return eldr_diag_fail(d, ELDR_EIO, "config: cannot open %s: %s", path, strerror(errno));
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 > cap) {
      cap = cap ? cap * 2 : 8192;
      if (cap > (64u << 20)) {
        fclose(f);
        free(buf);
        return eldr_diag_fail(d, ELDR_ERANGE, "config: %s is too large", path);
      }
      char *p = realloc(buf, cap);
      if (!p) {
        fclose(f);
        free(buf);
        return ELDR_ENOMEM;
      }
      buf = p;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(buf);
    return eldr_diag_fail(d, ELDR_EIO, "config: cannot read %s", path);
  }
  int rc = eldr_serve_config_parse(c, buf, n, d);
  free(buf);
  if (rc) eldr_diag_prefix(d, "%s", path);
  return rc;
}

static int header_safe(const char *v, int spaces) {
  for (const unsigned char *p = (const unsigned char *)v; *p; p++)
    if (*p >= 0x7f || *p < 0x20 || (*p == ' ' && !spaces)) return 0;
  return 1;
}

int eldr_serve_config_validate(const eldr_serve_config *c, eldr_diag *d) {
  if (c->n_prefill + c->n_prefill_dns == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "no prefill worker (--prefill URL or --prefill-dns NAME:PORT)");
  if (c->n_decode + c->n_decode_dns == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "no decode worker (--decode URL or --decode-dns NAME:PORT)");
  if (!(c->scrape_interval_s == 0 || (c->scrape_interval_s >= 0.01 && c->scrape_interval_s <= 3600)))
    return eldr_diag_fail(d, ELDR_ERANGE, "scrape_interval must be 0 (off) or in [0.01, 3600] s");
  if (!(c->dns_interval_s >= 0.01)) return eldr_diag_fail(d, ELDR_ERANGE, "dns_interval must be >= 0.01 s");
  if (c->port < 0 || c->port > 65535) return eldr_diag_fail(d, ELDR_ERANGE, "port %d out of range", c->port);
  if (!c->host || !*c->host) return eldr_diag_fail(d, ELDR_EINVAL, "no listen host");
  if (c->policy == ELDR_POLICY_DOMAIN || c->policy >= ELDR_POLICY__COUNT)
    return eldr_diag_fail(d, ELDR_EINVAL, "policy must be one of eldr, footprint, jsq, p2c, rr, random");
  for (size_t i = 0; i < c->n_boot; i++) {
    size_t k = 0;
    while (k < c->n_prefill && strcmp(c->prefill[k], c->boot_urls[i])) k++;
    if (k == c->n_prefill)
      return eldr_diag_fail(d, ELDR_EINVAL, "bootstrap_ports names %s, which is not a prefill worker URL", c->boot_urls[i]);
  }
  if (c->pd == ELDR_PD_SGLANG_EXACT && c->bootstrap_port == 0) { /* it polls every prefill's bootstrap server */
    if (c->n_prefill_dns)
      return eldr_diag_fail(d, ELDR_EINVAL, "pd sglang-exact polls each prefill's bootstrap server: the DNS-discovered "
                                            "prefill workers need bootstrap_port (not 0)");
    for (size_t k = 0; k < c->n_prefill; k++)
      if (eldr_serve_config_boot_port(c, c->prefill[k]) == 0)
        return eldr_diag_fail(d, ELDR_EINVAL, "pd sglang-exact polls each prefill's bootstrap server: %s has no "
                                              "bootstrap port (--prefill URL PORT, or bootstrap_port not 0)", c->prefill[k]);
  }
  if (!(c->tau < 0 || (c->tau >= 0 && c->tau <= 2)) || isnan(c->tau))
    return eldr_diag_fail(d, ELDR_ERANGE, "tau out of range [0, 2]");
  if (c->max_body == 0 || c->max_header < 256)
    return eldr_diag_fail(d, ELDR_ERANGE, "max_body must be > 0 and max_header >= 256");
  if (c->threads < 0 || c->threads > ELDR_SERVE_MAX_THREADS)
    return eldr_diag_fail(d, ELDR_ERANGE, "threads must be 0 (the CPUs the process may use) to %d", ELDR_SERVE_MAX_THREADS);
  if (c->retries < 0 || c->eject_after < 1)
    return eldr_diag_fail(d, ELDR_ERANGE, "retries must be >= 0 and eject_after >= 1");
  if (!(c->connect_timeout_s > 0 && c->prefill_timeout_s > 0 && c->decode_timeout_s > 0 &&
        c->header_timeout_s > 0 && c->idle_timeout_s > 0 && c->health_interval_s >= 0))
    return eldr_diag_fail(d, ELDR_ERANGE, "timeouts must be > 0");
  /* both go into header lines: visible ASCII only (no CR/LF injection) */
  if (c->backend_api_key && (!header_safe(c->backend_api_key, 0) || !*c->backend_api_key || strlen(c->backend_api_key) > 4096))
    return eldr_diag_fail(d, ELDR_EINVAL, "backend_api_key must be 1 to 4096 visible ASCII characters");
  if (c->record_dir && !*c->record_dir) return eldr_diag_fail(d, ELDR_EINVAL, "record: empty directory name");
  if (!(c->record_sample > 0 && c->record_sample <= 1))
    return eldr_diag_fail(d, ELDR_ERANGE, "record_sample must be in (0, 1]");
  if (c->record_dir && !c->artifact && !c->record_experts)
    return eldr_diag_fail(d, ELDR_EINVAL, "record: without an artifact, record_experts (--record-experts E) is needed: "
                                          "routed_experts replies do not say how many experts a layer has");
  if (!(c->record_max_seconds >= 0) || c->record_queue < 1)
    return eldr_diag_fail(d, ELDR_ERANGE, "record_max_seconds must be >= 0 and record_queue >= 1");
  if (c->cors_origin && (!header_safe(c->cors_origin, 1) || !*c->cors_origin || strlen(c->cors_origin) > 1024))
    return eldr_diag_fail(d, ELDR_EINVAL, "cors_origin must be '*' or comma-separated origins (visible ASCII, at most 1024)");
  if (c->admin_token && (!header_safe(c->admin_token, 0) || strlen(c->admin_token) < 16 || strlen(c->admin_token) > 4096))
    return eldr_diag_fail(d, ELDR_EINVAL, "admin_token must be 16 to 4096 visible ASCII characters without spaces");
  if (c->watch_requests < 1) return eldr_diag_fail(d, ELDR_ERANGE, "watch_requests must be >= 1");
  if (c->n_api_keys > 64) return eldr_diag_fail(d, ELDR_ERANGE, "api_key: at most 64 keys");
  for (size_t i = 0; i < c->n_api_keys; i++)
    if (!c->api_keys[i] || !header_safe(c->api_keys[i], 0) || !*c->api_keys[i] || strlen(c->api_keys[i]) > 4096)
      return eldr_diag_fail(d, ELDR_EINVAL, "api_key %zu: must be 1 to 4096 visible ASCII characters without spaces", i + 1);
  if (!(c->shutdown_timeout_s >= 0) || !(c->health_timeout_s > 0) || !(c->hang_window_s >= 0))
    return eldr_diag_fail(d, ELDR_ERANGE, "shutdown_timeout and hang_window must be >= 0 and health_timeout > 0");
  if (c->bus && (strncmp(c->bus, "nats://", 7) || strlen(c->bus) < 8 || strlen(c->bus) > 1024))
    return eldr_diag_fail(d, ELDR_EINVAL, "bus: '%s' is not nats://HOST:PORT", c->bus);
  if (c->bus_subject && (!*c->bus_subject || strlen(c->bus_subject) > 200 || strpbrk(c->bus_subject, " \t\r\n*>")))
    return eldr_diag_fail(d, ELDR_EINVAL, "bus_subject: 1 to 200 characters, no spaces or wildcards");
  if (c->bus_replica_id && (!*c->bus_replica_id || strlen(c->bus_replica_id) > 64))
    return eldr_diag_fail(d, ELDR_EINVAL, "bus_replica_id: 1 to 64 characters");
  if (!(c->bus_peer_timeout_s > c->bus_snapshot_s))
    return eldr_diag_fail(d, ELDR_ERANGE, "bus_peer_timeout (%g s) must exceed bus_snapshot_interval (%g s)",
                          c->bus_peer_timeout_s, c->bus_snapshot_s);
  if (c->dns_server) {
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    if (evutil_parse_sockaddr_port(c->dns_server, (struct sockaddr *)&ss, &sl))
      return eldr_diag_fail(d, ELDR_EINVAL, "dns_server '%s' must be IP[:PORT]", c->dns_server);
  }
  return 0;
}
