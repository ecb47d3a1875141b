/* fuzz_dns_answer.c — the DNS reply reader of the router's TCP lookups
 * (eldr__dns_answer, src/serve/dnsmsg.c: what a nameserver, any peer on the
 * path, sends), and the query builder. Input: two bytes choose the query id
 * and type; the rest is the reply. Checks: never crashes or reads out of
 * bounds (an exact-size copy); the code is one of the defined ones; OK has
 * records, every other code none (a reply that breaks off is not used in
 * part; MALFORMED has no RCODE when the header is
 * short or not the reply asked for); a query built from the input's first
 * bytes as a name is well-formed (its answer to itself, with QR set and no
 * records, reads as NODATA). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/dnsmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  uint16_t qtype = data[0] & 1 ? ELDR__DNS_AAAA : ELDR__DNS_A;
  uint16_t id = size >= 14 ? (uint16_t)(data[2] << 8 | data[3]) : data[1]; /* mostly the reply's own id */
  size_t n = size - 2;
  uint8_t *m = malloc(n ? n : 1);
  if (!m) return 0;
  memcpy(m, data + 2, n);
  static eldr__dns_addrs out;
  int rc = eldr__dns_answer(m, n, id, qtype, &out);
  if (rc < ELDR__DNS_OK || rc > ELDR__DNS_MALFORMED) abort();
  if ((rc == ELDR__DNS_OK) != (out.n > 0)) abort();
  if (out.n > ELDR__DNS_MAX_ADDRS) abort();
  if (n < 12 && (rc != ELDR__DNS_MALFORMED || out.rcode != -1)) abort();
  free(m);
  /* the query builder on a name from the input */
  char name[300];
  size_t nl = size - 2 < sizeof name - 1 ? size - 2 : sizeof name - 1;
  memcpy(name, data + 2, nl);
  name[nl] = 0;
  uint8_t q[600];
  size_t qn = eldr__dns_query(q, sizeof q, id, name, qtype);
  if (qn) {
    if (qn < 17 || qn > sizeof q || q[qn - 4] != (uint8_t)(qtype >> 8) || q[qn - 3] != (uint8_t)qtype) abort();
    q[2] |= 0x80; /* the query as a reply without records */
    if (eldr__dns_answer(q, qn, id, qtype, &out) != ELDR__DNS_NODATA) abort();
  }
  return 0;
}
