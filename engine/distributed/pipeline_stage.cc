#include "engine/distributed/pipeline_stage.h"

#include <chrono>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace flexh2o::distributed {

namespace {

constexpr int kTagHidden = 101, kTagTokens = 102, kTagLogprobs = 103;
// Rounds of the flights between two polls of stop_requested under continuous batching: a poll
// makes every stage wait for the others (the pipeline drains), so not every round.
constexpr std::size_t kStopPollRounds = 8;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Log-probabilities as the last stage sends them to the first: of the fixed block or the one
// request whose first prompt is `first`.
Bytes logprobs_bytes(std::size_t first, const engine::GenerationResult& r) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& sequence : r.top_logprobs) {
    nlohmann::json per_token = nlohmann::json::array();
    for (const auto& alternatives : sequence) {
      nlohmann::json a = nlohmann::json::array();
      for (const kernels::TokenLogprob& t : alternatives) a.push_back({t.token, t.logprob});
      per_token.push_back(std::move(a));
    }
    top.push_back(std::move(per_token));
  }
  return to_bytes({{"first", first}, {"logprobs", r.logprobs}, {"top_logprobs", top}});
}

// The first stage's result at prompt `first` takes the log-probabilities the last stage sent.
void take_logprobs(const Bytes& bytes, std::size_t first, engine::GenerationResult& r) {
  const nlohmann::json j = from_bytes(bytes);
  if (j.at("first").get<std::size_t>() != first)
    throw std::runtime_error("log-probabilities of prompt " + std::to_string(j["first"].get<std::size_t>()) +
                             " came where prompt " + std::to_string(first) + " finished (the stages disagree)");
  r.logprobs = j.at("logprobs").get<std::vector<std::vector<float>>>();
  r.top_logprobs.assign(r.logprobs.size(), {});
  for (std::size_t b = 0; b < r.top_logprobs.size(); ++b)
    for (const auto& alternatives : j.at("top_logprobs").at(b)) {
      auto& a = r.top_logprobs[b].emplace_back();
      for (const auto& t : alternatives) a.push_back({t.at(0).get<std::int32_t>(), t.at(1).get<float>()});
    }
}

// One stage's walk over its flights (the engine's blocks in flight), round after round, a
// step of each in turn, until none has work. Every stage records a flight's step at the
// flight's next turn, the last stage too, so that all of them admit requests (from the
// engine's one queue) in the same order.
class StageLoop {
 public:
  StageLoop(const Mpi& mpi, serving::Engine& engine, std::span<const serving::Request> requests, std::int64_t micro_batches,
            const PromptsFinished& finished)
      : mpi_(mpi), engine_(engine), requests_(requests), trace_(engine.trace()), finished_(finished),
        continuous_(engine.options().continuous), me_(mpi.rank()), last_(mpi.size() - 1),
        flights_(static_cast<std::size_t>(micro_batches)) {
    if (me_ > 0) links_.hidden.receive = [this](std::int64_t, std::span<float> hidden) { receive_hidden(hidden); };
    if (me_ < last_) {
      links_.hidden.send = [this](std::int64_t, std::span<const float> hidden) { send_hidden(hidden); };
      links_.receive_tokens = [this](std::span<std::int32_t> next) { receive_tokens(next); };
    } else {
      links_.send_tokens = [this](std::span<const std::int32_t> next) { send_tokens(next); };
    }
  }

  StageStats run() {
    const double t0 = now_seconds();
    engine_.start(requests_, [this](std::span<const std::size_t> at, const engine::GenerationResult& r) {
      prompts_finished(at.front(), r);
    }, feed());
    for (bool any = true; any; ++round_) {
      any = false;
      if (continuous_) poll_stop();
      for (current_ = 0; current_ < flights_; ++current_) any = engine_.step(current_, links_) || any;
    }
    const serving::JobOutcome done = engine_.end();
    for (auto& s : sends_) s.wait();
    stats_.total = done.total;
    stats_.stopped = done.stopped;
    stats_.wall_seconds = now_seconds() - t0;
    return stats_;
  }

 private:
  // The stages stop taking requests together: under continuous batching when the last poll
  // agreed to, with fixed blocks as each block would start (every stage asks there alike).
  serving::JobFeed feed() {
    serving::JobFeed f{.flights = flights_};
    if (continuous_)
      f.stop = [this] { return stop_admitting_; };
    else
      f.stop = [this] { return mpi_.any(engine_.stop_requested()); };
    return f;
  }

  // Continuous: every few rounds the stages agree whether to stop taking requests.
  void poll_stop() {
    if (round_ % kStopPollRounds != 0 || stop_admitting_) return;
    stop_admitting_ = mpi_.any(engine_.stop_requested());
  }

  // The last stage sampled them itself.
  void send_tokens(std::span<const std::int32_t> next) {
    const auto bytes = std::make_shared<const Bytes>(std::as_bytes(next).begin(), std::as_bytes(next).end());
    for (int r = 0; r < last_; ++r) sends_.push_back(mpi_.isend(r, kTagTokens, bytes));
  }

  void receive_tokens(std::span<std::int32_t> next) {
    waiting("wait_tokens", [&] {
      mpi_.recv_into(last_, kTagTokens, std::as_writable_bytes(next), "sampled tokens from the last stage");
    });
  }

  // Results at prompt `first`: the last stage, which sampled, sends their log-probabilities
  // (when some sequence asks) to the first as soon as they end, so that the first need not
  // wait; the first hands them on.
  void prompts_finished(std::size_t first, const engine::GenerationResult& r) {
    if (!r.logprobs.empty() && me_ == last_ && me_ != 0)
      sends_.push_back(mpi_.isend(0, kTagLogprobs, std::make_shared<const Bytes>(logprobs_bytes(first, r))));
    if (me_ != 0) return;
    if (r.logprobs.empty() || last_ == 0) return finished_(first, r);
    engine::GenerationResult sampled = r;
    waiting("wait_logprobs", [&] { take_logprobs(mpi_.recv(last_, kTagLogprobs), first, sampled); });
    finished_(first, sampled);
  }

  void receive_hidden(std::span<float> hidden) {
    progress();
    waiting("wait_hidden", [&] {
      mpi_.recv_into(me_ - 1, kTagHidden, std::as_writable_bytes(hidden), "hidden states from the previous stage");
    });
  }

  void send_hidden(std::span<const float> hidden) {
    progress();
    const auto bytes = std::as_bytes(hidden);
    sends_.push_back(mpi_.isend(me_ + 1, kTagHidden, std::make_shared<const Bytes>(bytes.begin(), bytes.end())));
  }

  // Completed sends let go of their buffers; testing them also lets MPI progress.
  void progress() {
    while (!sends_.empty() && sends_.front().test()) sends_.pop_front();
  }

  void waiting(const char* what, const std::function<void()>& receive) {
    offload::ScopedSpan span(trace_, "pipeline", what, "slot " + std::to_string(current_));
    const double w0 = now_seconds();
    receive();
    stats_.wait_seconds += now_seconds() - w0;
  }

  const Mpi& mpi_;
  serving::Engine& engine_;
  std::span<const serving::Request> requests_;
  offload::Trace* trace_;
  const PromptsFinished& finished_;
  const bool continuous_;  // continuous batching in each flight, else fixed blocks
  const int me_, last_;
  const std::size_t flights_;  // micro-batches in flight
  serving::StepLinks links_;
  std::deque<PendingSend> sends_;
  StageStats stats_;
  std::size_t current_ = 0;      // the flight whose step runs
  std::size_t round_ = 0;        // of the walk over the flights
  bool stop_admitting_ = false;  // continuous: the stages agreed to stop taking requests
};

}  // namespace

StageStats run_pipeline_stage(const Mpi& mpi, serving::Engine& engine, std::span<const serving::Request> requests,
                              std::int64_t micro_batches, const PromptsFinished& finished) {
  const engine::BlockExecutor& exec = engine.executor();
  if (exec.holds_input() != (mpi.rank() == 0) || exec.holds_head() != (mpi.rank() == mpi.size() - 1))
    throw std::logic_error("pipeline rank " + std::to_string(mpi.rank()) + " holds the wrong end of the model");
  if (micro_batches < 1) throw std::invalid_argument("a pipeline needs micro-batches");
  if (requests.empty()) return {};
  return StageLoop(mpi, engine, requests, micro_batches, finished).run();
}

}  // namespace flexh2o::distributed
