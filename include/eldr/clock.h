/* eldr/clock.h — the monotonic clock (base layer).
 *
 * Errors: none (CLOCK_MONOTONIC is always available on Linux).
 * Threads: any thread; no state.
 */
#ifndef ELDR_CLOCK_H
#define ELDR_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (arbitrary origin): for intervals, deadlines
 * and timing, never for wall-clock dates. */
double eldr_clock_now(void);

#endif
