#include "engine/serving/interrupts.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "offload/offload_cleanup.h"

namespace flexh2o::serving {

namespace {

std::atomic<int> g_count{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free counter");

void say(const char* text) {
  // write(2) is async-signal-safe; a short or failed write only loses the message.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
}

void on_signal(int) {
  const int saved_errno = errno;
  switch (++g_count) {
    case 1: say("\nflexh2o: interrupted: finishing the current block (interrupt again to abandon it)\n"); break;
    case 2: say("\nflexh2o: interrupted again: abandoning the current block\n"); break;
    default:
      offload::remove_offload_files_now();
      say("\nflexh2o: interrupted three times: exiting now\n");
      ::_exit(130);
  }
  errno = saved_errno;
}

}  // namespace

InterruptWatch::InterruptWatch() {
  offload::leave_signals_to_caller();
  g_count = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;  // I/O in progress carries on
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &previous_int_);
  sigaction(SIGTERM, &sa, &previous_term_);
}

InterruptWatch::~InterruptWatch() {
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGTERM, &previous_term_, nullptr);
}

bool InterruptWatch::stop_requested() const { return g_count.load() >= 1; }
bool InterruptWatch::abandon_requested() const { return g_count.load() >= 2; }

}  // namespace flexh2o::serving
