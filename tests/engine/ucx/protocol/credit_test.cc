#include "engine/ucx/protocol/credit.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <limits>

namespace slotstream::protocol {
namespace {

constexpr uint64_t kNearWrap = std::numeric_limits<uint64_t>::max() - 5;

TEST(CreditAccount, OneCreditPerMessageUntilNoneAreLeft) {
  CreditAccount a(4);
  EXPECT_EQ(a.available(), 4u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(a.can_send());
    a.spend();
  }
  EXPECT_FALSE(a.can_send());
  EXPECT_EQ(a.available(), 0u);
}

TEST(CreditAccount, AnUpdateReturnsWhatWasReleasedSinceTheLastOne) {
  CreditAccount a(4);
  for (int i = 0; i < 4; ++i) a.spend();
  EXPECT_EQ(a.on_ack(2), 2u);  // a batch of two (half of four)
  EXPECT_EQ(a.available(), 2u);
  EXPECT_EQ(a.on_ack(4), 2u);
  EXPECT_EQ(a.available(), 4u);
}

TEST(CreditAccount, StaleDuplicateAndImpossibleUpdatesAreIgnored) {
  CreditAccount a(4);
  for (int i = 0; i < 3; ++i) a.spend();
  EXPECT_EQ(a.on_ack(2), 2u);
  // Expect: a duplicate, an older update and one claiming more than was sent change nothing.
  EXPECT_EQ(a.on_ack(2), 0u);
  EXPECT_EQ(a.on_ack(1), 0u);
  EXPECT_EQ(a.on_ack(4), 0u);
  EXPECT_EQ(a.released(), 2u);
  EXPECT_EQ(a.available(), 3u);
}

TEST(CreditAccount, CountersWrapAround) {
  CreditAccount a(4, kNearWrap);
  for (int round = 0; round < 10; ++round) {  // 40 messages: the counters pass 2^64
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(a.can_send()) << round;
      a.spend();
    }
    ASSERT_FALSE(a.can_send());
    ASSERT_EQ(a.on_ack(a.released() + 2), 2u) << round;
    ASSERT_EQ(a.on_ack(a.released() - 1), 0u) << "an older update after the wrap";
    ASSERT_EQ(a.on_ack(a.sent()), 2u) << round;
  }
  EXPECT_EQ(a.sent(), kNearWrap + 40);  // modular
  EXPECT_LT(a.sent(), kNearWrap);
}

TEST(AckBatcher, AnUpdateAfterHalfTheCredits) {
  AckBatcher b(8);
  EXPECT_EQ(b.batch(), 4u);
  int updates = 0;
  for (int i = 1; i <= 20; ++i) {
    if (b.on_release()) {
      ++updates;
      EXPECT_EQ(b.released() % 4, 0u) << "an update exactly every fourth release";
      b.acked();
    }
  }
  EXPECT_EQ(updates, 5);
}

TEST(AckBatcher, OddAndSingleCredit) {
  EXPECT_EQ(AckBatcher(5).batch(), 2u);
  AckBatcher one(1);
  EXPECT_EQ(one.batch(), 1u);  // one credit: every release must return it
  EXPECT_TRUE(one.on_release());
}

TEST(AckBatcher, AnUnsentUpdateIsDueAgainAndCarriesEverything) {
  AckBatcher b(4, kNearWrap);
  EXPECT_FALSE(b.on_release());
  EXPECT_TRUE(b.on_release());
  // Its send failed (acked() not called): the next release is due again, with all three.
  EXPECT_TRUE(b.on_release());
  EXPECT_EQ(b.released(), kNearWrap + 3);
  b.acked();
  EXPECT_FALSE(b.on_release());
}

TEST(AckBatcher, DrivesACreditAccountThroughTheWrap) {
  const uint32_t n = 6;
  CreditAccount sender(n, kNearWrap);
  AckBatcher receiver(n, kNearWrap);
  uint64_t sent = 0;
  for (int step = 0; step < 100; ++step) {
    while (sender.can_send()) {
      sender.spend();
      ++sent;
    }
    // The receiver releases everything in flight; its updates give every credit back.
    for (uint32_t k = 0; k < n; ++k) {
      if (receiver.on_release()) {
        sender.on_ack(receiver.released());
        receiver.acked();
      }
    }
    ASSERT_EQ(sender.available(), n) << step;
  }
  EXPECT_EQ(sent, 600u);
}

TEST(CreditUpdate, LayoutIsPinned) {
  CreditUpdate u{0x0102030405060708ull, 0x1112131415161718ull};
  std::byte raw[sizeof u];
  std::memcpy(raw, &u, sizeof u);
  EXPECT_EQ(sizeof u, 16u);
  EXPECT_EQ(offsetof(CreditUpdate, released), 0u);
  EXPECT_EQ(offsetof(CreditUpdate, generated_ns), 8u);
  EXPECT_EQ(raw[0], std::byte{0x08});  // little-endian
  EXPECT_EQ(raw[7], std::byte{0x01});
  EXPECT_EQ(raw[8], std::byte{0x18});
}

}  // namespace
}  // namespace slotstream::protocol
