// UTF-8 helpers for the tokenizer: llama.cpp's lenient decoding rules (facts
// from its src/unicode.cpp, so invalid input is handled as it handles it), the
// GPT-2 byte-to-unicode table, and a strict decoder for streaming output.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace barata::tok {

// Length of the UTF-8 sequence a lead byte announces, by its high nibble:
// 0x0-0xB -> 1 (ASCII, and stray continuation bytes taken alone), 0xC-0xD -> 2,
// 0xE -> 3, 0xF -> 4. What llama.cpp's SentencePiece path splits text by.
inline size_t utf8_lead_len(unsigned char c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

void append_utf8(std::string& out, uint32_t cpt);  // cpt <= 0x10FFFF

// The text as the BPE path sees it, decoded with llama.cpp's rules (a lead
// byte 110xxxxx/1110xxxx/11110xxx followed by enough continuation bytes is one
// code point, overlong forms and UTF-16 surrogates included; anything else is
// U+FFFD consuming one byte) and re-encoded. `bytes` is what BPE encodes;
// `match` is the same with each surrogate replaced by U+E000 (also three
// bytes, and like a surrogate in no category the pre-tokenizers name), valid
// UTF-8 for PCRE2 at the same offsets. A value above U+10FFFF, on which
// llama.cpp aborts, becomes U+FFFD in both. Returns whether they differ.
bool sanitize_utf8(std::string_view text, std::string& bytes, std::string& match);

// GPT-2's bytes_to_unicode table: printable Latin-1 bytes (0x21-0x7E,
// 0xA1-0xAC, 0xAE-0xFF) stand for themselves, the other 68 bytes in order for
// U+0100, U+0101, ...
const std::array<std::string, 256>& byte_to_unicode();
// The inverse: the byte a code point of a BPE token stands for, or -1.
int unicode_to_byte(uint32_t cpt);

// Strict UTF-8 (RFC 3629): how many bytes at s[0..] form one valid character,
// 0 when they are invalid, or -1 when they are a valid but unfinished prefix.
int utf8_complete(std::string_view s);

}  // namespace barata::tok
