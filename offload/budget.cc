#include "offload/budget.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

namespace flexh2o::offload {

namespace {

struct Unit {
  std::string_view name;
  std::int64_t multiplier;
};

constexpr std::int64_t kKi = 1024;
constexpr std::array<Unit, 10> kUnits{{
    {"", 1},
    {"b", 1},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", 1000 * 1000 * 1000},
    {"tb", 1000LL * 1000 * 1000 * 1000},
    {"kib", kKi},
    {"mib", kKi * kKi},
    {"gib", kKi * kKi * kKi},
    {"tib", kKi * kKi * kKi * kKi},
}};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_size(std::string_view text, std::string_view why) {
  throw std::invalid_argument("invalid size '" + std::string(text) + "': " + std::string(why) +
                              " (expected e.g. 123, 512MiB, 16GiB, 1.5GB)");
}

}  // namespace

std::vector<kernels::OptionText::Piece> tier_hint(Tier t) {
  using kernels::Option;
  switch (t) {
    case Tier::Gpu: return {"raise ", Option::GpuMem, " or move more to cpu/disk"};
    case Tier::Cpu: return {"raise ", Option::CpuMem, " or move more to disk"};
    case Tier::Disk: return {"raise ", Option::DiskMem, " or use ", Option::OffloadDir, " on a larger disk"};
  }
  return {};
}

std::int64_t parse_bytes(std::string_view text) {
  const std::string_view s = trim(text);
  std::size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const std::string_view int_part = s.substr(0, i);
  std::string_view frac_part;
  if (i < s.size() && s[i] == '.') {
    const std::size_t start = ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    frac_part = s.substr(start, i - start);
  }
  if (int_part.empty() && frac_part.empty()) bad_size(text, "no number");
  // Digits beyond 18 cannot change the result by a whole byte at these magnitudes.
  if (frac_part.size() > 18) frac_part = frac_part.substr(0, 18);

  std::string unit(trim(s.substr(i)));
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto u = std::find_if(kUnits.begin(), kUnits.end(), [&](const Unit& x) { return x.name == unit; });
  if (u == kUnits.end()) bad_size(text, "unknown unit '" + unit + "'");

  std::int64_t whole = 0;
  if (!int_part.empty()) {
    const auto r = std::from_chars(int_part.data(), int_part.data() + int_part.size(), whole);
    if (r.ec != std::errc{}) bad_size(text, "number out of range");
  }
  std::int64_t frac = 0;
  std::int64_t frac_den = 1;
  for (char c : frac_part) {
    frac = frac * 10 + (c - '0');
    frac_den *= 10;
  }
  // 128-bit arithmetic keeps every in-range result exact.
  const __int128 m = u->multiplier;
  const __int128 total = static_cast<__int128>(whole) * m + (static_cast<__int128>(frac) * m + frac_den / 2) / frac_den;
  if (total > std::numeric_limits<std::int64_t>::max()) bad_size(text, "too large");
  return static_cast<std::int64_t>(total);
}

std::string format_bytes(std::int64_t bytes) {
  static constexpr std::array<const char*, 6> kNames{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const bool neg = bytes < 0;
  // Magnitude as unsigned so INT64_MIN does not overflow.
  const std::uint64_t mag = neg ? ~static_cast<std::uint64_t>(bytes) + 1 : static_cast<std::uint64_t>(bytes);
  if (mag < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(mag);
  std::size_t unit = 0;
  v /= 1024.0;
  while (v >= 1024.0 && unit + 1 < kNames.size()) {
    v /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%.2f %s", neg ? "-" : "", v, kNames[unit]);
  return buf;
}

Reservation::Reservation(Reservation&& o) noexcept
    : budget_(std::exchange(o.budget_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    reset();
    budget_ = std::exchange(o.budget_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void Reservation::reset() noexcept {
  if (budget_) budget_->release(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

Budget::Budget(Tier tier, std::int64_t capacity) : tier_(tier), capacity_(capacity) {
  if (capacity < 0) {
    throw std::invalid_argument(std::string(tier_name(tier)) + " tier: negative capacity " +
                                std::to_string(capacity));
  }
}

void Budget::reserve(std::int64_t bytes, std::string_view what) {
  if (bytes < 0) {
    throw std::invalid_argument(std::string(tier_name(tier_)) + " tier: negative reservation " +
                                std::to_string(bytes) + " for '" + std::string(what) + "'");
  }
  std::lock_guard lock(mu_);
  if (bytes > capacity_ - used_) {
    std::vector<kernels::OptionText::Piece> text{std::string(tier_name(tier_)) + " tier: cannot reserve " +
                                                 format_bytes(bytes) + " for '" + std::string(what) + "': " +
                                                 format_bytes(capacity_ - used_) + " of " + format_bytes(capacity_) +
                                                 " free (" + format_bytes(used_) + " in use); "};
    for (auto& piece : tier_hint(tier_)) text.push_back(std::move(piece));
    throw BudgetExceeded(std::move(text));
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
}

void Budget::release(std::int64_t bytes) noexcept {
  std::lock_guard lock(mu_);
  // Releasing more than was reserved is a caller bug; never let the count go negative.
  used_ = std::max<std::int64_t>(0, used_ - bytes);
}

Reservation Budget::reserve_scoped(std::int64_t bytes, std::string_view what) {
  reserve(bytes, what);
  return Reservation(this, bytes);
}

std::int64_t Budget::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

std::int64_t Budget::peak() const {
  std::lock_guard lock(mu_);
  return peak_;
}

void Budget::restore_peak(std::int64_t peak) {
  std::lock_guard lock(mu_);
  peak_ = std::max(peak, used_);
}

std::int64_t Budget::available() const {
  std::lock_guard lock(mu_);
  return capacity_ - used_;
}

}  // namespace flexh2o::offload
