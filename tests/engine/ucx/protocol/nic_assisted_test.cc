// The NIC-assisted sender's decisions (SDP §4) over a fake ring whose receiver enforces the
// virtual-window credits: direct writes while credits last, then the send queue, then coalescing;
// draining on a grant sends the queue first and coalesced data in segments of at most W; wrap
// markers take credits; every record intact and in order. Pure logic, no UCX.
#include "engine/ucx/protocol/nic_assisted.h"

#include <gtest/gtest.h>

#include <random>

#include "fake_ring.h"

namespace slotstream::protocol {
namespace {

using testing::FakeRingReceiver;
using testing::FakeRingWire;
using testing::make_record;
using Outcome = NicAssistedCore::Outcome;

struct Rig {
  Rig(uint64_t ring_bytes, uint64_t window, uint32_t slots, uint32_t slot_size, uint64_t buffer_bytes)
      : wire(ring_bytes),
        rx(wire, window),
        queue(size_t(slots) * slot_size),
        buffer(buffer_bytes),
        core(wire, ring_bytes, window, queue, slot_size, buffer) {}
  Outcome send(const std::vector<std::byte>& r) { return testing::transmit(core, r, &sent); }
  // The receiver takes every notice (its ledger rejects a segment without a credit), releases
  // `n` records and grants what the freed space allows.
  void receive(size_t n) {
    rx.take_notices();
    rx.release_some(n);
    rx.ledger.grant();
    core.on_grant(rx.ledger.granted());
  }
  void expect_all_delivered() { testing::expect_delivered(rx, sent); }
  FakeRingWire wire;
  FakeRingReceiver rx;
  std::vector<std::byte> queue, buffer;
  NicAssistedCore core;
  testing::Records sent;
};

TEST(NicAssistedCore, CreditsThenTheSendQueueThenCoalescing) {
  Rig rig(256, 64, /*slots=*/2, /*slot_size=*/64, 256);  // 4 credits
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(rig.send(make_record(1, i, 48, i)), Outcome::kWritten);
  EXPECT_EQ(rig.core.credits(), 0u);
  EXPECT_EQ(rig.send(make_record(1, 4, 16, 4)), Outcome::kQueued);
  EXPECT_EQ(rig.send(make_record(1, 5, 16, 5)), Outcome::kQueued);
  for (uint32_t i = 6; i < 10; ++i) EXPECT_EQ(rig.send(make_record(1, i, 16, i)), Outcome::kCoalesced);
  uint64_t writes = 0;
  ASSERT_TRUE(rig.core.drain(&writes).is_ok());
  EXPECT_EQ(writes, 0u) << "no credit, nothing leaves";
  // Two records freed: 128 bytes, two windows -> two credits: the two queued segments go first.
  rig.receive(2);
  EXPECT_EQ(rig.core.credits(), 2u);
  ASSERT_TRUE(rig.core.drain(&writes).is_ok());
  EXPECT_EQ(writes, 2u);
  EXPECT_EQ(rig.core.counters().coalesced_writes, 0u);
  // Everything freed: the coalesced 4 x 32 bytes leave two per segment of at most W = 64.
  rig.receive(100);
  ASSERT_TRUE(rig.core.drain(&writes).is_ok());
  EXPECT_EQ(rig.core.counters().coalesced_writes, 2u);
  EXPECT_FALSE(rig.core.holding());
  rig.expect_all_delivered();
  EXPECT_EQ(rig.rx.multi_record_segments, 2u);
}

TEST(NicAssistedCore, ImpossibleGrantsAreIgnored) {
  Rig rig(256, 64, 2, 64, 256);
  EXPECT_FALSE(rig.core.on_grant(1)) << "nothing used: the receiver cannot promise more than the ring";
  rig.send(make_record(1, 0, 48, 1));
  EXPECT_TRUE(rig.core.on_grant(1));
  EXPECT_FALSE(rig.core.on_grant(1)) << "duplicate";
  EXPECT_EQ(rig.core.credits(), 4u);
}

// Random sizes, many laps, a receiver consuming in random batches: its ledger accepts every
// notice — no segment without a credit, none longer than W, none across the end — and every
// record arrives intact and in order.
TEST(NicAssistedCore, RandomSizesManyLapsCreditsAlwaysHonoured) {
  const uint32_t block = 256;
  for (uint64_t window : {uint64_t(block), uint64_t(3 * block)}) {
    Rig rig(8 * block, window, /*slots=*/3, block, 4 * block);
    std::mt19937 rng(7);
    std::map<uint16_t, uint32_t> packet;
    for (uint32_t i = 0; i < 4000; ++i) {
      const uint16_t device = uint16_t(rng() % 2);
      auto r = make_record(device, packet[device]++, rng() % (block - wire::kBlockHeaderSize + 1), i);
      while (rig.send(r) == Outcome::kFull) {
        rig.receive(rng() % 6);
        ASSERT_TRUE(rig.core.drain().is_ok());
      }
      if (rng() % 3 == 0) rig.receive(rng() % 4);
      if (rng() % 2 == 0) {
        ASSERT_TRUE(rig.core.drain().is_ok());  // an interrupt
      }
    }
    while (rig.core.holding()) {
      rig.receive(1000);
      ASSERT_TRUE(rig.core.drain().is_ok());
    }
    rig.expect_all_delivered();
    const auto& c = rig.core.counters();
    EXPECT_GT(c.queued_records, 0u);
    EXPECT_GT(c.coalesced_records, c.coalesced_writes);
    EXPECT_GT(c.wrap_markers, 10u);
    EXPECT_EQ(c.credits_used, rig.wire.writes + rig.wire.pads);
  }
}

}  // namespace
}  // namespace slotstream::protocol
