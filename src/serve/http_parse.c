/* http_parse.c — strict, bounded parser of an HTTP/1.x request head.
 * Pure: no allocation, never reads past the given length. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "serve_internal.h"

static long fail(eldr__http_head *h, int status, const char *msg) {
  h->status = status;
  snprintf(h->error, sizeof h->error, "%s", msg);
  return -1;
}

static int is_tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return 1;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
  return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Find the end of the head: index just past the blank line, or 0. Lines may
 * end in CRLF or a bare LF. */
static size_t head_end(const char *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (b[i] != '\n') continue;
    if (i + 1 < n && b[i + 1] == '\n') return i + 2;
    if (i + 2 < n && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
  }
  return 0;
}

/* Case-insensitive: does the comma-separated list v[0..n) contain tok? */
static int list_has(const char *v, size_t n, const char *tok) {
  size_t tl = strlen(tok), i = 0;
  while (i < n) {
    while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t s = i;
    while (i < n && v[i] != ',') i++;
    size_t e = i;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (e - s == tl && strncasecmp(v + s, tok, tl) == 0) return 1;
  }
  return 0;
}

/* A Host value (RFC 9110 7.2, RFC 3986 3.2.2): empty, or uri-host [":" port]:
 * a reg-name or IPv4 (unreserved, pct-encoded, sub-delims) or an
 * IP-literal in brackets, then digits after one colon. */
static int host_valid(const char *v, size_t n) {
  size_t i = 0;
  if (n && v[0] == '[') {
    while (i < n && v[i] != ']') {
      unsigned char c = (unsigned char)v[i];
      if (i && !(isxdigit(c) || c == ':' || c == '.' || c == 'v' || c == 'V')) return 0;
      i++;
    }
    if (i == n) return 0;
    i++; /* past ']' */
  } else {
    for (; i < n && v[i] != ':'; i++) {
      unsigned char c = (unsigned char)v[i];
      if (c == '%') {
        if (i + 2 >= n || !isxdigit((unsigned char)v[i + 1]) || !isxdigit((unsigned char)v[i + 2])) return 0;
        i += 2;
      } else if (!c || (!isalnum(c) && !strchr("-._~!$&'()*+,;=", c))) {
        return 0;
      }
    }
  }
  if (i == n) return 1;
  if (v[i] != ':') return 0;
  for (i++; i < n; i++)
    if (!isdigit((unsigned char)v[i])) return 0;
  return 1;
}

static int copy_value(char *dst, size_t cap, const char *v, size_t n) {
  if (n >= cap) return -1;
  memcpy(dst, v, n);
  dst[n] = 0;
  return 0;
}

/* Every field empty, without writing the ~20 KB of string buffers (a
 * memset of the struct was 12% of the router's instructions per request):
 * the strings are only read up to their terminator. */
static void head_reset(eldr__http_head *h) {
  h->method = ELDR__M_OTHER;
  h->minor = h->keep_alive = h->chunked = h->expect_continue = h->status = 0;
  h->content_length = -1;
  h->method_name[0] = h->path[0] = h->request_id[0] = h->authorization[0] = 0;
  h->traceparent[0] = h->tracestate[0] = h->baggage[0] = h->origin[0] = h->acr_headers[0] = h->error[0] = 0;
}

long eldr__http_parse_head(const char *buf, size_t len, size_t max_header, eldr__http_head *h) {
  head_reset(h);
  size_t scan = len < max_header ? len : max_header;
  size_t end = head_end(buf, scan);
  if (end == 0) {
    /* skip leading empty lines tolerated by RFC 9112 only when complete */
    if (len >= max_header) return fail(h, 431, "request head too large");
    return 0;
  }
  size_t i = 0;
  while (i < end && (buf[i] == '\r' || buf[i] == '\n')) i++; /* leading CRLFs */
  /* request line */
  size_t ls = i;
  while (i < end && buf[i] != '\n') i++;
  size_t le = i;
  if (le > ls && buf[le - 1] == '\r') le--;
  i++; /* past '\n' */
  /* method */
  size_t p = ls;
  while (p < le && is_tchar((unsigned char)buf[p])) p++;
  if (p == ls || p >= le || buf[p] != ' ') return fail(h, 400, "malformed request line");
  if (p - ls >= sizeof h->method_name) return fail(h, 501, "method not implemented");
  memcpy(h->method_name, buf + ls, p - ls);
  h->method_name[p - ls] = 0;
  if (!strcmp(h->method_name, "GET")) h->method = ELDR__M_GET;
  else if (!strcmp(h->method_name, "POST")) h->method = ELDR__M_POST;
  else if (!strcmp(h->method_name, "HEAD")) h->method = ELDR__M_HEAD;
  else if (!strcmp(h->method_name, "OPTIONS")) h->method = ELDR__M_OPTIONS;
  else h->method = ELDR__M_OTHER;
  p++;
  /* target */
  size_t ts = p;
  while (p < le && buf[p] != ' ') {
    unsigned char c = (unsigned char)buf[p];
    if (c < 0x21 || c == 0x7f) return fail(h, 400, "invalid character in request target");
    p++;
  }
  if (p >= le || p == ts) return fail(h, 400, "malformed request line");
  size_t te = p;
  const char *t = buf + ts;
  size_t tn = te - ts;
  if (tn > 7 && (!strncasecmp(t, "http://", 7) || !strncasecmp(t, "https://", 8))) {
    size_t skip = t[4] == ':' ? 7 : 8;
    const char *slash = memchr(t + skip, '/', tn - skip);
    if (!slash) {
      t = "/";
      tn = 1;
    } else {
      tn -= (size_t)(slash - t);
      t = slash;
    }
  }
  if (t[0] != '/') return fail(h, 400, "request target must start with '/'");
  const char *q = memchr(t, '?', tn);
  size_t pn = q ? (size_t)(q - t) : tn;
  if (tn >= ELDR__HTTP_PATH_MAX) return fail(h, 414, "request target too long");
  memcpy(h->path, t, pn);
  h->path[pn] = 0;
  p++;
  /* version */
  size_t vn = le - p;
  if (vn != 8 || strncmp(buf + p, "HTTP/", 5) || buf[p + 6] != '.' || buf[p + 5] < '0' ||
      buf[p + 5] > '9' || buf[p + 7] < '0' || buf[p + 7] > '9')
    return fail(h, 400, "malformed HTTP version");
  if (buf[p + 5] != '1') return fail(h, 505, "HTTP version not supported");
  h->minor = buf[p + 7] - '0';
  h->keep_alive = h->minor >= 1;
  int conn_close = 0, conn_keep = 0, have_te = 0, n_host = 0, n_auth = 0, n_reqid = 0;
  /* headers */
  while (i < end) {
    size_t hs = i;
    while (i < end && buf[i] != '\n') i++;
    size_t he = i;
    i++;
    if (he > hs && buf[he - 1] == '\r') he--;
    if (he == hs) break; /* blank line */
    if (buf[hs] == ' ' || buf[hs] == '\t') return fail(h, 400, "obsolete header line folding");
    size_t c = hs;
    while (c < he && is_tchar((unsigned char)buf[c])) c++;
    if (c == hs || c >= he || buf[c] != ':') return fail(h, 400, "malformed header line");
    const char *name = buf + hs;
    size_t nn = c - hs;
    size_t vs = c + 1, ve = he;
    while (vs < ve && (buf[vs] == ' ' || buf[vs] == '\t')) vs++;
    while (ve > vs && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t')) ve--;
    for (size_t k = vs; k < ve; k++) {
      unsigned char ch = (unsigned char)buf[k];
      if ((ch < 0x20 && ch != '\t') || ch == 0x7f) return fail(h, 400, "invalid character in header value");
    }
    const char *v = buf + vs;
    size_t vl = ve - vs;
#define NAME_IS(s) (nn == sizeof(s) - 1 && !strncasecmp(name, s, nn))
    if (NAME_IS("Content-Length")) {
      if (vl == 0 || vl > 15) return fail(h, 400, "invalid Content-Length");
      int64_t n = 0;
      for (size_t k = 0; k < vl; k++) {
        if (v[k] < '0' || v[k] > '9') return fail(h, 400, "invalid Content-Length");
        n = n * 10 + (v[k] - '0');
      }
      if (h->content_length >= 0 && h->content_length != n)
        return fail(h, 400, "conflicting Content-Length headers");
      h->content_length = n;
    } else if (NAME_IS("Transfer-Encoding")) {
      have_te = 1;
      if (vl == 7 && !strncasecmp(v, "chunked", 7)) h->chunked = 1;
      else return fail(h, 501, "unsupported Transfer-Encoding");
    } else if (NAME_IS("Connection")) {
      if (list_has(v, vl, "close")) conn_close = 1;
      if (list_has(v, vl, "keep-alive")) conn_keep = 1;
    } else if (NAME_IS("Expect")) {
      if (vl == 12 && !strncasecmp(v, "100-continue", 12)) h->expect_continue = 1;
      else return fail(h, 417, "unsupported Expect");
    } else if (NAME_IS("Host")) { /* RFC 9112 3.2: exactly one in HTTP/1.1, a valid authority */
      if (++n_host > 1) return fail(h, 400, "more than one Host header");
      if (!host_valid(v, vl)) return fail(h, 400, "invalid Host header");
    } else if (NAME_IS("X-Request-Id")) {
      if (++n_reqid > 1) return fail(h, 400, "more than one X-Request-Id header");
      for (size_t k = 0; k < vl; k++)
        if ((unsigned char)v[k] <= 0x20 || (unsigned char)v[k] >= 0x7f)
          return fail(h, 400, "X-Request-Id must be visible ASCII without spaces");
      if (copy_value(h->request_id, sizeof h->request_id, v, vl))
        return fail(h, 400, "X-Request-Id too long");
    } else if (NAME_IS("Authorization")) { /* two would leave the router to pick one: refused */
      if (++n_auth > 1) return fail(h, 400, "more than one Authorization header");
      if (copy_value(h->authorization, sizeof h->authorization, v, vl))
        return fail(h, 431, "Authorization header too large");
    } else if (NAME_IS("traceparent")) {
      if (copy_value(h->traceparent, sizeof h->traceparent, v, vl)) return fail(h, 431, "traceparent header too large");
    } else if (NAME_IS("tracestate")) {
      if (copy_value(h->tracestate, sizeof h->tracestate, v, vl)) return fail(h, 431, "tracestate header too large");
    } else if (NAME_IS("baggage")) {
      if (copy_value(h->baggage, sizeof h->baggage, v, vl)) return fail(h, 431, "baggage header too large");
    } else if (NAME_IS("Origin")) {
      if (copy_value(h->origin, sizeof h->origin, v, vl)) return fail(h, 431, "Origin header too large");
    } else if (NAME_IS("Access-Control-Request-Headers")) {
      if (copy_value(h->acr_headers, sizeof h->acr_headers, v, vl))
        return fail(h, 431, "Access-Control-Request-Headers too large");
    }
#undef NAME_IS
  }
  if (have_te && h->content_length >= 0)
    return fail(h, 400, "both Transfer-Encoding and Content-Length");
  /* RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing */
  if (have_te && h->minor == 0) return fail(h, 400, "Transfer-Encoding in an HTTP/1.0 request");
  if (!n_host && h->minor >= 1) return fail(h, 400, "HTTP/1.1 request without a Host header");
  if (conn_close) h->keep_alive = 0;
  else if (conn_keep) h->keep_alive = 1;
  return (long)end;
}

int eldr__http_chunk_size(const char *line, size_t n, uint64_t *size) {
  uint64_t v = 0;
  size_t i = 0;
  for (; i < n; i++) {
    char ch = line[i];
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
    if (d < 0) break;
    if (v > (1ull << 36)) return -1; /* so v * 16 + 15 cannot overflow */
    v = v * 16 + (uint64_t)d;
    if (v > (1ull << 40)) return -1; /* 2^36 itself followed by a digit passed 2^40 */
  }
  if (i == 0) return -1;
  while (i < n && (line[i] == ' ' || line[i] == '\t')) i++;
  if (i < n && line[i] != ';') return -1;
  for (; i < n; i++)
    if ((unsigned char)line[i] < 0x20 && line[i] != '\t') return -1;
  *size = v;
  return 0;
}
