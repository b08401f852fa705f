// Real chat templates rendered by transformers (make_cases.py beside each cases.jsonl): every
// case must come out byte-identical, and every case transformers refused must be refused with
// transformers' message.
//   ../shared/data/chat_templates: 14 templates x 5 conversations (skipped when absent)
//   tests/data/chat_templates: templates of models this engine runs (SmolLM2, ...)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "engine/chat/chat_template.h"

namespace {

using flexh2o::engine::chat::ChatInputs;
using flexh2o::engine::chat::ChatTemplate;
using flexh2o::engine::chat::ChatTemplateError;
namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Outcome {
  int cases = 0;
  int passed = 0;
};

// Runs every case of dir/cases.jsonl; each mismatch is its own failure naming template and case.
Outcome run_cases(const fs::path& dir) {
  Outcome out;
  std::ifstream lines(dir / "cases.jsonl");
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const auto c = nlohmann::ordered_json::parse(line);
    ++out.cases;
    const std::string label = c["template"].get<std::string>() + " / " + c["case"].get<std::string>();
    ChatInputs in;
    in.messages = c["messages"];
    if (!c["tools"].is_null()) in.tools = c["tools"];
    in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    in.bos_token = c["bos_token"].get<std::string>();
    in.eos_token = c["eos_token"].get<std::string>();
    in.now = flexh2o::engine::chat::parse_date(c["date"].get<std::string>());
    const std::string name = c["template"].get<std::string>();
    try {
      const std::string text = ChatTemplate(read_file(dir / name), name).render(in);
      if (c.contains("error")) {
        ADD_FAILURE() << label << ": rendered, but transformers raised " << c["error"].get<std::string>();
      } else if (text != c["expected"].get<std::string>()) {
        ADD_FAILURE() << label << ": text differs\n--- expected\n" << c["expected"].get<std::string>() << "\n--- got\n"
                      << text;
      } else {
        ++out.passed;
      }
    } catch (const ChatTemplateError& e) {
      if (c.contains("error")) {
        // transformers wrote "TypeName: message"; ours is "template:line: message".
        const std::string theirs = c["error"].get<std::string>();
        const std::string message = theirs.substr(theirs.find(": ") + 2);
        const std::string ours = e.what();
        if (ours.size() >= message.size() && ours.compare(ours.size() - message.size(), message.size(), message) == 0) {
          ++out.passed;
        } else {
          ADD_FAILURE() << label << ": refused with '" << ours << "', transformers with '" << theirs << "'";
        }
      } else {
        ADD_FAILURE() << label << ": error " << e.what();
      }
    }
  }
  return out;
}

TEST(ChatTemplateCases, SharedRealTemplatesMatchTransformers) {
  const fs::path dir = fs::path(FLEXH2O_SOURCE_DIR) / ".." / "shared" / "data" / "chat_templates";
  if (!fs::exists(dir / "cases.jsonl")) GTEST_SKIP() << "no " << dir.string() << " (the shared data beside the checkout)";
  const Outcome o = run_cases(dir);
  std::printf("shared chat template cases: %d of %d pass\n", o.passed, o.cases);
  EXPECT_EQ(o.cases, 70);
  EXPECT_EQ(o.passed, o.cases);
}

TEST(ChatTemplateCases, OwnModelTemplatesMatchTransformers) {
  const fs::path dir = fs::path(FLEXH2O_TEST_DATA_DIR) / "chat_templates";
  const Outcome o = run_cases(dir);
  std::printf("own chat template cases: %d of %d pass\n", o.passed, o.cases);
  EXPECT_GT(o.cases, 0);
  EXPECT_EQ(o.passed, o.cases);
}

}  // namespace
