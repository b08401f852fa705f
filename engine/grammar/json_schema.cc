#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/grammar/automaton.h"
#include "engine/grammar/char_set.h"
#include "engine/grammar/json_numbers.h"
#include "engine/grammar/json_strings.h"
#include "engine/grammar/regex.h"

namespace flexh2o::grammar {

namespace {

using Json = nlohmann::ordered_json;

// Keywords that change what is valid and are not implemented: an error, never ignored.
const std::set<std::string> kUnsupported = {
    "not", "if", "then", "else", "propertyNames", "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems",
    "contains", "minContains", "maxContains", "multipleOf", "$dynamicRef", "$recursiveRef", "$anchor",
    "$dynamicAnchor"};
// Keywords this compiler reads; every other keyword (title, description, default, ...) has no
// effect on validity and is ignored.
const std::set<std::string> kValidation = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "nullable",
    "patternProperties", "minProperties"};
const std::set<std::string> kTypes = {"null", "boolean", "integer", "number", "string", "object", "array"};

bool has_validation(const Json& schema) {
  for (const auto& [key, value] : schema.items())
    if (kValidation.count(key)) return true;
  return false;
}

Json without(Json schema, const std::string& key) {
  schema.erase(key);
  return schema;
}

std::vector<std::string> type_list(const Json& type, const std::string& path) {
  std::vector<std::string> types;
  if (type.is_string()) types.push_back(type.get<std::string>());
  else if (type.is_array())
    for (const Json& t : type) types.push_back(t.is_string() ? t.get<std::string>() : "");
  for (const std::string& t : types)
    if (!kTypes.count(t)) throw std::invalid_argument("json schema at '" + path + "': unknown type '" + t + "'");
  if (types.empty()) throw std::invalid_argument("json schema at '" + path + "': empty 'type'");
  return types;
}

// Whether `pattern` finds a match in `text` (re.search), on the grammar's own regex reading.
bool pattern_finds(const std::string& pattern, const std::string& text) {
  GrammarBuilder builder;
  const std::uint32_t root = builder.add_rule("pattern");
  builder.define(root, regex_expr(pattern, RegexAlphabet::Utf8, true));
  Automaton automaton(std::move(builder).build(root));
  std::int32_t state = automaton.initial();
  for (const char c : text) {
    state = automaton.next(state, static_cast<std::uint8_t>(c));
    if (state == Automaton::kDead) return false;
  }
  return automaton.accepts(state);
}

bool value_has_type(const Json& value, const std::string& type) {
  if (type == "null") return value.is_null();
  if (type == "boolean") return value.is_boolean();
  if (type == "string") return value.is_string();
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "number") return value.is_number();
  return value.is_number_integer() || (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
}

// `enum` and `const` values are written as text, an alternative each: past these the grammar
// would take more memory than any output needs (about 80 bytes of expression per byte of text
// while compiling), and the start state would hold more open positions (one per value) than a
// closure may expand (Automaton::kMaxClosure).
constexpr std::size_t kMaxEnumValues = 30000;  // below Automaton::kMaxClosure
constexpr std::size_t kMaxEnumBytes = std::size_t{1} << 20;

// Whether a const/enum value satisfies the schema's other keywords: by its type where those are
// only `type` / `nullable`, else by whether the grammar they compile to takes its compact text.
struct ValueCheck {
  std::vector<std::string> types;     // empty: any type
  std::optional<Automaton> automaton;  // set: the other keywords' grammar

  bool operator()(const Json& value, const std::string& text) {
    const auto has_type = [&](const std::string& t) { return value_has_type(value, t); };
    if (!automaton) return types.empty() || std::any_of(types.begin(), types.end(), has_type);
    std::int32_t state = automaton->initial();
    for (std::size_t i = 0; i < text.size() && state != Automaton::kDead; ++i)
      state = automaton->next(state, static_cast<std::uint8_t>(text[i]));
    return state != Automaton::kDead && automaton->accepts(state);
  }
};

std::string validation_keywords(const Json& schema) {
  std::string names;
  for (const auto& [key, value] : schema.items())
    if (kValidation.count(key)) names += (names.empty() ? "" : ", ") + key;
  return names;
}

class JsonSchemaCompiler {
 public:
  JsonSchemaCompiler(const Json& root, const JsonOptions& options)
      : root_(root), options_(options), strings_(builder_, options.max_whitespace) {}

  Grammar schema_grammar() { return value_grammar(root_, ""); }

  // The grammar of `schema` (at `path`), its $refs resolved in the root schema.
  Grammar value_grammar(const Json& schema, const std::string& path) {
    const std::uint32_t root = builder_.add_rule("root");
    builder_.define(root, schema_expr(schema, path));
    while (!pending_.empty()) {
      const auto [ref, rule] = pending_.back();
      pending_.pop_back();
      builder_.define(rule, schema_expr(resolve(ref, ref), ref.substr(1)));
    }
    return std::move(builder_).build(root);
  }

  Grammar object_grammar() {
    const std::uint32_t root = builder_.add_rule("root");
    builder_.define(root, strings_.any_object());
    return std::move(builder_).build(root);
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw std::invalid_argument("json schema at '" + (path.empty() ? "/" : path) + "': " + what);
  }

  Expr as_rule(const std::string& name, Expr body) {
    const std::uint32_t rule = builder_.add_rule(name);
    builder_.define(rule, body);
    return rule_expr(rule);
  }

  const Json& resolve(const std::string& ref, const std::string& path);
  Expr ref_expr(const std::string& ref, const std::string& path);
  Json inline_ref(const Json& schema, const std::string& path);
  Json merge(Json into, const Json& other, const std::string& path);
  Expr schema_expr(const Json& schema, const std::string& path);
  Expr combined_expr(const Json& schema, const std::string& path);
  Expr value_literals(const Json& schema, const std::string& path);
  ValueCheck sibling_check(const Json& siblings, const std::string& path);
  Expr typed_expr(const Json& schema, const std::string& type, const std::string& path);
  std::vector<std::string> types_of(const Json& schema, const std::string& path);
  Expr number_expr(const Json& schema, bool integer, const std::string& path);
  Expr object_expr(const Json& schema, const std::string& path);
  std::optional<Expr> extra_member(const Json& schema, Json& properties, const std::string& path);
  Expr array_expr(const Json& schema, const std::string& path);

  const Json& root_;
  JsonOptions options_;
  GrammarBuilder builder_;
  JsonStrings strings_;
  std::map<std::string, std::uint32_t> ref_rules_;
  std::vector<std::pair<std::string, std::uint32_t>> pending_;
  int nesting_ = 0;  // schema_expr calls in progress
};

// A JSON pointer into the document ("#", "#/$defs/a", "#/properties/x/items").
const Json& JsonSchemaCompiler::resolve(const std::string& ref, const std::string& path) {
  if (ref.empty() || ref[0] != '#') fail(path, "$ref '" + ref + "' is not a local reference ('#...')");
  const Json* at = &root_;
  std::size_t start = 1;
  while (start < ref.size()) {
    if (ref[start] != '/') fail(path, "$ref '" + ref + "' is not a JSON pointer");
    const std::size_t end = std::min(ref.find('/', start + 1), ref.size());
    std::string token;
    for (std::size_t i = start + 1; i < end; ++i) {
      if (ref[i] == '~' && i + 1 < end) token += ref[++i] == '1' ? '/' : '~';
      else if (ref[i] == '%' && i + 2 < end) token += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16)), i += 2;
      else token += ref[i];
    }
    if (at->is_object() && at->contains(token)) at = &(*at)[token];
    else if (at->is_array() && !token.empty() && std::all_of(token.begin(), token.end(), ::isdigit) && std::stoul(token) < at->size()) at = &(*at)[std::stoul(token)];
    else fail(path, "$ref '" + ref + "' points nowhere");
    start = end;
  }
  return *at;
}

Expr JsonSchemaCompiler::ref_expr(const std::string& ref, const std::string& path) {
  resolve(ref, path);
  auto [it, inserted] = ref_rules_.try_emplace(ref, 0);
  if (inserted) {
    it->second = builder_.add_rule(ref.size() > 1 ? ref.substr(1) : "/");
    pending_.emplace_back(ref, it->second);
  }
  return rule_expr(it->second);
}

// The schema with its $ref (one level) replaced by the referenced schema merged in.
Json JsonSchemaCompiler::inline_ref(const Json& schema, const std::string& path) {
  if (!schema.is_object() || !schema.contains("$ref")) return schema;
  if (!schema["$ref"].is_string()) fail(path, "'$ref' is not a string");
  const Json& target = resolve(schema["$ref"].get<std::string>(), path);
  return merge(target.is_boolean() ? Json::object() : target, without(schema, "$ref"), path);
}

// Nesting (and allOf/$ref inlining) deeper than this is an error: it bounds the recursion on
// untrusted schemas and ends cycles such as {"allOf": [{"$ref": "#"}]}.
constexpr int kMaxNesting = 128;

Expr JsonSchemaCompiler::schema_expr(const Json& schema, const std::string& path) {
  if (nesting_ >= kMaxNesting) fail(path, "the schema nests deeper than 128 (or allOf/$ref form a cycle)");
  ++nesting_;
  struct Leave {
    int& nesting;
    ~Leave() { --nesting; }
  } leave{nesting_};
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) fail(path, "schema 'false' matches nothing");
    return strings_.any_value();
  }
  if (!schema.is_object()) fail(path, "a schema must be an object or a boolean");
  for (const auto& [key, value] : schema.items())
    if (kUnsupported.count(key)) fail(path, "keyword '" + key + "' is not supported");
  if (schema.contains("uniqueItems") && schema["uniqueItems"] != false) fail(path, "keyword 'uniqueItems' is not supported");
  if (schema.contains("$ref")) {
    if (!schema["$ref"].is_string()) fail(path, "'$ref' is not a string");
    if (!has_validation(without(schema, "$ref"))) return ref_expr(schema["$ref"].get<std::string>(), path);
    return schema_expr(inline_ref(schema, path), path);
  }
  if (schema.contains("allOf") || schema.contains("anyOf") || schema.contains("oneOf"))
    return combined_expr(schema, path);
  if (schema.contains("const") || schema.contains("enum")) return value_literals(schema, path);
  std::vector<Expr> options;
  for (const std::string& type : types_of(schema, path)) options.push_back(typed_expr(schema, type, path));
  return alt(std::move(options));
}

// const / enum (const first, as it is the stricter): the values that also satisfy the schema's
// other keywords, as JSON Schema validates; a const that does not, or an enum left with none,
// is an error naming the keywords.
Expr JsonSchemaCompiler::value_literals(const Json& schema, const std::string& path) {
  const std::string keyword = schema.contains("const") ? "const" : "enum";
  if (keyword == "enum" && !schema["enum"].is_array()) fail(path, "'enum' is not an array");
  const Json& given = schema[keyword];
  std::vector<const Json*> values;
  if (keyword == "const") {
    values.push_back(&given);
  } else {
    for (const Json& v : given) values.push_back(&v);
  }
  if (values.size() > kMaxEnumValues)
    fail(path, "'enum' has " + std::to_string(values.size()) + " values, more than " + std::to_string(kMaxEnumValues));
  const Json siblings = without(schema, keyword);
  ValueCheck fits = sibling_check(siblings, path);
  std::vector<Expr> kept;
  std::size_t bytes = 0;
  for (const Json* v : values) {
    const std::string text = v->dump();
    if ((bytes += text.size()) > kMaxEnumBytes)
      fail(path, "'" + keyword + "' values take more than " + std::to_string(kMaxEnumBytes) + " bytes written");
    if (fits(*v, text)) kept.push_back(literal(text));
  }
  if (kept.empty())
    fail(path, (keyword == "const" ? "'const' does not satisfy" : "'enum' has no value that satisfies") +
                   std::string(" the schema's other keywords (") + validation_keywords(siblings) + ")");
  return alt(std::move(kept));
}

ValueCheck JsonSchemaCompiler::sibling_check(const Json& siblings, const std::string& path) {
  ValueCheck check;
  if (!has_validation(siblings)) return check;
  if (!has_validation(without(without(siblings, "type"), "nullable"))) {
    check.types = types_of(siblings, path);
    return check;
  }
  Json typed = siblings;  // keywords of one type say nothing about values of the others
  if (!typed.contains("type")) typed["type"] = {"object", "array", "string", "number", "boolean", "null"};
  JsonSchemaCompiler keywords(root_, options_);
  keywords.nesting_ = nesting_;  // a $ref cycle through an enum's siblings still ends
  check.automaton.emplace(keywords.value_grammar(typed, path));
  return check;
}

// allOf: the branches merged into one schema. anyOf/oneOf: one branch, each merged with the
// schema's other keywords (oneOf is read as anyOf: docs/structured-output.md).
Expr JsonSchemaCompiler::combined_expr(const Json& schema, const std::string& path) {
  if (schema.contains("allOf")) {
    if (!schema["allOf"].is_array()) fail(path, "'allOf' is not an array");
    Json merged = without(schema, "allOf");
    for (std::size_t i = 0; i < schema["allOf"].size(); ++i)
      merged = merge(std::move(merged), inline_ref(schema["allOf"][i], path + "/allOf/" + std::to_string(i)), path + "/allOf");
    return schema_expr(merged, path);
  }
  if (schema.contains("anyOf") && schema.contains("oneOf")) fail(path, "'anyOf' together with 'oneOf'");
  const std::string key = schema.contains("anyOf") ? "anyOf" : "oneOf";
  const Json& branches = schema[key];
  if (!branches.is_array() || branches.empty()) fail(path, "'" + key + "' is not a non-empty array");
  const Json siblings = without(schema, key);
  std::vector<Expr> options;
  for (std::size_t i = 0; i < branches.size(); ++i) {
    const std::string branch_path = path + "/" + key + "/" + std::to_string(i);
    if (!has_validation(siblings)) options.push_back(schema_expr(branches[i], branch_path));
    else options.push_back(schema_expr(merge(siblings, inline_ref(branches[i], branch_path), branch_path), branch_path));
  }
  return alt(std::move(options));
}

std::vector<std::string> JsonSchemaCompiler::types_of(const Json& schema, const std::string& path) {
  std::vector<std::string> types;
  if (schema.contains("type")) {
    types = type_list(schema["type"], path);
  } else {
    auto any = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return schema.contains(k); });
    };
    if (any({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (any({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
    if (any({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
    if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
    if (types.empty()) types = {"object", "array", "string", "number", "boolean", "null"};
  }
  if (schema.value("nullable", false) && std::find(types.begin(), types.end(), "null") == types.end()) types.push_back("null");
  return types;
}

Expr JsonSchemaCompiler::typed_expr(const Json& schema, const std::string& type, const std::string& path) {
  if (type == "null") return literal("null");
  if (type == "boolean") return alt({literal("true"), literal("false")});
  if (type == "integer" || type == "number") return number_expr(schema, type == "integer", path);
  if (type == "string") return strings_.string_expr(schema, path);
  if (type == "object") return object_expr(schema, path);
  return array_expr(schema, path);
}

// allOf: `other`'s keywords added to `into`: types intersected, properties and required
// united, bounds tightened; a property that an explicit additionalProperties: false of one
// side does not list is dropped (an error when required).
Json JsonSchemaCompiler::merge(Json into, const Json& other, const std::string& path) {
  if (other.is_boolean()) {
    if (!other.get<bool>()) fail(path, "schema 'false' matches nothing");
    return into;
  }
  if (!other.is_object()) fail(path, "a schema must be an object or a boolean");
  for (const auto& [key, value] : other.items()) {
    if (!kValidation.count(key) && !kUnsupported.count(key)) continue;
    if (!into.contains(key) || into[key] == value) {
      into[key] = value;
    } else if (key == "type") {
      std::vector<std::string> kept;
      for (const std::string& a : type_list(into[key], path))
        for (const std::string& b : type_list(value, path))
          if (a == b || (a == "number" && b == "integer") || (a == "integer" && b == "number"))
            kept.push_back(a == "integer" || b == "integer" ? "integer" : a);
      if (kept.empty()) fail(path, "allOf: the branches share no type");
      into[key] = kept;
    } else if (key == "properties") {
      for (const auto& [name, schema] : value.items())
        into[key][name] = into[key].contains(name) && into[key][name] != schema ? Json{{"allOf", Json::array({into[key][name], schema})}} : schema;
    } else if (key == "required") {
      for (const Json& name : value)
        if (std::find(into[key].begin(), into[key].end(), name) == into[key].end()) into[key].push_back(name);
    } else if (key == "minLength" || key == "minItems" || key == "minProperties" || key == "minimum" ||
               key == "exclusiveMinimum") {
      if (value.is_number() && into[key].is_number()) into[key] = std::max(into[key].get<double>(), value.get<double>());
      else fail(path, "allOf: '" + key + "' in more than one branch");
    } else if (key == "maxLength" || key == "maxItems" || key == "maximum" || key == "exclusiveMaximum") {
      if (value.is_number() && into[key].is_number()) into[key] = std::min(into[key].get<double>(), value.get<double>());
      else fail(path, "allOf: '" + key + "' in more than one branch");
    } else if (key == "additionalProperties") {
      if (value == false || into[key] == false) into[key] = false;
      else if (into[key] == true) into[key] = value;
      else if (value != true) into[key] = Json{{"allOf", Json::array({into[key], value})}};
    } else {
      fail(path, "allOf: '" + key + "' differs between branches");
    }
  }
  for (const Json* side : std::array<const Json*, 2>{&into, &other}) {  // a closed side forbids the other's properties
    if (!side->is_object() || !side->contains("additionalProperties") || (*side)["additionalProperties"] != false) continue;
    const Json listed = side->value("properties", Json::object());
    const Json required = into.value("required", Json::array());
    const Json properties = into.value("properties", Json::object());
    Json kept = Json::object();
    for (const auto& [name, schema] : properties.items()) {
      if (listed.contains(name)) kept[name] = schema;
      else if (std::find(required.begin(), required.end(), Json(name)) != required.end())
        fail(path, "allOf: property '" + name + "' is required but another branch forbids it");
    }
    if (into.contains("properties")) into["properties"] = kept;
  }
  return into;
}

Expr JsonSchemaCompiler::number_expr(const Json& schema, bool integer, const std::string& path) {
  // The tighter of each pair of bounds; a fractional bound rounded inward to an inclusive
  // integer (docs/structured-output.md, "Numbers").
  auto bound = [&](const char* key) -> std::optional<double> {
    if (!schema.contains(key) || schema[key].is_boolean()) return std::nullopt;
    if (!schema[key].is_number()) fail(path, std::string("'") + key + "' is not a number");
    const double v = schema[key].get<double>();
    if (std::abs(v) > 1e18) fail(path, std::string("'") + key + "' beyond 1e18 is not supported");
    return v;
  };
  auto tighter = [&](const char* inclusive, const char* exclusive, bool lower) -> std::optional<NumberBound> {
    std::optional<double> v = bound(inclusive);
    bool open = schema.value(exclusive, Json(false)) == true;  // draft 4: a flag on the bound
    if (auto e = bound(exclusive); e && (!v || (lower ? *e >= *v : *e <= *v))) v = e, open = true;
    if (!v) return std::nullopt;
    const double rounded = lower ? std::ceil(*v) : std::floor(*v);
    if (rounded != *v) return NumberBound{static_cast<std::int64_t>(rounded), false};
    if (integer && open) return NumberBound{static_cast<std::int64_t>(rounded) + (lower ? 1 : -1), false};
    return NumberBound{static_cast<std::int64_t>(rounded), open};
  };
  const std::optional<NumberBound> lo = tighter("minimum", "exclusiveMinimum", true);
  const std::optional<NumberBound> hi = tighter("maximum", "exclusiveMaximum", false);
  try {
    if (integer) return integer_range_expr(lo ? std::optional(lo->value) : std::nullopt, hi ? std::optional(hi->value) : std::nullopt);
    if (!lo && !hi) return any_number_expr();
    return number_range_expr(lo, hi);
  } catch (const std::invalid_argument& e) {
    fail(path, e.what());
  }
}

// The member an object may have besides its listed properties (none: no other), after adding
// to `properties` the required names it does not list and patternProperties' schema to the
// listed names the pattern matches. With patternProperties (one pattern), the other members
// written are those whose names the pattern matches, under its schema (additionalProperties
// does not apply to them), and none when a listed name matches it (a key written with escapes
// could otherwise repeat that name).
std::optional<Expr> JsonSchemaCompiler::extra_member(const Json& schema, Json& properties, const std::string& path) {
  const Json required = schema.value("required", Json::array());
  const Json patterns = schema.value("patternProperties", Json::object());
  if (!properties.is_object()) fail(path, "'properties' is not an object");
  if (!required.is_array()) fail(path, "'required' is not an array");
  if (!patterns.is_object()) fail(path, "'patternProperties' is not an object");
  if (patterns.size() > 1) fail(path, "'patternProperties' with more than one pattern is not supported");
  // Absent additionalProperties: none when properties are listed (docs: "Objects"), any else.
  const Json additional = schema.value("additionalProperties", Json(properties.empty()));
  const std::string pattern = patterns.empty() ? "" : patterns.begin().key();
  auto matches = [&](const std::string& name) {
    try {
      return !patterns.empty() && pattern_finds(pattern, name);
    } catch (const std::invalid_argument& e) {
      fail(path + "/patternProperties", e.what());
    }
  };
  for (auto& [name, s] : properties.items())
    if (s != false && matches(name)) s = Json{{"allOf", Json::array({s, patterns.begin().value()})}};
  // A required property not listed must be there: listed last, under the pattern's schema or
  // additionalProperties.
  for (const Json& name : required) {
    if (!name.is_string()) fail(path, "required property " + name.dump() + " is not a string");
    const std::string key = name.get<std::string>();
    if (properties.contains(key)) continue;
    const Json declared = schema.value("additionalProperties", Json(true));  // JSON Schema's default here
    if (matches(key)) {
      properties[key] = patterns.begin().value();
    } else {
      if (declared == false)
        fail(path, "required property " + name.dump() + " is not in 'properties' and 'additionalProperties' is false");
      properties[key] = declared;
    }
  }
  std::vector<std::string> names;
  for (const auto& [name, s] : properties.items()) names.push_back(name);
  if (!patterns.empty()) {
    if (std::any_of(names.begin(), names.end(), matches)) return std::nullopt;
    const std::string at = path + "/patternProperties/" + pattern;
    Expr key = strings_.string_expr(Json{{"pattern", pattern}}, at);
    return as_rule(at, seq({key, literal(":"), strings_.ws(), schema_expr(patterns.begin().value(), at), strings_.ws()}));
  }
  if (additional == false) return std::nullopt;
  Expr key = names.empty() ? strings_.any_string() : strings_.key_not_in(names);
  Expr value = additional == true ? strings_.any_value() : schema_expr(additional, path + "/additionalProperties");
  return as_rule(path + "/additionalProperties", seq({key, literal(":"), strings_.ws(), value, strings_.ws()}));
}

// Properties in schema order, each optional one present or not (OpenAI strict mode's order):
// rule rest(i, written) is the text from property i on, `written` when a property came before.
// A property whose schema is false is one the object cannot have.
Expr JsonSchemaCompiler::object_expr(const Json& schema, const std::string& path) {
  Json properties = schema.value("properties", Json::object());
  const std::optional<Expr> extra = extra_member(schema, properties, path);
  const Json required = schema.value("required", Json::array());
  std::vector<std::string> never;  // properties whose schema is false
  for (const auto& [name, s] : properties.items())
    if (s == false) never.push_back(name);
  for (const std::string& name : never) {
    if (std::find(required.begin(), required.end(), Json(name)) != required.end())
      fail(path + "/properties/" + name, "required property with the schema 'false'");
    properties.erase(name);
  }
  std::uint32_t min_properties = 0;
  if (schema.contains("minProperties")) {
    const Json& v = schema["minProperties"];
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1000) fail(path, "'minProperties' is not a count up to 1000");
    min_properties = static_cast<std::uint32_t>(std::ceil(v.get<double>()));
  }
  std::vector<std::pair<std::string, Json>> listed;
  for (const auto& [name, s] : properties.items()) listed.emplace_back(name, s);
  // rest[i][k]: the text from property i on after k members (k capped at `top`, which is at
  // least 1 so that k > 0 says a comma comes first); none when minProperties cannot be met.
  const std::size_t n = listed.size();
  const std::uint32_t top = std::max<std::uint32_t>(min_properties, 1);
  std::vector<std::vector<std::optional<Expr>>> rest(n + 1, std::vector<std::optional<Expr>>(top + 1));
  const Expr comma = seq({literal(","), strings_.ws()});
  const Expr extras_after = extra ? star(seq({comma, *extra})) : empty_expr();
  for (std::uint32_t k = 0; k <= top; ++k) {
    const std::uint32_t need = min_properties > k ? min_properties - k : 0;
    if (need == 0) rest[n][k] = k > 0 ? extras_after : extra ? optional(seq({*extra, extras_after})) : empty_expr();
    else if (extra && k > 0) rest[n][k] = seq({repeat(seq({comma, *extra}), need, need), extras_after});
    else if (extra) rest[n][k] = seq({*extra, repeat(seq({comma, *extra}), need - 1, need - 1), extras_after});
  }
  for (std::size_t i = n; i-- > 0;) {
    const std::string& name = listed[i].first;
    const std::string member_path = path + "/properties/" + name;
    const Expr member = as_rule(member_path, seq({literal(Json(name).dump()), literal(":"), strings_.ws(),
                                                   schema_expr(listed[i].second, member_path), strings_.ws()}));
    const bool is_required = std::find(required.begin(), required.end(), Json(name)) != required.end();
    for (std::uint32_t k = 0; k <= top; ++k) {
      std::vector<Expr> options;
      if (const auto& after = rest[i + 1][std::min(k + 1, top)])
        options.push_back(seq({k > 0 ? comma : empty_expr(), member, *after}));
      if (!is_required && rest[i + 1][k]) options.push_back(*rest[i + 1][k]);
      if (!options.empty()) rest[i][k] = as_rule(path + "/properties", alt(std::move(options)));
    }
  }
  if (!rest[0][0]) fail(path, "'minProperties' is more than the properties the object may have");
  return seq({literal("{"), strings_.ws(), *rest[0][0], literal("}")});
}

// prefixItems (or draft 4-7's items array) then items, between minItems and maxItems: rule
// tail(j) is the text after j elements.
Expr JsonSchemaCompiler::array_expr(const Json& schema, const std::string& path) {
  Json prefix = schema.value("prefixItems", Json::array());
  Json items = schema.value("items", Json(true));
  if (items.is_array()) {
    if (schema.contains("prefixItems")) fail(path, "'items' array together with 'prefixItems'");
    prefix = items;
    items = schema.value("additionalItems", Json(true));
  }  // additionalItems without an items array has no effect (JSON Schema drafts 4-2019-09)
  auto count = [&](const char* key, std::uint64_t fallback) -> std::uint64_t {
    if (!schema.contains(key)) return fallback;
    if (!schema[key].is_number() || schema[key].get<double>() < 0) fail(path, std::string("'") + key + "' is not a count");
    return static_cast<std::uint64_t>(std::ceil(schema[key].get<double>()));
  };
  const std::uint64_t min = count("minItems", 0);
  std::uint64_t max = count("maxItems", Expr::kUnbounded);
  if (items == false) max = std::min<std::uint64_t>(max, prefix.size());
  if (min > max) fail(path, "minItems above what maxItems/items allow");
  if (max != Expr::kUnbounded && max > 10000) fail(path, "'maxItems' over 10000 is not supported");
  if (min > 10000) fail(path, "'minItems' over 10000 is not supported");
  std::vector<Expr> slot;  // the schema of element j, j < prefix size; then the items schema
  for (std::size_t j = 0; j < prefix.size(); ++j)
    slot.push_back(as_rule(path + "/prefixItems/" + std::to_string(j),
                           seq({schema_expr(prefix[j], path + "/prefixItems/" + std::to_string(j)), strings_.ws()})));
  const Expr rest_item = items == false ? empty_expr() : as_rule(path + "/items", seq({schema_expr(items, path + "/items"), strings_.ws()}));
  auto element = [&](std::uint64_t j) { return j < slot.size() ? slot[j] : rest_item; };
  const Expr comma = seq({literal(","), strings_.ws()});
  // From the last distinct tail down to tail(1): past max(prefix, min) they are all one star.
  const std::uint64_t last = std::max<std::uint64_t>(slot.size(), min);
  Expr tail = max == Expr::kUnbounded ? star(seq({comma, rest_item})) : empty_expr();
  const std::uint64_t top = max == Expr::kUnbounded ? last : max;
  for (std::uint64_t j = top; j-- > 1;) {
    Expr next = seq({comma, element(j), std::move(tail)});
    tail = as_rule(path + "/items", j < min ? std::move(next) : optional(std::move(next)));
  }
  if (max == 0) return seq({literal("["), strings_.ws(), literal("]")});
  Expr elements = seq({element(0), std::move(tail)});
  return seq({literal("["), strings_.ws(), min == 0 ? optional(std::move(elements)) : std::move(elements), literal("]")});
}

}  // namespace

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& options) {
  return JsonSchemaCompiler(schema, options).schema_grammar();
}

Grammar json_object_grammar(const JsonOptions& options) {
  return JsonSchemaCompiler(nlohmann::ordered_json::object(), options).object_grammar();
}

}  // namespace flexh2o::grammar
