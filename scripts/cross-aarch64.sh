#!/usr/bin/env bash
# Cross-compile eldr for aarch64 Linux and run its tests under qemu-user:
# correctness on Arm (the NEON paths against the portable ones), not speed.
#
# Usage: scripts/cross-aarch64.sh [build-dir] [ctest arguments...]
#   (default build-aarch64; without ctest arguments, the tests that need no
#   other program built for Arm: see TESTS below)
#
# Nothing is installed for arm64: Debian's arm64 library packages are
# downloaded with apt-get's own client into <build-dir>/debs (a private apt
# state under <build-dir>/apt: no `dpkg --add-architecture`, no change to the
# system's package lists) and unpacked with dpkg-deb into <build-dir>/sysroot.
# The compiler (gcc-aarch64-linux-gnu, with its C library) and qemu-user are
# native packages, installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-aarch64}
shift || true
mkdir -p "$B"
B=$(cd "$B" && pwd)
T=aarch64-linux-gnu

# ---- the toolchain and the emulator (native packages) ----------------------
missing=()
for p in gcc-aarch64-linux-gnu qemu-user; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# ---- the arm64 libraries, downloaded and unpacked (not installed) ----------
# The -dev packages eldr builds against and the run-time libraries their
# .so links and the tests need. No OpenBLAS (optional: the build falls back
# to its own loops, ELDR_HAVE_OPENBLAS unset).
DEBS=(libjansson-dev libjansson4
      libevent-dev libevent-2.1-7 libevent-core-2.1-7 libevent-extra-2.1-7
      libevent-pthreads-2.1-7 libevent-openssl-2.1-7 libssl3
      libxxhash-dev libxxhash0 libcmocka-dev libcmocka0
      libnats-dev libnats3.4 libprotobuf-c1)
APT=(-q -o APT::Architecture=arm64 -o APT::Architectures::=arm64
     -o "Dir::State::Lists=$B/apt/lists" -o "Dir::Cache=$B/apt/cache"
     -o Dir::State::status=/dev/null -o APT::Sandbox::User=root)
S=$B/sysroot
stamp="$S/.debs"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${DEBS[*]}" ]; then
  echo "== arm64 sysroot: ${#DEBS[@]} Debian packages into $S"
  mkdir -p "$B/apt/lists/partial" "$B/apt/cache/archives/partial" "$B/debs"
  rm -rf "$S" "$B/debs"/*.deb
  apt-get "${APT[@]}" update >/dev/null
  (cd "$B/debs" && apt-get "${APT[@]}" download "${DEBS[@]}" >/dev/null)
  for d in "$B/debs"/*.deb; do dpkg-deb -x "$d" "$S"; done
  # the toolchain's dynamic loader and C library at the paths the programs
  # ask for, so that qemu -L "$S" finds them there and nothing of the host's
  mkdir -p "$S/lib/$T"
  for f in /usr/$T/lib/*.so*; do ln -sf "$f" "$S/lib/$T/"; done
  ln -sf /usr/$T/lib/ld-linux-aarch64.so.1 "$S/lib/ld-linux-aarch64.so.1"
  echo "${DEBS[*]}" >"$stamp"
fi

# ---- build -----------------------------------------------------------------
echo "== build (aarch64-linux-gnu-gcc, $B)"
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DELDR_WERROR=ON \
      -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DELDR_AARCH64_SYSROOT="$S" >/dev/null
ninja -C "$B"
file "$B/eldr" | sed 's/, BuildID.*//'
t1=$(date +%s)

# ---- tests under qemu-user -------------------------------------------------
# By default the unit tests of the layers with vector paths and the fuzz
# corpora replayed (every fuzz target), each at the CPU's widest level and,
# the SIMD tests, again with ELDR_NO_SIMD=1 (the portable twins).
if [ $# -eq 0 ]; then
  TESTS='^(test_(base|cpu|writefile|batch_union|counts|footprint|signature|sigshard|tracegen|tracestats|latency|assign|placement|policy|quality|kmeans|fit|fit_scale|watch|jscan|routed_experts|reply_experts|reply_layers|reply_stream|trace|trace_counts|trace_stream|artifact|compact_plugin|sigcache|bufpool|busring|serve_units|dns_answers)(_nosimd)?|fuzz_.*_replay)$'
  set -- -R "$TESTS"
fi
echo "== tests under $(qemu-aarch64 --version | head -n 1)"
ctest --test-dir "$B" --output-on-failure -j2 "$@"
echo "== the same tests with ELDR_NO_SIMD=1 (the portable paths)"
ELDR_NO_SIMD=1 ctest --test-dir "$B" --output-on-failure -j2 "$@"
echo "== aarch64: build $((t1 - t0))s, tests $(($(date +%s) - t1))s"
