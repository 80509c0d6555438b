// The receiver session's idle policy (idle_nap), pure. The session itself (handshake, consumer
// loop, FIN) needs a sender over UCX: protocol_tests and integration tests (test_transfer,
// test_faults, test_idle).
#include "engine/ucx/session/receiver_session.h"

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

// Issue 19, item 6: a FIN whose counts wrap 2^64 once summed made the receiver answer "all stored"
// with nothing stored; the sum now saturates, so such a FIN can only be answered "missing".
TEST(Fin, MissingMessagesNeverWrapAndCountOnlyWhatIsBeyondTheStored) {
  wire::Fin fin;
  fin.messages = {{0, 1ull << 63}, {1, 1ull << 63}};  // 2^64 in all: wrapped to 0 before
  EXPECT_EQ(missing_messages(fin, [](uint16_t) { return uint64_t(0); }), UINT64_MAX);
  fin.messages = {{0, UINT64_MAX}, {1, UINT64_MAX}, {2, 2}};
  EXPECT_EQ(missing_messages(fin, [](uint16_t) { return uint64_t(1); }), UINT64_MAX);
  fin.messages = {{0, 10}, {1, 3}};
  EXPECT_EQ(missing_messages(fin, [](uint16_t d) { return d == 0 ? uint64_t(7) : uint64_t(5); }), 3u);  // 3 + 0
  EXPECT_EQ(missing_messages(wire::Fin{}, [](uint16_t) { return uint64_t(0); }), 0u);
}

TEST(Fin, OnlyDevicesTheConnectionDeclaredMayBeCounted) {
  wire::Fin fin;
  fin.messages = {{0, 1}, {7, 2}};
  EXPECT_EQ(check_fin(fin, {0, 7, 9}), std::nullopt);
  auto why = check_fin(fin, {0, 9});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("device 7"), std::string::npos) << *why;
}

}  // namespace
}  // namespace slotstream::session
