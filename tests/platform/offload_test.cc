#include "platform/offload.h"

#include <gtest/gtest.h>

namespace slotstream::platform {
namespace {

using std::chrono::milliseconds;

TEST(Offload, HysteresisOffloadsAboveTakesBackBelowAndHoldsBetween) {
  OffloadPolicy p{80, 50, milliseconds(0)};
  EXPECT_EQ(decide(p, 90, 3, 0, std::nullopt), Move::kOffload);
  EXPECT_EQ(decide(p, 80, 3, 0, std::nullopt), Move::kNone);  // not above
  EXPECT_EQ(decide(p, 65, 2, 1, std::nullopt), Move::kNone);  // between: stays as it is
  EXPECT_EQ(decide(p, 49, 2, 1, std::nullopt), Move::kTakeBack);
  EXPECT_EQ(decide(p, 50, 2, 1, std::nullopt), Move::kNone);
}

TEST(Offload, NothingToMoveMeansNoMove) {
  OffloadPolicy p{80, 50, milliseconds(0)};
  EXPECT_EQ(decide(p, 99, 0, 3, std::nullopt), Move::kNone);  // everything is offloaded already
  EXPECT_EQ(decide(p, 0, 3, 0, std::nullopt), Move::kNone);   // nothing to take back
}

TEST(Offload, OneMovePerSettleTime) {
  OffloadPolicy p{80, 50, milliseconds(2000)};
  EXPECT_EQ(decide(p, 99, 3, 0, milliseconds(1999)), Move::kNone);
  EXPECT_EQ(decide(p, 99, 3, 0, milliseconds(2000)), Move::kOffload);
  EXPECT_EQ(decide(p, 10, 2, 1, milliseconds(10)), Move::kNone);
}

TEST(Offload, ThresholdsMustLeaveAGap) {
  EXPECT_TRUE(check({80, 50, milliseconds(1)}).is_ok());
  EXPECT_EQ(check({50, 50, milliseconds(1)}).code(), Code::kInvalidArgument);
  EXPECT_EQ(check({40, 50, milliseconds(1)}).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace slotstream::platform
