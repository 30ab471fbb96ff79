#!/usr/bin/env bash
# The main job on a fresh machine: install build dependencies, fetch the
# default model, build, and run barata on it. Arguments go to barata; without
# any it asks the default model (SmolLM2-135M-Instruct) a question in chat mode.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" >&2
MODEL="$("$ROOT/scripts/fetch-model.sh")"
"$ROOT/scripts/build.sh" release >/dev/null
if [ $# -eq 0 ]; then
  set -- run -m "$MODEL" --chat -p "Give me three tips for staying healthy." -n 128
fi
exec "$ROOT/build/barata" "$@"
