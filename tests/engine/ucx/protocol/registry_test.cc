// PollBackoff (protocol.h, registry.cc): the wait between reads that each are a round trip.
#include <gtest/gtest.h>

#include <chrono>

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {
namespace {
using std::chrono::microseconds;
using std::chrono::nanoseconds;

TEST(PollBackoff, ReadsThroughThePeerAreSpacedByAboutOneReadFromTheFirst) {
  // A tcp status read of 17.6 µs: the next read comes ~one read later, not at once.
  EXPECT_EQ(PollBackoff::round_trip_sleep(1, nanoseconds(17600)), microseconds(18));
  EXPECT_EQ(PollBackoff::round_trip_sleep(2, microseconds(40)), microseconds(40));
}

TEST(PollBackoff, ReadsThroughThePeerBackOffTowards200MicrosecondsThenTheStalledSleep) {
  EXPECT_EQ(PollBackoff::round_trip_sleep(150, microseconds(18)), microseconds(150));
  EXPECT_EQ(PollBackoff::round_trip_sleep(300, microseconds(18)), microseconds(200));
  EXPECT_EQ(PollBackoff::round_trip_sleep(3, microseconds(5000)), microseconds(200));  // a read slowed by load
  // A receiver that released nothing for thousands of reads (stalled): 2 ms, as pause() does.
  EXPECT_GT(PollBackoff::round_trip_sleep(400, microseconds(18)), microseconds(200));
  EXPECT_EQ(PollBackoff::round_trip_sleep(100000, microseconds(18)), microseconds(2000));
}

}  // namespace
}  // namespace slotstream::protocol
