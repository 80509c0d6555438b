#include "stream/send_ring.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace slotstream::stream {
namespace {

using std::chrono::microseconds;

TEST(SendRing, TicketsMapToBlocksInOrder) {
  std::vector<std::byte> mem(4 * 32);
  SendRing ring(mem.data(), 4, 32);
  for (uint64_t t = 0; t < 4; ++t) {
    SendRing::Slot s;
    ASSERT_TRUE(ring.claim(&s).is_ok());
    EXPECT_EQ(s.ticket, t);
    EXPECT_EQ(s.index, t);
    EXPECT_EQ(s.block.data(), mem.data() + t * 32);
    ring.commit(s, 10 + uint32_t(t));
  }
  for (uint64_t t = 0; t < 4; ++t) EXPECT_EQ(ring.wait_filled(t, microseconds(0)), int64_t(10 + t));
}

TEST(SendRing, BlockIsNotSeenAsFilledForTheNextRoundBeforeItIsReleased) {
  std::vector<std::byte> mem(2 * 32);
  SendRing ring(mem.data(), 2, 32);
  SendRing::Slot s;
  ASSERT_TRUE(ring.claim(&s).is_ok());
  ring.commit(s, 5);
  // Ticket 2 uses the same block as ticket 0, which is filled (in flight) but not released:
  // the sending thread must not mistake ticket 0's data for ticket 2's.
  EXPECT_EQ(ring.wait_filled(2, microseconds(100)), -1);
}

TEST(SendRing, FillerWaitsForReleaseAndKeepsOrder) {
  std::vector<std::byte> mem(2 * 32);
  SendRing ring(mem.data(), 2, 32);
  std::vector<uint64_t> seen;
  std::thread filler([&] {
    for (int i = 0; i < 50; ++i) {
      SendRing::Slot s;
      ASSERT_TRUE(ring.claim(&s).is_ok());
      s.block[0] = std::byte(i);
      ring.commit(s, 1);
    }
  });
  for (uint64_t t = 0; t < 50; ++t) {
    int64_t len;
    while ((len = ring.wait_filled(t, microseconds(1000))) < 0) {
    }
    seen.push_back(std::to_integer<uint64_t>(ring.block(t)[0]));
    ring.release(t);
  }
  filler.join();
  for (uint64_t t = 0; t < 50; ++t) EXPECT_EQ(seen[t], t);
}

TEST(SendRing, AbortWakesAWaitingFiller) {
  std::vector<std::byte> mem(32);
  SendRing ring(mem.data(), 1, 32);
  SendRing::Slot s;
  ASSERT_TRUE(ring.claim(&s).is_ok());
  ring.commit(s, 1);
  Status result;
  std::thread filler([&] {
    SendRing::Slot s2;
    result = ring.claim(&s2);  // blocks: the only block is in use
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ring.abort();
  filler.join();
  EXPECT_EQ(result.code(), Code::kCancelled);
}

}  // namespace
}  // namespace slotstream::stream
