#!/usr/bin/env bash
# Install the Debian 12 packages eldr needs to build, test, fuzz and plot;
# with arguments, those packages instead (scripts/cross-aarch64.sh: its
# toolchain and emulator). Idempotent: does nothing when everything is
# already installed.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libjansson-dev libevent-dev libxxhash-dev
      libcmocka-dev libopenblas-dev gnuplot-nox clang libclang-rt-14-dev curl
      python3-yaml python3-jsonschema  # scripts/check_deploy.py (ctest deploy_*)
      nats-server libnats-dev)  # the fleet bus: libnats links in, tests/serve/test_bus.c and `eldr demo --bus nats` run nats-server
[ $# -gt 0 ] && PKGS=("$@")
# A package counts as present only when an instance of this machine's own
# architecture (or an arch-independent one) is installed: `dpkg -s` fails on
# a name installed for two architectures, and succeeds on a foreign-arch one
# alone (libevent-dev:arm64 for a cross build replaces libevent-dev:amd64,
# which leaves the host build without libevent).
NATIVE=$(dpkg --print-architecture)
installed=$(dpkg-query -W -f='${Package} ${Architecture} ${db:Status-Abbrev}\n' "${PKGS[@]}" 2>/dev/null || true)
missing=()
for p in "${PKGS[@]}"; do
  if ! printf '%s\n' "$installed" | awk -v p="$p" -v a="$NATIVE" \
       '$1 == p && ($2 == a || $2 == "all") && $3 == "ii" { ok = 1 } END { exit !ok }'; then
    missing+=("$p:$NATIVE")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
