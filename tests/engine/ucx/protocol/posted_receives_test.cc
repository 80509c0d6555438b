#include "engine/ucx/protocol/posted_receives.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>

namespace slotstream::protocol {
namespace {

using Outcome = ReceiveQueue::Outcome;

// Receives that completed (buffer -> length) or failed, as a fake completion queue.
struct Completions {
  std::map<uint32_t, uint32_t> arrived;
  std::set<uint32_t> failed;
  Outcome operator()(uint32_t i, uint32_t* length) {
    if (failed.erase(i)) return Outcome::kFailed;
    auto it = arrived.find(i);
    if (it == arrived.end()) return Outcome::kPending;
    *length = it->second;
    arrived.erase(it);
    return Outcome::kArrived;
  }
};

std::vector<uint32_t> exposed(ReceiveQueue& q) {
  std::vector<ReceiveQueue::Ready> r;
  q.exposed(&r);
  std::vector<uint32_t> out;
  for (auto& e : r) out.push_back(e.buffer);
  return out;
}

TEST(ReceiveQueue, CompletionsAreHandedOutInPostingOrder) {
  ReceiveQueue q(4);
  Completions c;
  // A large message matched to buffer 0 is still arriving; the small one matched to 1 is in.
  c.arrived[1] = 100;
  EXPECT_EQ(q.advance(std::ref(c)), 0u);
  EXPECT_TRUE(exposed(q).empty()) << "1 must not overtake 0";
  c.arrived[0] = 5000;
  EXPECT_EQ(q.advance(std::ref(c)), 2u);
  EXPECT_EQ(exposed(q), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(q.unreleased_bytes(), 5100u);
  EXPECT_EQ(q.posted(), 2u);
}

TEST(ReceiveQueue, AReleasedBufferIsPostedAgainAtTheBack) {
  ReceiveQueue q(3);
  Completions c;
  c.arrived = {{0, 10}, {1, 20}};
  q.advance(std::ref(c));
  ASSERT_EQ(q.release(1), 20u);  // released out of order
  EXPECT_EQ(exposed(q), (std::vector<uint32_t>{0}));
  // Posting order now: 2, 1. The next two messages land in 2, then 1.
  c.arrived = {{1, 30}};
  EXPECT_EQ(q.advance(std::ref(c)), 0u) << "buffer 2 was posted before 1's new receive";
  c.arrived[2] = 40;
  EXPECT_EQ(q.advance(std::ref(c)), 2u);
  EXPECT_EQ(exposed(q), (std::vector<uint32_t>{0, 2, 1}));
  EXPECT_EQ(q.unreleased_bytes(), 80u);
  EXPECT_EQ(q.max_unreleased_bytes(), 80u);
  EXPECT_EQ(q.max_unreleased(), 3u);
}

TEST(ReceiveQueue, ReleasingWhatWasNotHandedOutChangesNothing) {
  ReceiveQueue q(2);
  Completions c;
  c.arrived = {{0, 10}};
  q.advance(std::ref(c));
  // Expect: still posted, unknown, and released twice are all refused.
  EXPECT_FALSE(q.release(1));
  EXPECT_FALSE(q.release(9));
  EXPECT_EQ(q.release(0), 10u);
  EXPECT_FALSE(q.release(0));
  EXPECT_EQ(q.unreleased_bytes(), 0u);
  EXPECT_EQ(q.posted(), 2u);
}

TEST(ReceiveQueue, AFailedReceiveIsNeverHandedOutAndGoesToTheBack) {
  ReceiveQueue q(3);
  Completions c;
  c.failed = {0};
  c.arrived = {{1, 7}};
  EXPECT_EQ(q.advance(std::ref(c)), 1u);
  EXPECT_EQ(exposed(q), (std::vector<uint32_t>{1}));
  // Posting order: 2, 0.
  c.arrived = {{0, 8}, {2, 9}};
  EXPECT_EQ(q.advance(std::ref(c)), 2u);
  EXPECT_EQ(exposed(q), (std::vector<uint32_t>{1, 2, 0}));
}

TEST(ReceiveQueue, ABufferReusedManyTimesIsListedOnceEachTime) {
  ReceiveQueue q(2);
  Completions c;
  for (uint32_t round = 0; round < 50; ++round) {
    c.arrived = {{0, round + 1}, {1, round + 2}};
    ASSERT_EQ(q.advance(std::ref(c)), 2u) << round;
    ASSERT_EQ(exposed(q), (std::vector<uint32_t>{0, 1})) << round;
    ASSERT_EQ(q.release(0), round + 1);
    ASSERT_EQ(exposed(q), (std::vector<uint32_t>{1})) << round;
    ASSERT_EQ(q.release(1), round + 2);
  }
  EXPECT_EQ(q.unreleased(), 0u);
  EXPECT_EQ(q.max_unreleased(), 2u);
}

}  // namespace
}  // namespace slotstream::protocol
