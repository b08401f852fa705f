#include "engine/distributed/data_parallel.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "engine/runtime/prefix_match.h"

namespace flexh2o::distributed {

std::string rank_name(const Mpi& mpi) { return "rank " + std::to_string(mpi.rank()) + " (" + mpi.host() + ")"; }

std::vector<serving::Request> share_requests(const Mpi& mpi, const std::vector<serving::Request>& todo) {
  nlohmann::json all = nlohmann::json::array();
  if (mpi.rank() == 0)
    for (const serving::Request& r : todo) all.push_back(serving::to_json(r));
  const nlohmann::json got = from_bytes(mpi.broadcast(mpi.rank() == 0 ? to_bytes(all) : Bytes{}, 0));
  if (mpi.rank() == 0) return todo;
  std::vector<serving::Request> requests;
  for (const nlohmann::json& r : got) requests.push_back(serving::request_from_json(r));
  return requests;
}

namespace {

// Requests a rank keeps in hand beyond those running: under continuous batching a few, so that
// a freed slot rarely waits for rank 0's answer; fixed blocks ask for a block as one starts.
std::size_t requests_ahead(const serving::EngineOptions& o) {
  return o.continuous ? 1 + static_cast<std::size_t>(o.policy.block_size()) / 16 : 0;
}

// Runs the requests `source` deals this rank with its engine; each finished one goes to
// `finished` by its index in `todo`. A first signal stops taking requests (those running
// finish), a second abandons them (throws serving::Interrupted). Returns the rank's part.
serving::RunPart run_rank(const Mpi& mpi, const RankEngine& e, std::span<const serving::Request> todo,
                      serving::RequestSource& source, const RootQueue::Finished& finished,
                      const std::function<void()>& between_steps, const serving::InterruptWatch& interrupts) {
  if (todo.empty()) return {.name = rank_name(mpi), .rank = mpi.rank(), .host = mpi.host()};
  serving::Engine engine(e.backend, e.config, e.weights, e.options, &interrupts);
  const serving::JobOutcome done = engine.run(
      todo,
      [&](std::span<const std::size_t> at, const engine::GenerationResult& r) {
        for (std::size_t t = 0; t < at.size(); ++t) finished(at[t], r.sequence(t));
      },
      &source, between_steps);
  serving::RunPart part = engine.part(rank_name(mpi), mpi.rank(), mpi.host(), done.total);
  part.finished_requests = done.finished_requests;
  part.stopped = done.stopped;
  return part;
}

// How rank 0 deals (DealQueue), where the ranks' engines share prefixes: each prefix family to
// one rank, and to a rank those of its recent requests' families (its last block and the
// requests it keeps in hand ahead: what its cache rows hold), a rank running at most about two
// rounds of every rank's requests ahead of the queue; else in the job's order.
PrefixDealing prefix_dealing(const Mpi& mpi, const RankEngine& e, std::span<const serving::Request> todo) {
  const serving::EngineOptions& o = e.options;
  if (!o.continuous || !o.share_prefixes || !engine::prefix_sharing_off_reason(e.config, o.policy.kv != "full").empty())
    return {};
  PrefixDealing d;
  for (const serving::Request& r : todo) d.prompts.emplace_back(r.prompt);
  d.min_tokens = engine::GenerationRequest{}.min_shared_prefix;
  d.recent = static_cast<std::size_t>(o.policy.block_size()) + requests_ahead(o);
  d.lookahead = std::max<std::size_t>(16, 2 * static_cast<std::size_t>(mpi.size()) * d.recent);
  return d;
}

// A rank other than 0: runs what rank 0 deals it of `todo` (the job's requests, alike on every
// rank), sends back each finished request, then its part of the report, which it returns
// (`stopped`: an interrupt stopped it taking requests).
serving::RunPart run_dealt_rank(const Mpi& mpi, const RankEngine& e, std::span<const serving::Request> todo,
                            const serving::InterruptWatch& interrupts) {
  RankQueue queue(mpi, static_cast<std::size_t>(e.options.policy.block_size()), requests_ahead(e.options));
  const serving::RunPart part = run_rank(
      mpi, e, todo, queue,
      [&](std::size_t index, const engine::GenerationResult& one) { queue.send_finished(index, one); }, {},
      interrupts);
  queue.send_report(serving::to_json(part, true));
  return part;
}

// Rank 0: deals `todo`, runs its own share, and hands every finished request (its own and the
// other ranks', by index into `todo`) to `finished` as it comes. Returns every rank's part, in
// rank order.
std::vector<serving::RunPart> run_dealing_rank(const Mpi& mpi, const RankEngine& e, std::span<const serving::Request> todo,
                                           const serving::InterruptWatch& interrupts, const RootQueue::Finished& finished) {
  // The others' slots too, where they plan alike.
  const auto slots = static_cast<std::size_t>(e.options.policy.block_size());
  RootQueue queue(mpi, todo, slots + requests_ahead(e.options), prefix_dealing(mpi, e, todo), finished);
  const serving::RunPart own = run_rank(mpi, e, todo, queue.source(), finished, [&] { queue.poll(); }, interrupts);
  std::vector<serving::RunPart> parts;
  for (const nlohmann::json& j : queue.reports(serving::to_json(own, true))) parts.push_back(serving::part_from_json(j));
  std::ranges::sort(parts, {}, &serving::RunPart::rank);
  return parts;
}

}  // namespace

RankEngine on_this_rank(const Mpi& mpi, RankEngine job) {
  std::string& dir = job.options.tiers.offload_dir;
  if (!dir.empty()) dir += "/rank-" + std::to_string(mpi.rank());
  return job;
}

serving::RunReport ranks_report(serving::RunMode mode, const RankEngine& e) {
  serving::RunReport r{.mode = mode};
  r.stored = engine::with_weight_dtype(e.config, e.options.policy.weight_dtype(e.config.dtype));
  r.batching = e.options.continuous ? "continuous" : "fixed";
  if (e.options.constraints) r.structured_output = e.options.constraints->report();
  return r;
}

RanksOutcome run_data_parallel(const Mpi& mpi, const RankEngine& job, std::span<const serving::Request> todo,
                               const serving::InterruptWatch& interrupts, const RootQueue::Finished& finished) {
  const RankEngine e = on_this_rank(mpi, job);
  if (mpi.rank() != 0) return {.stopped = run_dealt_rank(mpi, e, todo, interrupts).stopped};
  std::vector<serving::RunPart> parts = run_dealing_rank(mpi, e, todo, interrupts, finished);
  RanksOutcome done{.report = ranks_report(serving::RunMode::DataParallel, e), .requests = todo.size()};
  done.report->parts = std::move(parts);
  for (const serving::RunPart& p : done.report->parts) {  // the job's totals are the ranks' sums
    done.report->total.add(p.result);
    done.finished_requests += p.finished_requests;
    done.stopped = done.stopped || p.stopped;
  }
  done.stopped = done.stopped || done.finished_requests != done.requests;
  return done;
}

}  // namespace flexh2o::distributed
