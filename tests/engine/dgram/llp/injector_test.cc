#include "engine/dgram/llp/injector.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/dgram/llp/llp.h"

namespace slotstream::dgram {
namespace {

TEST(Injector, SameSeedSameFaults) {
  InjectOptions o{0.1, 0.1, 0.1, 0.1, 42};
  Injector a(o), b(o);
  for (int i = 0; i < 1000; ++i) {
    auto x = a.next(100), y = b.next(100);
    EXPECT_EQ(x.drop, y.drop);
    EXPECT_EQ(x.flip_bit, y.flip_bit);
    EXPECT_EQ(x.duplicate, y.duplicate);
    EXPECT_EQ(x.reorder, y.reorder);
  }
}

TEST(Injector, RatesAreRoughlyAsAsked) {
  Injector inj(InjectOptions{0.05, 0, 0, 0.02, 1});
  for (int i = 0; i < 100000; ++i) inj.next(1000);
  EXPECT_NEAR(double(inj.stats().dropped) / 100000, 0.05, 0.005);
  EXPECT_NEAR(double(inj.stats().corrupted) / 100000, 0.02 * 0.95, 0.004);
}

TEST(Injector, CorruptionFlipsExactlyOneBit) {
  Injector inj(InjectOptions{0, 0, 0, 1.0, 9});
  std::vector<std::byte> d(64, std::byte{0});
  auto v = inj.next(d.size());
  ASSERT_GE(v.flip_bit, 0);
  Injector::corrupt(d, v);
  int ones = 0;
  for (auto b : d) ones += std::popcount(std::to_integer<unsigned>(b));
  EXPECT_EQ(ones, 1);
}

TEST(FaultyLink, ReorderSwapsWithTheNextAndDuplicatesTwice) {
  FaultyLink reorder(InjectOptions{0, 1.0, 0, 0, 1});
  std::vector<int> seen;
  auto emit = [&](std::span<const std::byte> d, bool) { seen.push_back(std::to_integer<int>(d[0])); };
  std::byte one{1}, two{2};
  reorder.pass(std::span(&one, 1), emit);  // held
  EXPECT_TRUE(seen.empty());
  reorder.pass(std::span(&two, 1), emit);  // also asked to reorder, but one is held: goes first
  EXPECT_EQ(seen, (std::vector<int>{2, 1}));
  FaultyLink dup(InjectOptions{0, 0, 1.0, 0, 1});
  seen.clear();
  dup.pass(std::span(&one, 1), emit);
  EXPECT_EQ(seen, (std::vector<int>{1, 1}));
}

TEST(ParsePercent, AcceptsPercentOnly) {
  double f = -1;
  EXPECT_TRUE(parse_percent("0.5", &f));
  EXPECT_DOUBLE_EQ(f, 0.005);
  EXPECT_TRUE(parse_percent("5%", &f));
  EXPECT_DOUBLE_EQ(f, 0.05);
  EXPECT_TRUE(parse_percent("100", &f));
  EXPECT_FALSE(parse_percent("101", &f));
  EXPECT_FALSE(parse_percent("-1", &f));
  EXPECT_FALSE(parse_percent("x", &f));
  EXPECT_FALSE(parse_percent("", &f));
  EXPECT_FALSE(parse_percent("nan", &f));
}

}  // namespace
}  // namespace slotstream::dgram
