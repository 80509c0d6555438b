#include "engine/dgram/placement/recv_queue.h"

#include <gtest/gtest.h>

#include <vector>

namespace slotstream::dgram {
namespace {

std::vector<std::byte> bytes(size_t n, int v) { return std::vector<std::byte>(n, std::byte(v)); }

TEST(ReceiveQueues, MatchesMessagesByMsnInArrivalOrder) {
  ReceiveQueues q(100);
  q.post(5, 2, 1000);
  std::vector<Completion> out;
  EXPECT_EQ(q.place(5, 1, 0, bytes(10, 1), false, 0, &out), Placed::kPlaced);
  EXPECT_EQ(q.place(5, 0, 0, bytes(10, 0), true, 0, &out), Placed::kCompleted);  // message 0 finishes first
  EXPECT_EQ(q.place(5, 1, 10, bytes(10, 1), true, 0, &out), Placed::kCompleted);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].msn, 0u);
  EXPECT_EQ(out[1].msn, 1u);
  EXPECT_EQ(out[1].length, 20u);
  EXPECT_EQ(q.place(5, 1, 0, bytes(10, 1), false, 0, &out), Placed::kStale);
}

TEST(ReceiveQueues, NoPostedBufferMeansDropped) {
  ReceiveQueues q(100);
  q.post(0, 1, 1000);
  std::vector<Completion> out;
  EXPECT_EQ(q.place(0, 0, 0, bytes(10, 1), false, 0, &out), Placed::kPlaced);
  EXPECT_EQ(q.place(0, 1, 0, bytes(10, 1), false, 0, &out), Placed::kNoBuffer);
  EXPECT_EQ(q.place(9, 0, 0, bytes(10, 1), true, 0, &out), Placed::kUnknownKey);
  EXPECT_EQ(q.outstanding(), 1u);
}

TEST(ReceiveQueues, IncompleteMessagesTimeOut) {
  ReceiveQueues q(100);
  q.post(0, 4, 1000);
  std::vector<Completion> out;
  q.place(0, 0, 0, bytes(10, 1), false, 50, &out);
  q.expire(149, &out);
  EXPECT_TRUE(out.empty());
  q.expire(150, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].outcome, Outcome::kIncomplete);
  EXPECT_EQ(q.place(0, 0, 10, bytes(10, 1), true, 151, &out), Placed::kStale);  // too late
  EXPECT_EQ(q.outstanding(), 0u);
}

TEST(ReceiveQueues, RemembersFinishedMessagesAcrossLosses) {
  ReceiveQueues q(100);
  q.post(0, 8, 100);
  std::vector<Completion> out;
  // Message 0 never arrives; 1..5000 do. Old duplicates stay stale even so.
  for (uint32_t m = 1; m <= 5000; ++m) ASSERT_EQ(q.place(0, m, 0, bytes(1, 1), true, 0, &out), Placed::kCompleted);
  EXPECT_EQ(q.place(0, 4999, 0, bytes(1, 1), true, 0, &out), Placed::kStale);
  EXPECT_EQ(q.place(0, 5001, 0, bytes(1, 1), true, 0, &out), Placed::kCompleted);
}

}  // namespace
}  // namespace slotstream::dgram
