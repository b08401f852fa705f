// OpenAI batch files (engine/serving/openai_batch.h, openai_results.h): every line read or named
// bad with why, body fields into sampling, result and error lines in OpenAI's shape, and the
// results file resuming by custom_id.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "engine/serving/linear_json.h"
#include "engine/serving/openai_batch.h"
#include "engine/serving/openai_job.h"
#include "engine/serving/openai_results.h"
#include "engine/serving/result_file.h"
#include "tests/support/error_of.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using serving::OpenAiLine;
using serving::parse_openai_line;

std::string chat_line(const std::string& custom_id, const std::string& body_fields) {
  return R"({"custom_id": ")" + custom_id + R"(", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}])" +
         (body_fields.empty() ? "" : ", " + body_fields) + "}}";
}

std::string completion_line(const std::string& custom_id, const std::string& body_fields) {
  return R"({"custom_id": ")" + custom_id + R"(", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once")" +
         (body_fields.empty() ? "" : ", " + body_fields) + "}}";
}

TEST(OpenAiBatch, ChatBodyFieldsBecomeTheRequestsSampling) {
  const OpenAiLine r = parse_openai_line(
      chat_line("q1", R"("model": "m", "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 11,
                 "stop": ["\n", "END"], "n": 3, "presence_penalty": 0.5, "frequency_penalty": -0.25,
                 "logprobs": true, "top_logprobs": 4, "logit_bias": {"50": -100, "7": 2.5}, "top_k": 20,
                 "min_p": 0.05, "repetition_penalty": 1.2, "min_tokens": 2, "ignore_eos": true,
                 "stop_token_ids": [9, 10])"),
      3);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.key, "\"q1\"");
  EXPECT_EQ(r.endpoint, serving::Endpoint::Chat);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.seeded);
  const kernels::SamplingParams& p = r.sampling;
  EXPECT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.seed, 11u);
  EXPECT_EQ(p.presence_penalty, 0.5f);
  EXPECT_EQ(p.frequency_penalty, -0.25f);
  EXPECT_EQ(p.logprobs, 4);
  ASSERT_EQ(p.logit_bias.size(), 2u);
  EXPECT_EQ(p.logit_bias[0].token, 7);  // sorted by token
  EXPECT_EQ(p.logit_bias[1].bias, -100.0f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.repetition_penalty, 1.2f);
  EXPECT_EQ(p.min_tokens, 2);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.stop_token_ids, (std::vector<std::int32_t>{9, 10}));
}

TEST(OpenAiBatch, DefaultsAreOpenAis) {
  const OpenAiLine r = parse_openai_line(chat_line("d", ""), 1);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.logprobs, -1);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.seeded);
}

TEST(OpenAiBatch, CompletionPromptsAreTextOrTokenIds) {
  const OpenAiLine text = parse_openai_line(completion_line("t", R"("logprobs": 2)"), 1);
  ASSERT_EQ(text.error, "");
  EXPECT_EQ(text.prompt_text, "Once");
  EXPECT_EQ(text.sampling.logprobs, 2);
  const OpenAiLine ids = parse_openai_line(
      R"({"custom_id": "i", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 5, 9]}})", 1);
  ASSERT_EQ(ids.error, "");
  EXPECT_FALSE(ids.prompt_text.has_value());
  EXPECT_EQ(ids.prompt_tokens, (std::vector<std::int32_t>{1, 5, 9}));
}

// Every kind of bad line is an error naming what is wrong, never an exception.
TEST(OpenAiBatch, BadLinesCarryTheirError) {
  const struct {
    std::string line, mention, param;
  } cases[] = {
      {"{not json", "not valid JSON", ""},
      {"[1, 2]", "must be an object", ""},
      {R"({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})", "custom_id", "custom_id"},
      {R"({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}})", "unknown url", "url"},
      {R"({"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x"}})", "POST", "method"},
      {R"({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}, "extra": 1})",
       "unknown field \"extra\"", "extra"},
      {completion_line("x", R"("echo": true)"), "\"echo\" is not implemented", "echo"},
      {completion_line("x", R"("best_of": 2)"), "\"best_of\" is not implemented", "best_of"},
      {chat_line("x", R"("tools": [])"), "\"tools\" is not implemented", "tools"},
      {chat_line("x", R"("temperature": 3)"), "temperature", "temperature"},
      {chat_line("x", R"("top_p": 0)"), "top_p", "top_p"},
      {chat_line("x", R"("n": 0)"), "body.n", "n"},
      {chat_line("x", R"("top_logprobs": 2)"), "needs body.logprobs", "top_logprobs"},
      {chat_line("x", R"("logit_bias": {"abc": 1})"), "not a token id", "logit_bias"},
      {chat_line("x", R"("logit_bias": {"5": 200})"), "[-100, 100]", "logit_bias"},
      {chat_line("x", R"("stop": [""])"), "empty string", "stop"},
      {chat_line("x", R"("stop": ["a", "b", "c", "d", "e"])"), "body.stop holds 5 strings; at most 4", "stop"},
      {chat_line("x", R"("temperature": 0.5, "temperature": 1)"), "\"temperature\" appears twice", ""},
      {chat_line("x", R"("logit_bias": {"5": 1, "5": 2})"), "\"5\" appears twice", ""},
      {chat_line("x", R"("stream": true)"), "stream", "stream"},
      {chat_line("x", R"("max_tokens": 0)"), "max_tokens", "max_tokens"},
      {chat_line("x", R"("max_tokens": 5, "max_completion_tokens": 5)"), "both", "max_completion_tokens"},
      {R"({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}})", "messages",
       "messages"},
      {completion_line("x", "").replace(completion_line("x", "").find("\"Once\""), 6, R"(["a", "b"])"),
       "several prompts", "prompt"},
  };
  for (const auto& c : cases) {
    const OpenAiLine r = parse_openai_line(c.line, 4);
    EXPECT_NE(r.error.find(c.mention), std::string::npos) << c.line << "\n  gave: " << r.error;
    EXPECT_EQ(r.error_param, c.param) << c.line;
  }
}

TEST(OpenAiBatch, ReadsAFileKeepingBadAndRepeatedLines) {
  testing::TempDir dir;
  testing::write_file(dir.file("b.jsonl"), chat_line("a", "") + "\n\n{oops\n" + chat_line("a", "") + "\n" +
                                                completion_line("b", "") + "\n");
  EXPECT_TRUE(serving::is_openai_batch_file(dir.file("b.jsonl")));
  const std::vector<OpenAiLine> lines = serving::read_openai_batch(dir.file("b.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].error, "");
  EXPECT_EQ(lines[1].line, 3);
  EXPECT_EQ(lines[1].key, "line 3");
  EXPECT_NE(lines[1].error, "");
  EXPECT_NE(lines[2].error.find("already used on line 1"), std::string::npos) << lines[2].error;
  EXPECT_EQ(lines[2].key, "line 4") << "a repeated custom_id's error is keyed by its line";
  EXPECT_EQ(lines[3].error, "");
  testing::write_file(dir.file("own.jsonl"), "{\"id\": 1, \"prompt\": \"x\"}\n");
  EXPECT_FALSE(serving::is_openai_batch_file(dir.file("own.jsonl")));
}

TEST(OpenAiBatch, LinesParseAsNlohmannParsesThem) {
  // The same value, keys in the order given, as nlohmann's own (quadratic) ordered parse.
  for (const std::string& text :
       {chat_line("a", R"("logit_bias": {"9": 1, "3": -2.5, "100": 0}, "stop": ["x", "y"], "seed": 18446744073709551615)"),
        std::string(R"([1, -2, 3.5e3, true, false, null, "s\u00e9\n", {}, [], {"b": {"a": [{}]}, "a": 1}])"),
        std::string("\"just a string\""), std::string("  42  ")}) {
    EXPECT_EQ(serving::parse_linear_json(text, "t"), nlohmann::ordered_json::parse(text)) << text;
    EXPECT_EQ(serving::parse_linear_json(text, "t").dump(), nlohmann::ordered_json::parse(text).dump()) << text;
  }
  for (const std::string& bad : {std::string("{\"a\": 1,}"), std::string("[1 2]"), std::string(""), std::string("{} x"),
                                std::string(200, '[') + std::string(200, ']')}) {
    const std::string err = testing::error_of([&] { serving::parse_linear_json(bad, "where"); });
    EXPECT_EQ(err.rfind("where: ", 0), 0u) << bad << ": " << err;
  }
  // A key may repeat in different objects, not within one.
  EXPECT_NO_THROW(serving::parse_linear_json(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})", "t"));
  EXPECT_NE(testing::error_of([] { serving::parse_linear_json(R"([{"a": 1, "b": 2, "a": 3}])", "t"); })
                .find("\"a\" appears twice in one object"),
            std::string::npos);
}

// A prompt's token ids are read straight into a vector (an id as 4 bytes, not a 16-byte JSON
// value and more: a 250 MB line of ids took ~23 times its size and aborted); its other items
// stay in the value, so that a bad item is still an error naming the field.
TEST(OpenAiBatch, TokenIdsAreReadAsideNotAsJsonValues) {
  serving::IdArray ids{.path = {"body", "prompt"}};
  const auto j = serving::parse_linear_json(R"({"body": {"prompt": [1, 5, 9], "n": [7]}, "prompt": [3]})", "t", &ids);
  EXPECT_TRUE(ids.found);
  EXPECT_EQ(ids.ids, (std::vector<std::int32_t>{1, 5, 9}));
  EXPECT_EQ(j.dump(), R"({"body":{"prompt":[],"n":[7]},"prompt":[3]})");
  serving::IdArray mixed{.path = {"tokens"}};
  EXPECT_EQ(serving::parse_linear_json(R"({"tokens": [1, -1, "a", [2], 2147483648, 3]})", "t", &mixed).dump(),
            R"({"tokens":[-1,"a",[2],2147483648]})");
  EXPECT_EQ(mixed.ids, (std::vector<std::int32_t>{1, 3}));
  const auto with_prompt = [](const std::string& prompt) {
    const std::string line = completion_line("x", "");
    return parse_openai_line(std::string(line).replace(line.find("\"Once\""), 6, prompt), 1);
  };
  for (const char* prompt : {"[1, -5]", "[1, \"a\"]", "[2147483648]", "[[1]]"}) {
    const OpenAiLine r = with_prompt(prompt);
    EXPECT_EQ(r.error_param, "prompt") << prompt << ": " << r.error;
  }
  EXPECT_EQ(with_prompt("[\"Hi\"]").prompt_text, "Hi");
  // Telling the formats apart builds no value at all.
  EXPECT_EQ(serving::object_has_key(R"({"custom_id": 1, "x": [1, 2]})", "custom_id"), true);
  EXPECT_EQ(serving::object_has_key(R"({"id": 1, "x": {"custom_id": 2}})", "custom_id"), false);
  EXPECT_EQ(serving::object_has_key("[1]", "custom_id"), std::nullopt);
  EXPECT_EQ(serving::object_has_key("{oops", "custom_id"), std::nullopt);
}

// A constraint's text is bounded before it compiles (compiling takes ~100 bytes a byte).
TEST(OpenAiBatch, ConstraintsPastTheTextBoundAreErrorLinesNamingTheField) {
  const std::string big(serving::kMaxConstraintBytes, 'a');
  const OpenAiLine regex = parse_openai_line(completion_line("x", R"("guided_regex": ")" + big + "b\""), 1);
  EXPECT_EQ(regex.error_param, "guided_regex");
  EXPECT_NE(regex.error.find("body.guided_regex is 4194305 bytes of constraint, more than 4194304"), std::string::npos)
      << regex.error.substr(0, 200);
  std::string values = "[";
  for (int i = 0; i < 400000; ++i) values += "\"abcdefghij\",";
  const OpenAiLine schema = parse_openai_line(completion_line("x", R"("guided_json": {"enum": )" + values + "\"z\"]}"), 1);
  EXPECT_EQ(schema.error_param, "guided_json");
  EXPECT_EQ(parse_openai_line(completion_line("x", R"("guided_regex": ")" + big.substr(1) + "\""), 1).error, "");
}

// Bounds the model sets, each an error line naming its field, before anything renders.
TEST(OpenAiBatch, ListsLongerThanTheModelAllowsAreErrorLinesNamingTheField) {
  testing::TempDir dir;
  const engine::ModelConfig cfg = testing::tiny_opt_config();  // 97 tokens, 64 positions
  std::string messages, bias, stop_ids;
  for (int i = 0; i < 98; ++i) {
    const std::string comma = i > 0 ? ", " : "";
    if (i < 65) messages += comma + R"({"role": "user", "content": "hi"})";
    bias += comma + "\"" + std::to_string(i) + "\": 1";
    stop_ids += comma + std::to_string(i % 90);
  }
  const std::string file =
      R"({"custom_id": "m", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [)" + messages +
      "]}}\n" + completion_line("b", R"("logit_bias": {)" + bias + "}") + "\n" +
      completion_line("s", R"("stop_token_ids": [)" + stop_ids + "]") + "\n";
  testing::write_file(dir.file("b.jsonl"), file);
  bool rendered = false;
  const serving::OpenAiPromptContext ctx{.config = &cfg,
                                     .tok = nullptr,
                                     .render_chat = [&](const nlohmann::ordered_json&) {
                                       rendered = true;
                                       return std::string();
                                     },
                                     .gen_len = 4,
                                     .default_seed = 1};
  const serving::OpenAiJob oj = serving::open_openai_job(dir.file("b.jsonl"), ctx);
  ASSERT_EQ(oj.lines.size(), 3u);
  EXPECT_EQ(oj.lines[0].error, "body.messages has 65 entries, more than the 64 positions of the model");
  EXPECT_EQ(oj.lines[0].error_param, "messages");
  EXPECT_FALSE(rendered);
  EXPECT_EQ(oj.lines[1].error, "body.logit_bias has 98 entries, more than the 97 tokens of the model's vocabulary");
  EXPECT_EQ(oj.lines[1].error_param, "logit_bias");
  EXPECT_EQ(oj.lines[2].error_param, "stop_token_ids");
  EXPECT_TRUE(oj.requests.empty());
}

TEST(OpenAiResults, ResultLinesHaveOpenAisShape) {
  OpenAiLine r = parse_openai_line(chat_line("q", R"("model": "my-model", "n": 2, "logprobs": true, "top_logprobs": 1)"), 1);
  ASSERT_EQ(r.error, "");
  std::vector<serving::ChoiceOutcome> choices(2);
  choices[0] = {{5, 6}, engine::FinishReason::Stop, {-0.5f, -1.0f}, {{{5, -0.5f}}, {{6, -1.0f}}}};
  choices[1] = {{7}, engine::FinishReason::Length, {-2.0f}, {{{3, -0.1f}}}};
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  const auto j = nlohmann::json::parse(serving::openai_result_line(r, prompt, choices, {.tok = nullptr, .model = "x", .created = 42}));
  EXPECT_EQ(j["custom_id"], "q");
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_EQ(j["response"]["status_code"], 200);
  const auto& body = j["response"]["body"];
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "my-model");
  EXPECT_EQ(body["created"], 42);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["usage"]["total_tokens"], 6);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  const auto& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[1]["logprob"], -1.0);
  EXPECT_EQ(content[1]["top_logprobs"].size(), 1u);
  EXPECT_EQ(serving::openai_result_key(j.dump()), "\"q\"");
}

TEST(OpenAiResults, ErrorLinesNameTheLineAndAreKeyedForResume) {
  const OpenAiLine bad = parse_openai_line("{oops", 9);
  const auto j = nlohmann::json::parse(serving::openai_error_line(bad));
  EXPECT_TRUE(j["response"].is_null());
  EXPECT_NE(j["error"]["message"].get<std::string>().find("line 9"), std::string::npos);
  EXPECT_EQ(serving::openai_result_key(j.dump()), "line 9");
  const OpenAiLine unknown = parse_openai_line(completion_line("u", R"("suffix": "x")"), 2);
  const auto k = nlohmann::json::parse(serving::openai_error_line(unknown));
  EXPECT_EQ(k["custom_id"], "u");
  EXPECT_EQ(k["error"]["param"], "suffix");
  EXPECT_EQ(serving::openai_result_key(k.dump()), "\"u\"");
}

// A line one of whose choices failed (its constraint: a grammar past what can be followed) is
// an error line naming the line and why; a line beside it is a result line as ever.
TEST(OpenAiResults, ALineWhoseGenerationFailedIsAnErrorLine) {
  const engine::ModelConfig cfg = testing::tiny_opt_config();
  const std::vector<std::string> texts = {
      R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2], "n": 2}})",
      R"({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": [3]}})"};
  const serving::OpenAiJob oj =
      serving::open_openai_job(serving::read_openai_batch(texts), {.config = &cfg, .gen_len = 4});
  ASSERT_EQ(oj.requests.size(), 3u);
  engine::GenerationResult r;
  r.tokens = {{5, 6}, {7}, {8, 9}};
  r.finish_reasons = {engine::FinishReason::Length, engine::FinishReason::Error, engine::FinishReason::Stop};
  r.errors = {"", "the grammar keeps too many positions open", ""};
  serving::OpenAiCollector collector(oj, {.tok = nullptr, .model = "x", .created = 1});
  const std::vector<serving::FinishedLine> lines = collector.add(oj.requests, r);
  ASSERT_EQ(lines.size(), 2u);
  const auto failed = nlohmann::json::parse(lines[0].text), fine = nlohmann::json::parse(lines[1].text);
  EXPECT_EQ(failed["custom_id"], "a");
  EXPECT_TRUE(failed["response"].is_null());
  EXPECT_EQ(failed["error"]["code"], "generation_failed");
  EXPECT_EQ(failed["error"]["message"], "line 1: the grammar keeps too many positions open");
  EXPECT_EQ(serving::openai_result_key(failed.dump()), "\"a\"");
  EXPECT_EQ(fine["custom_id"], "b");
  EXPECT_EQ(fine["response"]["body"]["choices"][0]["finish_reason"], "stop");
}

TEST(OpenAiResults, StopStringsEndTheTextAtTheEarliest) {
  const std::vector<std::string> stop = {"END", "\n\n"};
  EXPECT_EQ(serving::stop_position("abc\n\nxEND", stop), 3u);
  EXPECT_EQ(serving::stop_position("abcEND\n\n", stop), 3u);
  EXPECT_EQ(serving::stop_position("abc", stop), std::string::npos);
}

TEST(OpenAiResults, AResultsFileResumesByCustomId) {
  testing::TempDir dir;
  const std::string path = dir.file("out.jsonl");
  const OpenAiLine a = parse_openai_line(chat_line("a", ""), 1);
  const OpenAiLine bad = parse_openai_line("{oops", 2);
  const std::vector<serving::ChoiceOutcome> one = {{{5}, engine::FinishReason::Length, {}, {}}};
  const std::vector<std::int32_t> prompt = {1};
  testing::write_file(path, serving::openai_result_line(a, prompt, one, {}) + serving::openai_error_line(bad) + "{\"id\": \"batch_re");
  serving::ResultFile out(path, true, "", serving::ResultFormat::OpenAi);
  EXPECT_EQ(out.done_ids(), (std::set<std::string>{"\"a\"", "line 2"}));
  // Our own format's lines are no OpenAI results (and the other way round).
  testing::write_file(path, serving::ResultFile::line("1", "x", prompt));
  EXPECT_THROW(serving::ResultFile(path, true, "", serving::ResultFormat::OpenAi), std::runtime_error);
  testing::write_file(path, serving::openai_error_line(bad));
  EXPECT_THROW(serving::ResultFile(path, true, "", serving::ResultFormat::Simple), std::runtime_error);
}

}  // namespace
}  // namespace flexh2o
