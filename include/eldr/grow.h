/* eldr/grow.h — growable arrays (base layer): one overflow-checked growth
 * rule instead of a hand-written realloc loop per array.
 *
 * Usage, for any `T *p` with a `size_t cap` counting elements:
 *   if (eldr_grow_array(p, cap, n + 1)) return ELDR_ENOMEM;
 *   p[n++] = x;
 *
 * Ownership: the array stays the caller's; on failure it is unchanged (the
 * old block and cap are kept, nothing is freed).
 * Errors: ELDR_ENOMEM (allocation failed or need * esz overflows size_t).
 * Threads: any thread; the array is the caller's to guard.
 */
#ifndef ELDR_GROW_H
#define ELDR_GROW_H

#include <stddef.h>

/* Make *(void **)pptr hold at least `need` elements of esz bytes: capacity
 * doubles (at least `min_cap`, at least need). No-op when *cap >= need.
 * Returns 0 or ELDR_ENOMEM. */
int eldr_grow(void *pptr, size_t *cap, size_t need, size_t esz, size_t min_cap);

/* eldr_grow for a typed pointer lvalue p and its size_t capacity lvalue cap
 * (minimum capacity 16 elements). */
#define eldr_grow_array(p, cap, need) eldr_grow(&(p), &(cap), (need), sizeof *(p), 16)

#endif
