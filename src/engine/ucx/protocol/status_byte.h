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

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

enum BlockStatus : uint8_t { kEmpty = 0, kFull = 1, kHeld = 2 };

// The sender's bookkeeping of the receiver's status array, independent of UCX so that it can be
// unit-tested: which receiver block to write next, and what a fresh read of the array means.
//
// Which block is next (`status_byte:policy=`):
//   kAny    (default) the first empty block at or after the cursor, skipping full and held ones:
//           a block the receiver is still consuming never stops the sender while another is free.
//   kPaper  the paper's sender walk (§3.2.4 step 1, §3.3, Fig. 18): blocks strictly in order; a
//           held block (2) is skipped, but when the next block is full (1) the sender synchronises
//           — reads the whole status array — until that block is empty (0) or held, even if a later
//           block is free. Either way the status array is read only when the cache offers no block.
enum class Pick { kAny, kPaper };

class StatusCache {
 public:
  explicit StatusCache(uint32_t blocks, Pick policy = Pick::kAny) : status_(blocks, kEmpty), policy_(policy) {}
  // Next block to write by the policy, or -1 if the cache has none (then: read the status array).
  // Held blocks are skipped and counted (unless `held_skips` is null: only looking).
  int64_t pick(uint64_t* held_skips);
  void mark_full(uint32_t index) {
    status_[index] = kFull;
    cursor_ = (index + 1) % status_.size();
  }
  // Whether the cache shows an empty block anywhere (policy=paper may wait with one: not next).
  bool any_empty() const;
  Pick policy() const { return policy_; }
  // The raw array that an RDMA read fills.
  std::span<uint8_t> raw() { return status_; }
  uint32_t size() const { return static_cast<uint32_t>(status_.size()); }

 private:
  std::vector<uint8_t> status_;
  Pick policy_;
  uint32_t cursor_ = 0;
};

// `policy=paper|any` from the protocol's options (default any); an error names what it takes.
Status parse_pick(const Options& options, Pick* out);

extern const Descriptor kStatusByte;

}  // namespace slotstream::protocol
