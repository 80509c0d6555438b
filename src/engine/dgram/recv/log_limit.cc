#include "engine/dgram/recv/log_limit.h"

#include "clock.h"

namespace slotstream::dgram {

std::optional<std::string> LogLimiter::admit(const std::string& kind, const std::string& line, int64_t now_ns,
                                             int burst) {
  Kind& k = kinds_[kind];
  if (k.window_start == INT64_MIN || now_ns - k.window_start >= kWindowNs) {
    k.window_start = now_ns;
    k.printed = 0;
  }
  if (k.printed >= burst) {
    ++k.left_out;
    ++suppressed_;
    return std::nullopt;
  }
  ++k.printed;
  if (k.left_out == 0) return line;
  std::string out = line + " (" + std::to_string(k.left_out) + " more like it not shown; see /metrics)";
  k.left_out = 0;
  return out;
}

void EventLog::operator()(const std::string& kind, const std::string& line, int burst) {
  if (!sink_) return;
  std::optional<std::string> out;
  {
    std::lock_guard lock(mu_);
    out = limit_.admit(kind, line, now_ns(), burst);
  }
  if (out) sink_(*out);
}

uint64_t EventLog::suppressed() const {
  std::lock_guard lock(mu_);
  return limit_.suppressed();
}

}  // namespace slotstream::dgram
