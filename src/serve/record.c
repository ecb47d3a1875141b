/* record.c — the request recorder of `eldr serve --record DIR` (record.h):
 * a bounded queue, one writer thread, files rotated by size, age and shape,
 * fdatasync once a second and at close. The line itself: record_line.c. */
#define _GNU_SOURCE
#include "record.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const drop_names[ELDR__REC_DROP__N] = {"queue_full", "no_counts", "write_error",
                                                          "out_of_memory"};

const char *eldr__rec_drop_name(eldr__rec_drop r) {
  return (unsigned)r < ELDR__REC_DROP__N ? drop_names[r] : "unknown";
}

/* fdatasync of the open file at most this often while lines are written. */
#define SYNC_INTERVAL_S 1.0
/* After a failed open or write (disk full, directory gone) the disk is left
 * alone for a delay that doubles from BACKOFF_MIN_S to BACKOFF_MAX_S while
 * the failures last; the records sampled meanwhile are dropped and counted
 * (write_error), never queued up or spread over empty files. */
#define BACKOFF_MIN_S 1.0
#define BACKOFF_MAX_S 60.0
/* An error report for the log at most this often (the count in between
 * goes into the next one). */
#define REPORT_INTERVAL_S 30.0

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
  char fname[96];      /* the open file's name in dir */
  dev_t ddev;          /* the directory opened as dirfd: still the one named dir? */
  ino_t dino;
  double backoff_s, backoff_until; /* 0: writing; else the disk is left alone until then */
  uint64_t dropped_off;            /* records dropped since the backoff began */
  double report_t;                 /* when the last error report was made (mu) */
  uint64_t unreported;             /* errors since it (mu) */
  double paused_until;             /* backoff_until while backing off, else 0 (mu) */
};

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double eldr__rec_clock(const eldr__rec *r, double now) { return now - r->t0; }

const char *eldr__rec_dir(const eldr__rec *r) { return r->dir; }

/* ---- files (writer thread) ------------------------------------------------------ */

/* Count an error (force 0) or a notice (force 1: always reported); it
 * becomes a report for the log (st.errors, st.last_error) when none was
 * made for REPORT_INTERVAL_S, naming how many came in between. */
static void report(eldr__rec *r, int force, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(eldr__rec *r, int force, const char *fmt, ...) {
  char msg[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  double now = mono_now();
  pthread_mutex_lock(&r->mu);
  if (!force) r->st.write_errors++;
  if (force || !r->report_t || now - r->report_t >= REPORT_INTERVAL_S) {
    r->st.errors++;
    if (r->unreported)
      snprintf(r->st.last_error, sizeof r->st.last_error, "%.140s (%llu more errors since the last report)", msg,
               (unsigned long long)r->unreported);
    else
      snprintf(r->st.last_error, sizeof r->st.last_error, "%s", msg);
    if (!force) r->report_t = now;
    r->unreported = 0;
  } else {
    r->unreported++;
  }
  pthread_mutex_unlock(&r->mu);
}
#define note_error(r, ...) report(r, 0, __VA_ARGS__)

/* The directory as dirfd: 0, or -1 (reported). Remembers its identity. */
static int dir_open(eldr__rec *r) {
  if (mkdir(r->dir, 0755) != 0 && errno != EEXIST) {
    note_error(r, "record: cannot create directory %s: %s", r->dir, strerror(errno));
    return -1;
  }
  int fd = open(r->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    note_error(r, "record: cannot open directory %s: %s", r->dir, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  if (r->dirfd >= 0) close(r->dirfd);
  r->dirfd = fd;
  r->ddev = st.st_dev;
  r->dino = st.st_ino;
  return 0;
}

/* The directory named dir is still the one being written: not removed
 * (a removed directory's files are unlinked: records written there are
 * lost), not renamed or replaced. Otherwise the open file is closed and
 * dir opened again (created when missing, as at start). 0, or -1. */
static int dir_check(eldr__rec *r) {
  struct stat a, b;
  int same = r->dirfd >= 0 && fstat(r->dirfd, &a) == 0 && a.st_nlink > 0 && stat(r->dir, &b) == 0 &&
             b.st_dev == r->ddev && b.st_ino == r->dino;
  if (same) return 0;
  int was = r->dirfd >= 0;
  if (r->fd >= 0) {
    close(r->fd); /* its directory is gone: nothing to sync for */
    r->fd = -1;
    r->dirty = 0;
  }
  if (dir_open(r) != 0) return -1;
  if (was) report(r, 1, "record: directory %s was removed or replaced: writing into %s again", r->dir, r->dir);
  return 0;
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
  snprintf(r->fname, sizeof r->fname, "%s", name);
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
      if (!r->fbytes) { /* nothing of it was written: no empty file left behind */
        close(r->fd);
        r->fd = -1;
        r->dirty = 0;
        unlinkat(r->dirfd, r->fname, 0);
        return -1;
      }
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
  double now = mono_now();
  if (!rc && r->backoff_s > 0 && now < r->backoff_until) { /* the disk is left alone a while */
    why = ELDR__REC_WRITE_ERROR;
    r->dropped_off++;
  } else if (!rc) {
    maybe_age_out(r, lim, now);
    if (r->fd >= 0 && (!same_header(r, it) || (lim->max_bytes && r->fbytes && r->fbytes + n > lim->max_bytes)))
      file_close(r);
    if (dir_check(r) != 0 || (r->fd < 0 && file_open(r, it) != 0) || file_append(r, line, n) != 0) {
      why = ELDR__REC_WRITE_ERROR;
      r->dropped_off++;
      r->backoff_s = r->backoff_s > 0 ? (r->backoff_s * 2 < BACKOFF_MAX_S ? r->backoff_s * 2 : BACKOFF_MAX_S)
                                       : BACKOFF_MIN_S;
      r->backoff_until = now + r->backoff_s;
    } else if (r->backoff_s > 0) {
      report(r, 1, "record: writing to %s again (%llu sampled records dropped while it failed)", r->dir,
             (unsigned long long)r->dropped_off);
      r->backoff_s = 0;
      r->dropped_off = 0;
    }
  }
  pthread_mutex_lock(&r->mu);
  r->paused_until = r->backoff_s > 0 ? r->backoff_until : 0;
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
    if (batch && slow > 0) { /* a test's slow disk: until the deadline, or set_slow(0), or stop */
      pthread_mutex_lock(&r->mu);
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      double until = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + slow;
      ts.tv_sec = (time_t)until;
      ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
      while (r->slow_s > 0 && !r->stop && pthread_cond_timedwait(&r->cv, &r->mu, &ts) != ETIMEDOUT) {
      }
      pthread_mutex_unlock(&r->mu);
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
  struct stat dst;
  if (fstat(dfd, &dst) != 0) {
    int e = errno;
    close(dfd);
    return eldr_diag_fail(d, ELDR_EIO, "record: %s: %s", dir, strerror(e));
  }
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
  r->ddev = dst.st_dev;
  r->dino = dst.st_ino;
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
  pthread_cond_broadcast(&r->cv); /* a stall in progress ends when set to 0 */
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
  st->paused = r->paused_until > 0 && mono_now() < r->paused_until;
  st->queued = r->n;
  st->queued_bytes = r->bytes;
  pthread_mutex_unlock(&r->mu);
}
