// Reading an OpenAI batch line costs time linear in its size (issue 47: a logit_bias of
// 200,000 entries took ~100 s before its error line). Each field that holds a list or an
// object is scaled to 1k, 10k and 100k entries, and the time from the file to the request
// (or to its error) is measured in process: read, parsed, checked against a model. Linear time
// makes 10x the entries cost ~10x; a quadratic reader costs ~100x. The bound, 30x plus a
// fixed slack, lies between. Each time is this process's CPU time, the least of a few tries, so
// that a busy 2-core machine (another process taking the core for a while) does not fail it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <string>
#include <string_view>

#include "engine/serving/openai_job.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

constexpr double kMaxGrowth = 30.0;      // time(10 n) <= 30 time(n) + slack
constexpr double kSlackSeconds = 0.02;   // what timer and scheduling noise add to a small time
constexpr int kTries = 3;

// n entries "<before><offset + i><after>", comma-separated.
std::string entries(int n, std::string_view before, std::string_view after, int offset = 0) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ',';
    s += before;
    s += std::to_string(offset + i);
    s += after;
  }
  return s;
}

std::string line(const std::string& url, const std::string& body) {
  return R"({"custom_id": "big", "method": "POST", "url": ")" + url + R"(", "body": {)" + body + "}}\n";
}
std::string completion(const std::string& fields) { return line("/v1/completions", R"("prompt": [1, 2, 3], )" + fields); }
std::string chat(const std::string& fields) { return line("/v1/chat/completions", fields); }

struct Field {
  const char* name;
  std::function<std::string(int n)> make;  // the line with n entries
  const char* outcome;                     // in the error ("" : the request is made)
};

const Field kFields[] = {
    {"logit_bias in the vocabulary", [](int n) { return completion(R"("logit_bias": {)" + entries(n, "\"", "\": 1") + "}"); },
     ""},
    {"logit_bias beyond the vocabulary",
     [](int n) { return completion(R"("logit_bias": {)" + entries(n, "\"", "\": -5", 1000000) + "}"); }, "logit_bias"},
    {"stop", [](int n) { return completion(R"("stop": [)" + entries(n, "\"s", "\"") + "]"); }, "body.stop holds"},
    {"messages",
     [](int n) { return chat(R"("messages": [)" + entries(n, R"({"role": "user", "content": "m)", "\"}") + "]"); },
     "no tokenizer"},
    {"tools",
     [](int n) {
       return chat(R"("messages": [{"role": "user", "content": "hi"}], "tools": [)" +
                   entries(n, R"({"type": "function", "function": {"name": "f)",
                           R"(", "parameters": {"type": "object", "properties": {}}}})") +
                   "]");
     },
     "\"tools\" is not implemented"},
    {"prompt token ids", [](int n) { return line("/v1/completions", R"("prompt": [)" + entries(n, "", "") + "]"); }, ""},
};

// A model shape with room for every line that should run: 2^18 tokens, 2^20 positions.
engine::ModelConfig roomy_config() {
  engine::ModelConfig c = testing::tiny_opt_config();
  c.vocab_size = 1 << 18;
  c.max_positions = 1 << 20;
  return c;
}

// The least CPU time of kTries (this process's: another process taking the core does not
// count) to read and prepare the one-line file; checks its outcome.
double seconds_to_prepare(const std::string& path, const serving::OpenAiPromptContext& ctx, const Field& f) {
  double best = std::numeric_limits<double>::infinity();
  for (int t = 0; t < kTries; ++t) {
    const std::clock_t t0 = std::clock();
    const serving::OpenAiJob oj = serving::open_openai_job(path, ctx);
    best = std::min(best, static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC);
    EXPECT_EQ(oj.lines.size(), 1u);
    if (*f.outcome == '\0')
      EXPECT_EQ(oj.lines[0].error, "") << f.name;
    else
      EXPECT_NE(oj.lines[0].error.find(f.outcome), std::string::npos) << f.name << ": " << oj.lines[0].error;
  }
  return best;
}

TEST(RequestScaling, TenTimesTheEntriesTakeAboutTenTimesTheTime) {
  testing::TempDir dir;
  const engine::ModelConfig cfg = roomy_config();
  const serving::OpenAiPromptContext ctx{.config = &cfg, .tok = nullptr, .render_chat = {}, .gen_len = 4, .default_seed = 1};
  for (const Field& f : kFields) {
    double seconds[3] = {};
    for (int s = 0; s < 3; ++s) {
      const int n = 1000 * (s == 0 ? 1 : s == 1 ? 10 : 100);
      testing::write_file(dir.file("big.jsonl"), f.make(n));
      seconds[s] = seconds_to_prepare(dir.file("big.jsonl"), ctx, f);
    }
    std::printf("%-34s 1k %8.4f s  10k %8.4f s  100k %8.4f s\n", f.name, seconds[0], seconds[1], seconds[2]);
    EXPECT_LE(seconds[1], kMaxGrowth * seconds[0] + kSlackSeconds) << f.name << ": 1k -> 10k entries";
    EXPECT_LE(seconds[2], kMaxGrowth * seconds[1] + kSlackSeconds) << f.name << ": 10k -> 100k entries";
  }
}

}  // namespace
}  // namespace flexh2o
