/* eldr/upstream.h — the HTTP/1.1 client (net layer): one connection to one
 * server (the router's legs, health checks and scrapes; the demo's
 * supervisor), one exchange at a time over a keep-alive socket, the request
 * written straight to the socket, the reply parsed incrementally (Content-Length, chunked or
 * until close) and handed over as it arrives. Replaces evhttp's client for
 * the upstream legs: no per-request header lists, no epoll_ctl churn.
 * A request that went out on a reused connection the worker had closed
 * (no reply byte came) is sent once more on a fresh one (eldr_up_resent).
 *
 * Callbacks run on the loop thread. From inside a callback the caller may
 * start the next exchange, abort, or free the connection. After done() the
 * connection is idle (or closed) and reusable.
 */
#ifndef ELDR_UPSTREAM_H
#define ELDR_UPSTREAM_H

#include <event2/event.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>

typedef struct eldr_up eldr_up;

typedef struct eldr_up_cbs {
  /* status line and headers read; ctype = Content-Type or "" */
  void (*head)(void *arg, int status, const char *ctype);
  /* body bytes (de-chunked), in order */
  void (*data)(void *arg, const char *p, size_t n);
  /* 0: reply complete; ELDR_EIO: connect/reset/EOF mid-reply; ELDR_EPARSE: not
   * HTTP; ELDR_ETIMEOUT: connect timeout; ELDR_ENOMEM: no socket could be
   * opened (the router's fds or memory exhausted: not the worker's fault) */
  void (*done)(void *arg, int err);
} eldr_up_cbs;

/* A connection to addr (copied); connects lazily. NULL on ENOMEM. */
eldr_up *eldr_up_new(struct event_base *base, const struct sockaddr *addr, socklen_t len);
/* Fail an exchange whose TCP connect takes longer than this (ELDR_ETIMEOUT);
 * 0 = no limit (default). */
void eldr_up_set_connect_timeout(eldr_up *u, double seconds);
/* Close and release (deferred when called from inside a callback). */
void eldr_up_free(eldr_up *u);
/* Start an exchange: the request bytes are the concatenation of iov. Returns
 * 0 (callbacks follow, never synchronously) or ELDR_EINVAL (one is active). */
int eldr_up_request(eldr_up *u, const struct iovec *iov, int iovcnt, const eldr_up_cbs *cbs,
                     void *arg);
/* Drop the exchange in flight: closes the socket (the worker sees the client
 * leave), no further callbacks. No-op when idle. */
void eldr_up_abort(eldr_up *u);
/* Bytes of the current (or just failed) exchange's request reached a
 * connected socket: the worker may have read it. 0 when no connection took
 * a byte (refused, connect timeout, a kept-alive socket whose write the
 * kernel refused at once). A kept-alive socket that took the request and
 * then failed counts, even when the resend's fresh connection is refused:
 * a worker that read the request and died looks the same as a keep-alive
 * close that crossed it. Valid until the next eldr_up_request. */
int eldr_up_sent(const eldr_up *u);
/* The current (or just ended) exchange was sent again on a fresh connection:
 * it went out on a reused kept-alive connection that failed (EOF, reset,
 * broken pipe) before any byte of a reply, which is how a worker's
 * keep-alive close that crossed the request looks. At most once per
 * exchange; never after a reply byte, never from a fresh connection (its
 * failure is the exchange's). Valid until the next eldr_up_request. */
int eldr_up_resent(const eldr_up *u);
/* Inside the head callback: the reply body's Content-Length, or -1 when
 * the body is chunked or runs until close. */
long long eldr_up_body_length(const eldr_up *u);
/* An exchange is in flight. */
int eldr_up_active(const eldr_up *u);
/* Stop (on = 1) or resume (0) reading the reply from the socket: bytes
 * already read are still delivered; the worker's sends then block in TCP.
 * A new exchange starts resumed. */
void eldr_up_pause(eldr_up *u, int on);
/* Idle connection: release request/reply buffers above keep bytes (a 16 MiB
 * request body must not stay with a pooled connection). Returns the bytes
 * released. No-op while an exchange is in flight. */
size_t eldr_up_trim(eldr_up *u, size_t keep);

/* For tests and fuzzing: start an exchange without any socket, then feed
 * reply bytes as if read from one (eof: the peer closed). */
void eldr_up_test_begin(eldr_up *u, const eldr_up_cbs *cbs, void *arg);
void eldr_up_test_feed(eldr_up *u, const char *p, size_t n, int eof);

#endif
