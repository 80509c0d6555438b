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
  for (uint64_t t = 0; t < 4; ++t) {
    EXPECT_EQ(ring.cursor(), t);
    EXPECT_EQ(ring.next_length(), int64_t(10 + t));
    ring.advance();
  }
  EXPECT_EQ(ring.next_length(), -1);  // ticket 4 not claimed
}

TEST(SendRing, BlockIsNotSeenAsFilledForTheNextRoundBeforeItIsReleased) {
  std::vector<std::byte> mem(2 * 32);
  SendRing ring(mem.data(), 2, 32);
  SendRing::Slot s;
  ASSERT_TRUE(ring.claim(&s).is_ok());
  ring.commit(s, 5);
  ASSERT_TRUE(ring.claim(&s).is_ok());
  ring.commit(s, 6);
  ring.advance();
  ring.advance();
  // Ticket 2 uses the same block as ticket 0, which is filled (in flight) but not released:
  // the transmitter must not mistake ticket 0's data for ticket 2's.
  EXPECT_EQ(ring.cursor(), 2u);
  EXPECT_EQ(ring.wait_next(microseconds(0), microseconds(100)), -1);
  ring.release(0);
  EXPECT_EQ(ring.next_length(), -1);  // released, not yet filled again
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
    while (ring.wait_next(microseconds(2), microseconds(1000)) < 0) {
    }
    ASSERT_EQ(ring.cursor(), t);
    seen.push_back(std::to_integer<uint64_t>(ring.block(t)[0]));
    ring.advance();
    ring.release(t);
  }
  filler.join();
  for (uint64_t t = 0; t < 50; ++t) EXPECT_EQ(seen[t], t);
}

TEST(SendRing, TokenHasOneHolderAndReportsBlocksCommittedMeanwhile) {
  std::vector<std::byte> mem(4 * 32);
  SendRing ring(mem.data(), 4, 32);
  ASSERT_TRUE(ring.try_take_token());
  EXPECT_FALSE(ring.try_take_token());  // held
  EXPECT_FALSE(ring.give_token());      // nothing filled at the cursor
  ASSERT_TRUE(ring.try_take_token());
  // A filler commits while the token is held and cannot take it: the holder must learn of it.
  SendRing::Slot s;
  ASSERT_TRUE(ring.claim(&s).is_ok());
  ring.commit(s, 3, /*wake=*/false);
  EXPECT_FALSE(ring.try_take_token());
  EXPECT_TRUE(ring.give_token());
  ASSERT_TRUE(ring.try_take_token());
  EXPECT_EQ(ring.next_length(), 3);
  ring.advance();
  EXPECT_FALSE(ring.give_token());
}

TEST(SendRing, SleepingSenderIsWokenByACommitAndByWakeSender) {
  std::vector<std::byte> mem(4 * 32);
  SendRing ring(mem.data(), 4, 32);
  for (bool wake_in_commit : {true, false}) {
    const auto t0 = std::chrono::steady_clock::now();
    std::thread filler([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      SendRing::Slot s;
      ASSERT_TRUE(ring.claim(&s).is_ok());
      ring.commit(s, 7, wake_in_commit);
      if (!wake_in_commit) ring.wake_sender();
    });
    // A 10-second sleep that must end when the block is committed.
    EXPECT_EQ(ring.wait_next(microseconds(0), std::chrono::seconds(10)), 7);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    filler.join();
    ring.release(ring.cursor());
    ring.advance();
  }
}

TEST(SendRing, ANapWhileTheTokenIsHeldEndsWhenTheHolderWakesTheSender) {
  std::vector<std::byte> mem(4 * 32);
  SendRing ring(mem.data(), 4, 32);
  // The token is free (given back before the nap began, without a wake: the holder saw no one
  // waiting): nothing to wait for, the nap ends at once.
  auto t0 = std::chrono::steady_clock::now();
  ring.nap(std::chrono::seconds(10));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // Held by a filler that leaves work behind and wakes the sending thread: a 10-second nap ends.
  ASSERT_TRUE(ring.try_take_token());
  t0 = std::chrono::steady_clock::now();
  std::thread holder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (void)ring.give_token();
    ring.wake_sender();
  });
  ring.nap(std::chrono::seconds(10));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  holder.join();
  // Held, and nobody wakes it: the nap lasts its time.
  ASSERT_TRUE(ring.try_take_token());
  t0 = std::chrono::steady_clock::now();
  ring.nap(std::chrono::milliseconds(30));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
}

// A filler that gives up (claim with a deadline) leaves an empty block behind, so the cursor never
// waits for it: once the block is free it is committed with length 0 (nothing to send), and the
// next ticket goes on.
TEST(SendRing, AClaimThatTimesOutLeavesAnEmptyBlockAndTheCursorGoesOn) {
  std::vector<std::byte> mem(2 * 32);
  SendRing ring(mem.data(), 2, 32);
  SendRing::Slot s;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ring.claim(&s).is_ok());
    ring.commit(s, 7);
    ring.advance();
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ring.claim(&s, t0 + std::chrono::milliseconds(50)).code(), Code::kTimeout);  // ticket 2: block 0 busy
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
  EXPECT_EQ(ring.next_length(), -1);
  ring.release(0);  // block 0 is free: the abandoned ticket 2 is given back empty at once
  EXPECT_EQ(ring.cursor(), 2u);
  EXPECT_EQ(ring.next_length(), 0);
  ring.advance();
  ring.release(2);
  ring.release(1);
  ASSERT_TRUE(ring.claim(&s, std::chrono::steady_clock::now()).is_ok());  // ticket 3: free, no wait
  EXPECT_EQ(s.ticket, 3u);
  ring.commit(s, 9);
  EXPECT_EQ(ring.next_length(), 9);
}

// The block of a ticket that timed out may become free between the timeout and the give-up: then
// the filler commits it empty itself.
TEST(SendRing, ATicketFreedJustAsItsFillerGivesUpIsCommittedEmptyOnce) {
  std::vector<std::byte> mem(1 * 32);
  SendRing ring(mem.data(), 1, 32);
  SendRing::Slot s;
  ASSERT_TRUE(ring.claim(&s).is_ok());
  ring.commit(s, 3);
  ring.advance();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ring.release(0);
  });
  Status st = ring.claim(&s, std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
  releaser.join();
  if (st.is_ok()) ring.commit(s, 0);  // won the race: gives it back itself, as send_until does on error
  EXPECT_EQ(ring.cursor(), 1u);
  EXPECT_EQ(ring.next_length(), 0) << "ticket 1 must be filled (empty) exactly once";
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
