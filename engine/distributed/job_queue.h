// A data-parallel job's queue over MPI (dynamic dealing). Every rank holds the job's requests;
// rank 0 holds the queue of those not yet dealt (RootQueue), preferring for a rank the
// requests whose prompt prefix it took recently (DealQueue). Its own runner takes from it
// directly, a request at a time as its slots free; the other ranks' runners ask it as theirs
// free (RankQueue, with a few requests in hand ahead so that a freed slot rarely waits), so a
// rank whose requests end early takes more. The ranks send each finished request's outcome
// back as it ends, and rank 0 writes it at once; then each sends its report. Rank 0 answers
// between its own steps. An OpenAI line's n choices are dealt to one rank together.
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/distributed/mpi_comm.h"
#include "engine/distributed/sharding.h"
#include "engine/serving/request.h"
#include "engine/serving/request_source.h"
#include "engine/runtime/generator.h"

namespace flexh2o::distributed {

// Rank 0's side.
class RootQueue {
 public:
  // Called with each finished request of the job (its index and its one-sequence result), rank
  // 0's own and the ones the other ranks send, as they come.
  using Finished = std::function<void(std::size_t index, const engine::GenerationResult& one)>;
  // Deals every other rank its first `first_deal` requests at once, unasked, so that none waits
  // for rank 0 to reach its first step (loading its weights) before it can start; `prefer`:
  // how it picks each rank's requests (DealQueue).
  RootQueue(const Mpi& mpi, std::span<const serving::Request> requests, std::size_t first_deal, PrefixDealing prefer,
            Finished finished);
  // What rank 0's own runner takes from.
  serving::RequestSource& source() { return own_; }
  // Answers the asks and takes the outcomes waiting (between rank 0's steps).
  void poll();
  // After rank 0's runner ended: serves the other ranks until each sent its report; every
  // rank's report, rank 0's (`own`) first.
  std::vector<nlohmann::json> reports(nlohmann::json own);

 private:
  class Own final : public serving::RequestSource {
   public:
    explicit Own(DealQueue& queue) : queue_(queue) {}
    std::optional<std::size_t> next(std::size_t from, bool wait) override;

   private:
    DealQueue& queue_;
    Hand hand_;
  };
  void take(int from, const nlohmann::json& msg);  // one message from a rank

  const Mpi& mpi_;
  DealQueue queue_;
  Own own_;
  Finished finished_;
  std::vector<nlohmann::json> reports_;
  int reports_due_;
  std::vector<PendingSend> sends_;
};

// A rank's side (rank > 0): the requests rank 0 deals it, and its outcomes and report sent back.
class RankQueue final : public serving::RequestSource {
 public:
  // `slots`: requests the runner runs at once (it asks for that many when none runs);
  // `ahead`: requests kept in hand beyond those running (continuous batching). Rank 0's first
  // deal comes unasked.
  RankQueue(const Mpi& mpi, std::size_t slots, std::size_t ahead);
  std::optional<std::size_t> next(std::size_t from, bool wait) override;
  // A finished request (index into the job's requests) and its one-sequence result.
  void send_finished(std::size_t index, const engine::GenerationResult& one);
  // After the runner ended: waits for the answer to an ask still on its way, then sends the
  // report and waits for every send.
  void send_report(const nlohmann::json& report);

 private:
  void ask(std::size_t want);
  void receive(bool wait);  // the answer to the ask, if any is on its way (waiting for it)

  const Mpi& mpi_;
  std::size_t slots_, ahead_;
  Hand hand_;
  bool asking_ = true, none_left_ = false;  // asking_: an answer is on its way
  std::vector<PendingSend> sends_;
};

// A one-sequence result as a message, and back (tokens, finish reason, log-probabilities).
nlohmann::json to_json(const engine::GenerationResult& one);
engine::GenerationResult sequence_from_json(const nlohmann::json& j);

}  // namespace flexh2o::distributed
