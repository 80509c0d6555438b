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

#include "protocol/protocol.h"

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

// What the baseline did, for the benchmark (paper §4.2.1, Fig. 10-11, 16-17). Process-wide
// totals over every sliding_window sender and receiver in this process, since start or the last
// reset_sliding_window_stats(); the sender fields stay 0 in a receiver process and vice versa.
struct SlidingWindowStats {
  // sender
  uint64_t notifications_sent = 0;   // emulated write-with-immediate: one AM per block
  uint64_t acks_received = 0;        // ACKs for a block in flight (stray/duplicate ones excluded)
  uint64_t acks_ignored = 0;         // malformed, stray or duplicate ACKs
  uint64_t window_full_waits = 0;    // transmit_st calls that found the window full and waited
  uint64_t window_full_wait_ns = 0;  // total time spent in those waits
  uint64_t head_blocked_acks = 0;    // ACKs that freed nothing: an older block was still unacked
  // receiver
  uint64_t notifications_received = 0;
  uint64_t notifications_dropped = 0;  // unknown session or out-of-range block
  uint64_t acks_sent = 0;              // ACK AMs posted (two-sided: a receive consumed at the sender)
  uint64_t ack_send_failures = 0;      // the sender had gone
};
SlidingWindowStats sliding_window_stats();
void reset_sliding_window_stats();

// Per-block ACK round trip of one sliding_window sender, in ns: from posting the block's
// notification to handling its ACK (includes the receiver's processing time). Empty for any
// other protocol. At most kMaxSyncSamples.
std::vector<uint64_t> sliding_window_ack_round_trips_ns(const SenderProtocol& sender);

extern const Descriptor kSlidingWindow;

}  // namespace slotstream::protocol
