# eldr router image: multi-stage on Debian bookworm, runs as a non-root user.
#
#   docker build -t eldr:dev .
#   docker run --rm -p 8000:8000 -v $PWD/deploy/eldr.json:/etc/eldr/eldr.json:ro \
#       -v $PWD/routing.json:/etc/eldr/routing.json:ro eldr:dev
#
# The config (and the artifact it names) are mounted, never baked in; see
# deploy/README.md for Kubernetes and systemd.

FROM debian:bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config libjansson-dev libevent-dev \
      libxxhash-dev libcmocka-dev libopenblas-dev libnats-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/opt/eldr \
 && ninja -C build eldr \
 && cmake --install build --component runtime

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libjansson4 libevent-2.1-7 libevent-pthreads-2.1-7 libxxhash0 libopenblas0-pthread libnats3.4 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin eldr
COPY --from=build /opt/eldr /opt/eldr
USER 10001:10001
# The port the router listens on and the health check asks: one variable, so
# they cannot disagree (it is passed as --port, which overrides the config
# file's "port"; run with -e ELDR_PORT=9000 -p 9000:9000 to move it).
ENV ELDR_PORT=8000
EXPOSE 8000
# /health is 200 only while at least one prefill and one decode worker
# answer, and 503 from the moment a SIGTERM starts the drain.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD curl -fsS "http://127.0.0.1:${ELDR_PORT}/health" >/dev/null || exit 1
# docker stop sends SIGTERM: requests in flight finish (--shutdown-timeout,
# 30 s by default); give it that long: docker stop -t 40
STOPSIGNAL SIGTERM
ENTRYPOINT ["/bin/sh", "-c", "exec /opt/eldr/bin/eldr serve --port \"$ELDR_PORT\" \"$@\"", "eldr"]
CMD ["--config", "/etc/eldr/eldr.json"]
