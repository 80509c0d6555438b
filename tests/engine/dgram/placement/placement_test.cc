#include "engine/dgram/placement/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace slotstream::dgram {
namespace {

using R = RangeSet::Range;

TEST(RangeSet, MergesInAnyOrder) {
  RangeSet s;
  EXPECT_EQ(s.add(100, 50), 50u);
  EXPECT_EQ(s.add(0, 10), 10u);
  EXPECT_EQ(s.add(10, 90), 90u);  // touches both neighbours: one range
  EXPECT_EQ(s.ranges(), (std::vector<R>{{0, 150}}));
  EXPECT_TRUE(s.covers(150));
  EXPECT_FALSE(s.covers(151));
  EXPECT_EQ(s.bytes(), 150u);
}

TEST(RangeSet, CountsOnlyNewBytes) {
  RangeSet s;
  s.add(0, 10);
  s.add(20, 10);
  EXPECT_EQ(s.add(5, 20), 10u);  // 10..20 is new; 5..10 and 20..25 were there
  EXPECT_EQ(s.ranges(), (std::vector<R>{{0, 30}}));
  EXPECT_EQ(s.add(0, 30), 0u);  // a duplicate
  EXPECT_EQ(s.add(3, 0), 0u);
  EXPECT_EQ(s.bytes(), 30u);
}

TEST(RangeSet, WalksWhatIsMissingAndWhatIsThere) {
  RangeSet s;
  s.add(10, 10);
  s.add(30, 10);
  std::vector<R> missing, present;
  s.for_each_missing(5, 40, [&](uint64_t o, uint64_t n) { missing.push_back({o, n}); });
  s.for_each_present(5, 40, [&](uint64_t o, uint64_t n) { present.push_back({o, n}); });
  EXPECT_EQ(missing, (std::vector<R>{{5, 5}, {20, 10}, {40, 5}}));
  EXPECT_EQ(present, (std::vector<R>{{10, 10}, {30, 10}}));
  missing.clear();
  s.for_each_missing(12, 5, [&](uint64_t o, uint64_t n) { missing.push_back({o, n}); });
  EXPECT_TRUE(missing.empty());
}

TEST(Assembly, TheFirstWriterWins) {
  Assembly a(0, 0, 100);
  std::vector<std::byte> first(8, std::byte{1}), forged(8, std::byte{9});
  EXPECT_EQ(a.place(0, first, false, 64), Placed::kPlaced);
  EXPECT_EQ(a.place(0, forged, false, 64), Placed::kConflict);
  EXPECT_EQ(a.place(0, first, false, 64), Placed::kDuplicate);
  EXPECT_EQ(a.place(4, forged, true, 64), Placed::kPlaced);  // 8..12 is new, 4..8 stays
  Completion c = a.finish(0, Outcome::kComplete, 1);
  EXPECT_EQ(c.length, 12u);
  EXPECT_EQ(c.data[7], std::byte{1});
  EXPECT_EQ(c.data[8], std::byte{9});
}

TEST(RangeSet, KeepsHoles) {
  RangeSet s;
  s.add(0, 8);
  s.add(16, 8);
  s.add(40, 8);
  EXPECT_EQ(s.ranges(), (std::vector<R>{{0, 8}, {16, 8}, {40, 8}}));
  EXPECT_FALSE(s.covers(24));
  EXPECT_EQ(s.end(), 48u);
  EXPECT_EQ(s.add(10, 4), 4u);  // inside a hole, touching neither side
  EXPECT_EQ(s.ranges(), (std::vector<R>{{0, 8}, {10, 4}, {16, 8}, {40, 8}}));
}

TEST(RangeSet, RandomOrderEqualsABitmap) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<bool> bits(500);
    RangeSet s;
    for (int i = 0; i < 40; ++i) {
      uint64_t off = rng() % 480, len = rng() % 20;
      uint64_t fresh = 0;
      for (uint64_t b = off; b < off + len; ++b) fresh += !bits[b], bits[b] = true;
      EXPECT_EQ(s.add(off, len), fresh);
    }
    std::vector<bool> back(500);
    for (const auto& r : s.ranges()) {
      for (uint64_t b = r.offset; b < r.end(); ++b) back[b] = true;
    }
    EXPECT_EQ(back, bits);
    for (size_t i = 1; i < s.ranges().size(); ++i) EXPECT_LT(s.ranges()[i - 1].end(), s.ranges()[i].offset);
  }
}

std::vector<std::byte> bytes(size_t n, int v) { return std::vector<std::byte>(n, std::byte(v)); }

TEST(Assembly, CompletesOnlyWithTheLastSegmentAndNoHoles) {
  Assembly a(5, 100, 1000);
  EXPECT_EQ(a.place(8, bytes(8, 2), /*last=*/true, 64), Placed::kPlaced);
  EXPECT_FALSE(a.complete());  // 0..8 missing
  EXPECT_EQ(a.place(0, bytes(8, 1), false, 64), Placed::kPlaced);
  EXPECT_TRUE(a.complete());
  Completion c = a.finish(42, Outcome::kComplete, 200);
  EXPECT_EQ(c.key, 42u);
  EXPECT_EQ(c.msn, 5u);
  EXPECT_TRUE(c.length_known);
  EXPECT_EQ(c.length, 16u);
  ASSERT_EQ(c.data.size(), 16u);
  EXPECT_EQ(c.data[0], std::byte{1});
  EXPECT_EQ(c.data[15], std::byte{2});
  EXPECT_EQ(c.first_ns, 100);
  EXPECT_EQ(c.done_ns, 200);
}

TEST(Assembly, PartialHasZeroHolesAndItsHighestValidEnd) {
  Assembly a(0, 0, 10);
  a.place(0, bytes(4, 9), false, 64);
  a.place(12, bytes(4, 9), false, 64);  // the last segment (ending at 24) never came
  Completion c = a.finish(1, Outcome::kIncomplete, 10);
  EXPECT_FALSE(c.length_known);
  EXPECT_EQ(c.length, 16u);
  EXPECT_EQ(c.valid.ranges(), (std::vector<R>{{0, 4}, {12, 4}}));
  EXPECT_EQ(std::vector<std::byte>(c.data.begin(), c.data.end()), (std::vector<std::byte>{std::byte{9},
                                                                                          std::byte{9},
                                                                                          std::byte{9},
                                                                                          std::byte{9},
                                                                                          {},
                                                                                          {},
                                                                                          {},
                                                                                          {},
                                                                                          {},
                                                                                          {},
                                                                                          {},
                                                                                          {},
                                                                                          std::byte{9},
                                                                                          std::byte{9},
                                                                                          std::byte{9},
                                                                                          std::byte{9}}));
}

TEST(Assembly, RefusesWhatCannotBelong) {
  Assembly a(0, 0, 10);
  EXPECT_EQ(a.place(60, bytes(8, 1), false, 64), Placed::kOutOfBounds);         // past the region
  EXPECT_EQ(a.place(~0ull - 2, bytes(8, 1), false, 64), Placed::kOutOfBounds);  // wraps
  EXPECT_EQ(a.place(16, bytes(8, 1), true, 64), Placed::kPlaced);               // length 24
  EXPECT_EQ(a.place(24, bytes(8, 1), false, 64), Placed::kOutOfBounds);         // past the known end
  EXPECT_EQ(a.place(0, bytes(8, 1), true, 64), Placed::kOutOfBounds);           // a second, different end
  EXPECT_EQ(a.place(16, bytes(8, 1), true, 64), Placed::kDuplicate);            // the same last segment again
  Assembly b(0, 0, 10);
  b.place(0, bytes(32, 1), false, 64);
  EXPECT_EQ(b.place(8, bytes(8, 1), true, 64), Placed::kOutOfBounds);  // ends before bytes already there
}

TEST(Assembly, EmptyMessage) {
  Assembly a(3, 0, 10);
  EXPECT_EQ(a.place(0, {}, true, 64), Placed::kPlaced);
  EXPECT_TRUE(a.complete());
  EXPECT_EQ(a.finish(0, Outcome::kComplete, 1).length, 0u);
}

}  // namespace
}  // namespace slotstream::dgram
