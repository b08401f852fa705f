// SIGINT/SIGTERM during `flexh2o run`: the first finishes the current block (its results are
// written) and stops; the second abandons the block; a third exits at once. The handler only
// counts (the run checks the count between steps), so offload files are removed by ordinary
// unwinding; only the third removes them from the handler itself.
#pragma once
#include <csignal>
#include <stdexcept>

namespace flexh2o::serving {

class Interrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InterruptWatch {
 public:
  // Installs the handlers; construct before any disk store exists (they take over from the
  // store's remove-and-die handlers).
  InterruptWatch();
  ~InterruptWatch();  // restores the previous handlers
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;

  bool stop_requested() const;
  bool abandon_requested() const;

 private:
  struct sigaction previous_int_ {}, previous_term_ {};
};

}  // namespace flexh2o::serving
