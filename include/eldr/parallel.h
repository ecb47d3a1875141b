/* eldr/parallel.h — parallel-for over independent tasks (base layer).
 *
 * eldr_parallel_for runs body(ctx, i) once for every i in [0, n), on up to
 * `threads` threads, the calling thread being one of them; tasks are
 * claimed in increasing i from a shared counter. It returns when every task
 * has run. When a thread cannot be started the others (at least the caller)
 * run its tasks, so a result never depends on how many threads started:
 * bodies write to per-task slots (or lock what they share) and the caller
 * merges in index order afterwards.
 *
 * Ownership: ctx is borrowed for the call. Errors: none (tasks report their
 * own through ctx). Threads: body runs concurrently on several threads.
 */
#ifndef ELDR_PARALLEL_H
#define ELDR_PARALLEL_H

#include <stddef.h>

/* Online cores (at least 1): the default thread count of callers. */
unsigned eldr_parallel_cores(void);

void eldr_parallel_for(size_t n, unsigned threads, void (*body)(void *ctx, size_t i), void *ctx);

#endif
