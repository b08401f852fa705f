// Runs a parsed template. Scopes follow jinja2: `if` shares its scope, each `for` iteration and
// each macro call gets a fresh one (a `set` inside does not leak out), macros see the scope they
// were defined in as it is when they are called. Sandboxed: there is nothing that reads files
// or runs programs, and a step limit, an output limit and a call-depth limit stop runaway
// templates with an error.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/chat/ast.h"
#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Scope> parent;
  Value* find(const std::string& name);
  void set(const std::string& name, Value v);
};
using ScopePtr = std::shared_ptr<Scope>;

struct RenderLimits {
  std::int64_t max_steps = 20'000'000;       // statements, expressions and loop iterations
  std::size_t max_output = 64u << 20;        // bytes of rendered text (and of any one string)
  int max_call_depth = 200;                  // nested macro calls (jinja2 hits Python's recursion limit)
  int max_nesting = 2000;                    // statements and expressions being evaluated inside each other
};

class Interpreter {
 public:
  explicit Interpreter(RenderLimits limits) : limits_(limits) {}
  std::string render(const Body& body, const ScopePtr& root);

  // For filters, methods and globals.
  Value call(const Value& fn, CallArgs& args, int line);
  void step(int line);
  const RenderLimits& limits() const { return limits_; }
  void check_size(std::size_t bytes, int line) const;
  // Namespaces are the one mutable value, so the one way to a reference cycle ({% set ns.me = ns %});
  // render() empties every namespace it made when it ends.
  void adopt_namespace(const std::shared_ptr<Object>& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body, const ScopePtr& scope);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope);
  Flow exec_for(const Stmt& s, const ScopePtr& scope);
  void exec_set(const Stmt& s, const ScopePtr& scope);
  void assign(const Target& t, const Value& v, const ScopePtr& scope, int line);
  Value make_macro(const StmtPtr& s, const ScopePtr& scope, bool is_caller);
  Value call_macro(const Stmt& m, const ScopePtr& defining, CallArgs& args, bool is_caller);
  std::string capture(const Body& body, const ScopePtr& scope);
  Value apply_filters(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope);
  void write(const std::string& text, int line);

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller);
  CallArgs eval_args(const Expr& e, const ScopePtr& scope);

  RenderLimits limits_;
  std::int64_t steps_ = 0;
  int call_depth_ = 0;
  int nesting_ = 0;
  class Nesting;
  std::vector<std::string> outputs_;  // the innermost is where text goes (macros capture theirs)
  std::size_t total_output_ = 0;
  std::vector<std::shared_ptr<Object>> namespaces_;
};

// Looks a name up through the scope chain; Undefined when no scope has it.
Value lookup(const ScopePtr& scope, const std::string& name);

}  // namespace flexh2o::engine::chat
