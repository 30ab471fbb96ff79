// Ids back to bytes: token pieces, Tokenizer::decode and StreamDecoder. The
// rules are llama.cpp's (release b4748, src/llama-vocab.cpp: token_to_piece,
// detokenize), restated.
#include "barata/error.h"
#include "barata/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace barata {
namespace tok {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";     // '▁' U+2581
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// A BPE token's text through the byte-to-unicode table, back to bytes. A code
// point outside the table is spelled "[UNK_BYTE_0x<its utf-8 hex><text>]", as
// llama.cpp spells it.
std::string bpe_bytes(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    int k = utf8_complete(text.substr(i));
    uint32_t cpt = 0xFFFD;
    if (k > 0) {
      const auto c0 = static_cast<unsigned char>(text[i]);
      cpt = k == 1 ? c0 : (c0 & (0x7F >> k));
      for (int j = 1; j < k; ++j)
        cpt = (cpt << 6) | (static_cast<unsigned char>(text[i + j]) & 0x3F);
    } else {
      k = 1;
    }
    const int b = unicode_to_byte(cpt);
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out += "[UNK_BYTE_0x";
      std::string utf8;
      append_utf8(utf8, cpt);
      for (char c : utf8) out += fmt::format("{:02x}", static_cast<unsigned char>(c));
      out += text;
      out += ']';
    }
    i += static_cast<size_t>(k);
  }
  return out;
}

// Hugging Face's clean_up_tokenization_spaces, in llama.cpp's three passes.
// Each pass reads the previous pass's text; the second one blanks the space it
// drops after " ' " so that the next position does not see it.
void clean_spaces(std::string& s) {
  if (s.size() < 2) return;
  std::string out;
  // 1. " ?", " !", " .", " ,": drop the space.
  out.assign(1, s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) out.pop_back();
    out += x;
  }
  s.swap(out);
  // 2. " ' ": drop both spaces around a lone apostrophe.
  out.assign(1, s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (x == '\'' && i + 1 < s.size() && s[i - 1] == ' ' && s[i + 1] == ' ') {
      out.pop_back();
      s[++i] = '\0';
    }
    out += x;
  }
  s.swap(out);
  // 3. " 's", " 'm", " 're", " 've": drop the space (" 't", " 'd", " 'll" keep it).
  out.assign(1, s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && x == '\'' && i + 1 < s.size()) {
      const char x1 = s[i + 1];
      if (x1 == 's' || x1 == 'm') {
        out.pop_back();
      } else if (i + 2 < s.size()) {
        const char x2 = s[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) out.pop_back();
      }
    }
    out += x;
  }
  s.swap(out);
}

}  // namespace

std::string piece_for(const Vocab& v, int32_t id) {
  const TokenData& t = v.tokens[id];
  if (t.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return t.text;
  if (v.kind == Kind::kSpm) {
    if (t.attr & kAttrNormal) {
      std::string out;
      std::string_view s = t.text;
      for (size_t p; (p = s.find(kSpmSpace)) != std::string_view::npos; s.remove_prefix(p + 3)) {
        out += s.substr(0, p);
        out += ' ';
      }
      out += s;
      return out;
    }
    if (t.attr & kAttrByte) {  // "<0xXX>"
      // A byte token's text is "<0xXX>" with two hex digits; any other text
      // (a hostile "<0xZZ>") is not a byte and has no piece.
      auto hex = [](char c) {
        return c >= '0' && c <= '9'   ? c - '0'
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                      : -1;
      };
      if (t.text.size() == 6 && t.text.compare(0, 3, "<0x") == 0 && t.text[5] == '>' &&
          hex(t.text[3]) >= 0 && hex(t.text[4]) >= 0)
        return std::string(1, static_cast<char>(hex(t.text[3]) * 16 + hex(t.text[4])));
      return t.text.size() == 1 ? t.text : std::string();
    }
    return {};
  }
  if (t.attr & kAttrNormal) return bpe_bytes(t.text);
  return {};  // byte, unused and undefined tokens have no piece in a BPE vocabulary
}

}  // namespace tok

std::string Tokenizer::token_to_piece(int32_t id) const {
  return std::string(piece(id));
}

std::string_view Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    fail("token id {} is outside the vocabulary [0, {})", id, n_vocab());
  return v_->pieces[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  using namespace tok;
  std::string out;
  bool remove_space = v_->add_space_prefix;  // one leading space of the first piece
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab())
      fail("token id {} is outside the vocabulary [0, {})", id, n_vocab());
    std::string_view piece = v_->pieces[id];
    if (!render_special && (v_->tokens[id].attr & (kAttrUnknown | kAttrControl))) piece = {};
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    remove_space = false;
    out += piece;
  }
  if (v_->clean_spaces) clean_spaces(out);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  std::string out;
  push(id, out);
  return out;
}

void StreamDecoder::push(int32_t id, std::string& out) {
  pending_ += t_.piece(id);
  size_t i = 0;
  while (i < pending_.size()) {
    const int k = tok::utf8_complete(std::string_view(pending_).substr(i));
    if (k < 0) break;  // an unfinished character: wait for the next token
    if (k == 0) {
      out += tok::kReplacement;
      i += 1;
    } else {
      out.append(pending_, i, static_cast<size_t>(k));
      i += static_cast<size_t>(k);
    }
  }
  pending_.erase(0, i);
}

std::string StreamDecoder::flush() {
  std::string out = pending_.empty() ? "" : std::string(tok::kReplacement);
  pending_.clear();
  return out;
}

}  // namespace barata
