// Credit-based flow control as SDP uses it (Balaji et al., "RDMA-based and NIC-assisted flow
// control for SDP", §2, Figure 1) — the design the status-byte paper's family is measured against.
//
// The receiver pre-posts N receive buffers of S bytes (tagged receives into its UCX-allocated
// region: posted_receives.h). The sender starts with N credits, spends one per message whatever
// its size — a 1-byte message takes a whole buffer (§2.2 "buffer utilization") — and sends it
// two-sided (UCP tag send: the message lands in the oldest posted receive). Messages larger than
// S are already segmented by the stream layer into records of at most one block (§2.1
// "segmented and transmitted in a pipelined manner"). When the consumer has released a buffer,
// the receiver posts it again; it returns the credits not one by one but in a batch, once half
// the credits have been used (§2.1, "delaying ACKs ... after half the credits have been used").
//
// The ACK is a two-sided message, as in SDP (a credit update is an ordinary SDP message: its
// BSDH header carries the sequence number of the last message received). UCP's two-sided
// message that needs no pre-posted receive at the sender is an active message, sent on the
// endpoint the receiver opens to the sender's worker (Descriptor::receiver_endpoint) — the same
// kind of ACK sliding_window uses, so the two compare like with like. A put into a word the
// sender exposes would be the RDMA-based design of §3 (and CARC's), not this one.
//
// Unexpected messages: credits guarantee that every message finds a posted receive. Should a
// sender send without one (a bug: it is not our sender), UCX keeps the message in its
// unexpected queue (eager) or keeps the data at the sender (rendezvous) and matches it with the
// next receive posted — in order, nothing lost, but held in UCX's memory outside the receiver's
// budget instead of being refused as an InfiniBand RC queue pair would (receiver-not-ready NAK,
// retried by the sender's NIC). It is counted (receiver counter "unexpected_messages", fabric
// counter tag_unexpected) and tested (tests/engine/ucx/protocol/credit_test.cc).
#pragma once

#include <cstdint>

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

// The sender's credits, independent of UCX so it can be unit-tested. Counts are cumulative and
// modular (they may wrap at 2^64): `sent` messages, of which the receiver has `released`.
// Threading: the sending thread only (credit updates are handled inside its worker progress).
class CreditAccount {
 public:
  explicit CreditAccount(uint32_t credits, uint64_t start = 0) : credits_(credits), sent_(start), released_(start) {}
  uint32_t available() const { return credits_ - static_cast<uint32_t>(sent_ - released_); }
  bool can_send() const { return sent_ - released_ < credits_; }
  // One message sent (call only when can_send()).
  void spend() { ++sent_; }
  // An ACK saying that `released` messages have been released in all. Returns the credits it
  // gives back; 0 for a stale or duplicate ACK, or one claiming more than was sent (ignored).
  uint32_t on_ack(uint64_t released);
  uint64_t sent() const { return sent_; }
  uint64_t released() const { return released_; }
  uint32_t credits() const { return credits_; }

 private:
  uint32_t credits_;
  uint64_t sent_;
  uint64_t released_;
};

// The receiver's side: when to return credits (SDP §2.1: after half of them have been used).
// Threading: the receiver's consumer thread only.
class AckBatcher {
 public:
  // batch = credits / 2, at least 1 (one credit must still come back one by one).
  explicit AckBatcher(uint32_t credits, uint64_t start = 0)
      : batch_(credits / 2 > 0 ? credits / 2 : 1),
        released_(start),
        acked_(start) {}
  // The consumer released one buffer (already posted again). True when an ACK is due now; it
  // carries released().
  bool on_release() {
    ++released_;
    return released_ - acked_ >= batch_;
  }
  // The ACK carrying released() was sent.
  void acked() { acked_ = released_; }
  uint64_t released() const { return released_; }
  uint32_t batch() const { return batch_; }

 private:
  uint32_t batch_;
  uint64_t released_;
  uint64_t acked_;
};

// The credit update, receiver -> sender: the header of an active message, little-endian, 16 bytes
// (copied as this struct; pinned by tests/engine/ucx/protocol/credit_test.cc):
//
//   0          8              16
//   +----------+--------------+
//   | released | generated_ns |
//   +----------+--------------+
//
//   released      messages the receiver has released in all (cumulative, wraps at 2^64) — as
//                 SDP's BSDH header carries the sequence number of the last message received
//   generated_ns  when the receiver sent it (its CLOCK_MONOTONIC), for the update's latency
struct CreditUpdate {
  uint64_t released;
  uint64_t generated_ns;
};
static_assert(sizeof(CreditUpdate) == 16, "fixed AM layout");

extern const Descriptor kCredit;

}  // namespace slotstream::protocol
