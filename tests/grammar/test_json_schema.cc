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

TEST(JsonObject, AcceptsAnyObjectOnly) {
  const Grammar g = json_object_grammar();
  for (const char* text : {"{}", R"({"a":[1,2.5e3,"x",{"b":null}],"c":true})", "{\n  \"k\": \"\\u00e9\"\n}"})
    EXPECT_TRUE(testing::accepts(g, text)) << text;
  for (const char* text : {"[]", "1", R"({"a":})", R"({"a":1,})", "{'a':1}"}) EXPECT_FALSE(testing::accepts(g, text)) << text;
}

}  // namespace
}  // namespace flexh2o::grammar
