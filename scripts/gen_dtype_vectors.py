#!/usr/bin/env python3
"""Regenerates tests/data/dtype_vectors/: dequantization (and, where gguf-py
defines it, quantization) vectors computed by the PyPI package `gguf`
(llama.cpp's gguf-py, numpy). barata's reference rows must match them
bit for bit.

    pip install gguf==0.19.0 numpy
    python3 scripts/gen_dtype_vectors.py
"""
import json
from importlib.metadata import version
import pathlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "dtype_vectors"
SEED = 20261130

# type -> byte offsets of fp16 fields inside one block (set to finite values so
# that random blocks never hold inf/nan scales)
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0],
}
QUANTIZABLE = {T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}
TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
         T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL]


def random_blocks(rng, qtype, n_blocks):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        x = rng.standard_normal(n_blocks).astype(np.float32)
        x[:4] = [0.0, -0.0, np.inf, 1e-40]
        return x.view(np.uint8)
    if qtype == T.F16:
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint32).astype(np.uint16)
        bits = np.where((bits & 0x7c00) == 0x7c00, bits & 0x83ff, bits)  # no inf/nan
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x7c00]  # zeros, smallest subnormal, inf
        return bits.view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint32).astype(np.uint16)
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint32).astype(np.uint8)
    for off in FP16_FIELDS[qtype]:
        vals = (rng.standard_normal(n_blocks) * 0.02).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def quant_inputs(rng, qtype, n):
    x = rng.standard_normal(n).astype(np.float32)
    # numpy warns when F16 inputs overflow to inf; that is the case under test
    x[32:64] = 0.0                       # an all-zero block
    x[64:96] = 0.5                       # a constant block
    x[96:128] = rng.integers(-8, 8, 32)  # exact levels: ties in rounding
    x[128] = 40.0                        # an outlier
    if qtype == T.F16:
        x[200:210] = [1e-8, -3e-6, 65504.0, 65520.0, 1e6, -1e6, 6.1e-5, 2.0**-24, 2.0**-25, 3.0 * 2.0**-26]
    if qtype == T.BF16:
        x[200:204] = [np.nan, np.inf, -np.inf, 3.4e38]
    return x


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    manifest = {"source": f"gguf (PyPI) {version('gguf')} + numpy {np.__version__}",
                "seed": SEED, "types": []}
    for qtype in TYPES:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = 16 if block_size == 256 else 64 if block_size == 32 else 2048
        n = n_blocks * block_size
        raw = random_blocks(rng, qtype, n_blocks)
        deq = quants.dequantize(raw, qtype).astype(np.float32, copy=False).reshape(-1)
        assert deq.size == n
        name = qtype.name
        (OUT / f"{name}.blocks.bin").write_bytes(raw.tobytes())
        (OUT / f"{name}.dequant.f32").write_bytes(deq.tobytes())
        entry = {"type": name, "n": n, "blocks": f"{name}.blocks.bin", "dequant": f"{name}.dequant.f32"}
        if qtype in QUANTIZABLE:
            x = quant_inputs(rng, qtype, n)
            q = quants.quantize(x.reshape(-1, n), qtype)
            (OUT / f"{name}.quant_in.f32").write_bytes(x.tobytes())
            (OUT / f"{name}.quant_out.bin").write_bytes(np.ascontiguousarray(q).view(np.uint8).tobytes())
            entry.update({"quant_in": f"{name}.quant_in.f32", "quant_out": f"{name}.quant_out.bin"})
        manifest["types"].append(entry)
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(TYPES)} types to {OUT}")


if __name__ == "__main__":
    main()
