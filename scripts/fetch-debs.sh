#!/usr/bin/env bash
# Downloads the amd64 Debian packages that scripts/gpu-check.sh unpacks on a lent
# GPU machine, which has no package registry. Run it here (where apt works);
# the files land in .debs/ (git-ignored), which the device run then carries.
#
#   .debs/dev/    headers, CMake configs and the shared libraries they link to
#   .debs/tools/  cmake, ninja and pkg-config with the libraries they load; used
#                 there only when the machine's own cmake (>= 3.25) or ninja is
#                 missing. Skip with --no-tools to carry less.
#
# Idempotent: a package already present (any version) is not fetched again;
# --refresh empties .debs/ first.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.debs"
WITH_TOOLS=1
for arg in "$@"; do
  case "$arg" in
    --no-tools) WITH_TOOLS=0 ;;
    --refresh) rm -rf "$DEST" ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "fetch-debs: unknown option $arg" >&2; exit 2 ;;
  esac
done

DEV=(libcli11-dev libfmt-dev libspdlog-dev libgtest-dev libgmock-dev nlohmann-json3-dev libpcre2-dev libedit-dev
  libcpp-httplib-dev zlib1g-dev)
TOOLS=(cmake cmake-data ninja-build pkgconf pkgconf-bin pkg-config libpkgconf3)
# Never carried: the C runtime and compiler runtime must be the target's own.
BASE_RE='^(libc6|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|libc-dev|libc6-dev)$'

# The target is x86-64 whatever this machine is; off amd64, use separate lists.
APT=(apt-get)
# As root, apt's download sandbox user (_apt) cannot write into a root-owned tree.
if [ "$(id -u)" = 0 ]; then APT+=(-oAPT::Sandbox::User=root); fi
CACHE=(apt-cache)
if [ "$(dpkg --print-architecture)" != amd64 ]; then
  opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/barata-amd64-lists)
  mkdir -p /tmp/barata-amd64-lists/partial
  APT+=("${opts[@]}")
  CACHE+=("${opts[@]}")
  "${APT[@]}" update -qq
elif ! "${CACHE[@]}" show libfmt-dev >/dev/null 2>&1; then
  "${APT[@]}" update -qq
fi

# Closure of $@ through library packages (lib*): the -dev packages' shared
# libraries, and what cmake's libcurl/libarchive load. Other dependencies
# (procps, perl, catch2, googletest's sources) are not needed to build.
# One recursive apt-cache call gives the whole graph; apt-cache is slow to start.
lib_closure() {
  local -A deps=() seen=()
  local pkg="" line queue=("$@") p d
  while IFS= read -r line; do
    if [[ "$line" =~ ^[^\ \<] ]]; then
      pkg="$line"
    elif [[ "$line" =~ ^\ +(Pre)?Depends:\ ([^\<].*)$ ]]; then
      deps[$pkg]+=" ${BASH_REMATCH[2]}"
    fi
  done < <("${CACHE[@]}" depends --recurse --no-recommends --no-suggests --no-enhances \
    --no-conflicts --no-breaks --no-replaces "$@")
  while [ ${#queue[@]} -gt 0 ]; do
    p="${queue[0]}"
    queue=("${queue[@]:1}")
    [ -n "${seen[$p]:-}" ] && continue
    seen[$p]=1
    echo "$p"
    for d in ${deps[$p]:-}; do
      if [[ "$d" == lib* && ! "$d" =~ $BASE_RE ]]; then queue+=("$d"); fi
    done
  done
}

fetch_group() {  # fetch_group DIR PACKAGE...
  local dir="$DEST/$1"
  shift
  mkdir -p "$dir"
  local want=() p
  for p in "$@"; do
    compgen -G "$dir/${p}_*.deb" >/dev/null || want+=("$p")
  done
  if [ ${#want[@]} -gt 0 ]; then
    echo "fetch-debs: $(basename "$dir"): downloading ${want[*]}"
    (cd "$dir" && "${APT[@]}" download -q "${want[@]}" >/dev/null)
  fi
  echo "fetch-debs: $(basename "$dir"): $# packages, $(du -sh "$dir" | cut -f1)"
}

mapfile -t dev_pkgs < <(lib_closure "${DEV[@]}")
fetch_group dev "${dev_pkgs[@]}"
if [ "$WITH_TOOLS" = 1 ]; then
  mapfile -t tool_pkgs < <(lib_closure "${TOOLS[@]}")
  fetch_group tools "${tool_pkgs[@]}"
fi
echo "fetch-debs: .debs/ holds $(du -sh "$DEST" | cut -f1)"
