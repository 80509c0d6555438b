// Where the datagram receiver's messages go (engine/dgram/recv/receiver.h). Behind Receiver, the store is the
// sender's MessageSink (engine/dgram/engine.cc: MessageSink::deliver_datagram; src/sink/dir_sink.h keeps the
// layout on disk, partial messages and lost messages' unused numbers included).
#pragma once

#include <cstdint>
#include <span>

#include "engine/dgram/placement/placement.h"
#include "slotstream/status.h"

namespace slotstream::dgram {

// A message handed to a store.
struct Delivered {
  uint16_t device = 0;
  uint32_t msn = 0;      // the sender's message number for this device (0, 1, 2, ...)
  bool partial = false;  // an incomplete Write-Record message kept under keep_partial
  std::span<const std::byte> data;
  const RangeSet* valid = nullptr;  // partial: the bytes that arrived (others are zero)
  bool length_known = true;         // partial: false if the last segment never came (length = highest valid end)
  int64_t first_ns = 0;             // first segment's arrival (CLOCK_MONOTONIC)
  int64_t done_ns = 0;              // complete, or its timer fired
};

// Where one session's messages go. Called from the receiver's storing thread only, a device's
// messages in MSN order. A failing call is retried with the same message: kBusy means "this device
// is paused" (its worker is behind; the device's messages wait, the others go on, retried every
// 100 ms), any other error concerns the whole store (a full disk; retried every 100 ms, reported).
class MessageStore {
 public:
  virtual ~MessageStore() = default;
  virtual Status store(const Delivered& m) = 0;
};

}  // namespace slotstream::dgram
