/* eldr/error.h — error codes and diagnostics shared by every module.
 *
 * Convention: library functions return 0 (ELDR_OK) or a negative eldr_err.
 * Functions that can fail on bad input also take an optional eldr_diag*
 * (NULL is allowed everywhere) that receives one human-readable line naming
 * what is wrong (line number, field, value). Library code never prints and
 * never exits; only src/cli/ does.
 */
#ifndef ELDR_ERROR_H
#define ELDR_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum eldr_err {
  ELDR_OK = 0,
  ELDR_EINVAL = -1,      /* invalid argument (caller bug or bad parameter) */
  ELDR_ENOMEM = -2,      /* allocation failed */
  ELDR_EIO = -3,         /* file or socket I/O failed */
  ELDR_EPARSE = -4,      /* malformed input (JSON, base64, npy, HTTP) */
  ELDR_ERANGE = -5,      /* a value out of its allowed range */
  ELDR_ESHAPE = -6,      /* dimensions do not match the model shape */
  ELDR_EVERSION = -7,    /* unknown format version */
  ELDR_EUNSUPPORTED = -8,/* valid but not supported (dtype, representation) */
  ELDR_ENOTFOUND = -9,   /* a named thing does not exist */
  ELDR_EEMPTY = -10,     /* no data (empty file, all-zero signature) */
  ELDR_EUNAVAIL = -11,   /* no healthy worker / resource unavailable */
  ELDR_ETIMEOUT = -12,   /* an operation timed out */
};

/* Static string for an eldr_err code; never NULL. */
const char *eldr_strerror(int err);

/* One diagnostic line. Filled by failing functions when non-NULL. */
typedef struct eldr_diag {
  char msg[320];
} eldr_diag;

/* printf-style: store a message in d (if d != NULL) and return err.
 * Usage: return eldr_diag_fail(d, ELDR_EPARSE, "line %zu: field 'id' ...", n); */
int eldr_diag_fail(eldr_diag *d, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix an existing message: "<prefix>: <old message>". NULL-safe. */
void eldr_diag_prefix(eldr_diag *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message, or eldr_strerror(err) if d is NULL or empty. */
const char *eldr_diag_msg(const eldr_diag *d, int err);

#ifdef __cplusplus
}
#endif
#endif
