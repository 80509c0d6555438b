// A ring in plain memory for the ring protocols' unit tests (packed_ring, nic_assisted): the
// sender core writes through FakeRingWire, and FakeRingReceiver applies the notices the way the
// UCX receiver does (RingLedger + split_records), delivering records in ring order. No UCX.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "engine/ucx/protocol/ring.h"
#include "wire/block_header.h"

namespace slotstream::protocol::testing {

// One record as the stream layer writes it: header + payload.
inline std::vector<std::byte> make_record(uint16_t device, uint32_t packet, size_t payload_length, uint32_t seed) {
  std::vector<std::byte> r(wire::kBlockHeaderSize + payload_length);
  wire::encode_block_header({wire::kFirstFragment | wire::kLastFragment, device, packet, uint32_t(payload_length)},
                            std::span(r).first<wire::kBlockHeaderSize>());
  std::mt19937 rng(seed);
  for (size_t i = wire::kBlockHeaderSize; i < r.size(); ++i) r[i] = std::byte(rng());
  return r;
}

class FakeRingWire : public RingWire {
 public:
  explicit FakeRingWire(uint64_t bytes) : ring(bytes) {}
  Status write(const std::byte* src, uint32_t length, uint64_t position, fabric::Request*) override {
    const uint64_t offset = position % ring.size();
    EXPECT_LE(offset + length, ring.size()) << "a segment straddles the ring's end";
    std::memcpy(ring.data() + offset, src, length);
    notices.push_back({0, position, length, 0});
    ++writes;
    return Status::ok();
  }
  Status pad(uint64_t position, uint32_t length) override {
    notices.push_back({0, position, length, kNoticePadding});
    ++pads;
    return Status::ok();
  }
  std::vector<std::byte> ring;
  std::deque<RingNotice> notices;
  uint64_t writes = 0;
  uint64_t pads = 0;
};

// Takes notices like the UCX receiver and keeps what it delivered, in order.
class FakeRingReceiver {
 public:
  FakeRingReceiver(FakeRingWire& wire, uint64_t window) : ledger(wire.ring.size(), window), wire_(wire) {}

  // Applies every notice sent so far; each record's bytes are copied out (delivered) but its
  // ring space stays held until release_all()/release_some().
  void take_notices() {
    while (!wire_.notices.empty()) {
      RingNotice n = wire_.notices.front();
      wire_.notices.pop_front();
      const bool padding = n.flags & kNoticePadding;
      ASSERT_EQ(ledger.accept(n.position, n.length, padding), RingLedger::Verdict::kOk)
          << "notice at " << n.position << " length " << n.length;
      if (padding) continue;
      std::span<const std::byte> segment(wire_.ring.data() + n.position % wire_.ring.size(), n.length);
      std::vector<std::span<const std::byte>> spans;
      split_records(segment, &spans);
      if (spans.size() > 1) ++multi_record_segments;
      for (auto s : spans) {
        const uint64_t at = n.position + uint64_t(s.data() - segment.data());
        held.push_back(ledger.add_record(at, uint32_t(s.size())));
        delivered.emplace_back(s.begin(), s.end());
      }
    }
  }
  void release_all() {
    for (uint64_t id : held) EXPECT_TRUE(ledger.release(id));
    held.clear();
  }
  // Releases the oldest `n` held records.
  void release_some(size_t n) {
    for (size_t i = 0; i < n && !held.empty(); ++i) {
      EXPECT_TRUE(ledger.release(held.front()));
      held.pop_front();
    }
  }

  RingLedger ledger;
  std::deque<uint64_t> held;
  std::vector<std::vector<std::byte>> delivered;
  uint64_t multi_record_segments = 0;

 private:
  FakeRingWire& wire_;
};

using Records = std::vector<std::vector<std::byte>>;

// Hands record `r` to a sender core (PackedRingCore, NicAssistedCore); keeps it in `sent` unless
// the core refused it as full.
template <class Core>
typename Core::Outcome transmit(Core& core, const std::vector<std::byte>& r, Records* sent) {
  typename Core::Outcome o;
  fabric::Request req;
  EXPECT_TRUE(core.transmit(r.data(), uint32_t(r.size()), &req, &o).is_ok());
  if (o != Core::Outcome::kFull) sent->push_back(r);
  return o;
}

// Everything sent arrived, intact and in order.
inline void expect_delivered(FakeRingReceiver& rx, const Records& sent) {
  rx.take_notices();
  ASSERT_EQ(rx.delivered.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) ASSERT_EQ(rx.delivered[i], sent[i]) << "record " << i;
}

}  // namespace slotstream::protocol::testing
