/* fuzz_reply_stream.c — libFuzzer target for the stream collector a
 * decoder's SSE stream drives (eldr/reply_stream.h: the router keeps the
 * event carrying routed_experts for the recorder and live rho).
 *
 * The input is fed whole, byte by byte, and in pieces whose sizes the
 * input's own bytes choose, with a small event bound (so the skipping path
 * runs) and the default one: the kept payload must not depend on how the
 * bytes were split, must contain "routed_experts" when kept, and must be
 * NUL-terminated at its length; the event count must agree. Else abort. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/reply_stream.h"

static void feed(eldr_re_stream *s, const uint8_t *d, size_t n, int how) {
  if (how == 0) {
    eldr_re_stream_feed(s, (const char *)d, n);
  } else if (how == 1) {
    for (size_t i = 0; i < n; i++) eldr_re_stream_feed(s, (const char *)d + i, 1);
  } else {
    size_t i = 0, k = 0;
    while (i < n) {
      size_t step = 1 + d[k++ % n] % 37;
      if (step > n - i) step = n - i;
      eldr_re_stream_feed(s, (const char *)d + i, step);
      i += step;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const size_t maxes[2] = {64, 0};
  for (int m = 0; m < 2; m++) {
    eldr_re_stream ref;
    eldr_re_stream_init(&ref, maxes[m]);
    feed(&ref, data, size, 0);
    size_t rn;
    const char *rk = eldr_re_stream_kept(&ref, &rn);
    if (rk && (rk[rn] != '\0' || !memmem(rk, rn, "\"routed_experts\"", 16))) abort();
    for (int how = 1; how < 3; how++) {
      eldr_re_stream s;
      eldr_re_stream_init(&s, maxes[m]);
      feed(&s, data, size, how);
      size_t kn;
      const char *k = eldr_re_stream_kept(&s, &kn);
      if (!k != !rk || (k && (kn != rn || memcmp(k, rk, kn)))) abort();
      if (s.events != ref.events || s.dropped != ref.dropped) abort();
      size_t tn;
      char *t = eldr_re_stream_take(&s, &tn);
      if ((t != NULL) != (k != NULL) || eldr_re_stream_kept(&s, NULL)) abort();
      free(t);
      eldr_re_stream_free(&s);
    }
    eldr_re_stream_free(&ref);
  }
  return 0;
}
