#include "engine/chat/filters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include "engine/chat/args.h"
#include "engine/chat/formatting.h"
#include "engine/chat/interpreter.h"
#include "engine/chat/json_value.h"
#include "engine/chat/methods.h"
#include "engine/chat/operators.h"
#include "engine/chat/string_methods.h"
#include "engine/chat/tests.h"
#include "engine/chat/text.h"

namespace flexh2o::engine::chat {

namespace {

// jinja2's builtin filters this engine leaves out: using one is an error naming it.
const std::set<std::string> kNotImplemented = {"batch",  "filesizeformat", "groupby",  "pprint",    "random",
                                               "slice",  "striptags",      "truncate", "urlencode", "urlize",
                                               "wordwrap", "xmlattr"};

using Filter = std::function<Value(Interpreter& in, const Value& v, CallArgs& a, const std::string& what)>;

// A filter's text result is a Markup when its input was (Markup's str methods give Markup).
Value same_kind(const Value& input, std::string text) {
  return input.is_markup() ? Value::markup(std::move(text)) : Value(std::move(text));
}

// Python's len().
Value length_of(const Value& v, int line) {
  if (v.is_string()) return static_cast<std::int64_t>(to_code_points(v.as_string()).size());
  if (v.is_iterable_obj() && !v.is_iterator()) return static_cast<std::int64_t>(v.as_list().items.size());
  if (v.is_dict()) return static_cast<std::int64_t>(v.as_dict().items.size());
  if (v.is_undefined()) return std::int64_t{0};
  throw TemplateError("object of type '" + type_name(v) + "' has no len()", line);
}

// jinja2's make_attrgetter: "a.b.0" reads item a, then b, then index 0.
Value read_attribute(const Value& item, const std::string& path, int line) {
  Value v = item;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(v, digits ? Value(static_cast<std::int64_t>(std::stoll(part))) : Value(part), line);
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::function<Value(const Value&)> attribute_getter(const Value& attribute, int line) {
  if (attribute.is_none() || attribute.is_undefined()) return [](const Value& v) { return v; };
  if (is_integral(attribute)) {
    return [attribute, line](const Value& v) { return get_item(v, attribute, line); };
  }
  if (!attribute.is_string()) throw TemplateError("attribute must be a string or an integer", line);
  const std::string path = attribute.as_string();
  return [path, line](const Value& v) { return read_attribute(v, path, line); };
}

// The sort key jinja2 uses without case_sensitive: strings lowered.
Value fold_case(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(lower(v.as_string())) : v;
}

std::vector<Value> sorted_values(std::vector<Value> items, const std::function<Value(const Value&)>& key, bool reverse,
                                 int line) {
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& v : items) keyed.emplace_back(key(v), std::move(v));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? less_than(b.first, a.first, line) : less_than(a.first, b.first, line);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

// Python's float(str): surrounding whitespace allowed, the whole rest must be the number.
std::optional<double> parse_float(const std::string& s) {
  const std::string t = py_strip(s, None{}, true, true, 0);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

// Python's int(str, base) for bases 2..36, with its whitespace, sign and underscore rules.
std::optional<std::int64_t> parse_int(const std::string& s, std::int64_t base) {
  std::string t = py_strip(s, None{}, true, true, 0);
  bool negative = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    negative = t[0] == '-';
    t.erase(0, 1);
  }
  if (t.empty() || t.front() == '_' || t.back() == '_' || t.find("__") != std::string::npos) return std::nullopt;
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  std::int64_t v = 0;
  for (char c : t) {
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10
                                                                 : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return std::nullopt;
  }
  return negative ? -v : v;
}

Value to_int_filter(const Value& v, const BoundArgs& b, int line) {
  const Value fallback = b.get_or(0, Value(std::int64_t{0}));
  const std::int64_t base = b.int_or(1, 10, line);
  if (v.is_undefined()) fail_undefined(v, line);
  if (is_integral(v)) return to_int64(v);
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) return fallback;
    return static_cast<std::int64_t>(std::trunc(v.as_float()));
  }
  if (v.is_string()) {
    if (const auto i = parse_int(v.as_string(), base)) return *i;
    if (const auto d = parse_float(v.as_string()); d && std::isfinite(*d)) return static_cast<std::int64_t>(std::trunc(*d));
  }
  return fallback;
}

Value to_float_filter(const Value& v, const BoundArgs& b, int line) {
  const Value fallback = b.get_or(0, Value(0.0));
  if (v.is_undefined()) fail_undefined(v, line);
  if (v.is_number()) return to_double(v);
  if (v.is_string()) {
    if (const auto d = parse_float(v.as_string())) return *d;
  }
  return fallback;
}

Value round_filter(const Value& v, const BoundArgs& b, int line) {
  const std::int64_t precision = b.int_or(0, 0, line);
  const std::string method = b.string_or(1, "common", line);
  if (method != "common" && method != "ceil" && method != "floor") {
    throw TemplateError("method must be 'common', 'ceil' or 'floor'", line);
  }
  if (!v.is_number()) {
    if (v.is_undefined()) fail_undefined(v, line);
    throw TemplateError("round needs a number, got " + type_name(v), line);
  }
  if (precision < 0 || precision > 30) throw TemplateError("round: precision must be between 0 and 30", line);
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return std::ceil(to_double(v) * scale) / scale;
  if (method == "floor") return std::floor(to_double(v) * scale) / scale;
  if (is_integral(v)) return to_int64(v);
  // printf rounds the exact binary value half-to-even, as Python's round() does.
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), v.as_float());
  return std::strtod(buf, nullptr);
}

Value indent_filter(const Value& v, const BoundArgs& b, int line) {
  const Value width = b.get_or(0, Value(std::int64_t{4}));
  const auto spaces = width.is_string() ? 0 : static_cast<std::uint64_t>(std::max<std::int64_t>(0, b.int_or(0, 4, line)));
  check_text_bytes(spaces, line);
  const std::string indention = width.is_string() ? width.as_string() : std::string(spaces, ' ');
  const bool first = b.bool_or(1, false);
  const bool blank = b.bool_or(2, false);
  std::vector<std::string> lines;
  const std::string s = to_str(v, line) + "\n";
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    lines.push_back(s.substr(start, i - start));
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    start = i + 1;
  }
  check_text_bytes(s.size() + lines.size() * indention.size(), line);
  std::string out = lines.empty() ? "" : lines[0];
  for (std::size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += indention;
    out += lines[i];
  }
  return first ? indention + out : out;
}

Value tojson_filter(const Value& v, const BoundArgs& b, int line) {
  JsonDumpOptions opt;
  opt.ensure_ascii = b.bool_or(0, false);
  if (b.has(1) && !b.get(1).is_none()) {
    const Value& indent = b.get(1);
    if (indent.is_string()) {
      opt.indent = indent.as_string();
    } else {
      opt.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, b.int_or(1, 0, line))), ' ');
    }
    opt.item_separator = ",";
  }
  if (b.has(2) && !b.get(2).is_none()) {
    const Value& sep = b.get(2);
    if (!sep.is_sequence_obj() || sep.as_list().items.size() != 2 || !sep.as_list().items[0].is_string() ||
        !sep.as_list().items[1].is_string()) {
      throw TemplateError("tojson: separators must be a pair of strings", line);
    }
    opt.item_separator = sep.as_list().items[0].as_string();
    opt.key_separator = sep.as_list().items[1].as_string();
  }
  opt.sort_keys = b.bool_or(3, false);
  return dump_json(v, opt, line);
}

Value select_like(Interpreter& in, const Value& v, CallArgs& a, bool by_attribute, bool keep) {
  // jinja2's generator starts with `if value:`: None or an empty value selects nothing, unchecked.
  if (!truthy(v)) return Value::sequence(SeqKind::Iterator, {});
  const std::string what = std::string(keep ? "select" : "reject") + (by_attribute ? "attr" : "");
  std::size_t next = 0;
  std::function<Value(const Value&)> getter = [](const Value& x) { return x; };
  if (by_attribute) {
    if (a.positional.empty()) throw TemplateError(what + " needs an attribute name", a.line);
    getter = attribute_getter(a.positional[next++], a.line);
  }
  std::string test;
  if (next < a.positional.size()) {
    if (!a.positional[next].is_string()) throw TemplateError(what + ": the test name must be a string", a.line);
    test = a.positional[next++].as_string();
    if (!is_jinja_test(test)) throw TemplateError("No test named '" + test + "'.", a.line);
  }
  CallArgs test_args;
  test_args.line = a.line;
  test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next), a.positional.end());
  test_args.keyword = a.keyword;
  std::vector<Value> out;
  for (const Value& item : iterate(v, a.line)) {
    in.step(a.line);
    const Value probe = getter(item);
    CallArgs args = test_args;
    const bool passed = test.empty() ? truthy(probe) : apply_test(in, test, probe, args);
    if (passed == keep) out.push_back(item);
  }
  return Value::sequence(SeqKind::Iterator, std::move(out));
}

Value map_filter(Interpreter& in, const Value& v, CallArgs& a) {
  if (!truthy(v)) return Value::sequence(SeqKind::Iterator, {});  // as select_like
  std::vector<Value> out;
  if (a.positional.empty()) {
    BoundArgs b(a, {"attribute", "default"}, "filter 'map'");
    if (!b.has(0)) throw TemplateError("map needs a filter name or attribute=", a.line);
    const auto getter = attribute_getter(b.get(0), a.line);
    for (const Value& item : iterate(v, a.line)) {
      in.step(a.line);
      Value x = getter(item);
      if (x.is_undefined() && b.has(1)) x = b.get(1);
      out.push_back(std::move(x));
    }
    return Value::sequence(SeqKind::Iterator, std::move(out));
  }
  if (!a.positional[0].is_string()) throw TemplateError("map: the filter name must be a string", a.line);
  const std::string name = a.positional[0].as_string();
  if (!is_jinja_filter(name)) throw TemplateError("No filter named '" + name + "'.", a.line);
  CallArgs rest;
  rest.line = a.line;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : iterate(v, a.line)) {
    CallArgs args = rest;
    out.push_back(apply_filter(in, name, item, args));
  }
  return Value::sequence(SeqKind::Iterator, std::move(out));
}

Value min_max(const Value& v, const BoundArgs& b, int line, bool want_max) {
  const bool case_sensitive = b.bool_or(0, false);
  const auto getter = attribute_getter(b.get_or(1, None{}), line);
  const std::vector<Value> items = iterate(v, line);
  if (items.empty()) return Undefined{"No aggregated item, sequence was empty."};
  const Value* best = &items[0];
  for (const Value& item : items) {
    const Value k = fold_case(getter(item), case_sensitive);
    const Value best_k = fold_case(getter(*best), case_sensitive);
    if (want_max ? less_than(best_k, k, line) : less_than(k, best_k, line)) best = &item;
  }
  return *best;
}

Value unique_filter(const Value& v, const BoundArgs& b, int line) {
  const bool case_sensitive = b.bool_or(0, false);
  const auto getter = attribute_getter(b.get_or(1, None{}), line);
  std::vector<Value> seen;
  std::vector<Value> out;
  for (const Value& item : iterate(v, line)) {
    const Value key = fold_case(getter(item), case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::sequence(SeqKind::Iterator, std::move(out));
}

Value dictsort_filter(const Value& v, const BoundArgs& b, int line) {
  if (!v.is_dict()) throw TemplateError("dictsort needs a mapping, got " + type_name(v), line);
  const bool case_sensitive = b.bool_or(0, false);
  const std::string by = b.string_or(1, "key", line);
  if (by != "key" && by != "value") throw TemplateError("You can only sort by either \"key\" or \"value\"", line);
  const std::size_t pos = by == "key" ? 0 : 1;
  std::vector<Value> items;
  for (const auto& [k, val] : v.as_dict().items) items.push_back(Value::tuple({k, val}));
  return Value::list(sorted_values(
      std::move(items), [&](const Value& t) { return fold_case(t.as_list().items[pos], case_sensitive); },
      b.bool_or(2, false), line));
}

Value join_filter(Interpreter& in, const Value& v, const BoundArgs& b, int line) {
  const std::string sep = b.has(0) ? to_str(b.get(0), line) : "";
  const auto getter = attribute_getter(b.get_or(1, None{}), line);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v, line)) {
    if (!first) out += sep;
    first = false;
    out += to_str(getter(item), line);
    in.check_size(out.size(), line);
  }
  return out;
}

Value sum_filter(Interpreter& in, const Value& v, const BoundArgs& b, int line) {
  const auto getter = attribute_getter(b.get_or(0, None{}), line);
  Value total = b.get_or(1, Value(std::int64_t{0}));
  for (const Value& item : iterate(v, line)) total = binary_op(in, "+", total, getter(item), line);
  return total;
}

Value first_or_last(const Value& v, int line, bool last) {
  if (last && v.is_iterator()) throw TemplateError("'generator' object is not reversible", line);
  const std::vector<Value> items = iterate(v, line);
  if (items.empty()) return Undefined{last ? "No last item, sequence was empty." : "No first item, sequence was empty."};
  return last ? items.back() : items.front();
}

// jinja2's format: printf-style, with the positional arguments or the keyword ones.
Value format_filter(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.positional.empty() && !a.keyword.empty()) {
    throw TemplateError("can't handle positional and keyword arguments at the same time", a.line);
  }
  Value args = Value::tuple(a.positional);
  if (!a.keyword.empty()) {
    args = Value::dict();
    for (const auto& [k, x] : a.keyword) args.as_dict().set(Value(k), x);
  }
  std::string text = format_percent(to_str(v, a.line), args, v.is_markup(), a.line);
  in.check_size(text.size(), a.line);
  return same_kind(v, std::move(text));
}

Value items_filter(const Value& v, int line) {
  if (v.is_undefined()) return Value::sequence(SeqKind::Iterator, {});
  if (!v.is_dict()) throw TemplateError("Can only get item pairs from a mapping.", line);
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::tuple({k, val}));
  return Value::sequence(SeqKind::Iterator, std::move(out));
}

Value reverse_filter(const Value& v, int line) {
  if (v.is_string()) {
    std::u32string cps = to_code_points(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return to_utf8(cps);
  }
  std::vector<Value> items = iterate(v, line);
  std::reverse(items.begin(), items.end());
  // reversed() of a sequence is an iterator; a generator has none, so jinja2 makes a list.
  return v.is_iterator() ? Value::list(std::move(items)) : Value::sequence(SeqKind::Iterator, std::move(items));
}

Value abs_filter(const Value& v, int line) {
  if (v.is_float()) return std::fabs(v.as_float());
  if (is_integral(v)) return to_int64(v) < 0 ? negate(v, line) : Value(to_int64(v));
  if (v.is_undefined()) fail_undefined(v, line);
  throw TemplateError("bad operand type for abs(): '" + type_name(v) + "'", line);
}

Value wordcount(const Value& v, int line) {
  std::int64_t n = 0;
  bool in_word = false;
  for (char32_t c : to_code_points(to_str(v, line))) {
    const bool w = py_isalnum(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

// jinja2's title filter: split at runs of -, whitespace and opening brackets, then each piece's
// first character upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  const std::u32string cps = to_code_points(s);
  auto boundary = [](char32_t c) { return c == '-' || py_isspace(c) || c == '(' || c == '{' || c == '[' || c == '<'; };
  std::string out;
  std::size_t i = 0;
  while (i < cps.size()) {
    std::size_t j = i;
    const bool sep = boundary(cps[i]);
    while (j < cps.size() && boundary(cps[j]) == sep) ++j;
    const std::u32string piece = cps.substr(i, j - i);
    out += sep ? to_utf8(piece) : to_utf8(upper_full(piece[0])) + lower(to_utf8(piece.substr(1)));
    i = j;
  }
  return out;
}

Value center_filter(Interpreter& in, const Value& v, const BoundArgs& b, int l) {
  CallArgs a;
  a.line = l;
  a.positional.push_back(b.get_or(0, Value(std::int64_t{80})));
  return same_kind(v, string_method(Value(to_str(v, l)), "center").as_callable().call(in, a).as_string());
}

Value sort_filter(Interpreter&, const Value& v, const BoundArgs& b, int l) {
  const bool case_sensitive = b.bool_or(1, false);
  const auto getter = attribute_getter(b.get_or(2, None{}), l);
  return Value::list(sorted_values(
      iterate(v, l), [&](const Value& x) { return fold_case(getter(x), case_sensitive); }, b.bool_or(0, false), l));
}

// Filters whose parameters bind by Python's rules (the value is the first argument).
struct Simple {
  std::vector<std::string> params;
  std::function<Value(Interpreter& in, const Value& v, const BoundArgs& b, int line)> fn;
};

const std::map<std::string, Simple>& simple_filters() {
  static const std::map<std::string, Simple> f = {
      {"abs", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return abs_filter(v, l); }}},
      {"attr", {{"name"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) {
         return get_attribute(v, b.string_or(0, "", l), l);
       }}},
      {"capitalize", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) {
         return same_kind(v, py_capitalize(to_str(v, l)));
       }}},
      {"center", {{"width"}, center_filter}},
      {"count", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return length_of(v, l); }}},
      {"length", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return length_of(v, l); }}},
      {"default", {{"default_value", "boolean"}, [](Interpreter&, const Value& v, const BoundArgs& b, int) {
         const bool use_default = b.bool_or(1, false) ? !truthy(v) : v.is_undefined();
         return use_default ? b.get_or(0, Value("")) : v;
       }}},
      {"dictsort", {{"case_sensitive", "by", "reverse"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) {
         return dictsort_filter(v, b, l);
       }}},
      {"escape", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return Value::markup(escaped_text(v, l)); }}},
      {"forceescape", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) {
         return Value::markup(html_escape(to_str(v, l)));
       }}},
      {"first", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return first_or_last(v, l, false); }}},
      {"last", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return first_or_last(v, l, true); }}},
      {"float", {{"default"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) { return to_float_filter(v, b, l); }}},
      {"int", {{"default", "base"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) { return to_int_filter(v, b, l); }}},
      {"indent", {{"width", "first", "blank"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) {
         return same_kind(v, indent_filter(v, b, l).as_string());
       }}},
      {"items", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return items_filter(v, l); }}},
      {"join", {{"d", "attribute"}, [](Interpreter& in, const Value& v, const BoundArgs& b, int l) {
         return join_filter(in, v, b, l);
       }}},
      {"list", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return Value::list(iterate(v, l)); }}},
      {"lower", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return same_kind(v, lower(to_str(v, l))); }}},
      {"upper", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return same_kind(v, upper(to_str(v, l))); }}},
      {"max", {{"case_sensitive", "attribute"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) {
         return min_max(v, b, l, true);
       }}},
      {"min", {{"case_sensitive", "attribute"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) {
         return min_max(v, b, l, false);
       }}},
      {"replace", {{"old", "new", "count"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) -> Value {
         if (!b.has(0) || !b.has(1)) throw TemplateError("replace needs the old and the new text", l);
         return py_replace(to_str(v, l), to_str(b.get(0), l), to_str(b.get(1), l), b.int_or(2, -1, l), l);
       }}},
      {"reverse", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return reverse_filter(v, l); }}},
      {"round", {{"precision", "method"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) {
         return round_filter(v, b, l);
       }}},
      {"safe", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return Value::markup(to_str(v, l)); }}},
      {"sort", {{"reverse", "case_sensitive", "attribute"}, sort_filter}},
      {"string", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) {
         return v.is_string() ? v : Value(to_str(v, l));  // soft_str: a Markup stays one
       }}},
      {"sum", {{"attribute", "start"}, [](Interpreter& in, const Value& v, const BoundArgs& b, int l) {
         return sum_filter(in, v, b, l);
       }}},
      {"title", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) -> Value { return jinja_title(to_str(v, l)); }}},
      {"tojson", {{"ensure_ascii", "indent", "separators", "sort_keys"},
                  [](Interpreter&, const Value& v, const BoundArgs& b, int l) { return tojson_filter(v, b, l); }}},
      {"trim", {{"chars"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) -> Value {
         return same_kind(v, py_strip(to_str(v, l), b.get_or(0, None{}), true, true, l));
       }}},
      {"unique", {{"case_sensitive", "attribute"}, [](Interpreter&, const Value& v, const BoundArgs& b, int l) {
         return unique_filter(v, b, l);
       }}},
      {"wordcount", {{}, [](Interpreter&, const Value& v, const BoundArgs&, int l) { return wordcount(v, l); }}},
  };
  return f;
}

std::string canonical(const std::string& name) {
  if (name == "d") return "default";
  if (name == "e") return "escape";
  return name;
}

}  // namespace

bool is_jinja_filter(const std::string& name) {
  const std::string n = canonical(name);
  return simple_filters().count(n) || kNotImplemented.count(n) || n == "map" || n == "select" || n == "reject" ||
         n == "selectattr" || n == "rejectattr" || n == "format";
}

Value apply_filter(Interpreter& in, const std::string& name, const Value& value, CallArgs& args) {
  in.step(args.line);
  const std::string n = canonical(name);
  if (n == "map") return map_filter(in, value, args);
  if (n == "format") return format_filter(in, value, args);
  if (n == "select" || n == "reject") return select_like(in, value, args, false, n == "select");
  if (n == "selectattr" || n == "rejectattr") return select_like(in, value, args, true, n == "selectattr");
  const auto it = simple_filters().find(n);
  if (it == simple_filters().end()) {
    if (kNotImplemented.count(n)) throw TemplateError("filter '" + name + "' is not implemented", args.line);
    // Only a filter the parser let through in an if (see parser.cc) gets here, as in jinja2.
    throw TemplateError("No filter named '" + name + "' found.", args.line);
  }
  BoundArgs b(args, it->second.params, "filter '" + name + "'");
  return it->second.fn(in, value, b, args.line);
}

}  // namespace flexh2o::engine::chat
