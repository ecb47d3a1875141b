/* trace_expect.h — checks the trace-format tests share.
 *
 * Ownership: arguments are the caller's; nothing is kept.
 * Errors: a failed check fails the calling cmocka test (fail_msg) with the
 * input and the message it got.
 * Threads: the test's thread. */
#ifndef ELDR_TEST_TRACE_EXPECT_H
#define ELDR_TEST_TRACE_EXPECT_H

#include "eldr/error.h"

/* d's message contains sub. */
void eldr_test_msg_has(const eldr_diag *d, const char *sub);

/* eldr_trace_parse(text) fails with err, leaves no trace, and its message
 * contains sub1 and (when not NULL) sub2. */
void eldr_test_trace_parse_fails(const char *text, int err, const char *sub1, const char *sub2);

#endif
