/* demo_drift.h — `eldr demo --drift` (demo_drift.c), run by cmd_demo.c with
 * its flags, work directory and cluster supervisor. */
#ifndef ELDR_CLI_DEMO_DRIFT_H
#define ELDR_CLI_DEMO_DRIFT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/cluster.h"

typedef struct demo_drift_opts {
  const char *model, *hardware, *workload, *plot, *dir, *log_path;
  long P, D, max_seqs, n_fit, max_decode;
  double rate, scale, duration; /* req/s of model time, time scale, wall seconds of arrivals */
  uint64_t seed;
  int json;
  eldr_cluster *cluster;
  const volatile int *stop;
} demo_drift_opts;

/* Runs the drift demo and prints its table (or JSON) on stdout; 0, or 1
 * when the plot could not be written. Fails through demo_fail. */
int demo_drift_run(const demo_drift_opts *o);

/* cmd_demo.c: print "eldr demo: <msg>", stop every child, exit 1. */
_Noreturn void demo_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
