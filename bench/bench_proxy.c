/* bench_proxy.c — eldr serve throughput and added latency, measured in one
 * run against the same fast fixture worker:
 *   direct-1   client -> worker, one request (a plain completion)
 *   direct-2   client -> worker prefill leg, then decode leg (what a PD
 *              client does without a router, sequentially on one connection)
 *   router     client -> eldr serve -> prefill worker -> decode worker
 * Small non-streaming bodies. The fixture worker is a minimal HTTP/1.1
 * responder on libevent in its own thread (answers a prefill leg with
 * kv_transfer_params, anything else with a short completion); the router runs in-process in its own
 * thread; the load generator is closed-loop over N keep-alive connections.
 *
 * usage: bench_proxy [--duration S] [--conns N] [--policy jsq|eldr|rr] [--prompt-tokens N]
 * (prompts of N stand-in tokens, default 48: three 16-token blocks, which the
 * router hashes at arrival; below 16 it hashes the text instead)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "eldr/clock.h"
#include "eldr/serve.h"
#include "eldr/tokenize.h"

#include "bench_net.h"

/* ---- fixture worker ------------------------------------------------------- */

static const char PREFILL_REPLY[] =
    "{\"id\":\"cmpl-p\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"x\","
    "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1},"
    "\"kv_transfer_params\":{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
    "\"remote_engine_id\":\"e0\",\"remote_block_ids\":[1,2,3],\"remote_host\":\"127.0.0.1\","
    "\"remote_port\":5600}}";
static const char DECODE_REPLY[] =
    "{\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" a short "
    "answer of a few words\",\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,"
    "\"completion_tokens\":8}}";

/* A deliberately cheap HTTP/1.1 responder (keep-alive, Content-Length
 * bodies), so that the benchmark measures the router rather than the fixture. */
typedef struct fixture {
  struct event_base *base;
  struct evconnlistener *lis;
  int port;
  pthread_t th;
} fixture;

typedef struct fxconn {
  struct event *ev;
  int fd;
  char buf[65536];
  size_t len;
} fxconn;

static char prefill_resp[1024], decode_resp[1024], health_resp[128];
static size_t prefill_resp_len, decode_resp_len, health_resp_len;

static void fx_read(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  fxconn *c = arg;
  ssize_t n = recv(fd, c->buf + c->len, sizeof c->buf - c->len - 1, 0);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    event_free(c->ev);
    close(fd);
    free(c);
    return;
  }
  c->len += (size_t)n;
  for (;;) {
    c->buf[c->len] = 0;
    char *he = strstr(c->buf, "\r\n\r\n");
    if (!he) return;
    size_t hl = (size_t)(he - c->buf) + 4, bl = 0;
    char *cl = strcasestr(c->buf, "Content-Length:");
    if (cl && cl < he) bl = strtoul(cl + 15, NULL, 10);
    if (c->len < hl + bl) return;
    const char *resp = decode_resp;
    size_t rl = decode_resp_len;
    if (!strncmp(c->buf, "GET /health", 11)) {
      resp = health_resp;
      rl = health_resp_len;
    } else if (memmem(c->buf + hl, bl, "\"do_remote_decode\":true", 23)) {
      resp = prefill_resp;
      rl = prefill_resp_len;
    }
    if (send(fd, resp, rl, MSG_NOSIGNAL) != (ssize_t)rl) { /* small replies: all or nothing here */
      event_free(c->ev);
      close(fd);
      free(c);
      return;
    }
    memmove(c->buf, c->buf + hl + bl, c->len - hl - bl);
    c->len -= hl + bl;
  }
}

static void fx_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int sl, void *arg) {
  (void)l;
  (void)sa;
  (void)sl;
  fixture *f = arg;
  fxconn *c = calloc(1, sizeof *c);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  evutil_make_socket_nonblocking(fd);
  c->fd = fd;
  c->ev = event_new(f->base, fd, EV_READ | EV_PERSIST, fx_read, c);
  event_add(c->ev, NULL);
}

static void *fx_run(void *arg) {
  pthread_setname_np(pthread_self(), "fixture");
  event_base_dispatch(((fixture *)arg)->base);
  return NULL;
}

static int fx_start(fixture *f) {
  prefill_resp_len = (size_t)snprintf(prefill_resp, sizeof prefill_resp,
                                      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                                      sizeof PREFILL_REPLY - 1, PREFILL_REPLY);
  decode_resp_len = (size_t)snprintf(decode_resp, sizeof decode_resp,
                                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                                     sizeof DECODE_REPLY - 1, DECODE_REPLY);
  health_resp_len = (size_t)snprintf(health_resp, sizeof health_resp, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  f->base = event_base_new();
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  f->lis = evconnlistener_new_bind(f->base, fx_accept, f, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 128,
                                   (struct sockaddr *)&sa, sizeof sa);
  if (!f->lis) return -1;
  socklen_t sl = sizeof sa;
  getsockname(evconnlistener_get_fd(f->lis), (struct sockaddr *)&sa, &sl);
  f->port = ntohs(sa.sin_port);
  return pthread_create(&f->th, NULL, fx_run, f);
}

/* ---- router --------------------------------------------------------------- */

typedef struct router {
  eldr_server *s;
  pthread_t th;
} router;

static void *rt_run(void *arg) {
  pthread_setname_np(pthread_self(), "router");
  eldr_server_run(((router *)arg)->s);
  return NULL;
}

/* ---- load generator ------------------------------------------------------- */

typedef struct conn {
  int fd;
  int step;      /* mode 2: 0 = prefill leg, 1 = decode leg */
  double t0;
  char buf[8192];
  size_t len;
} conn;

/* The completion request: a prompt of prompt_tokens stand-in tokens
 * ("w0 w1 ...", one token a word for the router's tokenizer), so that the
 * router hashes its 16-token blocks as it does a real prompt's. */
static char body[16384], body_prefill[16384];
static size_t body_len, body_prefill_len;

static int make_bodies(int prompt_tokens) {
  char prompt[12288];
  size_t off = 0;
  for (int i = 0; i < prompt_tokens; i++) {
    int w = snprintf(prompt + off, sizeof prompt - off, "w%d ", i);
    if (w < 0 || (size_t)w >= sizeof prompt - off) return -1;
    off += (size_t)w;
  }
  if (eldr_tokenize(prompt, off, NULL, 0) != (size_t)prompt_tokens) return -1;
  int n = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"%s\",\"max_tokens\":16,\"temperature\":0}", prompt);
  int m = snprintf(body_prefill, sizeof body_prefill,
                   "{\"model\":\"m\",\"prompt\":\"%s\",\"max_tokens\":1,\"temperature\":0,\"stream\":false,"
                   "\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                   "\"remote_engine_id\":null,\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}}",
                   prompt);
  if (n < 0 || (size_t)n >= sizeof body || m < 0 || (size_t)m >= sizeof body_prefill) return -1;
  body_len = (size_t)n;
  body_prefill_len = (size_t)m;
  return 0;
}

static char req_plain[17000], req_prefill[17000];
static size_t req_plain_len, req_prefill_len;

static void send_req(conn *c, int mode) {
  const char *r = (mode == 2 && c->step == 0) ? req_prefill : req_plain;
  size_t n = (mode == 2 && c->step == 0) ? req_prefill_len : req_plain_len;
  size_t off = 0;
  while (off < n) {
    ssize_t w = send(c->fd, r + off, n - off, MSG_NOSIGNAL);
    if (w <= 0) {
      if (errno == EINTR) continue;
      perror("send");
      exit(1);
    }
    off += (size_t)w;
  }
}

/* One complete response in c->buf? Returns its length or 0. */
static size_t complete(conn *c, int *status) {
  c->buf[c->len] = 0;
  char *he = strstr(c->buf, "\r\n\r\n");
  if (!he) return 0;
  char *cl = strcasestr(c->buf, "Content-Length:");
  if (!cl || cl > he) {
    fprintf(stderr, "response without Content-Length\n");
    exit(1);
  }
  size_t total = (size_t)(he - c->buf) + 4 + strtoul(cl + 15, NULL, 10);
  if (c->len < total) return 0;
  *status = atoi(c->buf + 9);
  return total;
}

typedef struct result {
  double rps, p50, p99, p999;
  size_t n, errors;
} result;

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* heap allocations of the router loop so far, when bench/malloc_count.c is
 * preloaded (NULL: it is not) */
static unsigned long (*malloc_count)(void);
static unsigned long mc_warm; /* malloc_count() when the last load's warm-up ended */

/* mode 1: one request per exchange; mode 2: prefill leg then decode leg */
static result load(int port, int nconn, double duration, int mode) {
  conn *cs = calloc((size_t)nconn, sizeof *cs);
  struct pollfd *pf = calloc((size_t)nconn, sizeof *pf);
  size_t cap = 1 << 22, n = 0, errors = 0;
  double *lat = malloc(cap * sizeof *lat);
  for (int i = 0; i < nconn; i++) {
    cs[i].fd = bench_connect_loopback(port);
    if (cs[i].fd < 0) {
      perror("connect");
      exit(1);
    }
    pf[i].fd = cs[i].fd;
    pf[i].events = POLLIN;
  }
  double start = eldr_clock_now(), end = start + duration, warm = start + duration * 0.1;
  size_t n_warm = 0;
  for (int i = 0; i < nconn; i++) {
    cs[i].t0 = eldr_clock_now();
    send_req(&cs[i], mode);
  }
  while (eldr_clock_now() < end) {
    int pr = poll(pf, (nfds_t)nconn, 100);
    if (pr <= 0) continue;
    for (int i = 0; i < nconn; i++) {
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      conn *c = &cs[i];
      ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len - 1, 0);
      if (r <= 0) {
        fprintf(stderr, "connection closed by the server\n");
        exit(1);
      }
      c->len += (size_t)r;
      int status;
      size_t used;
      while ((used = complete(c, &status)) > 0) {
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
        if (status != 200) errors++;
        if (mode == 2 && c->step == 0) {
          c->step = 1;
          send_req(c, mode);
          continue;
        }
        double t = eldr_clock_now();
        if (t >= warm) {
          if (!n_warm) {
            n_warm = n;
            if (malloc_count) mc_warm = malloc_count();
          }
          if (n < cap) lat[n++] = t - c->t0;
        } else {
          n++;
        }
        c->step = 0;
        c->t0 = t;
        send_req(c, mode);
      }
    }
  }
  double el = eldr_clock_now() - warm;
  result res = {0};
  size_t m = n - n_warm;
  res.rps = (double)m / el;
  qsort(lat + n_warm, m, sizeof *lat, cmpd);
  res.p50 = lat[n_warm + m / 2];
  res.p99 = lat[n_warm + (size_t)((double)(m - 1) * 0.99)];
  res.p999 = lat[n_warm + (size_t)((double)(m - 1) * 0.999)];
  res.n = m;
  res.errors = errors;
  for (int i = 0; i < nconn; i++) close(cs[i].fd);
  free(cs);
  free(pf);
  free(lat);
  return res;
}

static void row(const char *name, int conns, result r, const result *base) {
  printf("%-9s %5d %10.0f %9.1f %9.1f %9.1f %8zu %6zu", name, conns, r.rps, r.p50 * 1e6, r.p99 * 1e6,
         r.p999 * 1e6, r.n, r.errors);
  if (base) printf("   %5.2fx rps  +%.1f us p50  +%.1f us p99", r.rps / base->rps, (r.p50 - base->p50) * 1e6,
                   (r.p99 - base->p99) * 1e6);
  printf("\n");
  fflush(stdout);
}

int main(int argc, char **argv) {
  double duration = 3;
  int conns = 32;
  int prompt_tokens = 48; /* three 16-token blocks */
  eldr_policy_kind policy = ELDR_POLICY_JSQ;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--duration") && i + 1 < argc) duration = atof(argv[++i]);
    else if (!strcmp(argv[i], "--conns") && i + 1 < argc) conns = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--prompt-tokens") && i + 1 < argc) prompt_tokens = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--policy") && i + 1 < argc) {
      if (eldr_policy_parse(argv[++i], &policy)) {
        fprintf(stderr, "bench_proxy: unknown policy %s\n", argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: bench_proxy [--duration S] [--conns N] [--policy NAME] [--prompt-tokens N]\n");
      return 2;
    }
  }
  if (duration <= 0 || conns < 1 || conns > 1000 || prompt_tokens < 1 || prompt_tokens > 1024) {
    fprintf(stderr, "bench_proxy: bad --duration, --conns or --prompt-tokens (1..1024)\n");
    return 2;
  }
  evthread_use_pthreads();
  malloc_count = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "eldr_mc_router");
  if (make_bodies(prompt_tokens)) {
    fprintf(stderr, "bench_proxy: --prompt-tokens %d: the request does not fit its buffer\n", prompt_tokens);
    return 2;
  }
  req_plain_len = (size_t)snprintf(req_plain, sizeof req_plain,
                                   "POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                                   "Content-Length: %zu\r\n\r\n%s", body_len, body);
  req_prefill_len = (size_t)snprintf(req_prefill, sizeof req_prefill,
                                     "POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                                     "Content-Length: %zu\r\n\r\n%s", body_prefill_len, body_prefill);
  fixture f;
  if (fx_start(&f)) {
    fprintf(stderr, "bench_proxy: cannot start the fixture worker\n");
    return 1;
  }
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", f.port);
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  c.port = 0;
  c.policy = policy;
  c.health_interval_s = 0;
  /* one loop: the thread whose CPU and allocations are counted serves every
   * connection (the default, one loop per core, left a connection that the
   * kernel gave to another loop uncounted: 0.0 us per request at 1 conn) */
  c.threads = 1;
  eldr_serve_config_add_worker(&c, 0, url, NULL);
  eldr_serve_config_add_worker(&c, 1, url, NULL);
  router r;
  eldr_diag d = {{0}};
  if (eldr_server_new(&c, &r.s, &d)) {
    fprintf(stderr, "bench_proxy: %s\n", d.msg);
    return 1;
  }
  int rport = eldr_server_port(r.s);
  pthread_create(&r.th, NULL, rt_run, &r);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  printf("# bench_proxy: %ld CPUs, %.1f s per run (first 10%% warm-up), small non-streaming bodies, policy %s, "
         "prompts of %d tokens (%d blocks)\n",
         ncpu, duration, eldr_policy_name(policy), prompt_tokens, prompt_tokens / ELDR_BLOCK_TOKENS);
  printf("# router threads: 1 event loop; fixture worker: 1 event loop; load generator: 1 thread\n");
  printf("%-9s %5s %10s %9s %9s %9s %8s %6s\n", "target", "conns", "req/s", "p50_us", "p99_us", "p99.9_us", "n", "errors");
  int levels[] = {1, conns};
  for (int li = 0; li < 2; li++) {
    int nc = levels[li];
    result d1 = load(f.port, nc, duration, 1);
    row("direct-1", nc, d1, NULL);
    result d2 = load(f.port, nc, duration, 2);
    row("direct-2", nc, d2, NULL);
    clockid_t cid;
    struct timespec c0, c1;
    pthread_getcpuclockid(r.th, &cid);
    unsigned long (*mc)(void) = malloc_count;
    unsigned long m0 = mc ? mc() : 0;
    clock_gettime(cid, &c0);
    result rr = load(rport, nc, duration, 1);
    clock_gettime(cid, &c1);
    unsigned long m1 = mc ? mc() : 0;
    row("router", nc, rr, &d2);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
    if (rr.n && cpu <= 0) {
      fprintf(stderr, "bench_proxy: the router loop measured used no CPU over %zu requests: another thread "
                      "served them\n", rr.n);
      return 1;
    }
    size_t total = (size_t)((double)rr.n / 0.9 + 0.5); /* the warm-up tenth counts for CPU too */
    printf("%-9s %5s  router loop CPU: %.1f us per request (%.2f cores) -> %.0f req/s per core\n", "", "",
           cpu / (double)total * 1e6, cpu / duration, (double)total / cpu);
    printf("%-9s %5s  router vs direct-1: %.2fx rps, +%.1f us p50\n", "", "", rr.rps / d1.rps, (rr.p50 - d1.p50) * 1e6);
    if (mc) /* the warm-up tenth fills the loop's pools; after it, steady state */
      printf("%-9s %5s  router loop heap allocations: %.1f per request (%lu in all, %lu after the warm-up: "
             "%.4f per request)\n", "", "", (double)(m1 - m0) / (double)total, m1 - m0, m1 - mc_warm,
             (double)(m1 - mc_warm) / (double)rr.n);
  }
  eldr_server_stop(r.s);
  pthread_join(r.th, NULL);
  eldr_server_free(r.s);
  eldr_serve_config_free(&c);
  event_base_loopbreak(f.base);
  pthread_join(f.th, NULL);
  evconnlistener_free(f.lis);
  event_base_free(f.base); /* open fixture connections are left to process exit */
  return 0;
}
