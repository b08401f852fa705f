// Regexes (whole match and search), GBNF grammars and choices: texts that must be accepted or
// rejected, and the errors for what is not supported.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "engine/grammar/constraint.h"
#include "engine/grammar/gbnf.h"
#include "engine/grammar/regex.h"
#include "tests/grammar/grammar_test_util.h"

namespace flexh2o::grammar {
namespace {

using testing::accepts;

Grammar regex_grammar(std::string_view pattern, RegexAlphabet alphabet = RegexAlphabet::Utf8, bool search = false) {
  GrammarBuilder builder;
  const std::uint32_t root = builder.add_rule("root");
  builder.define(root, regex_expr(pattern, alphabet, search));
  return std::move(builder).build(root);
}

struct RegexCase {
  const char* pattern;
  std::vector<const char*> accept;
  std::vector<const char*> reject;
};

TEST(Regex, AcceptsExactlyItsLanguage) {
  const std::vector<RegexCase> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "abd"}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"(ab)*c", {"c", "abc", "ababc"}, {"ac", "abab"}},
      {"a+b?", {"a", "aa", "ab", "aaab"}, {"", "b", "abb"}},
      {"x{2,3}", {"xx", "xxx"}, {"x", "xxxx"}},
      {"x{2}y{1,}", {"xxy", "xxyyy"}, {"xy", "xx"}},
      {"[a-c0-2_]+", {"a", "c2_b"}, {"d", "3", ""}},
      {"[^a-c]", {"d", "\xc3\xa9", "\n"}, {"a", "b", "\xc3"}},
      {"\\d\\w\\s", {"1a ", "9_\t"}, {"a1 ", "11x"}},
      {"\\D\\W\\S", {"a-x"}, {"1-x", "aax", "a- "}},
      {"(?:a|b)(?P<n>c)", {"ac", "bc"}, {"c"}},
      {".", {"a", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}, {"\n", "ab", "\xe2\x82"}},
      {"\\u00e9\\x41\\.", {"\xc3\xa9" "A."}, {"\xc3\xa9" "Ax"}},
      {"^[0-9]{3}-[0-9]{4}$", {"555-1234"}, {"5555-1234", "555-123"}},
      {"a*?b+?", {"b", "aab"}, {"a"}},
      {"[\\]\\-]", {"]", "-"}, {"\\"}},
      {"\xe2\x82\xac[\xc3\xa0-\xc3\xa9]", {"\xe2\x82\xac\xc3\xa1"}, {"\xe2\x82\xac\xc3\xaa"}},
  };
  for (const RegexCase& c : cases) {
    const Grammar g = regex_grammar(c.pattern);
    for (const char* text : c.accept) EXPECT_TRUE(accepts(g, text)) << c.pattern << " on '" << text << "'";
    for (const char* text : c.reject) EXPECT_FALSE(accepts(g, text)) << c.pattern << " on '" << text << "'";
  }
}

// Random ASCII texts against std::regex (ECMAScript), whose whole-match semantics agree with
// Python's on these patterns.
TEST(Regex, AgreesWithStdRegexOnRandomTexts) {
  const std::vector<std::string> patterns = {"(a|ab)(c|bcd)(d*)", "[ab]{1,3}c?", "(a*b|ba)+", "a?b?c?", "(ab|a)(bc|c)?",
                                             "[^b]*b[^b]*", "(aa|b){2,4}"};
  std::mt19937 rng(7);
  for (const std::string& pattern : patterns) {
    const Grammar g = regex_grammar(pattern);
    const std::regex reference(pattern);
    for (int i = 0; i < 300; ++i) {
      std::string text;
      const int length = static_cast<int>(rng() % 7);
      for (int k = 0; k < length; ++k) text += "abcd"[rng() % 4];
      EXPECT_EQ(accepts(g, text), std::regex_match(text, reference)) << pattern << " on '" << text << "'";
    }
  }
}

TEST(Regex, SearchMatchesTextsContainingAMatch) {
  const Grammar unanchored = regex_grammar("ab+", RegexAlphabet::Utf8, true);
  EXPECT_TRUE(accepts(unanchored, "xxabbx"));
  EXPECT_TRUE(accepts(unanchored, "ab"));
  EXPECT_FALSE(accepts(unanchored, "xa"));
  const Grammar start = regex_grammar("^ab", RegexAlphabet::Utf8, true);
  EXPECT_TRUE(accepts(start, "abxx"));
  EXPECT_FALSE(accepts(start, "xab"));
  const Grammar end = regex_grammar("ab$", RegexAlphabet::Utf8, true);
  EXPECT_TRUE(accepts(end, "xxab"));
  EXPECT_FALSE(accepts(end, "abx"));
}

TEST(Regex, JsonStringAlphabetWritesEscapes) {
  const Grammar g = regex_grammar("a\"b\\\\c\\nd[\\x00-\\x02]", RegexAlphabet::JsonString);
  EXPECT_TRUE(accepts(g, "a\\\"b\\\\c\\nd\\u0001"));
  EXPECT_FALSE(accepts(g, "a\"b\\c\nd\x01"));
}

TEST(Regex, UnsupportedConstructsAreErrorsNamingThem) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"a(?=b)", "lookaround"}, {"(a)\\1", "backreference"}, {"\\bword", "word boundary"},
      {"a$b", "'$' before the end"}, {"a^", "'^' after the start"}, {"(ab", "missing ')'"},
      {"[ab", "missing ']'"}, {"*a", "nothing to repeat"}, {"a{3,1}", "max < min"}, {"a++", "possessive"}};
  for (const auto& [pattern, message] : cases) {
    try {
      regex_grammar(pattern);
      ADD_FAILURE() << pattern << " compiled";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << pattern << ": " << e.what();
    }
  }
  EXPECT_THROW(regex_grammar("^a|b", RegexAlphabet::Utf8, true), std::invalid_argument);
  EXPECT_THROW(regex_grammar(std::string(300, '(') + "a" + std::string(300, ')')), std::invalid_argument);
  EXPECT_TRUE(accepts(regex_grammar(std::string(200, '(') + "a" + std::string(200, ')')), "a"));
  EXPECT_THROW(regex_grammar("(a*)*"), std::invalid_argument);  // repeats something empty
}

// The automaton's closure bound (Automaton::kMaxClosure): a short pattern with many optional
// parts open at once is an error when it compiles, before any state is built, whether or not
// the start state reaches them; the same pattern below the bound walks in time linear per byte.
TEST(Regex, ManyOptionalPartsOpenAtOnceAreAnErrorWhenCompiled) {
  const auto error_of = [](const Grammar& g) -> std::string {
    try {
      Automaton automaton(g);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  for (const char* pattern : {"(a?){30000}b", "b(a?){30000}", "((a?){300}){300}b"})
    EXPECT_NE(error_of(regex_grammar(pattern)).find("positions open at once"), std::string::npos) << pattern;
  EXPECT_NE(error_of(parse_gbnf("root ::= x{30000} \"b\"\nx ::= \"a\"?")).find("positions open at once"),
            std::string::npos);
  EXPECT_EQ(error_of(regex_grammar("[0-9]{1,20}")), "");
  EXPECT_EQ(error_of(regex_grammar("(ab|c){0,100000}")), "");
  // Below the bound: each byte expands the optional parts once, not once per open stack (which
  // took ~500^3 steps for this walk).
  const Grammar g = regex_grammar("(a?){500}b");
  EXPECT_TRUE(accepts(g, std::string(500, 'a') + "b"));
  EXPECT_TRUE(accepts(g, "b"));
  EXPECT_FALSE(accepts(g, std::string(501, 'a') + "b"));
}

TEST(Gbnf, ParsesRulesAndAcceptsTheirLanguage) {
  const Grammar g = parse_gbnf(R"g(
    # arithmetic
    root   ::= expr
    expr   ::= term ([-+] term)*
    term   ::= factor ("*" factor)*
    factor ::= [0-9]+ | "(" expr ")"
  )g");
  for (const char* text : {"1", "1+2*3", "(1+2)*3", "((7))", "12-3-4"}) EXPECT_TRUE(accepts(g, text)) << text;
  for (const char* text : {"", "1+", "(1", "1**2", "a"}) EXPECT_FALSE(accepts(g, text)) << text;
  const Grammar repeats = parse_gbnf("root ::= \"a\"{2,3} [x-z]? \"\\u00e9\" .");
  EXPECT_TRUE(accepts(repeats, "aax\xc3\xa9q"));
  EXPECT_TRUE(accepts(repeats, "aaa\xc3\xa9\xe2\x82\xac"));
  EXPECT_FALSE(accepts(repeats, "a\xc3\xa9q"));
}

TEST(Gbnf, ErrorsNameTheLine) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"root ::= a", "'a' is used but not defined"},
      {"start ::= \"x\"", "no 'root' rule"},
      {"root ::= \"x\"\nroot ::= \"y\"", "line 2: rule 'root' is defined twice"},
      {"root ::= \"x\n", "unterminated string"},
      {"root ::= root \"x\" | \"y\"", "left-recursive"},
      {"root ::= \"x\" root", "can never complete"},
      {"root := \"x\"", "expected '::='"},
      {"root ::= \"x\" | \"\\q\"", "unknown escape"},
      {"root ::= \"x\"\n  | \"\\uD800\"", "line 2: escape '\\uD800' at column 6 is a UTF-16 surrogate"},
      {"root ::= \"\\udfff\"", "line 1: escape '\\udfff' at column 11 is a UTF-16 surrogate"},
      {"root ::= \"\\U00110000\"", "escape '\\U00110000' at column 11 is above U+10FFFF"},
      {"root ::= \"\\UFFFFFFFF\"", "above U+10FFFF"}};
  for (const auto& [text, message] : cases) {
    try {
      parse_gbnf(text);
      ADD_FAILURE() << text << " parsed";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << text << ": " << e.what();
    }
  }
}

TEST(Choice, AcceptsExactlyTheChoices) {
  const Grammar g = constraint_grammar({.kind = Constraint::Kind::Choice, .choices = {"yes", "no", "not sure"}});
  for (const char* text : {"yes", "no", "not sure"}) EXPECT_TRUE(accepts(g, text));
  for (const char* text : {"", "ye", "yess", "not", "No"}) EXPECT_FALSE(accepts(g, text));
  EXPECT_THROW(constraint_grammar({.kind = Constraint::Kind::Choice}), std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o::grammar
