/* dnsmsg.c — DNS messages for the router's TCP lookups (dnstcp.c): a query
 * for one name and type, and the reply's A / AAAA records (RFC 1035 4.1,
 * RFC 3596). Pure: no allocation beyond the caller's buffers, never reads
 * past the given length, every count and pointer bounded; a reply is
 * driven by a DNS server, so fuzz_dns_answer runs it on every input. */
#include <string.h>

#include "dnsmsg.h"

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

size_t eldr__dns_query(uint8_t *out, size_t cap, uint16_t id, const char *name, uint16_t qtype) {
  size_t nl = strlen(name);
  if (nl && name[nl - 1] == '.') nl--; /* the root's dot is the final 0 */
  if (!nl || nl > 253 || cap < 12 + nl + 2 + 4) return 0;
  uint8_t *o = out;
  o[0] = (uint8_t)(id >> 8), o[1] = (uint8_t)id;
  o[2] = 0x01, o[3] = 0; /* RD: recursion desired */
  o[4] = 0, o[5] = 1;     /* one question */
  memset(o + 6, 0, 6);
  o += 12;
  for (size_t i = 0; i < nl;) {
    size_t j = i;
    while (j < nl && name[j] != '.') j++;
    if (j == i || j - i > 63) return 0; /* an empty or overlong label */
    *o++ = (uint8_t)(j - i);
    memcpy(o, name + i, j - i);
    o += j - i;
    i = j + 1;
    if (j == nl - 1 && name[j] == '.') return 0;
  }
  *o++ = 0;
  *o++ = (uint8_t)(qtype >> 8), *o++ = (uint8_t)qtype;
  *o++ = 0, *o++ = 1; /* class IN */
  return (size_t)(o - out);
}

/* Step over a (possibly compressed) name at *i: 0, or -1 when malformed.
 * A compression pointer ends the name in place (what follows it is not
 * ours to read), so no pointer is followed and no loop is possible. */
static int skip_name(const uint8_t *m, size_t len, size_t *i) {
  size_t j = *i, labels = 0;
  for (;;) {
    if (j >= len) return -1;
    uint8_t l = m[j];
    if ((l & 0xc0) == 0xc0) {
      if (j + 2 > len) return -1;
      *i = j + 2;
      return 0;
    }
    if (l & 0xc0) return -1; /* the 01 and 10 label types are not in use */
    j++;
    if (!l) break;
    if (++labels > 127 || j + l > len) return -1;
    j += l;
  }
  *i = j;
  return 0;
}

/* A reply that breaks off is not used in part. */
static int malformed(eldr__dns_addrs *out) {
  out->n = 0;
  return ELDR__DNS_MALFORMED;
}

int eldr__dns_answer(const uint8_t *m, size_t len, uint16_t id, uint16_t qtype, eldr__dns_addrs *out) {
  out->n = 0;
  out->ttl = 0;
  out->rcode = -1;
  if (len < 12) return ELDR__DNS_MALFORMED;
  if (get16(m) != id || !(m[2] & 0x80)) return ELDR__DNS_MALFORMED; /* not the answer to our query */
  out->rcode = m[3] & 0x0f;
  if (m[2] & 0x02) return ELDR__DNS_TRUNCATED;
  if (out->rcode == 3) return ELDR__DNS_NXDOMAIN;
  if (out->rcode) return ELDR__DNS_FAILED;
  size_t qd = get16(m + 4), an = get16(m + 6), i = 12;
  for (size_t q = 0; q < qd; q++) {
    if (skip_name(m, len, &i) || i + 4 > len) return malformed(out);
    i += 4;
  }
  size_t alen = qtype == ELDR__DNS_AAAA ? 16 : 4;
  for (size_t a = 0; a < an; a++) {
    if (skip_name(m, len, &i) || i + 10 > len) return malformed(out);
    uint16_t type = get16(m + i), cls = get16(m + i + 2), rdl = get16(m + i + 8);
    uint32_t ttl = (uint32_t)get16(m + i + 4) << 16 | get16(m + i + 6);
    i += 10;
    if (i + rdl > len) return malformed(out);
    if (type == qtype && cls == 1) { /* CNAMEs and anything else are stepped over */
      if (rdl != alen) return malformed(out);
      if (out->n >= ELDR__DNS_MAX_ADDRS) return malformed(out); /* more than any Service has */
      memcpy(out->addr[out->n++], m + i, alen);
      if (out->n == 1 || ttl < out->ttl) out->ttl = ttl;
    }
    i += rdl;
  }
  return out->n ? ELDR__DNS_OK : ELDR__DNS_NODATA;
}
