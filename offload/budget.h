// Per-tier byte budgets. Every allocation in a tier is charged to its Budget first, so a
// plan that does not fit fails early with a message that says what to change.
#pragma once
#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/option_error.h"
#include "offload/tier.h"

namespace flexh2o::offload {

// "16GiB", "512MiB", "1.5GB", "123" -> bytes. KiB/MiB/GiB/TiB are powers of 1024,
// KB/MB/GB/TB powers of 1000, a plain number (or "B") is bytes; units are case-insensitive.
// Fractions are rounded to the nearest byte. Throws std::invalid_argument naming the text.
std::int64_t parse_bytes(std::string_view text);
// 1610612736 -> "1.50 GiB"; below 1 KiB -> "123 B".
std::string format_bytes(std::int64_t bytes);
// What to change when a tier is full, e.g. "raise <the gpu tier's capacity> or move more to
// cpu/disk", naming the options that give it room.
std::vector<kernels::OptionText::Piece> tier_hint(Tier t);

// A reservation beyond a tier's capacity; its text ends with the tier's hint.
class BudgetExceeded : public kernels::OptionRuntimeError {
 public:
  using kernels::OptionRuntimeError::OptionRuntimeError;
};

class Budget;

// Bytes reserved from a Budget, released on destruction.
class Reservation {
 public:
  Reservation() = default;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  Reservation(Reservation&& o) noexcept;
  Reservation& operator=(Reservation&& o) noexcept;
  ~Reservation() { reset(); }

  std::int64_t bytes() const { return bytes_; }
  void reset() noexcept;

 private:
  friend class Budget;
  Reservation(Budget* b, std::int64_t bytes) : budget_(b), bytes_(bytes) {}
  Budget* budget_ = nullptr;
  std::int64_t bytes_ = 0;
};

class Budget {
 public:
  static constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();

  explicit Budget(Tier tier, std::int64_t capacity = kUnlimited);
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  Tier tier() const { return tier_; }
  std::int64_t capacity() const { return capacity_; }
  bool unlimited() const { return capacity_ == kUnlimited; }

  // Throws BudgetExceeded when bytes do not fit; `what` names the request in the message.
  void reserve(std::int64_t bytes, std::string_view what);
  void release(std::int64_t bytes) noexcept;
  Reservation reserve_scoped(std::int64_t bytes, std::string_view what);

  std::int64_t used() const;
  std::int64_t peak() const;
  // After a placement tried and undone: the peak as it was before (`peak`), or what is in use now.
  void restore_peak(std::int64_t peak);
  std::int64_t available() const;

 private:
  const Tier tier_;
  const std::int64_t capacity_;
  mutable std::mutex mu_;
  std::int64_t used_ = 0;
  std::int64_t peak_ = 0;
};

}  // namespace flexh2o::offload
