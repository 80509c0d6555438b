// The sender lane's pure decisions: which error a user reads when the transport fails, and how
// long the sending thread sleeps between idle turns. The lane itself (handshake, fabric, sending
// thread) needs a receiver: integration tests test_transfer, test_faults and test_idle.
#include "engine/ucx/session/sender_lane.h"

#include <gtest/gtest.h>

namespace slotstream::session {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr std::string_view kAdvice =
    "): it stopped or died, and nothing more can be sent on this connection. Start the receiver again, then this "
    "sender";

TEST(SenderLane, EveryWayOfLosingTheReceiverReadsTheSame) {
  // The control socket's EOF (shm), the endpoint's transport error (tcp), a protocol's failed put:
  // one error, which says what happened and what to do (tcp used to read "receiver unreachable" or
  // "lost the receiver (did it die?): Endpoint timeout", shm "receiver closed the connection").
  EXPECT_EQ(receiver_lost("it closed the connection").message(),
            "lost the receiver (it closed the connection" + std::string(kAdvice));
  for (const char* how : {"Endpoint timeout", "receiver unreachable", "receiver unreachable (ACK channel)"}) {
    Status st = explain_transmit_error({Code::kPeerGone, how});
    EXPECT_EQ(st.code(), Code::kPeerGone);
    EXPECT_EQ(st.message(), "lost the receiver (" + std::string(how) + std::string(kAdvice));
  }
}

TEST(SenderLane, ErrorsThatSayWhatHappenedAlreadyAreLeftAlone) {
  // Expect: no second explanation in front of the lane's own words.
  Status gone = explain_transmit_error(receiver_lost("it closed the connection"));
  EXPECT_EQ(gone.message(), receiver_lost("it closed the connection").message());
  Status io = explain_transmit_error({Code::kIoError, "Endpoint timeout"});
  EXPECT_EQ(io.code(), Code::kIoError);
  EXPECT_EQ(io.message(), "Endpoint timeout");
  EXPECT_TRUE(explain_transmit_error(Status::ok()).is_ok());
}

TEST(SenderLane, IdlePeriodIsShortestWithTransfersInFlightThenWhileHolding) {
  // In flight wins over everything: only progressing the worker frees a block.
  EXPECT_EQ(sending_idle_period(true, true, std::chrono::seconds(10)), microseconds(20));
  EXPECT_EQ(sending_idle_period(true, false, microseconds(0)), microseconds(20));
  // Records held back are flushed by the next idle turn, whatever the idle time.
  EXPECT_EQ(sending_idle_period(false, true, std::chrono::seconds(10)), microseconds(50));
}

TEST(SenderLane, AnIdleLaneLooksEveryMillisecondThenEveryTwentyOnceIdleForAHundred) {
  EXPECT_EQ(sending_idle_period(false, false, microseconds(0)), microseconds(1000));
  EXPECT_EQ(sending_idle_period(false, false, milliseconds(100)), microseconds(1000));  // not yet past it
  EXPECT_EQ(sending_idle_period(false, false, milliseconds(100) + microseconds(1)), milliseconds(20));
  EXPECT_EQ(sending_idle_period(false, false, std::chrono::hours(1)), milliseconds(20));
}

}  // namespace
}  // namespace slotstream::session
