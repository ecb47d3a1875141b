/* sidechan.h — the emulated NIXL side channel (internal to src/worker).
 *
 * vLLM's NixlConnector keeps a prefill request's KV blocks after the prefill
 * leg has answered (request_finished returns delay_free_blocks) until the
 * decode worker has read them, or until VLLM_NIXL_ABORT_REQUEST_TIMEOUT
 * expires. The emulator does the same: the prefill side parks the blocks in
 * an eldr__kvhold under the request's id (the kv_transfer_params'
 * remote_request_id); the decode side pulls them with
 *
 *   POST /eldr/nixl/pull  {"remote_request_id": str, "remote_engine_id": str,
 *                          "remote_block_ids": [int, ...]}
 *
 * sent to remote_host:remote_port, and the prefill answers 200 and frees the
 * blocks, or 404 when it holds no such request (never prefilled, already
 * pulled, expired, or the prefill restarted), 409 when the block ids differ.
 *
 * Bounds: the pull body is at most ELDR__PULL_MAX_BODY bytes and names at most
 * ELDR__PULL_MAX_IDS blocks; ids are at most ELDR__PULL_MAX_ID bytes. A hold
 * exists only while its blocks are held, so holds <= KV blocks.
 *
 * Ownership: the hold owns each parked block array (freed on take/expiry)
 * and one timer per entry on the borrowed event_base. Not thread-safe.
 */
#ifndef ELDR_WORKER_SIDECHAN_H
#define ELDR_WORKER_SIDECHAN_H

#include <stddef.h>
#include <stdint.h>

#include "worker/kvcache.h"

struct event_base;

#define ELDR__PULL_MAX_BODY 65536
#define ELDR__PULL_MAX_IDS 8192
#define ELDR__PULL_MAX_ID 300
#define ELDR__PULL_PATH "/eldr/nixl/pull"

typedef struct eldr__pull {
  char rid[ELDR__PULL_MAX_ID + 1];
  char engine[ELDR__PULL_MAX_ID + 1];
  int32_t ids[ELDR__PULL_MAX_IDS];
  size_t n_ids;
} eldr__pull;

/* Parse a pull body of len bytes (need not be NUL-terminated). Returns 0 with
 * *out filled, or -1 with a message in err naming what is wrong. Never reads
 * past len, never allocates more than jansson's parse of at most
 * ELDR__PULL_MAX_BODY bytes. */
int eldr__pull_parse(const char *body, size_t len, eldr__pull *out, char *err, size_t errcap);

typedef struct eldr__kvhold eldr__kvhold;

/* timeout_s > 0: a parked request's blocks are released after it, and then
 * on_expire(arg) runs (the owner retries work that waits for blocks). */
eldr__kvhold *eldr__kvhold_new(struct event_base *base, eldr__kv *kv, double timeout_s,
                               void (*on_expire)(void *), void *arg);
/* Releases every parked block array into kv. NULL-safe. */
void eldr__kvhold_free(eldr__kvhold *h);

/* Park blocks[0..n) (malloc'd; ownership passes to the hold, also on
 * failure, when they are released at once) under rid. Returns 0, or -1 on
 * memory or a too-long rid (blocks released). A rid already parked replaces
 * the old entry (whose blocks are released), as vLLM's dict does. */
int eldr__kvhold_park(eldr__kvhold *h, const char *rid, int32_t *blocks, size_t n);

/* Serve a pull: 0 = found and released, 404 = no such request, 409 = a
 * named block id is not one of the request's (nothing released), 500 =
 * out of memory. The pull may name a subset of the request's blocks. */
int eldr__kvhold_take(eldr__kvhold *h, const eldr__pull *p);

size_t eldr__kvhold_count(const eldr__kvhold *h);
uint64_t eldr__kvhold_expired(const eldr__kvhold *h);

#endif
