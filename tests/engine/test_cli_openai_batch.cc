// `flexh2o run` on OpenAI batch files end to end, on the embedded model (stories260K): bad lines
// become error lines while the job goes on, --resume continues by custom_id, stop strings,
// n, max_tokens, seed and logprobs behave as OpenAI documents them, and n choices share one
// prefill.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/json_near.h"
#include "tests/support/cli_run.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
using Output = testing::CliOutput;

Output run(const std::string& args) { return testing::run_cli(args); }

std::string completion(const std::string& id, const Json& body) {
  return Json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}.dump() + "\n";
}

// The result lines of a file by custom_id (each must appear once).
std::map<std::string, Json> results(const std::string& path) {
  std::map<std::string, Json> by_id;
  std::istringstream lines(testing::read_file(path));
  for (std::string line; std::getline(lines, line);) {
    const Json j = Json::parse(line);
    const std::string id = j["custom_id"].is_string() ? j["custom_id"].get<std::string>() : j["id"].get<std::string>();
    EXPECT_FALSE(by_id.count(id)) << "custom_id " << id << " twice";
    by_id[id] = j;
  }
  return by_id;
}

const Json& body(const Json& result) { return result.at("response").at("body"); }
std::string text(const Json& result, std::size_t choice = 0) {
  return body(result)["choices"][choice]["text"].get<std::string>();
}

// What a rerun must reproduce: the result without its time stamp.
Json timeless(Json j) {
  if (j["response"].is_object()) j["response"]["body"].erase("created");
  return j;
}

// A log-probability's tolerance when the rows sharing a step differ (another batch, a resumed
// job): a GEMM's summation order may follow the row count, and a reordered fp32 dot product of
// K <= 172 terms errs by at most K * 2^-24 of its terms' magnitudes; through stories260K's 5
// layers that bounds a logit (and so a log-softmax) near 1e-4. Measured: about 1e-7.
constexpr double kReorderedLogprob = 1e-4;


const char* kPrompts[] = {"Once upon a time", "The dog", "Lily and Tom", "One day", "The sun", "A little bird"};

TEST(CliOpenAiBatch, ThreeBadLinesAmongAHundredGiveErrorLinesAndTheJobResumes) {
  testing::TempDir dir;
  std::string file;
  for (int i = 0; i < 100; ++i) {
    const std::string id = "req-" + std::to_string(i);
    if (i == 17) file += "{\"custom_id\": \"req-17\", \"method\": \"POST\", oops\n";  // invalid JSON
    else if (i == 50) file += Json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/embeddings"}, {"body", Json::object()}}.dump() + "\n";
    else if (i == 83) file += completion(id, {{"prompt", std::vector<int>(600, 5)}, {"max_tokens", 4}});  // > 512 positions
    else
      file += completion(id, {{"prompt", kPrompts[i % 6]}, {"max_tokens", 3 + i % 5}, {"temperature", i % 2 ? 0.8 : 0.0},
                              {"seed", i}});
  }
  testing::write_file(dir.file("batch.jsonl"), file);
  const std::string args = "--prompts " + dir.file("batch.jsonl") + " --out " + dir.file("out.jsonl") + " --batch 8";
  const Output r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("3 bad request lines"));
  const std::map<std::string, Json> all = results(dir.file("out.jsonl"));
  ASSERT_EQ(all.size(), 100u);
  int ok = 0, errors = 0;
  for (const auto& [id, j] : all) {
    if (j["error"].is_null()) {
      ++ok;
      EXPECT_EQ(j["response"]["status_code"], 200);
      EXPECT_EQ(body(j)["object"], "text_completion");
    } else {
      ++errors;
      EXPECT_TRUE(j["response"].is_null());
    }
  }
  EXPECT_EQ(ok, 97);
  EXPECT_EQ(errors, 3);
  EXPECT_THAT(all.at("batch_req_line_18")["error"]["message"].get<std::string>(), HasSubstr("not valid JSON"));
  EXPECT_THAT(all.at("req-50")["error"]["message"].get<std::string>(), HasSubstr("unknown url"));
  EXPECT_THAT(all.at("req-83")["error"]["message"].get<std::string>(), HasSubstr("positions"));

  // Cut the file to its first 40 lines and half of the 41st, as a kill would: --resume writes
  // the rest, each request once, as the uninterrupted run did.
  std::istringstream lines(testing::read_file(dir.file("out.jsonl")));
  std::string kept, line;
  for (int i = 0; i < 40 && std::getline(lines, line); ++i) kept += line + "\n";
  std::getline(lines, line);
  testing::write_file(dir.file("out.jsonl"), kept + line.substr(0, line.size() / 2));
  const Output resumed = run(args + " --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const std::map<std::string, Json> again = results(dir.file("out.jsonl"));
  ASSERT_EQ(again.size(), 100u);
  for (const auto& [id, j] : all) testing::expect_json_near(timeless(again.at(id)), timeless(j), kReorderedLogprob, id);
}

TEST(CliOpenAiBatch, SamplingFieldsBehaveAsOpenAiDocuments) {
  testing::TempDir dir;
  const Json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true}};
  testing::write_file(dir.file("first.jsonl"), completion("plain", greedy));
  ASSERT_EQ(run("--prompts " + dir.file("first.jsonl") + " --out " + dir.file("first.out")).code, 0);
  const Json plain = results(dir.file("first.out")).at("plain");
  const std::string whole = text(plain);
  ASSERT_EQ(body(plain)["usage"]["completion_tokens"], 30);
  EXPECT_EQ(body(plain)["choices"][0]["finish_reason"], "length");
  // A stop string from the middle of that text: the text ends right before it.
  const std::size_t space = whole.find(' ', whole.size() / 2);
  ASSERT_NE(space, std::string::npos) << whole;
  const std::string stop = whole.substr(space, 3);

  Json stopped = greedy, sampled = greedy, seeded = greedy, other_seed = greedy, logprobs = greedy, short_one = greedy;
  stopped["stop"] = {stop, "never appears"};
  sampled["temperature"] = 1.0;
  sampled["n"] = 3;
  sampled["seed"] = 7;
  seeded["temperature"] = 1.0;
  seeded["seed"] = 7;
  other_seed["temperature"] = 1.0;
  other_seed["seed"] = 8;
  logprobs["logprobs"] = 2;
  short_one["max_tokens"] = 5;
  testing::write_file(dir.file("b.jsonl"), completion("stopped", stopped) + completion("n3", sampled) +
                                               completion("seed7", seeded) + completion("filler", greedy) +
                                               completion("seed7-again", seeded) + completion("seed8", other_seed) +
                                               completion("logprobs", logprobs) + completion("short", short_one));
  for (const char* batch : {"1", "8"}) {  // a request's result does not depend on its batch
    const std::string out = dir.file(std::string("b") + batch + ".out");
    const Output r = run("--prompts " + dir.file("b.jsonl") + " --out " + out + " --batch " + batch);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  const std::map<std::string, Json> one = results(dir.file("b1.out")), all = results(dir.file("b8.out"));
  for (const auto& [id, j] : one) testing::expect_json_near(timeless(all.at(id)), timeless(j), kReorderedLogprob, id);

  EXPECT_EQ(text(all.at("stopped")), whole.substr(0, space)) << "stop '" << stop << "'";
  EXPECT_EQ(body(all.at("stopped"))["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(body(all.at("stopped"))["usage"]["completion_tokens"], 30);
  EXPECT_EQ(text(all.at("filler")), whole) << "greedy requests give the same text in any batch";

  const Json& n3 = body(all.at("n3"));
  ASSERT_EQ(n3["choices"].size(), 3u);
  std::set<std::string> texts;
  for (std::size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(n3["choices"][c]["index"], c);
    texts.insert(text(all.at("n3"), c));
  }
  EXPECT_GE(texts.size(), 2u) << "n choices are sampled independently";
  EXPECT_EQ(n3["usage"]["prompt_tokens"], body(plain)["usage"]["prompt_tokens"]) << "the prompt counts once";
  EXPECT_EQ(n3["usage"]["completion_tokens"], 90);

  EXPECT_EQ(text(all.at("seed7-again")), text(all.at("seed7"))) << "same seed and parameters, same result";
  EXPECT_EQ(text(all.at("seed7")), text(all.at("n3"), 0)) << "a seeded request's first choice is its n=1 result";
  EXPECT_NE(text(all.at("seed8")), text(all.at("seed7"))) << "another seed draws otherwise";

  EXPECT_EQ(body(all.at("short"))["usage"]["completion_tokens"], 5);
  EXPECT_EQ(text(all.at("short")), whole.substr(0, text(all.at("short")).size()));

  const Json& lp = body(all.at("logprobs"))["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 30u);
  ASSERT_EQ(lp["token_logprobs"].size(), 30u);
  for (std::size_t i = 0; i < 30; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
    double best = -1e9;  // greedy: the chosen token is the most likely
    for (const auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-6);
  }
  EXPECT_TRUE(body(all.at("stopped"))["choices"][0]["logprobs"].is_null());
}

// A request's n choices share one prefill: each choice's result is the one a prefill of its own
// gives (--share-prefill 0), in memory and over the tiers, with eviction and a compressed cache,
// under continuous and fixed batching; the metrics count each prompt computed once; --resume
// keeps a request's choices together in one line. (Log-probabilities may differ in their last
// bits, as the steps' rows differ: test_prefill_fork bounds them.)
TEST(CliOpenAiBatch, NChoicesShareOnePrefill) {
  testing::TempDir dir;
  std::string file;
  const int lines = 8;
  auto choices = [](int line) { return 1 + line % 4; };
  for (int i = 0; i < lines; ++i)
    file += completion("req-" + std::to_string(i), {{"prompt", kPrompts[i % 6]}, {"max_tokens", 4 + i % 5},
                                                   {"temperature", 1.0}, {"n", choices(i)}, {"seed", i}});
  testing::write_file(dir.file("b.jsonl"), file);
  struct Setup {
    std::string flags;
    int block;   // gpu_batch_size x num_gpu_batches
    bool fixed;  // fixed blocks cut a request's choices apart at block boundaries
  };
  const Setup setups[] = {
      {"--gpu-batch-size 4 --num-gpu-batches 2", 8, false},
      {"--gpu-batch-size 4 --num-gpu-batches 2 --batching fixed", 8, true},
      {"--gpu-batch-size 2 --num-gpu-batches 3 --percent 30 40 20 30 50 50", 6, false},
      {"--gpu-batch-size 3 --num-gpu-batches 1 --percent 100 0 0 100 100 0 --kv h2o:0.5 --compress-cache", 3, false},
      {"--gpu-batch-size 2 --num-gpu-batches 2 --percent 100 0 30 30 100 0 --kv tova:0.5 --batching fixed "
       "--cpu-cache-compute", 4, true}};
  const std::string job = "--prompts " + dir.file("b.jsonl") + " --out ";
  for (const Setup& setup : setups) {
    SCOPED_TRACE(setup.flags);
    std::map<std::string, Json> by_share[2];
    std::int64_t computed[2] = {0, 0}, prompt_tokens = 0;
    for (const int share : {0, 1}) {
      const std::string out = dir.file("out-" + std::to_string(share)), metrics = dir.file("metrics-" + std::to_string(share));
      const Output r = run(job + out + " " + setup.flags + " --metrics " + metrics + " --share-prefill " + std::to_string(share));
      ASSERT_EQ(r.code, 0) << r.err;
      by_share[share] = results(out);
      const Json m = Json::parse(testing::read_file(metrics));
      computed[share] = m["prompt_tokens_computed"].get<std::int64_t>();
      prompt_tokens = m["prompt_tokens"].get<std::int64_t>();
    }
    ASSERT_EQ(by_share[1].size(), static_cast<std::size_t>(lines));
    // Each request's prompt once per run of its choices admitted together: at most a block's
    // slots, and under fixed blocks within one block.
    std::int64_t once = 0;
    for (int i = 0, first = 0; i < lines; first += choices(i), ++i) {
      const std::string id = "req-" + std::to_string(i);
      const Json& j = by_share[1].at(id);
      EXPECT_EQ(timeless(j), timeless(by_share[0].at(id))) << id;
      const int last = first + choices(i) - 1;
      const int prefills = setup.fixed ? last / setup.block - first / setup.block + 1 : (choices(i) + setup.block - 1) / setup.block;
      once += prefills * body(j)["usage"]["prompt_tokens"].get<std::int64_t>();
    }
    EXPECT_EQ(computed[0], prompt_tokens) << "every choice prefilled its prompt";
    EXPECT_EQ(computed[1], once);
    EXPECT_LT(computed[1], prompt_tokens);
  }
  // Cut after three result lines: --resume runs the other requests, all choices of each.
  std::istringstream lines_in(testing::read_file(dir.file("out-1")));
  std::string kept, line;
  for (int i = 0; i < 3 && std::getline(lines_in, line); ++i) kept += line + "\n";
  testing::write_file(dir.file("out-1"), kept);
  const std::map<std::string, Json> before = results(dir.file("out-0"));
  ASSERT_EQ(run(job + dir.file("out-1") + " " + setups[4].flags + " --resume").code, 0);
  const std::map<std::string, Json> resumed = results(dir.file("out-1"));
  ASSERT_EQ(resumed.size(), static_cast<std::size_t>(lines));
  for (const auto& [id, j] : resumed) EXPECT_EQ(timeless(j), timeless(before.at(id))) << id;
}

TEST(CliOpenAiBatch, GreedyCompletionIsTheOwnFormatsContinuation) {
  testing::TempDir dir;
  testing::write_file(dir.file("own.jsonl"), "{\"id\": 1, \"prompt\": \"The dog\", \"max_tokens\": 12}\n");
  testing::write_file(dir.file("oai.jsonl"), completion("1", {{"prompt", "The dog"}, {"max_tokens", 12}, {"temperature", 0}}));
  ASSERT_EQ(run("--prompts " + dir.file("own.jsonl") + " --out " + dir.file("own.out")).code, 0);
  ASSERT_EQ(run("--prompts " + dir.file("oai.jsonl") + " --out " + dir.file("oai.out")).code, 0);
  const Json own = Json::parse(testing::read_file(dir.file("own.out")));
  EXPECT_EQ(text(results(dir.file("oai.out")).at("1")), own["text"]);
}

TEST(CliOpenAiBatch, ChatWithoutATemplateIsAnErrorLine) {
  testing::TempDir dir;
  testing::write_file(dir.file("b.jsonl"),
                      Json{{"custom_id", "c"}, {"method", "POST"}, {"url", "/v1/chat/completions"},
                           {"body", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}}}.dump() + "\n" +
                          completion("ok", {{"prompt", "The dog"}, {"max_tokens", 2}}));
  const Output r = run("--prompts " + dir.file("b.jsonl") + " --out " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto all = results(dir.file("out"));
  EXPECT_THAT(all.at("c")["error"]["message"].get<std::string>(), HasSubstr("chat template"));
  EXPECT_TRUE(all.at("ok")["error"].is_null());
}

}  // namespace
}  // namespace flexh2o
