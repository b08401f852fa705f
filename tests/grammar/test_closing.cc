// Closing within max_tokens (docs/structured-output.md): the automaton's distance (the fewest
// bytes that complete an output) against a breadth-first search over bytes, at states random
// walks reach; and walks under a token limit: every mask is the plain mask less the tokens after
// which the output could not be completed in the tokens left, and every walk ends complete (and
// valid under its schema) by its limit.
#include <gtest/gtest.h>

#include <deque>
#include <fstream>
#include <random>
#include <unordered_map>

#include "engine/grammar/constraint.h"
#include "tests/grammar/grammar_test_util.h"
#include "tests/grammar/json_validator.h"

namespace flexh2o::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kSearchLimit = 48;

// The fewest bytes from `state` to a state where the input may end, by a breadth-first search
// over the 256 byte values; -1 when there is none within kSearchLimit.
int searched_distance(const CompiledGrammar& g, std::int32_t state) {
  std::unordered_map<std::int32_t, int> depth = {{state, 0}};
  std::deque<std::int32_t> queue = {state};
  while (!queue.empty()) {
    const std::int32_t s = queue.front();
    queue.pop_front();
    const int d = depth[s];
    if (g.accepts(s)) return d;
    if (d == kSearchLimit) continue;
    for (int b = 0; b < 256; ++b) {
      const std::int32_t next = g.advance(s, std::string(1, static_cast<char>(b)));
      if (next != Automaton::kDead && depth.emplace(next, d + 1).second) queue.push_back(next);
    }
  }
  return -1;
}

struct Case {
  std::string name;
  std::shared_ptr<const CompiledGrammar> grammar;
  Json schema;  // null: not a JSON schema
};

// Every schema of the fixture cases, and a regex, a GBNF grammar, choices and any JSON object.
std::vector<Case> all_cases(ConstraintCache& cache) {
  std::ifstream in(std::string(FLEXH2O_TEST_DATA_DIR) + "/grammar/json_schema_cases.json");
  const Json fixture = Json::parse(in);
  std::vector<Case> out;
  for (const Json& c : fixture["cases"])
    out.push_back({c["name"], cache.get({.kind = Constraint::Kind::JsonSchema, .text = c["schema"].dump()}), c["schema"]});
  out.push_back({"regex", cache.get({.kind = Constraint::Kind::Regex, .text = "(ab|x)+[0-9]{2,4}(\xc3\xa9|-)?"}), nullptr});
  out.push_back({"gbnf",
                 cache.get({.kind = Constraint::Kind::Grammar,
                            .text = "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [a-b]+ | root"}),
                 nullptr});
  out.push_back({"choice", cache.get({.kind = Constraint::Kind::Choice, .choices = {"name", "nam", "\xc3\xa9t\xc3\xa9"}}),
                 nullptr});
  out.push_back({"json_object", cache.get({.kind = Constraint::Kind::JsonObject}), nullptr});
  return out;
}

std::vector<std::int32_t> allowed_tokens(std::span<const std::uint64_t> mask, std::size_t vocab_size) {
  std::vector<std::int32_t> out;
  for (std::size_t t = 0; t < vocab_size; ++t)
    if (mask_allows(mask, static_cast<std::int32_t>(t))) out.push_back(static_cast<std::int32_t>(t));
  return out;
}

// What closing allows with `tokens_left`, token by token: a stop token where the output may end,
// another when its bytes lead to a state at most tokens_left - 1 bytes from an end.
std::vector<std::uint64_t> expected_closing_mask(const CompiledGrammar& g, std::int32_t state, std::int64_t tokens_left) {
  const Vocabulary& v = g.trie().vocabulary();
  std::vector<std::uint64_t> mask(mask_words(v.token_bytes.size()), 0);
  for (std::size_t t = 0; t < v.token_bytes.size(); ++t) {
    const bool stop = std::find(v.stop_tokens.begin(), v.stop_tokens.end(), static_cast<std::int32_t>(t)) != v.stop_tokens.end();
    bool allowed = stop && g.accepts(state);
    if (!stop && !v.token_bytes[t].empty()) {
      const std::int32_t after = g.advance(state, v.token_bytes[t]);
      allowed = after != Automaton::kDead && g.distance(after) <= tokens_left - 1;
    }
    if (allowed) mask[t >> 6] |= std::uint64_t{1} << (t & 63);
  }
  return mask;
}

TEST(Closing, DistanceIsTheShortestCompletion) {
  std::mt19937 rng(7);
  ConstraintCache cache(std::make_shared<const TokenTrie>(testing::random_vocabulary(rng, 300)));
  int states_checked = 0;
  for (const Case& c : all_cases(cache)) {
    SCOPED_TRACE(c.name);
    const CompiledGrammar& g = *c.grammar;
    const std::size_t vocab = g.trie().vocab_size();
    std::vector<std::uint64_t> mask(mask_words(vocab));
    for (int w = 0; w < 4; ++w) {
      Matcher m(c.grammar);
      std::int32_t state = g.initial_state();
      for (int step = 0; step < 30 && state != Automaton::kDead; ++step, ++states_checked) {
        const int searched = searched_distance(g, state);
        if (searched >= 0) EXPECT_EQ(g.distance(state), searched) << "step " << step;
        else EXPECT_GT(g.distance(state), kSearchLimit) << "step " << step;
        EXPECT_EQ(m.distance(), g.distance(state));
        m.fill_mask(mask);
        std::vector<std::int32_t> allowed = allowed_tokens(mask, vocab);
        std::erase(allowed, g.trie().vocabulary().stop_tokens[0]);
        if (allowed.empty()) break;
        const std::int32_t token = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(token));
        state = g.advance(state, g.trie().vocabulary().token_bytes[static_cast<std::size_t>(token)]);
      }
    }
  }
  EXPECT_GT(states_checked, 1000);
}

TEST(Closing, WalksUnderATokenLimitEndCompleteAndValid) {
  std::mt19937 rng(11);
  ConstraintCache cache(std::make_shared<const TokenTrie>(testing::random_vocabulary(rng, 600)));
  int walks = 0, narrowed = 0;
  for (const Case& c : all_cases(cache)) {
    SCOPED_TRACE(c.name);
    const CompiledGrammar& g = *c.grammar;
    const Vocabulary& v = g.trie().vocabulary();
    std::vector<std::uint64_t> mask(mask_words(v.token_bytes.size())), plain(mask.size());
    for (int w = 0; w < 6; ++w, ++walks) {
      const std::int64_t limit = g.distance(g.initial_state()) + static_cast<std::int64_t>(rng() % 24);
      Matcher m(c.grammar);
      std::int32_t state = g.initial_state();
      std::string text;
      for (std::int64_t step = 0; step < limit && !m.is_finished(); ++step) {
        const std::int64_t tokens_left = limit - step;
        m.fill_mask(mask, tokens_left);
        ASSERT_EQ(mask, expected_closing_mask(g, state, tokens_left)) << "after '" << text << "', " << tokens_left << " left";
        m.fill_mask(plain);
        narrowed += mask != plain;
        EXPECT_EQ(m.limit_narrows(tokens_left), mask != plain) << "after '" << text << "'";
        const std::vector<std::int32_t> allowed = allowed_tokens(mask, v.token_bytes.size());
        ASSERT_FALSE(allowed.empty()) << "after '" << text << "'";
        std::int32_t token = allowed[rng() % allowed.size()];
        if (m.is_complete() && rng() % 4 == 0) token = v.stop_tokens[0];
        ASSERT_TRUE(m.accept_token(token));
        if (token == v.stop_tokens[0]) break;
        text += v.token_bytes[static_cast<std::size_t>(token)];
        state = g.advance(state, v.token_bytes[static_cast<std::size_t>(token)]);
      }
      ASSERT_EQ(m.distance(), 0) << "a walk of " << limit << " tokens ended incomplete: '" << text << "'";
      if (!c.schema.is_null()) {
        const Json instance = Json::parse(text);  // throws (fails the test) if not JSON
        EXPECT_EQ(testing::schema_violation(instance, c.schema, c.schema), "") << text;
      }
    }
  }
  EXPECT_GT(narrowed, walks) << "the limits should narrow masks in most walks";
}

// A vocabulary without single bytes for some of the grammar's bytes: where no token can close
// the output in time, the tokens that leave the fewest bytes are allowed (never an empty mask).
TEST(Closing, WithoutSingleByteTokensTheNearestTokensAreAllowed) {
  Vocabulary v;
  v.token_bytes = {"ab", "a", "abc", "x", "d", ""};
  v.stop_tokens = {5};
  ConstraintCache cache(std::make_shared<const TokenTrie>(std::move(v)));
  Matcher m(cache.get({.kind = Constraint::Kind::Regex, .text = "abcd"}));
  std::vector<std::uint64_t> mask(1);
  m.fill_mask(mask, 1);
  EXPECT_EQ(mask[0], 0b100u) << "'abc' leaves 1 byte, 'ab' 2, 'a' 3: only 'abc'";
  m.fill_mask(mask, 3);
  EXPECT_EQ(mask[0], 0b101u) << "3 tokens left: 'ab' and 'abc' close in time one byte a token, 'a' does not";
  m.fill_mask(mask, 4);
  EXPECT_EQ(mask[0], 0b111u);
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], 0b111u);
  ASSERT_TRUE(m.accept_token(2));
  m.fill_mask(mask, 1);
  EXPECT_EQ(mask[0], 0b10000u);
}

// Whether a constraint can close within a request's max_tokens at all (JobConstraints::get
// refuses the request when not): with the single bytes only, `{}` takes 2 tokens; a `{}` token
// or a whole choice as one token closes in 1. Searched over tokens, not only by the distance.
TEST(Closing, WhetherAnOutputFitsInTheTokensIsKnownBeforeDecoding) {
  const auto compiled = [](std::vector<std::string> extra, const Constraint& c) {
    Vocabulary v;
    for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, static_cast<char>(b)));
    v.token_bytes.insert(v.token_bytes.end(), extra.begin(), extra.end());
    v.token_bytes.push_back("");
    v.stop_tokens = {static_cast<std::int32_t>(v.token_bytes.size() - 1)};
    return ConstraintCache(std::make_shared<const TokenTrie>(std::move(v))).get(c);
  };
  const Constraint object{.kind = Constraint::Kind::JsonObject};
  EXPECT_FALSE(compiled({}, object)->closes_within(1));
  EXPECT_TRUE(compiled({}, object)->closes_within(2));
  EXPECT_TRUE(compiled({"{}"}, object)->closes_within(1));
  const Constraint choice{.kind = Constraint::Kind::Choice, .choices = {"positive", "negative"}};
  EXPECT_FALSE(compiled({"pos", "itive"}, choice)->closes_within(1));
  EXPECT_TRUE(compiled({"pos", "itive"}, choice)->closes_within(2));
  EXPECT_FALSE(compiled({"pos", "itive"}, choice)->closes_within(0));
  EXPECT_TRUE(compiled({"negative"}, choice)->closes_within(1));
}

}  // namespace
}  // namespace flexh2o::grammar
