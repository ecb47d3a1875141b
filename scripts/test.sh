#!/usr/bin/env bash
# Install dependencies, build eldr and run every test (unit, integration,
# fuzz-corpus replay). Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
scripts/deps.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DELDR_WERROR=ON >/dev/null
ninja -C "$BUILD"
ctest --test-dir "$BUILD" --output-on-failure -j2
