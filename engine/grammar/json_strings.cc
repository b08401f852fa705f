#include "engine/grammar/json_strings.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include "engine/grammar/char_set.h"
#include "engine/grammar/json_numbers.h"
#include "engine/grammar/regex.h"

namespace flexh2o::grammar {

namespace {

// Characters written as themselves inside a JSON string: not '"', '\' or a control.
CharSet plain_chars() {
  CharSet escaped = CharSet::range(0, 0x1F);
  escaped.add('"', '"');
  escaped.add('\\', '\\');
  return escaped.complement();
}

// The formats, as regexes over the string's characters (docs/structured-output.md, "Formats").
const std::map<std::string, std::string>& format_patterns() {
  static const std::string year = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])";
  static const std::string month_day = "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))";
  static const std::string leap_day = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29";
  static const std::string date = "(" + year + "-" + month_day + "|" + leap_day + ")";
  static const std::string time = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::string hex = "[0-9a-fA-F]";
  static const std::string unreserved = "[A-Za-z0-9._~-]";
  static const std::string pchar = "([A-Za-z0-9._~!$&'()*+,;=:@-]|%" + hex + hex + ")";
  static const std::map<std::string, std::string> patterns = {
      {"date", date},
      {"time", time},
      {"date-time", date + "T" + time},
      {"email", "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){1,8}"},
      {"ipv4", "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}"},
      {"uuid", hex + "{8}-" + hex + "{4}-" + hex + "{4}-" + hex + "{4}-" + hex + "{12}"},
      {"uri", "[A-Za-z][A-Za-z0-9+.-]*://" + unreserved + "+(:[0-9]{1,5})?(/" + pchar + "*)*(\\?(" + pchar + "|[/?])*)?(#(" + pchar + "|[/?])*)?"},
  };
  return patterns;
}

std::optional<std::uint32_t> length_keyword(const nlohmann::ordered_json& schema, const char* key, const std::string& path) {
  if (!schema.contains(key)) return std::nullopt;
  const auto& v = schema[key];
  if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 100000)
    throw std::invalid_argument("json schema at '" + path + "': '" + key + "' is not a count up to 100000");
  return static_cast<std::uint32_t>(std::ceil(v.get<double>()));
}

}  // namespace

Expr JsonStrings::shared(std::optional<std::uint32_t>& rule, const char* name, Expr (JsonStrings::*body)()) {
  if (!rule) {
    rule = builder_.add_rule(name);
    builder_.define(*rule, (this->*body)());
  }
  return rule_expr(*rule);
}

Expr JsonStrings::ws() {
  if (max_whitespace_ == 0) return empty_expr();
  return shared(ws_, "ws", &JsonStrings::ws_body);
}
Expr JsonStrings::ws_body() { return repeat(bytes_expr(ByteClass::of(" \t\n")), 0, max_whitespace_); }

// A character of a JSON string: itself, or an escape (\u of a surrogate excluded, so that a
// character is one code point when lengths are counted).
Expr JsonStrings::char_body() {
  const Expr hex = bytes_expr(ByteClass::of("0123456789abcdefABCDEF"));
  const Expr not_surrogate = alt({seq({bytes_expr(ByteClass::of("0123456789abcefABCEF")), hex, hex, hex}),
                                  seq({bytes_expr(ByteClass::of("dD")), bytes_expr(ByteClass::range('0', '7')), hex, hex})});
  return alt({plain_char(), seq({literal("\\"), alt({bytes_expr(ByteClass::of("\"\\/bfnrt")), seq({literal("u"), not_surrogate})})})});
}
Expr JsonStrings::plain_char_body() { return utf8_expr(plain_chars()); }

Expr JsonStrings::any_string() { return shared(string_, "string", &JsonStrings::string_body); }
Expr JsonStrings::string_body() { return seq({literal("\""), star(string_char()), literal("\"")}); }

Expr JsonStrings::any_value() { return shared(value_, "value", &JsonStrings::value_body); }
Expr JsonStrings::value_body() {
  return alt({any_object(), shared(array_, "array", &JsonStrings::array_body), any_string(), any_number_expr(),
              literal("true"), literal("false"), literal("null")});
}

Expr JsonStrings::any_object() { return shared(object_, "object", &JsonStrings::object_body); }
Expr JsonStrings::object_body() {
  Expr member = seq({any_string(), literal(":"), ws(), any_value(), ws()});
  Expr members = seq({member, star(seq({literal(","), ws(), member}))});
  return seq({literal("{"), ws(), optional(std::move(members)), literal("}")});
}
Expr JsonStrings::array_body() {
  Expr item = seq({any_value(), ws()});
  Expr items = seq({item, star(seq({literal(","), ws(), item}))});
  return seq({literal("["), ws(), optional(std::move(items)), literal("]")});
}

Expr JsonStrings::string_expr(const nlohmann::ordered_json& schema, const std::string& path) {
  const auto min_length = length_keyword(schema, "minLength", path);
  const auto max_length = length_keyword(schema, "maxLength", path);
  const bool lengths = min_length || max_length;
  Expr content;
  if (schema.contains("pattern")) {
    if (lengths || schema.contains("format"))
      throw std::invalid_argument("json schema at '" + path + "': 'pattern' together with 'minLength'/'maxLength'/'format' is not supported");
    if (!schema["pattern"].is_string()) throw std::invalid_argument("json schema at '" + path + "': 'pattern' is not a string");
    content = regex_expr(schema["pattern"].get<std::string>(), RegexAlphabet::JsonString, true);
  } else if (schema.contains("format") && schema["format"] != "int32" && schema["format"] != "int64" &&
             schema["format"] != "float" && schema["format"] != "double") {
    const std::string format = schema["format"].is_string() ? schema["format"].get<std::string>() : "";
    auto it = format_patterns().find(format);
    if (it == format_patterns().end())
      throw std::invalid_argument("json schema at '" + path + "': format '" + format + "' is not supported");
    if (lengths) throw std::invalid_argument("json schema at '" + path + "': 'format' together with 'minLength'/'maxLength' is not supported");
    content = regex_expr(it->second, RegexAlphabet::JsonString);
  } else {
    const std::uint32_t min = min_length.value_or(0);
    const std::uint32_t max = max_length ? *max_length : Expr::kUnbounded;
    if (max < min) throw std::invalid_argument("json schema at '" + path + "': 'maxLength' below 'minLength'");
    content = repeat(string_char(), min, max);
  }
  return seq({literal("\""), std::move(content), literal("\"")});
}

Expr JsonStrings::key_not_in(const std::vector<std::string>& names) {
  // A trie over the names' code points; at each node: end here (unless a name ends here), take
  // a child's code point and stay on the trie, or leave it with any other character.
  struct Node {
    bool is_name = false;
    std::map<std::uint32_t, std::size_t> children;
  };
  std::vector<Node> trie(1);
  const CharSet plain = plain_chars();
  for (const std::string& name : names) {
    std::size_t at = 0;
    bool representable = true;
    std::vector<std::uint32_t> cps;
    for (std::size_t i = 0; i < name.size();) {
      const auto b = static_cast<std::uint8_t>(name[i]);
      const std::size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      std::uint32_t cp = n == 1 ? b : b & (0x3F >> (n - 1));
      for (std::size_t k = 1; k < n && i + k < name.size(); ++k) cp = (cp << 6) | (static_cast<std::uint8_t>(name[i + k]) & 0x3F);
      cps.push_back(cp);
      representable = representable && plain.contains(cp);
      i += n;
    }
    if (!representable) continue;
    for (std::uint32_t cp : cps) {
      auto [it, inserted] = trie[at].children.try_emplace(cp, trie.size());
      if (inserted) trie.emplace_back();
      at = it->second;
    }
    trie[at].is_name = true;
  }
  std::vector<std::uint32_t> rules(trie.size());
  for (std::uint32_t& r : rules) r = builder_.add_rule("key-not-listed");
  const Expr rest = star(plain_char());
  for (std::size_t i = 0; i < trie.size(); ++i) {
    std::vector<Expr> options;
    if (!trie[i].is_name) options.push_back(empty_expr());
    CharSet others = plain;
    for (const auto& [cp, child] : trie[i].children) {
      options.push_back(seq({literal(utf8_encode(cp)), rule_expr(rules[child])}));
      others = others.minus(CharSet::range(cp, cp));
    }
    options.push_back(seq({utf8_expr(others), rest}));
    builder_.define(rules[i], alt(std::move(options)));
  }
  return seq({literal("\""), rule_expr(rules[0]), literal("\"")});
}

}  // namespace flexh2o::grammar
