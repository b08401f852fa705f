// A set of bytes (one bit per value), the terminal of the byte-level grammars.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace flexh2o::grammar {

class ByteClass {
 public:
  ByteClass() = default;
  static ByteClass single(std::uint8_t byte) {
    ByteClass c;
    c.add(byte);
    return c;
  }
  static ByteClass range(std::uint8_t lo, std::uint8_t hi) {
    ByteClass c;
    c.add_range(lo, hi);
    return c;
  }
  static ByteClass of(std::string_view bytes) {
    ByteClass c;
    for (char b : bytes) c.add(static_cast<std::uint8_t>(b));
    return c;
  }
  void add(std::uint8_t byte) { words_[byte >> 6] |= std::uint64_t{1} << (byte & 63); }
  void add_range(std::uint8_t lo, std::uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(static_cast<std::uint8_t>(b));
  }
  void add(const ByteClass& other) {
    for (int i = 0; i < 4; ++i) words_[i] |= other.words_[i];
  }
  void remove(const ByteClass& other) {
    for (int i = 0; i < 4; ++i) words_[i] &= ~other.words_[i];
  }
  bool contains(std::uint8_t byte) const { return (words_[byte >> 6] >> (byte & 63)) & 1; }
  bool empty() const { return (words_[0] | words_[1] | words_[2] | words_[3]) == 0; }
  const std::array<std::uint64_t, 4>& words() const { return words_; }
  bool operator==(const ByteClass&) const = default;

 private:
  std::array<std::uint64_t, 4> words_{};
};

}  // namespace flexh2o::grammar
