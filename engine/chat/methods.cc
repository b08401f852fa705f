#include "engine/chat/methods.h"

#include <algorithm>
#include <map>
#include <set>

#include "engine/chat/args.h"
#include "engine/chat/string_methods.h"

namespace flexh2o::engine::chat {

namespace {

// Python's attributes of list and dict; the ones that modify are refused by the sandbox.
const std::set<std::string> kListAttrs = {"append", "clear", "copy",   "count", "extend", "index",
                                          "insert", "pop",   "remove", "reverse", "sort"};
const std::set<std::string> kListUnsafe = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
const std::set<std::string> kTupleAttrs = {"count", "index"};
const std::set<std::string> kDictAttrs = {"clear", "copy", "fromkeys", "get",    "items", "keys",
                                          "pop",   "popitem", "setdefault", "update", "values"};
const std::set<std::string> kDictUnsafe = {"clear", "pop", "popitem", "setdefault", "update"};

Value missing(const Value& obj, const std::string& name) {
  return Undefined{std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'"};
}

Value unsafe(const Value& obj, const std::string& name) {
  return Undefined{"access to attribute '" + name + "' of '" + type_name(obj) +
                       "' object is unsafe.",
                   true};
}

Value list_method(const Value& self, const std::string& name) {
  const std::string what = type_name(self) + "." + name + "()";
  if (name == "count" || name == "index") {
    return Value::callable(what, [self, name, what](Interpreter&, CallArgs& a) -> Value {
      BoundArgs b(a, {"value"}, what);
      const auto& items = self.as_list().items;
      std::int64_t n = 0;
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (!equals(items[i], b.get(0))) continue;
        if (name == "index") return static_cast<std::int64_t>(i);
        ++n;
      }
      if (name == "index") throw TemplateError("value is not in " + type_name(self), a.line);
      return n;
    });
  }
  return Value::callable(what, [self, what](Interpreter&, CallArgs& a) -> Value {
    BoundArgs b(a, {}, what);
    return Value::list(self.as_list().items);
  });
}

Value dict_method(const Value& self, const std::string& name) {
  const std::string what = "dict." + name + "()";
  if (name == "get") {
    return Value::callable(what, [self, what](Interpreter&, CallArgs& a) -> Value {
      BoundArgs b(a, {"key", "default"}, what);
      if (!b.has(0)) throw TemplateError(what + " needs a key", a.line);
      const Value* v = self.as_dict().find(b.get(0));
      return v ? *v : b.get_or(1, Value(None{}));
    });
  }
  if (name == "items" || name == "keys" || name == "values" || name == "copy") {
    return Value::callable(what, [self, name, what](Interpreter&, CallArgs& a) -> Value {
      BoundArgs b(a, {}, what);
      if (name == "copy") {
        Value d = Value::dict();
        d.as_dict().items = self.as_dict().items;
        return d;
      }
      std::vector<Value> out;
      for (const auto& [k, v] : self.as_dict().items) {
        out.push_back(name == "items" ? Value::tuple({k, v}) : name == "keys" ? k : v);
      }
      const SeqKind kind = name == "items" ? SeqKind::DictItems : name == "keys" ? SeqKind::DictKeys : SeqKind::DictValues;
      return Value::sequence(kind, std::move(out));
    });
  }
  return Value::callable(what, [what](Interpreter&, CallArgs& a) -> Value {
    throw TemplateError(what + " is not implemented", a.line);
  });
}

Value index_sequence(const Value& obj, std::int64_t i) {
  if (obj.is_string()) {
    const std::u32string cps = to_code_points(obj.as_string());
    const auto n = static_cast<std::int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Undefined{"string index out of range"};
    std::string c = to_utf8(cps.substr(static_cast<std::size_t>(i), 1));
    return obj.is_markup() ? Value::markup(std::move(c)) : Value(std::move(c));
  }
  const auto& items = obj.as_list().items;
  const auto n = static_cast<std::int64_t>(items.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return Undefined{type_name(obj) + " index out of range"};
  return items[static_cast<std::size_t>(i)];
}

}  // namespace

Value get_attribute(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  if (obj.is_object()) {
    const Value* v = obj.as_object().find(name);
    return v ? *v : missing(obj, name);
  }
  if (obj.is_string()) return is_string_method(name) ? string_method(obj, name) : missing(obj, name);
  if (obj.is_callable()) {
    for (const auto& [key, value] : obj.as_callable().attributes) {
      if (key == name) return value;
    }
  }
  if (obj.is_list() && kListAttrs.count(name)) return kListUnsafe.count(name) ? unsafe(obj, name) : list_method(obj, name);
  if (obj.is_tuple() && kTupleAttrs.count(name)) return list_method(obj, name);
  if (obj.is_dict()) {
    if (kDictAttrs.count(name)) return kDictUnsafe.count(name) ? unsafe(obj, name) : dict_method(obj, name);
    const Value* v = obj.as_dict().find(Value(name));
    return v ? *v : missing(obj, name);
  }
  return missing(obj, name);
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(key)) return *v;
  } else if ((obj.is_sequence_obj() || obj.is_string() || obj.is_kind(SeqKind::Range)) && is_integral(key)) {
    return index_sequence(obj, to_int64(key));
  }
  if (key.is_string()) return get_attribute(obj, key.as_string(), line);
  if (obj.is_dict()) return Undefined{"'dict object' has no attribute " + to_repr(key, line)};
  return Undefined{std::string("'") + type_name(obj) + " object' has no item " + to_repr(key, line)};
}

namespace {

std::int64_t slice_bound(const Value& v, int line) {
  if (!is_integral(v)) {
    if (v.is_undefined()) fail_undefined(v, line);
    throw TemplateError("slice indices must be integers or None, not " + type_name(v), line);
  }
  return to_int64(v);
}

// Python's slice.indices(): the positions obj[start:stop:step] visits.
std::vector<std::size_t> slice_positions(std::int64_t n, const Value& start_v, const Value& stop_v,
                                         const Value& step_v, int line) {
  const std::int64_t step = step_v.is_none() ? 1 : slice_bound(step_v, line);
  if (step == 0) throw TemplateError("slice step cannot be zero", line);
  auto clamp = [&](const Value& v, std::int64_t fallback) {
    if (v.is_none()) return fallback;
    std::int64_t i = slice_bound(v, line);
    if (i < 0) i += n;
    if (step > 0) return std::clamp<std::int64_t>(i, 0, n);
    return std::clamp<std::int64_t>(i, -1, n - 1);
  };
  const std::int64_t start = clamp(start_v, step > 0 ? 0 : n - 1);
  const std::int64_t stop = clamp(stop_v, step > 0 ? n : -1);
  std::vector<std::size_t> out;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(static_cast<std::size_t>(i));
  return out;
}

}  // namespace

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  if (obj.is_string()) {
    const std::u32string cps = to_code_points(obj.as_string());
    std::u32string out;
    for (std::size_t i : slice_positions(static_cast<std::int64_t>(cps.size()), start, stop, step, line)) out += cps[i];
    return obj.is_markup() ? Value::markup(to_utf8(out)) : Value(to_utf8(out));
  }
  if (!obj.is_sequence_obj()) throw TemplateError("'" + type_name(obj) + "' object is not subscriptable", line);
  const auto& items = obj.as_list().items;
  std::vector<Value> out;
  for (std::size_t i : slice_positions(static_cast<std::int64_t>(items.size()), start, stop, step, line)) {
    out.push_back(items[i]);
  }
  return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

}  // namespace flexh2o::engine::chat
