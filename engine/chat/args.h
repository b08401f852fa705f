// Binds the arguments of a call to a builtin's Python signature (positional, then by name),
// so that `indent(4, true)` and `indent(width=4, first=true)` read the same.
#pragma once
#include <string>
#include <vector>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

class BoundArgs {
 public:
  // `what` names the callee in messages ("filter 'join'"); throws on an unknown keyword, a
  // repeated argument or too many positional arguments.
  BoundArgs(const CallArgs& args, std::vector<std::string> params, const std::string& what);
  bool has(std::size_t i) const { return set_[i]; }
  const Value& get(std::size_t i) const { return values_[i]; }
  Value get_or(std::size_t i, Value fallback) const { return set_[i] ? values_[i] : fallback; }
  std::string string_or(std::size_t i, const std::string& fallback, int line) const;
  std::int64_t int_or(std::size_t i, std::int64_t fallback, int line) const;
  bool bool_or(std::size_t i, bool fallback) const { return set_[i] ? truthy(values_[i]) : fallback; }

 private:
  std::string what_;
  std::vector<std::string> params_;
  std::vector<Value> values_;
  std::vector<bool> set_;
};

}  // namespace flexh2o::engine::chat
