#include "engine/chat/globals.h"

#include <vector>

#include "engine/chat/args.h"

namespace flexh2o::engine::chat {

namespace {

constexpr std::int64_t kMaxRange = 100000;  // jinja2's sandbox refuses larger ranges

Value range_global(Interpreter&, CallArgs& a) {
  BoundArgs b(a, {"start", "stop", "step"}, "range()");
  if (!b.has(0)) throw TemplateError("range expected at least 1 argument, got 0", a.line);
  std::int64_t start = 0;
  std::int64_t stop = b.int_or(0, 0, a.line);
  if (b.has(1)) {
    start = stop;
    stop = b.int_or(1, 0, a.line);
  }
  const std::int64_t step = b.int_or(2, 1, a.line);
  if (step == 0) throw TemplateError("range() arg 3 must not be zero", a.line);
  std::vector<Value> out;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<std::int64_t>(out.size()) >= kMaxRange) {
      throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).", a.line);
    }
    out.emplace_back(i);
  }
  Value r = Value::sequence(SeqKind::Range, std::move(out));
  r.as_list().range_start = start;
  r.as_list().range_stop = stop;
  r.as_list().range_step = step;
  return r;
}

// dict(mapping or pairs, **kwargs) and namespace(...) take the same arguments.
std::vector<std::pair<Value, Value>> dict_items(CallArgs& a, const char* what) {
  if (a.positional.size() > 1) throw TemplateError(std::string(what) + " expected at most 1 positional argument", a.line);
  std::vector<std::pair<Value, Value>> items;
  auto put = [&](const Value& k, const Value& v) {
    for (auto& [ok, ov] : items) {
      if (equals(ok, k)) {
        ov = v;
        return;
      }
    }
    items.emplace_back(k, v);
  };
  if (!a.positional.empty()) {
    const Value& src = a.positional[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.as_dict().items) put(k, v);
    } else {
      for (const Value& pair : iterate(src, a.line)) {
        const std::vector<Value> kv = iterate(pair, a.line);
        if (kv.size() != 2) throw TemplateError(std::string(what) + ": each item must be a pair", a.line);
        put(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.keyword) put(Value(k), v);
  return items;
}

Value namespace_global(Interpreter& in, CallArgs& a) {
  auto o = std::make_shared<Object>();
  in.adopt_namespace(o);
  o->type_name = "Namespace";
  o->assignable = true;
  for (auto& [k, v] : dict_items(a, "namespace()")) {
    if (!k.is_string()) throw TemplateError("namespace() attribute names must be strings", a.line);
    if (!k.as_string().empty() && k.as_string()[0] == '_') {
      throw TemplateError("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                              k.as_string() + "'. Please rename the attribute.",
                          a.line);
    }
    o->set(k.as_string(), v);
  }
  return Value(std::move(o));
}

Value dict_global(Interpreter&, CallArgs& a) {
  Value d = Value::dict();
  d.as_dict().items = dict_items(a, "dict()");
  return d;
}

// transformers' TemplateDict: dict(...) and dict.fromkeys(iterable, value=None).
Value dict_fromkeys(Interpreter&, CallArgs& a) {
  if (!a.keyword.empty()) throw TemplateError("dict.fromkeys() takes no keyword arguments", a.line);
  if (a.positional.empty()) throw TemplateError("fromkeys expected at least 1 argument, got 0", a.line);
  if (a.positional.size() > 2) {
    throw TemplateError("fromkeys expected at most 2 arguments, got " + std::to_string(a.positional.size()), a.line);
  }
  const Value value = a.positional.size() == 2 ? a.positional[1] : Value(None{});
  Value d = Value::dict();
  for (const Value& key : iterate(a.positional[0], a.line)) d.as_dict().set(key, value);
  return d;
}

Value raise_exception(Interpreter&, CallArgs& a) {
  const std::string message = a.positional.empty() ? "" : to_str(a.positional[0], a.line);
  throw TemplateError(message, a.line);
}

std::tm local_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

Value not_implemented(Interpreter&, CallArgs& a, const char* name) {
  throw TemplateError(std::string(name) + "() is not implemented", a.line);
}

}  // namespace

std::string format_time(const std::string& format, const std::tm& t, int line) {
  std::string fmt;
  for (std::size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      const char c = format[i + 1];
      if (c == 'f') {
        fmt += "000000";
        ++i;
        continue;
      }
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      fmt += format.substr(i, 2);
      ++i;
      continue;
    }
    fmt += format[i];
  }
  if (fmt.empty()) return "";
  std::vector<char> buf(256 + fmt.size() * 8);
  const std::size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
  if (n == 0) throw TemplateError("strftime_now: cannot format '" + format + "'", line);
  return std::string(buf.data(), n);
}

void add_globals(Scope& scope, const std::optional<std::tm>& now) {
  scope.set("range", Value::callable("range", range_global));
  Value dict = Value::callable("dict", dict_global);
  dict.as_callable().attributes.emplace_back("fromkeys", Value::callable("dict.fromkeys", dict_fromkeys));
  scope.set("dict", dict);
  scope.set("namespace", Value::callable("namespace", namespace_global));
  scope.set("raise_exception", Value::callable("raise_exception", raise_exception));
  scope.set("strftime_now", Value::callable("strftime_now", [now](Interpreter&, CallArgs& a) -> Value {
    BoundArgs b(a, {"format"}, "strftime_now()");
    if (!b.has(0)) throw TemplateError("strftime_now() missing required argument: 'format'", a.line);
    return format_time(b.string_or(0, "", a.line), now ? *now : local_now(), a.line);
  }));
  for (const char* name : {"lipsum", "cycler", "joiner"}) {
    scope.set(name, Value::callable(name, [name](Interpreter& in, CallArgs& a) { return not_implemented(in, a, name); }));
  }
}

}  // namespace flexh2o::engine::chat
