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
#   -- ARGS...       extra arguments for the cmake configure step
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-gpu"
ALLOW_NO_GPU=0
CARRIED_TOOLS=0
EXTRA_CMAKE=()
while [ $# -gt 0 ]; do
  case "$1" in
    --allow-no-gpu) ALLOW_NO_GPU=1 ;;
    --carried-tools) CARRIED_TOOLS=1 ;;
    --build-dir) BUILD="$(realpath -m "$2")"; shift ;;
    --) shift; EXTRA_CMAKE=("$@"); break ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
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

main() {
  cd "$ROOT"
  step "machine"
  grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null || true
  echo "cores: $(nproc)  compiler: $(c++ --version 2>/dev/null | head -1 || echo none)"
  if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  command -v nvcc >/dev/null || die "no nvcc on PATH or in /usr/local/cuda/bin"
  nvcc --version | tail -1
  if nvidia-smi -L 2>/dev/null; then
    HAVE_GPU=1
  else
    HAVE_GPU=0
    [ "$ALLOW_NO_GPU" = 1 ] || die "nvidia-smi sees no GPU (use --allow-no-gpu for a dry run)"
    echo "no GPU: dry run, CUDA tests will skip"
  fi

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
  cmake --build "$BUILD" -j "$(nproc)" >"$LOGS/build.log" 2>&1 || {
    grep -E -B2 -A12 "error|FAILED" "$LOGS/build.log" | head -80
    die "build failed; see build.log"
  }
  grep -E "warning" "$LOGS/build.log" | sort -u | head -20 || true

  step "tests"
  if [ "$ALLOW_NO_GPU" = 0 ]; then export BARATA_REQUIRE_GPU=1; fi
  test_rc=0
  ctest --test-dir "$BUILD" -j "$(nproc)" --timeout 300 --output-on-failure \
    --output-junit "$LOGS/ctest-junit.xml" >"$LOGS/ctest.log" 2>&1 || test_rc=$?
  grep -E "Test +#[0-9]+: Cuda" "$LOGS/ctest.log" || true
  sed -n '/tests passed/,$p' "$LOGS/ctest.log"

  step "benchmark"
  if [ "$HAVE_GPU" = 0 ]; then
    echo "no GPU: benchmark skipped"
  elif "$BUILD/barata" --help 2>/dev/null | grep -qE '^ +bench\b'; then
    "$BUILD/barata" bench --device cuda 2>&1 | tee "$LOGS/bench.log"
  else
    echo "no GPU benchmark yet: 'barata bench --device cuda' does not exist"
  fi

  step "done: tests exit $test_rc, logs in $LOGS"
  return "$test_rc"
}

main 2>&1 | tee "$LOGS/gpu-check.log"
exit "${PIPESTATUS[0]}"
