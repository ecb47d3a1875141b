/* worker_internal.h — internals of the emulated worker exposed to tests and
 * fuzz targets (not a public API). */
#ifndef ELDR_WORKER_INTERNAL_H
#define ELDR_WORKER_INTERNAL_H

#include <stddef.h>

#include "eldr/worker.h"

/* Parse and check a completion request body exactly as the HTTP handler
 * does (chat = 1 for /v1/chat/completions, 2 for SGLang's /generate: an
 * --engine sglang worker's only, else 404). Returns 0 when the request is
 * acceptable, else the HTTP status it would get (4xx; 500 for memory) with
 * the message in err. Allocates only temporarily; never crashes on any
 * input. An --engine sglang worker checks as its SGLang handler does
 * (batches, n, the bootstrap fields its role needs: src/worker/sgl.h). */
int eldr__worker_check_request(const eldr_worker *w, const char *body, size_t len, int chat,
                               char *err, size_t errcap);

#endif
