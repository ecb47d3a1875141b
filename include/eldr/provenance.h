/* eldr/provenance.h — does a served trace come from the same source as the
 * fitted one?
 *
 * A synthetic trace's domains are drawn from its generator's seed and
 * workload (eldr/tracegen.h, eldr_tracegen_provenance): an artifact fitted
 * on one seed's trace knows nothing of another seed's domains, so serving
 * it the other trace silently drops the gain to nothing. This module
 * compares the generator strings and model names of the fitted and served
 * sources and says, in one sentence, why they differ.
 *
 * Pure functions, no allocation, thread-safe.
 */
#ifndef ELDR_PROVENANCE_H
#define ELDR_PROVENANCE_H

#include <stddef.h>

/* Compare a fitted source (model name, generator string or NULL for real
 * data) with a served one. Returns 0 when they agree (same model, and
 * either both real or both from the same generator string); otherwise 1
 * with a one-line explanation in why (cap bytes, NUL-terminated), e.g.
 * "generator seed differs: fitted 1, served 2 (domains of one seed mean
 * nothing for the other)". Empty/NULL model names are not compared. */
int eldr_provenance_mismatch(const char *fit_model, const char *fit_gen, const char *serve_model,
                             const char *serve_gen, char *why, size_t cap);

/* Parse "eldr-tracegen workload=W seed=S" (order-free key=value words after
 * the first). workload (wcap bytes) and *seed get the values; returns 0 if
 * both were found, -1 otherwise (outputs then unspecified). */
int eldr_provenance_parse(const char *gen, char *workload, size_t wcap,
                          unsigned long long *seed);

#endif
