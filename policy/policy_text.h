// A Policy as people and programs read it: the one wording that `run`, `plan`, `bench` and the
// MPI runs print, and the one JSON that metrics files record (so the paths cannot drift apart).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "policy/policy.h"

namespace flexh2o::policy {

// "WG WC CG CC AG AC" in percent, each with `decimals` places (-1: as short as %g prints it).
std::string percent_text(const Policy& p, int decimals = -1);
// "gpu batch B x K batches, percent [..], overlap true, sep_layer true, cpu_cache_compute false, kv full".
std::string to_text(const Policy& p);
// Every field a run uses; expert_slots resolved for a model of `experts` routed experts, each
// token to `top_k` of them (0 experts: a dense model).
nlohmann::json to_json(const Policy& p, std::int64_t experts, std::int64_t top_k);

}  // namespace flexh2o::policy
