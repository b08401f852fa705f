#include "engine/serving/engine.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/serving/engine_flight.h"
#include "policy/policy_text.h"

namespace flexh2o::serving {

std::vector<Request> requests_to_run(std::span<const Request> all, const std::optional<ResultFile>& out,
                                     bool resuming, const std::string& out_path) {
  std::vector<Request> todo;
  for (const Request& r : all)
    if (!out || !out->done_ids().count(r.id_json)) todo.push_back(r);
  if (resuming)
    fmt::print(stderr, "resuming: {} of {} prompts already in {}\n", all.size() - todo.size(), all.size(), out_path);
  return todo;
}

bool stop_string_ends(const StopStringSeen& seen, const Request& r, std::span<const std::int32_t> generated) {
  return !r.stop.empty() && static_cast<std::int64_t>(generated.size()) >= r.sampling.min_tokens && seen(r, generated);
}

bool shares_prompt_of_previous(std::span<const Request> requests, std::size_t i) {
  return i > 0 && requests[i].choice > 0 && requests[i - 1].source == requests[i].source;
}

std::vector<std::shared_ptr<const engine::TokenConstraint>> request_constraints(std::span<const Request> requests,
                                                                               JobConstraints* constraints) {
  if (std::none_of(requests.begin(), requests.end(), [](const Request& r) { return r.constraint.has_value(); }))
    return {};
  if (!constraints) throw std::logic_error("requests with structured output need the job's constraints");
  std::vector<std::shared_ptr<const engine::TokenConstraint>> out;
  for (const Request& r : requests) out.push_back(r.constraint ? constraints->get(*r.constraint) : nullptr);
  return out;
}

std::string stopped_message(const std::string& who, std::size_t finished, std::size_t requests,
                            const std::string& results_in) {
  return fmt::format("flexh2o: interrupted: {} stopped after {} of the job's {} requests{}\n", who, finished, requests,
                     results_in.empty() ? "" : "; rerun with --resume to continue");
}

namespace {

// What a backend's kernels ran since an earlier reading `before`: the GEMMs' calls and FLOPs less
// those, so that a job's figures leave out the machine's measurement at start. The primitives
// are those used by then (the library does not count them).
kernels::KernelUse used_since(const kernels::KernelUse& now, const kernels::KernelUse& before) {
  kernels::KernelUse d{now.isa, {}, now.primitives};
  for (kernels::KernelUse::Path p : now.gemm) {
    for (const kernels::KernelUse::Path& b : before.gemm)
      if (b.name == p.name) p.calls -= b.calls, p.flops -= b.flops;
    if (p.calls > 0) d.gemm.push_back(p);
  }
  return d;
}

offload::TierOptions engine_tiers(const EngineOptions& o) {
  offload::TierOptions t = o.tiers;
  t.pin_host = o.policy.pin_weight;
  return t;
}

}  // namespace

Engine::Engine(kernels::Backend& backend, const engine::ModelConfig& config, const engine::WeightSource& weights,
               EngineOptions options, const InterruptWatch* interrupts)
    : config_(config), o_(std::move(options)), interrupts_(interrupts),
      tiers_(backend, engine_tiers(o_)) {
  if (o_.trace) trace_.emplace();
  kernels_at_start_ = backend.kernel_use();
  const engine::LayerRange layers = o_.stage ? engine::stage_layers(config, *o_.stage) : engine::LayerRange{};
  exec_ = std::make_unique<engine::BlockExecutor>(backend, tiers_, config, weights, o_.policy, trace(),
                                                   offload::CopyOptions{}, layers);
}

Engine::~Engine() = default;

engine::GenerationHooks Engine::block_hooks(std::span<const Request> requests) {
  engine::GenerationHooks hooks;
  if (o_.stop_string_seen)
    hooks.stop_here = [requests, &seen = o_.stop_string_seen](std::size_t b, std::span<const std::int32_t> generated) {
      return stop_string_ends(seen, requests[b], generated);
    };
  hooks.on_step = [this](std::int64_t, std::int64_t) { between_steps(); };
  return hooks;
}

engine::GenerationRequest Engine::block_request(std::span<const Request> requests) const {
  engine::GenerationRequest req;
  req.max_new_tokens = 0;
  req.share_prefixes = o_.share_prefixes;
  req.hold_prefixes = o_.hold_prefixes;
  req.cuda_graphs = o_.cuda_graphs;
  const auto constraints = request_constraints(requests, o_.constraints);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    req.sequences.push_back({.prompt = r.prompt,
                             .max_new_tokens = r.max_tokens,
                             .sampling = r.sampling,
                             .stream = r.stream,
                             .shares_prompt = o_.share_prefill && shares_prompt_of_previous(requests, i),
                             .constraint = constraints.empty() ? nullptr : constraints[i]});
    req.max_new_tokens = std::max(req.max_new_tokens, r.max_tokens);
  }
  return req;
}

engine::GenerationRequest Engine::continuous_request(std::span<const Request> requests) const {
  engine::GenerationRequest req = block_request(requests);
  req.slots = o_.policy.block_size();
  req.prefill_budget = o_.prefill_budget;
  return req;
}

void Engine::check_abandon() const {
  if (interrupts_ && interrupts_->abandon_requested())
    throw Interrupted("interrupted: the requests under way were abandoned; finished ones are in " +
                      (o_.results_in.empty() ? std::string("the output")
                                             : o_.results_in + "; rerun with --resume to continue"));
}

bool Engine::stop_requested() const { return interrupts_ && interrupts_->stop_requested(); }

RunReport Engine::report(const std::string& description, std::span<const Request> requests, std::int64_t gen_len,
                         const JobOutcome& outcome) const {
  RunReport r = make_run_report(description, config_, o_.policy, static_cast<std::int64_t>(requests.size()),
                                longest_prompt(requests), longest_limit(requests, gen_len), outcome.total, tiers_,
                                *exec_, trace_ ? &*trace_ : nullptr);
  r.batching = o_.continuous ? "continuous" : "fixed";
  r.wall_seconds = outcome.wall_seconds;
  r.timings = outcome.timings;
  r.kernels = used_since(tiers_.backend().kernel_use(), kernels_at_start_);
  return r;
}

RunPart Engine::part(const std::string& name, int rank, const std::string& host,
                     const engine::GenerationResult& total) const {
  RunPart p{.name = name, .rank = rank, .host = host, .result = total, .kv_reads = exec_->kv_reads(),
            .kv_copies = exec_->kv_copies(), .kv_held = exec_->kv_held()};
  const auto& moe = config_.moe;
  p.placement = Placement{policy::to_json(o_.policy, moe.experts, moe.top_k), policy::to_text(o_.policy), peaks_of(tiers_)};
  if (trace_) p.spans = trace_->spans();
  return p;
}

}  // namespace flexh2o::serving
