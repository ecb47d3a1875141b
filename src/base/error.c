#include "eldr/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *eldr_strerror(int err) {
  switch (err) {
  case ELDR_OK: return "success";
  case ELDR_EINVAL: return "invalid argument";
  case ELDR_ENOMEM: return "out of memory";
  case ELDR_EIO: return "I/O error";
  case ELDR_EPARSE: return "malformed input";
  case ELDR_ERANGE: return "value out of range";
  case ELDR_ESHAPE: return "shape mismatch";
  case ELDR_EVERSION: return "unknown format version";
  case ELDR_EUNSUPPORTED: return "unsupported";
  case ELDR_ENOTFOUND: return "not found";
  case ELDR_EEMPTY: return "empty input";
  case ELDR_EUNAVAIL: return "unavailable";
  case ELDR_ETIMEOUT: return "timed out";
  default: return "unknown error";
  }
}

int eldr_diag_fail(eldr_diag *d, int err, const char *fmt, ...) {
  if (d) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    va_end(ap);
  }
  return err;
}

void eldr_diag_prefix(eldr_diag *d, const char *fmt, ...) {
  if (!d) return;
  char pre[sizeof d->msg];
  char old[sizeof d->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  memcpy(old, d->msg, sizeof old);
  old[sizeof old - 1] = '\0';
  size_t n = strlen(pre);
  if (n > sizeof d->msg - 1) n = sizeof d->msg - 1;
  memcpy(d->msg, pre, n);
  if (old[0] && n + 2 < sizeof d->msg) {
    memcpy(d->msg + n, ": ", 2);
    n += 2;
    size_t m = strlen(old);
    if (m > sizeof d->msg - 1 - n) m = sizeof d->msg - 1 - n;
    memcpy(d->msg + n, old, m);
    n += m;
  }
  d->msg[n] = '\0';
}

const char *eldr_diag_msg(const eldr_diag *d, int err) {
  if (d && d->msg[0]) return d->msg;
  return eldr_strerror(err);
}
