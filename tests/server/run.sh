#!/usr/bin/env bash
# ctest's entry to the Python tests of barata serve (tests/CMakeLists.txt):
#   tests/server/run.sh NAME BARATA_BINARY OUTPUT_DIR
# runs tests/server/test_NAME.py with the environment of
# scripts/fetch-server-deps.sh. Without that environment it skips (exit 77),
# or fails under BARATA_REQUIRE_DATA=1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NAME="$1"
export BARATA_CLI="$2"
export BARATA_TEST_OUT="$3"
mkdir -p "$BARATA_TEST_OUT"
PY="$ROOT/.venv-server/bin/python"
if [ ! -x "$PY" ]; then
  msg="$PY is absent: run scripts/fetch-server-deps.sh"
  if [ "${BARATA_REQUIRE_DATA:-0}" = 1 ]; then echo "error: $msg" >&2; exit 1; fi
  echo "Skipped: $msg"; exit 77
fi
exec "$PY" "$ROOT/tests/server/test_$NAME.py"
