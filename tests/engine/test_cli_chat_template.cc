// `flexh2o chat-template` end to end: the exact text on stdout, the model's own template and
// tokens, and a template's error as one line with a non-zero exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using ::testing::HasSubstr;

struct Output {
  int code;
  std::string out, err;
};

Output chat_template(const std::string& args) {
  testing::TempDir dir;
  const std::string cmd = std::string(FLEXH2O_BINARY) + " chat-template " + args + " >" + dir.file("out") + " 2>" +
                          dir.file("err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), testing::read_file(dir.file("out")),
          testing::read_file(dir.file("err"))};
}

constexpr const char* kMessages = R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])";
constexpr const char* kTemplate =
    "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
    "[{{ strftime_now('%Y-%m-%d') }}]";

TEST(CliChatTemplate, PrintsTheTextExactly) {
  testing::TempDir dir;
  testing::write_file(dir.file("t.jinja"), kTemplate);
  testing::write_file(dir.file("m.json"), kMessages);
  testing::write_file(dir.file("tools.json"), R"([{"type": "function", "function": {"name": "f"}}])");
  const std::string base = "--template " + dir.file("t.jinja") + " --messages " + dir.file("m.json") + " --date 2026-11-25";
  Output r = chat_template(base + " --bos-token '<s>' --eos-token '</s>'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<s><system>Be brief.</s><user>Hi</s><assistant>[2026-11-25]");  // no newline added
  r = chat_template(base + " --no-generation-prompt --tools " + dir.file("tools.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<system>Be brief.<user>Hi[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}][2026-11-25]");
}

TEST(CliChatTemplate, ModelDirectoryGivesTemplateAndTokens) {
  testing::TempDir dir;
  testing::write_file(dir.file("tokenizer_config.json"),
                      std::string(R"({"bos_token": "<|b|>", "eos_token": {"content": "<|e|>"}, "chat_template": )") +
                          "\"{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\"}");
  testing::write_file(dir.file("m.json"), kMessages);
  const Output r = chat_template("--model " + dir.path() + " --messages " + dir.file("m.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<|b|>Be brief.<|e|>Hi<|e|>");
}

TEST(CliChatTemplate, TemplateErrorExitsWithItsMessage) {
  testing::TempDir dir;
  testing::write_file(dir.file("t.jinja"), "ok\n{{ raise_exception('System role not supported') }}");
  testing::write_file(dir.file("m.json"), kMessages);
  const Output r = chat_template("--template " + dir.file("t.jinja") + " --messages " + dir.file("m.json"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "flexh2o: error: " + dir.file("t.jinja") + ":2: System role not supported\n");
}

TEST(CliChatTemplate, BadInputsAreOneLine) {
  testing::TempDir dir;
  testing::write_file(dir.file("t.jinja"), "x");
  testing::write_file(dir.file("bad.json"), "{not json");
  testing::write_file(dir.file("m.json"), kMessages);
  Output r = chat_template("--template " + dir.file("t.jinja") + " --messages " + dir.file("bad.json"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--messages " + dir.file("bad.json") + ": not valid JSON"));
  r = chat_template("--template " + dir.file("t.jinja") + " --messages " + dir.file("m.json") + " --date 2026-13-01");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("'2026-13-01' is not a date"));
  r = chat_template("--messages " + dir.file("bad.json"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--template FILE or --model M"));
}

}  // namespace
}  // namespace flexh2o
