// JSON Schema grammars against tests/data/grammar/json_schema_cases.json, whose expectations
// make_json_cases.py checked with the `jsonschema` package: each text accepted or rejected as
// listed, and each unsupported or unsatisfiable schema an error naming the keyword.
#include <gtest/gtest.h>

#include <fstream>

#include "engine/grammar/json_schema.h"
#include "tests/grammar/grammar_test_util.h"

namespace flexh2o::grammar {
namespace {

using Json = nlohmann::ordered_json;

Json load_cases() {
  std::ifstream in(std::string(FLEXH2O_TEST_DATA_DIR) + "/grammar/json_schema_cases.json");
  return Json::parse(in);
}

TEST(JsonSchema, AcceptsAndRejectsTheFixtureTexts) {
  const Json cases = load_cases();
  ASSERT_GE(cases["cases"].size(), 30u);
  for (const Json& c : cases["cases"]) {
    const Grammar g = json_schema_grammar(c["schema"]);
    for (const Json& t : c["texts"]) {
      const std::string text = t["text"].get<std::string>();
      EXPECT_EQ(testing::accepts(g, text), t["accept"].get<bool>()) << c["name"] << ": " << text;
      if (t["accept"].get<bool>()) {
        EXPECT_TRUE(t["valid"].get<bool>()) << c["name"] << ": " << text;
      }
    }
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  const Json cases = load_cases();
  for (const Json& c : cases["errors"]) {
    try {
      json_schema_grammar(c["schema"]);
      ADD_FAILURE() << c["name"] << " compiled";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(c["message"].get<std::string>()), std::string::npos)
          << c["name"] << ": " << e.what();
    }
  }
}

TEST(JsonSchema, ErrorsNameTheSchemaLocation) {
  try {
    json_schema_grammar(Json::parse(R"({"type":"object","properties":{"a":{"type":"array","items":{"not":{}}}}})"));
    FAIL() << "compiled";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("at '/properties/a/items'"), std::string::npos) << e.what();
  }
}

TEST(JsonSchema, DeepNestingAndCyclesAreErrors) {
  Json deep = Json::object();
  for (int i = 0; i < 200; ++i) deep = Json{{"type", "array"}, {"items", deep}};
  EXPECT_THROW(json_schema_grammar(deep), std::invalid_argument);
  try {
    json_schema_grammar(Json::parse(R"({"allOf":[{"$ref":"#"}]})"));
    FAIL() << "compiled";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nests deeper than 128"), std::string::npos) << e.what();
  }
}

TEST(JsonSchema, CompactWhitespaceOption) {
  const Grammar g = json_schema_grammar(Json::parse(R"({"type":"array","items":{"type":"integer"}})"),
                                        JsonOptions{.max_whitespace = 0});
  EXPECT_TRUE(testing::accepts(g, "[1,2]"));
  EXPECT_FALSE(testing::accepts(g, "[1, 2]"));
  const Grammar limited = json_schema_grammar(Json::parse(R"({"type":"array"})"), JsonOptions{.max_whitespace = 3});
  EXPECT_TRUE(testing::accepts(limited, "[   1]"));
  EXPECT_FALSE(testing::accepts(limited, "[    1]"));
}

// The error message of compiling `schema`; "" when it compiles.
std::string schema_error(const char* schema) {
  try {
    json_schema_grammar(Json::parse(schema));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// JSON Schema validates an instance against const/enum and every other keyword beside them:
// enum values the others refuse are left out, and a const they refuse is an error.
TEST(JsonSchema, ConstAndEnumValuesMustSatisfyTheOtherKeywords) {
  EXPECT_NE(schema_error(R"({"type":"integer","const":"a"})").find("'const' does not satisfy the schema's other keywords (type)"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"const":3,"minimum":5})").find("(minimum)"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"string","enum":["abcdef"],"maxLength":2})").find("'enum' has no value"),
            std::string::npos);
  const Grammar short_only = json_schema_grammar(Json::parse(R"({"type":"string","enum":["abcdef","xy"],"maxLength":2})"));
  EXPECT_TRUE(testing::accepts(short_only, "\"xy\""));
  EXPECT_FALSE(testing::accepts(short_only, "\"abcdef\""));
  // maxLength says nothing about numbers; nullable adds null to the type.
  const Grammar mixed = json_schema_grammar(Json::parse(R"({"enum":["abc",5,"x"],"maxLength":2})"));
  EXPECT_TRUE(testing::accepts(mixed, "5"));
  EXPECT_TRUE(testing::accepts(mixed, "\"x\""));
  EXPECT_FALSE(testing::accepts(mixed, "\"abc\""));
  const Grammar nullable = json_schema_grammar(Json::parse(R"({"type":"string","nullable":true,"enum":["a",null,1]})"));
  EXPECT_TRUE(testing::accepts(nullable, "null"));
  EXPECT_FALSE(testing::accepts(nullable, "1"));
  const Grammar constant = json_schema_grammar(Json::parse(R"({"type":"object","properties":{"k":{"type":"integer"}},"const":{"k":2}})"));
  EXPECT_TRUE(testing::accepts(constant, R"({"k":2})"));
}

// An enum's values are an alternative each: past 30000 values or 1 MiB of text, an error
// before the grammar is built; up to them, it compiles (within Automaton::kMaxClosure).
TEST(JsonSchema, EnumsBeyondTheBoundsAreErrors) {
  Json many = {{"enum", Json::array()}};
  for (int i = 0; i < 30000; ++i) many["enum"].push_back(i);
  EXPECT_TRUE(testing::accepts(json_schema_grammar(many), "29999"));
  many["enum"].push_back(30000);
  EXPECT_NE(schema_error(many.dump().c_str()).find("'enum' has 30001 values, more than 30000"), std::string::npos);
  Json long_values = {{"enum", Json::array()}};
  for (int i = 0; i < 20; ++i) long_values["enum"].push_back(std::string(60000, static_cast<char>('a' + i)));
  EXPECT_NE(schema_error(long_values.dump().c_str()).find("more than 1048576 bytes"), std::string::npos);
}

TEST(JsonObject, AcceptsAnyObjectOnly) {
  const Grammar g = json_object_grammar();
  for (const char* text : {"{}", R"({"a":[1,2.5e3,"x",{"b":null}],"c":true})", "{\n  \"k\": \"\\u00e9\"\n}"})
    EXPECT_TRUE(testing::accepts(g, text)) << text;
  for (const char* text : {"[]", "1", R"({"a":})", R"({"a":1,})", "{'a':1}"}) EXPECT_FALSE(testing::accepts(g, text)) << text;
}

}  // namespace
}  // namespace flexh2o::grammar
