// Which connections the receiver serves: unauthenticated ones take turns in a small budget of
// their own, so they can never lock out a sender that authenticates.
#include "engine/ucx/session/admission.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace slotstream::session {
namespace {

TEST(Admission, HalfOpenConnectionsBeyondTheBudgetEvictTheOldestAndASenderThatAuthenticatesGetsIn) {
  Admission a;
  uint64_t id = 0;
  // 2,000 half-open connections from many addresses, reopened as they are closed.
  for (; id < 2000; ++id) {
    const auto victim = a.arrive(id, "10.0." + std::to_string(id % 200) + ".1");
    if (id < kMaxUnauthenticated) {
      EXPECT_FALSE(victim) << id;
    } else {
      ASSERT_TRUE(victim) << id;
      EXPECT_EQ(*victim, id - kMaxUnauthenticated) << "the oldest goes first";
    }
    EXPECT_LE(a.unauthenticated(), kMaxUnauthenticated);
  }
  // A real sender arrives, says HELLO (the flood never does) and authenticates while the flood goes on.
  const uint64_t real = id++;
  ASSERT_TRUE(a.arrive(real, "192.168.1.7"));
  a.spoke(real);
  for (int i = 0; i < 500; ++i, ++id) {
    const auto victim = a.arrive(id, "10.0." + std::to_string(id % 200) + ".1");
    ASSERT_TRUE(victim);
    EXPECT_NE(*victim, real) << "a connection that said HELLO outlives those that did not";
  }
  EXPECT_EQ(a.authenticate(real), std::nullopt);
  EXPECT_EQ(a.authenticated(), 1u);
}

TEST(Admission, UnderPressureTheAddressWithTheMostConnectionsPays) {
  Admission a;
  uint64_t id = 0;
  // Alone, one address may use the whole budget (a site behind one NAT address).
  for (; id < kMaxUnauthenticated; ++id) EXPECT_FALSE(a.arrive(id, "10.0.0.9")) << id;
  // Beyond it, every newcomer — from that address or any other — costs the flooding address its oldest.
  for (uint64_t i = 0; i < 100; ++i, ++id) {
    const auto victim = a.arrive(id, i % 2 ? "10.0.0.9" : "10.0.1." + std::to_string(i));
    ASSERT_TRUE(victim);
    EXPECT_LT(*victim, kMaxUnauthenticated + i) << "never one of the other addresses' connections";
  }
  // A connection of another address survives as long as the flooding address has more.
  const uint64_t other = id++;
  a.arrive(other, "192.168.1.7");
  for (int i = 0; i < 500; ++i, ++id) {
    const auto victim = a.arrive(id, "10.0.0.9");
    ASSERT_TRUE(victim);
    EXPECT_NE(*victim, other);
  }
}

TEST(Admission, AmongConnectionsThatSpokeTheOldestGoesFirst) {
  Admission a;
  for (uint64_t id = 0; id < kMaxUnauthenticated; ++id) {
    a.arrive(id, "10.0." + std::to_string(id) + ".1");
    a.spoke(id);
  }
  EXPECT_EQ(a.arrive(1000, "10.9.9.9"), std::optional<uint64_t>(0));
  EXPECT_EQ(a.arrive(1001, "10.9.9.8"), std::optional<uint64_t>(1000)) << "the newcomer has not said HELLO yet";
}

TEST(Admission, AuthenticatedConnectionsAreCappedAndFreedWhenTheyEnd) {
  Admission a;
  uint64_t id = 0;
  for (; id < kMaxAuthenticated; ++id) {
    a.arrive(id, "10.1." + std::to_string(id % 250) + "." + std::to_string(id / 250));
    ASSERT_EQ(a.authenticate(id), std::nullopt) << id;
  }
  a.arrive(id, "10.2.0.1");
  auto busy = a.authenticate(id);
  ASSERT_TRUE(busy);
  EXPECT_NE(busy->find("busy"), std::string::npos) << *busy;
  a.ended(id);
  a.ended(0);
  ++id;
  a.arrive(id, "10.2.0.1");
  EXPECT_EQ(a.authenticate(id), std::nullopt);
  EXPECT_EQ(a.unauthenticated(), 0u);
}

TEST(Admission, AnEvictedConnectionCannotAuthenticateAndItsEndChangesNothing) {
  Admission a;
  for (uint64_t id = 0; id <= kMaxUnauthenticated; ++id) a.arrive(id, "10.0.0.1");
  // Connection 0 was evicted by the last arrival.
  EXPECT_TRUE(a.authenticate(0));
  a.ended(0);
  EXPECT_EQ(a.unauthenticated(), kMaxUnauthenticated);
  EXPECT_EQ(a.authenticated(), 0u);
}

TEST(Admission, AConnectionWhoseHelloWaitsUnreadIsKeptLikeOneThatSaidIt) {
  // The receiver's thread for a real sender may not have run yet when the flood needs room: the
  // kernel already holds its HELLO (`has_spoken`), and that keeps it.
  Admission a;
  uint64_t id = 0;
  for (; id < kMaxUnauthenticated; ++id) a.arrive(id, "10.0." + std::to_string(id % 200) + ".1");
  const uint64_t real = 5;  // in the middle of the budget; never marked spoke here
  std::vector<uint64_t> asked;
  const Admission::HasSpoken spoke = [&](uint64_t v) {
    asked.push_back(v);
    return v == real;
  };
  for (int i = 0; i < 1000; ++i, ++id) {
    const auto victim = a.arrive(id, "10.0." + std::to_string(id % 200) + ".1", spoke);
    ASSERT_TRUE(victim);
    EXPECT_NE(*victim, real) << "evicted a connection whose HELLO had arrived";
  }
  EXPECT_EQ(std::count(asked.begin(), asked.end(), real), 1) << "once known to have spoken, it is not asked again";
  EXPECT_EQ(a.authenticate(real), std::nullopt);
  // Without the kernel's answer the same connection would have gone in the first turns.
  Admission b;
  for (uint64_t j = 0; j < kMaxUnauthenticated; ++j) b.arrive(j, "10.0." + std::to_string(j % 200) + ".1");
  bool gone = false;
  for (uint64_t j = kMaxUnauthenticated; j < kMaxUnauthenticated + 10; ++j) {
    gone |= b.arrive(j, "10.0." + std::to_string(j % 200) + ".1") == std::optional<uint64_t>(real);
  }
  EXPECT_TRUE(gone);
}

TEST(Admission, WhenEveryCandidateHasSpokenOneOfThemStillMakesRoom) {
  Admission a;
  for (uint64_t id = 0; id < kMaxUnauthenticated; ++id) a.arrive(id, "10.0.0." + std::to_string(id % 250));
  const auto victim = a.arrive(500, "10.9.9.9", [](uint64_t) { return true; });
  EXPECT_EQ(victim, std::optional<uint64_t>(0)) << "the oldest of those that spoke";
  EXPECT_EQ(a.unauthenticated(), kMaxUnauthenticated);
}

}  // namespace
}  // namespace slotstream::session
