#include "engine/serving/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace flexh2o::serving {

namespace {

// A window shorter than this, or with fewer tokens, measures nothing yet (the first step's
// prefill would stand for the rate).
constexpr double kMinWindowSeconds = 2.0;
constexpr std::int64_t kMinWindowTokens = 16;
constexpr double kRedrawSeconds = 0.1;  // a terminal's line at most ten times a second

std::string rate_text(double rate) { return rate >= 100 ? fmt::format("{:.0f}", rate) : fmt::format("{:.1f}", rate); }

}  // namespace

std::string clock_text(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, std::round(seconds)));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

Progress::Progress(ProgressOptions options, std::FILE* out) : o_(options), out_(out) { window_.push_back({}); }

void Progress::sampled(std::int64_t rows, double now, bool prefilled) {
  sampled_ += rows;
  record(now);
  if (!prefilled) steady_from(now);
}

void Progress::finished(std::int64_t prompt_tokens, std::int64_t generated_tokens, std::int64_t max_tokens,
                        double now) {
  ++done_;
  prompt_done_ += prompt_tokens;
  generated_done_ += generated_tokens;
  limits_done_ += max_tokens;
  if (generated_tokens < max_tokens) ++stopped_;
  record(now);
  steady_from(now);
}

void Progress::steady_from(double now) {
  if (!steady_) steady_ = Sample{now, prompt_done_, sampled_};
}

void Progress::record(double now) {
  window_.push_back({now, prompt_done_, sampled_});
  // Keep one sample at or before the window's start, so the window spans it whole.
  while (window_.size() > 2 && window_[1].at <= now - o_.window_seconds) window_.pop_front();
}

double Progress::expected_tokens_left() const {
  // What the unfinished requests may still generate: their limits less what they sampled.
  const double in_flight = static_cast<double>(sampled_ - generated_done_);
  const double room = std::max(0.0, static_cast<double>(o_.max_new_tokens - limits_done_) - in_flight);
  if (stopped_ == 0 || sampled_ == 0) return room;
  // Stop ids end requests early, at a chance per token p (requests a stop ended over the tokens
  // sampled): each unfinished request is expected to generate 1 / p more, whatever it has so
  // far (the share of their limits the finished ones used read the short ones that end first
  // as the rest, and a ShareGPT job said 00:00 left at 11%).
  const double p = static_cast<double>(stopped_) / static_cast<double>(sampled_);
  return std::min(room, static_cast<double>(o_.requests - std::min(done_, o_.requests)) / p);
}

ProgressFigures Progress::figures(double now) const {
  ProgressFigures f{.done = done_, .requests = o_.requests, .elapsed = now};
  const Sample& first = window_.front();
  const Sample& last = window_.back();
  const double span = now - first.at;
  if (span > 0) {
    f.prompt_rate = static_cast<double>(last.prompt - first.prompt) / span;
    f.generated_rate = static_cast<double>(last.sampled - first.sampled) / span;
  }
  // The time left: the rate over the window's part since the steady state began.
  const Sample& from = steady_ && steady_->at > first.at ? *steady_ : first;
  const double steady_span = now - from.at;
  const auto steady_tokens = last.sampled - from.sampled;
  const bool measured = steady_ && steady_span >= kMinWindowSeconds && steady_tokens >= kMinWindowTokens;
  if (done_ >= o_.requests) {
    f.seconds_left = 0.0;
  } else if (measured) {
    f.seconds_left = expected_tokens_left() * steady_span / static_cast<double>(steady_tokens);
  } else if (o_.planned_tokens_per_second > 0) {
    f.seconds_left = expected_tokens_left() / o_.planned_tokens_per_second;
    f.planned = true;
  }
  return f;
}

std::string Progress::text(const ProgressFigures& f) {
  const double percent = f.requests ? 100.0 * static_cast<double>(f.done) / static_cast<double>(f.requests) : 100.0;
  std::string left = "? left";
  if (f.seconds_left) left = clock_text(*f.seconds_left) + (f.planned ? " left (planned)" : " left");
  return fmt::format("requests {}/{} ({:.0f}%) | prompt {} tok/s, generated {} tok/s | {} elapsed, {}", f.done,
                     f.requests, std::floor(percent), rate_text(f.prompt_rate), rate_text(f.generated_rate),
                     clock_text(f.elapsed), left);
}

std::string Progress::bar_text(const ProgressFigures& f, int width) {
  const double part = f.requests ? static_cast<double>(f.done) / static_cast<double>(f.requests) : 1.0;
  const int filled = std::clamp(static_cast<int>(std::floor(part * width)), 0, width);
  return fmt::format("|{:#<{}}{:<{}}| {}", "", filled, "", width - filled, text(f));
}

void Progress::show(double now) {
  if (o_.terminal) {
    if (last_line_ >= 0 && now - last_line_ < kRedrawSeconds) return;  // steps can come hundreds a second
    last_line_ = now;
    fmt::print(out_, "\r\033[K{}", bar_text(figures(now), 20));
    std::fflush(out_);
    return;
  }
  const std::size_t tenth = o_.requests ? done_ * 10 / o_.requests : 10;
  if (last_line_ >= 0 && now - last_line_ < o_.line_seconds && tenth == last_tenth_) return;
  last_line_ = now;
  last_tenth_ = tenth;
  done_written_ = done_;
  fmt::print(out_, "{}\n", text(figures(now)));
  std::fflush(out_);
}

void Progress::close(double now) {
  if (o_.terminal) fmt::print(out_, "\r\033[K{}\n", bar_text(figures(now), 20));
  else if (done_written_ != done_ || done_ < o_.requests) fmt::print(out_, "{}\n", text(figures(now)));
  std::fflush(out_);
}

}  // namespace flexh2o::serving
