// The paper's baseline (§2.3, Figure 1; Tu et al.): a sliding window over the receiver's pool.
//
// Initialisation (RmInit): the receiver hands out its pool (address, length, key); the sender
// builds a circular queue of n blocks tracked by a head and a tail pointer.
// Transfer (RmWrite): the block is written at the tail and the receiver is notified of its
// position and length. InfiniBand does that with one RDMA Write-with-Immediate; UCP has no
// write-with-immediate, so we emulate it with a put followed by an active message carrying
// (index, length) — the AM is the "immediate" the receiver must receive, as on a real QP.
// Release (RmFree): after processing, the receiver returns an ACK with a two-sided send (AM);
// the sender frees blocks strictly in order: the head never passes an unacknowledged block.
//
// Devices cannot share one window (a block held back by one device's consumer would stall the
// others' in-order release): one connection per device (Descriptor::connection_per_device).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

// The sender's window, independent of UCX so it can be unit-tested: n slots, tail = next to
// write, head = oldest not yet freed; ACKs may come in any order, frees only in order.
class WindowTracker {
 public:
  explicit WindowTracker(uint32_t blocks) : acked_(blocks, false) {}
  bool full() const { return tail_ - head_ == acked_.size(); }
  bool empty() const { return tail_ == head_; }
  // Takes the slot at the tail (call only when !full()); returns its index.
  uint32_t push() { return static_cast<uint32_t>(tail_++ % acked_.size()); }
  // Records an ACK for slot `index`; returns how many slots the head advanced (0 when the ACK
  // is for a block behind an unacknowledged one, or for a slot not in flight).
  uint32_t ack(uint32_t index);
  // Whether slot `index` holds a block in flight whose ACK has not arrived yet.
  bool awaiting_ack(uint32_t index) const;
  uint64_t in_flight() const { return tail_ - head_; }
  uint64_t head() const { return head_; }
  uint64_t tail() const { return tail_; }

 private:
  std::vector<bool> acked_;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
};

extern const Descriptor kSlidingWindow;

}  // namespace slotstream::protocol
