/* trace_json.h — the strict JSON scanning primitives shared by the trace
 * line parsers (trace.c: token form, trace_counts.c: counts form) and the
 * trace writer (serve objects): a line context that names file, line and
 * field in errors, value scanners that validate syntax without building a
 * tree, and small typed value parsers. Internal to src/format; static
 * inline so each parser keeps its hot loops local.
 * Ownership: strings from decode_string are malloc'd for the caller.
 * Threads: pure functions of their arguments. */
#ifndef ELDR_FORMAT_TRACE_JSON_H
#define ELDR_FORMAT_TRACE_JSON_H

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"
#include "eldr/grow.h"
#define MAX_DEPTH 64


/* ------------------------------------------------------------------------ */
/* line parser                                                               */

typedef struct lctx {
  eldr_diag *d;
  const char *src; /* file name, or NULL: "line N" */
  size_t lineno;
  const char *base; /* start of the line: columns in messages */
} lctx;

__attribute__((format(printf, 4, 5))) static inline int lfail(const lctx *c, int err, const char *field,
                                                       const char *fmt, ...) {
  if (!c->d) return err;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char where[160];
  if (c->src)
    snprintf(where, sizeof where, "%s:%zu", c->src, c->lineno);
  else
    snprintf(where, sizeof where, "line %zu", c->lineno);
  if (field)
    eldr_diag_fail(c->d, err, "%s: field '%s': %s", where, field, msg);
  else
    eldr_diag_fail(c->d, err, "%s: %s", where, msg);
  return err;
}

static inline const char *skip_ws(const char *p, const char *e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
  return p;
}

/* Scan a JSON string starting at '"'; returns the position after the
 * closing quote, or NULL if unterminated / contains a raw control char /
 * a bad escape. */
static inline const char *scan_string(const char *p, const char *e) {
  p++;
  while (p < e) {
    unsigned char c = (unsigned char)*p;
    if (c == '"') return p + 1;
    if (c < 0x20) return NULL;
    if (c == '\\') {
      if (p + 1 >= e) return NULL;
      char x = p[1];
      if (x == 'u') {
        if (e - p < 6) return NULL;
        for (int i = 2; i < 6; i++) {
          char h = p[i];
          if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F')))
            return NULL;
        }
        p += 6;
        continue;
      }
      if (!strchr("\"\\/bfnrt", x) || x == 0) return NULL;
      p += 2;
      continue;
    }
    p++;
  }
  return NULL;
}

/* Scan a JSON number; returns the end or NULL. */
static inline const char *scan_number(const char *p, const char *e) {
  if (p < e && *p == '-') p++;
  if (p >= e) return NULL;
  if (*p == '0') {
    p++;
  } else if (*p >= '1' && *p <= '9') {
    while (p < e && *p >= '0' && *p <= '9') p++;
  } else {
    return NULL;
  }
  if (p < e && *p == '.') {
    p++;
    if (p >= e || !(*p >= '0' && *p <= '9')) return NULL;
    while (p < e && *p >= '0' && *p <= '9') p++;
  }
  if (p < e && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < e && (*p == '+' || *p == '-')) p++;
    if (p >= e || !(*p >= '0' && *p <= '9')) return NULL;
    while (p < e && *p >= '0' && *p <= '9') p++;
  }
  return p;
}

static inline const char *scan_literal(const char *p, const char *e, const char *lit) {
  size_t n = strlen(lit);
  if ((size_t)(e - p) < n || memcmp(p, lit, n)) return NULL;
  return p + n;
}

/* An object key and its ':' at p (after '{' or ','); returns the position
 * after ':' or NULL with *why set. */
static inline const char *scan_key_colon(const char *p, const char *e, const char **why) {
  if (p >= e || *p != '"' || !(p = scan_string(p, e))) {
    *why = p && p >= e ? "unexpected end of line (truncated JSON?)" : "expected a string key";
    return NULL;
  }
  p = skip_ws(p, e);
  if (p >= e || *p != ':') {
    *why = p >= e ? "unexpected end of line (truncated JSON?)" : "expected ':'";
    return NULL;
  }
  return p + 1;
}

/* Scan any JSON value (iteratively for containers, depth-limited).
 * Returns the end, or NULL with *why set. */
static inline const char *scan_value(const char *p, const char *e, const char **why) {
  char stack[MAX_DEPTH];
  int depth = 0;
  for (;;) {
    /* expect a value at p */
    p = skip_ws(p, e);
    if (p >= e) {
      *why = "unexpected end of line (truncated JSON?)";
      return NULL;
    }
    const char *q;
    switch (*p) {
    case '"': q = scan_string(p, e); if (!q) *why = "invalid or unterminated string"; break;
    case 't': q = scan_literal(p, e, "true"); if (!q) *why = "invalid literal"; break;
    case 'f': q = scan_literal(p, e, "false"); if (!q) *why = "invalid literal"; break;
    case 'n': q = scan_literal(p, e, "null"); if (!q) *why = "invalid literal"; break;
    case '[':
    case '{': {
      if (depth >= MAX_DEPTH) {
        *why = "nesting too deep";
        return NULL;
      }
      char open = *p;
      stack[depth++] = open;
      p = skip_ws(p + 1, e);
      if (p < e && *p == (open == '[' ? ']' : '}')) {
        depth--;
        q = p + 1;
        break;
      }
      if (open == '{' && !(p = scan_key_colon(p, e, why))) return NULL;
      continue; /* parse the first element */
    }
    default: q = scan_number(p, e); if (!q) *why = "invalid value"; break;
    }
    if (!q) return NULL;
    p = q;
    /* after a value: close containers or go to the next element */
    for (;;) {
      if (depth == 0) return p;
      p = skip_ws(p, e);
      if (p >= e) {
        *why = "unexpected end of line (truncated JSON?)";
        return NULL;
      }
      char open = stack[depth - 1];
      char close = open == '[' ? ']' : '}';
      if (*p == close) {
        depth--;
        p++;
        continue;
      }
      if (*p != ',') {
        *why = open == '[' ? "expected ',' or ']'" : "expected ',' or '}'";
        return NULL;
      }
      p = skip_ws(p + 1, e);
      if (open == '{' && !(p = scan_key_colon(p, e, why))) return NULL;
      break; /* parse the next value */
    }
  }
}

/* Fast end-of-value finder for the big numeric arrays (prefill, decode,
 * prefill_gates): bracket counting is exact when the value holds only
 * numbers, brackets, commas and whitespace. Anything else (a string, an
 * object...) returns NULL and the caller falls back to scan_value. Syntax
 * is validated later by parse_sel. */
static inline const char *skip_num_array(const char *p, const char *e) {
  static const unsigned char ok[256] = {
      [' '] = 1, ['\t'] = 1, ['\r'] = 1, ['\n'] = 1, [','] = 1, ['-'] = 1, ['+'] = 1,
      ['.'] = 1, ['e'] = 1,  ['E'] = 1,  ['0'] = 1,  ['1'] = 1, ['2'] = 1, ['3'] = 1,
      ['4'] = 1, ['5'] = 1,  ['6'] = 1,  ['7'] = 1,  ['8'] = 1, ['9'] = 1, ['['] = 2,
      [']'] = 3};
  if (p >= e || *p != '[') return NULL;
  long depth = 0;
  for (; p < e; p++) {
    switch (ok[(unsigned char)*p]) {
    case 1: continue;
    case 2: depth++; continue;
    case 3:
      if (--depth == 0) return p + 1;
      continue;
    default: return NULL;
    }
  }
  return NULL;
}

typedef struct span {
  const char *p, *e; /* NULL when absent */
} span;

/* Decode a JSON string token [p, e) with jansson into a malloc'd C string. */
static inline int decode_string(const lctx *c, const char *field, span s, char **out) {
  if (*s.p != '"') return lfail(c, ELDR_EPARSE, field, "expected a string");
  /* fast path: no escapes, plain ASCII */
  bool plain = true;
  for (const char *q = s.p + 1; q < s.e - 1; q++)
    if (*q == '\\' || (unsigned char)*q >= 0x80) {
      plain = false;
      break;
    }
  if (plain) {
    size_t n = (size_t)(s.e - s.p) - 2;
    char *r = malloc(n + 1);
    if (!r) return ELDR_ENOMEM;
    memcpy(r, s.p + 1, n);
    r[n] = '\0';
    *out = r;
    return ELDR_OK;
  }
  json_error_t jerr;
  json_t *j = json_loadb(s.p, (size_t)(s.e - s.p), JSON_DECODE_ANY, &jerr);
  if (!j || !json_is_string(j)) {
    json_decref(j);
    return lfail(c, ELDR_EPARSE, field, "invalid string (%s)", jerr.text);
  }
  const char *v = json_string_value(j);
  size_t n = json_string_length(j);
  if (strlen(v) != n) {
    json_decref(j);
    return lfail(c, ELDR_EPARSE, field, "string contains a NUL character");
  }
  char *r = malloc(n + 1);
  if (!r) {
    json_decref(j);
    return ELDR_ENOMEM;
  }
  memcpy(r, v, n + 1);
  json_decref(j);
  *out = r;
  return ELDR_OK;
}

/* A non-negative JSON integer (no fraction/exponent), at most max. */
static inline int parse_uint(const lctx *c, const char *field, span s, uint64_t max, uint64_t *out) {
  *out = 0;
  const int shown = (int)(s.e - s.p > 40 ? 40 : s.e - s.p);
  if (scan_number(s.p, s.e) != s.e)
    return lfail(c, ELDR_EPARSE, field, "expected an integer, got %.*s", shown, s.p);
  const size_t n = (size_t)(s.e - s.p);
  if (memchr(s.p, '.', n) || memchr(s.p, 'e', n) || memchr(s.p, 'E', n))
    return lfail(c, ELDR_EPARSE, field, "expected an integer, got %.*s", shown, s.p);
  if (*s.p == '-') return lfail(c, ELDR_ERANGE, field, "negative value %.*s", shown, s.p);
  uint64_t v = 0;
  for (const char *p = s.p; p < s.e; p++) {
    v = v * 10 + (uint64_t)(*p - '0');
    if (v > max)
      return lfail(c, ELDR_ERANGE, field, "value %.*s out of range (max %llu)", shown, s.p,
                   (unsigned long long)max);
  }
  *out = v;
  return ELDR_OK;
}

/* A finite JSON number as double (float when as_float). */
static inline int parse_real(const char **pp, const char *e, double *out, bool as_float) {
  const char *p = *pp;
  const char *q = scan_number(p, e);
  if (!q) return ELDR_EPARSE;
  size_t n = (size_t)(q - p);
  char buf[80];
  if (n >= sizeof buf) return ELDR_ERANGE;
  memcpy(buf, p, n);
  buf[n] = '\0';
  char *end;
  errno = 0;
  double v = as_float ? (double)strtof(buf, &end) : strtod(buf, &end);
  if (end != buf + n) return ELDR_EPARSE;
  if (!isfinite(v)) return ELDR_ERANGE;
  *out = v;
  *pp = q;
  return ELDR_OK;
}

/* Growable buffer of elements of size esz. */
typedef struct gbuf {
  void *p;
  size_t n, cap, esz;
} gbuf;

static inline int gbuf_reserve(gbuf *b, size_t more) {
  if (more > SIZE_MAX - b->n) return ELDR_ENOMEM;
  return eldr_grow(&b->p, &b->cap, b->n + more, b->esz, 1024);
}

static inline bool is_null(span s) { return s.p && s.e - s.p == 4 && !memcmp(s.p, "null", 4); }

/* Whether [p, p+n) is exactly one JSON object (white space around it allowed). */
static inline bool text_is_json_object(const char *p, size_t n) {
  const char *e = p + n, *why = NULL;
  p = skip_ws(p, e);
  if (p >= e || *p != '{') return false;
  const char *q = scan_value(p, e, &why);
  return q && skip_ws(q, e) == e;
}

#endif
