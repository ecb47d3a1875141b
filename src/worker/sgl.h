/* sgl.h — the emulated worker as an SGLang engine (`eldr worker --engine
 * sglang`; internal to src/worker). Written from SGLang's source
 * (docs/sglang.md, "What SGLang does"), not from eldr's router:
 *
 *  - An HTTP request is a group of B x n items (B prompts of a batch, n
 *    samples each, batch-major as GenerateReqInput._normalize_batch_inputs
 *    expands them), each a sequence of its own (a wreq with grp set) with
 *    its own bootstrap room (_normalize_bootstrap_params: a scalar room r
 *    gives item i the room r + i; a list is repeated n times and item i
 *    takes entry i).
 *  - Prefill (role prefill): an item waits in the bootstrap queue until a
 *    decode worker has registered for its room (PrefillBootstrapQueue.
 *    pop_bootstrapped: KVPoll.Bootstrapping -> WaitingForInput), then is
 *    prefilled; at the forward's end the KV is sent (eldr_latency_
 *    kv_transfer x scale), and only when every item's transfer is done does
 *    the HTTP request get its answer (process_disagg_prefill_inflight_queue:
 *    stream_output on KVPoll.Success): one token per item, finish_reason
 *    length, "sglext": {"routed_experts": base64 of the first item's int32
 *    rows (tokens, hidden layers, top_k)} when asked.
 *  - With `--exact` (the contrib/sglang-eldr-exact patch): an item runs its
 *    forward without waiting for the decode's registration, publishes the
 *    prompt's compact counts (eldr/reply_compact.h) at the forward's end on
 *    the bootstrap server, and holds its KV until the decode registers.
 *  - Decode (role decode): an item handshakes with the prefill's bootstrap
 *    server at arrival (GET /route), waits for KV blocks for prompt + output
 *    (DecodePreallocQueue), registers for its room and waits for the KV
 *    (DecodeTransferQueue), then emits the prefill's first token at once and
 *    generates the rest in the continuous batch.
 *  - Routes: the OpenAI ones and SGLang's native POST /generate
 *    (GenerateReqInput: text or input_ids, a list a batch, sampling_params
 *    with max_new_tokens and n; the reply per item {text, meta_info}, a
 *    list for a batch or n > 1, streamed as data: events of the text so
 *    far; errors {"error": {"message"}}: http_server.py generate_request,
 *    tokenizer_manager.py _handle_batch_output).
 *  - Role both: not disaggregated (--disaggregation-mode null): prefill
 *    then decode locally, SGLang's reply format.
 *
 * The bootstrap server (the prefill's --bootstrap-port, SGLang's
 * --disaggregation-bootstrap-port, default 8998) answers
 *   GET  /health, GET /route                 as SGLang's CommonKVBootstrapServer
 *   POST /eldr/kv/register {"room": R, ...}  the emulator's stand-in for the
 *        decode's ZMQ transfer info and the RDMA write: answered when the
 *        room's KV has been sent (200 {"room", "first_token", "tokens"}) or
 *        has failed (4xx/5xx); a decode that closes it aborts the room
 *   GET  /eldr/expert_counts?room=R          (--exact) the prompt's compact
 *        counts, answered at the room's forward end (a long poll)
 * Every wait is bounded: the bootstrap timeout (SGLANG_DISAGGREGATION_
 * BOOTSTRAP_TIMEOUT, 300 s) for a prefill item or a counts poll waiting for
 * its room's partner, the waiting timeout (SGLANG_DISAGGREGATION_WAITING_
 * TIMEOUT, 300 s) for a decode item waiting for its KV; rooms at most
 * SGL_MAX_ROOMS, bodies at most SGL_MAX_BOOT_BODY bytes.
 *
 * Ownership: groups are the worker's (its `groups` list) until their reply
 * is sent or their connection closed and every item freed; a room entry is
 * the bootstrap server's. Threads: the worker's event loop only.
 */
#ifndef ELDR_WORKER_SGL_H
#define ELDR_WORKER_SGL_H

#include <stddef.h>
#include <stdint.h>

#define SGL_MAX_ITEMS 64          /* B x n items per request */
#define SGL_MAX_ROOMS 8192        /* rooms the bootstrap server tracks at once */
#define SGL_MAX_BOOT_BODY 4096    /* a registration body */
#define SGL_MAX_COUNT_POLLS 4     /* expert-count polls per room */
#define SGL_DEFAULT_BOOTSTRAP_PORT 8998
#define SGL_DEFAULT_TIMEOUT 300.0 /* SGLANG_DISAGGREGATION_{BOOTSTRAP,WAITING}_TIMEOUT */
#define SGL_MAX_ROOM ((uint64_t)INT64_MAX) /* rooms are 0..2^63-1 */
enum { SGL_API_COMPLETIONS = 0, SGL_API_CHAT = 1, SGL_API_GENERATE = 2 }; /* the routes a group came in on */
#define SGL_SWEEP_S 0.1           /* how often waiting peers are checked for having left */

typedef struct sgl_group sgl_group;
typedef struct sgl_boot sgl_boot;
typedef struct sgl_room sgl_room;
struct evhttp_request;
struct evhttp_connection;
struct event;

/* Per item state (inside its wreq). */
typedef struct sgl_item {
  int role;                 /* 0 local, 1 prefill side, 2 decode side */
  uint64_t room;
  int has_room;
  char boot_host[256];
  uint16_t boot_port;
  sgl_room *entry;          /* prefill side: its room entry */
  int registered;           /* prefill side: the decode registered */
  int forwarded;            /* prefill side: its forward ended */
  int transferring;         /* prefill side: the KV is on its way */
  struct event *ev;         /* prefill: transfer end; decode: KV arrival / handshake end */
  /* decode side: the handshake and the registration */
  struct evhttp_connection *conn;
  struct evhttp_request *hreq;
  int handshaken, reg_sent, failed;
  char first_tok[64];       /* the prefill's sampled token (decode's token 0) */
  char *err;                /* a failure's message (malloc'd) */
} sgl_item;

/* One HTTP request. */
struct sgl_group {
  struct eldr_worker *w;
  sgl_group *next;
  struct evhttp_request *http;
  int chat, stream, include_usage, return_re, started, gone, replied;
  int gen, as_list;              /* /generate: SGLang's native reply; a list (a batch, or n > 1) */
  int return_lp;                 /* /generate: "return_logprob": the prompt's input_token_logprobs */
  uint32_t **lp_ids, *lp_n;      /* per prompt, with return_lp: its token ids */
  int busy;                      /* inside a walk over its items: not freed meanwhile */
  uint32_t nitems, nprompts, n;  /* items = prompts x n */
  uint32_t live;                 /* items not yet freed */
  uint32_t done;                 /* items finished */
  struct wreq **items;           /* nitems; an entry is NULL once freed */
  uint32_t *emitted, *n_prompt;  /* per item, kept past the item's free */
  uint8_t *capped;
  char **texts;                  /* per item: its generated text so far (non-streamed) */
  size_t *text_len, *text_cap;
  int fail_code;
  char *fail_msg;
  char rid[80];
  char *re_b64;                  /* first item's routed_experts (base64 int32), when asked */
};

#endif
