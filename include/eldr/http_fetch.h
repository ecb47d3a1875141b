/* eldr/http_fetch.h — one blocking HTTP/1.1 exchange (net layer), for a
 * program's own short requests (the demo reading its routers' /metrics and
 * /eldr/status, asking for a reload): not for a server's event loop, which
 * uses eldr/upstream.h's connections directly.
 *
 * Ownership: *reply is malloc'd for the caller. Errors: as below, with a
 * message in d naming the url and path. Threads: any thread; each call runs
 * its own event loop and holds no state after it returns.
 */
#ifndef ELDR_HTTP_FETCH_H
#define ELDR_HTTP_FETCH_H

#include "eldr/error.h"

/* One exchange with url ("http://host:port", numeric host) over a fresh
 * connection: method path, extra header lines (each ending CRLF, or NULL),
 * a JSON body (NULL: none); *status and the reply body (*reply, malloc'd,
 * NUL-terminated, at most 4 MiB) on return 0. Errors: ELDR_EINVAL (url),
 * ELDR_ERANGE (request head over 1 KiB), ELDR_ETIMEOUT (no whole reply
 * within timeout_s), ELDR_EIO (connection failed or reply too large),
 * ELDR_ENOMEM. */
int eldr_http_fetch(const char *url, const char *method, const char *path, const char *headers, const char *body,
                    double timeout_s, int *status, char **reply, eldr_diag *d);

#endif
