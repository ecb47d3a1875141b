/* serve_internal.h — pieces of the router that are pure functions (HTTP
 * request-head parsing, the JSON of both legs, routed_experts splicing),
 * exposed for unit tests and fuzz targets. Names are eldr__ (internal). */
#ifndef ELDR_SERVE_INTERNAL_H
#define ELDR_SERVE_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/jscan.h"
#include "eldr/reply.h"

/* First occurrence of k[0..kn) in h[0..n), or NULL. */
static inline const char *eldr__memmem(const char *h, size_t n, const char *k, size_t kn) {
  for (size_t i = 0; i + kn <= n; i++) {
    const char *q = memchr(h + i, k[0], n - i - kn + 1);
    if (!q) return NULL;
    if (!memcmp(q, k, kn)) return q;
    i = (size_t)(q - h);
  }
  return NULL;
}

/* Text appenders for the heads the router writes on every request (no
 * printf on the hot path): each writes at o and returns the end of what it
 * wrote; the caller sizes the buffer. */
static inline char *eldr__put(char *o, const char *s, size_t n) {
  memcpy(o, s, n);
  return o + n;
}
static inline char *eldr__puts(char *o, const char *s) { return eldr__put(o, s, strlen(s)); }
#define ELDR__PUT_LIT(o, lit) eldr__put((o), (lit), sizeof(lit) - 1)
static inline char *eldr__put_u64(char *o, uint64_t v) {
  char t[20];
  size_t k = 0;
  do t[k++] = (char)('0' + v % 10), v /= 10;
  while (v);
  while (k) *o++ = t[--k];
  return o;
}
static inline char *eldr__put_i64(char *o, int64_t v) {
  if (v < 0) *o++ = '-';
  return eldr__put_u64(o, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
}
/* strlcpy: src cut to fit cap (> 0) bytes with its NUL. */
static inline void eldr__copy(char *dst, size_t cap, const char *src) {
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* ---- HTTP/1.x request head ------------------------------------------------ */

#define ELDR__HTTP_PATH_MAX 2048
#define ELDR__HTTP_REQID_MAX 256
#define ELDR__HTTP_AUTH_MAX 8192
#define ELDR__HTTP_TRACEPARENT_MAX 128 /* W3C trace context: 55 bytes today */
#define ELDR__HTTP_TRACESTATE_MAX 544  /* 32 members of at most 512 bytes in all */
#define ELDR__HTTP_BAGGAGE_MAX 8192    /* W3C baggage: 8192 bytes */
#define ELDR__HTTP_ORIGIN_MAX 256

typedef enum eldr__method {
  ELDR__M_OTHER = 0,
  ELDR__M_GET,
  ELDR__M_POST,
  ELDR__M_HEAD,
  ELDR__M_OPTIONS,
} eldr__method;

/* eldr__http_parse_head resets each field (head_reset, not a memset of
 * the whole struct): a field added here must be reset there. */
typedef struct eldr__http_head {
  eldr__method method;
  char method_name[16];
  char path[ELDR__HTTP_PATH_MAX]; /* without the query string */
  int minor;                      /* HTTP/1.<minor> */
  int keep_alive;                 /* after Connection header and version */
  int64_t content_length;         /* -1 when absent */
  int chunked;                    /* Transfer-Encoding: chunked */
  int expect_continue;
  char request_id[ELDR__HTTP_REQID_MAX]; /* X-Request-Id, "" when absent */
  char authorization[ELDR__HTTP_AUTH_MAX];
  /* forwarded to both legs as received (W3C trace context and baggage) */
  char traceparent[ELDR__HTTP_TRACEPARENT_MAX];
  char tracestate[ELDR__HTTP_TRACESTATE_MAX];
  char baggage[ELDR__HTTP_BAGGAGE_MAX];
  char origin[ELDR__HTTP_ORIGIN_MAX];      /* Origin (CORS), "" when absent */
  char acr_headers[512];                   /* Access-Control-Request-Headers */
  int status;                     /* on error: the HTTP status to answer */
  char error[160];                /* on error: message */
} eldr__http_head;

/* Parse a request head from buf[0..len). Returns the head's length in bytes
 * (through the blank line) when complete, 0 when more bytes are needed (and
 * len <= max_header), or -1 with h->status (400, 414, 431, 501, 505) and
 * h->error set. Never reads past len. */
long eldr__http_parse_head(const char *buf, size_t len, size_t max_header, eldr__http_head *h);

/* The size line of a chunk in a chunked request body: line[0..n) without
 * its CRLF, hex digits then optional ";extension". 0 with *size set, or -1
 * (malformed, or a size above 2^40). */
int eldr__http_chunk_size(const char *line, size_t n, uint64_t *size);

/* ---- a growing byte buffer, kept from request to request ------------------- */

typedef struct eldr__buf {
  char *p; /* owned; NUL-terminated at n once written */
  size_t n, cap;
} eldr__buf;

/* cap >= need + 1 (room for a NUL): 0 or ELDR_ENOMEM (b unchanged). */
int eldr__buf_reserve(eldr__buf *b, size_t need);
void eldr__buf_free(eldr__buf *b);

/* ---- client request --------------------------------------------------------- */

/* GENERATE: SGLang's native POST /generate (GenerateReqInput), served in
 * the SGLang flows only (--pd sglang, sglang-exact; docs/sglang.md). */
typedef enum eldr__api { ELDR__API_COMPLETIONS = 0, ELDR__API_CHAT, ELDR__API_GENERATE } eldr__api;

typedef struct eldr__req {
  json_t *root;     /* owned: the client's body as a tree; NULL when the scanner read it */
  eldr__api api;
  int stream;
  int want_routed_experts; /* "return_routed_experts": true */
  int prompt_logprobs;     /* "prompt_logprobs" is there and not null */
  char *text;       /* owned: prompt text (chat: "role: content\n" per message) */
  size_t text_len, text_cap;
  uint32_t *ids;    /* owned: prompt token ids when the client sent ids, else NULL */
  size_t n_ids, ids_cap;
  char *raw;        /* owned: the body as received; the legs' bodies are cut from it */
  size_t raw_len, raw_cap;
  int raw_ok;       /* raw is editable in place (no NUL byte: see edit.c) */
} eldr__req;

/* Parse and validate a client body, including what the decode engine would
 * refuse (stream_options without stream, min_tokens above max_tokens, ...).
 * Errors (ELDR_EPARSE for bad JSON, ELDR_EINVAL for a wrong field) carry a
 * message naming the field. out need not be initialised. */
int eldr__req_parse(const char *body, size_t len, eldr__api api, eldr__req *out, eldr_diag *d);
/* The same into a request that is zeroed or was read before (its buffers
 * are reused: no allocation once they are large enough). The byte scanner
 * (reqscan.c) reads a body without NUL bytes; what it does not accept as
 * plainly valid (any error, an unusual shape) is parsed by jansson, which
 * decides and names the error as it always did. */
int eldr__req_read(const char *body, size_t len, eldr__api api, eldr__req *out, eldr_diag *d);
/* The jansson path alone (out need not be initialised): root is set. */
int eldr__req_parse_tree(const char *body, size_t len, eldr__api api, eldr__req *out, eldr_diag *d);
/* The scanner path alone, into a zeroed or read-before request: 0 (read:
 * root NULL, every other field as eldr__req_parse_tree gives it), 1 (not
 * taken: the tree path decides) or ELDR_ENOMEM. body has no NUL byte. */
int eldr__req_scan(const char *body, size_t len, eldr__api api, eldr__req *out);
/* Drop what the last read left (the tree) but keep the buffers. */
void eldr__req_clear(eldr__req *r);
void eldr__req_free(eldr__req *r);

/* SGLang prefill/decode (sglbody.c): both legs carry the same body, the
 * client's JSON with bootstrap_host (the prefill worker's host),
 * bootstrap_port (its bootstrap server; port <= 0: null) and
 * bootstrap_room set by the router, as SGLang's gateway does
 * (inject_bootstrap_into_value), any the client sent replaced. Items: a
 * completion's prompts (B: an array of strings or of token-id arrays, else
 * 1) x n; a /generate body's (B: a "text" list or an "input_ids" list of
 * lists) x sampling_params.n; one item: scalars; more: arrays of that length, a room each
 * (the gateway sends B rooms for a batch, which SGLang repeats n times, so
 * that the samples of one prompt share a room; one per item never does).
 * eldr__sgl_items: the item count, or ELDR_EPARSE (not JSON) / ELDR_EINVAL
 * (not an object, bad n, an empty prompt array, more than
 * ELDR__SGL_MAX_ITEMS) with the message in d. eldr__sgl_leg_body: rooms
 * (each <= 2^63-1, nrooms == the item count) into out; 0 or ELDR_E*.
 * Pure; any thread. */
#define ELDR__SGL_MAX_ITEMS 128
int eldr__sgl_items(const char *body, size_t len, eldr__api api, uint32_t *items, eldr_diag *d);
int eldr__sgl_leg_body(const char *body, size_t len, eldr__api api, const char *host, int port,
                       const uint64_t *rooms, uint32_t nrooms, eldr__buf *out, eldr_diag *d);
/* The prefill leg's body as the router sends it: eldr__sgl_leg_body's, with
 * "stream": false (stream_options dropped) and "return_routed_experts":
 * true. The gateway sends the decode's body to the prefill too; the router
 * reads the prefill's reply itself (its routed experts complete the
 * signature cache), so it asks for them and for one whole reply. */
int eldr__sgl_prefill_body(const char *body, size_t len, eldr__api api, const char *host, int port,
                           const uint64_t *rooms, uint32_t nrooms, eldr__buf *out, eldr_diag *d);

/* SGLang's /generate with "return_logprob": the prefill's
 * meta_info.input_token_logprobs put in front of the decode's, as the
 * gateway does (pd_router.rs, merge_logprobs_in_json), for one reply
 * object, or item by item for lists of one length (a batch; the gateway
 * merges single replies only). 0 with the decode's reply so merged into out,
 * 1 when there is nothing to merge (either not JSON, shapes that differ, no
 * arrays on both sides: the decode's reply stands), ELDR_ENOMEM. Pure; any
 * thread. */
int eldr__sgl_merge_logprobs(const char *pre, size_t pn, const char *dec, size_t dn, eldr__buf *out, eldr_diag *d);

/* --pd sglang-exact: the document a patched SGLang prefill's bootstrap
 * server answers to GET /eldr/expert_counts?room=R (contrib/sglang-eldr-exact,
 * and `eldr worker --engine sglang --exact`):
 *   {"room": R, "eldr_expert_counts": {<the compact object, eldr/reply_compact.h>}}
 * doc[0..n) must be a JSON object (at most ELDR__SGL_COUNTS_MAX bytes) whose
 * "room" is the integer room asked for and whose "eldr_expert_counts" is an
 * object: 0 and *compact its span (the compact object itself is read and
 * checked by eldr_compact_read / the signature path), else ELDR_EPARSE (not
 * JSON) / ELDR_EINVAL (another shape, another room) / ELDR_ERANGE (too large)
 * with the message in d. Pure; any thread. */
#define ELDR__SGL_COUNTS_MAX ((size_t)4 << 20)
int eldr__sgl_counts_doc(const char *doc, size_t n, uint64_t room, eldr_js_span *compact, eldr_diag *d);

/* The prefill leg's body into a reused buffer (out->n = the body's length,
 * NUL-terminated): 0 or ELDR_ENOMEM. Cut from the client's bytes (edit.c):
 * its members but stream, max_tokens, max_completion_tokens,
 * stream_options, min_tokens, min_completion_tokens and kv_transfer_params,
 * then the prefill's own values of those. */
int eldr__prefill_body_buf(const eldr__req *r, eldr__buf *out);
/* The decode leg's body, the same way: the original with the client's
 * kv_transfer_params and prompt_logprobs (the prefill's are used) removed,
 * plus the prefill's kv_transfer_params as JSON text (kv[0..kv_len), kv_len
 * 0: none). */
int eldr__decode_body_buf(const eldr__req *r, const char *kv, size_t kv_len, eldr__buf *out);
/* The tree-built forms (jansson), for a body the byte editor does not take
 * (r->root set: a tree-parsed request). */
char *eldr__prefill_body_tree(const eldr__req *r, size_t *len);
char *eldr__decode_body_tree(const eldr__req *r, json_t *kv_transfer_params, size_t *len);

/* Splice the prefill's prompt rows (proot: the prefill reply, parsed) into
 * a (non-streaming) decode reply, in the layout both carry: vLLM 0.21 and
 * later, the prefill's top-level prompt_routed_experts replaces the
 * decoder's; npy and lists (one array per choice over the whole sequence),
 * the prefill's rows (prompt tokens [prompt_tokens - rows, prompt_tokens),
 * prompt_tokens from the prefill's usage, else rows) overwrite the decode
 * choice's rows at those positions. Returns 0 and a new body in *out
 * (malloc'd), or an error (ELDR_ENOTFOUND: nothing to splice; the caller
 * then relays the reply unchanged). proot is borrowed. */
int eldr__splice_routed_experts(const char *decode_body, size_t len, json_t *proot, char **out,
                                size_t *out_len, eldr_diag *d);

/* What a non-streaming decode reply takes from the prefill reply (proot):
 *   usage            usage.prompt_tokens and prompt_tokens_details from the
 *                    prefill, completion_tokens from the decoder,
 *                    total_tokens their sum;
 *   prompt_logprobs  the prefill's prompt_logprobs (top level, or choice 0's
 *                    into every choice);
 *   splice           as eldr__splice_routed_experts.
 * Returns 0 and the new body in *out (*spliced: the splice happened), or
 * ELDR_ENOTFOUND when nothing changed, or an error (the caller relays the
 * reply unchanged). proot is borrowed. */
typedef struct eldr__fix_opts {
  int splice, usage, prompt_logprobs;
} eldr__fix_opts;
int eldr__decode_reply_fix(const char *decode_body, size_t len, json_t *proot, const eldr__fix_opts *o,
                           char **out, size_t *out_len, int *spliced, eldr_diag *d);

/* eldr__decode_reply_fix with the prefill reply as read (format's
 * eldr/reply.h), into a reused buffer (out->n: the new body's length): the
 * byte edits (edit.c: the routed_experts splice and prompt_logprobs of
 * eldr/reply_splice.h, then the usage) where the scanner takes both
 * documents, else the tree path above. */
int eldr__decode_reply_fix_buf(const char *decode_body, size_t len, eldr_reply_prefill *pr,
                               const eldr__fix_opts *o, eldr__buf *out, int *spliced, eldr_diag *d);

/* JSON error body {"error":{"message":..,"type":..,"code":status}} (malloc'd). */
char *eldr__error_json(int status, const char *type, const char *msg, size_t *len);

#endif
