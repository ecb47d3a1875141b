/* eldr/trace.h — the expert-selection trace file codec (format layer): the JSONL format of
 * ../shared/traces/README.md, general in layers, experts and k.
 *
 * One JSON object per line, one request per object:
 *   id (string), domain (string, optional), model (string), num_experts (int),
 *   top_k (int), layers (array of MoE layer ids), prefill[t][l][k],
 *   decode[t][l][k] (int expert ids), and optional extensions:
 *   arrival (number, seconds since trace start), prompt (string),
 *   prefill_gates[t][l][k] (numbers: gate probabilities, for the gate/logit
 *   representations), generator (string: who made a synthetic trace, e.g.
 *   "eldr-tracegen workload=realistic seed=1"; absent in real traces).
 * Every line of a file must agree on model, num_experts, top_k and layers.
 * The counts form (docs/trace.md): a line with "form":"counts" carries
 * prefill_tokens, decode_tokens (ints >= 0), prefill_counts[l][e] and
 * optionally decode_counts[l][e] (each row sums to tokens*top_k, no entry
 * above tokens) instead of prefill/decode/prefill_gates, which are then
 * errors (as the counts fields are on a per-token line); an optional
 * "serve" object (either form) is kept as text. A file may mix forms.
 *
 * Reader details: blank lines are skipped; a missing final newline is fine;
 * fields may come in any order; unknown fields are ignored (but must be
 * valid JSON); a JSON null optional field counts as absent; a duplicated
 * known field, a "generator" other than line 1's (a line may omit it), an empty "layers", a repeated layer id, a negative arrival,
 * non-finite gates and strings with \u0000 or invalid UTF-8 are errors.
 * Keys are matched literally (a key spelled with \u escapes is unknown).
 * Expert ids must be JSON integers (no fraction or exponent), 0 <= id < E.
 * The writer emits compact JSON in the field order id, domain, model,
 * num_experts, top_k, layers, generator, arrival, prompt, prefill, decode,
 * prefill_gates (arrival "%.17g", gates "%.9g": both read back bit-exact),
 * so a file in that compact form (like the real llama4 trace) round-trips
 * byte for byte.
 *
 * The in-memory trace (eldr_trace, its constructors) is eldr/trace_model.h
 * (core layer), included here.
 * Ownership: a loaded eldr_trace belongs to the caller (eldr_trace_free).
 * Errors name the line number (1-based) and the field.
 * Threads: any thread; a parse of a large buffer uses a second thread.
 */
#ifndef ELDR_TRACE_H
#define ELDR_TRACE_H

#include <stdio.h>

#include "eldr/error.h"
#include "eldr/trace_model.h"

/* Load a JSONL file. On error returns < 0, *out = NULL, and d names the line
 * and field (e.g. "trace.jsonl:17: field 'prefill': expert id 130 >= num_experts 128").
 * Rejects: empty file, truncated last line (no closing brace / bad JSON),
 * missing or mistyped fields, ragged arrays, expert ids out of range, lines
 * that disagree on the shape. */
int eldr_trace_load(const char *path, eldr_trace **out, eldr_diag *d);

/* Parse a whole in-memory JSONL buffer (same rules as eldr_trace_load). */
int eldr_trace_parse(const char *buf, size_t len, eldr_trace **out, eldr_diag *d);

/* ---- several inputs, torn last lines, streaming ---------------------------
 * A trace input is a file, a directory (its *.jsonl files, sorted by name,
 * not recursive) or a glob pattern (sorted matches); several inputs are read
 * in order as one trace: every line of every file must agree on model,
 * shape, layers and generator, exactly as within one file.
 * Torn last line: a file whose last line has no trailing newline and does
 * not parse as JSON (a write cut short by kill -9) has that line skipped,
 * with a note (eldr_trace_read_info), not an error. A last line without a
 * newline that parses is read as usual, and any other bad line is an error.
 * (eldr_trace_load / eldr_trace_parse above stay strict: whole-file codec.) */

/* What a multi-input read saw. */
typedef struct eldr_trace_read_info {
  size_t files;    /* input files read */
  size_t requests; /* requests read (loaded or visited) */
  size_t torn;     /* torn last lines skipped */
  char note[320];  /* the first skipped line's note ("" when none), e.g.
                      "rec/a.jsonl:41: last line has no newline and does not
                      parse (a torn write?): skipped: ..." */
} eldr_trace_read_info;

/* Expand inputs (files, directories, globs) into file paths, in order.
 * *out: a malloc'd array of *n malloc'd paths (free with
 * eldr_trace_inputs_free). Errors (d names the input): ELDR_ENOTFOUND (a
 * missing file, a directory without *.jsonl, a glob without matches),
 * ELDR_EIO, ELDR_ENOMEM, ELDR_EINVAL (no inputs). */
int eldr_trace_inputs_expand(const char *const *inputs, size_t n_inputs, char ***out, size_t *n,
                             eldr_diag *d);
void eldr_trace_inputs_free(char **paths, size_t n);

/* Load the expanded inputs (eldr_trace_inputs_expand first) into one trace,
 * skipping torn last lines (counted in info, which may be NULL). Large
 * files parse on two threads as in eldr_trace_load. Errors as
 * eldr_trace_load, naming the file and line; ELDR_EEMPTY when no file holds
 * a request. */
int eldr_trace_load_inputs(char *const *paths, size_t n, eldr_trace **out,
                           eldr_trace_read_info *info, eldr_diag *d);

/* A streaming visitor: called once per request in input order; index is
 * 0-based over all inputs. t holds the header read so far (model, shape,
 * layer_ids, generator, domains: r->domain indexes t->domains) and no
 * requests; r belongs to the reader and is released after the call, but the
 * visitor may take any of its arrays or strings by setting the field to
 * NULL. Return 0 to go on; anything else stops the read, which returns it. */
typedef int (*eldr_trace_visit_fn)(const eldr_trace *t, eldr_request *r, size_t index, void *ud);

/* Visit the requests of paths one at a time with bounded memory: one line
 * (at most ELDR_TRACE_MAX_LINE bytes, else ELDR_ERANGE) and one request at a
 * time, whatever the file sizes. Torn last lines are skipped (info). Returns
 * 0, a reader error (d names file, line, field), or the visitor's nonzero
 * value (d untouched by the reader). ELDR_EEMPTY when no request was seen. */
int eldr_trace_foreach_inputs(char *const *paths, size_t n, eldr_trace_visit_fn fn, void *ud,
                              eldr_trace_read_info *info, eldr_diag *d);

/* eldr_trace_foreach_inputs on one file. On success d (when non-NULL)
 * holds the torn-line note, or "" when there was none. */
int eldr_trace_foreach(const char *path, eldr_trace_visit_fn fn, void *ud, eldr_diag *d);

#define ELDR_TRACE_MAX_LINE ((size_t)512 << 20)

/* Parse one line (no newline needed) and append it to t. If t has no
 * requests yet and t->shape.num_layers == 0, the line defines the shape.
 * lineno is used only in messages. On error t is unchanged. */
int eldr_trace_parse_line(eldr_trace *t, const char *line, size_t len, size_t lineno,
                          eldr_diag *d);

/* Write one request as a single JSONL line (with '\n'), in its own form
 * (counts form when r->prefill_counts is set). Returns 0,
 * ELDR_EINVAL, ELDR_ERANGE (a non-finite gate), ELDR_ENOMEM or ELDR_EIO. */
int eldr_trace_write_request(FILE *f, const eldr_trace *t, const eldr_request *r);

/* The same line appended to the growable buffer *buf (*len bytes used of
 * *cap; *buf may start NULL/0/0: it grows with realloc and stays the
 * caller's to free), for a writer that batches many lines into one write.
 * On error *len is unchanged. Returns 0, ELDR_EINVAL, ELDR_ERANGE (a
 * non-finite gate) or ELDR_ENOMEM. Thread-safe (touches only its
 * arguments). */
int eldr_trace_format_request(const eldr_trace *t, const eldr_request *r, char **buf,
                              size_t *len, size_t *cap);

/* One counts-form line for a writer that has no eldr_trace (eldr serve
 * --record): the header fields, the token counts, the dense L*E matrices
 * and an optional pre-serialised "serve" object. Nothing is owned. */
typedef struct eldr_counts_line {
  const char *id;                 /* required */
  const char *domain;             /* NULL: omitted */
  const char *model;              /* NULL: "" */
  const eldr_shape *shape;        /* required */
  const uint32_t *layer_ids;      /* shape->num_layers ids; NULL: 0..L-1 */
  const char *generator;          /* NULL: omitted (real traffic) */
  double arrival;                 /* seconds; < 0 or non-finite: omitted */
  const char *prompt;             /* NULL: omitted */
  uint32_t prefill_tokens, decode_tokens;
  const uint32_t *prefill_counts; /* L*E, required */
  const uint32_t *decode_counts;  /* L*E, or NULL: decode selections unknown */
  const char *serve;              /* one compact JSON object (no newline), or NULL */
} eldr_counts_line;

/* Append ln as one counts-form JSONL line (ending in '\n') to the growable
 * buffer *buf (*len bytes used of *cap; *buf may start NULL/0/0: it grows
 * with realloc and stays the caller's to free). The rows are checked
 * (eldr_counts_rows_check) and serve must be one JSON object, so every line
 * written reads back. On error *len is unchanged and d says why:
 * ELDR_EINVAL, ELDR_ERANGE (a bad row), ELDR_EPARSE (serve), ELDR_ENOMEM.
 * Thread-safe (touches only its arguments). */
int eldr_trace_format_counts(const eldr_counts_line *ln, char **buf, size_t *len, size_t *cap,
                             eldr_diag *d);

/* Write the whole trace. Writes to path via a temp file + rename. */
int eldr_trace_save(const char *path, const eldr_trace *t, eldr_diag *d);

#endif
