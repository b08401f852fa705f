#include "engine/distributed/job_queue.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace flexh2o::distributed {

using nlohmann::json;

namespace {

constexpr int kTagToRoot = 2;  // rank -> 0: asks, finished requests, then the rank's report
constexpr int kTagDeal = 3;    // 0 -> rank: the requests dealt for an ask (none: empty)

std::vector<bool> group_starts(std::span<const serving::Request> requests) {
  std::vector<bool> starts;
  for (const serving::Request& r : requests) starts.push_back(r.choice == 0);
  return starts;
}

PendingSend send_json(const Mpi& mpi, int dest, int tag, const json& j) {
  return mpi.isend(dest, tag, std::make_shared<const Bytes>(to_bytes(j)));
}

// Lets go of the sends that completed (testing them also progresses MPI).
void prune(std::vector<PendingSend>& sends) { std::erase_if(sends, [](PendingSend& s) { return s.test(); }); }

}  // namespace

json to_json(const engine::GenerationResult& one) {
  json j = {{"tokens", one.tokens.at(0)}, {"stop", one.finish_reasons.at(0) == engine::FinishReason::Stop}};
  if (one.finish_reasons.at(0) == engine::FinishReason::Error) j["error"] = one.errors.at(0);
  if (!one.logprobs.empty()) {
    json top = json::array();
    for (const auto& alternatives : one.top_logprobs.at(0)) {
      json a = json::array();
      for (const kernels::TokenLogprob& t : alternatives) a.push_back({t.token, t.logprob});
      top.push_back(std::move(a));
    }
    j["logprobs"] = one.logprobs.at(0);
    j["top_logprobs"] = std::move(top);
  }
  return j;
}

engine::GenerationResult sequence_from_json(const json& j) {
  engine::GenerationResult one;
  one.tokens = {j.at("tokens").get<std::vector<std::int32_t>>()};
  one.finish_reasons = {j.at("stop").get<bool>() ? engine::FinishReason::Stop : engine::FinishReason::Length};
  one.errors = {j.value("error", std::string())};
  if (j.contains("error")) one.finish_reasons = {engine::FinishReason::Error};
  if (j.contains("logprobs")) {
    one.logprobs = {j["logprobs"].get<std::vector<float>>()};
    one.top_logprobs.emplace_back();
    for (const json& alternatives : j.at("top_logprobs")) {
      auto& a = one.top_logprobs.back().emplace_back();
      for (const json& t : alternatives) a.push_back({t.at(0).get<std::int32_t>(), t.at(1).get<float>()});
    }
  }
  one.generated_tokens = static_cast<std::int64_t>(one.tokens[0].size());
  one.sequences = 1;
  return one;
}

// ---- rank 0 ----------------------------------------------------------------------------------

RootQueue::RootQueue(const Mpi& mpi, std::span<const serving::Request> requests, std::size_t first_deal,
                     PrefixDealing prefer, Finished finished)
    : mpi_(mpi),
      queue_(group_starts(requests), mpi.size(), std::move(prefer)),
      own_(queue_),
      finished_(std::move(finished)),
      reports_(static_cast<std::size_t>(mpi.size())),
      reports_due_(mpi.size() - 1) {
  for (int r = 1; r < mpi.size(); ++r)
    sends_.push_back(send_json(mpi_, r, kTagDeal, {{"deal", queue_.deal(std::max<std::size_t>(first_deal, 1), r)}}));
}

std::optional<std::size_t> RootQueue::Own::next(std::size_t from, bool) {
  if (const auto held = hand_.next(from)) return held;
  const std::vector<std::size_t> dealt = queue_.deal(1, 0);  // no wait: a group at a time
  if (dealt.empty()) return kNoneLeft;
  hand_.add(dealt);
  return hand_.next(from);
}

void RootQueue::take(int from, const json& msg) {
  if (msg.contains("ask")) {
    sends_.push_back(send_json(mpi_, from, kTagDeal, {{"deal", queue_.deal(msg["ask"].get<std::size_t>(), from)}}));
  } else if (msg.contains("done")) {
    for (const json& d : msg["done"]) finished_(d.at("index").get<std::size_t>(), sequence_from_json(d));
  } else if (msg.contains("report")) {
    reports_.at(static_cast<std::size_t>(from)) = msg["report"];
    --reports_due_;
  } else {
    throw std::runtime_error("rank " + std::to_string(from) + " sent rank 0 a message it does not know");
  }
}

void RootQueue::poll() {
  while (reports_due_ > 0 && mpi_.waiting(Mpi::kAnySource, kTagToRoot)) {
    int from = 0;
    const json msg = from_bytes(mpi_.recv(Mpi::kAnySource, kTagToRoot, &from));
    take(from, msg);
  }
  prune(sends_);
}

std::vector<json> RootQueue::reports(json own) {
  while (reports_due_ > 0) {
    mpi_.await(Mpi::kAnySource, kTagToRoot);
    poll();
  }
  for (PendingSend& s : sends_) s.wait();
  reports_[0] = std::move(own);
  return reports_;
}

// ---- the other ranks -------------------------------------------------------------------------

RankQueue::RankQueue(const Mpi& mpi, std::size_t slots, std::size_t ahead)
    : mpi_(mpi), slots_(std::max<std::size_t>(slots, 1)), ahead_(ahead) {}

void RankQueue::ask(std::size_t want) {
  sends_.push_back(send_json(mpi_, 0, kTagToRoot, {{"ask", want}}));
  asking_ = true;
}

void RankQueue::receive(bool wait) {
  if (!asking_) return;
  if (wait) mpi_.await(0, kTagDeal);
  else if (!mpi_.waiting(0, kTagDeal)) return;
  const json msg = from_bytes(mpi_.recv(0, kTagDeal));
  asking_ = false;
  const auto dealt = msg.at("deal").get<std::vector<std::size_t>>();
  if (dealt.empty()) none_left_ = true;
  hand_.add(dealt);
}

std::optional<std::size_t> RankQueue::next(std::size_t from, bool wait) {
  receive(false);
  for (;;) {
    if (const auto held = hand_.next(from)) {
      // Keep `ahead` in hand beyond this one, so that the next freed slot need not wait.
      if (!asking_ && !none_left_ && hand_.size() <= ahead_) ask(ahead_ + 1 - hand_.size());
      return held;
    }
    if (none_left_) return kNoneLeft;
    // Nothing runs (wait): enough for every slot; else this slot and those ahead.
    if (!asking_) ask(wait ? slots_ + ahead_ : ahead_ + 1);
    if (!wait) return std::nullopt;
    receive(true);
  }
}

void RankQueue::send_finished(std::size_t index, const engine::GenerationResult& one) {
  json d = to_json(one);
  d["index"] = index;
  sends_.push_back(send_json(mpi_, 0, kTagToRoot, {{"done", json::array({std::move(d)})}}));
  prune(sends_);
}

void RankQueue::send_report(const json& report) {
  receive(true);  // an ask's answer still on its way (the runner stopped before taking it)
  sends_.push_back(send_json(mpi_, 0, kTagToRoot, {{"report", report}}));
  for (PendingSend& s : sends_) s.wait();
}

}  // namespace flexh2o::distributed
