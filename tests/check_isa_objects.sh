#!/usr/bin/env bash
# The CPU kernels are compiled once per ISA (src/cpu/dot.h). A function with
# vague linkage (an inline function or template instance outside the ISA's
# namespace) defined in more than one copy is merged by the linker into one of
# them, maybe the AVX-512 one, which an AVX2-only CPU then runs. This checks
# that the ISA objects define no such symbol (nm: W, V, u) outside their own
# namespace barata::isa_<name>, beyond the C++ runtime's personality reference.
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
  while read -r line; do
    echo "shared symbol in ${o#"$BUILD"/}: $line" >&2
    bad=1
  done < <(nm -C --defined-only "$o" | grep -E ' [WVu] ' | grep -v 'DW.ref.__gxx_personality_v0' |
    grep -v -E "[WVu] (\(anonymous namespace\)::)?barata::isa_${isa}::" || true)
done
echo "${#objs[@]} ISA objects checked"
exit $bad
