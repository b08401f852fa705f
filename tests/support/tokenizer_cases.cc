#include "tests/support/tokenizer_cases.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/test_models.h"

namespace flexh2o::testing {
namespace {

// The start of a text with its control and non-ASCII bytes as \xHH, for messages.
std::string shown(const std::string& s) {
  std::string out;
  for (const char c : s.substr(0, 60)) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7F) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    }
  }
  return out;
}

}  // namespace

std::size_t expect_tokenizer_cases(const engine::Tokenizer& tok, const std::string& jsonl_path) {
  std::istringstream lines(read_file(jsonl_path));
  std::size_t n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    const nlohmann::json c = nlohmann::json::parse(line);
    const std::string text = c.at("text");
    const std::vector<std::int32_t> ids = c.at("ids");
    SCOPED_TRACE(jsonl_path + ":" + std::to_string(n) + " \"" + shown(text) + "\"");
    EXPECT_EQ(tok.encode(text, false), ids);
    EXPECT_EQ(tok.encode(text, true), c.at("ids_with_special").get<std::vector<std::int32_t>>());
    EXPECT_EQ(tok.decode(ids, false), c.at("decoded").get<std::string>());
  }
  return n;
}

}  // namespace flexh2o::testing
