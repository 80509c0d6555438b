// The ring machinery shared by packed_ring and nic_assisted: sender-side space, the coalescing
// buffer, splitting a segment into records, and the receiver's ledger. Pure logic, no UCX.
#include "engine/ucx/protocol/ring.h"

#include <gtest/gtest.h>

#include "fake_ring.h"
#include "wire/block_header.h"

namespace slotstream::protocol {
namespace {

using testing::make_record;
using Verdict = RingLedger::Verdict;

TEST(RingLayout, NoticeAndAckArePinned) {
  RingNotice n{0x1122334455667788ull, 0x0102030405060708ull, 0xAABBCCDD, kNoticePadding};
  const auto* b = reinterpret_cast<const uint8_t*>(&n);
  EXPECT_EQ(b[0], 0x88);  // session, little-endian, bytes 0..7
  EXPECT_EQ(b[8], 0x08);  // position, bytes 8..15
  EXPECT_EQ(b[15], 0x01);
  EXPECT_EQ(b[16], 0xDD);  // length, bytes 16..19
  EXPECT_EQ(b[20], 0x01);  // flags, bytes 20..23: bit 0 = wrap marker
  RingAck a{1, 2, 3};
  const auto* c = reinterpret_cast<const uint8_t*>(&a);
  EXPECT_EQ(c[0], 1);
  EXPECT_EQ(c[8], 2);
  EXPECT_EQ(c[16], 3);
}

TEST(RingSpace, PaddingOnlyWhenASegmentWouldCrossTheEnd) {
  RingSpace s(100);
  EXPECT_EQ(s.padding_for(100), 0u);  // a whole empty lap
  s.take(70);
  EXPECT_EQ(s.to_end(), 30u);
  EXPECT_EQ(s.padding_for(30), 0u);
  EXPECT_EQ(s.padding_for(31), 30u);
  EXPECT_EQ(s.free(), 30u);
}

TEST(RingSpace, AcksMoveTheHeadForwardOnly) {
  RingSpace s(100);
  s.take(60);
  EXPECT_FALSE(s.freed(61)) << "beyond anything written";
  EXPECT_TRUE(s.freed(40));
  EXPECT_FALSE(s.freed(40)) << "duplicate";
  EXPECT_FALSE(s.freed(10)) << "late";
  EXPECT_EQ(s.free(), 80u);
  s.take(80);  // wraps: positions are monotonic, offsets are modulo the size
  EXPECT_EQ(s.tail(), 140u);
  EXPECT_EQ(s.to_end(), 60u);
  EXPECT_EQ(s.free(), 0u);
}

TEST(CoalesceBuffer, RunsOfWholeRecordsFromTheFront) {
  CoalesceBuffer b(100);
  EXPECT_EQ(b.append(30), 0u);
  EXPECT_EQ(b.append(30), 30u);
  EXPECT_EQ(b.append(30), 60u);
  EXPECT_FALSE(b.fits(11));
  size_t n = 0;
  EXPECT_EQ(b.run(75, &n), 60u);  // never half a record
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(b.run(29, &n), 0u);
  b.sent(60, 2);
  EXPECT_EQ(b.front_offset(), 60u);
  EXPECT_EQ(b.pending_records(), 1u);
  b.reset();  // not empty: ignored
  EXPECT_EQ(b.front_offset(), 60u);
  EXPECT_FALSE(b.fits(11)) << "space is reused only once everything was sent";
  b.sent(30, 1);
  EXPECT_TRUE(b.empty());
  b.reset();
  EXPECT_TRUE(b.fits(100));
  EXPECT_EQ(b.append(5), 0u);
}

TEST(SplitRecords, SeveralSmallMessagesKeepDeviceNumberAndBytes) {
  std::vector<std::byte> seg;
  std::vector<std::vector<std::byte>> recs = {make_record(3, 7, 1, 1), make_record(65535, 0xFFFFFFFF, 0, 2),
                                              make_record(0, 8, 200, 3)};
  for (auto& r : recs) seg.insert(seg.end(), r.begin(), r.end());
  std::vector<std::span<const std::byte>> out;
  split_records(seg, &out);
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::equal(out[i].begin(), out[i].end(), recs[i].begin(), recs[i].end())) << i;
  }
  auto h = wire::decode_block_header(out[1].first<wire::kBlockHeaderSize>(), 0);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->device, 65535);
  EXPECT_EQ(h->packet, 0xFFFFFFFFu);
}

TEST(SplitRecords, GarbageBecomesOneLastRecordSoNothingIsLost) {
  auto good = make_record(1, 1, 10, 1);
  std::vector<std::byte> seg(good.begin(), good.end());
  auto bad = make_record(1, 2, 10, 2);
  bad[13] ^= std::byte{0xFF};  // check word broken
  seg.insert(seg.end(), bad.begin(), bad.end());
  auto more = make_record(1, 3, 10, 3);
  seg.insert(seg.end(), more.begin(), more.end());
  std::vector<std::span<const std::byte>> out;
  split_records(seg, &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].size(), good.size());
  EXPECT_EQ(out[1].size(), bad.size() + more.size()) << "the rest, as one record the stream layer rejects";

  // A header whose payload runs past the segment, and a tail shorter than a header.
  auto longer = make_record(1, 4, 100, 4);
  std::vector<std::byte> cut(longer.begin(), longer.begin() + 50);
  split_records(cut, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].size(), 50u);
  std::vector<std::byte> tiny(7);
  split_records(tiny, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].size(), 7u);
  split_records({}, &out);
  EXPECT_TRUE(out.empty());
}

TEST(RingLedger, RejectsNoticesThatBreakTheRules) {
  RingLedger l(100, 0);
  EXPECT_EQ(l.accept(10, 5, false), Verdict::kWrongPosition);
  EXPECT_EQ(l.accept(0, 0, false), Verdict::kEmpty);
  EXPECT_EQ(l.accept(0, 101, false), Verdict::kCrossesEnd);
  EXPECT_EQ(l.accept(0, 100, true), Verdict::kBadPadding) << "a wrap marker over a whole lap";
  ASSERT_EQ(l.accept(0, 60, false), Verdict::kOk);
  const uint64_t id = l.add_record(0, 60);
  EXPECT_EQ(l.accept(60, 30, true), Verdict::kBadPadding) << "padding must end at the ring's end";
  EXPECT_EQ(l.accept(60, 41, false), Verdict::kCrossesEnd);
  ASSERT_EQ(l.accept(60, 40, true), Verdict::kOk);
  EXPECT_EQ(l.head(), 0u) << "the padding waits behind the unreleased record";
  EXPECT_EQ(l.accept(100, 1, false), Verdict::kOverrun) << "would overwrite the unreleased record";
  EXPECT_FALSE(l.release(id + 5));
  EXPECT_TRUE(l.release(id));
  EXPECT_FALSE(l.release(id)) << "twice";
  EXPECT_EQ(l.head(), 100u) << "record and padding freed together";
  EXPECT_EQ(l.accept(100, 100, false), Verdict::kOk);
}

TEST(RingLedger, HeadMovesOverTheReleasedPrefixOnly) {
  RingLedger l(100, 0);
  ASSERT_EQ(l.accept(0, 30, false), Verdict::kOk);
  const uint64_t a = l.add_record(0, 10), b = l.add_record(10, 10), c = l.add_record(20, 10);
  EXPECT_TRUE(l.release(c));
  EXPECT_TRUE(l.release(b));
  EXPECT_EQ(l.head(), 0u);
  EXPECT_TRUE(l.released(b));
  EXPECT_FALSE(l.released(a));
  EXPECT_TRUE(l.release(a));
  EXPECT_EQ(l.head(), 30u);
  EXPECT_TRUE(l.released(a));
}

TEST(RingLedger, VirtualWindowsShiftWithShortSegments) {
  // SDP §4.1's example, in bytes: a 64K ring, W = 8K: 8 receives posted at first.
  RingLedger l(64 << 10, 8 << 10);
  EXPECT_EQ(l.initial_credits(), 8u);
  EXPECT_EQ(l.grant(), 0u);
  // A 1K message takes one credit; the remaining windows shift: 63K free, 7 x 8K promised, 7K
  // spare. Another 1K: 14K spare, more than W: one more receive can be posted, 6K remain.
  ASSERT_EQ(l.accept(0, 1 << 10, false), Verdict::kOk);
  l.add_record(0, 1 << 10);
  EXPECT_EQ(l.grant(), 0u);
  ASSERT_EQ(l.accept(1 << 10, 1 << 10, false), Verdict::kOk);
  l.add_record(1 << 10, 1 << 10);
  EXPECT_EQ(l.grant(), 1u);
  EXPECT_EQ(l.granted(), 1u);
  EXPECT_EQ(l.outstanding(), 7u);
  EXPECT_EQ(l.accept(2 << 10, (8 << 10) + 1, false), Verdict::kOverWindow);
}

TEST(RingLedger, NoSegmentWithoutACredit) {
  RingLedger l(100, 40);  // 2 credits at first
  ASSERT_EQ(l.accept(0, 30, false), Verdict::kOk);
  const uint64_t a = l.add_record(0, 30);
  ASSERT_EQ(l.accept(30, 30, false), Verdict::kOk);
  l.add_record(30, 30);
  EXPECT_EQ(l.accept(60, 30, false), Verdict::kNoCredit) << "40 bytes are free, but no receive is posted";
  EXPECT_EQ(l.grant(), 1u) << "40 free, nothing promised: one window";
  ASSERT_EQ(l.accept(60, 30, false), Verdict::kOk);
  l.add_record(60, 30);
  EXPECT_EQ(l.grant(), 0u) << "10 free";
  EXPECT_TRUE(l.release(a));
  EXPECT_EQ(l.grant(), 1u) << "40 free again";
  EXPECT_EQ(l.granted(), 2u);
}

}  // namespace
}  // namespace slotstream::protocol
