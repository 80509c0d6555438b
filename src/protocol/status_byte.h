// The status-byte-assisted transmission mechanism (paper §3.2).
//
// Receiver ("third status byte memory block"): N blocks + N status bytes in one UCX-allocated
// region; status 0 empty, 1 full, 2 held. It issues no network operation after set-up.
// Sender: a cached copy of the receiver's status bytes ("second status byte memory block");
// the local send blocks and their status bytes ("first") live in the stream layer's SendRing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "protocol/protocol.h"

namespace slotstream::protocol {

enum BlockStatus : uint8_t { kEmpty = 0, kFull = 1, kHeld = 2 };

// The sender's bookkeeping of the receiver's status array, independent of UCX so that it can be
// unit-tested: which receiver block to write next, and what a fresh read of the array means.
class StatusCache {
 public:
  explicit StatusCache(uint32_t blocks) : status_(blocks, kEmpty) {}
  // Next empty block at or after the cursor (round robin), or -1 if the cache has none.
  // Held blocks are skipped and counted (unless `held_skips` is null: only looking).
  int64_t pick(uint64_t* held_skips);
  void mark_full(uint32_t index) {
    status_[index] = kFull;
    cursor_ = (index + 1) % status_.size();
  }
  // The raw array that an RDMA read fills.
  std::span<uint8_t> raw() { return status_; }
  uint32_t size() const { return static_cast<uint32_t>(status_.size()); }

 private:
  std::vector<uint8_t> status_;
  uint32_t cursor_ = 0;
};

extern const Descriptor kStatusByte;

}  // namespace slotstream::protocol
