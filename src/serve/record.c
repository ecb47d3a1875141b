/* record.c — the request recorder of `eldr serve --record DIR` (record.h):
 * a bounded queue, one writer thread, files rotated by size, age and shape,
 * fdatasync once a second and at close. */
#define _GNU_SOURCE
#include "record.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "eldr/grow.h"
#include "eldr/reply_experts.h"
#include "eldr/trace.h"
#include "serve_internal.h"

static const char *const drop_names[ELDR__REC_DROP__N] = {"queue_full", "no_counts", "write_error",
                                                          "out_of_memory"};

const char *eldr__rec_drop_name(eldr__rec_drop r) {
  return (unsigned)r < ELDR__REC_DROP__N ? drop_names[r] : "unknown";
}

/* fdatasync of the open file at most this often while lines are written. */
#define SYNC_INTERVAL_S 1.0

struct eldr__rec {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th;
  int started;
  /* under mu */
  eldr__rec_item *head, *tail;
  size_t n, bytes, max_items, max_bytes;
  int stop;
  eldr__rec_limits lim;
  double stride_acc;
  double slow_s;
  eldr__rec_stats st;
  /* the writer thread's */
  char *dir;
  int dirfd;
  int fd;              /* -1: no file open */
  uint64_t fbytes;     /* bytes in the open file */
  double fopened;      /* monotonic time it was opened */
  int dirty;           /* written since the last fdatasync */
  double synced;
  unsigned seq;
  eldr_shape fshape;   /* the open file's shape and model */
  char fmodel[128];
  uint32_t *flayers;
  double t0;           /* monotonic start */
};

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double eldr__rec_clock(const eldr__rec *r, double now) { return now - r->t0; }

const char *eldr__rec_dir(const eldr__rec *r) { return r->dir; }

/* ---- items ------------------------------------------------------------------ */

eldr__rec_item *eldr__rec_item_new(const eldr_shape *s, const uint32_t *layer_ids) {
  eldr__rec_item *it = calloc(1, sizeof *it);
  if (!it) return NULL;
  it->shape = *s;
  it->layer_ids = malloc(s->num_layers * sizeof *it->layer_ids);
  if (!it->layer_ids) {
    free(it);
    return NULL;
  }
  for (uint32_t l = 0; l < s->num_layers; l++) it->layer_ids[l] = layer_ids ? layer_ids[l] : l;
  it->decoder_index = it->centroid = -1;
  it->prompt_tokens = it->output_tokens = -1;
  it->ttft_ms = it->tpot_ms = NAN;
  it->policy = it->reason = "";
  it->bytes = sizeof *it + s->num_layers * sizeof *it->layer_ids;
  return it;
}

void eldr__rec_item_free(eldr__rec_item *it) {
  if (!it) return;
  json_decref(it->prefill_root);
  free(it->layer_ids);
  free(it->prefill_counts);
  free(it->prefill_raw);
  free(it->decode_body);
  free(it->sims);
  free(it);
}

/* ---- the line ------------------------------------------------------------------ */

typedef struct sb {
  char *p;
  size_t n, cap;
  int bad;
} sb;

static void sb_need(sb *b, size_t more) {
  if (b->bad) return;
  if (eldr_grow(&b->p, &b->cap, b->n + more + 1, 1, 4096)) b->bad = 1;
}

static void sb_put(sb *b, const char *s, size_t n) {
  sb_need(b, n);
  if (b->bad) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

#define sb_lit(b, s) sb_put(b, "" s, sizeof(s) - 1) /* s: a string literal */

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *b, const char *fmt, ...) {
  sb_need(b, 64);
  if (b->bad) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  if (k < 0) {
    b->bad = 1;
    return;
  }
  if ((size_t)k >= b->cap - b->n) {
    sb_need(b, (size_t)k + 1);
    if (b->bad) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
  }
  b->n += (size_t)k;
}

/* A JSON string (the values here are ids, URLs and model names). */
static void sb_str(sb *b, const char *s) {
  sb_lit(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      sb_put(b, e, 2);
    } else if (c < 0x20) {
      sb_printf(b, "\\u%04x", c);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_lit(b, "\"");
}

static void sb_num(sb *b, double x, const char *fmt) {
  if (isfinite(x)) sb_printf(b, fmt, x);
  else sb_lit(b, "null");
}

/* The generated rows of the decode reply counted into dc (L*E, zeroed
 * here): their number, or -1 when the reply has none usable. *out_tokens:
 * usage.completion_tokens (unchanged when absent). */
static int64_t decode_counts(const eldr__rec_item *it, uint32_t *dc, int64_t *out_tokens) {
  /* the router's reply parser: a large routed_experts blob bypasses the JSON parser */
  eldr__prefill_reply pr;
  if (eldr__prefill_reply_parse(it->decode_body, it->decode_len, &pr, NULL) != 0) return -1;
  json_t *root = pr.root;
  json_t *ct = json_object_get(json_object_get(root, "usage"), "completion_tokens");
  if (json_is_integer(ct) && json_integer_value(ct) >= 0) *out_tokens = json_integer_value(ct);
  int64_t rows = -1;
  eldr_re_opts o = {it->chat ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS, it->shape.num_layers, it->shape.top_k,
                    it->shape.num_experts, NULL};
  eldr_reply_experts rex;
  if (eldr_reply_experts_from_json(root, &o, &rex, NULL, NULL) == 0) {
    const eldr_re_view *g = rex.nchoices ? &rex.choices[0].generated : NULL;
    if (g && g->data && g->rows) {
      memset(dc, 0, eldr_shape_cells(&it->shape) * sizeof *dc);
      if (eldr_counts_accumulate(&it->shape, g->data, g->dtype, g->rows, dc, NULL) == 0 &&
          g->rows <= UINT32_MAX)
        rows = (int64_t)g->rows;
    }
    eldr_reply_experts_free(&rex);
  }
  eldr__prefill_reply_free(&pr);
  return rows;
}

/* The prompt rows of the prefill reply tree, counted into a new buffer:
 * it->shape becomes the rows' (E: it->experts). 0 or -1. */
static int root_counts(eldr__rec_item *it, uint32_t **out, uint32_t *tokens) {
  eldr_re_opts o = {it->chat ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS, 0, 0, it->experts, NULL};
  eldr_reply_experts rex;
  if (!it->experts || eldr_reply_experts_from_json(it->prefill_root, &o, &rex, NULL, NULL) != 0) return -1;
  const eldr_re_view *v = rex.nchoices ? &rex.choices[0].prompt : NULL;
  int rc = -1;
  if (v && v->data && v->rows && v->rows <= UINT32_MAX && v->top_k <= it->experts) {
    eldr_shape sh = {(uint32_t)v->layers, it->experts, (uint32_t)v->top_k};
    uint32_t *c = calloc(eldr_shape_cells(&sh), sizeof *c);
    if (sh.num_layers != it->shape.num_layers) { /* not the artifact's layers: 0..L-1 */
      uint32_t *ly = realloc(it->layer_ids, sh.num_layers * sizeof *ly);
      if (ly) {
        for (uint32_t l = 0; l < sh.num_layers; l++) ly[l] = l;
        it->layer_ids = ly;
      } else {
        free(c);
        c = NULL;
      }
    }
    if (c && eldr_counts_accumulate(&sh, v->data, v->dtype, v->rows, c, NULL) == 0) {
      it->shape = sh;
      *out = c;
      *tokens = (uint32_t)v->rows;
      rc = 0;
    } else {
      free(c);
    }
  }
  eldr_reply_experts_free(&rex);
  return rc;
}

int eldr__rec_format(eldr__rec_item *it, char **line, size_t *len) {
  *line = NULL;
  *len = 0;
  uint32_t *pc = it->prefill_counts, *own = NULL, *dc = NULL;
  uint32_t ptok = it->prefill_tokens;
  if (!pc && it->prefill_root) {
    if (root_counts(it, &own, &ptok) != 0) return ELDR_EEMPTY;
    pc = own;
  }
  const eldr_shape *s = &it->shape;
  size_t cells = eldr_shape_cells(s);
  if (!pc && it->prefill_raw) {
    if (!(own = calloc(cells, sizeof *own))) return ELDR_ENOMEM;
    if (eldr_counts_accumulate(s, it->prefill_raw, it->prefill_dtype, it->prefill_rows, own, NULL) != 0 ||
        it->prefill_rows > UINT32_MAX) {
      free(own);
      return ELDR_EEMPTY;
    }
    pc = own;
    ptok = (uint32_t)it->prefill_rows;
  }
  if (!pc) return ELDR_EEMPTY;
  int64_t out_tokens = it->output_tokens, drows = -1;
  if (it->decode_body) {
    if (!(dc = malloc(cells * sizeof *dc))) {
      free(own);
      return ELDR_ENOMEM;
    }
    drows = decode_counts(it, dc, &out_tokens);
  }
  /* the decision, as the "serve" object (opaque to readers) */
  sb b = {0};
  sb_lit(&b, "{\"decoder\":");
  if (it->decoder[0]) sb_str(&b, it->decoder);
  else sb_lit(&b, "null");
  sb_printf(&b, ",\"decoder_index\":%d,\"policy\":", it->decoder_index);
  sb_str(&b, it->policy);
  sb_lit(&b, ",\"reason\":");
  sb_str(&b, it->reason);
  sb_printf(&b, ",\"centroid\":%d,\"similarity\":", it->centroid);
  if (it->sims) {
    sb_lit(&b, "[");
    for (size_t k = 0; k < it->nsims; k++) {
      if (k) sb_lit(&b, ",");
      sb_num(&b, it->sims[k], "%.9g");
    }
    sb_lit(&b, "]");
  } else {
    sb_lit(&b, "null");
  }
  sb_lit(&b, ",\"ttft_ms\":");
  sb_num(&b, it->ttft_ms, "%.3f");
  sb_lit(&b, ",\"tpot_ms\":");
  sb_num(&b, it->tpot_ms, "%.3f");
  sb_printf(&b, ",\"status\":%d,\"artifact\":", it->status);
  if (it->artifact[0]) sb_str(&b, it->artifact);
  else sb_lit(&b, "null");
  sb_lit(&b, ",\"time\":");
  sb_num(&b, it->time, "%.6f");
  sb_lit(&b, ",\"prompt_tokens\":");
  if (it->prompt_tokens >= 0) sb_printf(&b, "%lld", (long long)it->prompt_tokens);
  else sb_lit(&b, "null");
  sb_lit(&b, ",\"output_tokens\":");
  if (out_tokens >= 0) sb_printf(&b, "%lld", (long long)out_tokens);
  else sb_lit(&b, "null");
  sb_lit(&b, "}");
  sb_put(&b, "", 1); /* NUL */
  int rc = b.bad ? ELDR_ENOMEM : 0;
  if (!rc) {
    /* with counts, decode_tokens are the tokens they cover; else the output's */
    int64_t dtok = drows >= 0 ? drows : out_tokens > 0 ? out_tokens : 0;
    eldr_counts_line ln = {.id = it->id,
                           .model = it->model[0] ? it->model : "unknown",
                           .shape = s,
                           .layer_ids = it->layer_ids,
                           .arrival = it->arrival >= 0 ? it->arrival : 0,
                           .prefill_tokens = ptok,
                           .decode_tokens = (uint32_t)(dtok > UINT32_MAX ? UINT32_MAX : dtok),
                           .prefill_counts = pc,
                           .decode_counts = drows >= 0 ? dc : NULL,
                           .serve = b.p};
    size_t cap = 0;
    rc = eldr_trace_format_counts(&ln, line, len, &cap, NULL);
    if (rc) {
      free(*line);
      *line = NULL;
      *len = 0;
      if (rc != ELDR_ENOMEM) rc = ELDR_EEMPTY; /* counts that are no trace's: nothing to refit on */
    }
  }
  free(b.p);
  free(own);
  free(dc);
  return rc;
}

int64_t eldr__rec_scan_usage(const char *p, size_t n, int64_t prev) {
  static const char key[] = "\"completion_tokens\":";
  const size_t kn = sizeof key - 1;
  const char *e = p + n;
  for (const char *q = p; q + kn <= e; q++) {
    q = memmem(q, (size_t)(e - q), key, kn);
    if (!q) break;
    const char *v = q + kn;
    while (v < e && *v == ' ') v++;
    int64_t x = 0;
    int digits = 0;
    while (v < e && *v >= '0' && *v <= '9' && digits < 12) x = x * 10 + (*v++ - '0'), digits++;
    if (digits) prev = x;
  }
  return prev;
}

/* ---- files (writer thread) ------------------------------------------------------ */

static void note_error(eldr__rec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(eldr__rec *r, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&r->mu);
  r->st.errors++;
  snprintf(r->st.last_error, sizeof r->st.last_error, "%s", msg);
  pthread_mutex_unlock(&r->mu);
}

static void file_close(eldr__rec *r) {
  if (r->fd < 0) return;
  if (fdatasync(r->fd) != 0) note_error(r, "record: fdatasync: %s", strerror(errno));
  close(r->fd);
  r->fd = -1;
  r->dirty = 0;
}

/* A new file: record-<UTC>-<seq>.jsonl (names sort by time, then seq). */
static int file_open(eldr__rec *r, const eldr__rec_item *it) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  char ts[32], name[96];
  strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm);
  for (int tries = 0; tries < 1000; tries++) {
    snprintf(name, sizeof name, "record-%s-%06u.jsonl", ts, r->seq++);
    r->fd = openat(r->dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (r->fd >= 0 || errno != EEXIST) break;
  }
  if (r->fd < 0) {
    note_error(r, "record: cannot create a file in %s: %s", r->dir, strerror(errno));
    return -1;
  }
  if (fsync(r->dirfd) != 0) note_error(r, "record: fsync of %s: %s", r->dir, strerror(errno));
  r->fbytes = 0;
  r->fopened = mono_now();
  r->synced = r->fopened;
  r->fshape = it->shape;
  snprintf(r->fmodel, sizeof r->fmodel, "%s", it->model);
  uint32_t *ly = realloc(r->flayers, it->shape.num_layers * sizeof *ly);
  if (ly) {
    memcpy(ly, it->layer_ids, it->shape.num_layers * sizeof *ly);
    r->flayers = ly;
  }
  pthread_mutex_lock(&r->mu);
  r->st.files++;
  pthread_mutex_unlock(&r->mu);
  return ly ? 0 : -1;
}

/* Every line of a file agrees on model and shape (docs/trace.md). */
static int same_header(const eldr__rec *r, const eldr__rec_item *it) {
  return !memcmp(&r->fshape, &it->shape, sizeof it->shape) && !strcmp(r->fmodel, it->model) &&
         !memcmp(r->flayers, it->layer_ids, it->shape.num_layers * sizeof *it->layer_ids);
}

/* Append buf (whole lines) to the open file: 0, or -1 with the file cut
 * back to its last whole line and closed. */
static int file_append(eldr__rec *r, const char *buf, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(r->fd, buf + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      note_error(r, "record: write to %s: %s", r->dir, w < 0 ? strerror(errno) : "no progress");
      if (off && ftruncate(r->fd, (off_t)r->fbytes) != 0)
        note_error(r, "record: cannot cut a torn line: %s", strerror(errno));
      file_close(r);
      return -1;
    }
    off += (size_t)w;
  }
  r->fbytes += n;
  r->dirty = 1;
  return 0;
}

/* Rotation by age (also with no new line: a finished file is closed). */
static void maybe_age_out(eldr__rec *r, const eldr__rec_limits *lim, double now) {
  if (r->fd >= 0 && lim->max_seconds > 0 && now - r->fopened >= lim->max_seconds) file_close(r);
}

static void write_one(eldr__rec *r, eldr__rec_item *it, const eldr__rec_limits *lim) {
  char *line = NULL;
  size_t n = 0;
  int rc = eldr__rec_format(it, &line, &n);
  eldr__rec_drop why = ELDR__REC_DROP__N;
  if (rc == ELDR_EEMPTY) why = ELDR__REC_NO_COUNTS;
  else if (rc) why = ELDR__REC_NO_MEMORY;
  if (!rc) {
    maybe_age_out(r, lim, mono_now());
    if (r->fd >= 0 && (!same_header(r, it) || (lim->max_bytes && r->fbytes && r->fbytes + n > lim->max_bytes)))
      file_close(r);
    if ((r->fd < 0 && file_open(r, it) != 0) || file_append(r, line, n) != 0) why = ELDR__REC_WRITE_ERROR;
  }
  pthread_mutex_lock(&r->mu);
  if (why == ELDR__REC_DROP__N) {
    r->st.written++;
    r->st.bytes += n;
  } else {
    r->st.dropped[why]++;
  }
  pthread_mutex_unlock(&r->mu);
  free(line);
  eldr__rec_item_free(it);
}

static void *writer_main(void *arg) {
  eldr__rec *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->head && !r->stop) {
      /* wake for the next fdatasync or age rotation */
      double wait = 3600;
      if (r->fd >= 0 && r->dirty) wait = SYNC_INTERVAL_S;
      if (r->fd >= 0 && r->lim.max_seconds > 0) {
        double left = r->fopened + r->lim.max_seconds - mono_now();
        if (left < wait) wait = left > 0 ? left : 0;
      }
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      double sec = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + wait + 0.001;
      ts.tv_sec = (time_t)sec;
      ts.tv_nsec = (long)((sec - (double)ts.tv_sec) * 1e9);
      int rc = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
      if (rc == ETIMEDOUT) break;
    }
    eldr__rec_item *batch = r->head;
    r->head = r->tail = NULL;
    r->n = 0;
    r->bytes = 0;
    int stop = r->stop;
    eldr__rec_limits lim = r->lim;
    double slow = r->slow_s;
    pthread_mutex_unlock(&r->mu);
    if (batch && slow > 0) {
      struct timespec ts = {(time_t)slow, (long)((slow - (double)(time_t)slow) * 1e9)};
      nanosleep(&ts, NULL);
    }
    while (batch) {
      eldr__rec_item *next = batch->next;
      write_one(r, batch, &lim);
      batch = next;
    }
    double now = mono_now();
    maybe_age_out(r, &lim, now);
    if (r->fd >= 0 && r->dirty && now - r->synced >= SYNC_INTERVAL_S) {
      if (fdatasync(r->fd) != 0) note_error(r, "record: fdatasync: %s", strerror(errno));
      r->dirty = 0;
      r->synced = now;
    }
    pthread_mutex_lock(&r->mu);
    if (stop && !r->head) break;
  }
  pthread_mutex_unlock(&r->mu);
  file_close(r);
  return NULL;
}

/* ---- public ----------------------------------------------------------------------- */

int eldr__rec_new(const char *dir, const eldr__rec_limits *lim, size_t max_items, size_t max_queue_bytes,
                  eldr__rec **out, eldr_diag *d) {
  *out = NULL;
  if (!dir || !*dir) return eldr_diag_fail(d, ELDR_EINVAL, "record: no directory");
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return eldr_diag_fail(d, ELDR_EIO, "record: cannot create directory %s: %s", dir, strerror(errno));
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return eldr_diag_fail(d, ELDR_EIO, "record: %s is not a directory: %s", dir, strerror(errno));
  if (faccessat(dfd, ".", W_OK, AT_EACCESS) != 0) {
    int e = errno;
    close(dfd);
    return eldr_diag_fail(d, ELDR_EIO, "record: directory %s is not writable: %s", dir, strerror(e));
  }
  eldr__rec *r = calloc(1, sizeof *r);
  if (!r || !(r->dir = strdup(dir))) {
    free(r);
    close(dfd);
    return eldr_diag_fail(d, ELDR_ENOMEM, "record: out of memory");
  }
  r->dirfd = dfd;
  r->fd = -1;
  r->lim = *lim;
  r->max_items = max_items ? max_items : 1;
  r->max_bytes = max_queue_bytes;
  r->t0 = mono_now();
  pthread_mutex_init(&r->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_cond_init(&r->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&r->th, NULL, writer_main, r) != 0) {
    eldr__rec_free(r);
    return eldr_diag_fail(d, ELDR_ENOMEM, "record: cannot start the writer thread");
  }
  r->started = 1;
  *out = r;
  return 0;
}

void eldr__rec_free(eldr__rec *r) {
  if (!r) return;
  if (r->started) {
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->th, NULL);
  }
  while (r->head) {
    eldr__rec_item *n = r->head->next;
    eldr__rec_item_free(r->head);
    r->head = n;
  }
  file_close(r);
  if (r->dirfd >= 0) close(r->dirfd);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r->flayers);
  free(r->dir);
  free(r);
}

void eldr__rec_set_limits(eldr__rec *r, const eldr__rec_limits *lim) {
  pthread_mutex_lock(&r->mu);
  r->lim = *lim;
  pthread_cond_signal(&r->cv); /* a shorter max_seconds applies now */
  pthread_mutex_unlock(&r->mu);
}

void eldr__rec_set_slow(eldr__rec *r, double seconds) {
  pthread_mutex_lock(&r->mu);
  r->slow_s = seconds;
  pthread_mutex_unlock(&r->mu);
}

int eldr__rec_sample(eldr__rec *r) {
  pthread_mutex_lock(&r->mu);
  /* a stride: exactly the fraction, evenly spread, no randomness to test around */
  r->stride_acc += r->lim.sample;
  int take = r->stride_acc >= 1.0 - 1e-12;
  if (take) r->stride_acc -= 1.0;
  else r->st.sampled_out++;
  pthread_mutex_unlock(&r->mu);
  return take;
}

void eldr__rec_drop_count(eldr__rec *r, eldr__rec_drop why) {
  pthread_mutex_lock(&r->mu);
  r->st.dropped[why < ELDR__REC_DROP__N ? why : ELDR__REC_NO_MEMORY]++;
  pthread_mutex_unlock(&r->mu);
}

int eldr__rec_submit(eldr__rec *r, eldr__rec_item *it) {
  pthread_mutex_lock(&r->mu);
  if (r->n >= r->max_items || (r->max_bytes && r->bytes + it->bytes > r->max_bytes)) {
    r->st.dropped[ELDR__REC_QUEUE_FULL]++;
    pthread_mutex_unlock(&r->mu);
    eldr__rec_item_free(it);
    return ELDR_EUNAVAIL;
  }
  it->next = NULL;
  if (r->tail) r->tail->next = it;
  else r->head = it;
  r->tail = it;
  r->n++;
  r->bytes += it->bytes;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return 0;
}

void eldr__rec_stats_get(eldr__rec *r, eldr__rec_stats *st) {
  pthread_mutex_lock(&r->mu);
  *st = r->st;
  st->queued = r->n;
  st->queued_bytes = r->bytes;
  pthread_mutex_unlock(&r->mu);
}
