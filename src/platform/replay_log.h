// What a platform sender keeps of each device's stream until a receiver has confirmed it stored
// (STORED, wire/control.h), so that it can send it again to the next receiver when this one dies
// (at-least-once; the receiver recognises what it already has by number, sink/dir_sink.h).
//
// Per device, messages are counted from 0 over the sender's whole life (its "index"); a
// connection begins at some index (everything before it was confirmed then) and its receiver
// numbers the first message of it `first` on disk: so message i is stored as
// base + i, where base = first - (the connection's first index). Pure bookkeeping, one thread at
// a time per device (the caller's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace slotstream::platform {

class ReplayLog {
 public:
  // Keeps a copy of the next message; returns its index.
  uint64_t append(std::vector<std::byte> message);
  // Takes back the newest message (one that was not sent after all: a send that gave up before its
  // first fragment went).
  void drop_newest() {
    bytes_ -= messages_.back().size();
    messages_.pop_back();
  }
  // A connection that began at index `begin` has `stored` of its messages confirmed: every index
  // below begin + stored is dropped. Confirmations never move backwards.
  void confirm(uint64_t begin, uint64_t stored);
  // Indexes [confirmed(), next()) are kept, oldest first.
  uint64_t confirmed() const { return confirmed_; }
  uint64_t next() const { return confirmed_ + messages_.size(); }
  const std::deque<std::vector<std::byte>>& pending() const { return messages_; }
  uint64_t bytes() const { return bytes_; }

  // The on-disk number of index 0, once a receiver told what a connection's first message got.
  void learn_base(uint64_t connection_begin, uint64_t first) { base_ = first - connection_begin; }
  void set_base(uint64_t base) { base_ = base; }
  void forget_base() { base_.reset(); }
  std::optional<uint64_t> base() const { return base_; }
  // The number the next message to send again (or the next new one) is stored as.
  std::optional<uint64_t> first_unconfirmed_number() const {
    return base_ ? std::optional<uint64_t>(*base_ + confirmed_) : std::nullopt;
  }

 private:
  std::deque<std::vector<std::byte>> messages_;
  uint64_t confirmed_ = 0;
  uint64_t bytes_ = 0;
  std::optional<uint64_t> base_;
};

}  // namespace slotstream::platform
