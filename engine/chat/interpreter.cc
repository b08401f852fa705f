#include "engine/chat/interpreter.h"

#include "engine/chat/filters.h"
#include "engine/chat/methods.h"
#include "engine/chat/operators.h"
#include "engine/chat/tests.h"

namespace flexh2o::engine::chat {

Value* Scope::find(const std::string& name) {
  for (auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  if (Value* old = find(name)) {
    *old = std::move(v);
  } else {
    vars.emplace_back(name, std::move(v));
  }
}

Value lookup(const ScopePtr& scope, const std::string& name) {
  for (Scope* s = scope.get(); s; s = s->parent.get()) {
    if (Value* v = s->find(name)) return *v;
  }
  return Undefined{"'" + name + "' is undefined"};
}

namespace {

ScopePtr child_scope(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

}  // namespace

std::string Interpreter::render(const Body& body, const ScopePtr& root) {
  struct BreakCycles {
    std::vector<std::shared_ptr<Object>>& namespaces;
    ~BreakCycles() {
      for (const auto& ns : namespaces) ns->attrs.clear();
      namespaces.clear();
    }
  } break_cycles{namespaces_};
  outputs_.assign(1, std::string());
  exec(body, root);
  return std::move(outputs_.back());
}

// Bounds the C++ stack a template can use (nested blocks inside recursive macros).
class Interpreter::Nesting {
 public:
  Nesting(Interpreter& in, int line) : in_(in) {
    if (++in_.nesting_ > in_.limits_.max_nesting) {
      --in_.nesting_;
      throw TemplateError("the template nests more than " + std::to_string(in_.limits_.max_nesting) +
                              " statements and expressions inside each other; stopped",
                          line);
    }
  }
  ~Nesting() { --in_.nesting_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;

 private:
  Interpreter& in_;
};

void Interpreter::step(int line) {
  if (++steps_ > limits_.max_steps) {
    throw TemplateError("the template ran for more than " + std::to_string(limits_.max_steps) +
                            " steps (a runaway loop?); stopped",
                        line);
  }
}

void Interpreter::check_size(std::size_t bytes, int line) const {
  if (bytes > limits_.max_output) {
    throw TemplateError("the template made a text of more than " + std::to_string(limits_.max_output) +
                            " bytes; stopped",
                        line);
  }
}

void Interpreter::write(const std::string& text, int line) {
  total_output_ += text.size();
  check_size(total_output_, line);
  outputs_.back() += text;
}

std::string Interpreter::capture(const Body& body, const ScopePtr& scope) {
  outputs_.emplace_back();
  try {
    exec(body, scope);
  } catch (...) {
    outputs_.pop_back();
    throw;
  }
  std::string text = std::move(outputs_.back());
  outputs_.pop_back();
  return text;
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope) {
  for (const StmtPtr& s : body) {
    const Flow f = exec_stmt(*s, scope);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope) {
  step(s.line);
  const Nesting nesting(*this, s.line);
  switch (s.kind) {
    case StmtKind::Text:
      write(s.text, s.line);
      return Flow::Normal;
    case StmtKind::Output:
      write(to_str(eval(*s.expr, scope), s.line), s.line);
      return Flow::Normal;
    case StmtKind::If:
      for (const auto& [cond, body] : s.branches) {
        if (!cond || truthy(eval(*cond, scope))) return exec(body, scope);
      }
      return Flow::Normal;
    case StmtKind::For:
      return exec_for(s, scope);
    case StmtKind::Set:
    case StmtKind::SetBlock:
      exec_set(s, scope);
      return Flow::Normal;
    case StmtKind::Macro:
      // The statement lives as long as the parsed template, which outlives every render.
      scope->set(s.name, make_macro(StmtPtr(StmtPtr{}, &s), scope, false));
      return Flow::Normal;
    case StmtKind::CallBlock: {
      const Value caller = make_macro(StmtPtr(StmtPtr{}, &s), scope, true);
      write(to_str(eval_call(*s.expr, scope, &caller), s.line), s.line);
      return Flow::Normal;
    }
    case StmtKind::FilterBlock:
      write(to_str(apply_filters(s.filters, capture(s.body, scope), scope), s.line), s.line);
      return Flow::Normal;
    case StmtKind::With: {
      ScopePtr inner = child_scope(scope);
      for (const auto& [target, expr] : s.assignments) assign(target, eval(*expr, scope), inner, s.line);
      return exec(s.body, inner);
    }
    case StmtKind::Scope:
      return exec(s.body, scope);
    case StmtKind::Break:
      return Flow::Break;
    case StmtKind::Continue:
      return Flow::Continue;
  }
  return Flow::Normal;
}

namespace {

Value make_loop(const std::vector<Value>& items, std::size_t i, const std::shared_ptr<Value>& last_changed) {
  auto o = std::make_shared<Object>();
  o->type_name = "LoopContext";
  const auto n = static_cast<std::int64_t>(items.size());
  const auto k = static_cast<std::int64_t>(i);
  o->attrs = {
      {"index", Value(k + 1)},       {"index0", Value(k)},
      {"revindex", Value(n - k)},    {"revindex0", Value(n - k - 1)},
      {"first", Value(k == 0)},      {"last", Value(k == n - 1)},
      {"length", Value(n)},          {"depth", Value(1)},
      {"depth0", Value(0)},
      {"previtem", i > 0 ? items[i - 1] : Value(Undefined{"there is no previous item"})},
      {"nextitem", i + 1 < items.size() ? items[i + 1] : Value(Undefined{"there is no next item"})},
  };
  o->attrs.emplace_back("cycle", Value::callable("loop.cycle", [k](Interpreter&, CallArgs& a) -> Value {
    if (a.positional.empty()) throw TemplateError("no items for cycling given", a.line);
    return a.positional[static_cast<std::size_t>(k) % a.positional.size()];
  }));
  o->attrs.emplace_back("changed", Value::callable("loop.changed", [last_changed](Interpreter&, CallArgs& a) -> Value {
    Value now = Value::list(a.positional);
    if (!last_changed->is_undefined() && equals(*last_changed, now)) return false;
    *last_changed = now;
    return true;
  }));
  return Value(std::move(o));
}

}  // namespace

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const ScopePtr& scope) {
  const Value iterable = eval(*s.expr, scope);
  std::vector<Value> items = iterate(iterable, s.line);
  if (s.condition) {  // `for x in xs if cond`: loop.* count the items that pass
    std::vector<Value> kept;
    for (const Value& item : items) {
      step(s.line);
      ScopePtr probe = child_scope(scope);
      assign(s.target, item, probe, s.line);
      if (truthy(eval(*s.condition, probe))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  auto last_changed = std::make_shared<Value>();
  for (std::size_t i = 0; i < items.size(); ++i) {
    step(s.line);
    ScopePtr iteration = child_scope(scope);
    iteration->set("loop", make_loop(items, i, last_changed));
    assign(s.target, items[i], iteration, s.line);
    if (exec(s.body, iteration) == Flow::Break) break;
  }
  if (items.empty() && !s.else_body.empty()) return exec(s.else_body, child_scope(scope));
  return Flow::Normal;
}

void Interpreter::exec_set(const Stmt& s, const ScopePtr& scope) {
  Value v = s.kind == StmtKind::SetBlock ? apply_filters(s.filters, capture(s.body, scope), scope) : eval(*s.expr, scope);
  assign(s.target, v, scope, s.line);
}

void Interpreter::assign(const Target& t, const Value& v, const ScopePtr& scope, int line) {
  if (!t.attribute.empty()) {
    const Value ns = lookup(scope, t.names[0]);
    if (!ns.is_object() || !ns.as_object().assignable) {
      throw TemplateError("cannot assign attribute on non-namespace object '" + t.names[0] + "'", line);
    }
    if (t.attribute[0] == '_') {
      throw TemplateError("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                              t.attribute + "'. Please rename the attribute.",
                          line);
    }
    ns.as_object().set(t.attribute, v);
    return;
  }
  if (!t.unpack) {
    scope->set(t.names[0], v);
    return;
  }
  if (v.is_undefined()) fail_undefined(v, line);
  const std::vector<Value> parts = iterate(v, line);
  if (parts.size() != t.names.size()) {
    throw TemplateError(parts.size() > t.names.size()
                            ? "too many values to unpack (expected " + std::to_string(t.names.size()) + ")"
                            : "not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
                                  std::to_string(parts.size()) + ")",
                        line);
  }
  for (std::size_t i = 0; i < parts.size(); ++i) scope->set(t.names[i], parts[i]);
}

Value Interpreter::apply_filters(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope) {
  for (const ExprPtr& f : filters) {
    CallArgs args = eval_args(*f, scope);
    v = apply_filter(*this, f->name, v, args);
  }
  return v;
}

Value Interpreter::make_macro(const StmtPtr& s, const ScopePtr& scope, bool is_caller) {
  // A weak reference: the macro usually lives in the scope it closes over.
  std::weak_ptr<Scope> defining = scope;
  const std::string name = is_caller ? "caller" : "macro '" + s->name + "'";
  return Value::callable(name, [this, s, defining, is_caller, name](Interpreter&, CallArgs& args) -> Value {
    ScopePtr scope = defining.lock();
    if (!scope) throw TemplateError(name + " was called after the scope it was defined in ended", args.line);
    return call_macro(*s, scope, args, is_caller);
  });
}

Value Interpreter::call_macro(const Stmt& m, const ScopePtr& defining, CallArgs& args, bool is_caller) {
  const std::string what = is_caller ? "caller" : "macro '" + m.name + "'";
  if (++call_depth_ > limits_.max_call_depth) {
    --call_depth_;
    throw TemplateError(what + ": macro calls nested more than " + std::to_string(limits_.max_call_depth) +
                            " deep (runaway recursion?)",
                        args.line);
  }
  struct DepthGuard {
    int& depth;
    ~DepthGuard() { --depth; }
  } guard{call_depth_};
  ScopePtr scope = child_scope(defining);
  std::vector<bool> bound(m.params.size(), false);
  std::vector<Value> extra;
  for (std::size_t i = 0; i < args.positional.size(); ++i) {
    if (i < m.params.size()) {
      scope->set(m.params[i].name, args.positional[i]);
      bound[i] = true;
    } else if (m.uses_varargs) {
      extra.push_back(args.positional[i]);
    } else {
      throw TemplateError(what + " takes not more than " + std::to_string(m.params.size()) + " argument(s)", args.line);
    }
  }
  Value extra_kwargs = Value::dict();
  for (const auto& [key, value] : args.keyword) {
    std::size_t i = 0;
    while (i < m.params.size() && m.params[i].name != key) ++i;
    if (i < m.params.size()) {
      if (bound[i]) throw TemplateError(what + " got multiple values for argument '" + key + "'", args.line);
      scope->set(key, value);
      bound[i] = true;
    } else if (key == "caller" && m.uses_caller) {
      scope->set("caller", value);
    } else if (m.uses_kwargs) {
      extra_kwargs.as_dict().set(Value(key), value);
    } else {
      throw TemplateError(what + " takes no keyword argument '" + key + "'", args.line);
    }
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (bound[i]) continue;
    scope->set(m.params[i].name, m.params[i].default_value
                                     ? eval(*m.params[i].default_value, scope)
                                     : Value(Undefined{"parameter '" + m.params[i].name + "' was not provided"}));
  }
  if (m.uses_varargs) scope->set("varargs", Value::tuple(std::move(extra)));
  if (m.uses_kwargs) scope->set("kwargs", extra_kwargs);
  return capture(m.body, scope);
}

Value Interpreter::call(const Value& fn, CallArgs& args, int line) {
  step(line);
  args.line = line;
  if (fn.is_callable()) return fn.as_callable().call(*this, args);
  if (fn.is_undefined()) fail_undefined(fn, line);
  throw TemplateError("'" + type_name(fn) + "' object is not callable", line);
}

CallArgs Interpreter::eval_args(const Expr& e, const ScopePtr& scope) {
  CallArgs args;
  args.line = e.line;
  for (const ExprPtr& a : e.items) args.positional.push_back(eval(*a, scope));
  for (const auto& [k, a] : e.kwargs) args.keyword.emplace_back(k, eval(*a, scope));
  return args;
}

Value Interpreter::eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
  const Value fn = eval(*e.target, scope);
  CallArgs args = eval_args(e, scope);
  if (caller) args.keyword.emplace_back("caller", *caller);
  return call(fn, args, e.line);
}

Value Interpreter::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.target, scope);
  for (std::size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i], scope);
    const std::string& op = e.ops[i];
    bool ok = false;
    if (op == "==") ok = equals(left, right);
    else if (op == "!=") ok = !equals(left, right);
    else if (op == "<") ok = less_than(left, right, e.line);
    else if (op == ">") ok = less_than(right, left, e.line);
    else if (op == "<=") ok = less_than(left, right, e.line) || equals(left, right);
    else if (op == ">=") ok = less_than(right, left, e.line) || equals(left, right);
    else if (op == "in") ok = contains(right, left, e.line);
    else ok = !contains(right, left, e.line);
    if (!ok) return false;
    left = std::move(right);
  }
  return true;
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  step(e.line);
  const Nesting nesting(*this, e.line);
  switch (e.kind) {
    case ExprKind::Literal:
      return e.value;
    case ExprKind::Name:
      return lookup(scope, e.name);
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      for (const ExprPtr& i : e.items) items.push_back(eval(*i, scope));
      return e.kind == ExprKind::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::Dict: {
      Value d = Value::dict();
      for (std::size_t i = 0; i + 1 < e.items.size(); i += 2) {
        d.as_dict().set(eval(*e.items[i], scope), eval(*e.items[i + 1], scope));
      }
      return d;
    }
    case ExprKind::Attr:
      return get_attribute(eval(*e.target, scope), e.name, e.line);
    case ExprKind::Item:
      return get_item(eval(*e.target, scope), eval(*e.other, scope), e.line);
    case ExprKind::Slice: {
      const Value obj = eval(*e.target, scope);
      auto bound = [&](std::size_t i) { return e.items[i] ? eval(*e.items[i], scope) : Value(None{}); };
      return get_slice(obj, bound(0), bound(1), bound(2), e.line);
    }
    case ExprKind::Call:
      return eval_call(e, scope, nullptr);
    case ExprKind::Filter: {
      const Value target = eval(*e.target, scope);
      CallArgs args = eval_args(e, scope);
      return apply_filter(*this, e.name, target, args);
    }
    case ExprKind::Test: {
      const Value target = eval(*e.target, scope);
      CallArgs args = eval_args(e, scope);
      return apply_test(*this, e.name, target, args) != e.negated;
    }
    case ExprKind::Unary: {
      const Value v = eval(*e.target, scope);
      if (e.name == "not") return !truthy(v);
      if (e.name == "-") return negate(v, e.line);
      if (!v.is_number()) {
        if (v.is_undefined()) fail_undefined(v, e.line);
        throw TemplateError("bad operand type for unary +: '" + type_name(v) + "'", e.line);
      }
      return v.is_bool() ? Value(to_int64(v)) : v;
    }
    case ExprKind::Binary: {
      const Value a = eval(*e.target, scope);
      const Value b = eval(*e.other, scope);
      if (e.name == "~") {
        std::string s = to_str(a, e.line) + to_str(b, e.line);
        check_size(s.size(), e.line);
        return s;
      }
      return binary_op(*this, e.name, a, b, e.line);
    }
    case ExprKind::And: {
      Value a = eval(*e.target, scope);
      return truthy(a) ? eval(*e.other, scope) : a;
    }
    case ExprKind::Or: {
      Value a = eval(*e.target, scope);
      return truthy(a) ? a : eval(*e.other, scope);
    }
    case ExprKind::Compare:
      return eval_compare(e, scope);
    case ExprKind::Condition:
      if (truthy(eval(*e.target, scope))) return eval(*e.other, scope);
      if (e.third) return eval(*e.third, scope);
      return Undefined{"the inline if-expression on line " + std::to_string(e.line) +
                       " evaluated to false and no else section was defined"};
  }
  return Undefined{};
}

}  // namespace flexh2o::engine::chat
