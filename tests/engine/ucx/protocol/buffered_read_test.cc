// The pure logic of buffered_read: ring arithmetic (entry sizes, capacity, where a span lies) and
// out-of-order frees. The protocol itself runs over real UCX in tests/engine/ucx/protocol.
#include "engine/ucx/protocol/buffered_read.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "wire/block_header.h"

namespace slotstream::protocol {
namespace {

using Piece = RingLayout::Piece;

TEST(RingLayout, EntryIsAnEightBytePrefixAndTheRecordPaddedToEight) {
  EXPECT_EQ(RingLayout::entry_size(0), 8u);
  EXPECT_EQ(RingLayout::entry_size(1), 16u);
  EXPECT_EQ(RingLayout::entry_size(wire::kBlockHeaderSize), 24u);  // a header-only record (an empty message)
  EXPECT_EQ(RingLayout::entry_size(17), 32u);
  EXPECT_EQ(RingLayout::entry_size(4096), 4104u);
}

TEST(RingLayout, CapacityHoldsOneFullBlockEntryPerBlockAndIsAMultipleOfEight) {
  for (uint32_t bs : {64u, 65u, 1000u, 4096u, 1u << 20}) {
    for (uint32_t n : {1u, 3u, 32u}) {
      const uint64_t c = RingLayout::capacity({n, bs});
      EXPECT_EQ(c % 8, 0u);
      EXPECT_EQ(c, n * RingLayout::entry_size(bs)) << n << " x " << bs;
      EXPECT_GE(c, RingLayout::entry_size(bs));  // the largest record always fits
    }
  }
}

TEST(RingLayout, LayoutOffsetsArePinned) {
  // The wire format (buffered_read.h): tail, head on its own cache line, data.
  EXPECT_EQ(RingLayout::kTailOffset, 0u);
  EXPECT_EQ(RingLayout::kWaitOffset, 8u);
  EXPECT_EQ(RingLayout::kHeadOffset, 64u);
  EXPECT_EQ(RingLayout::kDataOffset, 128u);
  EXPECT_EQ(RingLayout::kPrefix, 8u);
  EXPECT_EQ(RingLayout::kRingVersion, 1);
}

TEST(RingLayout, SplitKeepsASpanWholeUntilItPassesTheEnd) {
  Piece p[2];
  EXPECT_EQ(RingLayout::split(100, 0, 0, p), 0);
  ASSERT_EQ(RingLayout::split(100, 10, 90, p), 1);
  EXPECT_EQ(p[0].offset, 10u);
  EXPECT_EQ(p[0].length, 90u);
  ASSERT_EQ(RingLayout::split(100, 250, 30, p), 1);  // positions never wrap; offsets do
  EXPECT_EQ(p[0].offset, 50u);
  ASSERT_EQ(RingLayout::split(100, 0, 100, p), 1);  // exactly the whole ring
  EXPECT_EQ(p[0].length, 100u);
}

TEST(RingLayout, SplitAtTheWrapGivesTheRestFromOffsetZero) {
  Piece p[2];
  ASSERT_EQ(RingLayout::split(100, 190, 25, p), 2);
  EXPECT_EQ(p[0].offset, 90u);
  EXPECT_EQ(p[0].length, 10u);
  EXPECT_EQ(p[1].offset, 0u);
  EXPECT_EQ(p[1].length, 15u);
  ASSERT_EQ(RingLayout::split(100, 99, 100, p), 2);  // a whole ring starting at the last byte
  EXPECT_EQ(p[0].length, 1u);
  EXPECT_EQ(p[1].length, 99u);
}

TEST(RingLayout, SplitCoversEveryByteOnceForRandomSpans) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t cap = 8 * (1 + rng() % 64);
    const uint64_t pos = rng() % (1u << 20);
    const uint64_t len = rng() % (cap + 1);
    Piece p[2];
    const int n = RingLayout::split(cap, pos, len, p);
    std::vector<int> hits(cap, 0);
    uint64_t total = 0;
    for (int k = 0; k < n; ++k) {
      ASSERT_LE(p[k].offset + p[k].length, cap);
      for (uint64_t b = 0; b < p[k].length; ++b) ++hits[p[k].offset + b];
      total += p[k].length;
    }
    ASSERT_EQ(total, len);
    for (uint64_t b = 0; b < len; ++b) ASSERT_EQ(hits[(pos + b) % cap], 1);  // position by position
  }
}

TEST(ReleaseTracker, InOrderFreesMoveTheHeadOverEachEntry) {
  ReleaseTracker t;
  EXPECT_EQ(t.push(24, 16), 0u);
  EXPECT_EQ(t.push(40, 30), 1u);
  EXPECT_EQ(t.end(), 64u);
  EXPECT_EQ(t.head(), 0u);
  EXPECT_EQ(t.entry(1).pos, 24u);
  EXPECT_EQ(t.entry(1).length, 30u);
  EXPECT_TRUE(t.release(0));
  EXPECT_EQ(t.head(), 24u);
  EXPECT_TRUE(t.release(1));
  EXPECT_EQ(t.head(), 64u);
  EXPECT_EQ(t.outstanding(), 0u);
  EXPECT_EQ(t.first_id(), 2u);
}

TEST(ReleaseTracker, AnOutOfOrderFreeWaitsForTheEntriesBeforeIt) {
  ReleaseTracker t;
  for (int i = 0; i < 4; ++i) t.push(16, 8);
  EXPECT_TRUE(t.release(2));
  EXPECT_TRUE(t.release(1));
  EXPECT_EQ(t.head(), 0u) << "entry 0 is still in use: nothing before it is free";
  EXPECT_EQ(t.outstanding(), 4u);
  EXPECT_TRUE(t.entry(1).released);
  EXPECT_TRUE(t.release(0));
  EXPECT_EQ(t.head(), 48u) << "0, 1 and 2 go at once";
  EXPECT_EQ(t.outstanding(), 1u);
  EXPECT_EQ(t.first_id(), 3u);
}

TEST(ReleaseTracker, UnknownAndRepeatedFreesChangeNothing) {
  ReleaseTracker t;
  t.push(16, 8);
  t.push(16, 8);
  EXPECT_FALSE(t.release(5));  // never pushed
  EXPECT_TRUE(t.release(1));
  EXPECT_FALSE(t.release(1));  // already freed, waiting behind 0
  EXPECT_TRUE(t.release(0));
  EXPECT_FALSE(t.release(0));  // already passed by the head
  EXPECT_EQ(t.head(), 32u);
}

TEST(ReleaseTracker, RandomFreeOrderEndsWithEverythingFreeAndTheHeadNeverPassesABusyEntry) {
  std::mt19937 rng(11);
  ReleaseTracker t;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 500; ++i) ids.push_back(t.push(8 * (1 + rng() % 10), 4));
  const uint64_t end = t.end();
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<bool> freed(ids.size(), false);
  for (uint64_t id : ids) {
    ASSERT_TRUE(t.release(id));
    freed[id] = true;
    // The head lies exactly after the longest freed prefix.
    uint64_t prefix = 0;
    while (prefix < freed.size() && freed[prefix]) ++prefix;
    if (prefix < freed.size()) {
      ASSERT_EQ(t.first_id(), prefix);
      ASSERT_EQ(t.head(), t.entry(prefix).pos);
    }
  }
  EXPECT_EQ(t.head(), end);
  EXPECT_EQ(t.outstanding(), 0u);
}

}  // namespace
}  // namespace slotstream::protocol
