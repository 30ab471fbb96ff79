#!/usr/bin/env bash
# Formats the C++/CUDA sources with .clang-format, or (--check) fails when any
# file differs from its formatted self.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
mapfile -t FILES < <(git ls-files -- 'include/*.h' 'src/*.cpp' 'src/*.h' 'tools/*.cpp' 'tools/*.h' \
  'tests/*.cpp' 'tests/*.h' 'kernels/*.cu' 'kernels/*.cuh')
if [ "${1:-}" = "--check" ]; then
  clang-format --dry-run --Werror "${FILES[@]}"
  echo "format: ${#FILES[@]} files clean"
else
  clang-format -i "${FILES[@]}"
fi
