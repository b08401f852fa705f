#include "engine/chat/parser.h"

#include <charconv>
#include <cstdlib>
#include <set>

#include "engine/chat/filters.h"
#include "engine/chat/lexer.h"
#include "engine/chat/tests.h"

namespace flexh2o::engine::chat {

namespace {

std::shared_ptr<Expr> make_expr(ExprKind kind, int line) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

std::shared_ptr<Stmt> make_stmt(StmtKind kind, int line) {
  auto s = std::make_shared<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, end);
    if (cur().type != TokenType::End) fail("unexpected '" + describe(cur()) + "'");
    check_unknown_names();
    return body;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(std::size_t k = 1) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::Operator && cur().value == op; }
  bool is_name(const char* name) const { return cur().type == TokenType::Name && cur().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', found '" + describe(cur()) + "'");
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) fail("expected a name, found '" + describe(cur()) + "'");
    std::string n = cur().value;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd) fail("expected the end of the tag ('%}'), found '" + describe(cur()) + "'");
    advance();
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::Text: return "text";
      case TokenType::VariableBegin: return "{{";
      case TokenType::VariableEnd: return "}}";
      case TokenType::BlockBegin: return "{%";
      case TokenType::BlockEnd: return "%}";
      case TokenType::End: return "end of template";
      case TokenType::String: return "string";
      default: return t.value;
    }
  }
  [[noreturn]] void fail(const std::string& what) const { throw TemplateError(what, cur().line); }

  // ---- statements ----
  // Parses until `{% name` with name in `ends` (left at the name) or the end of the template.
  Body parse_body(const std::set<std::string>& ends, std::string& end_found) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::End) {
        if (!ends.empty()) fail("unexpected end of template: expected " + list_names(ends));
        return body;
      }
      if (t.type == TokenType::Text) {
        auto s = make_stmt(StmtKind::Text, t.line);
        s->text = t.value;
        body.push_back(s);
        advance();
      } else if (t.type == TokenType::VariableBegin) {
        advance();
        auto s = make_stmt(StmtKind::Output, t.line);
        s->expr = parse_tuple(true, {}, false);
        if (cur().type != TokenType::VariableEnd) fail("expected '}}', found '" + describe(cur()) + "'");
        advance();
        body.push_back(s);
      } else {  // BlockBegin
        advance();
        if (cur().type == TokenType::Name && ends.count(cur().value)) {
          end_found = cur().value;
          advance();
          return body;
        }
        body.push_back(parse_statement());
      }
    }
  }

  static std::string list_names(const std::set<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : " or ") + ("{% " + n + " %}");
    return out;
  }

  // Recursive descent: nesting deeper than this is refused rather than overflowing the stack.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.nesting_ > 500) p.fail("the template nests blocks or expressions more than 500 deep");
    }
    ~Nest() { --p.nesting_; }
  };

  StmtPtr parse_statement() {
    const Nest nest(*this);
    if (cur().type != TokenType::Name) fail("expected a tag name after '{%', found '" + describe(cur()) + "'");
    const std::string tag = cur().value;
    const int line = cur().line;
    advance();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "call") return parse_call_block(line);
    if (tag == "filter") return parse_filter_block(line);
    if (tag == "with") return parse_with(line);
    if (tag == "generation") return parse_generation(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) throw TemplateError("'{% " + tag + " %}' outside a for loop", line);
      expect_block_end();
      return make_stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, line);
    }
    static const std::set<std::string> kSandboxed = {"include", "import", "from", "extends", "block"};
    if (kSandboxed.count(tag)) {
      throw TemplateError("'{% " + tag + " %}' is not supported: a chat template cannot load other templates", line);
    }
    static const std::set<std::string> kUnsupported = {"autoescape", "do", "trans", "pluralize", "debug"};
    if (kUnsupported.count(tag)) throw TemplateError("'{% " + tag + " %}' is not implemented", line);
    throw TemplateError("unknown tag '" + tag + "'", line);
  }

  StmtPtr parse_if(int line) {
    const Soft soft(*this, true);
    auto s = make_stmt(StmtKind::If, line);
    ExprPtr cond = parse_tuple(true, {}, false);
    expect_block_end();
    while (true) {
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, end);
      s->branches.emplace_back(cond, std::move(body));
      if (end == "endif") break;
      if (end == "else") {
        expect_block_end();
        std::string end2;
        Body else_body = parse_body({"endif"}, end2);
        s->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      cond = parse_tuple(true, {}, false);
      expect_block_end();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(StmtKind::For, line);
    s->target = parse_target(false);
    if (!skip_name("in")) fail("expected 'in' in the for loop, found '" + describe(cur()) + "'");
    s->expr = parse_tuple(false, {"recursive", "if"}, false);
    const Soft inner(*this, false);
    if (skip_name("if")) s->condition = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not implemented");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    s->body = parse_body({"else", "endfor"}, end);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, end);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    Target target = parse_target(true);
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    if (target.unpack || !target.attribute.empty()) fail("a block set ({% set x %}...{% endset %}) takes one name");
    auto s = make_stmt(StmtKind::SetBlock, line);
    const Soft inner(*this, false);
    s->target = std::move(target);
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    std::string end;
    s->body = parse_body({"endset"}, end);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(StmtKind::Macro, line);
    const Soft inner(*this, false);
    s->name = expect_name();
    s->params = parse_params();
    expect_block_end();
    macro_frames_.push_back(s.get());
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->body = parse_body({"endmacro"}, end);
    loop_depth_ = saved_loop_depth;
    macro_frames_.pop_back();
    if (cur().type == TokenType::Name) advance();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  std::vector<Param> parse_params() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make_stmt(StmtKind::CallBlock, line);
    if (is_op("(")) s->params = parse_params();
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail("expected a macro call in {% call %}");
    expect_block_end();
    const Soft inner(*this, false);
    std::string end;
    s->body = parse_body({"endcall"}, end);
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = make_stmt(StmtKind::FilterBlock, line);
    const Soft inner(*this, false);
    s->filters.push_back(parse_filter(nullptr));
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    std::string end;
    s->body = parse_body({"endfilter"}, end);
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(int line) {
    auto s = make_stmt(StmtKind::With, line);
    while (cur().type != TokenType::BlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      Target t = parse_target(false);
      expect_op("=");
      s->assignments.emplace_back(std::move(t), parse_expression(true));
    }
    expect_block_end();
    const Soft inner(*this, false);
    std::string end;
    s->body = parse_body({"endwith"}, end);
    expect_block_end();
    return s;
  }

  // transformers' {% generation %} marks assistant text for training masks; it renders its body.
  StmtPtr parse_generation(int line) {
    auto s = make_stmt(StmtKind::Scope, line);
    const Soft inner(*this, false);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endgeneration"}, end);
    expect_block_end();
    return s;
  }

  Target parse_target(bool allow_namespace) {
    Target t;
    const bool parenthesized = skip_op("(");
    t.names.push_back(expect_name());
    if (allow_namespace && !parenthesized && skip_op(".")) {
      t.attribute = expect_name();
      return t;
    }
    while (skip_op(",")) {
      t.unpack = true;
      if (cur().type != TokenType::Name) break;
      t.names.push_back(expect_name());
    }
    if (parenthesized) {
      expect_op(")");
      t.unpack = true;
    }
    return t;
  }

  // ---- expressions ----
  bool tuple_ends(const std::set<std::string>& extra_ends) const {
    const Token& t = cur();
    if (t.type == TokenType::VariableEnd || t.type == TokenType::BlockEnd || t.type == TokenType::End) return true;
    if (t.type == TokenType::Operator && t.value == ")") return true;
    return t.type == TokenType::Name && extra_ends.count(t.value);
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::set<std::string>& extra_ends, bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_ends(extra_ends)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return items[0];
      if (!explicit_parens) fail("expected an expression, found '" + describe(cur()) + "'");
    }
    auto e = make_expr(ExprKind::Tuple, line);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    const Nest nest(*this);
    const std::size_t first_unknown = unknown_names_.size();
    ExprPtr expr = parse_or();
    if (!is_name("if")) return expr;
    for (std::size_t i = first_unknown; i < unknown_names_.size(); ++i) unknown_names_[i].soft = true;
    const Soft soft(*this, true);
    while (is_name("if")) {
      const int line = cur().line;
      advance();
      auto e = make_expr(ExprKind::Condition, line);
      e->other = expr;
      e->target = parse_or();
      if (skip_name("else")) e->third = parse_condexpr();
      expr = e;
    }
    return expr;
  }

  ExprPtr binary(ExprKind kind, const std::string& op, ExprPtr left, ExprPtr right, int line) {
    auto e = make_expr(kind, line);
    e->name = op;
    e->target = std::move(left);
    e->other = std::move(right);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      advance();
      left = binary(ExprKind::Or, "or", left, parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      advance();
      left = binary(ExprKind::And, "and", left, parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    const Nest nest(*this);
    if (is_name("not")) {
      const int line = cur().line;
      advance();
      auto e = make_expr(ExprKind::Unary, line);
      e->name = "not";
      e->target = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    auto e = make_expr(ExprKind::Compare, line);
    while (true) {
      static const std::set<std::string> kOps = {"==", "!=", "<", "<=", ">", ">="};
      if (cur().type == TokenType::Operator && kOps.count(cur().value)) {
        e->ops.push_back(cur().value);
        advance();
      } else if (is_name("in")) {
        e->ops.push_back("in");
        advance();
      } else if (is_name("not") && peek().type == TokenType::Name && peek().value == "in") {
        e->ops.push_back("notin");
        advance();
        advance();
      } else {
        break;
      }
      e->items.push_back(parse_math1());
    }
    if (e->ops.empty()) return first;
    e->target = first;
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().value;
      const int line = cur().line;
      advance();
      left = binary(ExprKind::Binary, op, left, parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      advance();
      left = binary(ExprKind::Binary, "~", left, parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      advance();
      left = binary(ExprKind::Binary, op, left, parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      advance();
      left = binary(ExprKind::Binary, "**", left, parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Nest nest(*this);
    const int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto e = make_expr(ExprKind::Unary, line);
      e->name = cur().value;
      advance();
      e->target = parse_unary(false);
      node = e;
    } else {
      node = parse_primary();
    }
    node = parse_postfix(node);
    if (with_filter) node = parse_filter_expr(node);
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case TokenType::Name: {
        advance();
        if (t.value == "true" || t.value == "True") return literal(Value(true), t.line);
        if (t.value == "false" || t.value == "False") return literal(Value(false), t.line);
        if (t.value == "none" || t.value == "None") return literal(Value(None{}), t.line);
        note_name(t.value);
        auto e = make_expr(ExprKind::Name, t.line);
        e->name = t.value;
        return e;
      }
      case TokenType::String: {
        std::string s;
        while (cur().type == TokenType::String) {
          s += cur().value;
          advance();
        }
        return literal(Value(std::move(s)), t.line);
      }
      case TokenType::Integer: {
        advance();
        std::int64_t v = 0;
        const auto r = std::from_chars(t.value.data(), t.value.data() + t.value.size(), v);
        if (r.ec != std::errc()) throw TemplateError("integer " + t.value + " is too large (the limit is 2^63-1)", t.line);
        return literal(Value(v), t.line);
      }
      case TokenType::Float:
        advance();
        return literal(Value(std::strtod(t.value.c_str(), nullptr)), t.line);
      case TokenType::Operator:
        if (t.value == "(") {
          advance();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail("unexpected '" + describe(t) + "'");
  }

  ExprPtr literal(Value v, int line) {
    auto e = make_expr(ExprKind::Literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_list() {
    auto e = make_expr(ExprKind::List, cur().line);
    expect_op("[");
    while (!is_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("]")) break;
      e->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make_expr(ExprKind::Dict, cur().line);
    expect_op("{");
    while (!is_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("}")) break;
      e->items.push_back(parse_expression(true));
      expect_op(":");
      e->items.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(node);
      } else if (is_op("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        advance();
        node = parse_filter(node);
      } else if (is_name("is")) {
        node = parse_test(node);
      } else if (is_op("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == TokenType::Integer) {
        auto e = make_expr(ExprKind::Item, line);
        e->target = node;
        e->other = parse_primary();
        return e;
      }
      auto e = make_expr(ExprKind::Attr, line);
      e->target = node;
      e->name = expect_name();
      return e;
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      if (is_op("]")) break;
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.empty()) fail("expected a subscript in '[]'");
    if (args.size() == 1 && args[0]->kind == ExprKind::Slice && !args[0]->target) {
      auto s = std::const_pointer_cast<Expr>(args[0]);
      s->target = node;
      return s;
    }
    auto e = make_expr(ExprKind::Item, line);
    e->target = node;
    if (args.size() == 1) {
      e->other = args[0];
    } else {
      auto t = make_expr(ExprKind::Tuple, line);
      t->items = std::move(args);
      e->other = t;
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    if (skip_op(":")) {
      args.push_back(nullptr);
    } else {
      ExprPtr node = parse_expression(true);
      if (!skip_op(":")) return node;
      args.push_back(node);
    }
    auto bound = [&]() -> ExprPtr { return (is_op("]") || is_op(",") || is_op(":")) ? nullptr : parse_expression(true); };
    args.push_back(bound());
    if (skip_op(":")) {
      args.push_back(bound());
    } else {
      args.push_back(nullptr);
    }
    auto e = make_expr(ExprKind::Slice, line);
    e->items = std::move(args);
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not implemented");
      if (cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().value == "=") {
        std::string key = cur().value;
        advance();
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("a positional argument after a keyword argument");
        e.items.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make_expr(ExprKind::Call, cur().line);
    e->target = std::move(node);
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == TokenType::Name) {
      advance();
      name += '.';
      name += expect_name();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node) {
    const int line = cur().line;
    auto e = make_expr(ExprKind::Filter, line);
    e->target = std::move(node);
    e->name = dotted_name();
    if (!is_jinja_filter(e->name)) note_unknown("filter", e->name, line);
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = cur().line;
    advance();  // is
    auto e = make_expr(ExprKind::Test, line);
    e->negated = skip_name("not");
    e->target = std::move(node);
    e->name = dotted_name();
    if (!is_jinja_test(e->name)) note_unknown("test", e->name, line);
    const Token& t = cur();
    const bool arg_starts = t.type == TokenType::Name || t.type == TokenType::String || t.type == TokenType::Integer ||
                            t.type == TokenType::Float ||
                            (t.type == TokenType::Operator && (t.value == "[" || t.value == "{"));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if (arg_starts && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
      e->items.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  // jinja2 3.x: an unknown filter or test fails the template when it compiles, unless it sits
  // in an `if` statement or an if-expression (a "soft frame", not inside a loop, macro or block
  // there): then only using it fails, when the template runs.
  struct UnknownName {
    std::string message;
    int line;
    bool soft;
  };
  class Soft {
   public:
    Soft(Parser& p, bool soft) : p_(p), saved_(p.soft_) { p.soft_ = soft; }
    ~Soft() { p_.soft_ = saved_; }
    Soft(const Soft&) = delete;
    Soft& operator=(const Soft&) = delete;

   private:
    Parser& p_;
    bool saved_;
  };

  void note_unknown(const char* kind, const std::string& name, int line) {
    unknown_names_.push_back({std::string("No ") + kind + " named '" + name + "'.", line, soft_});
  }

  void check_unknown_names() const {
    for (const UnknownName& u : unknown_names_) {
      if (!u.soft) throw TemplateError(u.message, u.line);
    }
  }

  void note_name(const std::string& name) {
    if (macro_frames_.empty()) return;
    Stmt* m = macro_frames_.back();
    if (name == "varargs") m->uses_varargs = true;
    if (name == "kwargs") m->uses_kwargs = true;
    if (name == "caller") m->uses_caller = true;
  }

  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
  bool soft_ = false;
  std::vector<UnknownName> unknown_names_;
  std::vector<Stmt*> macro_frames_;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse_all(); }

}  // namespace flexh2o::engine::chat
