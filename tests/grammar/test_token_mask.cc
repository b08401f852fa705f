// Token masks against brute force, at states reached by random walks over allowed tokens: a
// token is allowed iff the automaton accepts all its bytes from the state (a stop token iff
// the output is complete). The walks' finished texts must be valid under their schema
// (json_validator.h); with FLEXH2O_GRAMMAR_WALKS=FILE they are also written for
// make_json_cases.py --check-walks (the jsonschema package, formats included).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include "engine/grammar/constraint.h"
#include "engine/grammar/mask_prefetcher.h"
#include "tests/grammar/grammar_test_util.h"
#include "tests/grammar/json_validator.h"

namespace flexh2o::grammar {
namespace {

using Json = nlohmann::ordered_json;
using testing::random_vocabulary;

std::vector<std::uint64_t> brute_force_mask(const CompiledGrammar& g, std::int32_t state) {
  const Vocabulary& v = g.trie().vocabulary();
  std::vector<std::uint64_t> mask(mask_words(v.token_bytes.size()), 0);
  for (std::size_t t = 0; t < v.token_bytes.size(); ++t) {
    const bool stop = std::find(v.stop_tokens.begin(), v.stop_tokens.end(), static_cast<std::int32_t>(t)) != v.stop_tokens.end();
    const bool allowed = stop ? g.accepts(state)
                              : !v.token_bytes[t].empty() && g.advance(state, v.token_bytes[t]) != Automaton::kDead;
    if (allowed) mask[t >> 6] |= std::uint64_t{1} << (t & 63);
  }
  return mask;
}

struct Walk {
  std::string text;
  bool finished = false;
};

// Picks allowed tokens at random (the stop token half the time it is allowed), checking every
// mask against brute force on the way.
Walk random_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng, int max_steps) {
  const Vocabulary& v = g->trie().vocabulary();
  Matcher matcher(g);
  std::int32_t state = g->initial_state();
  Walk walk;
  std::vector<std::uint64_t> mask(mask_words(v.token_bytes.size()));
  for (int step = 0; step < max_steps; ++step) {
    matcher.fill_mask(mask);
    EXPECT_EQ(mask, brute_force_mask(*g, state)) << "after '" << walk.text << "'";
    std::vector<std::int32_t> allowed;
    for (std::size_t t = 0; t < v.token_bytes.size(); ++t)
      if (mask_allows(mask, static_cast<std::int32_t>(t))) allowed.push_back(static_cast<std::int32_t>(t));
    if (allowed.empty()) return walk;
    std::int32_t token = allowed[rng() % allowed.size()];
    if (matcher.is_complete() && rng() % 2 == 0) token = v.stop_tokens[0];
    EXPECT_TRUE(matcher.accept_token(token));
    if (token == v.stop_tokens[0]) {
      walk.finished = true;
      return walk;
    }
    walk.text += v.token_bytes[static_cast<std::size_t>(token)];
    state = g->advance(state, v.token_bytes[static_cast<std::size_t>(token)]);
  }
  return walk;
}

TEST(TokenMask, EqualsBruteForceAndWalksValidate) {
  std::mt19937 rng(2024);
  auto trie = std::make_shared<const TokenTrie>(random_vocabulary(rng, 600));
  ConstraintCache cache(trie);
  std::ifstream in(std::string(FLEXH2O_TEST_DATA_DIR) + "/grammar/json_schema_cases.json");
  const Json cases = Json::parse(in);
  const char* walks_path = std::getenv("FLEXH2O_GRAMMAR_WALKS");
  std::ofstream walks_out;
  if (walks_path != nullptr) walks_out.open(walks_path);
  int finished = 0, walks = 0;
  for (const Json& c : cases["cases"]) {
    const auto g = cache.get({.kind = Constraint::Kind::JsonSchema, .text = c["schema"].dump()});
    for (int w = 0; w < 6; ++w, ++walks) {
      const Walk walk = random_walk(g, rng, 60);
      if (!walk.finished) continue;
      ++finished;
      const Json instance = Json::parse(walk.text);  // throws (fails the test) if not JSON
      EXPECT_EQ(testing::schema_violation(instance, c["schema"], c["schema"]), "") << c["name"] << ": " << walk.text;
      if (walks_out) walks_out << Json{{"case", c["name"]}, {"text", walk.text}}.dump() << "\n";
    }
  }
  EXPECT_GT(finished, walks / 2) << "too few walks finished to check the outputs";
}

TEST(TokenMask, RegexGrammarAndChoiceWalksMatch) {
  std::mt19937 rng(99);
  auto trie = std::make_shared<const TokenTrie>(random_vocabulary(rng, 400));
  ConstraintCache cache(trie);
  const auto regex = cache.get({.kind = Constraint::Kind::Regex, .text = "(ab|x)+[0-9]{2,4}(\xc3\xa9|-)?"});
  const std::regex reference("(ab|x)+[0-9]{2,4}(\xc3\xa9|-)?");
  const auto gbnf = cache.get({.kind = Constraint::Kind::Grammar, .text = "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [a-b]+ | root"});
  const auto choice = cache.get({.kind = Constraint::Kind::Choice, .choices = {"name", "nam", "age", "\xc3\xa9t\xc3\xa9"}});
  for (int w = 0; w < 20; ++w) {
    const Walk r = random_walk(regex, rng, 40);
    if (r.finished) {
      EXPECT_TRUE(std::regex_match(r.text, reference)) << r.text;
    }
    const Walk c = random_walk(choice, rng, 10);
    EXPECT_TRUE(c.finished);
    EXPECT_TRUE(c.text == "name" || c.text == "nam" || c.text == "age" || c.text == "\xc3\xa9t\xc3\xa9") << c.text;
    random_walk(gbnf, rng, 40);
  }
  const auto object = cache.get({.kind = Constraint::Kind::JsonObject});
  for (int w = 0; w < 20; ++w) {
    const Walk o = random_walk(object, rng, 60);
    if (o.finished) {
      EXPECT_TRUE(Json::parse(o.text).is_object()) << o.text;
    }
  }
}

TEST(TokenMask, CacheCompilesEachDistinctConstraintOnce) {
  std::mt19937 rng(5);
  ConstraintCache cache(std::make_shared<const TokenTrie>(random_vocabulary(rng, 10)));
  const auto a = cache.get({.kind = Constraint::Kind::JsonSchema, .text = R"({"type": "integer"})"});
  const auto b = cache.get({.kind = Constraint::Kind::JsonSchema, .text = R"({"type":"integer"})"});
  const auto c = cache.get({.kind = Constraint::Kind::Regex, .text = R"({"type":"integer"})"});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(cache.size(), 2u);
  // Schema texts are untrusted: too deep or not JSON is an error, not a stack overflow.
  EXPECT_THROW(cache.get({.kind = Constraint::Kind::JsonSchema, .text = std::string(100000, '[')}), std::invalid_argument);
  EXPECT_THROW(cache.get({.kind = Constraint::Kind::JsonSchema, .text = "{\"type\":"}), std::invalid_argument);
  // One compile time per distinct constraint compiled; failures are not counted.
  const std::vector<double> seconds = cache.compile_seconds();
  ASSERT_EQ(seconds.size(), 2u);
  for (const double s : seconds) EXPECT_GE(s, 0.0);
}

TEST(TokenMask, StopOnlyWhereComplete) {
  std::mt19937 rng(3);
  auto trie = std::make_shared<const TokenTrie>(random_vocabulary(rng, 10));
  ConstraintCache cache(trie);
  Matcher m(cache.get({.kind = Constraint::Kind::Choice, .choices = {"ab"}}));
  const std::int32_t stop = trie->vocabulary().stop_tokens[0];
  EXPECT_FALSE(m.accept_token(stop));
  EXPECT_TRUE(m.accept_token('a'));
  EXPECT_FALSE(m.accept_token('a'));
  EXPECT_FALSE(m.is_complete());
  EXPECT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.is_complete());
  EXPECT_TRUE(m.is_finished());  // nothing can follow "ab"
  EXPECT_FALSE(m.accept_token(stop - 1));  // the control token
  EXPECT_TRUE(m.accept_token(stop));
  std::vector<std::uint64_t> mask(mask_words(trie->vocab_size()));
  m.fill_mask(mask);
  EXPECT_TRUE(std::all_of(mask.begin(), mask.end(), [](std::uint64_t w) { return w == 0; }));
}

TEST(TokenMask, StopTokenWithBytesIsNeverText) {
  Vocabulary v;
  v.token_bytes = {"a", "b", "</s>"};
  v.stop_tokens = {2};
  ConstraintCache cache(std::make_shared<const TokenTrie>(std::move(v)));
  Matcher m(cache.get({.kind = Constraint::Kind::Regex, .text = "a(</s>)?"}));
  std::vector<std::uint64_t> mask(1);
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], 0b001u);
  ASSERT_TRUE(m.accept_token(0));
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], 0b100u);  // allowed as the stop it is (the output is complete)
  EXPECT_TRUE(m.accept_token(2));
  EXPECT_FALSE(m.accept_bytes("</s>"));  // stopped
}

// Masks computed ahead on the prefetcher's worker, while the sampling side asks for the same
// states' masks (under a limit too), are the masks a constraint compiled apart gives.
TEST(TokenMask, MasksPreparedAheadAreTheSame) {
  std::mt19937 rng(31);
  auto trie = std::make_shared<const TokenTrie>(random_vocabulary(rng, 400));
  ConstraintCache ahead_cache(trie), plain_cache(trie);
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"integer"}}},"required":["name","tags"]})";
  const Constraint c{.kind = Constraint::Kind::JsonSchema, .text = schema};
  const auto ahead_grammar = ahead_cache.get(c);
  MaskPrefetcher ahead;
  std::uint64_t queued = 0;
  std::vector<std::uint64_t> got(mask_words(trie->vocab_size())), want(got.size());
  for (int w = 0; w < 20; ++w) {
    Matcher m(ahead_grammar), reference(plain_cache.get(c));
    const std::int64_t limit = 10 + static_cast<std::int64_t>(rng() % 40);
    for (std::int64_t step = 0; step < limit && !m.is_finished(); ++step) {
      ahead.prepare(m.shared_grammar(), m.state(), limit - step);
      ++queued;
      m.fill_mask(got, limit - step);
      reference.fill_mask(want, limit - step);
      ASSERT_EQ(got, want) << "walk " << w << ", step " << step;
      std::vector<std::int32_t> allowed;
      for (std::size_t t = 0; t < trie->vocab_size(); ++t)
        if (mask_allows(got, static_cast<std::int32_t>(t))) allowed.push_back(static_cast<std::int32_t>(t));
      const std::int32_t token = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(token));
      ASSERT_TRUE(reference.accept_token(token));
      if (m.is_finished()) break;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ahead.prepared() < queued && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(ahead.prepared(), queued) << "the worker finishes every task queued";
}

}  // namespace
}  // namespace flexh2o::grammar
