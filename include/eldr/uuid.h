/* eldr/uuid.h — random (version 4, RFC 4122) UUIDs (base layer): the
 * router's request ids, which both legs of a request carry in
 * X-Request-Id (docs/serve.md, "Request ids").
 *
 * Errors: ELDR_EIO when the OS has no randomness to give (getrandom fails).
 * Threads: any thread; each thread draws from its own pool of random bytes
 * (thread-local: one getrandom per 256 UUIDs), so nothing is shared.
 * Ownership: the caller's buffer; no allocation.
 */
#ifndef ELDR_UUID_H
#define ELDR_UUID_H

/* characters of a UUID's text: 8-4-4-4-12 hex digits */
#define ELDR_UUID_LEN 36

/* out: the UUID as lowercase text, NUL-terminated. 0 or ELDR_EIO. */
int eldr_uuid4(char out[ELDR_UUID_LEN + 1]);

#endif
