#!/usr/bin/env bash
# Builds barata with CUDA for Hopper (sm_90) on a lent GPU machine and runs every
# test there, the CUDA ones included, which must then pass rather than skip.
#
# That machine has the CUDA toolkit, a compiler and (usually) cmake and ninja,
# but none of the Debian -dev packages the build needs and no registry. Fetch
# them here first with scripts/fetch-debs.sh; this script unpacks .debs/ into a
# private prefix (never into /) and builds against it. From the device tool:
#   run(command="bash scripts/gpu-check.sh", carry=[".debs"], timeout_s=540)
# (carry ".debs/dev" alone when the machine's cmake >= 3.25 and ninja are known
# to be there). Logs go to $OUT when set, else to the build directory.
#
# Options:
#   --allow-no-gpu   dry run without a GPU: CUDA tests skip instead of failing
#   --carried-tools  use the carried cmake/ninja even when the machine has them
#   --build-dir DIR  build directory (default build-gpu)
#   --bench-only     build, then the benchmark; no tests
#   --no-bench       build and test; no benchmark
#   --no-sanitizers  no compute-sanitizer step (below)
#   --no-build       use the binaries already in the build directory (a dry run
#                    of the benchmark on a machine without CUDA)
#   -- ARGS...       extra arguments for the cmake configure step
#
# The benchmark (docs/cuda.md, "The GPU check and its synthetic models") builds
# its models on the machine: barata_synth writes a random-weight Qwen2.5-0.5B
# (F16) into a temporary folder and `barata quantize` makes every block-32/64
# type and barata's schemes of it; the K-quants (and the Q4_K_M mix) come from
# a second 0.5B (preset llama-0.5b), whose rows are multiples of their 256-weight
# block. `barata bench --device cuda -v` measures each (prefill,
# decode, the batch sweep B=1..64 with the kernel chosen per width, the
# roofline; SVG charts with --plot), greedy `barata run` on CUDA and on the CPU
# are compared, and the crossover step runs the batch sweep of a few types
# twice, skinny kernels up to width 64 (BARATA_CUDA_QMM_MAX=64) against
# dequant + cuBLAS at every width (=0), to measure where cuBLAS starts to win,
# and a third time on fp32 activations (BARATA_CUDA_Q8_ACT=0) against 8-bit.
# Everything lands in $OUT (or the logs folder), the summary in
# cuda-results.md. Environment:
#   BARATA_TEST_TIMEOUT  seconds a test may run (default 300)
#   BARATA_BENCH_DEVICE  cuda (default) or cpu (a dry run of the pipeline)
#   BARATA_BENCH_PRESET  barata_synth preset (default qwen2.5-0.5b; tiny for a dry run)
#   BARATA_BENCH_LAYERS  override the presets' layer count
#   BARATA_BENCH_TYPES   its quantized types (default: q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl
#                        int8-tensor int8-row int4-tensor int4-row int4-g128 nf4)
#   BARATA_BENCH_KPRESET the K-quants' preset (default llama-0.5b: every row a multiple
#                        of 256; the same as BARATA_BENCH_PRESET for a dry run)
#   BARATA_BENCH_KTYPES  its types (default "q4_k q4_k_m q5_k q6_k"; q4_k_m is Q4_K
#                        with Q6_K attn_v, ffn_down and output; "" skips them)
#   BARATA_BENCH_ARGS    bench flags (default "--tests prefill,decode,batch,roofline -p 512,2048
#                        -c 64,1024 -b 1,2,4,8,16,32,64 -r 3 -v")
#   BARATA_BENCH_BUDGET  seconds for the whole benchmark step (default 390)
#   BARATA_CROSSOVER_TYPES  types of the crossover step (default "q4_k q8_0 nf4"; "" skips it)
#   BARATA_CROSSOVER_BUDGET seconds of the budget kept for it (default 90)
#   BARATA_BENCH_TMP     folder for the model files (default: a new one in /tmp)
#   BARATA_ARCH_PRESETS  the architecture rows' presets checked after the benchmark
#                        (default "qwen3-0.6b gemma3-270m llama3.2-1b phi3-mini"; "" skips)
#
# Between the tests and the benchmark, NVIDIA compute-sanitizer (the toolkit's:
# on PATH, else /usr/local/cuda/bin, else $CUDA_HOME/bin; without one the step
# says so and the summary reads "not available") runs the kernel-level CUDA
# tests of tests/barata_tests under each of its tools in turn, `--tool T
# --error-exitcode 1 --print-limit 20`, all of them within one time budget:
# each tool gets what is left of it divided by the tools left, so racecheck,
# usually the slowest, goes last and inherits what the others did not use. A
# tool stopped at its limit is reported incomplete (not failed, unless it had
# reported an error); errors reported, a failed test under a tool or a filter
# that matches no test fail the step, and the script then exits non-zero after
# the benchmark has run. Logs
# sanitizer-<tool>.log, summaries sanitizer-<tool>.md, the table in
# sanitizers.md and cuda-results.md. Skipped with --no-sanitizers, with
# --bench-only, and without a GPU (--allow-no-gpu). Environment:
#   BARATA_SANITIZER_TOOLS   (default "memcheck initcheck synccheck racecheck")
#   BARATA_SANITIZER_FILTER  gtest filter (default "CudaDequant*.*:Types/CudaMatmul.*:
#                            Backends/BackendOps.*/cuda_*", as one word: the device
#                            dequantizers, every matmul path and every op; not the
#                            whole-model CudaEngine.* tests)
#   BARATA_SANITIZER_BUDGET  seconds for all the tools together (default 120)
#   BARATA_SANITIZER_ARGS    more compute-sanitizer flags for every tool, and
#   BARATA_SANITIZER_ARGS_<TOOL> for one (e.g. BARATA_SANITIZER_ARGS_RACECHECK=
#                            "--racecheck-report all")
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-gpu"
ALLOW_NO_GPU=0
CARRIED_TOOLS=0
BENCH_ONLY=0
NO_BENCH=0
NO_BUILD=0
NO_SANITIZERS=0
EXTRA_CMAKE=()
while [ $# -gt 0 ]; do
  case "$1" in
    --allow-no-gpu) ALLOW_NO_GPU=1 ;;
    --carried-tools) CARRIED_TOOLS=1 ;;
    --build-dir) BUILD="$(realpath -m "$2")"; shift ;;
    --bench-only) BENCH_ONLY=1 ;;
    --no-bench) NO_BENCH=1 ;;
    --no-build) NO_BUILD=1 ;;
    --no-sanitizers) NO_SANITIZERS=1 ;;
    --) shift; EXTRA_CMAKE=("$@"); break ;;
    -h | --help) awk 'NR > 1 && /^set -euo pipefail/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

PREFIX="${BARATA_DEPS_PREFIX:-/tmp/barata-deps}"
LOGS="${OUT:-$BUILD/logs}"
mkdir -p "$LOGS"
START=$SECONDS
step() { echo "== [$((SECONDS - START))s] $*"; }
die() { echo "gpu-check: $*" >&2; exit 1; }

# dpkg-deb where there is one; a .deb is an ar archive of tarballs otherwise.
unpack() {  # unpack DEB DIR
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
  else
    local tmp
    tmp="$(mktemp -d)"
    (cd "$tmp" && ar x "$1" && tar -xf data.tar.* -C "$2")
    rm -rf "$tmp"
  fi
}

cmake_ok() {  # the machine's cmake, if any, is new enough
  local v
  v="$(cmake --version 2>/dev/null | awk 'NR==1 {print $3}')" || return 1
  [ -n "$v" ] && [ "$(printf '%s\n3.25\n' "$v" | sort -V | head -1)" = 3.25 ]
}

build_all() {
  step "unpacking .debs into $PREFIX"
  compgen -G ".debs/dev/*.deb" >/dev/null || die "no .debs/dev/*.deb: run scripts/fetch-debs.sh and carry .debs"
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX/dev" "$PREFIX/bin"
  for f in .debs/dev/*.deb; do unpack "$ROOT/$f" "$PREFIX/dev"; done
  DEV="$PREFIX/dev/usr"
  # pkg-config files name /usr literally; point them at the private prefix.
  find "$PREFIX/dev" -name '*.pc' -exec sed -i -E \
    "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=$DEV#" {} +
  export PKG_CONFIG_PATH="$DEV/lib/x86_64-linux-gnu/pkgconfig:$DEV/share/pkgconfig"
  # Headers for compiles that get no include directory from a CMake target (such
  # as .cu files including fmt); searched like -isystem, after the command line's.
  export CPLUS_INCLUDE_PATH="$DEV/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"

  need_tools=()
  if [ "$CARRIED_TOOLS" = 1 ] || ! cmake_ok; then need_tools+=(cmake ctest); fi
  if [ "$CARRIED_TOOLS" = 1 ] || ! command -v ninja >/dev/null; then need_tools+=(ninja); fi
  if ! command -v pkg-config >/dev/null; then need_tools+=(pkg-config); fi

  # Carried tools load only the carried libraries this system lacks, never one
  # that would shadow a system library which compilers started by cmake also load.
  if [ ${#need_tools[@]} -gt 0 ]; then
    step "using carried ${need_tools[*]}"
    compgen -G ".debs/tools/*.deb" >/dev/null || die "need ${need_tools[*]} but .debs/tools is empty"
    mkdir -p "$PREFIX/tools" "$PREFIX/tools-libs"
    for f in .debs/tools/*.deb; do unpack "$ROOT/$f" "$PREFIX/tools"; done
    # CMake 3.25's FindCUDAToolkit fails on CUDA 13, which dropped libnvToolsExt:
    # it sets a property on CUDA::nvToolsExt without checking that it exists
    # (the fix in later CMake releases; this dev image's copy carries it too).
    sed -i 's/^\( *\)if(CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)$/\1if(TARGET CUDA::nvToolsExt AND CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)/' \
      "$PREFIX"/tools/usr/share/cmake-*/Modules/FindCUDAToolkit.cmake
    bins=()
    for t in "${need_tools[@]}"; do
      ln -sf "$PREFIX/tools/usr/bin/$t" "$PREFIX/bin/$t"
      bins+=("$PREFIX/tools/usr/bin/$(basename "$(readlink -f "$PREFIX/tools/usr/bin/$t")")")
    done
    for _ in 1 2 3 4 5 6 7 8; do
      missing="$(LD_LIBRARY_PATH="$PREFIX/tools-libs" ldd "${bins[@]}" 2>/dev/null |
        awk '/not found/ {print $1}' | sort -u)"
      [ -z "$missing" ] && break
      for so in $missing; do
        lib="$(find "$PREFIX/tools" -name "$so" | head -1)"
        [ -n "$lib" ] || die "carried tools need $so, which neither this system nor .debs/tools has"
        ln -sf "$(readlink -f "$lib")" "$PREFIX/tools-libs/$so"
      done
    done
    echo "carried libraries loaded: $(find "$PREFIX/tools-libs" -mindepth 1 -printf '%f ')"
    export LD_LIBRARY_PATH="$PREFIX/tools-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$PREFIX/bin:$PATH"
  fi
  echo "$(cmake --version | head -1), ninja $(ninja --version)"

  step "configure ($BUILD)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_MAKE_PROGRAM="$(command -v ninja)" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBARATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$DEV" \
    "${EXTRA_CMAKE[@]}" >"$LOGS/configure.log" 2>&1 || {
    tail -40 "$LOGS/configure.log"
    die "configure failed; see configure.log"
  }
  grep -E "^(fmt|spdlog|CLI11|nlohmann_json|GTest)_DIR" "$BUILD/CMakeCache.txt" || true
  grep "barata:" "$LOGS/configure.log" || true

  step "build ($(nproc) jobs)"
  local targets=()
  if [ "$BENCH_ONLY" = 1 ]; then targets=(--target barata_cli barata_synth); fi
  cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}" >"$LOGS/build.log" 2>&1 || {
    grep -E -B2 -A12 "error|FAILED" "$LOGS/build.log" | head -80
    die "build failed; see build.log"
  }
  grep -E "warning" "$LOGS/build.log" | sort -u | head -20 || true

}

run_tests() {
  step "tests"
  if [ "$ALLOW_NO_GPU" = 0 ]; then export BARATA_REQUIRE_GPU=1; fi
  ctest --test-dir "$BUILD" -j "$(nproc)" --timeout "${BARATA_TEST_TIMEOUT:-300}" --output-on-failure \
    --output-junit "$LOGS/ctest-junit.xml" >"$LOGS/ctest.log" 2>&1 || test_rc=$?
  grep -E "Test +#[0-9]+: Cuda" "$LOGS/ctest.log" || true
  sed -n '/tests passed/,$p' "$LOGS/ctest.log"

}

# ---- compute-sanitizer over the CUDA tests -----------------------------------

# The toolkit's compute-sanitizer: on PATH, else /usr/local/cuda/bin, else
# $CUDA_HOME/bin; fails where there is none.
find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer || true)" /usr/local/cuda/bin/compute-sanitizer \
    "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}"; do
    if [ -n "$c" ] && [ -x "$c" ]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

# A compute-sanitizer log line that opens a report (an error or hazard, an API
# error) starts "========= " and a non-space; its banner and summaries are not
# reports, and the indented lines under a report locate it.
SAN_REPORT='^========= [^ ]'
SAN_NOT_REPORT='COMPUTE-SANITIZER|(ERROR|RACECHECK|LEAK) SUMMARY|Target application returned|Warning:|Note:'

# san_errors LOG: "N summary", N from the log's ERROR SUMMARY (or, lacking
# one, from racecheck's RACECHECK SUMMARY), else "N counted": the reports of
# a run stopped before it printed its summary.
san_errors() {
  awk -v rep="$SAN_REPORT" -v not="$SAN_NOT_REPORT" '
    /^========= ERROR SUMMARY: [0-9]+ error/ && total == "" { total = $4 }
    /^========= RACECHECK SUMMARY:/ && race == "" && match($0, /\([0-9]+ error/) {
      race = substr($0, RSTART + 1, RLENGTH - 7)
    }
    $0 ~ rep && $0 !~ not { n++ }
    END {
      if (total != "") print total, "summary"
      else if (race != "") print race, "summary"
      else print n + 0, "counted"
    }' "$1"
}

# san_first LOG: the log's first three reports, each under the test that was
# running, with up to three of the lines that locate it (no backtraces).
san_first() {
  awk -v rep="$SAN_REPORT" -v not="$SAN_NOT_REPORT" '
    /^\[ RUN      \] / { test = substr($0, 14) }
    $0 ~ rep { inrep = 0 }
    $0 ~ rep && $0 !~ not {
      if (++n > 3) exit
      if (n == 1 || test != shown) { print "(in " (test == "" ? "no test yet" : test) ")"; shown = test }
      print
      inrep = 1
      k = 0
      next
    }
    inrep && /^=========     / && !/Saved host backtrace|Host Frame|^=========  +in / && k < 3 { print; k++ }
  ' "$1"
}

# The kernel-level CUDA tests under each compute-sanitizer tool in turn (the
# header says how): sanitizer-<tool>.log and .md, the table in sanitizers.md
# (SANITIZER_MD), which cuda-results.md includes. Non-zero when a tool failed.
sanitizers() {
  step "compute-sanitizer"
  local tools="${BARATA_SANITIZER_TOOLS:-memcheck initcheck synccheck racecheck}"
  local filter="${BARATA_SANITIZER_FILTER:-CudaDequant*.*:Types/CudaMatmul.*:Backends/BackendOps.*/cuda_*}"
  local budget="${BARATA_SANITIZER_BUDGET:-120}"
  local tests="$BUILD/tests/barata_tests" md="$LOGS/sanitizers.md" cs version
  SANITIZER_MD="$md"
  printf '### compute-sanitizer over the CUDA tests\n\n' >"$md"
  if ! cs="$(find_sanitizer)"; then
    echo "no compute-sanitizer (not on PATH, in /usr/local/cuda/bin or \$CUDA_HOME/bin): sanitizers not run"
    echo "compute-sanitizer: **not available** (not on PATH, in /usr/local/cuda/bin or \$CUDA_HOME/bin); not run." >>"$md"
    return 0
  fi
  if [ ! -x "$tests" ]; then
    echo "no $tests: sanitizers not run"
    echo "**Not run**: no tests/barata_tests in the build directory." >>"$md"
    return 1
  fi
  version="$("$cs" --version 2>/dev/null | grep -m1 -i version || true)"
  echo "$cs (${version:-version unknown}); filter $filter; budget $budget s"

  local n=0 k=0 t rc=0 rows="" details="" t_start
  for t in $tools; do n=$((n + 1)); done
  t_start="$(now)"
  for t in $tools; do
    local left tmo log="$LOGS/sanitizer-$t.log" var flags=()
    # What is left of the budget, shared among the tools left.
    left="$(awk -v a="$t_start" -v b="$(now)" -v B="$budget" 'BEGIN { printf "%d", B - (b - a) }')"
    tmo=$((left / (n - k)))
    k=$((k + 1))
    case "$t" in
      memcheck | racecheck | synccheck | initcheck) ;;
      *)
        rows+="| $t | - | - | - | **FAIL**: not a compute-sanitizer tool |"$'\n'
        echo "  $t: not a compute-sanitizer tool"
        rc=1
        continue
        ;;
    esac
    if [ "$tmo" -lt 10 ]; then
      rows+="| $t | - | - | - | skipped: the budget of $budget s is spent |"$'\n'
      echo "  $t: skipped, the budget of $budget s is spent"
      continue
    fi
    var="BARATA_SANITIZER_ARGS_$(echo "$t" | tr '[:lower:]' '[:upper:]')"
    read -r -a flags <<<"${BARATA_SANITIZER_ARGS:-} ${!var:-}"
    local shown="compute-sanitizer --tool $t --error-exitcode 1 --print-limit 20${flags[*]:+ ${flags[*]}}"
    local t0 st=0 dt
    t0="$(now)"
    # timeout signals its process group: the tests under the tool stop too.
    BARATA_REQUIRE_GPU=1 timeout -k 10 "$tmo" "$cs" --tool "$t" --error-exitcode 1 --print-limit 20 \
      "${flags[@]}" "$tests" "--gtest_filter=$filter" --gtest_color=no >"$log" 2>&1 || st=$?
    dt="$(secs_since "$t0")"

    local ran ok failed skipped errs how what tcell ecell first failed_names
    ran="$(grep -c '^\[ RUN      \] ' "$log" || true)"
    ok="$(grep -c '^\[       OK \] ' "$log" || true)"
    failed="$(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$log" || true)"
    skipped="$(grep -cE '^\[  SKIPPED \] .*\([0-9]+ ms\)$' "$log" || true)"
    read -r errs how <<<"$(san_errors "$log")"
    tcell="$ran: $ok passed"
    if [ "$failed" -gt 0 ]; then tcell+=", $failed failed"; fi
    if [ "$skipped" -gt 0 ]; then tcell+=", $skipped skipped"; fi
    ecell="$errs"
    if [ "$how" != summary ]; then ecell="$errs (no summary: counted)"; fi
    what=pass
    if [ "$errs" -gt 0 ]; then
      what="**FAIL**: $errs error$([ "$errs" = 1 ] || echo s) reported"
    elif [ "$failed" -gt 0 ]; then
      what="**FAIL**: $failed test$([ "$failed" = 1 ] || echo s) failed under it"
    elif [ "$st" = 124 ] || [ "$st" = 137 ]; then
      what="incomplete: stopped at its limit of $tmo s"
    elif [ "$st" != 0 ]; then
      what="**FAIL**: exit $st"
    elif [ "$ran" = 0 ]; then
      what="**FAIL**: the filter matched no test"
    fi
    case "$what" in "**FAIL"*) rc=1 ;; esac
    rows+="| $t | $tcell | $ecell | $dt | $what |"$'\n'
    echo "  $t: tests $tcell; errors $ecell; ${dt} s; $what"

    first="$(san_first "$log")"
    failed_names="$(grep -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$log" | head -5 |
      sed -E 's/^\[  FAILED  \] //; s/ \([0-9]+ ms\)$//; s/, where GetParam.*//' | paste -sd, - | sed 's/,/, /g' || true)"
    local block=""
    if [ -n "$first" ]; then block+=$'\n```\n'"$first"$'\n```\n'; fi
    if [ -n "$failed_names" ]; then
      block+=$'\n'"Failed under $t$([ "$failed" -le 5 ] || echo " (the first 5 of $failed)"): $failed_names"$'\n'
    fi
    if [ "$what" != pass ] && [ -z "$block" ]; then
      block+=$'\n```\n'"$(tail -5 "$log")"$'\n```\n'
    fi
    if [ -n "$block" ]; then
      details+=$'\n'"**$t**: $what"$'\n'"$block"
      printf '%s\n' "${first:-$(tail -5 "$log")}" | sed 's/^/    /'
    fi
    {
      echo "## compute-sanitizer --tool $t"
      echo
      echo "- command: \`$shown tests/barata_tests --gtest_filter=$filter\` (limit $tmo s)"
      echo "- compute-sanitizer: $cs, ${version:-version unknown}"
      echo "- tests run: $tcell"
      echo "- errors reported: $ecell"
      echo "- seconds: $dt (exit $st)"
      echo "- result: $what"
      printf '%s' "$block"
    } >"$LOGS/sanitizer-$t.md"
  done

  {
    echo "\`compute-sanitizer --tool T --error-exitcode 1 --print-limit 20\` on \`tests/barata_tests --gtest_filter=$filter\`"
    echo "(${version:-version unknown}), the tools in turn within $budget s: $(secs_since "$t_start") s in all."
    echo
    echo "| tool | tests run | errors reported | s | result |"
    echo "|---|---|---:|---:|---|"
    printf '%s' "$rows"
    printf '%s' "$details"
  } >>"$md"
  cat "$md"
  return "$rc"
}

# ---- the benchmark ---------------------------------------------------------------

now() { date +%s.%N; }
secs_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# timed NAME STDOUT STDERR CMD...: runs CMD, adds a row to the step-time table.
timed() {
  local name="$1" out="$2" err="$3" t0 rc
  shift 3
  t0="$(now)"
  "$@" >"$out" 2>"$err"
  rc=$?
  local dt
  dt="$(secs_since "$t0")"
  local what=ok
  case "$rc" in
    0) ;;
    124 | 130 | 137) what="stopped at its time limit (exit $rc)" ;;
    *) what="exit $rc" ;;
  esac
  STEP_ROWS+="| $name | $dt | $what |"$'\n'
  echo "  $name: ${dt} s, $what"
  if [ "$rc" != 0 ]; then tail -5 "$err" | sed 's/^/    /'; fi
  return "$rc"
}

# quantize_each SRC PRESET TYPES: barata quantize SRC to each type, appending
# the files and their names to the caller's files and names arrays.
quantize_each() {
  local src="$1" pre="$2" t
  for t in $3; do
    local q="$tmp/$pre-$t.gguf" qargs=(--type "$t")
    # llama.cpp's Q4_K_M in outline (llama-quant.cpp): Q4_K, Q6_K for the
    # output and attn_v / ffn_down (there: half of their layers; here all).
    if [ "$t" = q4_k_m ]; then
      qargs=(--type q4_k --output-type q6_k --override 'blk.*.attn_v.weight=q6_k'
        --override 'blk.*.ffn_down.weight=q6_k')
    fi
    if timed "barata quantize ${qargs[*]} ($pre)" "$LOGS/quantize-$t.log" "$LOGS/quantize-$t.err" \
      "$bin" quantize "$src" "$q" "${qargs[@]}"; then
      files+=("$q")
      names+=("$(echo "$t" | tr '[:lower:]' '[:upper:]')")
      presets+=("$pre")
    else
      rc=1
    fi
  done
}

# bench_summary MD: one line of fields from a `barata bench` markdown output
# (medians; "-" where absent): tg B=1 tokens/s, B=16, B=64, the knee (the
# smallest B whose tokens/s reach 90% of the sweep's best), pp512 and pp2048
# tokens/s, pp2048 TFLOP/s, decode's % of the peak bandwidth (Device
# section) and the roofline fraction against the measured bandwidth.
bench_summary() {
  awk '
    function med(cell) { return match(cell, /\([^)]*\)/) ? substr(cell, RSTART + 1, RLENGTH - 2) : "-" }
    /^### / { sec = $2 }
    /^\|/ && $0 !~ /---/ {
      n = split($0, f, "|")
      if (sec == "Batch" && f[3] ~ /^ *[0-9]+ *$/) { b = f[3] + 0; tps[b] = med(f[5]); bs[++nb] = b }
      if (sec == "Prefill:" && f[3] ~ /^ *[0-9]+ *$/) pp[f[3] + 0] = med(f[6])
      if (sec == "Roofline:" && f[9] ~ /%/) { frac = f[9]; gsub(/ /, "", frac) }
    }
    /^  - decode at C=/ { if (match($0, /= [0-9.]+% of the peak/)) hbm = substr($0, RSTART + 2, RLENGTH - 14) }
    /^  - prefill P=2048:/ { tf = $4 }
    END {
      best = 0
      for (i = 1; i <= nb; i++) if (tps[bs[i]] + 0 > best) best = tps[bs[i]] + 0
      knee = "-"
      for (i = 1; i <= nb; i++) if (knee == "-" && best > 0 && tps[bs[i]] + 0 >= 0.9 * best) knee = bs[i]
      v1 = (1 in tps) ? tps[1] : "-"; v16 = (16 in tps) ? tps[16] : "-"; v64 = (64 in tps) ? tps[64] : "-"
      printf "%s %s %s %s %s %s %s %s %s\n", v1, v16, v64, knee, (512 in pp) ? pp[512] : "-",
        (2048 in pp) ? pp[2048] : "-", tf == "" ? "-" : tf, hbm == "" ? "-" : hbm, frac == "" ? "-" : frac
    }' "$1"
}

# ratio A B: A / B to two decimals, or "-".
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }

# The generated ids of a `barata run --json` output, comma-separated.
json_ids() { grep -o '"generated_ids":\[[^]]*\]' "$1" | head -1 | sed 's/.*\[//; s/\]//'; }
# The top logits of generated token I (from 0) of such an output (--top-logits).
json_top() { grep -o '{"top_logits":\[\[[^}]*\]\]}' "$1" | sed -n "$(($2 + 1))p" | sed 's/{"top_logits":\[\(.*\)\]}/\1/'; }
# Its text field, JSON-escaped as printed.
json_text() { grep -o '"text":"\([^"\\]\|\\.\)*"' "$1" | head -1 | sed 's/^"text":"//; s/"$//'; }

benchmark() {
  step "benchmark"
  local device="${BARATA_BENCH_DEVICE:-cuda}"
  local preset="${BARATA_BENCH_PRESET:-qwen2.5-0.5b}"
  local types="${BARATA_BENCH_TYPES:-q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl int8-tensor int8-row int4-tensor int4-row int4-g128 nf4}"
  local ktypes="${BARATA_BENCH_KTYPES-q4_k q4_k_m q5_k q6_k}"
  local kpreset="${BARATA_BENCH_KPRESET:-llama-0.5b}"
  local budget="${BARATA_BENCH_BUDGET:-390}"
  local bench_args="${BARATA_BENCH_ARGS:---tests prefill,decode,batch,roofline -p 512,2048 -c 64,1024 -b 1,2,4,8,16,32,64 -r 3 -v}"
  local cross_types="${BARATA_CROSSOVER_TYPES-q4_k q8_0 nf4}"
  local cross_budget="${BARATA_CROSSOVER_BUDGET:-90}"
  if [ -z "$cross_types" ]; then cross_budget=0; fi
  local bin="$BUILD/barata" synth="$BUILD/barata_synth" results="$LOGS/cuda-results.md"
  local t_start
  t_start="$(now)"
  case "$device" in
    cuda | cpu) ;;
    *) echo "BARATA_BENCH_DEVICE must be cuda or cpu, not '$device'"; return 2 ;;
  esac
  if [ "$device" = cuda ] && [ "$HAVE_GPU" = 0 ]; then
    echo "no GPU: benchmark skipped (BARATA_BENCH_DEVICE=cpu runs the pipeline on the CPU)"
    return 0
  fi
  [ -x "$synth" ] || { echo "no $synth (built with barata_cli)"; return 1; }
  # --device on run and bench: the CUDA benchmark needs it; a CPU dry run
  # works without it.
  local run_dev=() bench_dev=() cpu_dev=()
  if "$bin" bench --help 2>&1 | grep -q -- --device; then
    bench_dev=(--device "$device")
  elif [ "$device" = cuda ]; then
    echo "no CUDA benchmark yet: 'barata bench' has no --device"
    return 0
  fi
  local have_run_dev=0
  if "$bin" run --help 2>&1 | grep -q -- --device; then
    have_run_dev=1
    run_dev=(--device "$device")
    cpu_dev=(--device cpu)
  fi
  local threads=()
  if [ "$device" = cpu ]; then threads=(-t "$(nproc)"); fi

  local tmp="${BARATA_BENCH_TMP:-}"
  if [ -z "$tmp" ]; then tmp="$(mktemp -d /tmp/barata-bench.XXXXXX)"; else mkdir -p "$tmp"; fi
  local layers=() tag="$preset"
  if [ -n "${BARATA_BENCH_LAYERS:-}" ]; then
    layers=(--layers "$BARATA_BENCH_LAYERS")
    tag="$preset, $BARATA_BENCH_LAYERS layers"
  fi
  STEP_ROWS=""
  local rc=0 f16="$tmp/$preset-f16.gguf"
  echo "models in $tmp; device $device; budget ${budget} s"

  # 1. The F16 model, then its quantizations (CPU, all cores).
  if ! timed "barata_synth --preset $preset --type F16" "$LOGS/synth.log" "$LOGS/synth.err" \
    "$synth" --preset "$preset" --type F16 --seed 0 "${layers[@]}" -o "$f16"; then
    rm -rf "$tmp"
    return 1
  fi
  local files=("$f16") names=(F16) presets=("$preset")
  quantize_each "$f16" "$preset" "$types"
  # The K-quants on a shape whose every row is a multiple of their 256-weight
  # block (on Qwen2.5-0.5B's 896-wide rows barata quantize keeps F16 for all
  # but ffn_down, so such a file would measure F16).
  if [ -n "$ktypes" ]; then
    local kf16="$f16"
    if [ "$kpreset" != "$preset" ]; then
      kf16="$tmp/$kpreset-f16.gguf"
      if ! timed "barata_synth --preset $kpreset --type F16" "$LOGS/synth-k.log" \
        "$LOGS/synth-k.err" "$synth" --preset "$kpreset" --type F16 --seed 0 "${layers[@]}" \
        -o "$kf16"; then
        kf16=""
        rc=1
      fi
    fi
    if [ -n "$kf16" ]; then quantize_each "$kf16" "$kpreset" "$ktypes"; fi
  fi

  # 2. Greedy ids on the device against the CPU, on the F16 file. A CPU dry
  # run compares one thread against all of them (the pipeline, not a device).
  local prompt="Once upon a time" n_agree=16 agreement dev_name=CUDA dev_threads=()
  if [ "$device" = cpu ]; then dev_name="CPU, 1 thread" dev_threads=(-t 1); fi
  if [ "$have_run_dev" = 0 ] && [ "$device" = cuda ]; then
    agreement="- not compared: 'barata run' has no --device"
  else
    local ok=1
    timed "barata run ${run_dev[*]} ${dev_threads[*]} -n $n_agree" "$LOGS/run-device.json" \
      "$LOGS/run-device.log" timeout -k 10 120 "$bin" run -m "$f16" -p "$prompt" -n "$n_agree" \
      --temp 0 --json --top-logits 2 "${run_dev[@]}" "${dev_threads[@]}" || ok=0
    timed "barata run ${cpu_dev[*]} -t $(nproc) -n $n_agree" "$LOGS/run-cpu.json" \
      "$LOGS/run-cpu.log" timeout -k 10 120 "$bin" run -m "$f16" -p "$prompt" -n "$n_agree" \
      --temp 0 --json --top-logits 2 "${cpu_dev[@]}" -t "$(nproc)" || ok=0
    if [ "$ok" = 0 ]; then
      agreement="- not compared: a run failed (run-device.log, run-cpu.log)"
      rc=1
    else
      local gi ci
      gi="$(json_ids "$LOGS/run-device.json")"
      ci="$(json_ids "$LOGS/run-cpu.json")"
      agreement="- prompt \"$prompt\", greedy (\`--temp 0\`), $n_agree tokens, F16 file"$'\n'
      agreement+="- $dev_name ids: \`$gi\`"$'\n'"- CPU ids: \`$ci\`"$'\n'
      agreement+="- $dev_name text: \`\` $(json_text "$LOGS/run-device.json") \`\`"$'\n'
      agreement+="- CPU text: \`\` $(json_text "$LOGS/run-cpu.json") \`\`"$'\n'
      if [ "$gi" = "$ci" ]; then
        agreement+="- **equal**: the same $(echo "$gi" | tr ',' '\n' | grep -c .) ids"
      else
        local -a ga ca
        IFS=, read -r -a ga <<<"$gi"
        IFS=, read -r -a ca <<<"$ci"
        local i=0
        while [ "$i" -lt "${#ga[@]}" ] && [ "$i" -lt "${#ca[@]}" ] && [ "${ga[$i]}" = "${ca[$i]}" ]; do
          i=$((i + 1))
        done
        agreement+="- **differ** first at generated token $i: $dev_name ${ga[$i]:-(end)}, CPU ${ca[$i]:-(end)}"$'\n'
        agreement+="- top-2 (id, logit) there: $dev_name \`$(json_top "$LOGS/run-device.json" "$i")\`, CPU \`$(json_top "$LOGS/run-cpu.json" "$i")\`"
      fi
    fi
  fi
  printf "%s\n" "$agreement" | sed "s/^/  /"

  # 3. barata bench on each file, sharing what is left of the budget. At the
  # limit bench gets one SIGINT and prints what it measured (--foreground: a
  # second SIGINT, which timeout otherwise sends its process group as well,
  # makes bench exit at once with nothing printed).
  local sections="" n=${#files[@]} k
  for k in "${!files[@]}"; do
    local left tmo name="${names[$k]}"
    left="$(awk -v a="$t_start" -v b="$(now)" -v B="$((budget - cross_budget))" 'BEGIN { printf "%d", B - (b - a) }')"
    tmo=$((left / (n - k)))
    if [ "$tmo" -lt 15 ]; then tmo=$((left < 15 ? left : 15)); fi
    if [ "$tmo" -lt 10 ]; then
      STEP_ROWS+="| barata bench $name | - | skipped: the budget of $budget s is spent |"$'\n'
      sections+=$'\n'"### $name"$'\n\n'"Not measured: the benchmark's budget of $budget s was spent."$'\n'
      rc=1
      continue
    fi
    # shellcheck disable=SC2086  # bench_args is a list of flags
    timed "barata bench $name" "$LOGS/bench-$name.md" "$LOGS/bench-$name.log" \
      timeout --foreground -s INT -k 15 "$tmo" "$bin" bench -m "${files[$k]}" "${bench_dev[@]}" "${threads[@]}" \
      $bench_args --plot "$LOGS/plots-$name" || rc=1
    sections+=$'\n'"$(sed -e 's/^#### /##### /' -e 's/^### /#### /' \
      -e "1s/^## barata bench\$/### $name (${presets[$k]}, $(du -m "${files[$k]}" | cut -f1) MiB)/" "$LOGS/bench-$name.md")"$'\n'
  done

  # 4. The crossover: each type's batch sweep with the skinny kernels at every
  # width up to 64 and with dequant + cuBLAS at every width; the first width
  # where cuBLAS is at least as fast is where the default should switch.
  local crossover=""
  if [ -n "$cross_types" ]; then
    local ct n_ct=0 cross_start
    cross_start="$(now)"
    for ct in $cross_types; do n_ct=$((n_ct + 1)); done
    crossover="| type | B | skinny tokens/s | cuBLAS tokens/s | cuBLAS / skinny | skinny, fp32 activations | 8-bit / fp32 activations |"$'\n'
    crossover+="|---|---:|---:|---:|---:|---:|---:|"$'\n'
    local found=""
    for ct in $cross_types; do
      local cname f="" i
      cname="$(echo "$ct" | tr '[:lower:]' '[:upper:]')"
      for i in "${!names[@]}"; do [ "${names[$i]}" = "$cname" ] && f="${files[$i]}"; done
      if [ -z "$f" ]; then
        crossover+="| $cname | - | not measured: no such file among the benchmark's types | | |"$'\n'
        continue
      fi
      local per=$((cross_budget / (3 * n_ct))) mx
      if [ "$per" -lt 8 ]; then per=8; fi
      # 64: skinny kernels at every width (8-bit activations where the type
      # has them); 0: cuBLAS at every width; 64f: skinny on fp32 activations.
      local third=/dev/null
      for mx in 64 0 64f; do
        local q8=1
        if [ "$mx" = 64f ]; then
          [ "$ct" != nf4 ] || continue  # NF4 has no 8-bit form
          q8=0 third="$LOGS/crossover-$cname-64f.csv"
        fi
        BARATA_CUDA_QMM_MAX=${mx%f} BARATA_CUDA_Q8_ACT=$q8 \
          timed "crossover $cname BARATA_CUDA_QMM_MAX=${mx%f} BARATA_CUDA_Q8_ACT=$q8" \
          "$LOGS/crossover-$cname-$mx.csv" "$LOGS/crossover-$cname-$mx.log" \
          timeout --foreground -s INT -k 10 "$per" "$bin" bench -m "$f" "${bench_dev[@]}" \
          "${threads[@]}" --tests batch -b 1,2,4,8,12,16,24,32,48,64 -r 3 --csv || rc=1
      done
      # Median tokens/s per B of each run, joined on B.
      local rows
      rows="$(awk -F, '
        FNR == 1 { file++ }
        $1 == "batch" && $6 == "tokens_per_s" { v[file, $4] = $9; bs[$4] = 1 }
        END {
          n = 0
          for (b in bs) list[++n] = b + 0
          for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
            if (list[j] < list[i]) { t = list[i]; list[i] = list[j]; list[j] = t }
          for (i = 1; i <= n; i++) {
            b = list[i]; q = v[1, b]; c = v[2, b]; f = v[3, b]
            printf "%d %s %s %s %s %s\n", b, (q == "" ? "-" : sprintf("%.0f", q)),
              (c == "" ? "-" : sprintf("%.0f", c)),
              (q == "" || c == "" || q == 0 ? "-" : sprintf("%.2f", c / q)),
              (f == "" ? "-" : sprintf("%.0f", f)),
              (q == "" || f == "" || f == 0 ? "-" : sprintf("%.2f", q / f))
          }
        }' "$LOGS/crossover-$cname-64.csv" "$LOGS/crossover-$cname-0.csv" "$third")"
      local first="" b q c r fq fr
      while read -r b q c r fq fr; do
        [ -n "$b" ] || continue
        crossover+="| $cname | $b | $q | $c | $r | $fq | $fr |"$'\n'
        if [ -z "$first" ] && [ "$r" != - ] && awk -v r="$r" 'BEGIN { exit !(r >= 1) }'; then
          first="$b"
        fi
      done <<<"$rows"
      found+="- $cname: cuBLAS at least as fast from B = ${first:-(none up to 64)}"$'\n'
    done
    crossover+=$'\n'"$found"
    crossover+="- the default switches above B = 16 (BARATA_CUDA_QMM_MAX); step $(secs_since "$cross_start") s"
  fi

  # 5. One row per file, and the goals' ratios (against F16 and Q4_0 of the
  # same preset, at B=1).
  local table="" f16_b1="-" q40_b1="-" b1
  for k in "${!files[@]}"; do
    [ -s "$LOGS/bench-${names[$k]}.md" ] || continue
    read -r b1 _ _ _ _ _ _ _ _ <<<"$(bench_summary "$LOGS/bench-${names[$k]}.md")"
    if [ "${names[$k]}" = F16 ]; then f16_b1="$b1"; fi
    if [ "${names[$k]}" = Q4_0 ]; then q40_b1="$b1"; fi
  done
  table="| type | preset | MiB | tg B=1 tokens/s | % of peak HBM | roofline fraction | B=16 tokens/s | B=16 / B=1 | B=64 tokens/s | knee B | pp512 tokens/s | pp2048 tokens/s | pp2048 TFLOP/s | B=1 / F16 | B=1 / Q4_0 |"$'\n'
  table+="|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"$'\n'
  for k in "${!files[@]}"; do
    local nm="${names[$k]}" b16 b64 knee p512 p2048 tf hbm frac mib r16 r0
    if [ ! -s "$LOGS/bench-$nm.md" ]; then
      table+="| $nm | ${presets[$k]} | | not measured | | | | | | | | | | | |"$'\n'
      continue
    fi
    read -r b1 b16 b64 knee p512 p2048 tf hbm frac <<<"$(bench_summary "$LOGS/bench-$nm.md")"
    mib="$(du -m "${files[$k]}" | cut -f1)"
    r16="-" r0="-"
    if [ "${presets[$k]}" = "$preset" ]; then r16="$(ratio "$b1" "$f16_b1")" r0="$(ratio "$b1" "$q40_b1")"; fi
    table+="| $nm | ${presets[$k]} | $mib | $b1 | $hbm | $frac | $b16 | $(ratio "$b16" "$b1") | $b64 | $knee | $p512 | $p2048 | $tf | $r16 | $r0 |"$'\n'
  done

  # 6. The summary, ready for docs/cuda.md.
  local gpu cuda
  gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  cuda="$(nvcc --version 2>/dev/null | grep -o 'release [^,]*, V[0-9.]*' || echo "no nvcc")"
  {
    echo "## Results: ${gpu%%,*}${gpu:+, }$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    if [ -n "$gpu" ]; then
      echo "- GPU: ${gpu%%,*}; driver ${gpu#*, }; CUDA: nvcc $cuda"
    else
      echo "- GPU: none (a dry run on the CPU); CUDA: nvcc $cuda"
    fi
    echo "- host: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
    echo "- models: barata_synth \`--preset $tag --seed 0\` (random weights, std 0.02), F16 quantized by \`barata quantize\` to $types; \`--preset $kpreset\` F16 quantized to ${ktypes:-(none)}"
    echo "- bench: \`barata bench ${bench_dev[*]} ${threads[*]} $bench_args\` (device $device)"
    if [ -n "$SANITIZER_MD" ] && [ -s "$SANITIZER_MD" ]; then
      echo
      cat "$SANITIZER_MD"
    fi
    echo
    echo "### Step times"
    echo
    echo "| step | s | result |"
    echo "|---|---:|---|"
    printf '%s' "$STEP_ROWS"
    echo "| benchmark step, all | $(secs_since "$t_start") | |"
    echo
    echo "### Per type (medians; the sections below have mean ± sd)"
    echo
    printf '%s' "$table"
    echo
    echo "### $dev_name against the CPU: greedy ids"
    echo
    echo "$agreement"
    if [ -n "$crossover" ]; then
      echo
      echo "### Crossover: skinny kernels against dequant + cuBLAS (batch sweep, median tokens/s)"
      echo
      echo "$crossover"
    fi
    printf '%s\n' "$sections"
  } >"$results"
  RESULTS_WRITTEN=1
  echo "  wrote $results ($(secs_since "$t_start") s)"
  rm -rf "$tmp"
  return "$rc"
}

# ---- the architecture rows on the device -------------------------------------

# Each architecture row's full-shape synthetic model (barata_synth presets),
# F16 and Q8_0: greedy ids on the device against the CPU on a prompt longer
# than Gemma 3's window (so its local layers slide), and decode/prefill
# tokens/s. Summary in arch-results.md.
arch_check() {
  step "architectures"
  local presets="${BARATA_ARCH_PRESETS-qwen3-0.6b gemma3-270m llama3.2-1b phi3-mini}"
  local bin="$BUILD/barata" synth="$BUILD/barata_synth" results="$LOGS/arch-results.md"
  [ -n "$presets" ] || return 0
  if [ "$HAVE_GPU" = 0 ]; then echo "no GPU: architectures skipped"; return 0; fi
  local tmp rc=0 p t prompt
  tmp="$(mktemp -d /tmp/barata-arch.XXXXXX)"
  prompt="$(for _ in $(seq 60); do printf 'the quick brown fox jumps over a lazy dog. '; done)"
  {
    echo "## Architecture rows on the device: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Greedy, 16 tokens after a prompt of $(echo "$prompt" | wc -w) words (over 512 tokens: Gemma 3's window); \`barata bench --device cuda --tests prefill,decode -p 512 -c 64,2048 -r 3\`."
    echo
    echo "| preset | type | ids CUDA = CPU | first difference | tg C=64 tokens/s | tg C=2048 tokens/s | pp512 tokens/s |"
    echo "|---|---|---|---|---:|---:|---:|"
  } >"$results"
  for p in $presets; do
    local layers=()
    if [ "$p" = phi3-mini ]; then layers=(--layers 8); fi
    for t in F16 Q8_0; do
      local f="$tmp/$p-$t.gguf" tag="$p-$t" same="-" diff="" tg64="-" tg2k="-" pp="-"
      if ! timeout -k 5 120 "$synth" --preset "$p" --type "$t" --seed 0 "${layers[@]}" -o "$f" \
        >"$LOGS/arch-$tag.log" 2>&1; then
        echo "| $p${layers[*]:+ (${layers[*]})} | $t | synth failed | | | | |" >>"$results"
        rc=1
        continue
      fi
      timeout -k 5 120 "$bin" run -m "$f" -p "$prompt" -n 16 -c 4096 --temp 0 --json --top-logits 2 \
        --device cuda >"$LOGS/arch-$tag-cuda.json" 2>>"$LOGS/arch-$tag.log" || rc=1
      timeout -k 5 180 "$bin" run -m "$f" -p "$prompt" -n 16 -c 4096 --temp 0 --json --top-logits 2 \
        --device cpu -t "$(nproc)" >"$LOGS/arch-$tag-cpu.json" 2>>"$LOGS/arch-$tag.log" || rc=1
      local gi ci
      gi="$(json_ids "$LOGS/arch-$tag-cuda.json" || true)"
      ci="$(json_ids "$LOGS/arch-$tag-cpu.json" || true)"
      if [ -z "$gi" ] || [ -z "$ci" ]; then
        same="run failed"
      elif [ "$gi" = "$ci" ]; then
        same="yes (16)"
      else
        same="no"
        local -a ga ca
        IFS=, read -r -a ga <<<"$gi"
        IFS=, read -r -a ca <<<"$ci"
        local i=0
        while [ "$i" -lt "${#ga[@]}" ] && [ "${ga[$i]}" = "${ca[$i]:-}" ]; do i=$((i + 1)); done
        diff="token $i: CUDA \`$(json_top "$LOGS/arch-$tag-cuda.json" "$i")\` CPU \`$(json_top "$LOGS/arch-$tag-cpu.json" "$i")\`"
      fi
      if timeout --foreground -s INT -k 10 60 "$bin" bench -m "$f" --device cuda --tests prefill,decode \
        -p 512 -c 64,2048 -r 3 --csv >"$LOGS/arch-$tag-bench.csv" 2>>"$LOGS/arch-$tag.log"; then
        tg64="$(awk -F, '$1 == "decode" && $4 == 64 && $6 == "tokens_per_s" { printf "%.0f", $9 }' "$LOGS/arch-$tag-bench.csv")"
        tg2k="$(awk -F, '$1 == "decode" && $4 == 2048 && $6 == "tokens_per_s" { printf "%.0f", $9 }' "$LOGS/arch-$tag-bench.csv")"
        pp="$(awk -F, '$1 == "prefill" && $4 == 512 && $6 == "tokens_per_s" { printf "%.0f", $9 }' "$LOGS/arch-$tag-bench.csv")"
      else
        rc=1
      fi
      echo "| $p${layers[*]:+ (${layers[*]})} | $t | $same | $diff | ${tg64:--} | ${tg2k:--} | ${pp:--} |" >>"$results"
      rm -f "$f"
    done
  done
  rm -rf "$tmp"
  cat "$results"
  return "$rc"
}

main() {
  test_rc=0
  san_rc=0
  bench_rc=0
  SANITIZER_MD=""
  RESULTS_WRITTEN=0
  cd "$ROOT"
  step "machine"
  grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null || true
  echo "cores: $(nproc)  compiler: $(c++ --version 2>/dev/null | head -1 || echo none)"
  if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  if command -v nvcc >/dev/null; then
    nvcc --version | tail -1
  elif [ "$NO_BUILD" = 0 ]; then
    die "no nvcc on PATH or in /usr/local/cuda/bin"
  fi
  if nvidia-smi -L 2>/dev/null; then
    HAVE_GPU=1
  else
    HAVE_GPU=0
    [ "$ALLOW_NO_GPU" = 1 ] || die "nvidia-smi sees no GPU (use --allow-no-gpu for a dry run)"
    echo "no GPU: dry run, CUDA tests will skip"
  fi

  if [ "$NO_BUILD" = 1 ]; then
    step "no build: using $BUILD"
    [ -x "$BUILD/barata" ] || die "--no-build: no $BUILD/barata"
  else
    build_all
  fi
  if [ "$BENCH_ONLY" = 0 ]; then run_tests; fi
  # compute-sanitizer before the benchmark; its failure is the exit status
  # after the benchmark has run.
  if [ "$BENCH_ONLY" = 1 ] || [ "$NO_SANITIZERS" = 1 ]; then
    :
  elif [ "$HAVE_GPU" = 0 ]; then
    echo "no GPU: compute-sanitizer skipped"
  else
    sanitizers || san_rc=$?
  fi
  if [ "$NO_BENCH" = 0 ]; then
    benchmark || bench_rc=$?
    arch_check || bench_rc=$?
  fi
  # No benchmark summary this run: cuda-results.md holds the sanitizers' table.
  if [ -n "$SANITIZER_MD" ] && [ "$RESULTS_WRITTEN" = 0 ]; then
    local gpu
    gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
    {
      echo "## Results: ${gpu%%,*}${gpu:+, }$(date -u '+%Y-%m-%d %H:%M UTC')"
      echo
      echo "- GPU: ${gpu%%,*}; driver ${gpu#*, }; CUDA: nvcc $(nvcc --version 2>/dev/null | grep -o 'release [^,]*, V[0-9.]*' || echo "no nvcc")"
      echo "- no benchmark summary in this run"
      echo
      cat "$SANITIZER_MD"
    } >"$LOGS/cuda-results.md"
    echo "wrote $LOGS/cuda-results.md"
  fi
  step "done: tests exit $test_rc, sanitizers exit $san_rc, benchmark exit $bench_rc, logs in $LOGS"
  [ "$test_rc" = 0 ] || return "$test_rc"
  [ "$san_rc" = 0 ] || return "$san_rc"
  return "$bench_rc"
}

main 2>&1 | tee "$LOGS/gpu-check.log"
exit "${PIPESTATUS[0]}"
