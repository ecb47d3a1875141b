/* record.h — `eldr serve --record DIR` (serve-private): one JSONL line per
 * sampled completion request, in the trace format's counts form
 * (docs/trace.md), so `eldr fit --trace DIR` can refit on live traffic.
 * record.c: the queue, the writer thread and the files; record_line.c: the
 * item and its line.
 *
 *   loop thread   eldr__rec_sample() decides (a deterministic stride of the
 *                 sample fraction); the request's data is copied into an
 *                 eldr__rec_item (counts, or the raw prompt rows; the decode
 *                 reply's bytes) and handed over with eldr__rec_submit(),
 *                 which never blocks on I/O: a full queue drops the item and
 *                 counts it (reason "queue_full").
 *   writer thread counts raw rows, parses the decode reply (generated rows,
 *                 usage), formats the line, and appends it with one write(2)
 *                 per batch to DIR/record-<UTC>-<seq>.jsonl; rotates by size
 *                 (before a line that would pass max_bytes), by age
 *                 (max_seconds) and when the model shape changes; a torn
 *                 write (ENOSPC, EIO) is cut back with ftruncate so a file
 *                 holds only whole lines, except a write killed mid-way
 *                 (kill -9), whose torn last line readers skip.
 *
 * fsync policy: fdatasync(2) of the open file at most once a second while
 * lines are written, and at close (rotation, shutdown); the directory is
 * fsynced after a file is created. kill -9 of the router loses only the
 * queued lines (written lines are in the page cache); a machine crash loses
 * at most about the last second.
 *
 * Ownership: an item belongs to the caller until eldr__rec_submit, then to
 * the recorder (freed after it is written or dropped), with every buffer
 * it points to (the router hands over the decode reply's buffer and the
 * prefill reply's parsed tree instead of copying them). The recorder owns its
 * thread, queue, file and directory descriptors.
 * Threads: eldr__rec_sample / submit / set_limits / stats may be called from
 * any thread; new and free from one thread (the server's owner).
 * Errors: eldr__rec_new fails (ELDR_EIO naming the directory) when DIR
 * cannot be created or written. Later: a directory removed or replaced
 * while recording is made again (one level, as at start) and the files go
 * there, checked before every batch; a failed open or write (disk full)
 * leaves no empty file and makes the writer leave the disk alone for 1 s,
 * doubling to 60 s while failures last, the records sampled meanwhile
 * dropped and counted (reason "write_error"); errors are counted
 * (write_errors) and reported for the log at most once per 30 s
 * (eldr__rec_stats: errors, last_error).
 */
#ifndef ELDR_SERVE_RECORD_H
#define ELDR_SERVE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"

/* Bytes of a record's client request id, NUL included: the router's bound on
 * X-Request-Id (http_parse accepts at most 255 visible ASCII bytes, no
 * spaces); a longer one would be cut, never overrun. */
#define ELDR__REC_CLIENT_ID_MAX 256

/* Why a sampled request's record was not written (metric label values). */
typedef enum eldr__rec_drop {
  ELDR__REC_QUEUE_FULL = 0, /* the writer fell behind: the queue's items or bytes at their bound */
  ELDR__REC_NO_COUNTS,      /* no usable routed_experts in the prefill reply: nothing to refit on */
  ELDR__REC_WRITE_ERROR,    /* open/write failed (disk full, directory gone) */
  ELDR__REC_NO_MEMORY,
  ELDR__REC_DROP__N
} eldr__rec_drop;

const char *eldr__rec_drop_name(eldr__rec_drop r);

typedef struct eldr__rec_limits {
  double sample;        /* fraction of completion requests recorded, (0, 1] */
  uint64_t max_bytes;   /* a file is closed before a line would pass this (0: no limit) */
  double max_seconds;   /* a file is closed this long after it was opened (0: no limit) */
} eldr__rec_limits;

/* One request's record. Arrays are malloc'd and owned by the item. */
typedef struct eldr__rec_item {
  struct eldr__rec_item *next;
  char id[48];             /* the engines' request id (a UUID) */
  char client_id[ELDR__REC_CLIENT_ID_MAX]; /* the client's X-Request-Id ("": none sent) */
  char model[128];         /* the prefill reply's "model" */
  eldr_shape shape;        /* L layers (all), E, K */
  uint32_t *layer_ids;     /* L MoE layer ids */
  double arrival;          /* seconds since the recorder started (monotonic) */
  double time;             /* unix epoch seconds at arrival */
  /* the prompt: counts (L*E, every layer), raw rows counted by the writer, or
   * the prefill reply itself (a jansson tree handed over whole: no other
   * thread holds a reference) read by the writer with experts E; the
   * shape is then the reply's rows' (layer_ids kept when L matches) */
  void *prefill_root;
  uint32_t experts;
  int from_artifact;        /* shape and layer_ids are the artifact's: the writer
                               reads the tree's rows onto them first */
  uint32_t *prefill_counts;
  uint32_t prefill_tokens;  /* tokens prefill_counts cover */
  void *prefill_raw;        /* rows x L x K ids of prefill_dtype, or NULL */
  eldr_sel_dtype prefill_dtype;
  size_t prefill_rows;
  /* the decode reply as the decoder sent it (non-streaming), or NULL */
  char *decode_body;
  size_t decode_len;
  int chat;                 /* /v1/chat/completions */
  int64_t prompt_tokens;    /* usage.prompt_tokens of the prefill, -1 unknown */
  int64_t output_tokens;    /* generated tokens when known without the body, -1 unknown */
  /* the decision ("serve" object) */
  char decoder[128];        /* "host:port", "" when none */
  int decoder_index;        /* -1 when none */
  const char *policy;       /* static strings */
  const char *reason;
  int centroid;             /* chosen decoder's centroid, -1 when none */
  float *sims;              /* similarity to each centroid, or NULL */
  size_t nsims;
  double ttft_ms, tpot_ms;  /* NaN when unknown */
  int status;               /* HTTP status the client got */
  char artifact[40];        /* artifact identity, "" when none */
  size_t bytes;             /* memory held (set by eldr__rec_item_new / by the caller) */
  int counts_later;         /* --pd sglang: the decision came first, the prompt's counts
                               come with the prefill's reply (or the record is dropped) */
} eldr__rec_item;

/* An item for shape s (layer_ids copied; counts not allocated). NULL on ENOMEM. */
eldr__rec_item *eldr__rec_item_new(const eldr_shape *s, const uint32_t *layer_ids);
void eldr__rec_item_free(eldr__rec_item *it);

typedef struct eldr__rec eldr__rec;

/* Start recording into dir (created when missing, one level): the writer
 * thread and an empty queue of at most max_items items and max_queue_bytes
 * bytes of item memory. */
int eldr__rec_new(const char *dir, const eldr__rec_limits *lim, size_t max_items, size_t max_queue_bytes,
                  eldr__rec **out, eldr_diag *d);
/* Write what is queued, close the file cleanly (fdatasync), join, free. */
void eldr__rec_free(eldr__rec *r);
/* The directory it writes into. */
const char *eldr__rec_dir(const eldr__rec *r);
/* New sample fraction and rotation limits (a reload). */
void eldr__rec_set_limits(eldr__rec *r, const eldr__rec_limits *lim);
/* Whether the next request is recorded (stride of the sample fraction);
 * counts the others as sampled out. */
int eldr__rec_sample(eldr__rec *r);
/* Hand an item over (it is always consumed): 0 queued, ELDR_EUNAVAIL
 * dropped (queue full). */
int eldr__rec_submit(eldr__rec *r, eldr__rec_item *it);
/* Count a sampled request that could not be recorded. */
void eldr__rec_drop_count(eldr__rec *r, eldr__rec_drop why);
/* Seconds since the recorder started (for eldr__rec_item.arrival). */
double eldr__rec_clock(const eldr__rec *r, double monotonic_now);

typedef struct eldr__rec_stats {
  uint64_t written, bytes, files, sampled_out;
  uint64_t dropped[ELDR__REC_DROP__N];
  size_t queued, queued_bytes;
  uint64_t errors;        /* reports for the log so far: an error at most once per
                           * 30 s (naming the count since the previous report),
                           * and the notices (directory made again, writing
                           * again); the last in last_error */
  char last_error[200];
  uint64_t write_errors;  /* failed opens, writes and syncs, every one */
  int paused;             /* backing off after a failure: the disk is left alone */
} eldr__rec_stats;
void eldr__rec_stats_get(eldr__rec *r, eldr__rec_stats *st);

/* Test hook: the writer thread waits this long before each batch (a slow
 * disk), 0 = off; setting 0 also ends a wait in progress (so is stopping). */
void eldr__rec_set_slow(eldr__rec *r, double seconds);

/* The last "completion_tokens": N in p[0..n) (a stream's usage chunk), or
 * prev when there is none; numbers of at most 12 digits. */
int64_t eldr__rec_scan_usage(const char *p, size_t n, int64_t prev);

/* The record's line (for tests and the writer): JSON in the counts form,
 * ending in '\n', malloc'd into *line. Reads the prefill tree's rows,
 * counts raw rows, parses the decode body (it may update it->shape and
 * it->layer_ids). 0, ELDR_ENOMEM, or ELDR_EEMPTY when the item has no
 * prompt counts. */
int eldr__rec_format(eldr__rec_item *it, char **line, size_t *len);

#endif
