#include "engine/chat/json_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/chat/text.h"

namespace flexh2o::engine::chat {

Value from_json(const nlohmann::ordered_json& j) {
  const NestingGuard guard(0);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) {
        throw TemplateError("integer " + std::to_string(u) + " is too large (the limit is 2^63-1)", 0);
      }
      return Value(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      // A JSON object's keys are distinct strings: appended as they are, not each looked up
      // among those before it (a scan per key, quadratic in a large object).
      Value d = Value::dict();
      for (const auto& [k, v] : j.items()) d.as_dict().items.emplace_back(Value(k), from_json(v));
      return d;
    }
    default:
      throw TemplateError("unsupported JSON value (binary data)", 0);
  }
}

namespace {

void append_escaped(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : to_code_points(s)) {
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {  // a surrogate pair, as Python writes it
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      out += to_utf8(std::u32string(1, c));
    }
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

// A dict key as json.dumps turns it into a string.
std::string key_text(const Value& k, int line) {
  if (k.is_string()) return k.as_string();
  if (k.is_bool()) return k.as_bool() ? "true" : "false";
  if (k.is_int()) return std::to_string(k.as_int());
  if (k.is_float()) return float_json(k.as_float());
  if (k.is_none()) return "null";
  throw TemplateError("keys must be str, int, float, bool or None, not " + type_name(k), line);
}

class JsonWriter {
 public:
  JsonWriter(const JsonDumpOptions& opt, int line) : opt_(opt), line_(line) {}

  void write(const Value& v, int depth) {
    if (depth > 200) throw TemplateError("tojson: value nested too deeply", line_);
    if (v.is_none()) out_ += "null";
    else if (v.is_bool()) out_ += v.as_bool() ? "true" : "false";
    else if (v.is_int()) out_ += std::to_string(v.as_int());
    else if (v.is_float()) out_ += float_json(v.as_float());
    else if (v.is_string()) append_escaped(out_, v.as_string(), opt_.ensure_ascii);
    else if (v.is_sequence_obj()) write_list(v.as_list(), depth);
    else if (v.is_dict()) write_dict(v.as_dict(), depth);
    else throw TemplateError("Object of type " + type_name(v) + " is not JSON serializable", line_);
  }

  std::string take() { return std::move(out_); }

 private:
  void newline(int depth) {
    if (!opt_.indent) return;
    out_ += '\n';
    for (int i = 0; i < depth; ++i) out_ += *opt_.indent;
  }

  void write_list(const ListObj& l, int depth) {
    if (l.items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (std::size_t i = 0; i < l.items.size(); ++i) {
      if (i) out_ += opt_.item_separator;
      newline(depth + 1);
      write(l.items[i], depth + 1);
    }
    newline(depth);
    out_ += ']';
  }

  void write_dict(const DictObj& d, int depth) {
    if (d.items.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> entries;
    for (const auto& [k, v] : d.items) entries.emplace_back(key_text(k, line_), &v);
    if (opt_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out_ += '{';
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (i) out_ += opt_.item_separator;
      newline(depth + 1);
      append_escaped(out_, entries[i].first, opt_.ensure_ascii);
      out_ += opt_.key_separator;
      write(*entries[i].second, depth + 1);
    }
    newline(depth);
    out_ += '}';
  }

  const JsonDumpOptions& opt_;
  int line_;
  std::string out_;
};

}  // namespace

std::string dump_json(const Value& v, const JsonDumpOptions& opt, int line) {
  JsonWriter w(opt, line);
  w.write(v, 0);
  return w.take();
}

}  // namespace flexh2o::engine::chat
