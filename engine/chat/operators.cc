#include "engine/chat/operators.h"

#include <cmath>

#include "engine/chat/formatting.h"
#include "engine/chat/interpreter.h"

namespace flexh2o::engine::chat {

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) fail_undefined(a, line);
  if (b.is_undefined()) fail_undefined(b, line);
  if (op == "+" && (a.is_string() || a.is_list() || a.is_tuple())) {
    throw TemplateError("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a),
                        line);
  }
  throw TemplateError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'",
                      line);
}

void check_overflow(bool overflow, int line) {
  if (overflow) throw TemplateError("integer overflow (Python integers are unbounded; this engine stops at 2^63)", line);
}

Value int_op(const std::string& op, std::int64_t x, std::int64_t y, int line) {
  std::int64_t r = 0;
  if (op == "+" || op == "-" || op == "*") {
    check_overflow(op == "+" ? __builtin_add_overflow(x, y, &r)
                   : op == "-" ? __builtin_sub_overflow(x, y, &r)
                               : __builtin_mul_overflow(x, y, &r),
                   line);
    return r;
  }
  if (op == "/") {
    if (y == 0) throw TemplateError("division by zero", line);
    return static_cast<double>(x) / static_cast<double>(y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) throw TemplateError("integer division or modulo by zero", line);
    check_overflow(x == INT64_MIN && y == -1, line);
    std::int64_t q = x / y;
    std::int64_t m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    return op == "//" ? Value(q) : Value(m);
  }
  // **
  if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
  std::int64_t result = 1;
  for (std::int64_t i = 0; i < y; ++i) {
    check_overflow(__builtin_mul_overflow(result, x, &result), line);
    if (result == 0 || result == 1) break;
  }
  return result;
}

Value float_op(const std::string& op, double x, double y, int line) {
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "/") {
    if (y == 0) throw TemplateError("float division by zero", line);
    return x / y;
  }
  if (op == "//" || op == "%") {  // CPython's float_divmod
    if (y == 0) throw TemplateError("float division by zero", line);
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return mod;
    if (div == 0) return std::copysign(0.0, x / y);
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
  }
  return std::pow(x, y);
}

Value repeat(Interpreter& in, const Value& seq, std::int64_t n, int line) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    in.check_size(seq.as_string().size() * static_cast<std::size_t>(n), line);
    std::string out;
    for (std::int64_t i = 0; i < n; ++i) out += seq.as_string();
    return seq.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  in.check_size(seq.as_list().items.size() * static_cast<std::size_t>(n) * 16, line);
  std::vector<Value> items;
  for (std::int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.as_list().items.begin(), seq.as_list().items.end());
  return seq.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

Value concat(Interpreter& in, const Value& a, const Value& b, int line) {
  if (a.is_string()) {
    in.check_size(a.as_string().size() + b.as_string().size(), line);
    if (a.is_markup() || b.is_markup()) return Value::markup(escaped_text(a, line) + escaped_text(b, line));
    return a.as_string() + b.as_string();
  }
  std::vector<Value> items = a.as_list().items;
  items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
  return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

}  // namespace

Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return int_op(op, to_int64(a), to_int64(b), line);
    return float_op(op, to_double(a), to_double(b), line);
  }
  if (op == "+" && ((a.is_string() && b.is_string()) || (a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple()))) {
    return concat(in, a, b, line);
  }
  if (op == "*") {
    if ((a.is_string() || a.is_sequence_obj()) && is_integral(b)) return repeat(in, a, to_int64(b), line);
    if (is_integral(a) && (b.is_string() || b.is_sequence_obj())) return repeat(in, b, to_int64(a), line);
  }
  if (op == "%" && a.is_string()) {
    std::string text = format_percent(a.as_string(), b, a.is_markup(), line);
    in.check_size(text.size(), line);
    return a.is_markup() ? Value::markup(std::move(text)) : Value(std::move(text));
  }
  unsupported(op, a, b, line);
}

Value negate(const Value& v, int line) {
  if (v.is_float()) return -v.as_float();
  if (is_integral(v)) {
    std::int64_t r = 0;
    check_overflow(__builtin_sub_overflow(std::int64_t{0}, to_int64(v), &r), line);
    return r;
  }
  if (v.is_undefined()) fail_undefined(v, line);
  throw TemplateError("bad operand type for unary -: '" + type_name(v) + "'", line);
}

}  // namespace flexh2o::engine::chat
