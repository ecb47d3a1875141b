/* corpus.h — words of real text for the emulated worker's replies (internal
 * to src/worker).
 *
 * eldr__corpus_load reads every regular *.txt file of a directory (at most
 * ELDR__CORPUS_MAX_BYTES in all, files in name order) and splits it at ASCII
 * whitespace into words; words that are not valid UTF-8, longer than
 * ELDR__CORPUS_MAX_WORD bytes or containing control bytes are skipped, so
 * every word can be put in JSON by escaping only '"' and '\\'.
 *
 * Ownership: the corpus owns one text buffer and the word offsets.
 * Errors: ELDR_EIO (no readable *.txt / no words; d names the directory),
 * ELDR_ENOMEM. Thread-safe for readers once loaded.
 */
#ifndef ELDR_WORKER_CORPUS_H
#define ELDR_WORKER_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"

#define ELDR__CORPUS_MAX_BYTES (16u << 20)
#define ELDR__CORPUS_MAX_WORD 40

typedef struct eldr__corpus eldr__corpus;

int eldr__corpus_load(const char *dir, eldr__corpus **out, eldr_diag *d);
void eldr__corpus_free(eldr__corpus *c);
/* Word i mod the number of words; *len receives its length (not NUL-terminated). */
const char *eldr__corpus_word(const eldr__corpus *c, uint64_t i, size_t *len);

#endif
