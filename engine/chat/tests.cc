#include "engine/chat/tests.h"

#include <functional>
#include <map>

#include "engine/chat/args.h"
#include "engine/chat/filters.h"
#include "engine/chat/text.h"

namespace flexh2o::engine::chat {

namespace {

using Test = std::function<bool(const Value& v, const BoundArgs& b, int line)>;

struct TestDef {
  std::vector<std::string> params;
  Test test;
};

bool compare_test(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "eq") return equals(a, b);
  if (op == "ne") return !equals(a, b);
  if (op == "lt") return less_than(a, b, line);
  if (op == "le") return less_than(a, b, line) || equals(a, b);
  if (op == "gt") return less_than(b, a, line);
  return less_than(b, a, line) || equals(a, b);
}

std::int64_t need_int(const Value& v, const char* test, int line) {
  if (v.is_undefined()) fail_undefined(v, line);
  if (!is_integral(v)) throw TemplateError(std::string("test '") + test + "' needs an integer, got " + type_name(v), line);
  return to_int64(v);
}

bool case_is(const Value& v, bool want_upper) {
  if (!v.is_string()) return false;
  bool any = false;
  for (char32_t c : to_code_points(v.as_string())) {
    if (py_upper(c) == py_lower(c)) continue;
    any = true;
    if ((want_upper && c != py_upper(c)) || (!want_upper && c != py_lower(c))) return false;
  }
  return any;
}

Test comparison(const std::string& op) {
  return [op](const Value& v, const BoundArgs& b, int line) { return compare_test(op, v, b.get(0), line); };
}

const std::map<std::string, TestDef>& tests() {
  static const std::map<std::string, TestDef> t = {
      {"defined", {{}, [](const Value& v, const BoundArgs&, int) { return !v.is_undefined(); }}},
      {"undefined", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_undefined(); }}},
      {"none", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_none(); }}},
      {"boolean", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_bool(); }}},
      {"true", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_bool() && v.as_bool(); }}},
      {"false", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_bool() && !v.as_bool(); }}},
      {"integer", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_int(); }}},
      {"float", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_float(); }}},
      {"number", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_number(); }}},
      {"string", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_string(); }}},
      {"mapping", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_dict(); }}},
      // Python: iter(x) works (Undefined iterates as empty); len(x) and x[...] for sequence.
      {"iterable", {{}, [](const Value& v, const BoundArgs&, int) {
         return v.is_undefined() || v.is_string() || v.is_iterable_obj() || v.is_dict();
       }}},
      {"sequence", {{}, [](const Value& v, const BoundArgs&, int) {
         return v.is_undefined() || v.is_string() || v.is_sequence_obj() || v.is_kind(SeqKind::Range) || v.is_dict();
       }}},
      {"callable", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_callable(); }}},
      {"escaped", {{}, [](const Value&, const BoundArgs&, int) { return false; }}},
      {"lower", {{}, [](const Value& v, const BoundArgs&, int) { return case_is(v, false); }}},
      {"upper", {{}, [](const Value& v, const BoundArgs&, int) { return case_is(v, true); }}},
      {"odd", {{}, [](const Value& v, const BoundArgs&, int line) { return need_int(v, "odd", line) % 2 != 0; }}},
      {"even", {{}, [](const Value& v, const BoundArgs&, int line) { return need_int(v, "even", line) % 2 == 0; }}},
      {"divisibleby", {{"num"}, [](const Value& v, const BoundArgs& b, int line) {
         const std::int64_t d = need_int(b.get(0), "divisibleby", line);
         if (d == 0) throw TemplateError("integer division or modulo by zero", line);
         return need_int(v, "divisibleby", line) % d == 0;
       }}},
      {"sameas", {{"other"}, [](const Value& v, const BoundArgs& b, int) {
         const Value& o = b.get(0);
         if (v.is_none() || v.is_bool() || v.is_undefined()) return v.data().index() == o.data().index() && equals(v, o);
         if (v.is_iterable_obj() && o.is_iterable_obj()) return &v.as_list() == &o.as_list();
         if (v.is_dict() && o.is_dict()) return &v.as_dict() == &o.as_dict();
         return false;
       }}},
      {"in", {{"seq"}, [](const Value& v, const BoundArgs& b, int line) { return contains(b.get(0), v, line); }}},
      {"filter", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_string() && is_jinja_filter(v.as_string()); }}},
      {"test", {{}, [](const Value& v, const BoundArgs&, int) { return v.is_string() && is_jinja_test(v.as_string()); }}},
      {"eq", {{"other"}, comparison("eq")}},
      {"equalto", {{"other"}, comparison("eq")}},
      {"==", {{"other"}, comparison("eq")}},
      {"ne", {{"other"}, comparison("ne")}},
      {"!=", {{"other"}, comparison("ne")}},
      {"lt", {{"other"}, comparison("lt")}},
      {"lessthan", {{"other"}, comparison("lt")}},
      {"<", {{"other"}, comparison("lt")}},
      {"le", {{"other"}, comparison("le")}},
      {"<=", {{"other"}, comparison("le")}},
      {"gt", {{"other"}, comparison("gt")}},
      {"greaterthan", {{"other"}, comparison("gt")}},
      {">", {{"other"}, comparison("gt")}},
      {"ge", {{"other"}, comparison("ge")}},
      {">=", {{"other"}, comparison("ge")}},
  };
  return t;
}

}  // namespace

bool is_jinja_test(const std::string& name) { return tests().count(name) > 0; }

bool apply_test(Interpreter&, const std::string& name, const Value& value, CallArgs& args) {
  const auto it = tests().find(name);
  // Only a test the parser let through in an if (see parser.cc) gets here, as in jinja2.
  if (it == tests().end()) throw TemplateError("No test named '" + name + "' found.", args.line);
  BoundArgs b(args, it->second.params, "test '" + name + "'");
  for (std::size_t i = 0; i < it->second.params.size(); ++i) {
    if (!b.has(i)) throw TemplateError("test '" + name + "' needs an argument", args.line);
  }
  return it->second.test(value, b, args.line);
}

}  // namespace flexh2o::engine::chat
