// The parsed template: statements and expressions, each with its template line.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

enum class ExprKind {
  Literal,    // value
  Name,       // name
  List,       // items
  Tuple,      // items
  Dict,       // items: key, value, key, value, ...
  Attr,       // target.name
  Item,       // target[index]
  Slice,      // target[a:b:c]: items = {a, b, c}, each may be null
  Call,       // target(items..., kwargs...)
  Filter,     // target | name(items..., kwargs...)
  Test,       // target is [not] name(items..., kwargs...)
  Unary,      // name in {"-", "+", "not"} of target
  Binary,     // target name other: + - * / // % ** ~
  And,        // target and other
  Or,         // target or other
  Compare,    // target ops[0] items[0] ops[1] items[1] ...: == != < <= > >= in notin
  Condition,  // other if target else third (third may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;
  ExprPtr target;
  ExprPtr other;
  ExprPtr third;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

// Where `for` and `set` store: names (several: tuple unpacking) or one namespace attribute.
struct Target {
  std::vector<std::string> names;
  bool unpack = false;    // `a, b` / `(a, b)`
  std::string attribute;  // `ns.attr`: names = {"ns"}
};

struct Stmt;
using StmtPtr = std::shared_ptr<const Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,      // text
  Output,    // {{ expr }}
  If,        // branches (condition null for else)
  For,       // target in expr [if condition]: body, else_body
  Set,       // target = expr
  SetBlock,  // {% set name %}body{% endset %}, with filters
  Macro,     // name(params): body
  CallBlock, // {% call(params) expr %}body{% endcall %}
  FilterBlock,  // {% filter f %}body{% endfilter %}
  With,      // assignments: body
  Break,
  Continue,
  Scope,     // a body in the current scope ({% generation %})
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::string name;
  std::vector<Param> params;
  std::vector<ExprPtr> filters;  // Filter expressions whose target is null: applied in order
  std::vector<std::pair<Target, ExprPtr>> assignments;
  bool uses_varargs = false;  // a macro's body reads varargs / kwargs / caller
  bool uses_kwargs = false;
  bool uses_caller = false;
};

}  // namespace flexh2o::engine::chat
