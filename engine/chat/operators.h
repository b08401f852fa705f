// Python's arithmetic on template values: + - * / // % ** and unary minus, with Python's
// results (true division gives a float, // and % floor, str * int repeats) and its errors.
#pragma once
#include <string>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

class Interpreter;
Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b, int line);
Value negate(const Value& v, int line);

}  // namespace flexh2o::engine::chat
