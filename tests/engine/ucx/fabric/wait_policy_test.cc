// fabric::wait_policy (fabric.h): how Request::wait spends the start of a wait.
#include <gtest/gtest.h>

#include <chrono>

#include "engine/ucx/fabric/fabric.h"

namespace slotstream::fabric::wait_policy {
namespace {
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

TEST(WaitPolicy, SpinsWhereCompletionsTakeMicrosecondsAndSleepsWhereTheyTakeAPeersRoundTrip) {
  EXPECT_EQ(spin_budget(nanoseconds(0)), kMaxSpin);          // nothing measured yet: as before
  EXPECT_EQ(spin_budget(nanoseconds(100)), kMaxSpin);        // a shm status read
  EXPECT_EQ(spin_budget(microseconds(5)), kMaxSpin);         // an RDMA read (the paper's Fig. 10)
  EXPECT_EQ(spin_budget(microseconds(18)), nanoseconds(0));  // a tcp read through the receiver's thread
  EXPECT_EQ(spin_budget(microseconds(140)), nanoseconds(0));
}

TEST(WaitPolicy, FirstSampleSetsTheTypicalCompletion) {
  EXPECT_EQ(update_typical(nanoseconds(0), microseconds(18)), microseconds(18));
}

TEST(WaitPolicy, OnePreemptedWaitDoesNotTurnAFastFabricIntoASleepingOne) {
  // A shm read of 0.1 µs, then one wait stretched to 5 ms by the scheduler: still spun for.
  const auto typical = update_typical(nanoseconds(100), milliseconds(5));
  EXPECT_LE(typical, nanoseconds(200));
  EXPECT_EQ(spin_budget(typical), kMaxSpin);
}

TEST(WaitPolicy, FollowsAFabricWhoseCompletionsBecomeRoundTrips) {
  auto typical = nanoseconds(100);
  int samples = 0;
  while (spin_budget(typical) != nanoseconds(0) && samples < 1000) {
    typical = update_typical(typical, microseconds(18));
    ++samples;
  }
  // A sample counts as at most twice the typical, with weight 1/4: 1.25x per sample, ~21 samples
  // from 0.1 to 10 µs (a few ms of a sender's status reads over tcp).
  EXPECT_GE(samples, 15);
  EXPECT_LE(samples, 25);
  for (int i = 0; i < 50; ++i) typical = update_typical(typical, microseconds(18));
  EXPECT_NEAR(double(typical.count()), 18000.0, 500.0);
  // And back: completions in microseconds again are spun for again.
  for (int i = 0; i < 50; ++i) typical = update_typical(typical, nanoseconds(100));
  EXPECT_EQ(spin_budget(typical), kMaxSpin);
}

}  // namespace
}  // namespace slotstream::fabric::wait_policy
