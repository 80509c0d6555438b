#include "engine/ucx/stream/fragment.h"

#include <gtest/gtest.h>

namespace slotstream::stream {
namespace {

TEST(Fragment, CountsPackets) {
  EXPECT_EQ(fragment_count(0, 100), 1u);  // an empty message still takes one packet
  EXPECT_EQ(fragment_count(1, 100), 1u);
  EXPECT_EQ(fragment_count(100, 100), 1u);
  EXPECT_EQ(fragment_count(101, 100), 2u);
  EXPECT_EQ(fragment_count(1000, 100), 10u);
}

TEST(Fragment, CoversTheMessageExactlyOnceWithFlags) {
  for (uint64_t len : {0ull, 1ull, 99ull, 100ull, 101ull, 12345ull}) {
    uint64_t n = fragment_count(len, 100), covered = 0;
    for (uint64_t i = 0; i < n; ++i) {
      Fragment f = fragment_at(len, 100, i);
      EXPECT_EQ(f.offset, covered);
      covered += f.length;
      EXPECT_EQ(bool(f.flags & wire::kFirstFragment), i == 0);
      EXPECT_EQ(bool(f.flags & wire::kLastFragment), i + 1 == n);
    }
    EXPECT_EQ(covered, len);
  }
}

}  // namespace
}  // namespace slotstream::stream
