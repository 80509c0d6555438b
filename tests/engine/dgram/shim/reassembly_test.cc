#include "engine/dgram/shim/reassembly.h"

#include <gtest/gtest.h>
#include <netinet/in.h>

#include <climits>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace slotstream::dgram {
namespace {

constexpr int64_t kTimeout = 1000;

sockaddr_storage addr(uint16_t port) {
  sockaddr_storage ss{};
  auto& in = reinterpret_cast<sockaddr_in&>(ss);
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ss;
}

// A Write-Record segment as the sending shim makes it: STag kShimFirstStag + msn % kShimRing.
struct Seg {
  std::vector<std::byte> payload;
  Segment seg;
  Seg(uint32_t qp, uint32_t msn, uint64_t offset, size_t n, bool last, int fill) : payload(n, std::byte(fill)) {
    seg.header.opcode = Opcode::kWriteRecord;
    seg.header.has_msn = true;
    seg.header.source_qp = qp;
    seg.header.msn = msn;
    seg.header.stag = kShimFirstStag + msn % kShimRing;
    seg.header.offset = offset;
    seg.header.last = last;
    seg.payload = payload;
  }
};

struct Fixture {
  ReassemblyCounters counters;
  Reassembly r;
  std::deque<ShimDatagram> out;
  explicit Fixture(bool deliver, size_t max_sources = 32)
      : r(ReassemblyOptions{kTimeout, deliver, max_sources}, &counters) {}
  void feed(const Seg& s, int64_t now, uint16_t port = 5000, std::string_view control = {}) {
    const sockaddr_storage a = addr(port);
    r.feed(s.seg, a, sizeof(sockaddr_in), std::as_bytes(std::span(control)), now, &out);
  }
};

TEST(ShimReassembly, OutOfOrderSegmentsMakeOneDatagram) {
  Fixture f(false);
  f.feed(Seg(1, 0, 2000, 500, true, 3), 0);
  f.feed(Seg(1, 0, 0, 1000, false, 1), 1);
  EXPECT_TRUE(f.out.empty());
  f.feed(Seg(1, 0, 1000, 1000, false, 2), 2);
  ASSERT_EQ(f.out.size(), 1u);
  const ShimDatagram& d = f.out.front();
  EXPECT_FALSE(d.partial);
  ASSERT_EQ(d.data.size(), 2500u);
  EXPECT_EQ(d.data[999], std::byte{1});
  EXPECT_EQ(d.data[1000], std::byte{2});
  EXPECT_EQ(d.data[2499], std::byte{3});
  EXPECT_EQ(reinterpret_cast<const sockaddr_in&>(d.from).sin_port, htons(5000));
  EXPECT_EQ(f.counters.reassembled, 1u);
  // A late copy of a segment of the finished datagram starts nothing.
  f.feed(Seg(1, 0, 0, 1000, false, 1), 3);
  EXPECT_EQ(f.counters.late_segments, 1u);
  EXPECT_EQ(f.r.outstanding(), 0u);
}

TEST(ShimReassembly, AnIncompleteDatagramIsDroppedByDefault) {
  Fixture f(false);
  f.feed(Seg(1, 0, 0, 1000, false, 1), 0);
  f.feed(Seg(1, 0, 2000, 500, true, 3), 0);
  EXPECT_EQ(f.r.wake_ns(), INT64_MAX);  // nothing to hand over when the timer fires: no one is woken
  f.r.expire(kTimeout, &f.out);
  EXPECT_TRUE(f.out.empty());
  EXPECT_EQ(f.counters.partial_dropped, 1u);
}

TEST(ShimReassembly, PartialDeliveryZeroFillsTheHoles) {
  Fixture f(true);
  f.feed(Seg(1, 0, 0, 1000, false, 1), 0);
  f.feed(Seg(1, 0, 2000, 500, true, 3), 10);
  EXPECT_EQ(f.r.wake_ns(), kTimeout);  // from the first segment (the patent's timer)
  f.r.expire(kTimeout - 1, &f.out);
  EXPECT_TRUE(f.out.empty());
  f.r.expire(kTimeout, &f.out);
  ASSERT_EQ(f.out.size(), 1u);
  const ShimDatagram& d = f.out.front();
  EXPECT_TRUE(d.partial);
  ASSERT_EQ(d.data.size(), 2500u);
  EXPECT_EQ(d.data[0], std::byte{1});
  for (size_t i = 1000; i < 2000; ++i) ASSERT_EQ(d.data[i], std::byte{0}) << i;
  EXPECT_EQ(d.data[2000], std::byte{3});
  EXPECT_EQ(f.counters.partial_delivered, 1u);
}

TEST(ShimReassembly, SourcesAreToldApartByAddressAndQp) {
  Fixture f(false);
  // The same MSN and STag from three sources: three messages, not one.
  f.feed(Seg(1, 0, 0, 100, false, 1), 0, 5000);
  f.feed(Seg(2, 0, 0, 100, false, 2), 0, 5000);
  f.feed(Seg(1, 0, 0, 100, false, 3), 0, 5001);
  EXPECT_EQ(f.r.sources(), 3u);
  f.feed(Seg(2, 0, 100, 10, true, 2), 1, 5000);
  ASSERT_EQ(f.out.size(), 1u);
  EXPECT_EQ(f.out.front().data[0], std::byte{2});
  EXPECT_EQ(f.counters.duplicate_segments, 0u);
}

TEST(ShimReassembly, TheLeastRecentlyHeardSourceMakesRoom) {
  Fixture f(true, 2);
  f.feed(Seg(1, 0, 0, 100, false, 1), 0);
  f.feed(Seg(2, 0, 0, 100, false, 2), 5);
  f.feed(Seg(3, 0, 0, 100, false, 3), 6);  // source 1 ends: its message is handed over as timed out
  EXPECT_EQ(f.r.sources(), 2u);
  ASSERT_EQ(f.out.size(), 1u);
  EXPECT_TRUE(f.out.front().partial);
  EXPECT_EQ(f.out.front().data[0], std::byte{1});
}

TEST(ShimReassembly, SegmentsOutsideTheShimsStagsOrRegionAreBad) {
  Fixture f(false);
  Seg wrong_stag(1, 0, 0, 10, true, 1);
  wrong_stag.seg.header.stag = kShimFirstStag + kShimRing;
  f.feed(wrong_stag, 0);
  f.feed(Seg(1, 1, kShimRegion - 5, 10, true, 1), 0);
  EXPECT_EQ(f.counters.bad_segments, 2u);
  EXPECT_TRUE(f.out.empty());
}

TEST(ShimReassembly, SilentSourcesAreForgotten) {
  Fixture f(false);
  f.feed(Seg(1, 0, 0, 10, true, 1), 0);
  EXPECT_EQ(f.r.sources(), 1u);
  f.r.expire(kForgetAfter * kTimeout + 1, &f.out);
  EXPECT_EQ(f.r.sources(), 0u);
}

// A recombined datagram carries the ancillary data of its first placed segment (IP_PKTINFO: which group it was
// sent to), not another message's, even when two messages of one source interleave.
TEST(ShimReassembly, ADatagramKeepsItsFirstSegmentsAncillaryData) {
  Fixture f(false);
  f.feed(Seg(1, 0, 0, 1000, false, 1), 0, 5000, "group-a");
  f.feed(Seg(1, 1, 0, 1000, false, 2), 1, 5000, "group-b");
  f.feed(Seg(1, 0, 1000, 10, true, 1), 2, 5000, "later");
  f.feed(Seg(1, 1, 1000, 10, true, 2), 3, 5000);
  f.feed(Seg(1, 2, 0, 1000, false, 3), 4, 5000);  // a socket that asks for no ancillary data: none kept
  f.feed(Seg(1, 2, 1000, 10, true, 3), 5, 5000);
  ASSERT_EQ(f.out.size(), 3u);
  auto text = [](const ShimDatagram& d) {
    return std::string(reinterpret_cast<const char*>(d.control.data()), d.control.size());
  };
  EXPECT_EQ(text(f.out[0]), "group-a");
  EXPECT_EQ(text(f.out[1]), "group-b");
  EXPECT_EQ(text(f.out[2]), "");
}

}  // namespace
}  // namespace slotstream::dgram
