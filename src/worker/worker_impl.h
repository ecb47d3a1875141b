/* worker_impl.h — shared internals of the emulated worker's source files
 * (worker.c: engine and lifecycle; wreply.c: replies and endpoints;
 * wparse.c: request parsing and expert selections). Not a public API.
 *
 * Ownership: a wreq is owned by its worker from creation until req_free in
 * worker.c; its buffers are malloc'd and freed with it. Threads: everything
 * runs on the worker's event loop thread; nothing here locks.
 */
#ifndef ELDR_WORKER_IMPL_H
#define ELDR_WORKER_IMPL_H

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "eldr/batch_union.h"
#include "eldr/clock.h"
#include "eldr/grow.h"
#include "eldr/latency.h"
#include "eldr/routed_experts.h"
#include "eldr/preset_files.h"
#include "eldr/sigcache.h"
#include "eldr/tracegen.h"
#include "worker/corpus.h"
#include "worker/kvcache.h"
#include "worker/sidechan.h"
#include "worker/sgl.h"
#include "worker/wmetrics.h"
#include "worker/worker_internal.h"

#define DEFAULT_KV_BLOCKS 4096
#define DEFAULT_MAX_SEQS 256
#define DEFAULT_BATCH_TOKENS 8192
#define DEFAULT_MAX_TOKENS 16
#define MAX_BODY (32 * 1024 * 1024)
#define DEFAULT_ABORT_TIMEOUT 480.0 /* vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default */
#define DEFAULT_PULL_TIMEOUT 30.0
#define MAX_N 16 /* choices per request */

enum rstate { RS_NEW, RS_PREFILL_Q, RS_PREFILLING, RS_DECODE_Q, RS_PULLING, RS_READY,
              RS_RUNNING, RS_DONE };

typedef struct wreq wreq;
struct wreq {
  eldr_worker *w;
  wreq *all_prev, *all_next; /* every live request */
  wreq *qnext;               /* prefill / decode / ready queues */
  struct evhttp_request *http;
  enum rstate state;
  int chat, stream, include_usage, gone;
  int started;        /* a stream's HTTP head is sent (at once, as vLLM's) */
  int opened;         /* a stream's first events are sent (with its first token) */
  int remote_decode;  /* prefill leg: reply after prefill with kv_transfer_params */
  int remote_prefill; /* decode leg: pull the KV instead of computing it */
  int capped;         /* output length limited by max_tokens */
  char *echo;         /* completions with echo: the prompt text the reply starts with
                         (malloc'd), else NULL */
  int echo_only;      /* echo with max_tokens 0: the prompt alone, no generated text */
  char rid[ELDR__PULL_MAX_ID];
  char *chunk_head;   /* escaped JSON prefix shared by every stream chunk */
  uint32_t n_prompt, n_out, emitted, n_dsel;
  uint32_t *ids;
  uint64_t *hashes;
  size_t n_full;      /* full blocks of the prompt */
  int32_t *blocks;
  size_t n_blocks;
  uint32_t cached;    /* prompt tokens served from the prefix cache */
  uint16_t *psel, *dsel;
  struct event *pull_ev;
  uint32_t n_choices;  /* n */
  uint64_t text_seed;  /* where each choice's words start in the corpus */
  double t_arrival, t_first; /* monotonic s */
  /* decode leg: the side-channel pull of the prefill's blocks */
  char *pull_body;     /* the pull request; after a failure, the error message */
  int pull_failed;
  char remote_host[256];
  uint16_t remote_port;
  struct evhttp_connection *pull_conn;
  struct evhttp_request *pull_req;
  /* --engine sglang: this request is item gidx of an HTTP request's group
   * (sgl.h; NULL for vLLM's requests), with its bootstrap room */
  sgl_group *grp;
  uint32_t gidx;
  sgl_item sg;
};

typedef struct rqueue {
  wreq *head, *tail;
  size_t n;
} rqueue;

struct eldr_worker {
  struct event_base *base;
  struct evhttp *http;
  uint16_t port;
  eldr_worker_role role;
  char model[64], served[128], engine_id[96], host[64];
  char *served_json, *engine_json; /* JSON-escaped, quoted */
  eldr_latency_model lm;
  const eldr_placement *placement; /* EP: borrowed or own_placement, else NULL */
  eldr_placement *own_placement;
  eldr_ep_tally ep;
  eldr_shape shape;
  size_t LK, LE;
  const eldr_trace *trace;
  size_t *trace_index; /* open addressing over trace ids: index + 1 */
  size_t trace_mask;
  eldr_tracegen *gen;
  double scale;
  size_t max_seqs, max_batched_tokens;
  int return_re;
  eldr_re_layout re_layout;
  eldr__kv *pkv, *dkv; /* prefill-side (prefix caching) and decode-side pools */
  /* prefill engine */
  rqueue prefill_q;
  wreq **pbatch;
  size_t n_pbatch;
  struct event *prefill_ev;
  int prefilling;
  /* decode engine */
  rqueue decode_q, ready_q;
  size_t n_pulling;
  wreq **running;
  size_t n_running;
  struct event *step_ev;
  int stepping;
  eldr_union un;     /* the decode step's per-layer expert union */
  uint32_t *unions;  /* its per-layer counts */
  uint32_t *rowbuf; /* counts rows for sigcache registration (one block) */
  double step_end;  /* planned end of the current / last decode step (monotonic s) */
  wreq *all;
  uint64_t seq;
  time_t created;
  eldr_worker_stats st;
  eldr__wmetrics m;
  eldr__kvhold *hold;   /* prefill legs' blocks waiting for a pull */
  eldr__corpus *corpus; /* NULL: placeholder words */
  int re_computed_only, prompt_details, re_decode, re_stream;
  /* routed_experts rows over re_hidden layers, MoE layer l at re_ids[l]
   * (vLLM's all-layers form); re_hidden == shape.num_layers: as they are */
  uint32_t re_hidden;
  uint32_t re_ids[ELDR_MAX_LAYERS];
  double pull_timeout;
  /* --engine sglang (sgl.h): the bootstrap server and its rooms (prefill) */
  int sglang;
  sgl_boot *boot;
  sgl_group *groups; /* live HTTP requests */
  struct event *sgl_sweep_ev; /* every SGL_SWEEP_S: peers that left while waiting */
  int sgl_exact;
  double sgl_bootstrap_timeout, sgl_waiting_timeout;
};

/* A parsed completion request (prompt malloc'd, owned by the caller). */
typedef struct preq {
  char *prompt;
  size_t plen;
  int stream, include_usage, remote_decode, remote_prefill;
  json_int_t max_tokens; /* -1 = not given; 0 only with echo (completions) */
  int echo;              /* completions: "echo": true */
  long rec;              /* trace record, -1 = derive from the text */
  uint32_t n;            /* choices */
  char *pull_body;       /* decode leg: the side-channel pull (malloc'd) */
  char remote_host[256];
  uint16_t remote_port;
} preq;


/* sgl_req.c, sgl_boot.c: the SGLang engine (sgl.h) */
/* api: 0 /v1/completions, 1 /v1/chat/completions, 2 /generate (SGL_API_*) */
void eldr__sgl_handle(eldr_worker *w, struct evhttp_request *req, int api);
/* sgl_gen.c: /generate's item i (final: with its finish_reason, routed
 * experts and input log probabilities; a new reference, NULL without
 * memory) and its error body */
json_t *eldr__sgl_gen_item(const sgl_group *g, uint32_t i, int final);
void eldr__sgl_gen_error(struct evhttp_request *req, int code, const char *msg);
/* the body checks of eldr__sgl_handle alone (eldr__worker_check_request) */
int eldr__sgl_check_request(const eldr_worker *w, const char *body, size_t len, int api, char *err, size_t errcap);
void eldr__sgl_token(wreq *r, uint32_t t, int last);     /* token t of item r (last: its end) */
void eldr__sgl_item_done(wreq *r);                       /* r finished: its group counts it */
void eldr__sgl_item_fail(wreq *r, int code, const char *msg); /* r failed: its group answers the error */
void eldr__sgl_item_release(wreq *r);                    /* from eldr__w_req_free */
void eldr__sgl_item_cleanup(wreq *r);                    /* r's events, connections and room */
void eldr__sgl_item_client_gone(wreq *r);                /* the group's client left */
void eldr__sgl_item_start(wreq *r);                      /* r enters the engine */
void eldr__sgl_forward_done(wreq *r);                    /* prefill side: r's forward ended */
int eldr__sgl_register(wreq *r);                         /* decode side: r has its blocks */
void eldr__sgl_fail(wreq *r, int code, const char *msg); /* fail and free r */
void eldr__sgl_groups_free(eldr_worker *w);
int eldr__sgl_peer_closed(struct evhttp_request *req); /* the peer closed req's connection */
void eldr__sgl_sweep(eldr_worker *w);                 /* groups whose client left */
void eldr__sgl_boot_sweep(eldr_worker *w);            /* rooms whose decode or poller left */
int eldr__sgl_boot_new(eldr_worker *w, uint16_t port, eldr_diag *d);
void eldr__sgl_boot_free(eldr_worker *w);
uint16_t eldr__sgl_boot_port(const eldr_worker *w);
size_t eldr__sgl_rooms(const eldr_worker *w);

/* worker.c */
void eldr__w_req_free(wreq *r);              /* unlink from every list and free */
void eldr__w_req_abort(wreq *r, int code, const char *msg); /* end its HTTP exchange (if any), free it */
void eldr__w_tv_of(double s, struct timeval *tv); /* seconds, clamped to [0, 1e6] */
void eldr__w_q_push(rqueue *q, wreq *r);
wreq *eldr__w_q_pop(rqueue *q);               /* NULL when empty */
void eldr__w_step_done(evutil_socket_t fd, short what, void *arg); /* the step timer (arg: the worker) */
void eldr__w_decode_admit(eldr_worker *w);    /* move decode-queue requests on */
void eldr__w_ready(wreq *r);                  /* a decode request's KV is there: to the batch */
long eldr__w_trace_find(const eldr_worker *w, const char *id); /* record index or -1 */
void eldr__w_detach(wreq *r);                /* drop the connection close callback */
void eldr__w_prefill_try(eldr_worker *w);    /* start a prefill batch if blocks allow */

/* wreply.c: HTTP replies (JSON bodies, OpenAI-style errors), streaming,
 * the finished reply, the per-request metrics, and the small endpoints */
/* A JSON reply: code, reason, the body (taken: freed here). */
void eldr__w_send_json(struct evhttp_request *req, int code, const char *reason, json_t *body);
void eldr__w_send_error(struct evhttp_request *req, int code, const char *param, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));
void eldr__w_stream_head(wreq *r);          /* a stream's HTTP head, when it is accepted */
void eldr__w_stream_start(wreq *r);         /* its first events (chat: the role), at the first token */
void eldr__w_stream_error(wreq *r, int code, const char *msg); /* an error event, [DONE], the end */
void eldr__w_stream_token(wreq *r, uint32_t c, uint32_t i, int last);
void eldr__w_observe_first(wreq *r);         /* TTFT at the first token */
void eldr__w_reply_done(wreq *r);            /* the whole reply / the stream's end */
void eldr__w_handle_metrics(eldr_worker *w, struct evhttp_request *req);
void eldr__w_handle_pull(eldr_worker *w, struct evhttp_request *req);
void eldr__w_handle_models(eldr_worker *w, struct evhttp_request *req);
void eldr__w_token_text(const wreq *r, uint32_t c, uint32_t i, char *buf, size_t cap);

/* wparse.c: a request body -> preq (0, or a 4xx/500 status with err and
 * *param), the prompt's token ids, and its expert selections */
int eldr__w_parse_body(const eldr_worker *w, const char *body, size_t blen, int chat, preq *o,
                       char *err, size_t errcap, const char **param);
int eldr__w_tokenize(const char *text, size_t len, uint32_t **ids_out, size_t *n_out);
/* text NULL: a prompt given as token ids (seeded by its first block's ids) */
int eldr__w_selections(const eldr_worker *w, const char *text, size_t len, const uint32_t *ids,
                      size_t n_tok, long rec, uint32_t want_decode, uint16_t **psel,
                      uint16_t **dsel, uint32_t *n_dsel, eldr_diag *d);

#endif
