#!/usr/bin/env bash
# Registers, spills and occupancy of the matmul kernels, as ptxas reports
# them for one architecture (default sm_90): what can be known of the kernels
# without a GPU. Usage: scripts/cuda-resources.sh [ARCH]   (e.g. 90, 80)
# Prints one markdown table per kernel family: registers per thread for each
# (weight type, rows x tokens) variant, the CTAs of 128 threads one SM holds
# at that count (65536 registers, allocated per warp in units of 256), and
# every kernel that spills.
#
# scripts/cuda-resources.sh --emu-table [ARCH] instead compiles every
# kernels/*.cu but device.cu and prints kernels/emu/sm90_limits.inc, the table
# of the emulation's launch check (docs/cuda-emulation.md): per kernel family
# (the function's name without namespaces or template arguments, as
# BARATA_LAUNCH spells it up to '<'), the most registers per thread ptxas
# gives any of its instantiations, and its __launch_bounds__ (the PTX's
# .maxntid; 0 if none). After changing a kernel:
#   scripts/cuda-resources.sh --emu-table > kernels/emu/sm90_limits.inc
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EMU_TABLE=0
if [ "${1:-}" = "--emu-table" ]; then
  EMU_TABLE=1
  shift
fi
ARCH="${1:-90}"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$NVCC" ] || { echo "error: cuda-resources.sh: nvcc not found" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# kernels/$1.cu for sm_$ARCH: ptxas's report in $TMP/$1.txt, the PTX (kept
# from the same compilation) in $TMP/$1/$1.ptx.
compile() {
  mkdir -p "$TMP/$1"
  # Device code only (-cubin), with the build's flags (CMakeLists.txt).
  "$NVCC" -DBARATA_HAVE_CUDA=1 -DFMT_USE_CONSTEXPR=1 -O3 -DNDEBUG -arch="sm_$ARCH" -cubin \
    --expt-relaxed-constexpr -std=c++20 -I"$ROOT/kernels" -I"$ROOT/include" --resource-usage \
    --keep --keep-dir "$TMP/$1" "$ROOT/kernels/$1.cu" -o "$TMP/$1.cubin" >"$TMP/$1.txt" 2>&1 ||
    { tail -n 30 "$TMP/$1.txt"; echo "error: nvcc failed on kernels/$1.cu" >&2; exit 1; }
}

if [ "$EMU_TABLE" = 1 ]; then
  command -v c++filt >/dev/null || { echo "error: cuda-resources.sh: c++filt not found" >&2; exit 1; }
  files=()
  for cu in "$ROOT"/kernels/*.cu; do
    f="$(basename "$cu" .cu)"
    [ "$f" = device ] && continue  # the driver probe: no kernels
    echo "cuda-resources.sh: kernels/$f.cu" >&2
    compile "$f"
    files+=("$f")
  done
  python3 - "$ARCH" "$ROOT" "$TMP" "${files[@]}" <<'EOF'
import collections, glob, os, re, subprocess, sys
arch, root, tmp, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

def die(msg):
    sys.exit('error: cuda-resources.sh: ' + msg)

def family(demangled):
    # "void barata::cuda::(anonymous namespace)::qmm_kernel<(barata::DType)2, 4, 1>(...)"
    # -> "qmm_kernel": every bracketed group (template arguments, parameters)
    # dropped, then the return type and the namespaces.
    s = demangled.replace('(anonymous namespace)', '{anon}')
    out, depth = [], 0
    for c in s:
        if c in '<(':
            depth += 1
        elif c in '>)':
            depth -= 1
        elif depth == 0:
            out.append(c)
    return ''.join(out).strip().split(' ')[-1].split('::')[-1]

regs = {}    # mangled entry -> registers (ptxas)
bounds = {}  # mangled entry -> threads of its .maxntid (0: none)
for f in files:
    cur = None
    for line in open(os.path.join(tmp, f + '.txt')):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            regs[cur] = int(m.group(1))
            cur = None
    ptx = glob.glob(os.path.join(tmp, f, '*.ptx'))
    if len(ptx) != 1:
        die(f'not one PTX file for kernels/{f}.cu: {ptx}')
    # ".entry NAME(params)", then its directives (.maxntid X, Y, Z) up to the body.
    for m in re.finditer(r'\.entry\s+([\w$.]+)\s*\(([^)]*)\)([^{]*)\{', open(ptx[0]).read()):
        t = re.search(r'\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?', m.group(3))
        bounds[m.group(1)] = (int(t.group(1)) * int(t.group(2) or 1) * int(t.group(3) or 1)
                              if t else 0)
if not regs:
    die('ptxas reported no entry function')
if set(regs) != set(bounds):
    die('ptxas and the PTX disagree on the entries: ' + ', '.join(sorted(set(regs) ^ set(bounds))))
names = sorted(regs)
dem = subprocess.run(['c++filt'], input='\n'.join(names) + '\n', capture_output=True, text=True,
                     check=True).stdout.splitlines()
fam_regs = collections.defaultdict(int)
fam_bounds = collections.defaultdict(set)
for mangled, d in zip(names, dem):
    fam = family(d)
    if not re.fullmatch(r'[A-Za-z_]\w*', fam):
        die(f'no kernel name in {d!r}')
    fam_regs[fam] = max(fam_regs[fam], regs[mangled])
    fam_bounds[fam].add(bounds[mangled])
# The check finds a kernel by BARATA_LAUNCH's spelling (up to '<' or '('):
# every family must be launched by that name.
launched = set()
for src in (glob.glob(os.path.join(root, 'kernels', '*.cu')) +
            glob.glob(os.path.join(root, 'src', 'cuda', '*.cpp'))):
    launched.update(re.findall(r'BARATA_LAUNCH\(\s*\(?\s*(\w+)', open(src).read()))
for fam in sorted(fam_regs):
    if fam not in launched:
        die(f'kernel {fam} has no BARATA_LAUNCH({fam}...): the table row would never match')
    if len(fam_bounds[fam]) > 1:
        print(f'warning: cuda-resources.sh: {fam}: instantiations with different '
              f'__launch_bounds__ {sorted(fam_bounds[fam])}; the table keeps the largest',
              file=sys.stderr)
print(f'// Generated by scripts/cuda-resources.sh --emu-table {arch} (ptxas, sm_{arch}): '
      '{family, registers, launch bounds}.')
for fam in sorted(fam_regs):
    b = fam_bounds[fam]
    print(f'{{"{fam}", {fam_regs[fam]}, {0 if 0 in b else max(b)}}},')
EOF
  exit 0
fi

for f in qmm gemv; do
  compile "$f"
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
