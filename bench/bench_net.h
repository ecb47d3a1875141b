/* bench_net.h — what the socket benchmarks (bench_proxy.c, bench_sse.c)
 * share: a blocking TCP connection to 127.0.0.1. Header-only (each
 * benchmark is one program); any thread. */
#ifndef ELDR_BENCH_NET_H
#define ELDR_BENCH_NET_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* A connected socket to 127.0.0.1:port with TCP_NODELAY, or -1 (errno). */
static inline int bench_connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

#endif
