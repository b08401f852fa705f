// Tokenizer encode speed on long inputs: seconds for 100 KB and 200 KB of each kind of text
// with each tokenizer of tests/data/tokenizers, and their ratio (about 2 when encoding is
// linear; 4 would be quadratic). Medians of interleaved runs.
#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string repeat_to(const std::string& unit, std::size_t bytes) {
  std::string s;
  while (s.size() < bytes) s += unit;
  s.resize(bytes);
  return s;
}

}  // namespace

int main() {
  const std::string data = std::string(FLEXH2O_SOURCE_DIR) + "/tests/data/tokenizers/";
  const std::string prose = read_file(std::string(FLEXH2O_SOURCE_DIR) + "/tests/data/tokenizers/cases-qwen2.jsonl");
  struct Text {
    const char* name;
    std::string unit;
  };
  const std::vector<Text> texts = {{"prose (cases-qwen2.jsonl)", prose},
                                   {"one letter, no spaces", "a"},
                                   {"spaces", " "},
                                   {"CJK and emoji", "中文日本語한국어😀"}};
  fmt::print("| tokenizer | text | 100 KB (s) | 200 KB (s) | ratio | MB/s |\n|---|---|---|---|---|---|\n");
  for (const char* name : {"phi3", "phi3-metaspace", "qwen2", "smollm2"}) {
    const auto tok = flexh2o::engine::load_hf_tokenizer(data + name + "/tokenizer.json");
    for (const Text& t : texts) {
      const std::string small = repeat_to(t.unit, 100'000), large = repeat_to(t.unit, 200'000);
      const auto s = flexh2o::bench::interleaved_medians(
          {[&] { (void)tok->encode(small, false); }, [&] { (void)tok->encode(large, false); }}, 5);
      fmt::print("| {} | {} | {:.4f} | {:.4f} | {:.2f} | {:.1f} |\n", name, t.name, s[0], s[1], s[1] / s[0],
                 0.2 / s[1]);
    }
  }
}
