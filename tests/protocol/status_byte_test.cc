#include "protocol/status_byte.h"

#include <gtest/gtest.h>

namespace slotstream::protocol {
namespace {

TEST(StatusCache, PicksEmptyBlocksRoundRobin) {
  StatusCache c(4);
  uint64_t held = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_EQ(c.pick(&held), i);
    c.mark_full(i);
  }
  EXPECT_EQ(c.pick(&held), -1);  // no free block: time to read the receiver's status array
  EXPECT_EQ(held, 0u);
}

TEST(StatusCache, FreshReadFreesBlocksAndSkipsHeldOnes) {
  StatusCache c(4);
  uint64_t held = 0;
  for (uint32_t i = 0; i < 4; ++i) c.mark_full(c.pick(&held));
  // What an RDMA read of the receiver's array brings back: 0 freed, 1 still full, 2 held, 3 freed.
  auto raw = c.raw();
  raw[0] = kEmpty;
  raw[1] = kFull;
  raw[2] = kHeld;
  raw[3] = kEmpty;
  EXPECT_EQ(c.pick(&held), 0);  // cursor wrapped to 0
  c.mark_full(0);
  EXPECT_EQ(c.pick(&held), 3);  // 1 full, 2 held: skipped (paper §3.3)
  EXPECT_EQ(held, 1u);
  c.mark_full(3);
  EXPECT_EQ(c.pick(&held), -1);
}

TEST(StatusCache, HeldBlockIsUsedAgainOnceReleased) {
  StatusCache c(3);
  uint64_t held = 0;
  auto raw = c.raw();
  raw[0] = kHeld;
  EXPECT_EQ(c.pick(&held), 1);
  raw[0] = kEmpty;  // the receiver released it; a later read shows it
  c.mark_full(1);
  c.mark_full(2);
  EXPECT_EQ(c.pick(&held), 0);
}

}  // namespace
}  // namespace slotstream::protocol
