#!/usr/bin/env python3
"""Writes the F32 source of tests/data/llamacpp_quant/: a small random llama
(1 layer, d_model 256, GQA 4/2 heads, d_ff 256, the 512-token SentencePiece
vocabulary of tests/data/models/stories260K.gguf). Row lengths are whole K-quant
super-blocks, so llama.cpp's quantizer keeps its K types.

    pip install gguf==0.19.0 numpy
    python3 scripts/gen_llamacpp_quant_model.py OUT.gguf

The committed files were then made with llama.cpp b4748, outside this repo:
llama-quantize OUT.gguf tiny-q4_k_m.gguf Q4_K_M (and Q5_K_M), plus greedy
references from llama.cpp's C API (see tests/data/llamacpp_quant/README.md).
"""
import pathlib
import sys

import numpy as np
import gguf
from gguf import GGUFReader, GGUFValueType

SHARED = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "models"
D, HEADS, KV_HEADS, FF, LAYERS = 256, 4, 2, 256, 1
SEED = 20261130


def main(out: str) -> None:
    src = GGUFReader(SHARED / "stories260K.gguf")
    w = gguf.GGUFWriter(out, "llama")
    w.add_context_length(128)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_block_count(LAYERS)
    w.add_rope_dimension_count(D // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    for key, field in src.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(key, vals) if sub != GGUFValueType.INT32 else w.add_key_value(
                key, vals, GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
        elif field.types[0] == GGUFValueType.STRING:
            w.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif field.types[0] == GGUFValueType.UINT32:
            w.add_uint32(key, int(field.parts[field.data[0]][0]))
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(SEED)

    def mat(rows: int, k: int) -> np.ndarray:  # numpy shape (rows, k) = ggml (k, rows)
        return (rng.standard_normal((rows, k)) / np.sqrt(k)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    hd = D // HEADS
    w.add_tensor("token_embd.weight", mat(n_vocab, D))
    w.add_tensor("output_norm.weight", norm(D))
    w.add_tensor("output.weight", mat(n_vocab, D) * 4)
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(D))
        w.add_tensor(p + "attn_q.weight", mat(D, D))
        w.add_tensor(p + "attn_k.weight", mat(hd * KV_HEADS, D))
        w.add_tensor(p + "attn_v.weight", mat(hd * KV_HEADS, D))
        w.add_tensor(p + "attn_output.weight", mat(D, D))
        w.add_tensor(p + "ffn_norm.weight", norm(D))
        w.add_tensor(p + "ffn_gate.weight", mat(FF, D))
        w.add_tensor(p + "ffn_up.weight", mat(FF, D))
        w.add_tensor(p + "ffn_down.weight", mat(D, FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
