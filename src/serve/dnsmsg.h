/* dnsmsg.h — DNS query and answer (serve-private; pure, no libevent):
 * what the router's DNS-over-TCP lookups (dnstcp.c) send and read.
 *
 * Ownership: the caller's buffers; nothing is allocated.
 * Errors: eldr__dns_query returns 0 for a name it cannot encode;
 * eldr__dns_answer classifies every reply (below), never reads past len.
 * Threads: any (no state). */
#ifndef ELDR_SERVE_DNSMSG_H
#define ELDR_SERVE_DNSMSG_H

#include <stddef.h>
#include <stdint.h>

enum { ELDR__DNS_A = 1, ELDR__DNS_AAAA = 28 };

/* What a reply said. */
enum {
  ELDR__DNS_OK = 0,    /* records of the type asked (n > 0) */
  ELDR__DNS_NODATA,    /* NOERROR without such records: the name has none */
  ELDR__DNS_NXDOMAIN,  /* no such name */
  ELDR__DNS_FAILED,    /* another RCODE (SERVFAIL, REFUSED, ...): says nothing about the name */
  ELDR__DNS_TRUNCATED, /* TC set: incomplete */
  ELDR__DNS_MALFORMED, /* not a reply to the query, or not a well-formed one */
};

/* A reply of 64 KiB (DNS over TCP at most) holds fewer A or AAAA records. */
#define ELDR__DNS_MAX_ADDRS 4096

typedef struct eldr__dns_addrs {
  size_t n;
  uint32_t ttl;  /* the smallest of the records' */
  int rcode;     /* the reply's RCODE, -1 when it had none */
  uint8_t addr[ELDR__DNS_MAX_ADDRS][16]; /* 4 bytes each for A, 16 for AAAA (network order) */
} eldr__dns_addrs;

/* A query (RD set, one question: name, qtype, class IN) into out[0..cap):
 * its length, or 0 (a name that is empty, longer than 253 bytes, has an
 * empty label or one over 63 bytes, or cap too small). A final dot is
 * allowed. */
size_t eldr__dns_query(uint8_t *out, size_t cap, uint16_t id, const char *name, uint16_t qtype);

/* The records of type qtype (class IN) in the answer section of reply
 * m[0..len) to query id: one of the codes above, out filled for OK. */
int eldr__dns_answer(const uint8_t *m, size_t len, uint16_t id, uint16_t qtype, eldr__dns_addrs *out);

#endif
