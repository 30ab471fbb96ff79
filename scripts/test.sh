#!/usr/bin/env bash
# Installs dependencies, fetches everything the tests read (the default model,
# Qwen2.5-Coder-0.5B and 1.5B, llama.cpp's vocabulary sets, the Python
# environment of barata serve's tests), builds and runs every test
# with BARATA_REQUIRE_DATA=1, so that a test whose data is absent fails instead
# of skipping. Ends with one summary line: how many tests ran, passed, failed
# and skipped, and the skip reasons grouped; the skipped tests are listed in
# BUILD_DIR/test-skips.tsv (name, kind gpu|isa|other, reason), which .ci/run reads.
# Usage: scripts/test.sh [release|sanitize]   (default: release)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-release}"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/fetch-model.sh" >/dev/null
"$ROOT/scripts/fetch-qwen2.sh" >/dev/null
"$ROOT/scripts/fetch-qwen2-1.5b.sh" >/dev/null
"$ROOT/scripts/fetch-gemma3.sh" >/dev/null
"$ROOT/scripts/fetch-test-data.sh" >/dev/null
"$ROOT/scripts/fetch-server-deps.sh" >/dev/null
DIR="$("$ROOT/scripts/build.sh" "$MODE" | tail -n1)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export BARATA_REQUIRE_DATA=1
JUNIT="$DIR/ctest-junit.xml"
rm -f "$JUNIT" "$DIR/test-skips.tsv"
rc=0
ctest --test-dir "$DIR" --output-on-failure -j "${JOBS:-$(nproc)}" --output-junit "$JUNIT" || rc=$?

# The summary, from ctest's JUnit file: a skipped test's reason is the line
# after googletest's "file:line: Skipped". A GPU test is one named Cuda* or
# whose reason names CUDA, the GPU or its driver.
python3 - "$JUNIT" "$DIR/test-skips.tsv" <<'PY' || true
import collections, re, sys
import xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
n = passed = failed = 0
skips = []
for c in cases:
    n += 1
    out = c.findtext("system-out") or ""
    if c.find("skipped") is not None or c.get("status") == "notrun":
        m = re.search(r": Skipped\n(.*?)\n?\[  SKIPPED \]", out, re.S)
        reason = " ".join((m.group(1) if m else "no reason given").split()) or "no reason given"
        gpu = c.get("name", "").startswith("Cuda") or re.search(r"\b(CUDA|GPU|driver)\b", reason, re.I)
        # A kernel test of an instruction set this CPU lacks (AVX-512 on an
        # AVX2 machine): the tests name the CPU's best ISA ("best here: ...").
        isa = re.search(r"\(best here: (scalar|avx2|avxvnni|avx512)\)", reason)
        skips.append((c.get("name", "?"), "gpu" if gpu else "isa" if isa else "other", reason))
    elif c.find("failure") is not None or c.find("error") is not None or c.get("status") == "fail":
        failed += 1
    else:
        passed += 1
with open(sys.argv[2], "w") as f:
    for s in skips:
        f.write("\t".join(s) + "\n")
groups = collections.Counter((k, r) for _, k, r in skips)
why = "; ".join(f"{c} x {k}: {r}" for (k, r), c in groups.most_common())
print(f"tests: {n} in all, {passed} passed, {failed} failed, {len(skips)} skipped"
      + (f" ({why})" if why else ""))
PY
exit "$rc"
