#!/usr/bin/env bash
# barata's prefill and decode rates against llama.cpp's llama-bench on the same
# GGUF file and the same thread counts, measured in the same session (for each
# thread count: llama-bench, then barata bench).
#
#   bench/llama-bench.sh LLAMA_BENCH [GGUF] [THREADS] [BARATA]
#
# LLAMA_BENCH: the llama-bench binary (llama.cpp release b4748, CPU build).
# GGUF defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf, THREADS to "1,2",
# BARATA to build/barata. Environment: P (prompt lengths, default 64,256),
# N (generated tokens, default 32), REPS (default 5).
#
# The tests match llama-bench's: ppP is one prefill of P tokens; tgN is N
# one-token decode steps from an (almost) empty cache, which barata runs as
# `bench -c 1 --decode-steps N` (its cache holds at least one token). Both
# tools time REPS repetitions after a warm-up; the table quotes medians of the
# per-repetition tokens/s. Prints a markdown table; asserts nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA_BENCH="$1"
GGUF="${2:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${3:-1,2}"
BARATA="${4:-$ROOT/build/barata}"
P="${P:-64,256}"
N="${N:-32}"
REPS="${REPS:-5}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

IFS=',' read -r -a TLIST <<<"$THREADS"
for t in "${TLIST[@]}"; do
  echo "llama-bench t=$t ..." >&2
  "$LLAMA_BENCH" -m "$GGUF" -p "$P" -n "$N" -t "$t" -r "$REPS" -o json >"$WORK/llama-$t.json" 2>/dev/null
  echo "barata bench t=$t ..." >&2
  "$BARATA" bench -m "$GGUF" -t "$t" -r "$REPS" --tests prefill,decode -p "$P" -c 1 \
    --decode-steps "$N" --json >"$WORK/barata-$t.json" 2>/dev/null
done

python3 - "$WORK" "$THREADS" "$N" <<'PY'
import json, statistics, sys
work, threads, n_gen = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
print("| test | threads | barata tokens/s | llama.cpp tokens/s | barata / llama.cpp |")
print("|---|---:|---:|---:|---:|")
for t in threads:
    llama = json.load(open(f"{work}/llama-{t}.json"))
    barata = json.load(open(f"{work}/barata-{t}.json"))["runs"][0]
    rows = []
    for p in barata["prefill"]:
        ref = [r for r in llama if r["n_prompt"] == p["n_tokens"] and r["n_gen"] == 0]
        rows.append((f"pp{p['n_tokens']}", p["tokens_per_s"]["median"], ref))
    for d in barata["decode"]:
        ref = [r for r in llama if r["n_gen"] == n_gen and r["n_prompt"] == 0]
        rows.append((f"tg{n_gen}", d["tokens_per_s"]["median"], ref))
    for name, ours, ref in rows:
        theirs = statistics.median(ref[0]["samples_ts"]) if ref else float("nan")
        print(f"| {name} | {t} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")
PY
