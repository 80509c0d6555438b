// Small public helpers (src/common.cc): sizes as people write them.
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include <gtest/gtest.h>

#include "common.h"
#include "slotstream/slotstream.h"

namespace slotstream {
namespace {

TEST(ParseSize, PlainNumbersAndBinaryUnits) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("65536"), 65536u);
  EXPECT_EQ(parse_size("12B"), 12u);
  EXPECT_EQ(parse_size("64K"), 64u << 10);
  EXPECT_EQ(parse_size("64KiB"), 64u << 10);
  EXPECT_EQ(parse_size("64kb"), 64u << 10);
  EXPECT_EQ(parse_size("2M"), 2u << 20);
  EXPECT_EQ(parse_size("4G"), uint64_t(4) << 30);
  EXPECT_EQ(parse_size("1TiB"), uint64_t(1) << 40);
}

TEST(ParseSize, RejectsWhatIsNotASize) {
  for (const char* bad :
       {"", "M", "-5M", "1.5G", "12Q", "4 G", "4GiBs", "4Gi", "18446744073709551616", "17179869184G"}) {
    EXPECT_FALSE(parse_size(bad).has_value()) << bad;
  }
}

TEST(FormatBytes, PicksTheLargestUnitBelow1024) {
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(uint64_t(256) << 30), "256.0 GiB");
}

TEST(DefaultMaxMemory, IsAQuarterOfMemoryAtMost) {
  const uint64_t budget = default_max_memory();
  EXPECT_GT(budget, 0u);
  EXPECT_LE(budget, uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)) / 4);
}

}  // namespace
}  // namespace slotstream

namespace slotstream {
namespace {

TEST(LatencyHistogram, CountsEachObservationInTheFirstBucketThatHoldsItAndMerges) {
  LatencyHistogram h;
  h.observe(0.00001);  // below the first bound
  h.observe(0.001);    // exactly on a bound: that bucket (Prometheus' le)
  h.observe(0.0011);
  h.observe(60);  // above every bound
  const auto& b = LatencyHistogram::kBounds;
  const auto at = [&](double bound) { return size_t(std::find(b.begin(), b.end(), bound) - b.begin()); };
  EXPECT_EQ(h.buckets[0], 1u);
  EXPECT_EQ(h.buckets[at(0.001)], 1u);
  EXPECT_EQ(h.buckets[at(0.0025)], 1u);
  EXPECT_EQ(h.buckets.back(), 1u);
  EXPECT_EQ(h.count, 4u);
  EXPECT_NEAR(h.sum_seconds, 60.00211, 1e-9);
  LatencyHistogram other;
  other.observe(0.001);
  h.merge(other);
  EXPECT_EQ(h.buckets[at(0.001)], 2u);
  EXPECT_EQ(h.count, 5u);
}

TEST(LatencyHistogram, CountsNObservationsOfOneValueAsNAndNoneAsNothing) {
  LatencyHistogram h;
  h.observe(0.003, 7);  // a batch of 7 messages stored with one latency
  h.observe(0.5, 0);    // an empty batch
  const auto& b = LatencyHistogram::kBounds;
  const size_t at = size_t(std::find(b.begin(), b.end(), 0.005) - b.begin());
  EXPECT_EQ(h.buckets[at], 7u);
  EXPECT_EQ(h.count, 7u);
  EXPECT_NEAR(h.sum_seconds, 0.021, 1e-12);
  EXPECT_EQ(std::accumulate(h.buckets.begin(), h.buckets.end(), uint64_t(0)), 7u) << "one bucket only";
}

TEST(SessionReportMerge, KeepsEveryLanesDevicesAndCounters) {
  // Two connections of one sender (one per device, as the sliding window uses).
  SessionReport a, b;
  a.finished = true;
  a.messages = 3;
  a.bytes = 300;
  a.stalls = 1;
  a.held_blocks = 2;
  a.seconds = 1.5;
  a.sender.devices = {0};
  a.per_device[0] = {3, 300, 1, 0};
  b.finished = false;
  b.reason = "connection closed mid-stream";
  b.messages = 5;
  b.bytes = 500;
  b.stalls = 2;
  b.held_blocks = 1;
  b.seconds = 2.5;
  b.sender.devices = {7};
  b.per_device[7] = {5, 500, 0, 2};
  a.merge(b);
  EXPECT_FALSE(a.finished);
  EXPECT_EQ(a.reason, "connection closed mid-stream");
  EXPECT_EQ(a.messages, 8u);
  EXPECT_EQ(a.bytes, 800u);
  EXPECT_EQ(a.stalls, 3u);
  EXPECT_EQ(a.held_blocks, 3u);
  EXPECT_EQ(a.seconds, 2.5);
  EXPECT_EQ(a.sender.devices, (std::vector<uint16_t>{0, 7}));
  ASSERT_EQ(a.per_device.size(), 2u);
  EXPECT_EQ(a.per_device[0].messages, 3u);
  EXPECT_EQ(a.per_device[7].messages, 5u);
  EXPECT_EQ(a.per_device[7].duplicates, 2u);
  // A device in both lanes (not something a sender does, but a merge must not lose it) adds up.
  SessionReport c;
  c.per_device[0] = {1, 10, 0, 0};
  a.merge(c);
  EXPECT_EQ(a.per_device[0].messages, 4u);
  EXPECT_EQ(a.per_device[0].bytes, 310u);
}

}  // namespace
}  // namespace slotstream
