// Structured output end to end (`flexh2o run` on the embedded stories260K): OpenAI batch bodies
// with response_format (json_schema, json_object) and vLLM's guided_json / guided_regex /
// guided_choice / guided_grammar, greedy and sampled, n choices, logprobs, continuous and fixed
// batching. Every output that stopped is checked with engine/grammar's own acceptor (the bytes
// walked from the start state end where the grammar accepts); tests/grammar/
// check_structured_outputs.py checks committed outputs of this job with Python's jsonschema and re.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/constraint.h"
#include "tests/support/cli_run.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;
using grammar::Constraint;

std::string completion(const std::string& id, const Json& body) {
  return Json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}.dump() + "\n";
}

std::map<std::string, Json> results(const std::string& path) {
  std::map<std::string, Json> by_id;
  std::istringstream lines(testing::read_file(path));
  for (std::string line; std::getline(lines, line);) {
    const Json j = Json::parse(line);
    by_id[j["custom_id"].get<std::string>()] = j;
  }
  return by_id;
}

// Whether `text` is a whole output of the constraint (`whole`), or the start of one: the
// grammar's own acceptor over its bytes (a vocabulary of the 256 single bytes, so that any text
// can be walked).
bool valid_output(const Constraint& c, const std::string& text, bool whole) {
  grammar::Vocabulary bytes;
  for (int b = 0; b < 256; ++b) bytes.token_bytes.emplace_back(1, static_cast<char>(b));
  const auto trie = std::make_shared<const grammar::TokenTrie>(std::move(bytes));
  grammar::Matcher m(std::make_shared<const grammar::CompiledGrammar>(grammar::constraint_grammar(c), trie));
  return (text.empty() || m.accept_bytes(text)) && (!whole || m.is_complete());
}

const char* kPersonSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 1, "maximum": 99},
  "mood": {"enum": ["happy", "sad", "sleepy"]}, "pets": {"type": "array", "items": {"type": "string", "maxLength": 6},
  "maxItems": 2}}, "required": ["name", "age", "mood"], "additionalProperties": false})";

struct Case {
  std::string id;
  Json body_fields;        // the structured-output field(s) and sampling
  Constraint constraint;   // what every choice must be an output of
  // Whether every choice must stop (finish reason stop) before max_tokens: not any JSON object
  // (a tiny model writes long keys and strings), whose choices may reach the limit, closed in
  // time, nor a limit just above the shortest output's length.
  bool must_stop = true;
  int max_tokens = 480;  // the model writes up to 20 whitespace bytes wherever JSON allows, often a token each
};

std::vector<Case> cases() {
  const Json schema = Json::parse(kPersonSchema);
  const Constraint person{.kind = Constraint::Kind::JsonSchema, .text = schema.dump()};
  const Constraint regex{.kind = Constraint::Kind::Regex, .text = "[A-Z][a-z]{1,8} (is|was) [0-9]{1,2}"};
  const Constraint choice{.kind = Constraint::Kind::Choice, .choices = {"happy", "sad", "a little sleepy"}};
  const Constraint object{.kind = Constraint::Kind::JsonObject};
  const Constraint gbnf{.kind = Constraint::Kind::Grammar, .text = "root ::= \"Tom \" verb \".\"\nverb ::= \"ran\" | \"sat\" | \"hid\"\n"};
  const Json greedy = {{"temperature", 0}};
  const Json sampled = {{"temperature", 1.0}, {"seed", 7}, {"n", 2}, {"logprobs", 3}};
  auto with = [](Json a, const Json& b) {
    for (const auto& [k, v] : b.items()) a[k] = v;
    return a;
  };
  return {
      {"schema", with({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}, {"strict", true}}}}}}, greedy), person},
      {"schema-n2", with({{"guided_json", schema}}, sampled), person},
      {"regex", with({{"guided_regex", regex.text}}, greedy), regex},
      {"regex-n2", with({{"guided_regex", regex.text}}, sampled), regex},
      {"choice", with({{"guided_choice", choice.choices}}, greedy), choice},
      {"choice-n2", with({{"guided_choice", choice.choices}}, sampled), choice},
      {"gbnf", with({{"guided_grammar", gbnf.text}}, sampled), gbnf},
      {"object", with({{"response_format", {{"type", "json_object"}}}}, greedy), object, false},
      // The shortest person is {"name":"","age":1,"mood":"sad"}: 33 bytes, so 36 tokens must close it.
      {"schema-closed", with({{"guided_json", schema}}, sampled), person, false, 36},
      {"object-closed", with({{"response_format", {{"type", "json_object"}}}}, sampled), object, false, 3},
  };
}

TEST(CliStructuredOutput, EveryOutputIsAnOutputOfItsConstraintInEveryBatching) {
  testing::TempDir dir;
  std::string file;
  const char* prompts[] = {"Once upon a time", "The cat", "Lily said"};
  const std::vector<Case> all = cases();
  for (std::size_t i = 0; i < all.size(); ++i) {
    Json body = all[i].body_fields;
    body["prompt"] = prompts[i % 3];
    body["max_tokens"] = all[i].max_tokens;
    file += completion(all[i].id, body);
  }
  testing::write_file(dir.file("b.jsonl"), file);
  std::map<std::string, Json> first;
  for (const std::string flags : {"--gpu-batch-size 2 --num-gpu-batches 2", "--gpu-batch-size 3 --batching fixed",
                                  "--gpu-batch-size 4 --share-prefill 0"}) {
    SCOPED_TRACE(flags);
    const std::string out = dir.file("out.jsonl");
    const testing::CliOutput r = testing::run_cli("--prompts " + dir.file("b.jsonl") + " --out " + out + " " + flags);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::map<std::string, Json> got = results(out);
    for (const Case& c : all) {
      const Json& res = got.at(c.id);
      ASSERT_TRUE(res["error"].is_null()) << c.id << ": " << res["error"].dump();
      const Json& choices = res["response"]["body"]["choices"];
      ASSERT_EQ(choices.size(), c.body_fields.value("n", 1)) << c.id;
      for (const Json& ch : choices) {
        const std::string text = ch["text"].get<std::string>();
        EXPECT_TRUE(ch["finish_reason"] == "stop" || !c.must_stop) << c.id << ": " << text;
        if (c.id.ends_with("-closed")) {
          EXPECT_EQ(ch["finish_reason"], "length") << c.id << ": closed by its limit";
        }
        EXPECT_TRUE(valid_output(c.constraint, text, true)) << c.id << " (" << ch["finish_reason"] << "): " << text;
        if (!c.body_fields.contains("logprobs")) continue;
        const Json& lp = ch["logprobs"];
        ASSERT_EQ(lp["token_logprobs"].size(), lp["tokens"].size()) << c.id;
        for (const Json& v : lp["token_logprobs"]) EXPECT_LE(v.get<double>(), 0.0) << c.id;
      }
      if (!first.count(c.id)) first[c.id] = res;
      const Json& before = first[c.id]["response"]["body"]["choices"];
      for (std::size_t k = 0; k < choices.size(); ++k)  // the tokens do not depend on the batching
        EXPECT_EQ(choices[k]["text"], before[k]["text"]) << c.id;
    }
  }
}

TEST(CliStructuredOutput, AMaskThatAllowsEveryTextGivesTheUnconstrainedGreedyOutput) {
  // [\s\S]* allows every character, and the end anywhere: the greedy tokens are the model's own.
  testing::TempDir dir;
  const Json plain = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 2}};
  Json open = plain;
  open["guided_regex"] = "[\\s\\S]*";
  testing::write_file(dir.file("b.jsonl"), completion("plain", plain) + completion("open", open));
  const testing::CliOutput r = testing::run_cli("--prompts " + dir.file("b.jsonl") + " --out " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = results(dir.file("out"));
  const Json& a = got.at("plain")["response"]["body"]["choices"][0];
  const Json& b = got.at("open")["response"]["body"]["choices"][0];
  EXPECT_EQ(a["text"], b["text"]);
  EXPECT_EQ(a["finish_reason"], b["finish_reason"]);
  EXPECT_EQ(a["logprobs"]["tokens"], b["logprobs"]["tokens"]);
}

TEST(CliStructuredOutput, LogprobsUnderAMaskAreOverTheAllowedTokens) {
  // vLLM's: the log-softmax of the masked logits. A word the model would not write after this
  // prompt is almost certain token by token once it is the only choice (its tokens, or the byte
  // tokens spelling the same bytes, are all that is allowed), and the alternatives asked for
  // beyond the few allowed are masked: -inf, written -9999.
  testing::TempDir dir;
  testing::write_file(dir.file("b.jsonl"),
                      completion("c", {{"prompt", "The cat"}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 5},
                                       {"guided_choice", {"supercalifragilistic"}}}));
  const testing::CliOutput r = testing::run_cli("--prompts " + dir.file("b.jsonl") + " --out " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::map<std::string, Json> got = results(dir.file("out"));
  const Json& ch = got.at("c")["response"]["body"]["choices"][0];
  EXPECT_EQ(ch["text"], "supercalifragilistic");
  EXPECT_EQ(ch["finish_reason"], "stop");
  const Json& lp = ch["logprobs"];
  ASSERT_FALSE(lp["token_logprobs"].empty());
  double total = 0;
  for (std::size_t i = 0; i < lp["token_logprobs"].size(); ++i) {
    total += lp["token_logprobs"][i].get<double>();
    bool masked_alternative = false;
    for (const auto& [token, logprob] : lp["top_logprobs"][i].items()) masked_alternative |= logprob == -9999.0;
    EXPECT_TRUE(masked_alternative) << "token " << i;
  }
  EXPECT_GT(total, -3.0) << "the word's log-probability under the mask";
}

TEST(CliStructuredOutput, AConstraintNotSupportedIsThatRequestsErrorLine) {
  testing::TempDir dir;
  const Json bad_schema = {{"type", "object"}, {"properties", {{"a", {{"not", {{"type", "string"}}}}}}}};
  testing::write_file(
      dir.file("b.jsonl"),
      completion("keyword", {{"prompt", "The cat"}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", bad_schema}}}}}}) +
          completion("regex", {{"prompt", "The cat"}, {"guided_regex", "(?=a)b"}}) +
          completion("two", {{"prompt", "The cat"}, {"guided_regex", "a"}, {"guided_choice", {"b"}}}) +
          completion("type", {{"prompt", "The cat"}, {"response_format", {{"type", "xml"}}}}) +
          completion("ok", {{"prompt", "The cat"}, {"max_tokens", 20}, {"response_format", {{"type", "text"}}}}));
  const testing::CliOutput r = testing::run_cli("--prompts " + dir.file("b.jsonl") + " --out " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = results(dir.file("out"));
  const auto error = [&](const std::string& id) { return got.at(id)["error"]["message"].get<std::string>(); };
  EXPECT_THAT(error("keyword"), HasSubstr("keyword 'not' is not supported"));
  EXPECT_EQ(got.at("keyword")["error"]["param"], "response_format");
  EXPECT_THAT(error("regex"), HasSubstr("body.guided_regex"));
  EXPECT_THAT(error("two"), HasSubstr("give one"));
  EXPECT_THAT(error("type"), HasSubstr("xml"));
  EXPECT_TRUE(got.at("ok")["error"].is_null());
}

// Constraints the engine used to run: a 16-byte regex that stalled the whole job, a const of
// the wrong type written with status 200, a lone surrogate. Each is its request's error line,
// and the job's other requests run.
TEST(CliStructuredOutput, ConstraintsThatWouldStallOrCannotBeMetAreErrorLines) {
  testing::TempDir dir;
  testing::write_file(
      dir.file("b.jsonl"),
      completion("stall", {{"prompt", "The cat"}, {"guided_regex", "(a?){30000}b"}}) +
          completion("const", {{"prompt", "The cat"}, {"guided_json", {{"type", "integer"}, {"const", "a"}}}}) +
          completion("surrogate", {{"prompt", "The cat"}, {"guided_grammar", "root ::= \"\\uD800\""}}) +
          completion("ok", {{"prompt", "The cat"}, {"max_tokens", 8}, {"guided_choice", {"up", "down"}}}));
  const testing::CliOutput r = testing::run_cli("--prompts " + dir.file("b.jsonl") + " --out " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = results(dir.file("out"));
  const auto error = [&](const std::string& id) { return got.at(id)["error"]["message"].get<std::string>(); };
  EXPECT_THAT(error("stall"), HasSubstr("body.guided_regex: the grammar keeps more than 32768 positions open at once"));
  EXPECT_EQ(got.at("stall")["error"]["param"], "guided_regex");
  EXPECT_THAT(error("const"), HasSubstr("'const' does not satisfy the schema's other keywords (type)"));
  EXPECT_THAT(error("surrogate"), HasSubstr("is a UTF-16 surrogate"));
  EXPECT_TRUE(got.at("ok")["error"].is_null());
}

// A limit no output of the constraint fits in (`{}` is 2 bytes; the model has no `{}` token)
// is an error line, not a truncated `{` with status 200.
TEST(CliStructuredOutput, AConstraintThatCannotCloseWithinMaxTokensIsAnErrorLine) {
  testing::TempDir dir;
  testing::write_file(dir.file("b.jsonl"),
                      completion("short", {{"prompt", "The cat"}, {"max_tokens", 1}, {"response_format", {{"type", "json_object"}}}}) +
                          completion("fits", {{"prompt", "The cat"}, {"max_tokens", 2}, {"response_format", {{"type", "json_object"}}}}));
  const testing::CliOutput r = testing::run_cli("--prompts " + dir.file("b.jsonl") + " --out " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = results(dir.file("out"));
  EXPECT_THAT(got.at("short")["error"]["message"].get<std::string>(),
              HasSubstr("body.response_format: no output it allows fits in max_tokens 1 (the shortest takes 2 bytes)"));
  EXPECT_EQ(got.at("short")["error"]["param"], "response_format");
  EXPECT_TRUE(got.at("fits")["error"].is_null());
}

TEST(CliStructuredOutput, OwnPromptsLinesTakeTheFieldsAndABadOneFailsTheJobNamingIt) {
  testing::TempDir dir;
  testing::write_file(dir.file("p.jsonl"),
                      "{\"id\": 1, \"prompt\": \"The cat\", \"max_tokens\": 30, \"guided_choice\": [\"up\", \"down\"]}\n");
  const testing::CliOutput r = testing::run_cli("--prompts " + dir.file("p.jsonl") + " --out " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const Json out = Json::parse(testing::read_file(dir.file("out")));
  EXPECT_THAT((std::vector<std::string>{"up", "down"}), ::testing::Contains(out["text"].get<std::string>()));
  testing::write_file(dir.file("bad.jsonl"),
                      "{\"id\": \"q\", \"prompt\": \"The cat\", \"guided_json\": {\"type\": \"integer\", \"multipleOf\": 3}}\n");
  testing::expect_clean_error(testing::run_cli("--backend cpu --prompts " + dir.file("bad.jsonl")), "multipleOf");
}

}  // namespace
}  // namespace flexh2o
