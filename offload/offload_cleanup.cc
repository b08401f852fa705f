#include "offload/offload_cleanup.h"

#include <climits>
#include <csignal>
#include <cstring>
#include <mutex>
#include <unistd.h>

#include "offload/io_text.h"

namespace flexh2o::offload {

namespace {

std::atomic<bool> g_said_no_handlers{false};
std::atomic<bool> g_said_registry_full{false};

constexpr int kMaxLivePaths = 64;
struct LivePath {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 live
  bool is_dir = false;
  char path[PATH_MAX] = {};
};
LivePath g_live[kMaxLivePaths];
struct sigaction g_prev_int;
struct sigaction g_prev_term;
std::once_flag g_handlers_once;

std::atomic<bool> g_signals_external{false};

void on_fatal_signal(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;
  remove_offload_files_now();
  const struct sigaction& prev = sig == SIGINT ? g_prev_int : g_prev_term;
  // A handler installed before ours still runs (e.g. a graceful-stop handler).
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, ctx);
    errno = saved_errno;
    return;
  }
  if ((prev.sa_flags & SA_SIGINFO) == 0 && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    errno = saved_errno;
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_signal_handlers() {
  for (const auto& [sig, prev] : {std::pair{SIGINT, &g_prev_int}, std::pair{SIGTERM, &g_prev_term}}) {
    struct sigaction cur {};
    bool ok = ::sigaction(sig, nullptr, &cur) == 0;
    // An ignored signal cannot kill us, so there is nothing to clean up for it.
    if (ok && (cur.sa_flags & SA_SIGINFO) == 0 && cur.sa_handler == SIG_IGN) continue;
    *prev = cur;
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    ok = ok && ::sigemptyset(&sa.sa_mask) == 0 && ::sigaddset(&sa.sa_mask, SIGINT) == 0 &&
         ::sigaddset(&sa.sa_mask, SIGTERM) == 0 && ::sigaction(sig, &sa, nullptr) == 0;
    if (!ok) {
      note_once(g_said_no_handlers, "cannot install signal handlers (" + errno_text(errno) +
                                        "); offload files may be left behind if interrupted");
    }
  }
}

}  // namespace

int register_live_path(const std::string& path, bool is_dir) {
  if (!g_signals_external.load()) std::call_once(g_handlers_once, install_signal_handlers);
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kMaxLivePaths; ++i) {
    int expected = 0;
    if (!g_live[i].state.compare_exchange_strong(expected, 1)) continue;
    std::memcpy(g_live[i].path, path.c_str(), path.size() + 1);
    g_live[i].is_dir = is_dir;
    g_live[i].state.store(2);
    return i;
  }
  note_once(g_said_registry_full, "too many offload paths to remove on a signal; " + path +
                                      " may be left behind if interrupted");
  return -1;
}

void unregister_live_path(int slot) {
  if (slot >= 0) g_live[slot].state.store(0);
}


void remove_offload_files_now() noexcept {
  for (bool dirs : {false, true}) {  // files first so their directories are empty
    for (LivePath& p : g_live) {
      if (p.state.load() != 2 || p.is_dir != dirs) continue;
      if (dirs) {
        ::rmdir(p.path);
      } else {
        ::unlink(p.path);
      }
    }
  }
}

void leave_signals_to_caller() { g_signals_external.store(true); }

}  // namespace flexh2o::offload
