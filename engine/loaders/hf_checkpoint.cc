#include "engine/loaders/hf_checkpoint.h"
#include "offload/text_file.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "engine/families/family.h"
#include "engine/io/json_input.h"
#include "engine/loaders/read_rows.h"

namespace flexh2o::engine {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  auto text = offload::read_text_file(p.string());
  if (!text) throw std::runtime_error(p.string() + ": cannot open");
  return std::move(*text);
}

// Stop ids from generation_config.json (what generate() stops at), when it names them.
void read_generation_stop_ids(const fs::path& file, ModelConfig& c) {
  if (!fs::exists(file)) return;
  const nlohmann::json j = parse_json(read_text(file), file.string());
  if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) return;
  try {
    const auto& eos = j["eos_token_id"];
    c.stop_ids = eos.is_array() ? eos.get<std::vector<std::int32_t>>() : std::vector<std::int32_t>{eos.get<std::int32_t>()};
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error(file.string() + ": field 'eos_token_id' must be an id or a list of ids");
  }
  c.validate(file.string());
}

}  // namespace

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  const fs::path config = root / "config.json";
  if (!fs::exists(config)) throw std::runtime_error(dir + ": no config.json; a Hugging Face model directory needs one");
  config_ = load_hf_config(read_text(config), config.string());
  read_generation_stop_ids(root / "generation_config.json", config_);
  family_ = &find_family(config_.family, config.string());
  for (auto& spec : weight_specs(config_)) specs_.emplace(spec.name, spec);

  std::vector<fs::path> shards;
  const fs::path index = root / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const nlohmann::json j = parse_json(read_text(index), index.string());
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
    for (const auto& e : files_.back()->entries()) by_hf_name_[e.name] = {files_.back().get(), &e, false, 0};
  }
}

std::optional<HfCheckpoint::Located> HfCheckpoint::locate(const std::string& canonical) const {
  for (const auto& n : family_->tensor_names(config_, canonical)) {
    const auto it = by_hf_name_.find(n.name);
    if (it != by_hf_name_.end()) return Located{it->second.file, it->second.entry, n.part, n.row_offset};
  }
  return std::nullopt;
}

std::optional<std::vector<std::int64_t>> HfCheckpoint::shape(const std::string& name) const {
  const auto loc = locate(name);
  if (!loc) return std::nullopt;
  if (!loc->entry->dtype)
    throw std::runtime_error("tensor " + origin(name) + " has dtype " + loc->entry->dtype_name +
                             "; supported: F32, F16, BF16");
  const std::vector<std::int64_t>& stored = loc->entry->shape;
  if (!loc->part) return stored;
  // A part of a fused tensor (seen as rows of its last dimension): its rows must lie inside.
  const auto spec = specs_.find(name);
  const std::int64_t rows = stored.size() < 2 || stored.back() == 0 ? 0 : loc->entry->numel() / stored.back();
  if (spec == specs_.end() || loc->row_offset + spec->second.rows > rows)
    throw std::runtime_error("tensor " + origin(name) + " has " + std::to_string(rows) + " rows of its last dimension: "
                             "too few for " + name + " at row " + std::to_string(loc->row_offset) + " of it");
  return std::vector<std::int64_t>{spec->second.rows, stored.back()};
}

std::string HfCheckpoint::origin(const std::string& name) const {
  const auto loc = locate(name);
  if (loc) return "'" + loc->entry->name + "' in " + loc->file->path();
  const auto names = family_->tensor_names(config_, name);
  return "'" + (names.empty() ? name : names.front().name) + "' in " + dir_;
}

void HfCheckpoint::read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                             kernels::DType to) const {
  const auto loc = locate(name);
  if (!loc || !loc->entry->dtype) throw std::runtime_error("missing or unsupported tensor " + origin(name));
  const auto& e = *loc->entry;
  // Rows of the first dimension; a fused tensor's parts are rows of its last dimension.
  const std::int64_t cols = loc->part ? e.shape.back() : e.shape.empty() || e.shape[0] == 0 ? 0 : e.numel() / e.shape[0];
  const std::int64_t rows = loc->part ? (cols == 0 ? 0 : e.numel() / cols) : e.shape.empty() ? 1 : e.shape[0];
  read_converted_rows([&](std::uint64_t off, void* buf, std::uint64_t n) { loc->file->read(e, off, buf, n); },
                      *e.dtype, rows, cols, loc->row_offset + row_begin, loc->row_offset + row_end, dst, to,
                      origin(name));
}

}  // namespace flexh2o::engine
