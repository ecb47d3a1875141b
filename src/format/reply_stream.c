/* reply_stream.c — the payload of a streamed reply's event that carries
 * routed_experts (see eldr/reply_stream.h). */
#define _GNU_SOURCE
#include "eldr/reply_stream.h"

#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"

#define DEFAULT_MAX ((size_t)64 << 20)

void eldr_re_stream_init(eldr_re_stream *s, size_t max) {
  memset(s, 0, sizeof *s);
  s->max = max ? max : DEFAULT_MAX;
}

void eldr_re_stream_free(eldr_re_stream *s) {
  if (!s) return;
  free(s->ev);
  free(s->kept);
  memset(s, 0, sizeof *s);
}

const char *eldr_re_stream_kept(const eldr_re_stream *s, size_t *len) {
  if (len) *len = s->kept ? s->kept_n : 0;
  return s->kept;
}

char *eldr_re_stream_take(eldr_re_stream *s, size_t *len) {
  char *k = s->kept;
  if (len) *len = k ? s->kept_n : 0;
  s->kept = NULL;
  s->kept_n = 0;
  return k;
}

/* Does a JSON payload name routed_experts with a value other than null?
 * (The readers check the value; this only picks the event to keep.) */
static int has_routed_experts(const char *p, size_t n) {
  static const char key[] = "\"routed_experts\"";
  const size_t kn = sizeof key - 1;
  for (const char *q = p, *e = p + n; (size_t)(e - q) >= kn;) {
    const char *hit = memmem(q, (size_t)(e - q), key, kn);
    if (!hit) return 0;
    const char *v = hit + kn;
    while (v < e && (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n')) v++;
    if (v < e && *v == ':') {
      v++;
      while (v < e && (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n')) v++;
      if (v < e && !((size_t)(e - v) >= 4 && !memcmp(v, "null", 4))) return 1;
    }
    q = hit + kn;
  }
  return 0;
}

/* The event ev[0, n) is complete: its data lines joined, kept when they
 * carry routed_experts. The event's buffer is reused for the payload. */
static void event_end(eldr_re_stream *s) {
  s->events++;
  size_t o = 0, i = 0;
  int lines = 0;
  while (i < s->n) {
    const char *ln = s->ev + i, *nl = memchr(ln, '\n', s->n - i);
    size_t len = nl ? (size_t)(nl - ln) : s->n - i;
    i += len + (nl != NULL);
    if (len && ln[len - 1] == '\r') len--;
    if (len < 5 || memcmp(ln, "data:", 5)) continue; /* comments, event:, id:, retry: */
    size_t a = 5 + (len > 5 && ln[5] == ' ');
    if (lines++) s->ev[o++] = '\n';
    memmove(s->ev + o, ln + a, len - a); /* o <= the line's start: in place */
    o += len - a;
  }
  if (lines && has_routed_experts(s->ev, o)) {
    char *k = malloc(o + 1);
    if (k) {
      memcpy(k, s->ev, o);
      k[o] = '\0';
      free(s->kept);
      s->kept = k;
      s->kept_n = o;
    } else {
      s->dropped++;
    }
  }
  s->n = s->line = 0;
}

void eldr_re_stream_feed(eldr_re_stream *s, const char *p, size_t n) {
  while (n) {
    const char *nl = memchr(p, '\n', n);
    const size_t take = nl ? (size_t)(nl - p) + 1 : n;
    if (s->skipping) {
      /* an event over max: only its end matters (an empty line: nothing, or
       * one "\r", before its "\n"); line: 0 empty so far, 1 one "\r", 2 more */
      for (size_t k = 0; k < take; k++) {
        if (p[k] == '\n') {
          if (s->line < 2) {
            s->skipping = 0;
            s->n = 0;
          }
          s->line = 0;
        } else {
          s->line = p[k] == '\r' && s->line == 0 ? 1 : 2;
        }
      }
      p += take;
      n -= take;
      continue;
    }
    if (s->n + take > s->max || eldr_grow(&s->ev, &s->cap, s->n + take, 1, 4096)) {
      s->dropped++;
      s->skipping = 1;
      /* the line in progress so far, as the skipping state counts it */
      const size_t ll = s->n - s->line;
      s->line = ll == 0 ? 0 : ll == 1 && s->ev[s->line] == '\r' ? 1 : 2;
      s->n = 0;
      continue; /* these bytes again, skipping */
    }
    memcpy(s->ev + s->n, p, take);
    s->n += take;
    p += take;
    n -= take;
    if (nl) {
      const size_t len = s->n - 1 - s->line; /* the line just ended, without '\n' */
      const int empty = len == 0 || (len == 1 && s->ev[s->line] == '\r');
      if (empty) {
        s->n = s->line; /* the blank line is not part of the event */
        if (s->n) event_end(s);
        else s->n = s->line = 0;
      } else {
        s->line = s->n;
      }
    }
  }
}
