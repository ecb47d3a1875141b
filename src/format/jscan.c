/* jscan.c — one validating pass over a JSON document that records the
 * spans of a few wanted paths (jscan.h). An explicit stack (no recursion),
 * strings scanned 16 bytes at a time for the bytes that need a look
 * ('"', '\\', controls, non-ASCII), 64 at a time with AVX2 or NEON on long
 * runs (jscan_avx2.c, jscan_neon.c, where eldr/cpu.h allows: ELDR_NO_SIMD=1
 * leaves the 16-byte loop only, a byte loop without SSE2). */
#include "eldr/jscan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "eldr/cpu.h"
#include "jscan_int.h"

typedef struct want {
  const char *key[ELDR_JS_MAX_PATH]; /* NULL: an array index */
  size_t klen[ELDR_JS_MAX_PATH];
  size_t idx[ELDR_JS_MAX_PATH];
  size_t len;
} want;

typedef struct frame {
  uint32_t deeper;  /* wanted paths through this container */
  uint32_t target;  /* wanted paths that end at this container */
  uint32_t child;   /* of deeper: the paths through the member being read */
  uint8_t is_obj;
  size_t idx;       /* array: elements so far */
  size_t start;
} frame;

typedef struct scanner {
  const char *p;
  size_t n, i;
  const want *w;
  eldr_js_span *found;
  eldr_diag *d;
} scanner;

static int fail(scanner *s, const char *what) {
  return eldr_diag_fail(s->d, ELDR_EPARSE, "invalid JSON at byte %zu: %s", s->i, what);
}

static inline __attribute__((always_inline)) void skip_ws(scanner *s) {
  while (s->i < s->n) {
    char c = s->p[s->i];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
    s->i++;
  }
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* \uXXXX at p (pointing at the 'u'), n bytes available; -1 when malformed. */
static int32_t u_escape(const char *p, size_t n) {
  if (n < 5) return -1;
  int32_t v = 0;
  for (int k = 1; k <= 4; k++) {
    int h = hexval(p[k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

/* One UTF-8 sequence at p[0..n) (p[0] >= 0x80): its length, or 0 when it
 * is not well-formed (overlong, surrogate, above U+10FFFF, truncated). */
static size_t utf8_len(const unsigned char *p, size_t n) {
  unsigned c = p[0];
  size_t k;
  uint32_t v;
  if (c >= 0xC2 && c <= 0xDF) k = 2, v = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) k = 3, v = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) k = 4, v = c & 0x07;
  else return 0;
  if (n < k) return 0;
  for (size_t j = 1; j < k; j++) {
    if ((p[j] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (p[j] & 0x3F);
  }
  if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || (k == 3 && v < 0x800) || (k == 4 && v < 0x10000)) return 0;
  return k;
}

/* Index of the first byte at or after i that is '"', '\\', < 0x20 or
 * >= 0x80 (n when none). */
static size_t next_special(const char *p, size_t i, size_t n) {
#ifdef ELDR_JS_X86
  if (n - i >= 256 && eldr_cpu_has(ELDR_CPU_AVX2)) {
    i = eldr__js_special_avx2(p, i, n);
    if (i + 64 <= n) return i; /* found within the vectors */
  }
#endif
#ifdef ELDR_JS_NEON
  if (n - i >= 256 && eldr_cpu_has(ELDR_CPU_NEON)) {
    i = eldr__js_special_neon(p, i, n);
    if (i + 64 <= n) return i; /* found within the vectors */
  }
#endif
#ifdef __SSE2__
  const __m128i q = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\'), sp = _mm_set1_epi8(0x20);
  while (i + 16 <= n) {
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(p + i));
    /* signed compare: bytes >= 0x80 are negative, so below 0x20 too */
    __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(b, q), _mm_cmpeq_epi8(b, bs)), _mm_cmplt_epi8(b, sp));
    unsigned bits = (unsigned)_mm_movemask_epi8(m);
    if (bits) return i + (size_t)__builtin_ctz(bits);
    i += 16;
  }
#endif
  for (; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) return i;
  }
  return n;
}

/* A string whose opening quote is at s->i; leaves s->i after the closing
 * quote. */
static int scan_string(scanner *s) {
  const char *p = s->p;
  size_t n = s->n, i = s->i + 1;
  for (;;) {
    i = next_special(p, i, n);
    if (i >= n) {
      s->i = n;
      return fail(s, "unterminated string");
    }
    unsigned char c = (unsigned char)p[i];
    if (c == '"') {
      s->i = i + 1;
      return 0;
    }
    if (c == '\\') {
      if (i + 1 >= n) break;
      char e = p[i + 1];
      if (e == 'u') {
        int32_t v = u_escape(p + i + 1, n - i - 1);
        if (v < 0) break;
        if (v == 0) {
          s->i = i;
          return fail(s, "\\u0000 in a string");
        }
        i += 6;
        if (v >= 0xDC00 && v <= 0xDFFF) {
          s->i = i - 6;
          return fail(s, "lone low surrogate");
        }
        if (v >= 0xD800 && v <= 0xDBFF) {
          int32_t v2 = i + 1 < n && p[i] == '\\' && p[i + 1] == 'u' ? u_escape(p + i + 1, n - i - 1) : -1;
          if (v2 < 0xDC00 || v2 > 0xDFFF) {
            s->i = i - 6;
            return fail(s, "high surrogate without a low one");
          }
          i += 6;
        }
        continue;
      }
      if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't') break;
      i += 2;
      continue;
    }
    if (c < 0x20) {
      s->i = i;
      return fail(s, "control character in a string");
    }
    size_t k = utf8_len((const unsigned char *)p + i, n - i);
    if (!k) {
      s->i = i;
      return fail(s, "invalid UTF-8");
    }
    i += k;
  }
  s->i = i;
  return fail(s, "invalid escape");
}

/* Does a real number's text overflow a double (as strtod reports it)? */
static int real_overflows(const char *p, size_t len, int *nomem) {
  char small[128];
  char *b = len < sizeof small ? small : malloc(len + 1);
  if (!b) {
    *nomem = 1;
    return 1;
  }
  memcpy(b, p, len);
  b[len] = 0;
  errno = 0;
  double x = strtod(b, NULL);
  int over = errno == ERANGE && (x == HUGE_VAL || x == -HUGE_VAL);
  if (b != small) free(b);
  return over;
}

static int scan_number(scanner *s, eldr_js_type *t) {
  const char *p = s->p;
  size_t n = s->n, i = s->i, start = i;
  int neg = 0;
  if (p[i] == '-') neg = 1, i++;
  if (i >= n || p[i] < '0' || p[i] > '9') {
    s->i = i;
    return fail(s, "invalid number");
  }
  uint64_t mag = 0;
  int big = 0;
  if (p[i] == '0') {
    i++;
    if (i < n && p[i] >= '0' && p[i] <= '9') {
      s->i = i;
      return fail(s, "leading zero in a number");
    }
  } else {
    while (i < n && p[i] >= '0' && p[i] <= '9') {
      unsigned dgt = (unsigned)(p[i] - '0');
      if (mag > (UINT64_MAX - dgt) / 10) big = 1;
      else mag = mag * 10 + dgt;
      i++;
    }
  }
  int real = 0;
  if (i < n && p[i] == '.') {
    i++;
    if (i >= n || p[i] < '0' || p[i] > '9') {
      s->i = i;
      return fail(s, "digit expected after '.'");
    }
    while (i < n && p[i] >= '0' && p[i] <= '9') i++;
    real = 1;
  }
  if (i < n && (p[i] == 'e' || p[i] == 'E')) {
    i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    if (i >= n || p[i] < '0' || p[i] > '9') {
      s->i = i;
      return fail(s, "digit expected in an exponent");
    }
    while (i < n && p[i] >= '0' && p[i] <= '9') i++;
    real = 1;
  }
  if (!real) {
    if (big || mag > (uint64_t)INT64_MAX + (uint64_t)neg) return fail(s, "integer out of the int64 range");
    *t = ELDR_JS_INTEGER;
  } else {
    int nomem = 0;
    if (real_overflows(p + start, i - start, &nomem))
      return nomem ? eldr_diag_fail(s->d, ELDR_ENOMEM, "out of memory") : fail(s, "real number overflow");
    *t = ELDR_JS_REAL;
  }
  s->i = i;
  return 0;
}

static int scan_literal(scanner *s, eldr_js_type *t) {
  static const char *const lit[3] = {"true", "false", "null"};
  static const eldr_js_type ty[3] = {ELDR_JS_TRUE, ELDR_JS_FALSE, ELDR_JS_NULL};
  size_t j = s->i;
  while (j < s->n && ((s->p[j] >= 'a' && s->p[j] <= 'z') || (s->p[j] >= 'A' && s->p[j] <= 'Z'))) j++;
  for (int k = 0; k < 3; k++)
    if (j - s->i == strlen(lit[k]) && !memcmp(s->p + s->i, lit[k], j - s->i)) {
      s->i = j;
      *t = ty[k];
      return 0;
    }
  return fail(s, "invalid literal");
}

/* A key's raw bytes (between its quotes) against a name without escapes
 * or quotes: equal bytes, or (only when longer: an escape always decodes
 * to fewer bytes than it takes) equal once decoded. */
static int key_eq_raw(const char *raw, size_t rawlen, const char *name, size_t nlen) {
  if (rawlen <= nlen) return rawlen == nlen && !memcmp(raw, name, nlen);
  if (!memchr(raw, '\\', rawlen)) return 0;
  char buf[256];
  size_t len;
  eldr_js_span sp = {0, rawlen + 2, ELDR_JS_STRING};
  if (nlen > sizeof buf || eldr_js_string(raw - 1, sp, buf, sizeof buf, &len)) return 0;
  return len == nlen && !memcmp(buf, name, nlen);
}

/* Of the paths in mask (all of length > L), those whose component L
 * matches the member: key (raw bytes between the quotes) or index. */
static uint32_t match(const want *w, uint32_t mask, size_t L, const char *key, size_t klen, size_t idx) {
  uint32_t out = 0;
  int esc = -1; /* the key has an escape: looked up once, when a longer key needs it */
  while (mask) {
    int b = __builtin_ctz(mask);
    mask &= mask - 1;
    const want *x = &w[b];
    int ok;
    if (!key) {
      ok = !x->key[L] && x->idx[L] == idx;
    } else if (!x->key[L] || klen < x->klen[L]) {
      ok = 0;
    } else if (klen == x->klen[L]) {
      ok = !memcmp(key, x->key[L], klen);
    } else {
      if (esc < 0) esc = memchr(key, '\\', klen) != NULL;
      ok = esc && key_eq_raw(key, klen, x->key[L], x->klen[L]);
    }
    if (ok) out |= 1u << b;
  }
  return out;
}

static void record(scanner *s, uint32_t bits, size_t start, size_t end, eldr_js_type t) {
  while (bits) {
    int b = __builtin_ctz(bits);
    bits &= bits - 1;
    s->found[b] = (eldr_js_span){start, end - start, t};
  }
}

/* The paths of bits: those ending at the level below L + 1 (targets) and
 * those going deeper. */
static void split(const want *w, uint32_t bits, size_t level, uint32_t *target, uint32_t *deeper) {
  *target = *deeper = 0;
  while (bits) {
    int b = __builtin_ctz(bits);
    bits &= bits - 1;
    if (w[b].len == level) *target |= 1u << b;
    else *deeper |= 1u << b;
  }
}

static int prepare(const eldr_js_path *paths, size_t np, want *w, eldr_diag *d) {
  if (np > ELDR_JS_MAX_WANT) return eldr_diag_fail(d, ELDR_EINVAL, "at most %d paths per scan", ELDR_JS_MAX_WANT);
  for (size_t k = 0; k < np; k++) {
    size_t L = 0;
    for (; L < ELDR_JS_MAX_PATH && paths[k].c[L]; L++) {
      const char *c = paths[k].c[L];
      if (c[0] == '#') {
        w[k].key[L] = NULL;
        w[k].idx[L] = (size_t)strtoull(c + 1, NULL, 10);
      } else {
        w[k].key[L] = c;
        w[k].klen[L] = strlen(c);
      }
    }
    if (L == 0) return eldr_diag_fail(d, ELDR_EINVAL, "an empty path");
    w[k].len = L;
  }
  return 0;
}

int eldr_js_scan(const char *doc, size_t n, const eldr_js_path *paths, size_t npaths, eldr_js_span *found,
                 eldr_js_span *root, eldr_diag *d) {
  want w[ELDR_JS_MAX_WANT];
  int rc = prepare(paths, npaths, w, d);
  if (rc) return rc;
  for (size_t k = 0; k < npaths; k++) found[k] = (eldr_js_span){0, 0, ELDR_JS_NONE};
  static _Thread_local frame st[ELDR_JS_MAX_DEPTH];
  size_t top = 0; /* open containers */
  scanner s = {doc, n, 0, w, found, d};
  uint32_t all = npaths >= 32 ? UINT32_MAX : (1u << npaths) - 1;
  uint32_t cur = all;    /* paths through the value about to be read */
  size_t level = 0;      /* its path length */
  size_t root_start = 0, last_end = 0;
  eldr_js_type last_t = ELDR_JS_NONE;
  for (;;) {
    /* ---- a value: cur, level describe it ---- */
    skip_ws(&s);
    if (s.i >= n) return fail(&s, top ? "a value expected" : "empty document");
    if (top >= ELDR_JS_MAX_DEPTH) return fail(&s, "nesting too deep");
    uint32_t target, deeper;
    split(w, cur, level, &target, &deeper);
    if (!top) root_start = s.i;
    size_t start = s.i;
    char c = doc[s.i];
    eldr_js_type t = ELDR_JS_NONE;
    if (c == '{' || c == '[') {
      frame *f = &st[top++];
      *f = (frame){deeper, target, 0, c == '{', 0, start};
      s.i++;
      skip_ws(&s);
      if (s.i < n && doc[s.i] == (c == '{' ? '}' : ']')) {
        s.i++;
        top--;
        t = c == '{' ? ELDR_JS_OBJECT : ELDR_JS_ARRAY;
        record(&s, target, start, s.i, t);
        goto after_value;
      }
      if (c == '[') {
        cur = deeper ? match(w, deeper, level, NULL, 0, 0) : 0;
        level++;
        continue;
      }
      level++;
      goto member;
    }
    if (c == '"') {
      rc = scan_string(&s);
      t = ELDR_JS_STRING;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      rc = scan_number(&s, &t);
    } else {
      rc = scan_literal(&s, &t);
    }
    if (rc) return rc;
    record(&s, target, start, s.i, t);
  after_value:
    last_t = t;
    last_end = s.i;
    /* ---- after a value: a separator, a close, or the end ---- */
    for (;;) {
      skip_ws(&s);
      if (!top) {
        if (s.i < n) return fail(&s, "end of document expected");
        if (root) *root = (eldr_js_span){root_start, last_end - root_start, last_t};
        return 0;
      }
      frame *f = &st[top - 1];
      if (s.i >= n) return fail(&s, f->is_obj ? "',' or '}' expected" : "',' or ']' expected");
      char x = doc[s.i++];
      if (x == ',') {
        if (f->is_obj) goto member;
        f->idx++;
        cur = f->deeper ? match(w, f->deeper, level - 1, NULL, 0, f->idx) : 0;
        break; /* the next element */
      }
      if (x != (f->is_obj ? '}' : ']')) {
        s.i--;
        return fail(&s, f->is_obj ? "',' or '}' expected" : "',' or ']' expected");
      }
      top--;
      level--;
      last_t = f->is_obj ? ELDR_JS_OBJECT : ELDR_JS_ARRAY;
      last_end = s.i;
      record(&s, f->target, f->start, s.i, last_t);
    }
    continue;
  member:
    /* ---- an object member: key, ':', then its value ---- */
    {
      frame *f = &st[top - 1];
      skip_ws(&s);
      if (s.i >= n || doc[s.i] != '"') return fail(&s, "a string key expected");
      size_t ks = s.i;
      if ((rc = scan_string(&s))) return rc;
      cur = f->deeper ? match(w, f->deeper, level - 1, doc + ks + 1, s.i - ks - 2, 0) : 0;
      /* a repeated key: what its earlier value held is gone (jansson keeps the last) */
      for (uint32_t b = cur; b; b &= b - 1) found[__builtin_ctz(b)] = (eldr_js_span){0, 0, ELDR_JS_NONE};
      skip_ws(&s);
      if (s.i >= n || doc[s.i] != ':') return fail(&s, "':' expected");
      s.i++;
    }
  }
}

/* ---- readers of an accepted document ---------------------------------------- */

static size_t ws(const char *p, size_t i, size_t end) {
  while (i < end && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
  return i;
}

/* After the string whose opening quote is at i. */
static size_t skip_str(const char *p, size_t i, size_t end) {
  size_t j = i + 1;
  for (;;) {
    const char *q = memchr(p + j, '"', end - j);
    if (!q) return end;
    size_t k = (size_t)(q - p), bs = 0;
    while (k - bs > i + 1 && p[k - 1 - bs] == '\\') bs++;
    if (!(bs & 1)) return k + 1;
    j = k + 1;
  }
}

/* After the value starting at i; a string at koff (klen > 0: a known
 * string, eldr_js_iter_known) ends at koff + klen, unread, wherever it
 * lies in the value. */
static size_t skip_value(const char *p, size_t i, size_t end, eldr_js_type *t, size_t koff, size_t klen) {
  char c = p[i];
  if (c == '"') {
    *t = ELDR_JS_STRING;
    return klen && i == koff ? koff + klen : skip_str(p, i, end);
  }
  if (c == '{' || c == '[') {
    *t = c == '{' ? ELDR_JS_OBJECT : ELDR_JS_ARRAY;
    size_t depth = 0;
    for (size_t j = i; j < end; j++) {
      char x = p[j];
      if (x == '"') j = (klen && j == koff ? koff + klen : skip_str(p, j, end)) - 1;
      else if (x == '{' || x == '[') depth++;
      else if ((x == '}' || x == ']') && --depth == 0) return j + 1;
    }
    return end;
  }
  *t = c == 't' ? ELDR_JS_TRUE : c == 'f' ? ELDR_JS_FALSE : c == 'n' ? ELDR_JS_NULL : ELDR_JS_INTEGER;
  size_t j = i;
  while (j < end && p[j] != ',' && p[j] != '}' && p[j] != ']' && p[j] != ' ' && p[j] != '\t' && p[j] != '\n' &&
         p[j] != '\r') {
    if (*t == ELDR_JS_INTEGER && (p[j] == '.' || p[j] == 'e' || p[j] == 'E')) *t = ELDR_JS_REAL;
    j++;
  }
  return j;
}

/* Inside a container span of the given type (else an empty walk). */
static void iter_open(eldr_js_iter *it, const char *doc, eldr_js_span c, eldr_js_type type) {
  it->doc = doc;
  it->pos = c.type == type ? c.off + 1 : c.off;
  it->end = c.type == type ? c.off + c.len - 1 : c.off; /* before the closing bracket */
  it->known_off = it->known_len = 0;
}

void eldr_js_iter_known(eldr_js_iter *it, eldr_js_span s) {
  if (s.type != ELDR_JS_STRING || s.len < 2) return;
  it->known_off = s.off;
  it->known_len = s.len;
}

/* After the value starting at i (the known string, alone or inside it,
 * not read). */
static size_t iter_skip(const eldr_js_iter *it, size_t i, eldr_js_type *t) {
  const int k = it->known_len && it->known_off >= i && it->known_off + it->known_len <= it->end;
  return skip_value(it->doc, i, it->end, t, it->known_off, k ? it->known_len : 0);
}

/* Where the next item starts (past a separating ','), or it->end. */
static size_t iter_item(eldr_js_iter *it) {
  const char *p = it->doc;
  size_t i = ws(p, it->pos, it->end);
  if (i < it->end && p[i] == ',') i = ws(p, i + 1, it->end);
  if (i >= it->end) it->pos = it->end;
  return i < it->end ? i : it->end;
}

void eldr_js_iter_init(eldr_js_iter *it, const char *doc, eldr_js_span obj) { iter_open(it, doc, obj, ELDR_JS_OBJECT); }

int eldr_js_next(eldr_js_iter *it, eldr_js_member *m) {
  const char *p = it->doc;
  size_t i = iter_item(it);
  if (i >= it->end || p[i] != '"') {
    it->pos = it->end;
    return 0;
  }
  size_t ke = skip_str(p, i, it->end);
  m->key = (eldr_js_span){i, ke - i, ELDR_JS_STRING};
  size_t v = ws(p, ke, it->end);
  v = ws(p, v + 1, it->end); /* past ':' */
  eldr_js_type t;
  size_t ve = iter_skip(it, v, &t);
  m->value = (eldr_js_span){v, ve - v, t};
  m->off = i;
  m->len = ve - i;
  it->pos = ve;
  return 1;
}

void eldr_js_iter_array(eldr_js_iter *it, const char *doc, eldr_js_span arr) { iter_open(it, doc, arr, ELDR_JS_ARRAY); }

int eldr_js_next_elem(eldr_js_iter *it, eldr_js_span *v) {
  size_t i = iter_item(it);
  if (i >= it->end) return 0;
  eldr_js_type t;
  size_t e = iter_skip(it, i, &t);
  *v = (eldr_js_span){i, e - i, t};
  it->pos = e;
  return 1;
}

eldr_js_span eldr_js_get(const char *doc, eldr_js_span obj, const char *key) {
  eldr_js_span v = {0, 0, ELDR_JS_NONE};
  if (obj.type != ELDR_JS_OBJECT) return v;
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, doc, obj);
  while (eldr_js_next(&it, &m))
    if (eldr_js_key_is(doc, m.key, key)) v = m.value;
  return v;
}

int eldr_js_key_is(const char *doc, eldr_js_span key, const char *name) {
  if (key.type != ELDR_JS_STRING || key.len < 2) return 0;
  return key_eq_raw(doc + key.off + 1, key.len - 2, name, strlen(name));
}

static size_t put_utf8(uint32_t v, char *o) {
  if (v < 0x80) {
    o[0] = (char)v;
    return 1;
  }
  if (v < 0x800) {
    o[0] = (char)(0xC0 | (v >> 6));
    o[1] = (char)(0x80 | (v & 0x3F));
    return 2;
  }
  if (v < 0x10000) {
    o[0] = (char)(0xE0 | (v >> 12));
    o[1] = (char)(0x80 | ((v >> 6) & 0x3F));
    o[2] = (char)(0x80 | (v & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (v >> 18));
  o[1] = (char)(0x80 | ((v >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((v >> 6) & 0x3F));
  o[3] = (char)(0x80 | (v & 0x3F));
  return 4;
}

int eldr_js_string(const char *doc, eldr_js_span v, char *buf, size_t cap, size_t *len) {
  if (v.type != ELDR_JS_STRING || v.len < 2) return ELDR_EINVAL;
  const char *p = doc + v.off + 1, *e = doc + v.off + v.len - 1;
  size_t o = 0;
  while (p < e) {
    const char *bsl = memchr(p, '\\', (size_t)(e - p));
    size_t run = bsl ? (size_t)(bsl - p) : (size_t)(e - p);
    if (o + run > cap) return ELDR_EINVAL;
    memcpy(buf + o, p, run);
    o += run;
    p += run;
    if (!bsl) break;
    char tmp[4];
    size_t k = 1;
    char c = p[1];
    p += 2;
    switch (c) {
      case 'b': tmp[0] = '\b'; break;
      case 'f': tmp[0] = '\f'; break;
      case 'n': tmp[0] = '\n'; break;
      case 'r': tmp[0] = '\r'; break;
      case 't': tmp[0] = '\t'; break;
      case 'u': {
        uint32_t cp = (uint32_t)u_escape(p - 1, (size_t)(e - p + 1));
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* the low surrogate follows (validated) */
          uint32_t lo = (uint32_t)u_escape(p + 1, (size_t)(e - p - 1));
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          p += 6;
        }
        k = put_utf8(cp, tmp);
        break;
      }
      default: tmp[0] = c; /* '"', '\\', '/' */
    }
    if (o + k > cap) return ELDR_EINVAL;
    memcpy(buf + o, tmp, k);
    o += k;
  }
  *len = o;
  return 0;
}

int eldr_js_int(const char *doc, eldr_js_span v, int64_t *x) {
  if (v.type != ELDR_JS_INTEGER || v.len == 0) return ELDR_EINVAL;
  const char *p = doc + v.off;
  size_t i = 0;
  int neg = p[0] == '-';
  i += (size_t)neg;
  uint64_t mag = 0;
  for (; i < v.len; i++) mag = mag * 10 + (uint64_t)(p[i] - '0');
  *x = neg ? (int64_t)(0 - mag) : (int64_t)mag;
  return 0;
}

int eldr_js_root_object(const char *doc, size_t n, eldr_js_span *root) {
  size_t a = 0, b = n;
  while (a < n && (doc[a] == ' ' || doc[a] == '\t' || doc[a] == '\n' || doc[a] == '\r')) a++;
  while (b > a && (doc[b - 1] == ' ' || doc[b - 1] == '\t' || doc[b - 1] == '\n' || doc[b - 1] == '\r')) b--;
  if (b - a < 2 || doc[a] != '{') return -1;
  *root = (eldr_js_span){a, b - a, ELDR_JS_OBJECT};
  return 0;
}

/* ---- an object written again ---------------------------------------------- */

static int key_in(const char *doc, eldr_js_span key, const char *const *names) {
  for (; names && *names; names++)
    if (eldr_js_key_is(doc, key, *names)) return 1;
  return 0;
}

size_t eldr_js_cut_max(eldr_js_span obj, const eldr_js_piece *extra, size_t nextra) {
  size_t cap = obj.len + 2;
  for (size_t k = 0; k < nextra; k++) cap += extra[k].an + extra[k].bn + 1;
  return cap;
}

/* One member: a comma before every one but the first. */
static size_t put_member(char *o, int *first, const char *s, size_t n, const char *s2, size_t n2) {
  size_t w = 0;
  if (!*first) o[w++] = ',';
  *first = 0;
  memcpy(o + w, s, n);
  w += n;
  if (n2) memcpy(o + w, s2, n2);
  return w + n2;
}

size_t eldr_js_cut(const char *doc, eldr_js_span obj, const char *const *drop, const eldr_js_piece *extra,
                   size_t nextra, char *out) {
  size_t w = 0;
  int first = 1;
  out[w++] = '{';
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, doc, obj);
  while (eldr_js_next(&it, &m)) {
    if (key_in(doc, m.key, drop)) continue;
    w += put_member(out + w, &first, doc + m.off, m.len, NULL, 0);
  }
  for (size_t k = 0; k < nextra; k++)
    if (extra[k].a) w += put_member(out + w, &first, extra[k].a, extra[k].an, extra[k].b, extra[k].bn);
  out[w++] = '}';
  return w;
}
