#!/usr/bin/env bash
# The main job on a fresh machine: install build dependencies, fetch the
# default model, build, and run barata on it. Arguments go to barata; without
# any it asks the default model (SmolLM2-135M-Instruct) a question in chat mode.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" >&2
MODEL="$("$ROOT/scripts/fetch-model.sh")"
# Only the barata binary (not the tests), and the CUDA backend only where a
# GPU is there to run it (BARATA_CUDA=ON|OFF overrides): a fresh 2-core
# machine runs its first prompt minutes sooner.
if [ -z "${BARATA_CUDA:-}" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    export BARATA_CUDA=AUTO
  else
    export BARATA_CUDA=OFF
  fi
fi
"$ROOT/scripts/build.sh" release barata_cli >/dev/null
if [ $# -eq 0 ]; then
  set -- run -m "$MODEL" --chat -p "Give me three tips for staying healthy." -n 128
fi
exec "$ROOT/build/barata" "$@"
