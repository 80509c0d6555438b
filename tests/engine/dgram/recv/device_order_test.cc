#include "engine/dgram/recv/device_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace slotstream::dgram {
namespace {

using Kind = DeviceOrder::Kind;
constexpr int64_t kT = 100;

Completion done(uint32_t msn, Outcome o = Outcome::kComplete) {
  Completion c;
  c.msn = msn;
  c.outcome = o;
  return c;
}

std::vector<std::pair<uint32_t, Kind>> poll(DeviceOrder& d, int64_t now) {
  std::vector<DeviceOrder::Release> out;
  d.poll(now, &out);
  std::vector<std::pair<uint32_t, Kind>> r;
  for (auto& x : out) {
    for (uint64_t i = 0; i < x.count; ++i) r.emplace_back(uint32_t(x.msn + i), x.kind);
  }
  return r;
}

TEST(DeviceOrder, ReleasesInOrder) {
  DeviceOrder d(kT);
  d.seen(0, 0);
  d.seen(1, 0);
  d.finished(done(1), 1);
  EXPECT_TRUE(poll(d, 2).empty());  // 0 still being placed
  d.finished(done(0, Outcome::kIncomplete), 3);
  EXPECT_EQ(poll(d, 3), (std::vector<std::pair<uint32_t, Kind>>{{0, Kind::kIncomplete}, {1, Kind::kComplete}}));
  EXPECT_EQ(d.next(), 2u);
}

TEST(DeviceOrder, AMessageNothingArrivedOfIsLostAfterTheTimeout) {
  DeviceOrder d(kT);
  d.finished(done(0), 0);   // one-segment messages finish when first seen
  d.finished(done(2), 10);  // 1 never arrives
  EXPECT_EQ(poll(d, 10), (std::vector<std::pair<uint32_t, Kind>>{{0, Kind::kComplete}}));
  EXPECT_EQ(d.next_deadline(), 110);
  EXPECT_TRUE(poll(d, 109).empty());
  EXPECT_EQ(poll(d, 110), (std::vector<std::pair<uint32_t, Kind>>{{1, Kind::kLost}, {2, Kind::kComplete}}));
}

TEST(DeviceOrder, ALateArrivalFillsItsGap) {
  DeviceOrder d(kT);
  d.finished(done(3), 0);  // 0, 1, 2 unseen
  d.seen(1, 50);           // 1 turns up (its own timer now runs)
  EXPECT_EQ(poll(d, 100), (std::vector<std::pair<uint32_t, Kind>>{{0, Kind::kLost}}));
  d.finished(done(1), 120);
  EXPECT_EQ(poll(d, 120),
            (std::vector<std::pair<uint32_t, Kind>>{{1, Kind::kComplete}, {2, Kind::kLost}, {3, Kind::kComplete}}));
}

TEST(DeviceOrder, FinAccountsForTrailingLosses) {
  DeviceOrder d(kT);
  d.finished(done(0), 0);
  poll(d, 0);
  d.fin(3, 500);  // 1 and 2 were sent, nothing of them came
  EXPECT_FALSE(d.all_released());
  EXPECT_TRUE(poll(d, 599).empty());
  EXPECT_EQ(poll(d, 600), (std::vector<std::pair<uint32_t, Kind>>{{1, Kind::kLost}, {2, Kind::kLost}}));
  EXPECT_TRUE(d.all_released());
}

// A gap behind a head still being placed is not a deadline: its passing changes nothing until the
// head's own timer fires, and a receiver waking for it would spin until then.
TEST(DeviceOrder, AGapBehindAnActiveHeadIsNoDeadline) {
  DeviceOrder d(kT);
  d.seen(2, 0);  // 0 and 1 unseen: a gap since 0
  EXPECT_EQ(d.next_deadline(), kT);
  d.seen(0, 50);  // the head turns up and is being placed
  EXPECT_EQ(d.next_deadline(), INT64_MAX);
  EXPECT_TRUE(poll(d, 500).empty());
  d.finished(done(0, Outcome::kIncomplete), 150);
  EXPECT_EQ(poll(d, 150), (std::vector<std::pair<uint32_t, Kind>>{{0, Kind::kIncomplete}, {1, Kind::kLost}}));
  EXPECT_EQ(d.next_deadline(), INT64_MAX);  // 2 is active
}

TEST(DeviceOrder, ChecksStaleAndFarAhead) {
  DeviceOrder d(kT);
  d.finished(done(0), 0);
  poll(d, 0);
  EXPECT_EQ(d.check(0), DeviceOrder::Check::kReleased);
  EXPECT_EQ(d.check(1), DeviceOrder::Check::kOk);
  EXPECT_EQ(d.check(1 + DeviceOrder::kMaxAhead + 1), DeviceOrder::Check::kTooFarAhead);
}

TEST(DeviceOrder, EveryMessageExactlyOnce) {
  // 200 messages, every third lost, every fifth incomplete, finishing in scrambled order.
  DeviceOrder d(kT);
  int64_t now = 0;
  std::vector<uint32_t> order;
  for (uint32_t m = 0; m < 200; ++m) order.push_back((m * 37) % 200);
  for (uint32_t m : order) {
    now += 1;
    if (m % 3 == 0) continue;
    d.finished(done(m, m % 5 == 0 ? Outcome::kIncomplete : Outcome::kComplete), now);
  }
  d.fin(200, now);
  std::vector<std::pair<uint32_t, Kind>> all;
  for (int64_t t = now; !d.all_released() && t < now + 10 * kT; t += 10) {
    auto r = poll(d, t);
    all.insert(all.end(), r.begin(), r.end());
  }
  ASSERT_EQ(all.size(), 200u);
  for (uint32_t m = 0; m < 200; ++m) {
    EXPECT_EQ(all[m].first, m);
    EXPECT_EQ(all[m].second, m % 3 == 0 ? Kind::kLost : m % 5 == 0 ? Kind::kIncomplete : Kind::kComplete) << m;
  }
}

}  // namespace
}  // namespace slotstream::dgram
