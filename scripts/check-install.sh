#!/usr/bin/env bash
# Install the build in BUILD_DIR into a scratch prefix and check the result:
# the binary runs, the docs and the deployment examples are where the
# Dockerfile and the systemd unit expect them. Usage: check-install.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check-install.sh BUILD_DIR}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" --component runtime >/dev/null
for f in bin/eldr share/doc/eldr/README.md share/doc/eldr/docs/serve.md \
         share/doc/eldr/examples/eldr.json share/doc/eldr/examples/eldr.service \
         share/doc/eldr/examples/eldr.yaml share/doc/eldr/examples/eldr-dns.json \
         share/doc/eldr/examples/vllm-headless.yaml; do
  [ -e "$prefix/$f" ] || { echo "check-install: $f is not installed" >&2; exit 1; }
done
# the unit's Documentation= pages, where they are after an install
root=$(cd "$(dirname "$0")/.." && pwd)
for doc in $(sed -n 's/^Documentation=//p' "$root/deploy/systemd/eldr.service"); do
  f=${doc#file:///usr/local/}
  [ -e "$prefix/$f" ] || { echo "check-install: the unit's Documentation= $doc is not installed" >&2; exit 1; }
done
"$prefix/bin/eldr" --help >/dev/null
echo "check-install: ok ($prefix)"
