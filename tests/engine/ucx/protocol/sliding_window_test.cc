#include "engine/ucx/protocol/sliding_window.h"

#include <gtest/gtest.h>

namespace slotstream::protocol {
namespace {

TEST(WindowTracker, FillsUpToNBlocks) {
  WindowTracker w(3);
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.push(), 0u);
  EXPECT_EQ(w.push(), 1u);
  EXPECT_EQ(w.push(), 2u);
  EXPECT_TRUE(w.full());
}

TEST(WindowTracker, HeadCannotPassAnUnacknowledgedBlock) {
  WindowTracker w(3);
  for (int i = 0; i < 3; ++i) w.push();
  // Blocks 1 and 2 are processed first (e.g. another device's consumer was faster)...
  EXPECT_EQ(w.ack(1), 0u);
  EXPECT_EQ(w.ack(2), 0u);
  EXPECT_TRUE(w.full());    // ...but block 0 blocks the head: nothing can be sent (Figure 1d)
  EXPECT_EQ(w.ack(0), 3u);  // then all three are freed at once, in order
  EXPECT_TRUE(w.empty());
}

TEST(WindowTracker, WrapsAroundAndIgnoresStrayOrDuplicateAcks) {
  WindowTracker w(2);
  for (int round = 0; round < 5; ++round) {
    uint32_t a = w.push(), b = w.push();
    EXPECT_EQ(a, 0u);
    EXPECT_EQ(b, 1u);
    EXPECT_EQ(w.ack(a), 1u);
    EXPECT_EQ(w.ack(a), 0u);  // duplicate
    EXPECT_EQ(w.ack(7), 0u);  // no such block
    EXPECT_EQ(w.ack(b), 1u);
  }
  EXPECT_EQ(w.head(), 10u);
  w.push();
  EXPECT_EQ(w.ack(1), 0u);  // slot 1 is not in flight
  EXPECT_EQ(w.in_flight(), 1u);
}

TEST(WindowTracker, OutOfOrderAcksAcrossTheWrapFreeOnlyTheContiguousPrefix) {
  WindowTracker w(4);
  for (int i = 0; i < 4; ++i) w.push();
  EXPECT_EQ(w.ack(0), 1u);
  EXPECT_EQ(w.ack(1), 1u);
  EXPECT_EQ(w.push(), 0u);  // the tail wraps: in flight are slots 2, 3, 0 (oldest first)
  EXPECT_EQ(w.push(), 1u);  // ... and 1: full again
  EXPECT_TRUE(w.full());
  // The receiver processes the wrapped blocks first; the head is still at slot 2.
  EXPECT_EQ(w.ack(0), 0u);
  EXPECT_EQ(w.ack(1), 0u);
  EXPECT_EQ(w.ack(3), 0u);
  EXPECT_TRUE(w.full());
  EXPECT_EQ(w.head(), 2u);
  EXPECT_EQ(w.ack(2), 4u);  // the oldest block's ACK releases all four, in order
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.head(), 6u);
  EXPECT_EQ(w.tail(), 6u);
}

TEST(WindowTracker, AwaitingAckIsTrueOnlyForUnackedBlocksInFlight) {
  WindowTracker w(3);
  EXPECT_FALSE(w.awaiting_ack(0));  // nothing in flight
  w.push();
  w.push();
  EXPECT_TRUE(w.awaiting_ack(0));
  EXPECT_TRUE(w.awaiting_ack(1));
  EXPECT_FALSE(w.awaiting_ack(2));  // never written
  EXPECT_FALSE(w.awaiting_ack(3));  // no such slot
  EXPECT_EQ(w.ack(1), 0u);          // acked but behind block 0
  EXPECT_FALSE(w.awaiting_ack(1));  // a repeat of that ACK would be a duplicate
  EXPECT_TRUE(w.awaiting_ack(0));
  EXPECT_EQ(w.ack(0), 2u);
  EXPECT_FALSE(w.awaiting_ack(0));
  EXPECT_FALSE(w.awaiting_ack(1));
}

TEST(WindowTracker, SingleBlockWindowAlternatesFullAndEmpty) {
  WindowTracker w(1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(w.empty());
    EXPECT_EQ(w.push(), 0u);
    EXPECT_TRUE(w.full());
    EXPECT_EQ(w.ack(0), 1u);
  }
  EXPECT_EQ(w.head(), 3u);
}

}  // namespace
}  // namespace slotstream::protocol
