// Removal of the offload files and directories of live stores when SIGINT or SIGTERM kills the
// process. A signal handler may only touch pre-built C strings, so each path lives in a fixed
// slot; the first registration installs the handlers (unless leave_signals_to_caller() was called).
#pragma once
#include <string>

namespace flexh2o::offload {

// By default the first store installs SIGINT/SIGTERM handlers that remove every offload file
// and then let the signal kill the process. A program that stops gracefully on those signals
// calls this first (before any store exists) and cleans up by unwinding instead.
void leave_signals_to_caller();
// Removes every live offload file and directory now. Async-signal-safe, for a caller's handler
// that must exit at once.
void remove_offload_files_now() noexcept;

// Registers a path to remove on a signal. Returns its slot, or -1 when it cannot be registered
// (it is then only removed by its owner).
int register_live_path(const std::string& path, bool is_dir);
void unregister_live_path(int slot);

}  // namespace flexh2o::offload
