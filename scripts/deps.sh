#!/usr/bin/env bash
# Install the Debian 12 packages eldr needs to build, test, fuzz and plot.
# Idempotent: does nothing when everything is already installed.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libjansson-dev libevent-dev libxxhash-dev
      libcmocka-dev libopenblas-dev gnuplot-nox clang libclang-rt-14-dev curl
      python3-yaml python3-jsonschema  # scripts/check_deploy.py (ctest deploy_*)
      nats-server libnats-dev)  # the fleet bus: libnats links in, tests/serve/test_bus.c and `eldr demo --bus nats` run nats-server
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
