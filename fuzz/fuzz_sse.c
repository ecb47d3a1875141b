/* fuzz_sse.c — the load generator's SSE checker (eldr_sse_event), fed with
 * the input split into events at blank lines as the client does. Checks:
 * never crashes, never reads out of bounds, a malformed stream has a
 * message, token counts never exceed the events seen. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/loadgen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  eldr_sse_state st;
  memset(&st, 0, sizeof st);
  size_t i = 0, events = 0;
  while (i < size) {
    const char *e = NULL;
    for (size_t k = i; k + 1 < size; k++)
      if (buf[k] == '\n' && buf[k + 1] == '\n') {
        e = buf + k;
        break;
      }
    size_t len = e ? (size_t)(e - (buf + i)) : size - i;
    /* each event in an exact-size copy */
    char *ev = malloc(len ? len : 1);
    if (!ev) break;
    memcpy(ev, buf + i, len);
    eldr_sse_event(&st, ev, len);
    free(ev);
    events++;
    i += len + (e ? 2 : 0);
  }
  if (st.malformed && !st.error[0]) abort();
  if (st.tokens > events) abort();
  free(buf);
  return 0;
}
