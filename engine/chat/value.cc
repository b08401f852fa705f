#include "engine/chat/value.h"

#include <cmath>

#include "engine/chat/text.h"

namespace flexh2o::engine::chat {

void check_text_bytes(std::uint64_t bytes, int line) {
  if (bytes > kMaxTextBytes)
    throw TemplateError("the template would make a string of " + std::to_string(bytes) + " bytes, more than " +
                            std::to_string(kMaxTextBytes) + "; stopped",
                        line);
}

const Value* DictObj::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

void DictObj::set(const Value& key, Value v) {
  for (auto& [k, old] : items) {
    if (equals(k, key)) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* Object::find(const std::string& name) const {
  for (const auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Object::set(const std::string& name, Value v) {
  for (auto& [k, old] : attrs) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  attrs.emplace_back(name, std::move(v));
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

Value Value::list(std::vector<Value> items) {
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  return Value(std::move(l));
}

Value Value::tuple(std::vector<Value> items) { return sequence(SeqKind::Tuple, std::move(items)); }

Value Value::sequence(SeqKind kind, std::vector<Value> items) {
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  l->kind = kind;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<DictObj>()); }

Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->call = std::move(fn);
  return Value(std::move(c));
}

namespace {
thread_local int nesting = 0;
}  // namespace

NestingGuard::NestingGuard(int line) {
  if (++nesting > kMaxNesting) {
    --nesting;
    throw TemplateError("a value is nested more than " + std::to_string(kMaxNesting) + " levels deep (or contains itself)",
                        line);
  }
}

NestingGuard::~NestingGuard() { --nesting; }

std::string type_name(const Value& v) {
  struct Namer {
    std::string operator()(const Undefined&) const { return "Undefined"; }
    std::string operator()(const None&) const { return "NoneType"; }
    std::string operator()(bool) const { return "bool"; }
    std::string operator()(std::int64_t) const { return "int"; }
    std::string operator()(double) const { return "float"; }
    std::string operator()(const std::string&) const { return "str"; }
    std::string operator()(const Value::ListPtr& l) const {
      switch (l->kind) {
        case SeqKind::List: return "list";
        case SeqKind::Tuple: return "tuple";
        case SeqKind::Iterator: return "generator";
        case SeqKind::DictItems: return "dict_items";
        case SeqKind::DictKeys: return "dict_keys";
        case SeqKind::DictValues: return "dict_values";
        case SeqKind::Range: return "range";
      }
      return "list";
    }
    std::string operator()(const Value::DictPtr&) const { return "dict"; }
    std::string operator()(const Value::ObjectPtr& o) const { return o->type_name; }
    std::string operator()(const Value::CallablePtr&) const { return "function"; }
  };
  return std::visit(Namer{}, v.data());
}

bool truthy(const Value& v) {
  struct Truth {
    bool operator()(const Undefined&) const { return false; }
    bool operator()(const None&) const { return false; }
    bool operator()(bool b) const { return b; }
    bool operator()(std::int64_t i) const { return i != 0; }
    bool operator()(double d) const { return d != 0.0; }
    bool operator()(const std::string& s) const { return !s.empty(); }
    bool operator()(const Value::ListPtr& l) const { return l->kind == SeqKind::Iterator || !l->items.empty(); }
    bool operator()(const Value::DictPtr& d) const { return !d->items.empty(); }
    bool operator()(const Value::ObjectPtr&) const { return true; }
    bool operator()(const Value::CallablePtr&) const { return true; }
  };
  return std::visit(Truth{}, v.data());
}

bool is_integral(const Value& v) { return v.is_bool() || v.is_int(); }

std::int64_t to_int64(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }

double to_double(const Value& v) { return v.is_float() ? v.as_float() : static_cast<double>(to_int64(v)); }

namespace {

bool dicts_equal(const DictObj& a, const DictObj& b) {
  if (a.items.size() != b.items.size()) return false;
  for (const auto& [k, v] : a.items) {
    const Value* other = b.find(k);
    if (!other || !equals(v, *other)) return false;
  }
  return true;
}

bool sequences_equal(const ListObj& a, const ListObj& b) {
  // Generators and dict values compare by identity, as in Python.
  if (a.kind != b.kind || a.kind == SeqKind::Iterator || a.kind == SeqKind::DictValues) return false;
  if (a.items.size() != b.items.size()) return false;
  for (std::size_t i = 0; i < a.items.size(); ++i) {
    if (!equals(a.items[i], b.items[i])) return false;
  }
  return true;
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  const NestingGuard guard(0);
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return to_int64(a) == to_int64(b);
    return to_double(a) == to_double(b);
  }
  if (a.data().index() != b.data().index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.as_string() == b.as_string();
  if (a.is_iterable_obj()) return &a.as_list() == &b.as_list() || sequences_equal(a.as_list(), b.as_list());
  if (a.is_dict()) return &a.as_dict() == &b.as_dict() || dicts_equal(a.as_dict(), b.as_dict());
  if (a.is_object()) return a.object_ptr() == b.object_ptr();
  return a.callable_ptr() == b.callable_ptr();
}

bool less_than(const Value& a, const Value& b, int line) {
  const NestingGuard guard(line);
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return to_int64(a) < to_int64(b);
    return to_double(a) < to_double(b);
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 bytes order as code points
  if (a.is_sequence_obj() && b.is_sequence_obj() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less_than(x[i], y[i], line);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) fail_undefined(a, line);
  if (b.is_undefined()) fail_undefined(b, line);
  throw TemplateError("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'",
                      line);
}

namespace {

std::string join_reprs(const std::vector<Value>& items, int line) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(items[i], line);
  }
  return out;
}

std::string sequence_repr(const ListObj& l, int line) {
  const bool tuple = l.kind == SeqKind::Tuple;
  std::string out(tuple ? "(" : "[");
  out += join_reprs(l.items, line);
  if (tuple && l.items.size() == 1) out += ",";
  out += tuple ? ")" : "]";
  switch (l.kind) {
    case SeqKind::DictItems: return "dict_items(" + out + ")";
    case SeqKind::DictKeys: return "dict_keys(" + out + ")";
    case SeqKind::DictValues: return "dict_values(" + out + ")";
    case SeqKind::Range: {
      std::string r = "range(" + std::to_string(l.range_start) + ", " + std::to_string(l.range_stop);
      if (l.range_step != 1) r += ", " + std::to_string(l.range_step);
      return r + ")";
    }
    case SeqKind::Iterator:
      // Python prints the generator's address: no text to match, so refuse.
      throw TemplateError("cannot print a generator (what map, select, reject, unique, items and reverse give); "
                          "add | list",
                          line);
    default:
      return out;
  }
}

std::string dict_repr(const DictObj& d, int line) {
  std::string out = "{";
  for (std::size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(d.items[i].first, line) + ": " + to_repr(d.items[i].second, line);
  }
  return out + "}";
}

std::string object_repr(const Object& o, int line) {
  if (!o.assignable) throw TemplateError("cannot print a " + o.type_name + " object", line);
  std::string out = "<Namespace {";
  for (std::size_t i = 0; i < o.attrs.size(); ++i) {
    if (i) out += ", ";
    out += string_repr(o.attrs[i].first) + ": " + to_repr(o.attrs[i].second, line);
  }
  return out + "}>";
}

}  // namespace

std::string to_str(const Value& v, int line) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.as_string();
  return to_repr(v, line);
}

std::string to_repr(const Value& v, int line) {
  const NestingGuard guard(line);
  if (v.is_undefined()) return "Undefined";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_string()) return string_repr(v.as_string());
  if (v.is_iterable_obj()) return sequence_repr(v.as_list(), line);
  if (v.is_dict()) return dict_repr(v.as_dict(), line);
  if (v.is_object()) return object_repr(v.as_object(), line);
  // Python would print the function's address: no text to match, so refuse.
  throw TemplateError("cannot print " + v.as_callable().name + " (a function; call it with ())", line);
}

std::vector<Value> iterate(const Value& v, int line) {
  if (v.is_undefined()) return {};
  if (v.is_iterable_obj()) return v.as_list().items;
  std::vector<Value> out;
  if (v.is_dict()) {
    for (const auto& kv : v.as_dict().items) out.push_back(kv.first);
    return out;
  }
  if (v.is_string()) {
    for (char32_t c : to_code_points(v.as_string())) out.emplace_back(to_utf8(std::u32string(1, c)));
    return out;
  }
  throw TemplateError("'" + type_name(v) + "' object is not iterable", line);
}

bool contains(const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (!item.is_string()) {
      if (item.is_undefined()) fail_undefined(item, line);
      throw TemplateError("'in <string>' requires string as left operand, not " + type_name(item), line);
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return container.as_dict().find(item) != nullptr;
  if (container.is_undefined()) return false;
  if (!container.is_iterable_obj()) {
    throw TemplateError("argument of type '" + type_name(container) + "' is not iterable", line);
  }
  for (const Value& v : container.as_list().items) {
    if (equals(v, item)) return true;
  }
  return false;
}

std::string escaped_text(const Value& v, int line) {
  return v.is_markup() ? v.as_string() : html_escape(to_str(v, line));
}

void fail_undefined(const Value& v, int line) {
  const Undefined& u = v.as_undefined();
  if (u.unsafe) throw TemplateError(u.hint, line);
  throw TemplateError(u.hint.empty() ? "a value is undefined" : u.hint, line);
}

}  // namespace flexh2o::engine::chat
