#include "engine/chat/args.h"

namespace flexh2o::engine::chat {

BoundArgs::BoundArgs(const CallArgs& args, std::vector<std::string> params, const std::string& what)
    : what_(what), params_(std::move(params)), values_(params_.size()), set_(params_.size(), false) {
  if (args.positional.size() > params_.size()) {
    throw TemplateError(what_ + " takes at most " + std::to_string(params_.size()) + " argument(s), got " +
                            std::to_string(args.positional.size()),
                        args.line);
  }
  for (std::size_t i = 0; i < args.positional.size(); ++i) {
    values_[i] = args.positional[i];
    set_[i] = true;
  }
  for (const auto& [key, value] : args.keyword) {
    std::size_t i = 0;
    while (i < params_.size() && params_[i] != key) ++i;
    if (i == params_.size()) throw TemplateError(what_ + " got an unexpected keyword argument '" + key + "'", args.line);
    if (set_[i]) throw TemplateError(what_ + " got multiple values for argument '" + key + "'", args.line);
    values_[i] = value;
    set_[i] = true;
  }
}

std::string BoundArgs::string_or(std::size_t i, const std::string& fallback, int line) const {
  if (!set_[i] || values_[i].is_none()) return fallback;
  if (!values_[i].is_string()) {
    throw TemplateError(what_ + ": argument '" + params_[i] + "' must be a string, not " + type_name(values_[i]), line);
  }
  return values_[i].as_string();
}

std::int64_t BoundArgs::int_or(std::size_t i, std::int64_t fallback, int line) const {
  if (!set_[i] || values_[i].is_none()) return fallback;
  if (!is_integral(values_[i])) {
    throw TemplateError(what_ + ": argument '" + params_[i] + "' must be an integer, not " + type_name(values_[i]), line);
  }
  return to_int64(values_[i]);
}

}  // namespace flexh2o::engine::chat
