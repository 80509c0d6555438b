// SDP's "RDMA-based flow control" (SDP paper §3, Figure 2): the sender manages one receive ring of
// N x S bytes and knows its exact usage, so it writes each record at the next free byte (§3.1
// "Improving Buffer Utilization"); while the ring has room every record leaves at once, and once it
// is full the records are copied into a sender-side buffer and go out coalesced, as one write, when
// space returns (§3.1 "Improving Network Utilization"). ACKs carry the bytes the receiver freed.
// The ring itself (layout, wrap markers, notices, ACKs, the receiver) is in ring.h.
//
// The paper's flaw (§3.2, "lack of communication progress") is reproduced on purpose: coalesced
// data leaves only when the sender is next called to transmit. If the application computes
// instead, the data waits in the sender buffer although the receiver freed space long ago.
// `packed_ring:flush=idle` is the fix: the sending thread also flushes from idle_st(), i.e. a
// progress engine that polls while it holds coalesced data.
//
// Options: flush=call (default, the paper's behaviour) | idle; buffer=SIZE (sender buffer,
// default N x S, the paper's send buffer of the receive buffer's size).
#pragma once

#include <cstdint>
#include <span>

#include "engine/ucx/protocol/ring.h"

namespace slotstream::protocol {

// The packed-ring sender's decisions, apart from UCX (unit-tested with a fake ring).
class PackedRingCore {
 public:
  // `buffer`: the sender-side buffer's memory (registered by the caller).
  PackedRingCore(RingWire& wire, uint64_t ring_bytes, std::span<std::byte> buffer)
      : wire_(wire),
        space_(ring_bytes),
        buffer_(buffer) {}

  enum class Outcome {
    kWritten,    // written into the ring now (with *req if the put is still running)
    kCoalesced,  // copied into the sender buffer: `src` is free again
    kFull,       // neither ring nor sender buffer has room: wait for ACKs (flush()) and retry
  };
  // The record at `src` (`length` <= the ring's size and the buffer's).
  Status transmit(const std::byte* src, uint32_t length, fabric::Request* req, Outcome* out);
  // Writes as much coalesced data as the ring has room for, in as few writes as possible (runs of
  // whole records, none across the ring's end). Returns the number of writes in *writes.
  Status flush(uint64_t* writes = nullptr);
  // An ACK: the receiver's head is at `freed`. False if it was stale or bogus (ignored).
  bool on_ack(uint64_t freed) { return space_.freed(freed); }
  // Coalesced records not written yet.
  bool holding() const { return !buffer_.empty(); }

  const RingSpace& space() const { return space_; }
  const RingCounters& counters() const { return counters_; }

 private:
  Status pad(uint64_t length);

  RingWire& wire_;
  RingSpace space_;
  Coalescer buffer_;
  RingCounters counters_;
};

extern const Descriptor kPackedRing;

}  // namespace slotstream::protocol
