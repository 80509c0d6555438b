// SDP's "NIC-assisted RDMA-based flow control" (SDP paper §4, Figure 3): the packed ring of §3
// (ring.h) with the NIC's message-level flow control under it and an interrupt for progress.
//
// Virtual window scheme (§4.1). The receiver hands out credits — "posted receive WQEs" — one per
// W bytes of free ring space beyond what earlier credits already promise; it never says where.
// The sender cuts its data into segments of at most W bytes, each costing one credit, and itself
// chooses where each goes (the next free byte, as in §3): the receiver manages only logical space
// and the virtual windows shift with every segment shorter than W. The sender starts with R / W
// credits (what the receiver posts at first); later grants come in the ACKs.
//
// Asynchronous interrupt scheme (§4.2). The send buffer has a NIC-handled part — segments posted
// in a send queue that leave, in order, as soon as a credit arrives — and a software-handled part
// where the records beyond it coalesce. When the queue holds data, the sending thread sleeps on the
// UCX worker's wake-up fd (Descriptor::sender_wakeup, fabric::Worker::wait_for_event): a credit
// arriving is the "interrupt" that wakes it, and it flushes the queue and then the coalesced data.
// So data leaves while the application computes (the progress that §3's design lacks), and
// without a polling loop.
//
// Emulation on UCX: IB's hardware flow control holds a posted send until the peer posts a receive;
// UCP has nothing like it, so the queue holds the segments in sender memory and the sending thread
// puts them when the credit is there — the same data, copies and order as a posted send WQE.
//
// Options: window=SIZE (W, default the block size; at least one block, at most the ring),
// queue=N (segments the NIC-handled part holds, default R / W), buffer=SIZE (software-handled
// part, default N x S).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "engine/ucx/protocol/ring.h"

namespace slotstream::protocol {

// The NIC-assisted sender's decisions, apart from UCX (unit-tested with a fake ring).
class NicAssistedCore {
 public:
  // `queue`: `slots` x `slot_size` bytes for the NIC-handled part (slot_size >= the largest
  // record); `buffer`: the software-handled part.
  NicAssistedCore(RingWire& wire, uint64_t ring_bytes, uint64_t window, std::span<std::byte> queue, uint32_t slot_size,
                  std::span<std::byte> buffer);

  enum class Outcome {
    kWritten,    // a credit was there: written now (with *req if the put is still running)
    kQueued,     // copied into the send queue: leaves as soon as a credit arrives
    kCoalesced,  // copied into the software-handled buffer
    kFull,       // no credit and no room anywhere: wait for a grant (drain()) and retry
  };
  Status transmit(const std::byte* src, uint32_t length, fabric::Request* req, Outcome* out);
  // What the interrupt handler does: queued segments first, then coalesced data in segments of at
  // most W, as far as the credits go. *writes: how many segments it wrote.
  Status drain(uint64_t* writes = nullptr);
  // An ACK: `granted` credits after the initial ones so far. False if stale or impossible.
  bool on_grant(uint64_t granted);

  bool holding() const { return !queue_.empty() || !buffer_.empty(); }
  uint64_t credits() const { return initial_ + granted_ - used_; }
  const RingSpace& space() const { return space_; }

  struct Counters : RingCounters {  // coalesced_*: the software-handled buffer
    uint64_t queued_records = 0;    // records posted in the send queue (one segment each)
    uint64_t credits_used = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  Status pad(uint64_t length);
  Status write_segment(const std::byte* src, uint64_t length, fabric::Request* req);

  RingWire& wire_;
  RingSpace space_;
  uint64_t window_;
  uint64_t initial_;
  uint64_t granted_ = 0;
  uint64_t used_ = 0;
  struct Queued {
    uint32_t slot;
    uint32_t length;
  };
  std::span<std::byte> queue_memory_;
  uint32_t slot_size_;
  uint32_t slots_;
  uint32_t head_slot_ = 0;  // slot of queue_.front()
  std::deque<Queued> queue_;
  std::vector<fabric::Request> slot_puts_;  // per slot: its last put, if still running
  Coalescer buffer_;
  Counters counters_;
};

extern const Descriptor kNicAssisted;

}  // namespace slotstream::protocol
