/* trace_expect.c — see trace_expect.h. */
#include "support/trace_expect.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/trace.h"

void eldr_test_msg_has(const eldr_diag *d, const char *sub) {
  if (!strstr(d->msg, sub)) fail_msg("message '%s' lacks '%s'", d->msg, sub);
}

void eldr_test_trace_parse_fails(const char *text, int err, const char *sub1, const char *sub2) {
  eldr_trace *t = (eldr_trace *)0x1;
  eldr_diag d = {{0}};
  int rc = eldr_trace_parse(text, strlen(text), &t, &d);
  if (rc != err) fail_msg("input %s: rc %d (%s), want %d", text, rc, d.msg, err);
  if (t) fail_msg("input %s: a trace although the parse failed", text);
  eldr_test_msg_has(&d, sub1);
  if (sub2) eldr_test_msg_has(&d, sub2);
}
