#!/usr/bin/env bash
# Cross-compile eldr for aarch64 Linux and run its tests under qemu-user:
# correctness on Arm (the NEON paths against the portable ones), not speed.
#
# Usage: scripts/cross-aarch64.sh [build-dir] [ctest arguments...]
#   (default build-aarch64; without ctest arguments, the suite as described
#   at the tests below; with them, one ctest run with those)
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
scripts/deps.sh gcc-aarch64-linux-gnu qemu-user # the toolchain and the emulator (native packages)

# ---- the arm64 libraries, downloaded and unpacked (not installed) ----------
# The -dev packages eldr builds against and the run-time libraries their
# .so links and the tests need; OpenBLAS's pthread variant, whose
# update-alternatives links (made by its postinst, not in the package) are
# made below.
DEBS=(libjansson-dev libjansson4
      libevent-dev libevent-2.1-7 libevent-core-2.1-7 libevent-extra-2.1-7
      libevent-pthreads-2.1-7 libevent-openssl-2.1-7 libssl3
      libxxhash-dev libxxhash0 libcmocka-dev libcmocka0
      libnats-dev libnats3.4 libprotobuf-c1
      libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5)
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
  # OpenBLAS where the alternatives would put it
  ob=$S/usr/lib/$T/openblas-pthread
  ln -sf openblas-pthread/libopenblas.so "$S/usr/lib/$T/libopenblas.so"
  ln -sf openblas-pthread/libopenblas.so.0 "$S/usr/lib/$T/libopenblas.so.0"
  for h in "$S/usr/include/$T/openblas-pthread"/*.h; do ln -sf "openblas-pthread/${h##*/}" "$S/usr/include/$T/"; done
  [ -e "$ob/libopenblas.so.0" ] || { echo "cross-aarch64.sh: no OpenBLAS in $ob" >&2; exit 1; }
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
# Without arguments: the whole suite at the NEON level but for the tests
# that start an arm64 program other than through eldr-emulated (CMakeLists.txt),
# which needs the kernel's binfmt_misc: eldr starting itself (`eldr demo`:
# test_demo_cli, test_cmd_checks), a benchmark program run directly
# (test_cli_status), an installed copy of eldr (install_tree,
# deploy_systemd); and promtool's (an x86 check of the same text). Then the
# vector kernels' tests and every fuzz corpus again with ELDR_NO_SIMD=1 (the
# portable paths on Arm).
SKIP='^(install_tree|deploy_systemd|metrics_promtool|test_demo_cli|test_cmd_checks|test_cli_status)$'
KERNELS='^(test_(cpu|batch_union|counts|sigshard|signature|routed_experts|reply_experts|reply_layers|reply_stream|jscan|trace_counts|sigcache)|fuzz_.*_replay)$'
# OpenBLAS: one thread (its idle threads spin; under the emulator that is
# the whole machine)
export OPENBLAS_NUM_THREADS=1
echo "== tests under $(qemu-aarch64 --version | head -n 1)"
if [ $# -gt 0 ]; then
  ctest --test-dir "$B" --output-on-failure -j2 "$@"
else
  ctest --test-dir "$B" --output-on-failure -j2 -E "$SKIP"
  echo "== the vector kernels' tests and the fuzz corpora with ELDR_NO_SIMD=1 (the portable paths)"
  ELDR_NO_SIMD=1 ctest --test-dir "$B" --output-on-failure -j2 -R "$KERNELS"
fi
echo "== aarch64: build $((t1 - t0))s, tests $(($(date +%s) - t1))s"
