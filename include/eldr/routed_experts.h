/* eldr/routed_experts.h — the routed_experts codec: base64 of a NumPy .npy
 * file (format 1.0/2.0/3.0 header, C order, little-endian uint8, uint16,
 * int16, int32 or int64; shape (tokens, layers, top_k)), as vLLM returns per choice with
 * --enable-return-routed-experts.
 *
 * Decoding never reads out of bounds and never crashes on malformed input:
 * bad base64, a bad magic or header dict, fortran_order=True, an unsupported
 * dtype, a shape whose layers/top_k do not match the model, a payload shorter
 * or longer than the shape, and expert ids >= num_experts are all errors
 * with a message. Counting goes through eldr_counts_accumulate().
 */
#ifndef ELDR_ROUTED_EXPERTS_H
#define ELDR_ROUTED_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"

/* ---- base64 (RFC 4648 standard alphabet, '=' padding; whitespace is an error) */

/* Upper bound of decoded bytes for len input chars. */
size_t eldr_b64_decoded_max(size_t len);
/* Decode into out (capacity cap). Returns 0 and *out_len, or ELDR_EPARSE
 * (invalid char / bad padding / bad length, position in d) or ELDR_ERANGE (cap). */
int eldr_b64_decode(const char *in, size_t len, uint8_t *out, size_t cap, size_t *out_len,
                    eldr_diag *d);
/* Encoded length (with padding) of n bytes, excluding a terminating NUL. */
size_t eldr_b64_encoded_len(size_t n);
/* Encode n bytes; out needs eldr_b64_encoded_len(n) + 1 bytes; NUL-terminated. */
void eldr_b64_encode(const uint8_t *in, size_t n, char *out);

/* ---- npy header */
typedef struct eldr_npy_info {
  eldr_sel_dtype dtype; /* U8, U16LE, I16LE, I32LE or I64LE */
  uint32_t ndim;        /* always 3 for routed_experts */
  size_t shape[3];
  size_t data_offset;   /* byte offset of the payload in the .npy */
} eldr_npy_info;

/* Parse a .npy header from the first len bytes. */
int eldr_npy_parse_header(const uint8_t *buf, size_t len, eldr_npy_info *info, eldr_diag *d);

/* ---- routed_experts */

/* Decode base64 routed_experts straight into counts (L*E, accumulated, NOT
 * zeroed) without allocating: base64 is decoded in fixed-size chunks on the
 * stack (about 12 KiB; the npy header must fit in the first 12 KiB).
 * shape->num_layers and top_k must match the array's dims.
 * *ntokens receives the number of token rows.
 * Header, shape and payload length are checked before anything is counted,
 * but a bad base64 character or an expert id >= E found later leaves a
 * partial sum in counts: count into a zeroed scratch buffer and discard it
 * on error. */
int eldr_routed_experts_count(const char *b64, size_t len, const eldr_shape *shape,
                              uint32_t *counts, size_t *ntokens, eldr_diag *d);

/* As eldr_routed_experts_count, counting only the layers with mask[l] != 0
 * (L flags; NULL = all). The base64 payload and the .npy structure are still
 * fully validated; ids of unmasked layers are not read. The router passes the
 * artifact's layer mask here: the signature needs nothing else. */
int eldr_routed_experts_count_masked(const char *b64, size_t len, const eldr_shape *shape,
                                     const uint8_t *mask, uint32_t *counts, size_t *ntokens,
                                     eldr_diag *d);

/* Decode into a newly allocated host-order selection array (caller frees
 * *sel with free()). If shape->num_experts is 0, ids are not range-checked;
 * likewise num_layers/top_k == 0 accept any (reported in *out_shape).
 * shape may be NULL (accept any). out_shape (may be NULL) receives the
 * array's layers and top_k, and num_experts = shape's, or max id + 1 when
 * that is 0. Ids must fit uint16 (int32 arrays: 0..65535). */
int eldr_routed_experts_decode(const char *b64, size_t len, const eldr_shape *shape,
                               uint16_t **sel, size_t *ntokens, eldr_shape *out_shape,
                               eldr_diag *d);

/* Encode ntokens rows as base64 .npy (format 1.0, '<u2' if E > 256 else '|u1'
 * unless dtype forces one of U8/U16LE/I32LE; pass ELDR_SEL_U16 for that
 * automatic choice). *out is malloc'd and NUL-terminated; *out_len (may be
 * NULL) excludes the NUL. Returns ELDR_EINVAL (bad shape/dtype), ELDR_ERANGE
 * (an id >= E or not representable in a forced U8) or ELDR_ENOMEM. */
int eldr_routed_experts_encode(const uint16_t *sel, size_t ntokens, const eldr_shape *shape,
                               eldr_sel_dtype dtype, char **out, size_t *out_len);

/* ---- a view of routed_experts rows */

/* rows x layers x top_k expert ids of dtype, row-major, at data (borrowed
 * from whoever filled the view): in the wire dtype (U8/U16LE/I16LE/I32LE/
 * I64LE) or host-order U16 (converted lists). Every reader of a
 * routed_experts layout fills one (eldr_routed_experts_view here, the
 * reply readers of eldr/reply_experts.h); the router's signature path reads
 * nothing else. */
typedef struct eldr_re_view {
  const void *data;   /* NULL when absent */
  eldr_sel_dtype dtype;
  size_t rows, layers, top_k;
  size_t first_token; /* prompt views: prompt position of row 0 (rows of
                         [0, first_token) are not in the reply: prefix cache
                         or routed_experts_prompt_start); 0 for generated
                         rows and a whole array */
} eldr_re_view;

/* Decode base64 .npy routed_experts into a byte buffer owned by the caller
 * (*buf, *cap grown with realloc as needed; reused across calls) and view
 * its payload. The array goes through the same check as the decoders above
 * (3 dimensions, layers in [1, ELDR_MAX_LAYERS], top_k in [1, ELDR_MAX_TOPK],
 * no size overflow, payload exactly the shape's), plus layers/top_k equal
 * to shape's when shape is not NULL. Expert ids are not range-checked here
 * (eldr_counts_accumulate does, when counting). Errors as the decoders'. */
int eldr_routed_experts_view(const char *b64, size_t len, const eldr_shape *shape, uint8_t **buf, size_t *cap,
                             eldr_re_view *v, eldr_diag *d);

#endif
