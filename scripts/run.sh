#!/usr/bin/env bash
# The main job on a fresh machine: install build dependencies, fetch the
# default model, build, and run barata on it. Arguments go to barata; without
# any it inspects the default model.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" >&2
MODEL="$("$ROOT/scripts/fetch-model.sh")"
"$ROOT/scripts/build.sh" release >/dev/null
if [ $# -eq 0 ]; then
  set -- inspect --no-tensors "$MODEL"
fi
exec "$ROOT/build/barata" "$@"
