/* mooncake_io.c — the Mooncake trace reader (eldr/mooncake_io.h). */
#include "eldr/mooncake_io.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"
#include "eldr/readfile.h"

#define MC_MAX_ID 9007199254740992.0 /* 2^53: every id a JSON reader keeps exactly */

typedef struct mc_parse {
  eldr_mooncake *m;
  size_t rec_cap, ids_cap;
} mc_parse;

static int fail(eldr_diag *d, int rc, const char *name, size_t line, const char *field, const char *what) {
  return eldr_diag_fail(d, rc, "%s%sline %zu: field '%s': %s", name ? name : "", name ? ":" : "", line,
                        field, what);
}

/* a JSON integer in [lo, hi] */
static int get_int(json_t *o, const char *field, double lo, double hi, double *v, const char *name,
                   size_t line, eldr_diag *d) {
  json_t *x = json_object_get(o, field);
  char why[96];
  if (!x) return fail(d, ELDR_EPARSE, name, line, field, "missing");
  if (!json_is_integer(x)) return fail(d, ELDR_EPARSE, name, line, field, "not an integer");
  double y = (double)json_integer_value(x);
  if (y < lo || y > hi) {
    snprintf(why, sizeof why, "%.0f out of range [%.0f, %.0f]", y, lo, hi);
    return fail(d, ELDR_ERANGE, name, line, field, why);
  }
  *v = y;
  return 0;
}

static int parse_line(mc_parse *p, const char *s, size_t n, const char *name, size_t line, eldr_diag *d) {
  json_error_t je;
  json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
  if (!o) {
    char why[200];
    snprintf(why, sizeof why, "%s", je.text);
    return eldr_diag_fail(d, ELDR_EPARSE, "%s%sline %zu: bad JSON: %s", name ? name : "", name ? ":" : "",
                          line, why);
  }
  int rc = 0;
  double ts = 0, in = 0, outl = 0;
  json_t *t = json_object_get(o, "timestamp"), *h = json_object_get(o, "hash_ids");
  eldr_mooncake *m = p->m;
  if (!json_is_object(o)) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "%s%sline %zu: not a JSON object", name ? name : "", name ? ":" : "",
                        line);
  } else if (!t || !json_is_number(t)) {
    rc = fail(d, ELDR_EPARSE, name, line, "timestamp", t ? "not a number" : "missing");
  } else if (!((ts = json_number_value(t)) >= 0) || !isfinite(ts)) {
    rc = fail(d, ELDR_ERANGE, name, line, "timestamp", "negative or not finite");
  } else if ((rc = get_int(o, "input_length", 1, ELDR_MOONCAKE_MAX_INPUT, &in, name, line, d)) ||
             (rc = get_int(o, "output_length", 0, ELDR_MOONCAKE_MAX_OUTPUT, &outl, name, line, d))) {
  } else if (!h || !json_is_array(h)) {
    rc = fail(d, ELDR_EPARSE, name, line, "hash_ids", h ? "not an array" : "missing");
  } else {
    size_t want = ((size_t)in + ELDR_MOONCAKE_BLOCK_TOKENS - 1) / ELDR_MOONCAKE_BLOCK_TOKENS;
    size_t nh = json_array_size(h);
    if (nh != want) {
      char why[120];
      snprintf(why, sizeof why, "%zu ids for %.0f tokens (expected %zu: one per %u-token block)", nh, in,
               want, ELDR_MOONCAKE_BLOCK_TOKENS);
      rc = fail(d, ELDR_ERANGE, name, line, "hash_ids", why);
    } else if (eldr_grow_array(m->rec, p->rec_cap, m->n + 1) ||
               eldr_grow_array(m->ids, p->ids_cap, m->n_ids + nh)) {
      rc = eldr_diag_fail(d, ELDR_ENOMEM, "mooncake: out of memory at line %zu", line);
    } else {
      for (size_t i = 0; i < nh && !rc; i++) {
        json_t *x = json_array_get(h, i);
        double v = x && json_is_integer(x) ? (double)json_integer_value(x) : -1;
        if (!(v >= 0 && v <= MC_MAX_ID)) {
          char why[96];
          snprintf(why, sizeof why, "entry %zu is not an integer in [0, 2^53]", i);
          rc = fail(d, ELDR_ERANGE, name, line, "hash_ids", why);
        } else {
          m->ids[m->n_ids + i] = (uint64_t)json_integer_value(x);
        }
      }
      if (!rc) {
        m->rec[m->n] = (eldr_mooncake_rec){ts, (uint32_t)in, (uint32_t)outl, (uint32_t)nh, m->n_ids};
        m->n_ids += nh;
        m->n++;
      }
    }
  }
  json_decref(o);
  return rc;
}

int eldr_mooncake_parse(const char *buf, size_t len, const char *name, size_t max_records,
                        eldr_mooncake *out, eldr_diag *d) {
  if (!out || (!buf && len)) return eldr_diag_fail(d, ELDR_EINVAL, "mooncake: argument missing");
  memset(out, 0, sizeof *out);
  if (!max_records || max_records > ELDR_MOONCAKE_MAX_RECORDS) max_records = ELDR_MOONCAKE_MAX_RECORDS;
  mc_parse p = {.m = out};
  size_t pos = 0, line = 0;
  int rc = 0;
  while (pos < len && out->n < max_records && !rc) {
    const char *s = buf + pos;
    const char *nl = memchr(s, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - s) : len - pos;
    pos += n + (nl != NULL);
    line++;
    if (n > ELDR_MOONCAKE_MAX_LINE) {
      rc = eldr_diag_fail(d, ELDR_ERANGE, "%s%sline %zu: longer than %zu bytes", name ? name : "",
                          name ? ":" : "", line, ELDR_MOONCAKE_MAX_LINE);
      break;
    }
    size_t a = 0;
    while (a < n && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r')) a++;
    if (a == n) continue; /* blank */
    rc = parse_line(&p, s, n, name, line, d);
  }
  if (!rc && !out->n)
    rc = eldr_diag_fail(d, ELDR_EEMPTY, "%s%sno Mooncake record", name ? name : "", name ? ": " : "");
  if (rc) eldr_mooncake_free(out);
  return rc;
}

int eldr_mooncake_load(const char *path, size_t max_records, eldr_mooncake *out, eldr_diag *d) {
  char *buf = NULL;
  size_t len = 0;
  if (out) memset(out, 0, sizeof *out);
  int rc = eldr_read_file(path, (size_t)4 << 30, "Mooncake trace", &buf, &len, d);
  if (rc) return rc;
  rc = eldr_mooncake_parse(buf, len, path, max_records, out, d);
  free(buf);
  return rc;
}
