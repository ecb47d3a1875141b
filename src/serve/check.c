/* check.c — `eldr serve --check-config`: the configuration, the artifact
 * and, with =resolve, what the start needs on this machine (worker names,
 * the port, the access log, the record directory), checked without
 * starting the router; and the artifact check the running router shares
 * with it. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    return eldr_diag_fail(d, ELDR_EUNAVAIL, "%s: cannot resolve '%s': %s", what, host,
                          grc ? gai_strerror(grc) : "no address");
  return 0;
}

/* The record directory as the start opens it (record.c, eldr__rec_new):
 * created when missing (here: removed again), a directory, writable by
 * this process's effective ids. */
static int record_dir_ok(const char *dir, eldr_diag *d) {
  int made = mkdir(dir, 0755) == 0;
  if (!made && errno != EEXIST)
    return eldr_diag_fail(d, ELDR_EIO, "record: cannot create directory %s: %s", dir, strerror(errno));
  int rc = 0;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) rc = eldr_diag_fail(d, ELDR_EIO, "record: %s is not a directory: %s", dir, strerror(errno));
  else if (faccessat(dfd, ".", W_OK, AT_EACCESS) != 0)
    rc = eldr_diag_fail(d, ELDR_EIO, "record: directory %s is not writable: %s", dir, strerror(errno));
  if (dfd >= 0) close(dfd);
  if (made) rmdir(dir);
  return rc;
}

/* The access log as the start opens it (accesslog.c: appended to, created
 * when missing; here removed again). "-" is stdout. */
static int access_log_ok(const char *path, eldr_diag *d) {
  if (!strcmp(path, "-")) return 0;
  const int existed = access(path, F_OK) == 0;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return eldr_diag_fail(d, ELDR_EIO, "access log %s: %s", path, strerror(errno));
  close(fd);
  if (!existed) unlink(path);
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
  if (!resolve) return 0;
  /* on the machine that will run it, what the start checks: the port is
   * free, the access log and the record directory can be written */
  if ((rc = eldr__port_check(c->host, c->port, d))) return rc;
  if (c->access_log && (rc = access_log_ok(c->access_log, d))) return rc;
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
