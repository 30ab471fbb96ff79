#!/usr/bin/env bash
# Installs dependencies, fetches the default model, builds and runs every test.
# Usage: scripts/test.sh [release|sanitize]   (default: release)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-release}"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/fetch-model.sh" >/dev/null
DIR="$("$ROOT/scripts/build.sh" "$MODE" | tail -n1)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$DIR" --output-on-failure -j "${JOBS:-$(nproc)}"
