#include "tests/grammar/json_validator.h"

#include <cmath>
#include <regex>
#include <vector>

namespace flexh2o::grammar::testing {

namespace {

using Json = nlohmann::ordered_json;

const Json& resolve(const std::string& ref, const Json& root) {
  const Json* at = &root;
  for (std::size_t start = 1; start < ref.size();) {
    const std::size_t end = std::min(ref.find('/', start + 1), ref.size());
    at = &(*at)[ref.substr(start + 1, end - start - 1)];
    start = end;
  }
  return *at;
}

bool has_type(const Json& v, const std::string& type) {
  if (type == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (type == "number") return v.is_number();
  if (type == "string") return v.is_string();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "boolean") return v.is_boolean();
  return v.is_null();
}

// "where: what" (built with append: GCC 12 warns falsely on "literal" + std::string here).
std::string at(const std::string& where, const std::string& what) {
  std::string out = where;
  out.append(": ").append(what);
  return out;
}

std::size_t code_points(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string type_violation(const Json& v, const Json& s) {
  if (!s.contains("type")) return "";
  std::vector<std::string> types;
  if (s["type"].is_string()) types.push_back(s["type"]);
  else for (const Json& t : s["type"]) types.push_back(t);
  if (s.value("nullable", false)) types.push_back("null");
  for (const std::string& t : types)
    if (has_type(v, t)) return "";
  return at("type", s["type"].dump());
}

std::string number_violation(const Json& v, const Json& s) {
  if (!v.is_number()) return "";
  const double x = v.get<double>();
  if (s.contains("minimum") && x < s["minimum"].get<double>()) return "minimum";
  if (s.contains("maximum") && x > s["maximum"].get<double>()) return "maximum";
  if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>()) return "exclusiveMinimum";
  if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>()) return "exclusiveMaximum";
  return "";
}

std::string string_violation(const Json& v, const Json& s) {
  if (!v.is_string()) return "";
  const std::string text = v.get<std::string>();
  if (s.contains("minLength") && code_points(text) < s["minLength"].get<std::size_t>()) return "minLength";
  if (s.contains("maxLength") && code_points(text) > s["maxLength"].get<std::size_t>()) return "maxLength";
  if (s.contains("pattern") && !std::regex_search(text, std::regex(s["pattern"].get<std::string>()))) return "pattern";
  return "";
}

std::string object_violation(const Json& v, const Json& s, const Json& root) {
  if (!v.is_object()) return "";
  for (const Json& name : s.value("required", Json::array()))
    if (!v.contains(name.get<std::string>())) return at("required", name.dump());
  const Json properties = s.value("properties", Json::object());
  if (s.contains("minProperties") && v.size() < s["minProperties"].get<std::size_t>()) return "minProperties";
  const Json patterns = s.value("patternProperties", Json::object());
  for (const auto& [key, value] : v.items()) {
    bool matched = properties.contains(key);  // additionalProperties applies to the others
    std::vector<Json> subs;
    if (matched) subs.push_back(properties[key]);
    for (const auto& [pattern, sub] : patterns.items())
      if (std::regex_search(key, std::regex(pattern))) matched = true, subs.push_back(sub);
    if (!matched) subs.push_back(s.value("additionalProperties", Json(true)));
    for (const Json& sub : subs) {
      const std::string inner = schema_violation(value, sub, root);
      if (!inner.empty()) return at(key, inner);
    }
  }
  return "";
}

std::string array_violation(const Json& v, const Json& s, const Json& root) {
  if (!v.is_array()) return "";
  if (s.contains("minItems") && v.size() < s["minItems"].get<std::size_t>()) return "minItems";
  if (s.contains("maxItems") && v.size() > s["maxItems"].get<std::size_t>()) return "maxItems";
  const Json prefix = s.value("prefixItems", Json::array());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const Json& sub = i < prefix.size() ? prefix[i] : s.value("items", Json(true));
    const std::string inner = schema_violation(v[i], sub, root);
    if (!inner.empty()) return at(std::to_string(i), inner);
  }
  return "";
}

}  // namespace

std::string schema_violation(const Json& v, const Json& s, const Json& root) {
  if (s.is_boolean()) return s.get<bool>() ? "" : "false schema";
  if (s.contains("$ref")) {
    const std::string inner = schema_violation(v, resolve(s["$ref"], root), root);
    if (!inner.empty()) return inner;
  }
  if (s.contains("const") && v != s["const"]) return "const";
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return "enum";
  for (const Json& sub : s.value("allOf", Json::array()))
    if (const std::string inner = schema_violation(v, sub, root); !inner.empty()) return at("allOf", inner);
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    std::size_t matches = 0;
    for (const Json& sub : s[key]) matches += schema_violation(v, sub, root).empty();
    if (matches == 0 || (std::string(key) == "oneOf" && matches > 1)) return key;
  }
  for (const std::string& violation : {type_violation(v, s), number_violation(v, s), string_violation(v, s),
                                       object_violation(v, s, root), array_violation(v, s, root)})
    if (!violation.empty()) return violation;
  return "";
}

}  // namespace flexh2o::grammar::testing
