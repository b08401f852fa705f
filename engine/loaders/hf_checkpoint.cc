#include "engine/loaders/hf_checkpoint.h"
#include "offload/text_file.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "engine/loaders/read_rows.h"

namespace flexh2o::engine {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  auto text = offload::read_text_file(p.string());
  if (!text) throw std::runtime_error(p.string() + ": cannot open");
  return std::move(*text);
}

// Splits "layers.7.wq" into 7 and "wq"; returns -1 for non-layer names.
std::int64_t split_layer(const std::string& name, std::string& rest) {
  if (name.rfind("layers.", 0) != 0) {
    rest = name;
    return -1;
  }
  const std::size_t dot = name.find('.', 7);
  rest = name.substr(dot + 1);
  return std::stoll(name.substr(7, dot - 7));
}

}  // namespace

std::vector<std::string> hf_tensor_names(Family family, const std::string& canonical) {
  std::string rest;
  const std::int64_t layer = split_layer(canonical, rest);
  std::string hf;
  if (family == Family::Opt) {
    static const std::map<std::string, std::string> global = {
        {"tok_embed", "decoder.embed_tokens.weight"},        {"pos_embed", "decoder.embed_positions.weight"},
        {"final_norm.weight", "decoder.final_layer_norm.weight"}, {"final_norm.bias", "decoder.final_layer_norm.bias"},
    };
    static const std::map<std::string, std::string> per_layer = {
        {"attn_norm.weight", "self_attn_layer_norm.weight"}, {"attn_norm.bias", "self_attn_layer_norm.bias"},
        {"wq", "self_attn.q_proj.weight"}, {"bq", "self_attn.q_proj.bias"},
        {"wk", "self_attn.k_proj.weight"}, {"bk", "self_attn.k_proj.bias"},
        {"wv", "self_attn.v_proj.weight"}, {"bv", "self_attn.v_proj.bias"},
        {"wo", "self_attn.out_proj.weight"}, {"bo", "self_attn.out_proj.bias"},
        {"mlp_norm.weight", "final_layer_norm.weight"}, {"mlp_norm.bias", "final_layer_norm.bias"},
        {"fc1", "fc1.weight"}, {"fc1_bias", "fc1.bias"}, {"fc2", "fc2.weight"}, {"fc2_bias", "fc2.bias"},
    };
    if (canonical == "lm_head") return {"lm_head.weight"};
    const auto& table = layer < 0 ? global : per_layer;
    const auto it = table.find(rest);
    if (it == table.end()) return {};
    hf = layer < 0 ? it->second : "decoder.layers." + std::to_string(layer) + "." + it->second;
    return {"model." + hf, hf};  // OPTForCausalLM prefixes "model.", OPTModel does not
  }
  static const std::map<std::string, std::string> global = {
      {"tok_embed", "model.embed_tokens.weight"}, {"final_norm.weight", "model.norm.weight"}, {"lm_head", "lm_head.weight"}};
  static const std::map<std::string, std::string> per_layer = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"wq", "self_attn.q_proj.weight"},
      {"wk", "self_attn.k_proj.weight"}, {"wv", "self_attn.v_proj.weight"}, {"wo", "self_attn.o_proj.weight"},
      {"mlp_norm.weight", "post_attention_layernorm.weight"}, {"w_gate", "mlp.gate_proj.weight"},
      {"w_up", "mlp.up_proj.weight"}, {"w_down", "mlp.down_proj.weight"},
  };
  const auto& table = layer < 0 ? global : per_layer;
  const auto it = table.find(rest);
  if (it == table.end()) return {};
  return {layer < 0 ? it->second : "model.layers." + std::to_string(layer) + "." + it->second};
}

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  const fs::path config = root / "config.json";
  if (!fs::exists(config)) throw std::runtime_error(dir + ": no config.json; a Hugging Face model directory needs one");
  config_ = load_hf_config(read_text(config), config.string());

  std::vector<fs::path> shards;
  const fs::path index = root / "model.safetensors.index.json";
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text(index));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(index.string() + ": not valid JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw std::runtime_error(index.string() + ": missing object field 'weight_map'");
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw std::runtime_error(index.string() + ": weight_map entry '" + tensor + "' is not a file name");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == "..")
        throw std::runtime_error(index.string() + ": weight_map entry '" + tensor + "' points outside the directory");
      names.insert(f);
    }
    for (const auto& n : names) shards.push_back(root / n);
  } else if (fs::exists(root / "model.safetensors")) {
    shards.push_back(root / "model.safetensors");
  } else {
    throw std::runtime_error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  for (const auto& s : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>(s.string()));
    for (const auto& e : files_.back()->entries()) by_hf_name_[e.name] = {files_.back().get(), &e};
  }
}

std::optional<HfCheckpoint::Located> HfCheckpoint::locate(const std::string& canonical) const {
  for (const auto& n : hf_tensor_names(config_.family, canonical)) {
    const auto it = by_hf_name_.find(n);
    if (it != by_hf_name_.end()) return it->second;
  }
  return std::nullopt;
}

std::optional<std::vector<std::int64_t>> HfCheckpoint::shape(const std::string& name) const {
  const auto loc = locate(name);
  if (!loc) return std::nullopt;
  if (!loc->entry->dtype)
    throw std::runtime_error("tensor " + origin(name) + " has dtype " + loc->entry->dtype_name +
                             "; supported: F32, F16, BF16");
  return loc->entry->shape;
}

std::string HfCheckpoint::origin(const std::string& name) const {
  const auto loc = locate(name);
  if (loc) return "'" + loc->entry->name + "' in " + loc->file->path();
  const auto names = hf_tensor_names(config_.family, name);
  return "'" + (names.empty() ? name : names.front()) + "' in " + dir_;
}

void HfCheckpoint::read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                             kernels::DType to) const {
  const auto loc = locate(name);
  if (!loc || !loc->entry->dtype) throw std::runtime_error("missing or unsupported tensor " + origin(name));
  const auto& e = *loc->entry;
  const std::int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  const std::int64_t cols = rows == 0 ? 0 : e.numel() / rows;
  read_converted_rows([&](std::uint64_t off, void* buf, std::uint64_t n) { loc->file->read(e, off, buf, n); },
                      *e.dtype, rows, cols, row_begin, row_end, dst, to, origin(name));
}

}  // namespace flexh2o::engine
