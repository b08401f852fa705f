#include "engine/families/family.h"

#include <array>

#include "engine/families/families.h"
#include "engine/io/json_input.h"

namespace flexh2o::engine {

namespace {

const std::array<const Family*, 10>& all_families() {
  static const std::array<const Family*, 10> all = {&kOptFamily,   &kLlamaFamily,   &kMistralFamily,  &kQwen2Family,
                                                    &kQwen3Family, &kPhi3Family,    &kGemma2Family,   &kMixtralFamily,
                                                    &kQwen2MoeFamily, &kQwen3MoeFamily};
  return all;
}

}  // namespace

const Family& find_family(const std::string& model_type, const std::string& source) {
  std::string known;
  for (const Family* f : all_families()) {
    if (model_type == f->name) return *f;
    known += (known.empty() ? "" : ", ") + std::string(f->name);
  }
  throw std::invalid_argument(source + ": unknown model family '" + model_type + "' (supported: " + known + ")");
}

ModelConfig load_hf_config(const std::string& json_text, const std::string& source) {
  nlohmann::json j = parse_json(json_text, source);
  if (!j.is_object()) throw std::invalid_argument(source + ": expected a JSON object");
  const HfConfig config(std::move(j), source);
  const std::string type = config.get<std::string>("model_type");
  const Family& family = find_family(type, source);
  ModelConfig c;
  c.name = config.get<std::string>("_name_or_path", type);
  if (c.name.empty()) c.name = type;
  family.read_config(config, c);
  c.family = family.name;
  c.validate(source);
  return c;
}

std::int64_t split_layer_name(const std::string& name, std::string& rest) {
  if (name.rfind("layers.", 0) != 0) {
    rest = name;
    return -1;
  }
  const std::size_t dot = name.find('.', 7);
  rest = name.substr(dot + 1);
  return std::stoll(name.substr(7, dot - 7));
}

}  // namespace flexh2o::engine
