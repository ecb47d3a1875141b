/* jscan.h — find and read JSON values in place, without building a tree.
 *
 * eldr_js_scan validates a whole document (RFC 8259, UTF-8, with the
 * limits of jansson's default decoder so that both accept and reject the
 * same bytes: nesting at most ELDR_JS_MAX_DEPTH values deep, integers that
 * fit int64_t, reals that do not overflow a double, no "\u0000" in strings,
 * any value at the top level) and, in the same pass, records where the
 * values of a few wanted paths lie ({"usage", "prompt_tokens"},
 * {"choices", "#0", "routed_experts"}, ...). As jansson, a key repeated in
 * one object resolves to its last value.
 *
 * The other calls read a document eldr_js_scan accepted: walk an object's
 * members or an array's elements, look a key up, decode a string or an
 * integer. They never allocate; spans are
 * byte ranges of the caller's document, valid while it is. (eldr_js_scan
 * allocates only to check a real number longer than 127 bytes for
 * overflow: ELDR_ENOMEM when that fails.)
 *
 * Errors: eldr_js_scan returns ELDR_EPARSE with a message naming what is
 * wrong and its byte offset; the readers return ELDR_EINVAL for a value of
 * another type or a string that does not fit the caller's buffer.
 * Threads: any thread (eldr_js_scan keeps its nesting stack, ELDR_JS_MAX_DEPTH
 * frames, in thread-local storage; nothing else is shared).
 */
#ifndef ELDR_JSCAN_H
#define ELDR_JSCAN_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"

#define ELDR_JS_MAX_DEPTH 2048 /* values, containers and scalars, as jansson's parser counts them */
#define ELDR_JS_MAX_PATH 8     /* components of a wanted path */
#define ELDR_JS_MAX_WANT 32    /* wanted paths in one scan */

typedef enum eldr_js_type {
  ELDR_JS_NONE = 0, /* not found */
  ELDR_JS_OBJECT,
  ELDR_JS_ARRAY,
  ELDR_JS_STRING,
  ELDR_JS_INTEGER, /* a number without fraction or exponent */
  ELDR_JS_REAL,
  ELDR_JS_TRUE,
  ELDR_JS_FALSE,
  ELDR_JS_NULL,
} eldr_js_type;

/* A value's bytes: doc[off, off + len) (a string's span includes its
 * quotes). type ELDR_JS_NONE: the path is not in the document. */
typedef struct eldr_js_span {
  size_t off, len;
  eldr_js_type type;
} eldr_js_span;

/* A wanted path: NULL-terminated components; an object key, or "#<n>" for
 * the n-th element of an array (keys starting with '#' are not reachable). */
typedef struct eldr_js_path {
  const char *c[ELDR_JS_MAX_PATH + 1];
} eldr_js_path;

/* Validate doc[0..n) and find the npaths (<= ELDR_JS_MAX_WANT) paths:
 * found[i] is the span of paths[i] (type NONE when absent). root (may be
 * NULL) receives the top-level value's span. 0 or ELDR_EPARSE / EINVAL
 * (too many paths) with d set. */
int eldr_js_scan(const char *doc, size_t n, const eldr_js_path *paths, size_t npaths, eldr_js_span *found,
                 eldr_js_span *root, eldr_diag *d);

/* Members of an object, in document order (duplicates included). */
typedef struct eldr_js_member {
  eldr_js_span key;   /* the key string, quotes included */
  eldr_js_span value;
  size_t off, len;    /* the member: key through value */
} eldr_js_member;

typedef struct eldr_js_iter {
  const char *doc;
  size_t pos, end;
  size_t known_off, known_len; /* eldr_js_iter_known (0 length: none) */
} eldr_js_iter;

/* A string value of the document, quotes included, that an earlier
 * eldr_js_scan of the same bytes found (a megabyte base64 blob): when the
 * walk meets that string (as a member's or element's value, or inside one
 * it steps over) it takes its end from s instead of searching the text. Anything else (a span that is no string value of this
 * document) makes the walk wrong: only spans of that scan. Set after
 * eldr_js_iter_init / eldr_js_iter_array. */
void eldr_js_iter_known(eldr_js_iter *it, eldr_js_span s);

/* obj: an ELDR_JS_OBJECT span of a document eldr_js_scan accepted. */
void eldr_js_iter_init(eldr_js_iter *it, const char *doc, eldr_js_span obj);
/* 1 and *m set, or 0 after the last member. */
int eldr_js_next(eldr_js_iter *it, eldr_js_member *m);

/* Elements of an array (an ELDR_JS_ARRAY span of an accepted document), in
 * order: 1 and *v set, or 0 after the last. */
void eldr_js_iter_array(eldr_js_iter *it, const char *doc, eldr_js_span arr);
int eldr_js_next_elem(eldr_js_iter *it, eldr_js_span *v);

/* The value of obj's last member named key, as jansson's lookup gives it
 * (type ELDR_JS_NONE: no such member, or obj is not an object). */
eldr_js_span eldr_js_get(const char *doc, eldr_js_span obj, const char *key);

/* 1 when the key (a string span) decodes to exactly name. */
int eldr_js_key_is(const char *doc, eldr_js_span key, const char *name);

/* Decode a string value into buf[0..cap) (not NUL-terminated; *len its
 * length). ELDR_EINVAL: not a string, or longer than cap. */
int eldr_js_string(const char *doc, eldr_js_span v, char *buf, size_t cap, size_t *len);
/* An integer value. ELDR_EINVAL: not an integer. */
int eldr_js_int(const char *doc, eldr_js_span v, int64_t *x);

/* The top-level value of doc[0..n) less the whitespace around it, when it
 * is an object ('{' to '}'): 0 and *root, else -1. For a document the
 * scanner accepted (nothing is validated here). */
int eldr_js_root_object(const char *doc, size_t n, eldr_js_span *root);

/* ---- an object written again: some members dropped, others added ---------- */

/* A member to add: the bytes a[0..an) then b[0..bn) ("\"key\":" and a value,
 * or one piece holding both); a NULL: none (skipped). */
typedef struct eldr_js_piece {
  const char *a;
  size_t an;
  const char *b;
  size_t bn;
} eldr_js_piece;

/* The most bytes eldr_js_cut writes for obj and these extras. */
size_t eldr_js_cut_max(eldr_js_span obj, const eldr_js_piece *extra, size_t nextra);
/* "{" + the members of obj (an object span of doc, a document the scanner
 * accepted) whose key is none of drop (NULL-terminated names; every member
 * of that name goes), as they lie in doc, in order + the extra members +
 * "}", written at out (room for eldr_js_cut_max bytes; no NUL): returns the
 * bytes written. Never allocates. */
size_t eldr_js_cut(const char *doc, eldr_js_span obj, const char *const *drop, const eldr_js_piece *extra,
                   size_t nextra, char *out);

#endif
