/* demo_latency.c — TPOT from the prefill's end in `eldr demo` (see
 * demo_latency.h). */
#include "demo_latency.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/quantile.h"

int demo_tpot_pf(const char *access_log, const eldr_loadgen_result *r, uint64_t seed, double *p50,
                 double *p99, size_t *n) {
  *p50 = *p99 = NAN;
  *n = 0;
  FILE *f = fopen(access_log, "r");
  if (!f) return -1;
  double *pf = calloc(r->n ? r->n : 1, sizeof *pf); /* prefill_ms per send index; 0: unknown */
  double *v = malloc((r->n ? r->n : 1) * sizeof *v);
  if (!pf || !v) {
    free(pf);
    free(v);
    fclose(f);
    return -1;
  }
  char prefix[40], line[4096];
  int plen = snprintf(prefix, sizeof prefix, "lg-%llx-", (unsigned long long)seed);
  while (fgets(line, sizeof line, f)) {
    json_t *j = json_loads(line, 0, NULL);
    const char *id = json_string_value(json_object_get(j, "id"));
    json_t *p = json_object_get(j, "prefill_ms");
    if (id && !strncmp(id, prefix, (size_t)plen) && json_is_number(p)) {
      char *end;
      unsigned long long i = strtoull(id + plen, &end, 10);
      if (!*end && i < r->n) pf[i] = json_number_value(p);
    }
    json_decref(j);
  }
  fclose(f);
  for (size_t i = 0; i < r->n; i++) {
    const eldr_loadgen_rec *q = &r->recs[i];
    if (!q->ok || q->tokens < 2 || !(pf[i] > 0) || q->e2e_s < 0) continue;
    v[(*n)++] = (q->e2e_s - pf[i] / 1e3) / q->tokens;
  }
  *p50 = eldr_quantile(v, *n, 0.5);
  *p99 = eldr_quantile_sorted(v, *n, 0.99);
  free(pf);
  free(v);
  return 0;
}
