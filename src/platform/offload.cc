#include "platform/offload.h"

namespace slotstream::platform {

Status check(const OffloadPolicy& p) {
  if (!(p.below < p.above)) {
    return {Code::kInvalidArgument, "the take-back threshold must be below the offload threshold (hysteresis), got " +
                                        std::to_string(p.below) + " and " + std::to_string(p.above)};
  }
  if (p.settle.count() < 0) return {Code::kInvalidArgument, "the settle time must not be negative"};
  return Status::ok();
}

Move decide(const OffloadPolicy& p, double load, size_t local_devices, size_t offloaded_devices,
            std::optional<std::chrono::steady_clock::duration> since_last_move) {
  if (since_last_move && *since_last_move < p.settle) return Move::kNone;
  if (load > p.above && local_devices > 0) return Move::kOffload;
  if (load < p.below && offloaded_devices > 0) return Move::kTakeBack;
  return Move::kNone;
}

}  // namespace slotstream::platform

namespace slotstream {

Status check_offload_policy(const OffloadPolicy& p) { return platform::check(p); }

OffloadMove decide_offload(const OffloadPolicy& p, double load, size_t local_devices, size_t offloaded_devices,
                           std::optional<std::chrono::steady_clock::duration> since_last_move) {
  return platform::decide(p, load, local_devices, offloaded_devices, since_last_move);
}

}  // namespace slotstream
