/* uuid.c — random (version 4) UUIDs (see include/eldr/uuid.h). */
#include "eldr/uuid.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>

#include "eldr/error.h"

/* Random bytes for request ids, drawn from getrandom a block at a time
 * (one syscall per RAND_BLOCK / 16 requests, not one per request); per
 * thread, so each loop has its own. */
#define RAND_BLOCK 4096

int eldr_uuid4(char out[ELDR_UUID_LEN + 1]) {
  static _Thread_local uint8_t pool[RAND_BLOCK];
  static _Thread_local size_t left;
  uint8_t b[16];
  if (left < sizeof b) {
    size_t got = 0;
    while (got < sizeof pool) {
      ssize_t n = getrandom(pool + got, sizeof pool - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ELDR_EIO;
      got += (size_t)n;
    }
    left = sizeof pool;
  }
  memcpy(b, pool + sizeof pool - left, sizeof b);
  memset(pool + sizeof pool - left, 0, sizeof b); /* used bytes do not stay behind */
  left -= sizeof b;
  b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
  b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
  static const char hx[] = "0123456789abcdef";
  char *o = out;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) *o++ = '-';
    *o++ = hx[b[i] >> 4];
    *o++ = hx[b[i] & 15];
  }
  *o = 0;
  return 0;
}
