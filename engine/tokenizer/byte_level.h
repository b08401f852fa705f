// GPT-2's byte alphabet (bytes_to_unicode): printable Latin-1 bytes stand for themselves, the
// other 68 bytes for U+0100, U+0101, ... in byte order, so space is "Ġ" and newline "Ċ".
// Byte-level BPE vocabularies are written in this alphabet.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace flexh2o::engine::tok {

class ByteAlphabet {
 public:
  static const ByteAlphabet& get();

  // The UTF-8 of the character byte `b` stands for.
  const std::string& encoded(unsigned char b) const { return encoded_[b]; }
  // Appends the alphabet characters of `bytes`.
  void encode(std::string_view bytes, std::string& out) const;
  // The bytes a string of alphabet characters stands for; nullopt when it has any other
  // character.
  std::optional<std::string> decode(std::string_view chars) const;

 private:
  ByteAlphabet();
  // Code points of the alphabet are all below 256 + 68.
  static constexpr std::size_t kLimit = 324;
  std::array<std::string, 256> encoded_;
  std::array<int, kLimit> byte_of_code_point_;  // -1 when not in the alphabet
};

}  // namespace flexh2o::engine::tok
