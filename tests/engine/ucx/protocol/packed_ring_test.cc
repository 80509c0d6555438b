// The packed-ring sender's decisions (SDP §3) over a fake ring: direct writes while there is
// room, coalescing while the ring is full, one write per flush, wrap markers, and every record's
// device, number and bytes intact and in order at the receiver. Pure logic, no UCX.
#include "engine/ucx/protocol/packed_ring.h"

#include <gtest/gtest.h>

#include <random>

#include "fake_ring.h"

namespace slotstream::protocol {
namespace {

using testing::FakeRingReceiver;
using testing::FakeRingWire;
using testing::make_record;
using Outcome = PackedRingCore::Outcome;

struct Rig {
  Rig(uint64_t ring_bytes, uint64_t buffer_bytes)
      : wire(ring_bytes),
        rx(wire, 0),
        memory(buffer_bytes),
        core(wire, ring_bytes, memory) {}
  Outcome send(const std::vector<std::byte>& r) { return testing::transmit(core, r, &sent); }
  // The receiver consumes everything it was told about and ACKs.
  void receive_all() {
    rx.take_notices();
    rx.release_all();
    core.on_ack(rx.ledger.head());
  }
  void expect_all_delivered() { testing::expect_delivered(rx, sent); }
  FakeRingWire wire;
  FakeRingReceiver rx;
  std::vector<std::byte> memory;
  PackedRingCore core;
  testing::Records sent;
};

TEST(PackedRingCore, WritesWhileThereIsRoomThenCoalescesUntilFlushed) {
  Rig rig(256, 256);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(rig.send(make_record(1, i, 48, i)), Outcome::kWritten);
  EXPECT_EQ(rig.wire.writes, 4u);
  // Ring full: the records go into the sender buffer and control returns (§3.1).
  EXPECT_EQ(rig.send(make_record(2, 0, 48, 10)), Outcome::kCoalesced);
  EXPECT_EQ(rig.send(make_record(1, 4, 10, 11)), Outcome::kCoalesced);
  EXPECT_TRUE(rig.core.holding());
  rig.receive_all();
  // Space is back, but nothing moves by itself (§3.2: the progress flaw): only flush() sends,
  // which the sender calls on its next transmit (or, with flush=idle, when idle).
  EXPECT_EQ(rig.wire.writes, 4u);
  uint64_t writes = 0;
  ASSERT_TRUE(rig.core.flush(&writes).is_ok());
  EXPECT_EQ(writes, 1u) << "coalesced records leave as one write";
  EXPECT_FALSE(rig.core.holding());
  rig.expect_all_delivered();
  EXPECT_EQ(rig.rx.multi_record_segments, 1u);
  EXPECT_EQ(rig.core.counters().coalesced_records, 2u);
  EXPECT_EQ(rig.core.counters().coalesced_bytes, 64u + 26u);
}

TEST(PackedRingCore, ARecordWaitsBehindCoalescedOnesEvenIfItFits) {
  Rig rig(128, 256);
  EXPECT_EQ(rig.send(make_record(1, 0, 100, 1)), Outcome::kWritten);
  EXPECT_EQ(rig.send(make_record(1, 1, 100, 2)), Outcome::kCoalesced);
  // 12 bytes are free, enough for this one — but it must not overtake record 1.
  EXPECT_EQ(rig.send(make_record(1, 2, 0, 3)), Outcome::kCoalesced);
  rig.receive_all();
  ASSERT_TRUE(rig.core.flush().is_ok());
  rig.receive_all();
  ASSERT_TRUE(rig.core.flush().is_ok());
  rig.expect_all_delivered();
}

TEST(PackedRingCore, FullSenderBufferSaysFull) {
  Rig rig(64, 64);
  EXPECT_EQ(rig.send(make_record(1, 0, 48, 1)), Outcome::kWritten);
  EXPECT_EQ(rig.send(make_record(1, 1, 48, 2)), Outcome::kCoalesced);
  EXPECT_EQ(rig.send(make_record(1, 2, 48, 3)), Outcome::kFull);
  rig.receive_all();
  ASSERT_TRUE(rig.core.flush().is_ok());
  // The buffer is drained and reset: the record is written straight away once there is room.
  rig.receive_all();
  EXPECT_EQ(rig.send(make_record(1, 2, 48, 3)), Outcome::kWritten);
  rig.expect_all_delivered();
}

TEST(PackedRingCore, ARecordAsLargeAsTheRingAfterAPartialLap) {
  // The ring is one 64-byte block. A 40-byte record leaves 24 bytes at the end: the next 64-byte
  // record needs a wrap marker first, and the whole ring — which it gets once the receiver has
  // released the small record (the marker frees itself behind it).
  Rig rig(64, 64);
  EXPECT_EQ(rig.send(make_record(1, 0, 24, 1)), Outcome::kWritten);
  EXPECT_EQ(rig.send(make_record(1, 1, 48, 2)), Outcome::kCoalesced);
  EXPECT_EQ(rig.wire.pads, 1u) << "the marker goes at once, it needs only the tail's bytes";
  rig.receive_all();
  EXPECT_EQ(rig.rx.ledger.head(), 64u);
  ASSERT_TRUE(rig.core.flush().is_ok());
  EXPECT_FALSE(rig.core.holding());
  rig.expect_all_delivered();
}

TEST(PackedRingCore, StaleAndBogusAcksAreIgnored) {
  Rig rig(256, 256);
  rig.send(make_record(1, 0, 48, 1));
  EXPECT_FALSE(rig.core.on_ack(65)) << "beyond the tail";
  EXPECT_TRUE(rig.core.on_ack(64));
  EXPECT_FALSE(rig.core.on_ack(64));
  EXPECT_FALSE(rig.core.on_ack(0));
}

// Many laps of random sizes, a receiver that consumes in random batches (so the ring fills and
// empties again and again), ACKs that are sometimes not seen in time: every record arrives
// intact and in order, segments never cross the end, and coalescing really packs.
TEST(PackedRingCore, RandomSizesManyLapsEverythingIntactAndInOrder) {
  const uint32_t block = 256;
  Rig rig(4 * block, 4 * block);
  std::mt19937 rng(42);
  std::map<uint16_t, uint32_t> packet;
  for (uint32_t i = 0; i < 5000; ++i) {
    const uint16_t device = uint16_t(rng() % 3);
    auto r = make_record(device, packet[device]++, rng() % (block - wire::kBlockHeaderSize + 1), i);
    while (rig.send(r) == Outcome::kFull) {
      rig.receive_all();
      ASSERT_TRUE(rig.core.flush().is_ok());
    }
    if (rng() % 4 == 0) {  // the receiver makes some progress
      rig.rx.take_notices();
      rig.rx.release_some(rng() % 8);
      if (rng() % 2) rig.core.on_ack(rig.rx.ledger.head());
    }
    if (rig.core.holding() && rng() % 3 == 0) {
      ASSERT_TRUE(rig.core.flush().is_ok());  // "the next call"
    }
  }
  while (rig.core.holding()) {
    rig.receive_all();
    ASSERT_TRUE(rig.core.flush().is_ok());
  }
  rig.expect_all_delivered();
  const auto& c = rig.core.counters();
  EXPECT_GT(c.coalesced_records, c.coalesced_writes) << "coalesced writes carry several records";
  EXPECT_GT(rig.rx.multi_record_segments, 0u);
  EXPECT_GT(c.wrap_markers, 10u);
  EXPECT_GT(rig.core.space().tail(), 50u * 4 * block) << "many laps";
}

}  // namespace
}  // namespace slotstream::protocol
