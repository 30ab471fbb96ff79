#!/usr/bin/env bash
# Fetches llama.cpp's vocabulary test sets for the tokenizer tests: the
# ggml-vocab-*.gguf files (a tokenizer and no weights) with their .inp/.out
# strings and expected ids, taken from the source distribution of the PyPI
# package llama-cpp-python==0.3.16, which vendors llama.cpp at commit 4227c9b
# (2025-08-14; the sdist records no release number). The sdist is cached in
# models/cache/ and checked by sha256; the files go to models/vocab/ and are
# checked against tests/data/vocab-llama-cpp-python-0.3.16.sha256; llama.cpp's
# example grammars (grammars/*.gbnf, for the grammar tests) go to
# models/grammars/, checked against tests/data/grammars-llama-cpp-python-0.3.16.sha256;
# its chat templates (models/templates/*.jinja, for the Jinja test) go to
# models/templates/, checked against tests/data/templates-llama-cpp-python-0.3.16.sha256.
# Does nothing
# when they are already there and right. Prints the folder. About 15 s from a
# cold cache: only llama-cpp-python itself is asked for as source, so that pip's
# metadata step takes its build backend as a wheel (`--no-binary :all:` builds
# that whole chain from source too, minutes).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="llama-cpp-python==0.3.16"
SDIST_NAME="llama_cpp_python-0.3.16.tar.gz"
SDIST_SHA256="34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
MEMBERS="llama_cpp_python-0.3.16/vendor/llama.cpp/models/ggml-vocab-*"
MANIFEST="$ROOT/tests/data/vocab-llama-cpp-python-0.3.16.sha256"
OUT="$ROOT/models/vocab"
GRAMMAR_MEMBERS="llama_cpp_python-0.3.16/vendor/llama.cpp/grammars/*.gbnf"
GRAMMAR_MANIFEST="$ROOT/tests/data/grammars-llama-cpp-python-0.3.16.sha256"
GRAMMAR_OUT="$ROOT/models/grammars"
TEMPLATE_MEMBERS="llama_cpp_python-0.3.16/vendor/llama.cpp/models/templates/*.jinja"
TEMPLATE_MANIFEST="$ROOT/tests/data/templates-llama-cpp-python-0.3.16.sha256"
TEMPLATE_OUT="$ROOT/models/templates"

# Every file of the manifest ($2, default the vocabularies') is in `dir` with its sha256.
check() { [ -d "$1" ] && (cd "$1" && sha256sum --quiet --strict -c "${2:-$MANIFEST}" >/dev/null 2>&1); }

if check "$OUT" && check "$GRAMMAR_OUT" "$GRAMMAR_MANIFEST" && check "$TEMPLATE_OUT" "$TEMPLATE_MANIFEST"; then
  echo "$OUT"
  exit 0
fi

CACHE="$ROOT/models/cache"
SDIST="$CACHE/$SDIST_NAME"
mkdir -p "$CACHE"
sdist_ok() { [ -f "$SDIST" ] && echo "$SDIST_SHA256  $SDIST" | sha256sum --quiet -c - >/dev/null 2>&1; }
if ! sdist_ok; then
  rm -f "$SDIST"
  echo "fetch-test-data: downloading $PKG (source distribution, ~50 MB) from PyPI" >&2
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python --disable-pip-version-check \
    -d "$CACHE" "$PKG" >&2
  if ! sdist_ok; then
    echo "error: fetch-test-data: $SDIST is absent or does not have the sha256 $SDIST_SHA256" >&2
    exit 1
  fi
fi

# Swaps a checked folder in whole: a reader sees the old set or the new one.
swap_in() {
  if [ -e "$2" ]; then rm -rf "$1.old" && mv "$2" "$1.old"; fi
  mv "$1" "$2"
  rm -rf "$1.old"
}

# extract WHAT MEMBERS STRIP MANIFEST OUT: the sdist's members into OUT, checked.
extract() {
  if check "$5" "$4"; then return 0; fi
  local tmp
  tmp="$(mktemp -d "$ROOT/models/.$1-XXXXXX")"
  tar -xzf "$SDIST" -C "$tmp" --strip-components="$3" --wildcards "$2"
  if ! check "$tmp" "$4"; then
    echo "error: fetch-test-data: the $1 of $SDIST_NAME do not match $4" >&2
    rm -rf "$tmp"
    exit 1
  fi
  swap_in "$tmp" "$5"
}
extract grammars "$GRAMMAR_MEMBERS" 4 "$GRAMMAR_MANIFEST" "$GRAMMAR_OUT"
extract templates "$TEMPLATE_MEMBERS" 5 "$TEMPLATE_MANIFEST" "$TEMPLATE_OUT"
if check "$OUT"; then
  echo "$OUT"
  exit 0
fi

TMP="$(mktemp -d "$ROOT/models/.vocab-XXXXXX")"
trap 'rm -rf "$TMP" "$TMP.old"' EXIT
tar -xzf "$SDIST" -C "$TMP" --strip-components=4 --wildcards "$MEMBERS"
if ! check "$TMP"; then
  echo "error: fetch-test-data: the files of $SDIST_NAME do not match $MANIFEST:" >&2
  (cd "$TMP" && sha256sum --strict -c "$MANIFEST" 2>&1 | grep -v ': OK$' | head -n 5) >&2 || true
  exit 1
fi
# Swap the folder in whole: a reader sees the old set or the new one.
if [ -e "$OUT" ]; then mv "$OUT" "$TMP.old"; fi
mv "$TMP" "$OUT"
echo "$OUT"
