#!/usr/bin/env bash
# barata against one or more peers' llama-bench binaries (llama.cpp,
# ik_llama.cpp, ... built outside this repository), on the same GGUF files and
# thread counts, in one run: prefill of P tokens (ppP) and N one-token decode
# steps from an almost empty cache (tgN), as llama-bench defines them.
#
#   bench/compare.sh [-o OUT.md] [--peer NAME=LLAMA_BENCH]... FILE...
#
# For each file and thread count: every peer's llama-bench, then barata bench.
# A file no peer can load (barata's own types) gets barata's roofline instead:
# the decode's weight bytes per second as a fraction of the measured
# streaming-read bandwidth at the same thread count.
#
# Environment: THREADS (default 1,2), P (512), N (32), REPS (3), BARATA
# (build/barata), BARATA_ENV (extra environment for barata, e.g.
# "BARATA_ISA=avx2"). Writes a markdown report (stdout, or -o): the machine,
# its CPU flags, every value as median (mean ± sd) of REPS repetitions, and
# ratios of medians. Asserts nothing; prints what it runs on stderr.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT=""
PEERS=()
FILES=()
while [ $# -gt 0 ]; do
  case "$1" in
    -o) OUT="$2"; shift 2 ;;
    --peer) PEERS+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "error: compare.sh: unknown option '$1'" >&2; exit 2 ;;
    *) FILES+=("$1"); shift ;;
  esac
done
[ ${#FILES[@]} -gt 0 ] || { echo "error: compare.sh: no GGUF files given" >&2; exit 2; }
for p in "${PEERS[@]}"; do
  case "$p" in
    *=*) [ -x "${p#*=}" ] || { echo "error: compare.sh: peer '${p#*=}' is not executable" >&2; exit 2; } ;;
    *) echo "error: compare.sh: --peer wants NAME=PATH, got '$p'" >&2; exit 2 ;;
  esac
done
for f in "${FILES[@]}"; do
  [ -r "$f" ] || { echo "error: compare.sh: cannot read '$f'" >&2; exit 2; }
done
THREADS="${THREADS:-1,2}"
P="${P:-512}"
N="${N:-32}"
REPS="${REPS:-3}"
BARATA="${BARATA:-$ROOT/build/barata}"
read -r -a BENV <<<"${BARATA_ENV:-}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

IFS=',' read -r -a TLIST <<<"$THREADS"
i=0
for f in "${FILES[@]}"; do
  for p in "${PEERS[@]}"; do
    name="${p%%=*}"
    echo "$name: $(basename "$f") t=$THREADS ..." >&2
    if ! "${p#*=}" -m "$f" -p "$P" -n "$N" -t "$THREADS" -r "$REPS" -o json \
        >"$WORK/$i-$name.json" 2>"$WORK/$i-$name.err"; then
      echo "  $name cannot run this file (see its error below); no ratio" >&2
      tail -n 2 "$WORK/$i-$name.err" >&2 || true
      rm -f "$WORK/$i-$name.json"
    fi
  done
  for t in "${TLIST[@]}"; do
    echo "barata: $(basename "$f") t=$t ..." >&2
    env "${BENV[@]}" "$BARATA" bench -m "$f" -t "$t" -r "$REPS" --tests prefill,decode,roofline \
      -p "$P" -c 1 --decode-steps "$N" --json >"$WORK/$i-barata-$t.json" 2>"$WORK/$i-barata-$t.err"
  done
  echo "$f" >"$WORK/$i.file"
  i=$((i + 1))
done

{
  echo "machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) CPUs"
  echo "flags: $(grep -o -w -E 'avx2|fma|f16c|avx_vnni|avx512f|avx512bw|avx512vl|avx512dq|avx512_vnni|avx512_bf16|avx512_fp16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "barata: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)${BARATA_ENV:+ ($BARATA_ENV)}"
} >"$WORK/header"

python3 - "$WORK" "$i" "$P" "$N" "$THREADS" "${PEERS[@]}" >"$WORK/report.md" <<'PY'
import json, os, statistics, sys
work, n_files, P, N, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(",")
peers = [p.split("=", 1)[0] for p in sys.argv[6:]]

def fmt(med, mean, sd):
    return f"{med:.1f} ({mean:.1f} ± {sd:.1f})"

def stat(xs):
    return statistics.median(xs), statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0

print(open(f"{work}/header").read().rstrip())
print()
head = ["file", "test", "t", "barata tokens/s"]
for p in peers:
    head += [f"{p} tokens/s", f"barata / {p}"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * 3 + "---:|" * (1 + 2 * len(peers)))
own = []
for i in range(n_files):
    path = open(f"{work}/{i}.file").read().strip()
    name = os.path.basename(path)
    peer_rows = {}
    for p in peers:
        fn = f"{work}/{i}-{p}.json"
        peer_rows[p] = json.load(open(fn)) if os.path.exists(fn) else None
    if all(v is None for v in peer_rows.values()):
        own.append((name, i))
    for t in threads:
        b = json.load(open(f"{work}/{i}-barata-{t}.json"))["runs"][0]
        tests = [(f"pp{P}", b["prefill"][0]["tokens_per_s"], P, 0),
                 (f"tg{N}", b["decode"][0]["tokens_per_s"], 0, N)]
        for test, ts, n_p, n_g in tests:
            row = [name, test, t, fmt(ts["median"], ts["mean"], ts["sd"])]
            for p in peers:
                rows = peer_rows[p] or []
                ref = [r for r in rows if r["n_prompt"] == n_p and r["n_gen"] == n_g
                       and str(r["n_threads"]) == t]
                if not ref:
                    row += ["n/a", ""]
                    continue
                med, mean, sd = stat(ref[0]["samples_ts"])
                row += [fmt(med, mean, sd), f"**{ts['median'] / med:.2f}**"]
            print("| " + " | ".join(str(x) for x in row) + " |")
if own:
    print()
    print("Files no peer runs (barata's own types): decode against the measured streaming-read")
    print("bandwidth at the same thread count (bench's roofline).")
    print()
    print("| file | t | tg tokens/s | weight GB/s | streaming GB/s | fraction |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, i in own:
        for t in threads:
            r = json.load(open(f"{work}/{i}-barata-{t}.json"))["runs"][0]["roofline"]
            bw = r["bandwidth_gb_per_s"]
            print(f"| {name} | {t} | {1000 / r['decode_ms_per_step']['median']:.1f} "
                  f"| {r['weight_gb_per_s']:.1f} | {fmt(bw['median'], bw['mean'], bw['sd'])} "
                  f"| **{100 * r['fraction']:.0f}%** |")
PY
if [ -n "$OUT" ]; then
  cp "$WORK/report.md" "$OUT"
  echo "wrote $OUT" >&2
else
  cat "$WORK/report.md"
fi
