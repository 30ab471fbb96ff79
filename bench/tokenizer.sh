#!/usr/bin/env bash
# Encode throughput of barata's tokenizer against llama.cpp's on the same GGUF
# files and the same ~1 MiB of text, with an id-for-id comparison of the two.
#
#   bench/tokenizer.sh LLAMA_CPP_DIR [BARATA] [GGUF...]
#
# LLAMA_CPP_DIR: a llama.cpp checkout (release b4748) built in LLAMA_CPP_DIR/build
# with the llama-tokenize and test-tokenizer-0 targets. The text is the first
# 1 MiB of its README.md, docs/**/*.md and src/*.cpp, concatenated (English
# prose, Markdown, C++; a little non-ASCII). Times are of encoding alone:
# test-tokenizer-0's own timer for llama.cpp, `barata tokenize --ids`'s for
# barata (both single-threaded, no BOS, specials not parsed), best of 3; then
# the whole command including loading the vocabulary (wall clock, best of 3).
# Prints a markdown table. Nothing here is a test: it asserts nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA="$(cd "$1" && pwd)"
BARATA="${2:-$ROOT/build/barata}"
shift $(( $# >= 2 ? 2 : 1 ))
if [ $# -eq 0 ]; then
  set -- "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$ROOT"/../shared/vocab/ggml-vocab-*.gguf
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
CORPUS="$WORK/corpus.txt"
python3 - "$LLAMA" "$CORPUS" <<'PY'
import glob, os, sys
root, out_path = sys.argv[1], sys.argv[2]
files = ["README.md"] + sorted(glob.glob("docs/**/*.md", root_dir=root, recursive=True)) \
      + sorted(glob.glob("src/*.cpp", root_dir=root))
out = b""
for f in files:
    out += open(os.path.join(root, f), "rb").read()
    if len(out) >= 1 << 20:
        break
out = out[: 1 << 20]
while out and (out[-1] & 0xC0) == 0x80:  # end on a character boundary
    out = out[:-1]
if out and out[-1] >= 0xC0:
    out = out[:-1]
open(out_path, "wb").write(out)
PY
BYTES=$(stat -c %s "$CORPUS")
best_wall() {  # best of 3 wall-clock runs of "$@", in ms
  local best=""
  for _ in 1 2 3; do
    local t0 t1
    t0=$(date +%s%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s%N)
    local ms=$(( (t1 - t0) / 1000000 ))
    if [ -z "$best" ] || [ "$ms" -lt "$best" ]; then best=$ms; fi
  done
  echo "$best"
}
echo "text: $BYTES bytes; machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo
echo "| vocabulary | tokens | ids equal | llama.cpp encode ms | barata encode ms | speed-up | llama-tokenize wall ms | barata tokenize wall ms |"
echo "|---|---:|---|---:|---:|---:|---:|---:|"
for M in "$@"; do
  [ -f "$M" ] || continue
  name=$(basename "$M" .gguf)
  cp "$CORPUS" "$WORK/text.txt"
  ref_ms="" our_ms=""
  for _ in 1 2 3; do  # best of 3 for both
    t=$("$LLAMA/build/bin/test-tokenizer-0" "$M" "$WORK/text.txt" 2>&1 |
      sed -n 's/.*tokenized in \([0-9.]*\) ms.*/\1/p')
    ref_ms=$(python3 -c "print(min(x for x in [$t, ${ref_ms:-1e30}]))")
    "$BARATA" tokenize -m "$M" --ids --no-bos -f "$WORK/text.txt" >"$WORK/barata.ids" 2>"$WORK/barata.err"
    t=$(sed -n 's/.*encoded in \([0-9.]*\) ms.*/\1/p' "$WORK/barata.err")
    our_ms=$(python3 -c "print(min(x for x in [$t, ${our_ms:-1e30}]))")
  done
  tr ' ' '\n' <"$WORK/barata.ids" >"$WORK/barata.tok"
  same=no
  cmp -s "$WORK/barata.tok" "$WORK/text.txt.tokcpp" && same=yes
  n=$(wc -l <"$WORK/text.txt.tokcpp")
  ref_wall=$(best_wall "$LLAMA/build/bin/llama-tokenize" -m "$M" -f "$WORK/text.txt" --ids --no-bos \
    --no-escape --no-parse-special --log-disable)
  our_wall=$(best_wall "$BARATA" tokenize -m "$M" --ids --no-bos -f "$WORK/text.txt")
  speed=$(python3 -c "print(f'{$ref_ms / $our_ms:.1f}x')")
  echo "| $name | $n | $same | $ref_ms | $our_ms | $speed | $ref_wall | $our_wall |"
done
