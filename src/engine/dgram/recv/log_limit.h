// Rate-limited logging for the datagram receiver: a flood of refused hellos, forged datagrams or
// failed accepts must not become a flood of log lines (unlimited, 300,000 garbage datagrams
// print ~10,000). Each kind of event may print kBurst lines per kWindow; the rest are counted (the
// receiver's counters and /metrics keep the whole count), and the next line printed for that kind
// says how many were left out. Pure: the caller passes the time. Threading: one thread.
// EventLog is the receiver's: the limiter in front of its on_event callback, for any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace slotstream::dgram {

class LogLimiter {
 public:
  static constexpr int kBurst = 5;
  static constexpr int64_t kWindowNs = 10'000'000'000;

  // The line to print for an event of `kind` now (with a note of what was left out since the last
  // one printed), or nullopt when this kind has used its lines for the current window.
  std::optional<std::string> admit(const std::string& kind, const std::string& line, int64_t now_ns,
                                   int burst = kBurst);
  uint64_t suppressed() const { return suppressed_; }

 private:
  struct Kind {
    int64_t window_start = INT64_MIN;
    int printed = 0;
    uint64_t left_out = 0;
  };
  std::map<std::string, Kind> kinds_;
  uint64_t suppressed_ = 0;
};

class EventLog {
 public:
  explicit EventLog(std::function<void(const std::string&)> sink) : sink_(std::move(sink)) {}
  // Logs `line` unless lines of this kind are being rate-limited. Any thread.
  void operator()(const std::string& kind, const std::string& line, int burst = LogLimiter::kBurst);
  uint64_t suppressed() const;

 private:
  std::function<void(const std::string&)> sink_;
  mutable std::mutex mu_;
  LogLimiter limit_;
};

}  // namespace slotstream::dgram
