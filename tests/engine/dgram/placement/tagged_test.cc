#include "engine/dgram/placement/tagged.h"

#include <gtest/gtest.h>

#include <vector>

namespace slotstream::dgram {
namespace {

std::vector<std::byte> bytes(size_t n, int v) { return std::vector<std::byte>(n, std::byte(v)); }
constexpr int64_t kTimeout = 100;

TEST(WriteRecord, OutOfOrderSegmentsComplete) {
  TaggedTarget t(kTimeout);
  t.add_region(7, 1000);
  std::vector<Completion> out;
  EXPECT_EQ(t.write_record(7, 0, 200, bytes(100, 3), true, 0, &out), Placed::kPlaced);
  EXPECT_EQ(t.write_record(7, 0, 100, bytes(100, 2), false, 1, &out), Placed::kPlaced);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(t.outstanding(), 1u);
  EXPECT_EQ(t.write_record(7, 0, 0, bytes(100, 1), false, 2, &out), Placed::kCompleted);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].outcome, Outcome::kComplete);
  EXPECT_EQ(out[0].key, 7u);
  EXPECT_EQ(out[0].length, 300u);
  EXPECT_EQ(out[0].data[150], std::byte{2});
  EXPECT_EQ(t.outstanding(), 0u);
  // A late duplicate of a finished message is stale, and does not start a new one.
  EXPECT_EQ(t.write_record(7, 0, 0, bytes(100, 1), false, 3, &out), Placed::kStale);
  EXPECT_EQ(t.outstanding(), 0u);
}

TEST(WriteRecord, NewerMsnRetiresTheOlderMessage) {
  TaggedTarget t(kTimeout);
  t.add_region(1, 1000);
  std::vector<Completion> out;
  t.write_record(1, 4, 0, bytes(10, 1), false, 0, &out);  // message 4's last segment is lost
  EXPECT_EQ(t.write_record(1, 8, 0, bytes(10, 2), false, 5, &out), Placed::kPlaced);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].msn, 4u);
  EXPECT_EQ(out[0].outcome, Outcome::kRetired);
  EXPECT_EQ(out[0].valid.bytes(), 10u);
  // Segments of the retired message (or older) arriving now are stale.
  EXPECT_EQ(t.write_record(1, 4, 10, bytes(10, 1), true, 6, &out), Placed::kStale);
  EXPECT_EQ(t.write_record(1, 3, 0, bytes(10, 1), true, 6, &out), Placed::kStale);
  EXPECT_EQ(out.size(), 1u);
}

TEST(WriteRecord, TimerStartsAtTheFirstSegment) {
  TaggedTarget t(kTimeout);
  t.add_region(1, 1000);
  t.add_region(2, 1000);
  std::vector<Completion> out;
  t.write_record(1, 0, 0, bytes(10, 1), false, 1000, &out);
  t.write_record(2, 0, 0, bytes(10, 1), false, 1050, &out);
  EXPECT_EQ(t.next_deadline(), 1100);
  t.write_record(1, 0, 20, bytes(10, 1), false, 1090, &out);  // more segments do not restart it
  t.expire(1099, &out);
  EXPECT_TRUE(out.empty());
  t.expire(1100, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].outcome, Outcome::kIncomplete);
  EXPECT_EQ(out[0].valid.ranges().size(), 2u);
  EXPECT_FALSE(out[0].length_known);
  EXPECT_EQ(t.next_deadline(), 1150);
  EXPECT_EQ(t.write_record(1, 0, 10, bytes(10, 1), true, 1101, &out), Placed::kStale);
}

TEST(WriteRecord, UnknownStagAndOutOfRegion) {
  TaggedTarget t(kTimeout);
  t.add_region(1, 64);
  std::vector<Completion> out;
  EXPECT_EQ(t.write_record(2, 0, 0, bytes(8, 1), true, 0, &out), Placed::kUnknownKey);
  EXPECT_EQ(t.write_record(1, 0, 60, bytes(8, 1), true, 0, &out), Placed::kOutOfBounds);
  EXPECT_TRUE(out.empty());
}

TEST(RdmaWrite, NotificationHandsOverTheRegion) {
  TaggedTarget t(kTimeout);
  t.add_region(3, 100);
  EXPECT_EQ(t.write(3, 0, bytes(50, 1), 0), Placed::kPlaced);
  EXPECT_EQ(t.write(3, 50, bytes(20, 2), 0), Placed::kPlaced);
  EXPECT_EQ(t.next_deadline(), kTimeout);  // a Write whose notification never comes expires too
  auto c = t.take_written(3, 17, 70, 5);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->msn, 17u);
  EXPECT_EQ(c->data.size(), 70u);
  EXPECT_EQ(c->data[69], std::byte{2});
  // A notification claiming bytes that were never written is refused.
  t.write(3, 0, bytes(10, 1), 6);
  EXPECT_FALSE(t.take_written(3, 18, 20, 7));
  EXPECT_TRUE(t.take_written(3, 19, 0, 8));  // an empty message
}

TEST(RdmaWrite, ReliableTimersMeasureSilenceAndWaitOutBackPressure) {
  TaggedTarget t(kTimeout, /*idle=*/true);
  t.add_regions(10, 4, 100);
  EXPECT_EQ(t.touched(), 0u);  // declaring STags allocates nothing
  t.write(11, 0, bytes(10, 1), 0);
  EXPECT_EQ(t.touched(), 1u);
  t.write(11, 10, bytes(10, 1), 90);
  EXPECT_EQ(t.next_deadline(), 90 + kTimeout);  // every new byte restarts it
  t.write(11, 10, bytes(10, 1), 150);           // a duplicate does not
  EXPECT_EQ(t.next_deadline(), 90 + kTimeout);
  t.extend_all(500);  // the receiver held the sender back until now
  std::vector<Completion> out;
  t.expire(499, &out);
  EXPECT_TRUE(out.empty());
  t.expire(500, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].outcome, Outcome::kIncomplete);
  EXPECT_EQ(t.write(14, 0, bytes(1, 1), 0), Placed::kUnknownKey);  // past the declared range
}

TEST(WriteRecord, ADuplicateWithOtherBytesDoesNotOverwrite) {
  TaggedTarget t(kTimeout);
  t.add_region(1, 100);
  std::vector<Completion> out;
  EXPECT_EQ(t.write_record(1, 0, 0, bytes(10, 1), false, 0, &out), Placed::kPlaced);
  EXPECT_EQ(t.write_record(1, 0, 0, bytes(10, 9), false, 1, &out), Placed::kConflict);  // forged or damaged
  EXPECT_EQ(t.write_record(1, 0, 0, bytes(10, 1), false, 1, &out), Placed::kDuplicate);
  // Overlapping: only the new bytes are taken, the first writer's stay.
  EXPECT_EQ(t.write_record(1, 0, 5, bytes(10, 7), true, 2, &out), Placed::kCompleted);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data[9], std::byte{1});
  EXPECT_EQ(out[0].data[10], std::byte{7});
  EXPECT_EQ(out[0].length, 15u);
}

}  // namespace
}  // namespace slotstream::dgram
