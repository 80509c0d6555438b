// The receiver session's idle policy (idle_nap), pure. The session itself (handshake, consumer
// loop, FIN) needs a sender over UCX: protocol_tests and integration tests (test_transfer,
// test_faults, test_idle).
#include "session/receiver_session.h"

#include <gtest/gtest.h>

namespace slotstream::session {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

static_assert(kMinIdleSleep < kMaxIdleSleep && kMaxIdleSleep < kLongIdleSleep);
static_assert(kSpinIdle < kLongIdle, "a consumer naps before it is long idle");

TEST(IdleNap, AnEighthOfTheIdleTimeBetweenTheShortestAndTheLongestNap) {
  EXPECT_EQ(idle_nap(microseconds(0)), kMinIdleSleep);
  EXPECT_EQ(idle_nap(microseconds(100)), kMinIdleSleep);  // 12.5 us is below the shortest nap
  EXPECT_EQ(idle_nap(microseconds(400)), microseconds(50));
  EXPECT_EQ(idle_nap(milliseconds(8)), kMaxIdleSleep);
  EXPECT_EQ(idle_nap(milliseconds(50)), kMaxIdleSleep);  // a 25 fps camera's gap keeps the short naps
}

TEST(IdleNap, ALongIdleSenderIsLookedAtEveryTwentyMilliseconds) {
  EXPECT_EQ(idle_nap(kLongIdle), kMaxIdleSleep);  // not yet past it
  EXPECT_EQ(idle_nap(milliseconds(120)), milliseconds(15));
  EXPECT_EQ(idle_nap(milliseconds(160)), kLongIdleSleep);
  EXPECT_EQ(idle_nap(std::chrono::hours(1)), kLongIdleSleep);
}

TEST(IdleNap, NeverShorterForALongerIdleTime) {
  Clock::duration before{};
  for (auto idle = microseconds(0); idle < milliseconds(300); idle += microseconds(37)) {
    const Clock::duration nap = idle_nap(idle);
    EXPECT_GE(nap, before) << "idle " << idle.count() << " us";
    EXPECT_LE(nap, Clock::duration(kLongIdleSleep));
    before = nap;
  }
}

}  // namespace
}  // namespace slotstream::session
