/* parallel.c — a parallel-for on pthreads with a shared task counter. */
#include "eldr/parallel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

enum { PAR_MAX_THREADS = 64 };

typedef struct par_job {
  size_t n;
  atomic_size_t next;
  void (*body)(void *ctx, size_t i);
  void *ctx;
} par_job;

static void *par_worker(void *arg) {
  par_job *j = arg;
  for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) j->body(j->ctx, i);
  return NULL;
}

unsigned eldr_parallel_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1u : n > 4096 ? 4096u : (unsigned)n;
}

void eldr_parallel_for(size_t n, unsigned threads, void (*body)(void *ctx, size_t i), void *ctx) {
  if (n == 0) return;
  par_job j = {.n = n, .body = body, .ctx = ctx};
  atomic_init(&j.next, 0);
  size_t nt = threads < 1 ? 1 : threads;
  if (nt > n) nt = n;
  if (nt > PAR_MAX_THREADS) nt = PAR_MAX_THREADS;
  pthread_t tid[PAR_MAX_THREADS];
  size_t started = 0;
  for (size_t t = 1; t < nt; t++) {
    if (pthread_create(&tid[started], NULL, par_worker, &j) != 0) break;
    started++;
  }
  par_worker(&j);
  for (size_t t = 0; t < started; t++) pthread_join(tid[t], NULL);
}
