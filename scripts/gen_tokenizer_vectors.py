#!/usr/bin/env python3
"""Writes reference token ids for barata's tokenizer tests by running llama.cpp's
llama-tokenize (a build of release b4748).

    scripts/gen_tokenizer_vectors.py LLAMA_TOKENIZE MODEL.gguf OUT.jsonl
        One JSON object per line for the strings below: "text" (or "text_hex"
        for bytes that are not UTF-8), "parse_special", and the reference
        "ids" (no BOS added).

    scripts/gen_tokenizer_vectors.py --random LLAMA_TOKENIZE OUT_PREFIX GGUF...
        OUT_PREFIX.bin: a few KiB of random text from a fixed seed (many
        scripts, every whitespace llama.cpp knows and some it does not,
        contractions, digits, emoji, special-token look-alikes, invalid UTF-8);
        OUT_PREFIX.jsonl: one line per GGUF, {"file": its name, "ids": [...]}.
"""
import json
import subprocess
import sys

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll like it; they've said we'd go, isn't it?",
    "DON'T SHOUT, I'LL HEAR YOU",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
    "for (let i = 0; i < arr.length; ++i) { sum += arr[i] ** 2; }",
    "\tif x:\n\t\tpass\n",
    "3.14159 2718281828 1,000,000 -42 0x1F 1e-10",
    "Call 555-0123 at 10:30am on 2024-01-15.",
    "SmolLM2 is a 135M-parameter model trained on 2T tokens.",
    "a  b   c    d\t\te\n\nf",
    "   leading and trailing   ",
    "\n\n\n",
    "line one\r\nline two\r\n",
    "",
    " ",
    "Café naïve façade résumé über Ångström",
    "¿Dónde está la biblioteca? ¡Olé!",
    "Ünïcödé ÀÉÎÕÜ",
    "e\u0301 vs \u00e9",
    "你好，世界！今天天气很好。",
    "こんにちは、世界。カタカナとひらがな。",
    "안녕하세요 세계",
    "Ελληνικά και Русский текст",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "I love \U0001f999 and \U0001f917! \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "∑ x² ≤ ∞ → ∀ε>0 ∃δ",
    "a\u00a0b\u2009c\u3000d\u0085e",
    "zero\u200bwidth\u200djoiner",
    "https://example.com/path?q=1&r=two#frag",
    '{"name": "barata", "version": [0, 1, 0], "ok": true}',
    "## Title\n\n- item *one*\n- item **two**\n\n```cpp\nx++;\n```",
    "a" * 40,
    "!!!???...,,,;;;",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "<|im_start|>user\nHello<|im_end|>\n",
]
SPECIAL = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<|endoftext|>",
]
INVALID = [b"abc\xff\xfedef", b"caf\xc3", b"\xe2\x82 x", b"\xc0\xaf overlong"]


def tokenize(exe, model, data, parse_special):
    args = [exe, "-m", model, "--stdin", "--ids", "--no-bos", "--no-escape", "--log-disable"]
    if not parse_special:
        args.append("--no-parse-special")
    out = subprocess.run(args, input=data, capture_output=True, check=True).stdout
    return json.loads(out.decode().strip().splitlines()[-1])


POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  ", "\t", "\n",
    "\r\n", "\r", "'s", "'S", "'re", "'LL", "'ve", "'d", "'m", "'t", "'x", "''",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2009",
    "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u000b", "\u000c", "\u001c",
    "\u001f", "éèêëàâäôöûüçñÅÆØßÐÞ", "αβγδεζηθΩ", "привет", "你好世界中文字符", "ひらがなカタカナ",
    "한국어", "مرحبا", "नमस्ते", "ไทย", "\U0001f999\U0001f917\U0001f44d\U0001f3fd\u200d\U0001fae8",
    "\u200b\u200c\u200d\ufeff", "①②③", "١٢٣", "Ⅻ", "½¾", "ℂℍ", "\u017f", "\u212a", "\u2126",
    "！？，。、：；（）", "…", "—–", "‘’“”", "·•", "\u0301\u0308", "\ue000", "\U000e0001",
    "<s>", "</s>", "<|endoftext|>", "<|im_start|>", "<unk>", "<0x0A>", "\u2581", "\u2581\u2581",
]
INVALID_PIECES = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f", b"\xc0\xaf",
                  b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]


def random_text(seed=7, n_bytes=4096):
    import random
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < n_bytes:
        p = rng.choice(POOLS)
        piece = "".join(rng.choice(p) for _ in range(rng.randint(1, 6))) \
            if len(p) > 3 and rng.random() < 0.7 else p
        out += piece.encode()
        if rng.random() < 0.03:
            out += rng.choice(INVALID_PIECES)
    return bytes(out)


def main_random(exe, prefix, models):
    import os
    text = random_text()
    with open(prefix + ".bin", "wb") as f:
        f.write(text)
    with open(prefix + ".jsonl", "w", encoding="utf-8") as f:
        for m in models:
            ids = tokenize(exe, m, text, False)
            f.write(json.dumps({"file": os.path.basename(m), "ids": ids}) + "\n")
    print(f"{len(text)} bytes, {len(models)} files -> {prefix}.bin, {prefix}.jsonl")


def main():
    if sys.argv[1] == "--random":
        return main_random(sys.argv[2], sys.argv[3], sys.argv[4:])
    exe, model, out_path = sys.argv[1:4]
    rows = []
    for t in TEXTS:
        rows.append({"text": t, "parse_special": False,
                     "ids": tokenize(exe, model, t.encode(), False)})
    for t in SPECIAL:
        rows.append({"text": t, "parse_special": True,
                     "ids": tokenize(exe, model, t.encode(), True)})
    for b in INVALID:
        rows.append({"text_hex": b.hex(), "parse_special": False,
                     "ids": tokenize(exe, model, b, False)})
    with open(out_path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(rows)} vectors written to {out_path}")


if __name__ == "__main__":
    main()
