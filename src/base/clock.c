/* clock.c — the monotonic clock. */
#include "eldr/clock.h"

#include <time.h>

double eldr_clock_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
