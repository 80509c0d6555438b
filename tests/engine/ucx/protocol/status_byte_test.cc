#include "engine/ucx/protocol/status_byte.h"

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

// The paper's policy (policy=paper, §3.2.4, §3.3, Fig. 18): blocks in order; a held block is skipped,
// a full one is waited for (the status array read again) even when a later block is free.
TEST(StatusCache, PaperWaitsForAFullBlockAndSkipsOnlyHeldOnes) {
  StatusCache c(4, Pick::kPaper);
  uint64_t held = 0;
  for (uint32_t i = 0; i < 4; ++i) c.mark_full(c.pick(&held));  // cursor back at 0
  auto raw = c.raw();
  raw[0] = kFull;  // still being consumed
  raw[1] = kEmpty;
  raw[2] = kHeld;
  raw[3] = kEmpty;
  EXPECT_EQ(c.pick(&held), -1) << "in order: block 0 is full, so the sender waits (reads again)";
  raw[0] = kEmpty;
  EXPECT_EQ(c.pick(&held), 0);
  c.mark_full(0);
  EXPECT_EQ(c.pick(&held), 1);
  c.mark_full(1);
  EXPECT_EQ(held, 0u);
  EXPECT_EQ(c.pick(&held), 3) << "block 2 is held (status 2): skipped";
  EXPECT_EQ(held, 1u);
  c.mark_full(3);
  EXPECT_EQ(c.pick(&held), -1);
}

TEST(StatusCache, AnyPassesAFullBlockToTheNextFreeOne) {
  StatusCache c(4, Pick::kAny);
  uint64_t held = 0;
  for (uint32_t i = 0; i < 4; ++i) c.mark_full(c.pick(&held));
  auto raw = c.raw();
  raw[0] = kFull;
  raw[1] = kEmpty;
  raw[2] = kEmpty;
  raw[3] = kEmpty;
  EXPECT_EQ(c.pick(&held), 1);
}

TEST(StatusCache, PaperWithEveryOtherBlockHeldStillMoves) {
  StatusCache c(4, Pick::kPaper);
  uint64_t held = 0;
  auto raw = c.raw();
  raw[0] = kHeld;
  raw[2] = kHeld;
  EXPECT_EQ(c.pick(&held), 1);
  c.mark_full(1);
  EXPECT_EQ(c.pick(&held), 3);
  c.mark_full(3);
  EXPECT_EQ(c.pick(&held), -1);  // 0 held, 1 full: wait
}

TEST(StatusByteOptions, PolicyTakesAnyOrPaper) {
  Pick p = Pick::kPaper;
  Options o;
  ASSERT_TRUE(parse_pick(o, &p).is_ok());
  EXPECT_EQ(p, Pick::kAny);
  ASSERT_TRUE(Options::parse("policy=paper", &o).is_ok());
  ASSERT_TRUE(parse_pick(o, &p).is_ok());
  EXPECT_EQ(p, Pick::kPaper);
  ASSERT_TRUE(Options::parse("policy=any", &o).is_ok());
  ASSERT_TRUE(parse_pick(o, &p).is_ok());
  EXPECT_EQ(p, Pick::kAny);
  ASSERT_TRUE(Options::parse("policy=in_order", &o).is_ok());
  Status st = parse_pick(o, &p);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("paper"), std::string::npos) << st.message();
  ASSERT_TRUE(Options::parse("pick=in_order", &o).is_ok());  // its first name, never released: one name
  EXPECT_FALSE(parse_pick(o, &p).is_ok());
}

}  // namespace
}  // namespace slotstream::protocol
