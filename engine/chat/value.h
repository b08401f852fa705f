// The values a chat template computes with, modelled on the Python objects jinja2 works on:
// None, bool, int, float, str, list, tuple, dict (insertion-ordered), jinja2's Undefined,
// namespace and loop objects, and callables (macros, methods, globals). Lists, dicts and
// objects are shared by reference, as in Python.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace flexh2o::engine::chat {

// An error while parsing or rendering a template; `line` is the template line (0: none known).
class TemplateError : public std::runtime_error {
 public:
  TemplateError(const std::string& what, int line) : std::runtime_error(what), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

// The most bytes one string a template makes may take (RenderLimits::max_output's default):
// padding, indenting and replacing check what they would make against it before allocating,
// so that center(3e9) is an error, not 3 GB.
constexpr std::uint64_t kMaxTextBytes = std::uint64_t{64} << 20;
// Throws TemplateError when `bytes` is more than kMaxTextBytes.
void check_text_bytes(std::uint64_t bytes, int line);

class Value;
class Interpreter;

// jinja2's default Undefined: prints as "", is false, iterates as empty; most other uses fail
// with `hint` (what was missing). `unsafe` marks a method the immutable sandbox refuses.
struct Undefined {
  std::string hint;
  bool unsafe = false;
};
struct None {};

// What a sequence is beyond its items: Python's list and tuple, or what jinja2's filters and
// dict methods give back: a generator (always true, no len(), no indexing, not printable),
// a dict view (printed "dict_items([...])") or a range.
enum class SeqKind { List, Tuple, Iterator, DictItems, DictKeys, DictValues, Range };

struct ListObj {
  std::vector<Value> items;
  SeqKind kind = SeqKind::List;
  std::int64_t range_start = 0, range_stop = 0, range_step = 1;  // kind Range: how it prints
};

struct DictObj {
  std::vector<std::pair<Value, Value>> items;  // insertion order, keys unique by Python ==
  const Value* find(const Value& key) const;
  void set(const Value& key, Value v);
};

// An object with named attributes: jinja2's namespace() (assignable) or a loop object.
struct Object {
  std::string type_name;  // "Namespace", "LoopContext"
  bool assignable = false;
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value v);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  int line = 0;
};

struct Callable {
  std::string name;  // for messages: "raise_exception", "str.split", "macro render_type"
  std::function<Value(Interpreter&, CallArgs&)> call;
  std::vector<std::pair<std::string, Value>> attributes;  // e.g. transformers' dict.fromkeys
};

class Value {
 public:
  using ListPtr = std::shared_ptr<ListObj>;
  using DictPtr = std::shared_ptr<DictObj>;
  using ObjectPtr = std::shared_ptr<Object>;
  using CallablePtr = std::shared_ptr<Callable>;
  using Data = std::variant<Undefined, None, bool, std::int64_t, double, std::string, ListPtr, DictPtr, ObjectPtr,
                            CallablePtr>;

  Value() = default;
  Value(Undefined u) : data_(std::move(u)) {}
  Value(None) : data_(None{}) {}
  Value(bool b) : data_(b) {}
  Value(std::int64_t i) : data_(i) {}
  Value(int i) : data_(std::int64_t{i}) {}
  Value(double d) : data_(d) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(ListPtr l) : data_(std::move(l)) {}
  Value(DictPtr d) : data_(std::move(d)) {}
  Value(ObjectPtr o) : data_(std::move(o)) {}
  Value(CallablePtr c) : data_(std::move(c)) {}

  // jinja2's Markup: a str marked safe (`| safe`, `| escape`); a plain str added to it, or
  // formatted into it, is HTML-escaped first, and its str methods give Markup back.
  static Value markup(std::string s);
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value sequence(SeqKind kind, std::vector<Value> items);
  static Value dict();
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  const Data& data() const { return data_; }
  bool is_undefined() const { return std::holds_alternative<Undefined>(data_); }
  bool is_none() const { return std::holds_alternative<None>(data_); }
  bool is_bool() const { return std::holds_alternative<bool>(data_); }
  bool is_int() const { return std::holds_alternative<std::int64_t>(data_); }  // not bool
  bool is_float() const { return std::holds_alternative<double>(data_); }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python's numbers.Number
  bool is_string() const { return std::holds_alternative<std::string>(data_); }  // Markup too
  bool is_markup() const { return markup_; }
  bool is_list() const { return is_kind(SeqKind::List); }
  bool is_tuple() const { return is_kind(SeqKind::Tuple); }
  bool is_sequence_obj() const { return is_list() || is_tuple(); }
  bool is_iterator() const { return is_kind(SeqKind::Iterator); }
  bool is_iterable_obj() const { return std::holds_alternative<ListPtr>(data_); }  // any SeqKind
  bool is_kind(SeqKind k) const { return std::holds_alternative<ListPtr>(data_) && as_list().kind == k; }
  bool is_dict() const { return std::holds_alternative<DictPtr>(data_); }
  bool is_object() const { return std::holds_alternative<ObjectPtr>(data_); }
  bool is_callable() const { return std::holds_alternative<CallablePtr>(data_); }

  bool as_bool() const { return std::get<bool>(data_); }
  std::int64_t as_int() const { return std::get<std::int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  ListObj& as_list() const { return *std::get<ListPtr>(data_); }
  DictObj& as_dict() const { return *std::get<DictPtr>(data_); }
  Object& as_object() const { return *std::get<ObjectPtr>(data_); }
  Callable& as_callable() const { return *std::get<CallablePtr>(data_); }
  const Undefined& as_undefined() const { return std::get<Undefined>(data_); }
  const ObjectPtr& object_ptr() const { return std::get<ObjectPtr>(data_); }
  const CallablePtr& callable_ptr() const { return std::get<CallablePtr>(data_); }

 private:
  Data data_;
  bool markup_ = false;
};

// Counts nesting while walking a value (printing, comparing, converting): a value nested deeper
// than kMaxNesting (or a namespace that holds itself) is an error, not a stack overflow.
constexpr int kMaxNesting = 1000;
class NestingGuard {
 public:
  explicit NestingGuard(int line);
  ~NestingGuard();
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

// Python's type name of the value, for messages ('str', 'dict', 'NoneType', ...).
std::string type_name(const Value& v);
// Python's truth value (Undefined is false).
bool truthy(const Value& v);
// Python's ==, with Undefined equal only to Undefined.
bool equals(const Value& a, const Value& b);
// Python's <; throws TemplateError for types Python cannot order.
bool less_than(const Value& a, const Value& b, int line);
// Python's str() and repr(); throws for what jinja2 would print as an object address.
std::string to_str(const Value& v, int line);
std::string to_repr(const Value& v, int line);
// Numbers as doubles, for arithmetic on mixed int/float (bool counts as int).
double to_double(const Value& v);
bool is_integral(const Value& v);  // bool or int
std::int64_t to_int64(const Value& v);  // of an integral value

// Python's iter(): list and tuple items, dict keys, the characters of a str; Undefined is empty.
std::vector<Value> iterate(const Value& v, int line);
// Python's `item in container`.
bool contains(const Value& container, const Value& item, int line);

// markupsafe's escape(v) as text: a Markup as it is, anything else str() then HTML-escaped.
std::string escaped_text(const Value& v, int line);

// The error jinja2 raises on using an undefined value.
[[noreturn]] void fail_undefined(const Value& v, int line);

}  // namespace flexh2o::engine::chat
