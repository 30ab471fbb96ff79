#!/usr/bin/env bash
# Registers, spills and occupancy of the matmul kernels, as ptxas reports
# them for one architecture (default sm_90): what can be known of the kernels
# without a GPU. Usage: scripts/cuda-resources.sh [ARCH]   (e.g. 90, 80)
# Prints one markdown table per kernel family: registers per thread for each
# (weight type, rows x tokens) variant, the CTAs of 128 threads one SM holds
# at that count (65536 registers, allocated per warp in units of 256), and
# every kernel that spills.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ARCH="${1:-90}"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$NVCC" ] || { echo "error: cuda-resources.sh: nvcc not found" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
for f in qmm gemv; do
  # Device code only (-cubin), with the build's flags (CMakeLists.txt).
  "$NVCC" -DBARATA_HAVE_CUDA=1 -DFMT_USE_CONSTEXPR=1 -O3 -DNDEBUG -arch="sm_$ARCH" -cubin \
    --expt-relaxed-constexpr -std=c++20 -I"$ROOT/kernels" -I"$ROOT/include" --resource-usage \
    "$ROOT/kernels/$f.cu" -o "$TMP/$f.cubin" >"$TMP/$f.txt" 2>&1 ||
    { tail -n 30 "$TMP/$f.txt"; echo "error: nvcc failed on kernels/$f.cu" >&2; exit 1; }
done
python3 - "$ARCH" "$TMP/qmm.txt" "$TMP/gemv.txt" <<'EOF'
import collections, re, sys
# DType values (include/barata/dtype.h).
names = {0: 'F32', 1: 'F16', 2: 'Q4_0', 3: 'Q4_1', 6: 'Q5_0', 7: 'Q5_1', 8: 'Q8_0', 12: 'Q4_K',
         13: 'Q5_K', 14: 'Q6_K', 20: 'IQ4_NL', 30: 'BF16', 1000: 'I8_TENSOR', 1001: 'I8_ROW',
         1002: 'I4_TENSOR', 1003: 'I4_ROW', 1004: 'I4_G128', 1005: 'NF4_B64'}
def ctas(regs, threads=128):
    per_warp = -(-regs * 32 // 256) * 256
    return min(32, 65536 // (per_warp * (threads // 32)))
tab = collections.defaultdict(dict)
spills = []
for path in sys.argv[2:]:
    cur = None
    for line in open(path):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and cur and int(m.group(1)):
            k = re.search(r"(qmm_q8_kernel|qmm_kernel)ILNS_5DTypeE(\d+)ELi(\d+)ELi(\d+)E", cur)
            name = (f'{k.group(1)}<{names.get(int(k.group(2)), k.group(2))}, '
                    f'{k.group(3)}x{k.group(4)}>' if k else cur)
            spills.append((name, int(m.group(1))))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            k = re.search(r"(qmm_q8_kernel|qmm_kernel)ILNS_5DTypeE(\d+)ELi(\d+)ELi(\d+)E", cur)
            if k:
                tab[k.group(1)][(names.get(int(k.group(2)), k.group(2)),
                                 f'{k.group(3)}x{k.group(4)}')] = int(m.group(1))
            g = re.search(r"gemv_kernel", cur)
            if g:
                tab['gemv_kernel'][(cur[-40:], '')] = int(m.group(1))
            cur = None
print(f'sm_{sys.argv[1]}: registers per thread (CTAs of 128 threads per SM)\n')
for kernel in ('qmm_q8_kernel', 'qmm_kernel'):
    d = tab[kernel]
    shapes = sorted({s for _, s in d}, key=lambda s: int(s.split('x')[1]))
    print(f'| {kernel} | ' + ' | '.join(shapes) + ' |')
    print('|---' * (len(shapes) + 1) + '|')
    for t in sorted({t for t, _ in d}):
        print(f'| {t} | ' + ' | '.join(
            f'{d[(t, s)]} ({ctas(d[(t, s)])})' if (t, s) in d else '-' for s in shapes) + ' |')
    print()
g = sorted(tab['gemv_kernel'].values())
if g:
    print(f'gemv_kernel: {len(g)} variants, {g[0]}..{g[-1]} registers\n')
print('spills:', ', '.join(f'{n} ({b} bytes)' for n, b in spills) if spills else 'none')
EOF
