#include "engine/tokenizer/byte_level.h"

#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {

ByteAlphabet::ByteAlphabet() {
  byte_of_code_point_.fill(-1);
  char32_t extra = 0;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? b : 256 + extra++;
    byte_of_code_point_[cp] = static_cast<int>(b);
    append_utf8(encoded_[b], cp);
  }
}

const ByteAlphabet& ByteAlphabet::get() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

void ByteAlphabet::encode(std::string_view bytes, std::string& out) const {
  for (const char c : bytes) out += encoded_[static_cast<unsigned char>(c)];
}

std::optional<std::string> ByteAlphabet::decode(std::string_view chars) const {
  std::string out;
  for (std::size_t i = 0; i < chars.size();) {
    const CodePoint cp = decode_code_point(chars, i);
    if (cp.value >= kLimit || byte_of_code_point_[cp.value] < 0) return std::nullopt;
    out.push_back(static_cast<char>(byte_of_code_point_[cp.value]));
    i += cp.length;
  }
  return out;
}

}  // namespace flexh2o::engine::tok
