#!/usr/bin/env bash
# The CPU kernels are compiled once per ISA (src/cpu/dot.h). A function with
# vague linkage (an inline function or template instance outside the ISA's
# namespace) defined in more than one copy is merged by the linker into one of
# them, maybe the AVX-512 one, which an AVX2-only CPU then runs. This checks
# that the ISA objects define no such function (nm: class W, V or u, type
# FUNC) outside their own namespace barata::isa_<name>.
#   tests/check_isa_objects.sh BUILD_DIR
set -euo pipefail
BUILD="$1"
shopt -s nullglob
objs=("$BUILD"/CMakeFiles/barata_isa_*.dir/src/cpu/*.o)
if [ ${#objs[@]} -eq 0 ]; then
  echo "no ISA kernel objects under $BUILD/CMakeFiles/barata_isa_*.dir" >&2
  exit 1
fi
bad=0
for o in "${objs[@]}"; do
  isa="${o#*barata_isa_}"
  isa="${isa%%.dir/*}"
  # sysv format: name | value | class | type | ...; code only (FUNC): shared
  # data (an inline constexpr table) holds no instructions.
  while read -r line; do
    echo "shared function in ${o#"$BUILD"/}: $line" >&2
    bad=1
  done < <(nm --format=sysv -C --defined-only "$o" |
    awk -F'|' '$3 ~ /^ *[WVu] *$/ && $4 ~ /FUNC/ { sub(/ +$/, "", $1); print $1 }' |
    grep -v -E "^(\(anonymous namespace\)::)?barata::isa_${isa}::" || true)
done
echo "${#objs[@]} ISA objects checked"
exit $bad
