#include "engine/chat/string_methods.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "engine/chat/args.h"
#include "engine/chat/formatting.h"

namespace flexh2o::engine::chat {

namespace {

const std::set<std::string> kStrAttrs = {
    "capitalize", "casefold",  "center",     "count",      "encode",    "endswith",   "expandtabs", "find",
    "format",     "format_map", "index",     "isalnum",    "isalpha",   "isascii",    "isdecimal",  "isdigit",
    "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",  "istitle",    "isupper",    "join",
    "ljust",      "lower",     "lstrip",     "maketrans",  "partition", "removeprefix", "removesuffix", "replace",
    "rfind",      "rindex",    "rjust",      "rpartition", "rsplit",    "rstrip",     "split",      "splitlines",
    "startswith", "strip",     "swapcase",   "title",      "translate", "upper",      "zfill"};

std::string need_str(const Value& v, const std::string& what, int line) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) fail_undefined(v, line);
  throw TemplateError(what + ": expected a string, got " + type_name(v), line);
}

std::int64_t cp_index(const std::string& s, std::size_t byte_pos) {
  return static_cast<std::int64_t>(to_code_points(std::string_view(s).substr(0, byte_pos)).size());
}

// The prefix/suffix argument of startswith/endswith: a str or a tuple of them.
std::vector<std::string> affixes(const Value& v, const std::string& what, int line) {
  if (v.is_tuple()) {
    std::vector<std::string> out;
    for (const Value& x : v.as_list().items) out.push_back(need_str(x, what, line));
    return out;
  }
  return {need_str(v, what, line)};
}

std::string pad(const std::string& s, std::int64_t width, const std::string& fill, char how, int line) {
  const auto n = static_cast<std::int64_t>(to_code_points(s).size());
  if (width <= n) return s;
  const std::int64_t total = width - n;
  const auto fill_bytes = static_cast<std::uint64_t>(total);  // each fill at least a byte; checked before multiplying
  check_text_bytes(fill_bytes, line);
  check_text_bytes(s.size() + fill_bytes * fill.size(), line);
  std::int64_t left = how == 'l' ? 0 : how == 'r' ? total : total / 2 + (total & width & 1);
  std::string out;
  for (std::int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (std::int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

bool all_of_cps(const std::string& s, const std::function<bool(char32_t)>& pred) {
  const std::u32string cps = to_code_points(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

using Method = std::function<Value(const std::string& self, CallArgs& a, const std::string& what)>;

// str.format through jinja2's SandboxedFormatter; `escape`: self is a Markup (EscapeFormatter).
Value format_method(const std::string& s, CallArgs& a, bool escape) {
  Value kwargs = Value::dict();
  for (const auto& [k, v] : a.keyword) kwargs.as_dict().set(Value(k), v);
  return format_braces(s, a.positional, kwargs, escape, a.line);
}

Value format_map_method(const std::string& s, CallArgs& a, bool escape) {
  if (!a.keyword.empty()) throw TemplateError("format_map() takes no keyword arguments", a.line);
  if (a.positional.size() != 1) {
    throw TemplateError("format_map() takes exactly one argument (" + std::to_string(a.positional.size()) + " given)",
                        a.line);
  }
  if (!a.positional[0].is_dict()) throw TemplateError("format_map() argument must be a mapping", a.line);
  return format_braces(s, {}, a.positional[0], escape, a.line);
}

Value find_like(const std::string& self, CallArgs& a, const std::string& what, bool reverse, bool must) {
  BoundArgs b(a, {"sub"}, what);
  const std::string sub = need_str(b.get(0), what, a.line);
  const std::size_t pos = reverse ? self.rfind(sub) : self.find(sub);
  if (pos == std::string::npos) {
    if (must) throw TemplateError("substring not found", a.line);
    return std::int64_t{-1};
  }
  return cp_index(self, pos);
}

Value case_test(const std::string& self, bool want_upper) {
  bool any_cased = false;
  for (char32_t c : to_code_points(self)) {
    if (!is_cased(c)) continue;
    any_cased = true;
    if (want_upper ? py_lower(c) == c && py_upper(c) != c : py_upper(c) == c && py_lower(c) != c) return false;
  }
  return any_cased;
}

Value partition(const std::string& self, CallArgs& a, const std::string& what, bool reverse) {
  BoundArgs b(a, {"sep"}, what);
  const std::string sep = need_str(b.get(0), what, a.line);
  if (sep.empty()) throw TemplateError("empty separator", a.line);
  const std::size_t pos = reverse ? self.rfind(sep) : self.find(sep);
  if (pos == std::string::npos) return reverse ? Value::tuple({"", "", self}) : Value::tuple({self, "", ""});
  return Value::tuple({self.substr(0, pos), sep, self.substr(pos + sep.size())});
}

// A method that takes no arguments.
Method no_args(std::function<Value(const std::string&)> f) {
  return [f = std::move(f)](const std::string& s, CallArgs& a, const std::string& w) -> Value {
    BoundArgs b(a, {}, w);
    return f(s);
  };
}

Method strip_method(bool left, bool right) {
  return [=](const std::string& s, CallArgs& a, const std::string& w) -> Value {
    BoundArgs b(a, {"chars"}, w);
    return py_strip(s, b.get_or(0, None{}), left, right, a.line);
  };
}

Method pad_method(char how) {
  return [=](const std::string& s, CallArgs& a, const std::string& w) -> Value {
    BoundArgs b(a, {"width", "fillchar"}, w);
    return pad(s, b.int_or(0, 0, a.line), b.string_or(1, " ", a.line), how, a.line);
  };
}

// startswith (suffix false) and endswith (true): any of the affixes given.
Method affix_method(bool suffix) {
  return [=](const std::string& s, CallArgs& a, const std::string& w) -> Value {
    BoundArgs b(a, {suffix ? "suffix" : "prefix"}, w);
    for (const auto& p : affixes(b.get(0), w, a.line)) {
      if (p.size() > s.size()) continue;
      if (s.compare(suffix ? s.size() - p.size() : 0, p.size(), p) == 0) return true;
    }
    return false;
  };
}

Value swapcase_method(const std::string& s) {
  const std::u32string cps = to_code_points(s);
  std::u32string out;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    const std::u32string up = upper_full(cps[i]);
    out += up != std::u32string(1, cps[i]) ? up : lower_at(cps, i);
  }
  return to_utf8(out);
}

Value count_method(const std::string& s, CallArgs& a, const std::string& w) {
  BoundArgs b(a, {"sub"}, w);
  const std::string sub = need_str(b.get(0), w, a.line);
  if (sub.empty()) return static_cast<std::int64_t>(to_code_points(s).size()) + 1;
  std::int64_t n = 0;
  for (std::size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

Value join_method(const std::string& s, CallArgs& a, const std::string& w) {
  BoundArgs b(a, {"iterable"}, w);
  std::string out;
  bool first = true;
  for (const Value& v : iterate(b.get(0), a.line)) {
    if (!first) out += s;
    first = false;
    out += need_str(v, w, a.line);
  }
  return out;
}

Value splitlines_method(const std::string& s, CallArgs& a, const std::string& w) {
  BoundArgs b(a, {"keepends"}, w);
  const bool keep = b.bool_or(0, false);
  std::vector<Value> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    std::size_t end = i;
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    out.emplace_back(s.substr(start, (keep ? i + 1 : end) - start));
    start = i + 1;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return Value::list(std::move(out));
}

Value remove_affix(const std::string& s, CallArgs& a, const std::string& w, bool suffix) {
  BoundArgs b(a, {suffix ? "suffix" : "prefix"}, w);
  const std::string p = need_str(b.get(0), w, a.line);
  if (!suffix) return s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s;
  const bool ends = !p.empty() && p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
  return ends ? s.substr(0, s.size() - p.size()) : s;
}

const std::map<std::string, Method>& methods() {
  using S = const std::string&;
  static const std::map<std::string, Method> m = {
      {"strip", strip_method(true, true)},
      {"lstrip", strip_method(true, false)},
      {"rstrip", strip_method(false, true)},
      {"split", [](S s, CallArgs& a, S w) -> Value {
         BoundArgs b(a, {"sep", "maxsplit"}, w);
         std::vector<Value> out;
         for (auto& part : py_split(s, b.get_or(0, None{}), b.int_or(1, -1, a.line), a.line)) out.emplace_back(part);
         return Value::list(std::move(out));
       }},
      {"startswith", affix_method(false)},
      {"endswith", affix_method(true)},
      {"upper", no_args([](S s) -> Value { return upper(s); })},
      {"lower", no_args([](S s) -> Value { return lower(s); })},
      {"casefold", no_args([](S s) -> Value { return lower(s); })},
      {"swapcase", no_args(swapcase_method)},
      {"title", no_args([](S s) -> Value { return py_title(s); })},
      {"capitalize", no_args([](S s) -> Value { return py_capitalize(s); })},
      {"replace", [](S s, CallArgs& a, S w) -> Value {
         BoundArgs b(a, {"old", "new", "count"}, w);
         return py_replace(s, need_str(b.get(0), w, a.line), need_str(b.get(1), w, a.line), b.int_or(2, -1, a.line),
                           a.line);
       }},
      {"find", [](S s, CallArgs& a, S w) { return find_like(s, a, w, false, false); }},
      {"rfind", [](S s, CallArgs& a, S w) { return find_like(s, a, w, true, false); }},
      {"index", [](S s, CallArgs& a, S w) { return find_like(s, a, w, false, true); }},
      {"rindex", [](S s, CallArgs& a, S w) { return find_like(s, a, w, true, true); }},
      {"count", count_method},
      {"join", join_method},
      {"splitlines", splitlines_method},
      {"isdigit", no_args([](S s) -> Value { return all_of_cps(s, py_isdigit); })},
      {"isalpha", no_args([](S s) -> Value { return all_of_cps(s, py_isalpha); })},
      {"isalnum", no_args([](S s) -> Value { return all_of_cps(s, py_isalnum); })},
      {"isspace", no_args([](S s) -> Value { return all_of_cps(s, py_isspace); })},
      {"isupper", no_args([](S s) -> Value { return case_test(s, true); })},
      {"islower", no_args([](S s) -> Value { return case_test(s, false); })},
      {"center", pad_method('c')},
      {"ljust", pad_method('l')},
      {"rjust", pad_method('r')},
      {"partition", [](S s, CallArgs& a, S w) { return partition(s, a, w, false); }},
      {"rpartition", [](S s, CallArgs& a, S w) { return partition(s, a, w, true); }},
      {"format", [](S s, CallArgs& a, S) { return format_method(s, a, false); }},
      {"format_map", [](S s, CallArgs& a, S) { return format_map_method(s, a, false); }},
      {"removeprefix", [](S s, CallArgs& a, S w) { return remove_affix(s, a, w, false); }},
      {"removesuffix", [](S s, CallArgs& a, S w) { return remove_affix(s, a, w, true); }},
  };
  return m;
}

// markupsafe's Markup methods: these escape their str arguments and give a Markup back.
const std::set<std::string> kMarkupEscaping = {"capitalize", "title",  "lower", "upper",  "replace", "ljust",   "rjust",
                                               "lstrip",     "rstrip", "center", "strip", "swapcase", "zfill",
                                               "partition",  "rpartition"};

Value as_markup(const Value& v) {
  if (v.is_string()) return Value::markup(v.as_string());
  if (!v.is_iterable_obj()) return v;
  std::vector<Value> items;
  for (const Value& x : v.as_list().items) items.push_back(as_markup(x));
  return Value::sequence(v.as_list().kind, std::move(items));
}

Value markup_method(const Value& self, const std::string& name, const Method& method, const std::string& what) {
  return Value::callable(what, [self, name, &method, what](Interpreter&, CallArgs& a) -> Value {
    const std::string& s = self.as_string();
    if (name == "format") return Value::markup(format_method(s, a, true).as_string());
    if (name == "format_map") return Value::markup(format_map_method(s, a, true).as_string());
    if (name == "join") {
      BoundArgs b(a, {"iterable"}, what);
      std::vector<Value> escaped;
      for (const Value& v : iterate(b.get(0), a.line)) escaped.emplace_back(escaped_text(v, a.line));
      CallArgs inner;
      inner.line = a.line;
      inner.positional.push_back(Value::list(std::move(escaped)));
      return Value::markup(method(s, inner, what).as_string());
    }
    const bool escaping = kMarkupEscaping.count(name) > 0;
    if (escaping) {
      for (Value& v : a.positional) v = v.is_string() ? Value(escaped_text(v, a.line)) : v;
      for (auto& kv : a.keyword) kv.second = kv.second.is_string() ? Value(escaped_text(kv.second, a.line)) : kv.second;
    }
    const Value result = method(s, a, what);
    const bool gives_markup = escaping || name == "split" || name == "rsplit" || name == "splitlines";
    return gives_markup ? as_markup(result) : result;
  });
}

}  // namespace

bool is_string_method(const std::string& name) { return kStrAttrs.count(name) > 0; }

Value string_method(const Value& self, const std::string& name) {
  const std::string what = "str." + name + "()";
  const auto it = methods().find(name);
  if (it == methods().end()) {
    return Value::callable(what, [what](Interpreter&, CallArgs& a) -> Value {
      throw TemplateError(what + " is not implemented", a.line);
    });
  }
  const Method& method = it->second;
  if (self.is_markup()) return markup_method(self, name, method, what);
  return Value::callable(what, [self, &method, what](Interpreter&, CallArgs& a) { return method(self.as_string(), a, what); });
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right, int line) {
  const std::u32string cps = to_code_points(s);
  std::u32string set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = to_code_points(need_str(chars, "strip", line));
  auto strip_it = [&](char32_t c) { return whitespace ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  std::size_t begin = 0;
  std::size_t end = cps.size();
  if (left) {
    while (begin < end && strip_it(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip_it(cps[end - 1])) --end;
  }
  return to_utf8(std::u32string_view(cps).substr(begin, end - begin));
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, std::int64_t maxsplit, int line) {
  std::vector<std::string> out;
  if (sep.is_none()) {  // runs of whitespace; no empty strings
    const std::u32string cps = to_code_points(s);
    std::size_t i = 0;
    while (true) {
      while (i < cps.size() && py_isspace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
        std::size_t end = cps.size();
        while (end > i && py_isspace(cps[end - 1])) --end;
        out.push_back(to_utf8(std::u32string_view(cps).substr(i, end - i)));
        break;
      }
      std::size_t j = i;
      while (j < cps.size() && !py_isspace(cps[j])) ++j;
      out.push_back(to_utf8(std::u32string_view(cps).substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string d = need_str(sep, "str.split()", line);
  if (d.empty()) throw TemplateError("empty separator", line);
  std::size_t start = 0;
  for (std::size_t p = s.find(d); p != std::string::npos; p = s.find(d, start)) {
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) break;
    out.push_back(s.substr(start, p - start));
    start = p + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

namespace {

// How many times py_replace puts in the new text (an empty `old`: before every character and
// at the end).
std::uint64_t replacements(const std::string& s, const std::string& old, std::int64_t count) {
  std::uint64_t n = 0;
  if (old.empty()) {
    n = to_code_points(s).size() + 1;
  } else {
    for (std::size_t p = s.find(old); p != std::string::npos; p = s.find(old, p + old.size())) ++n;
  }
  return count < 0 ? n : std::min(n, static_cast<std::uint64_t>(count));
}

}  // namespace

std::string py_replace(const std::string& s, const std::string& old, const std::string& with, std::int64_t count,
                       int line) {
  std::string out;
  std::int64_t done = 0;
  check_text_bytes(s.size() + replacements(s, old, count) * with.size(), line);
  if (old.empty()) {  // Python inserts `with` before every character and at the end
    const std::u32string cps = to_code_points(s);
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += to_utf8(std::u32string(1, c));
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  std::size_t start = 0;
  for (std::size_t p = s.find(old); p != std::string::npos && (count < 0 || done < count); p = s.find(old, start)) {
    out += s.substr(start, p - start) + with;
    start = p + old.size();
    ++done;
  }
  return out + s.substr(start);
}

std::string py_capitalize(const std::string& s) {
  const std::u32string cps = to_code_points(s);
  std::u32string out;
  for (std::size_t i = 0; i < cps.size(); ++i) out += i == 0 ? title_full(cps[i]) : lower_at(cps, i);
  return to_utf8(out);
}

std::string py_title(const std::string& s) {
  const std::u32string cps = to_code_points(s);
  std::u32string out;
  bool prev_cased = false;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    out += prev_cased ? lower_at(cps, i) : title_full(cps[i]);
    prev_cased = is_cased(cps[i]);
  }
  return to_utf8(out);
}

}  // namespace flexh2o::engine::chat
