#include "platform/replay_log.h"

#include <gtest/gtest.h>

namespace slotstream::platform {
namespace {

std::vector<std::byte> msg(size_t n) { return std::vector<std::byte>(n, std::byte{1}); }

TEST(ReplayLog, KeepsWhatIsNotConfirmedAcrossConnections) {
  ReplayLog log;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(log.append(msg(10)), uint64_t(i));
  EXPECT_EQ(log.bytes(), 50u);
  // The first connection began at index 0 and has 3 stored.
  log.confirm(0, 3);
  EXPECT_EQ(log.confirmed(), 3u);
  EXPECT_EQ(log.pending().size(), 2u);
  EXPECT_EQ(log.bytes(), 20u);
  log.confirm(0, 2);  // an older confirmation changes nothing
  EXPECT_EQ(log.confirmed(), 3u);
  // A second connection begins at index 3 (the two unconfirmed ones are sent again first).
  log.append(msg(10));
  log.confirm(3, 2);
  EXPECT_EQ(log.confirmed(), 5u);
  EXPECT_EQ(log.next(), 6u);
  log.confirm(3, 99);  // never beyond what was kept
  EXPECT_EQ(log.confirmed(), 6u);
  EXPECT_TRUE(log.pending().empty());
}

TEST(ReplayLog, NumbersFollowWhatTheReceiverSaidTheFirstOneGot) {
  ReplayLog log;
  EXPECT_FALSE(log.first_unconfirmed_number());
  for (int i = 0; i < 4; ++i) log.append(msg(1));
  log.learn_base(0, 100);  // the receiver's directory stood at 100: index 0 is message 100
  log.confirm(0, 1);
  EXPECT_EQ(*log.first_unconfirmed_number(), 101u);
  // The device went elsewhere and comes back with its next message numbered 250.
  log.confirm(0, 4);
  log.set_base(250 - log.next());
  EXPECT_EQ(*log.first_unconfirmed_number(), 250u);
  log.forget_base();
  EXPECT_FALSE(log.first_unconfirmed_number());
}

// A send that gave up before its message's first fragment went (PlatformSender::send with a deadline)
// takes it back: the next message gets its index, and its bytes no longer count against the limit.
TEST(ReplayLog, TheNewestMessageCanBeTakenBack) {
  ReplayLog log;
  log.append(msg(3));
  EXPECT_EQ(log.append(msg(5)), 1u);
  log.drop_newest();
  EXPECT_EQ(log.bytes(), 3u);
  EXPECT_EQ(log.next(), 1u);
  EXPECT_EQ(log.append(msg(7)), 1u);
  EXPECT_EQ(log.bytes(), 10u);
}

}  // namespace
}  // namespace slotstream::platform
