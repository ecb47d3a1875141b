/* placement_io.c — SGLang `--init-expert-location` JSON for EP placements
 * (see include/eldr/placement_io.h). */
#include "eldr/placement_io.h"
#include "eldr/writefile.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eldr/readfile.h"

#define KEY "physical_to_logical_map"
#define MAX_FILE_BYTES (64 << 20)

char *eldr_placement_dump(const eldr_placement *p, const uint32_t *layer_ids, uint32_t rows) {
  if (!p || !p->phys || rows == 0) return NULL;
  const uint32_t L = p->num_layers, P = p->num_physical, E = p->num_experts;
  int32_t *row_of = malloc((size_t)rows * sizeof *row_of); /* model row -> MoE layer or -1 */
  if (!row_of) return NULL;
  for (uint32_t r = 0; r < rows; r++) row_of[r] = -1;
  for (uint32_t l = 0; l < L; l++) {
    uint32_t id = layer_ids ? layer_ids[l] : l;
    if (id >= rows) {
      free(row_of);
      return NULL;
    }
    row_of[id] = (int32_t)l;
  }
  /* integers only: build the text directly (rows x P small numbers) */
  size_t cap = 64 + (size_t)rows * ((size_t)P * 6 + 4), len = 0;
  char *s = malloc(cap);
  if (!s) {
    free(row_of);
    return NULL;
  }
  len += (size_t)snprintf(s + len, cap - len, "{\"" KEY "\": [");
  for (uint32_t r = 0; r < rows; r++) {
    len += (size_t)snprintf(s + len, cap - len, "%s[", r ? ",\n  " : "\n  ");
    for (uint32_t q = 0; q < P; q++) {
      unsigned v = row_of[r] >= 0 ? p->phys[(size_t)row_of[r] * P + q] : q % E;
      len += (size_t)snprintf(s + len, cap - len, q ? ", %u" : "%u", v);
    }
    len += (size_t)snprintf(s + len, cap - len, "]");
  }
  snprintf(s + len, cap - len, "\n]}\n");
  free(row_of);
  return s;
}

int eldr_placement_save(const char *path, const eldr_placement *p, const uint32_t *layer_ids,
                        uint32_t rows, eldr_diag *d) {
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "placement: no path");
  char *text = eldr_placement_dump(p, layer_ids, rows);
  if (!text)
    return eldr_diag_fail(d, ELDR_EINVAL, "%s: cannot serialise the placement (a layer id >= %u rows?)",
                          path, rows);
  int rc = eldr_write_file(path, text, strlen(text), d);
  free(text);
  return rc;
}

/* The placement of a parsed document (borrowed root). */
static int parse_root(const json_t *root, uint32_t experts, uint32_t ep_size,
                      const uint32_t *layer_ids, uint32_t layers, eldr_placement **out,
                      eldr_diag *d) {
  int rc = 0;
  eldr_placement *p = NULL;
  json_t *map = json_is_object(root) ? json_object_get(root, KEY) : NULL;
  if (!map || !json_is_array(map)) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "placement: expected an object with an array '" KEY "'");
    goto out;
  }
  if (json_object_size(root) != 1) { /* SGLang passes every key to init_by_mapping */
    rc = eldr_diag_fail(d, ELDR_EPARSE, "placement: keys other than '" KEY "' (SGLang rejects them)");
    goto out;
  }
  size_t rows = json_array_size(map);
  if (rows == 0 || rows > ELDR_MAX_LAYERS * 4) {
    rc = eldr_diag_fail(d, ELDR_ESHAPE, "placement: %zu rows (need 1..%d)", rows, ELDR_MAX_LAYERS * 4);
    goto out;
  }
  json_t *r0 = json_array_get(map, 0);
  size_t P = json_is_array(r0) ? json_array_size(r0) : 0;
  if (P == 0 || P > ELDR_MAX_EXPERTS * 2) {
    rc = eldr_diag_fail(d, ELDR_ESHAPE, "placement: row 0 must be a non-empty array of at most %d ids",
                        ELDR_MAX_EXPERTS * 2);
    goto out;
  }
  if (P < experts) {
    rc = eldr_diag_fail(d, ELDR_ESHAPE, "placement: %zu physical experts < %u logical experts", P,
                        experts);
    goto out;
  }
  if ((rc = eldr_placement_alloc(layers, experts, ep_size, (uint32_t)(P - experts), &p, d)) < 0)
    goto out;
  for (size_t r = 0; r < rows; r++) { /* every row well-formed, even unused ones */
    json_t *row = json_array_get(map, r);
    if (!json_is_array(row) || json_array_size(row) != P) {
      rc = eldr_diag_fail(d, ELDR_ESHAPE, "placement: row %zu is not an array of %zu ids", r, P);
      goto out;
    }
    for (size_t q = 0; q < P; q++) {
      json_t *v = json_array_get(row, q);
      if (!json_is_integer(v) || json_integer_value(v) < 0 ||
          json_integer_value(v) >= (json_int_t)experts) {
        rc = eldr_diag_fail(d, json_is_integer(v) ? ELDR_ERANGE : ELDR_EPARSE,
                            "placement: row %zu, physical expert %zu: not an expert id in [0, %u)", r,
                            q, experts);
        goto out;
      }
    }
  }
  for (uint32_t l = 0; l < layers; l++) {
    uint32_t id = layer_ids ? layer_ids[l] : l;
    if (id >= rows) {
      rc = eldr_diag_fail(d, ELDR_ESHAPE, "placement: MoE layer %u has no row (%zu rows)", id, rows);
      goto out;
    }
    json_t *row = json_array_get(map, id);
    for (size_t q = 0; q < P; q++)
      p->phys[(size_t)l * P + q] = (uint16_t)json_integer_value(json_array_get(row, q));
  }
  rc = eldr_placement_index(p, d);
out:
  if (rc < 0) {
    eldr_placement_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

int eldr_placement_parse(const char *json, size_t len, uint32_t experts, uint32_t ep_size,
                         const uint32_t *layer_ids, uint32_t layers, eldr_placement **out,
                         eldr_diag *d) {
  *out = NULL;
  if (!json) return eldr_diag_fail(d, ELDR_EINVAL, "placement: NULL input");
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "placement: empty input");
  json_error_t err;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
  if (!root) return eldr_diag_fail(d, ELDR_EPARSE, "placement: line %d: %s", err.line, err.text);
  int rc = parse_root(root, experts, ep_size, layer_ids, layers, out, d);
  json_decref(root);
  return rc;
}

int eldr_placement_load(const char *path, uint32_t experts, uint32_t ep_size,
                        const uint32_t *layer_ids, uint32_t layers, eldr_placement **out,
                        eldr_diag *d) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  int rc = eldr_read_file(path, MAX_FILE_BYTES, NULL, &text, &len, d);
  if (rc < 0) return rc;
  rc = eldr_placement_parse(text, len, experts, ep_size, layer_ids, layers, out, d);
  if (rc < 0) eldr_diag_prefix(d, "%s", path);
  free(text);
  return rc;
}
