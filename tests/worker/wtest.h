/* wtest.h — helpers for the worker tests (header-only, static): a blocking
 * HTTP/1.1 client with a deadline (never hangs a test), chunked decoding,
 * an SSE checker, an in-process worker on its own thread, and subprocess
 * management for the cluster tests. */
#ifndef ELDR_TESTS_WTEST_H
#define ELDR_TESTS_WTEST_H

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "eldr/clock.h"
#include "eldr/worker.h"
#include "support/fixture.h"

static __attribute__((unused)) double wt_now(void) { return eldr_clock_now(); }

typedef struct wt_resp {
  int status;       /* 0 = no response */
  char *body;       /* de-chunked, NUL-terminated (malloc'd) */
  size_t len;
  int chunked;
  char ctype[128];
} wt_resp;

static __attribute__((unused)) void wt_resp_free(wt_resp *r) {
  free(r->body);
  memset(r, 0, sizeof *r);
}

static __attribute__((unused)) int wt_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Decode a chunked body in place; returns the new length or -1. */
static __attribute__((unused)) long wt_dechunk(char *b, size_t n) {
  size_t in = 0, out = 0;
  for (;;) {
    char *end = NULL;
    if (in >= n) return -1;
    unsigned long sz = strtoul(b + in, &end, 16);
    char *nl = memchr(b + in, '\n', n - in);
    if (!nl || end == b + in) return -1;
    in = (size_t)(nl - b) + 1;
    if (sz == 0) break;
    if (in + sz > n) return -1;
    memmove(b + out, b + in, sz);
    out += sz;
    in += sz;
    if (in + 2 <= n && b[in] == '\r') in += 2;
    else if (in + 1 <= n && b[in] == '\n') in += 1;
  }
  b[out] = 0;
  return (long)out;
}

/* One request with Connection: close; reads until EOF or the deadline. */
static __attribute__((unused)) int wt_http(int port, const char *method, const char *path, const char *body,
                   double timeout_s, wt_resp *r) {
  memset(r, 0, sizeof *r);
  int fd = wt_connect(port);
  if (fd < 0) return -1;
  char head[512];
  size_t bl = body ? strlen(body) : 0;
  int hl = snprintf(head, sizeof head,
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                    method, path, port, bl);
  if (tc_send_all(fd, head, (size_t)hl) < 0 || (bl && tc_send_all(fd, body, bl) < 0)) {
    close(fd);
    return -1;
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  double deadline = wt_now() + timeout_s;
  for (;;) {
    double left = deadline - wt_now();
    if (left <= 0) break;
    struct pollfd p = {fd, POLLIN, 0};
    int pr = poll(&p, 1, (int)(left * 1000) + 1);
    if (pr <= 0) break;
    if (len + 4096 > cap) {
      cap *= 2;
      buf = realloc(buf, cap);
    }
    ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
    if (k <= 0) break;
    len += (size_t)k;
  }
  close(fd);
  buf[len] = 0;
  char *sep = strstr(buf, "\r\n\r\n");
  if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
    free(buf);
    r->status = 0;
    return -1;
  }
  *sep = 0;
  for (char *p = buf; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
  r->chunked = strstr(buf, "transfer-encoding: chunked") != NULL;
  char *ct = strstr(buf, "content-type: ");
  if (ct) sscanf(ct + 14, "%127[^\r\n]", r->ctype);
  size_t hlen = (size_t)(sep - buf) + 4;
  r->len = len - hlen;
  r->body = malloc(r->len + 1);
  memcpy(r->body, buf + hlen, r->len);
  r->body[r->len] = 0;
  free(buf);
  if (r->chunked) {
    long n = wt_dechunk(r->body, r->len);
    if (n < 0) return -2; /* truncated chunked body */
    r->len = (size_t)n;
  }
  return 0;
}

/* Check an SSE body: every event "data: {json object}" and the last one
 * "data: [DONE]". Returns the number of token events (non-empty text or
 * delta.content), or -1 with why in err. engine (48 bytes) receives the
 * eldr_engine_id; usage_tokens the usage.completion_tokens (-1 if absent). */
static __attribute__((unused)) int wt_sse_check(const char *body, char *err, size_t errcap, char *engine,
                        long *usage_tokens) {
  int tokens = 0, done = 0;
  if (usage_tokens) *usage_tokens = -1;
  if (engine) engine[0] = 0;
  const char *p = body;
  while (*p) {
    const char *e = strstr(p, "\n\n");
    if (!e) {
      snprintf(err, errcap, "unterminated event: %.60s", p);
      return -1;
    }
    if (done) {
      snprintf(err, errcap, "data after [DONE]");
      return -1;
    }
    if (strncmp(p, "data: ", 6)) {
      snprintf(err, errcap, "event does not start with 'data: ': %.60s", p);
      return -1;
    }
    const char *d = p + 6;
    size_t dl = (size_t)(e - d);
    if (dl == 6 && !memcmp(d, "[DONE]", 6)) {
      done = 1;
    } else {
      json_error_t je;
      json_t *j = json_loadb(d, dl, 0, &je);
      if (!json_is_object(j)) {
        snprintf(err, errcap, "event data is not a JSON object: %.80s", je.text);
        json_decref(j);
        return -1;
      }
      json_t *eng = json_object_get(j, "eldr_engine_id");
      if (engine && json_is_string(eng) && !engine[0])
        snprintf(engine, 48, "%s", json_string_value(eng));
      json_t *u = json_object_get(json_object_get(j, "usage"), "completion_tokens");
      if (usage_tokens && json_is_integer(u)) *usage_tokens = (long)json_integer_value(u);
      json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
      json_t *t = json_object_get(c0, "text");
      if (!t) t = json_object_get(json_object_get(c0, "delta"), "content");
      if (json_is_string(t) && json_string_length(t) > 0) tokens++;
      json_decref(j);
    }
    p = e + 2;
  }
  if (!done) {
    snprintf(err, errcap, "no data: [DONE]");
    return -1;
  }
  return tokens;
}

/* ---- an in-process worker on its own event loop thread ---- */
typedef struct wt_worker {
  struct event_base *base;
  eldr_worker *w;
  pthread_t th;
  int port;
  int ended; /* the loop returned (atomic) */
} wt_worker;

static void *wt_worker_main(void *arg) {
  wt_worker *t = arg;
  event_base_loop(t->base, EVLOOP_NO_EXIT_ON_EMPTY);
  __atomic_store_n(&t->ended, 1, __ATOMIC_RELEASE);
  return NULL;
}

static __attribute__((unused)) int wt_worker_start(wt_worker *t, const eldr_worker_config *cfg, eldr_diag *d) {
  static int threads_on = 0;
  if (!threads_on) {
    evthread_use_pthreads();
    threads_on = 1;
  }
  memset(t, 0, sizeof *t);
  t->base = event_base_new();
  if (!t->base) return -1;
  int rc = eldr_worker_new(t->base, cfg, &t->w, d);
  if (rc < 0) {
    event_base_free(t->base);
    return rc;
  }
  t->port = eldr_worker_port(t->w);
  pthread_create(&t->th, NULL, wt_worker_main, t);
  return 0;
}

/* A break asked before the thread entered its loop is lost (event_base_loop
 * clears it on entry): asked again until the thread has ended. */
static __attribute__((unused)) void wt_worker_stop(wt_worker *t) {
  for (;;) {
    event_base_loopbreak(t->base);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (__atomic_load_n(&t->ended, __ATOMIC_ACQUIRE)) break;
  }
  pthread_join(t->th, NULL);
  eldr_worker_free(t->w);
  event_base_free(t->base);
}

/* ---- subprocesses ---- */

/* Start argv (argv[0] = binary) with stdout to a pipe; its first stdout line
 * is returned in line (cap bytes) within timeout_s. Returns the pid or -1. */
static __attribute__((unused)) pid_t wt_spawn(char *const argv[], char *line, size_t cap, double timeout_s) {
  int pfd[2];
  if (pipe(pfd) < 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    close(pfd[1]);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0 && !getenv("WTEST_VERBOSE")) dup2(devnull, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t n = 0;
  if (line && cap) line[0] = 0;
  double deadline = wt_now() + timeout_s;
  while (line && n + 1 < cap) {
    double left = deadline - wt_now();
    if (left <= 0) break;
    struct pollfd p = {pfd[0], POLLIN, 0};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) break;
    char c;
    if (read(pfd[0], &c, 1) != 1) break;
    if (c == '\n') break;
    line[n++] = c;
    line[n] = 0;
  }
  close(pfd[0]);
  return pid;
}

/* Port from "... http://127.0.0.1:PORT ..." in a line, or -1. */
static __attribute__((unused)) int wt_port_of(const char *line) {
  const char *p = strstr(line, "127.0.0.1:");
  return p ? atoi(p + 10) : -1;
}

/* SIGTERM, then SIGKILL after 3 s; reaps. */
static __attribute__((unused)) void wt_kill(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  double deadline = wt_now() + 3;
  while (wt_now() < deadline) {
    if (waitpid(pid, NULL, WNOHANG) == pid) return;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* A free loopback port (bound then released). */
static __attribute__((unused)) int wt_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &sl) < 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

/* Poll GET path until 200 or the deadline. */
static __attribute__((unused)) int wt_wait_ready(int port, const char *path, double timeout_s) {
  double deadline = wt_now() + timeout_s;
  while (wt_now() < deadline) {
    wt_resp r;
    if (wt_http(port, "GET", path, NULL, 1.0, &r) == 0 && r.status == 200) {
      wt_resp_free(&r);
      return 0;
    }
    wt_resp_free(&r);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

/* Value of the /metrics series at port whose line starts with `series` (the
 * name with its labels, exactly), or NAN when absent or unreachable. */
static __attribute__((unused)) double wt_metric(int port, const char *series) {
  wt_resp r;
  double v = NAN;
  size_t l = strlen(series);
  if (wt_http(port, "GET", "/metrics", NULL, 5, &r) == 0 && r.status == 200) {
    for (const char *p = r.body; p && *p;) {
      if (!strncmp(p, series, l) && p[l] == ' ') {
        v = strtod(p + l + 1, NULL);
        break;
      }
      p = strchr(p, '\n');
      if (p) p++;
    }
  }
  wt_resp_free(&r);
  return v;
}

/* Poll wt_metric until it equals want; 0, or -1 after timeout_s. */
static __attribute__((unused)) int wt_wait_metric(int port, const char *series, double want,
                                                  double timeout_s) {
  double deadline = wt_now() + timeout_s;
  while (wt_now() < deadline) {
    if (wt_metric(port, series) == want) return 0;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

#endif
