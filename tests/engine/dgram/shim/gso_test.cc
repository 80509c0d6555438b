#include "engine/dgram/shim/gso.h"

#include <gtest/gtest.h>

#include <vector>

namespace slotstream::dgram {
namespace {

std::vector<GsoBatch> plan(const std::vector<size_t>& sizes, const GsoLimits& limits = {}, size_t iov = 3) {
  const std::vector<size_t> iovs(sizes.size(), iov);
  return plan_gso_batches(sizes, iovs, limits);
}

void expect_batch(const GsoBatch& b, size_t first, size_t count, uint16_t gso_size) {
  EXPECT_EQ(b.first, first);
  EXPECT_EQ(b.count, count);
  EXPECT_EQ(b.gso_size, gso_size);
}

TEST(GsoBatches, EqualSegmentsWithAShorterLastAreOneMessage) {
  // A 32,000-byte datagram at the 1,500-byte MTU: 22 segments of 1,472 bytes and a last one of 352.
  std::vector<size_t> sizes(22, 1472);
  sizes.push_back(352);
  const auto b = plan(sizes);
  ASSERT_EQ(b.size(), 1u);
  expect_batch(b[0], 0, 23, 1472);
}

TEST(GsoBatches, OneSegmentGoesWithoutGso) {
  const auto b = plan({1000});
  ASSERT_EQ(b.size(), 1u);
  expect_batch(b[0], 0, 1, 0);
  EXPECT_TRUE(plan({}).empty());
}

TEST(GsoBatches, AMessageStaysWithinOneUdpDatagram) {
  // 65,507 bytes: 46 segments; 44 x 1,472 = 64,768 fit one IPv4 UDP payload, a 45th would not.
  std::vector<size_t> sizes(45, 1472);
  sizes.push_back(1187);
  const auto b = plan(sizes);
  ASSERT_EQ(b.size(), 2u);
  expect_batch(b[0], 0, 44, 1472);
  expect_batch(b[1], 44, 2, 1472);
}

TEST(GsoBatches, SegmentAndScatterLimits) {
  const std::vector<size_t> sizes(10, 100);
  GsoLimits few;
  few.max_segments = 4;
  auto b = plan(sizes, few);
  ASSERT_EQ(b.size(), 3u);
  expect_batch(b[2], 8, 2, 100);
  GsoLimits pieces;
  pieces.max_iov = 7;  // two segments of three pieces each
  b = plan(sizes, pieces);
  ASSERT_EQ(b.size(), 5u);
  expect_batch(b[4], 8, 2, 100);
  GsoLimits none;
  none.max_segments = 1;  // SLOTSTREAM_UDP_GSO=off, or a kernel that refused: every segment alone
  b = plan(sizes, none);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < b.size(); ++i) expect_batch(b[i], i, 1, 0);
}

TEST(GsoBatches, AShortSegmentEndsItsMessage) {
  // The injector sent the short last segment twice: the kernel would cut the first copy's bytes together with
  // the second's, so the copy opens a message of its own.
  const auto b = plan({1472, 1472, 352, 352});
  ASSERT_EQ(b.size(), 2u);
  expect_batch(b[0], 0, 3, 1472);
  expect_batch(b[1], 3, 1, 0);
  // A larger segment after smaller ones never joins them (each wire datagram must stay one segment).
  const auto c = plan({500, 500, 1472, 1472});
  ASSERT_EQ(c.size(), 2u);
  expect_batch(c[0], 0, 2, 500);
  expect_batch(c[1], 2, 2, 1472);
}

TEST(GsoBatches, SegmentsLargerThanUdpSegmentTakesGoAlone) {
  GsoLimits l;
  l.max_gso_size = 1000;
  const auto b = plan({1472, 1472}, l);
  ASSERT_EQ(b.size(), 2u);
  expect_batch(b[0], 0, 1, 0);
}

}  // namespace
}  // namespace slotstream::dgram
