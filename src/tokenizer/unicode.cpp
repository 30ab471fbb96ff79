// UTF-8 helpers for the tokenizer (see unicode.h).
#include "tokenizer/unicode.h"

#include <vector>

namespace barata::tok {

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out += static_cast<char>(cpt);
  } else if (cpt < 0x800) {
    out += static_cast<char>(0xC0 | (cpt >> 6));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else if (cpt < 0x10000) {
    out += static_cast<char>(0xE0 | (cpt >> 12));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cpt >> 18));
    out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  }
}

bool sanitize_utf8(std::string_view text, std::string& bytes, std::string& match) {
  constexpr uint32_t kReplacement = 0xFFFD;
  bytes.clear();
  bytes.reserve(text.size() + 8);
  std::vector<size_t> surrogates;  // offsets in `bytes`
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {  // the common case, copied in runs
      size_t j = i + 1;
      while (j < n && static_cast<unsigned char>(text[j]) < 0x80) ++j;
      bytes.append(text.data() + i, j - i);
      i = j;
      continue;
    }
    auto cont = [&](size_t k) {
      return k < n && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80;
    };
    auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(text[k])); };
    uint32_t cpt = kReplacement;
    size_t len = 1;
    if ((c & 0xE0) == 0xC0 && cont(i + 1)) {
      cpt = ((c & 0x1F) << 6) | (at(i + 1) & 0x3F);
      len = 2;
    } else if ((c & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
      cpt = ((c & 0x0F) << 12) | ((at(i + 1) & 0x3F) << 6) | (at(i + 2) & 0x3F);
      len = 3;
    } else if ((c & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      cpt = ((c & 0x07) << 18) | ((at(i + 1) & 0x3F) << 12) | ((at(i + 2) & 0x3F) << 6) |
            (at(i + 3) & 0x3F);
      len = 4;
    }
    if (cpt > 0x10FFFF) cpt = kReplacement;
    if (cpt >= 0xD800 && cpt <= 0xDFFF) {  // encoded like any BMP code point
      surrogates.push_back(bytes.size());
      bytes += static_cast<char>(0xE0 | (cpt >> 12));
      bytes += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
      bytes += static_cast<char>(0x80 | (cpt & 0x3F));
    } else {
      append_utf8(bytes, cpt);
    }
    i += len;
  }
  if (surrogates.empty()) return false;
  match = bytes;
  for (size_t off : surrogates) match.replace(off, 3, "\xEE\x80\x80");  // U+E000
  return true;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> to_byte;  // every mapped code point is below 0x144
  ByteTables() {
    to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cpt = printable(b) ? static_cast<uint32_t>(b) : 256u + n++;
      append_utf8(to_unicode[b], cpt);
      to_byte[cpt] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  return tables().to_unicode;
}

int unicode_to_byte(uint32_t cpt) {
  return cpt < 512 ? tables().to_byte[cpt] : -1;
}

int utf8_complete(std::string_view s) {
  if (s.empty()) return -1;
  const auto c = static_cast<unsigned char>(s[0]);
  if (c < 0x80) return 1;
  int len;
  uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, min = 0x10000;
  } else {
    return 0;  // continuation byte, C0/C1 (always overlong) or F5..FF
  }
  uint32_t cpt = c & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= s.size()) {
      // Valid so far? Check the partial value cannot already be out of range.
      if (k == 2 || k == 3) {
        const uint32_t partial = cpt << (6 * (len - k));
        const uint32_t top = partial | ((1u << (6 * (len - k))) - 1);
        if (top < min || partial > 0x10FFFF || (partial >= 0xD800 && top <= 0xDFFF)) return 0;
      }
      return -1;
    }
    const auto d = static_cast<unsigned char>(s[k]);
    if ((d & 0xC0) != 0x80) return 0;
    cpt = (cpt << 6) | (d & 0x3F);
  }
  if (cpt < min || cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) return 0;
  return len;
}

}  // namespace barata::tok
