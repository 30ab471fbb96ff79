#!/usr/bin/env bash
# Configures and builds barata. Usage: scripts/build.sh [release|sanitize|fuzz] [TARGET...]
#   release   Release, CUDA when nvcc is found, host SIMD flags  -> build/
#   sanitize  RelWithDebInfo, ASan + UBSan, CPU only             -> build-sanitize/
#   fuzz      clang, libFuzzer + ASan + UBSan, CPU only          -> build-fuzz/
# Extra CMake arguments can be passed in BARATA_CMAKE_ARGS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-release}"
[ $# -gt 0 ] && shift
TARGETS=()
[ $# -gt 0 ] && TARGETS=(--target "$@")  # only these (default: everything)
JOBS="${JOBS:-$(nproc)}"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
read -r -a EXTRA <<<"${BARATA_CMAKE_ARGS:-}"

case "$MODE" in
  release)
    DIR="$ROOT/build"
    ARGS=(-DCMAKE_BUILD_TYPE=Release -DBARATA_CUDA="${BARATA_CUDA:-AUTO}") ;;
  sanitize)
    DIR="$ROOT/build-sanitize"
    ARGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DBARATA_CUDA=OFF -DBARATA_SANITIZE=address,undefined) ;;
  fuzz)
    DIR="$ROOT/build-fuzz"
    ARGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DBARATA_CUDA=OFF -DBARATA_FUZZ=ON
          -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
          -DBARATA_SANITIZE=address,undefined,fuzzer-no-link) ;;
  *) echo "error: build.sh: unknown mode '$MODE' (release, sanitize, fuzz)" >&2; exit 2 ;;
esac

cmake -S "$ROOT" -B "$DIR" "${GEN[@]}" "${ARGS[@]}" "${EXTRA[@]}" >/dev/null
cmake --build "$DIR" -j "$JOBS" "${TARGETS[@]}"
echo "$DIR"
