/* check.c — `eldr serve --check-config`: the configuration, the artifact
 * and (optionally) the worker names checked without starting the router;
 * and the artifact check the running router shares with it. */
#include <netdb.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "serve_types.h"

int eldr__artifact_servable(const eldr_artifact *a, const char *path, eldr_diag *d) {
  if (a->repr == ELDR_REPR_GATE || a->repr == ELDR_REPR_LOGIT)
    return eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                          "artifact %s uses the '%s' representation, which needs gate scores; vLLM's "
                          "routed_experts carry expert ids only (refit with count or binary)",
                          path, eldr_repr_name(a->repr));
  return 0;
}

static int resolves(const char *what, const char *host, int port, eldr_diag *d) {
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int grc = getaddrinfo(host, ps, &hints, &ai);
  if (ai) freeaddrinfo(ai);
  if (grc || !ai)
    return eldr_diag_fail(d, ELDR_EINVAL, "%s: cannot resolve '%s': %s", what, host,
                          grc ? gai_strerror(grc) : "no address");
  return 0;
}

/* dir is a writable directory, or does not exist in a writable one. */
static int record_dir_ok(const char *dir, eldr_diag *d) {
  struct stat st;
  if (stat(dir, &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return eldr_diag_fail(d, ELDR_EINVAL, "record: %s is not a directory", dir);
    if (access(dir, W_OK | X_OK)) return eldr_diag_fail(d, ELDR_EINVAL, "record: directory %s is not writable", dir);
    return 0;
  }
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", dir);
  char *slash = strrchr(parent, '/');
  if (slash == parent) slash[1] = 0;
  else if (slash) *slash = 0;
  else snprintf(parent, sizeof parent, ".");
  if (access(parent, W_OK | X_OK))
    return eldr_diag_fail(d, ELDR_EINVAL, "record: %s does not exist and %s is not a writable directory", dir, parent);
  return 0;
}

int eldr_serve_config_check(const eldr_serve_config *c, int resolve, eldr_diag *d) {
  int rc = eldr_serve_config_validate(c, d);
  if (rc) return rc;
  if (c->artifact) {
    eldr_artifact *a = NULL;
    if ((rc = eldr_artifact_load(c->artifact, &a, d))) return rc;
    rc = eldr__artifact_servable(a, c->artifact, d);
    eldr_artifact_free(a);
    if (rc) return rc;
  }
  if (c->dns_server) {
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    if (evutil_parse_sockaddr_port(c->dns_server, (struct sockaddr *)&ss, &sl))
      return eldr_diag_fail(d, ELDR_EINVAL, "dns_server '%s' must be IP[:PORT]", c->dns_server);
  }
  if (!resolve) return 0;
  /* on the machine that will run it: the record directory can be written */
  if (c->record_dir && (rc = record_dir_ok(c->record_dir, d))) return rc;
  char host[256], what[300];
  int port;
  for (int role = 0; role < 2; role++) {
    char **urls = role ? c->decode : c->prefill, **dns = role ? c->decode_dns : c->prefill_dns;
    size_t nu = role ? c->n_decode : c->n_prefill, nd = role ? c->n_decode_dns : c->n_prefill_dns;
    for (size_t i = 0; i < nu; i++) {
      if ((rc = eldr_serve_parse_url(urls[i], host, sizeof host, &port, d))) return rc;
      snprintf(what, sizeof what, "%s worker %s", eldr__role_name[role], urls[i]);
      if ((rc = resolves(what, host, port, d))) return rc;
    }
    for (size_t i = 0; i < nd; i++) {
      if ((rc = eldr_serve_parse_hostport(dns[i], host, sizeof host, &port, d))) return rc;
      snprintf(what, sizeof what, "%s_dns %s", eldr__role_name[role], dns[i]);
      if ((rc = resolves(what, host, port, d))) return rc;
    }
  }
  return 0;
}
