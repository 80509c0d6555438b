// Hands one device's messages to the sink in message order and accounts for every one of them.
//
// Over UD, messages finish out of order (a later one completes while an earlier one waits for its
// timer) and some never show up at all: "the loss of a message produces no outstanding operation
// at the target ... an invisible (to the target) loss of data" (patent). slotstream's sinks want a
// device's messages in order, and every message the sender sent must be counted as exactly one of
// complete, incomplete (kept as partial or dropped by the consumer) or lost. So:
//   - a finished message waits until every earlier one is released;
//   - a message of which nothing arrived is declared lost once a later message (or the sender's
//     FIN, which states how many were sent) has been seen for `timeout`: had any of its segments
//     been on the way, its own timer would have started by then.
// Message numbers are the sender's per-device MSNs, 0, 1, 2, ... (32-bit: a session sends at most
// 2^32 - 1 messages per device). Threading: one thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "engine/dgram/placement/placement.h"

namespace slotstream::dgram {

class DeviceOrder {
 public:
  explicit DeviceOrder(int64_t timeout_ns) : timeout_ns_(timeout_ns) {}

  enum class Kind { kComplete, kIncomplete, kLost };
  struct Release {
    uint32_t msn = 0;
    Kind kind = Kind::kLost;
    uint64_t count = 1;                    // kLost: messages msn, msn + 1, ... lost in one run
    std::optional<Completion> completion;  // kComplete, kIncomplete
  };

  // How far ahead of the next message to release an MSN may be; beyond it a segment is refused
  // (a bound on the bookkeeping a hostile or broken sender can cause).
  static constexpr uint32_t kMaxAhead = 1u << 16;
  enum class Check { kOk, kReleased, kTooFarAhead };
  Check check(uint32_t msn) const;

  // A segment of `msn` arrived (its target keeps the message until it finishes).
  void seen(uint32_t msn, int64_t now_ns);
  // The target finished `c.msn`.
  void finished(Completion c, int64_t now_ns);
  // The sender says it sent `count` messages in all.
  void fin(uint64_t count, int64_t now_ns);
  // Releases, in order, every message that is ready (a run of lost ones as one Release, so a FIN
  // claiming billions of messages costs one entry, not billions).
  void poll(int64_t now_ns, std::vector<Release>* out);

  uint64_t next() const { return next_; }
  bool fin_known() const { return fin_count_.has_value(); }
  bool all_released() const { return fin_count_ && next_ >= *fin_count_; }
  // When poll() will release a lost message at the head, if nothing else happens first; INT64_MAX if
  // no timer of this order's is what the head waits for.
  int64_t next_deadline() const;

 private:
  int64_t timeout_ns_;
  uint64_t next_ = 0;                    // the next message to release
  uint64_t seen_end_ = 0;                // one past the highest message seen (or announced by FIN)
  std::set<uint64_t> active_;            // seen, not finished
  std::map<uint64_t, Completion> done_;  // finished, waiting for earlier ones
  // Ranges of message numbers that nothing arrived of, each with the time it became known that
  // they were sent (a later message seen, or FIN): [first, end) -> since.
  struct Gap {
    uint64_t end;
    int64_t since_ns;
  };
  std::map<uint64_t, Gap> gaps_;
  std::optional<uint64_t> fin_count_;
};

}  // namespace slotstream::dgram
