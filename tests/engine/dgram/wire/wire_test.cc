#include "engine/dgram/wire/wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <vector>

#include "engine/dgram/wire/crc32c.h"
#include "engine/dgram/wire/mac.h"

namespace slotstream::dgram {
namespace {

uint8_t at(const std::vector<std::byte>& b, size_t i) { return std::to_integer<uint8_t>(b[i]); }
uint64_t le(const std::vector<std::byte>& b, size_t i, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k) v |= uint64_t(at(b, i + k)) << (8 * k);
  return v;
}

std::vector<std::byte> encode(const SegmentHeader& h, std::vector<std::byte> payload = {}) {
  std::vector<std::byte> out(kMaxHeaderSize + payload.size() + kCrcSize);
  out.resize(encode_segment(h, payload, out));
  return out;
}

// Pins the layout documented in wire.h: a change here is a wire-format change and needs a new
// kWireVersion.
TEST(DgramWire, WriteRecordLayoutIsPinned) {
  SegmentHeader h;
  h.service = Service::kUD;
  h.opcode = Opcode::kWriteRecord;
  h.last = true;
  h.has_msn = true;
  h.source_qp = 0x04030201;
  h.stag = 0x14131211;
  h.offset = 0x2827262524232221;
  h.msn = 0x34333231;
  auto d = encode(h, {std::byte{0xAA}, std::byte{0xBB}});
  static_assert(kCommonSize == 12 && kTaggedSize == 12 && kCrcSize == 4);
  ASSERT_EQ(d.size(), 12u + 16 + 2 + 4);
  EXPECT_EQ(at(d, 0), 'S');
  EXPECT_EQ(at(d, 1), 'D');
  EXPECT_EQ(at(d, 2), 2);                          // wire version
  EXPECT_EQ(at(d, 3), 0x80 | 0x40 | 0x20 | 0x01);  // T, L, M, DDP version 1
  EXPECT_EQ(at(d, 4), 0x40 | 8);                   // RDMAP version 1, opcode 8 (Write-Record)
  EXPECT_EQ(at(d, 5), 0);                          // UD
  EXPECT_EQ(le(d, 6, 2), 2u);                      // payload length
  EXPECT_EQ(le(d, 8, 4), 0x04030201u);             // source QP, little-endian
  EXPECT_EQ(le(d, 12, 4), 0x14131211u);            // STag
  EXPECT_EQ(le(d, 16, 8), 0x2827262524232221u);    // tagged offset
  EXPECT_EQ(le(d, 24, 4), 0x34333231u);            // MSN
  EXPECT_EQ(at(d, 28), 0xAA);
  EXPECT_EQ(at(d, 29), 0xBB);
  EXPECT_EQ(le(d, 30, 4), crc32c(std::span(d).first(30)));
}

TEST(DgramWire, UntaggedAndRdLayoutIsPinned) {
  SegmentHeader h;
  h.service = Service::kRD;
  h.opcode = Opcode::kSend;
  h.last = false;
  h.source_qp = 7;
  h.rd = {0x01020304, 0x05060708, 512, kRdSeqValid, 0x8000000000000001};
  h.queue = 0x0000BEEF;
  h.msn = 9;
  h.offset = 0x11223344;
  auto d = encode(h);
  ASSERT_EQ(d.size(), 12u + 24 + 12 + 4);
  EXPECT_EQ(at(d, 3), 0x01);      // untagged, not last
  EXPECT_EQ(at(d, 4), 0x40 | 3);  // Send
  EXPECT_EQ(at(d, 5), 1);         // RD
  EXPECT_EQ(le(d, 12, 4), 0x01020304u);
  EXPECT_EQ(le(d, 16, 4), 0x05060708u);
  EXPECT_EQ(le(d, 20, 4), 512u);
  EXPECT_EQ(le(d, 24, 4), uint64_t(kRdSeqValid));
  EXPECT_EQ(le(d, 28, 8), 0x8000000000000001u);
  EXPECT_EQ(le(d, 36, 4), 0xBEEFu);      // QN
  EXPECT_EQ(le(d, 40, 4), 9u);           // MSN
  EXPECT_EQ(le(d, 44, 4), 0x11223344u);  // MO
}

TEST(DgramWire, RoundTripsEveryShape) {
  std::vector<SegmentHeader> shapes;
  SegmentHeader a;
  a.opcode = Opcode::kWrite;
  a.service = Service::kRC;
  a.stag = 3;
  a.offset = 1u << 20;
  a.last = false;
  shapes.push_back(a);  // tagged without MSN
  SegmentHeader b;
  b.opcode = Opcode::kWriteRecord;
  b.has_msn = true;
  b.msn = 0xFFFFFFFF;
  b.stag = 0xFFFFFFFF;
  b.offset = ~0ull;
  shapes.push_back(b);
  SegmentHeader c;
  c.opcode = Opcode::kSend;
  c.queue = 0xFFFFFFFF;
  c.msn = 4;
  c.offset = 0xFFFFFFFF;
  shapes.push_back(c);
  SegmentHeader k;
  k.service = Service::kRD;
  k.opcode = Opcode::kAck;
  k.rd = {0, 77, 64, kRdAckValid, 0x5};
  shapes.push_back(k);
  for (const auto& h : shapes) {
    std::vector<std::byte> payload(h.opcode == Opcode::kAck ? 0 : 100, std::byte{0x5A});
    auto d = encode(h, payload);
    ASSERT_FALSE(d.empty());
    DecodeError why;
    auto s = decode_segment(d, &why);
    ASSERT_TRUE(s) << decode_error_name(why);
    EXPECT_EQ(s->header, h);
    EXPECT_EQ(s->payload.size(), payload.size());
  }
}

TEST(DgramWire, EveryFlippedBitIsCaughtByTheCrc) {
  SegmentHeader h;
  h.opcode = Opcode::kWriteRecord;
  h.has_msn = true;
  auto good = encode(h, std::vector<std::byte>(64, std::byte{1}));
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    auto d = good;
    d[bit / 8] ^= std::byte(1u << (bit % 8));
    DecodeError why;
    EXPECT_FALSE(decode_segment(d, &why)) << bit;
    EXPECT_EQ(why, DecodeError::kCrc) << bit;
  }
}

// A well-formed CRC over bad fields: each field check must fire on its own.
std::vector<std::byte> reseal(std::vector<std::byte> d) {
  const size_t body = d.size() - kCrcSize;
  put_crc(crc32c(std::span(d).first(body)), std::span<std::byte, kCrcSize>(d.data() + body, kCrcSize));
  return d;
}

TEST(DgramWire, RejectsWhatItCannotTrust) {
  SegmentHeader h;
  h.opcode = Opcode::kSend;
  auto good = encode(h, std::vector<std::byte>(8));
  DecodeError why;
  auto expect = [&](std::vector<std::byte> d, DecodeError e) {
    EXPECT_FALSE(decode_segment(reseal(std::move(d)), &why));
    EXPECT_EQ(why, e) << decode_error_name(why);
  };
  auto d = good;
  d[0] = std::byte{'X'};
  expect(d, DecodeError::kMagic);
  d = good;
  d[2] = std::byte{1};
  expect(d, DecodeError::kVersion);  // version 1: before authentication
  d = good;
  d[2] = std::byte{3};
  expect(d, DecodeError::kVersion);
  d = good;
  d[3] = std::byte{0x42};
  expect(d, DecodeError::kVersion);  // DDP version 2
  d = good;
  d[4] = std::byte{0x80 | 3};
  expect(d, DecodeError::kVersion);  // RDMAP version 2
  d = good;
  d[3] |= std::byte{0x04};
  expect(d, DecodeError::kReserved);
  d = good;
  d[3] |= std::byte{0x20};
  expect(d, DecodeError::kReserved);  // M on an untagged segment
  d = good;
  d[5] = std::byte{3};
  expect(d, DecodeError::kService);
  d = good;
  d[4] = std::byte{0x40 | 9};
  expect(d, DecodeError::kOpcode);
  d = good;
  d[4] = std::byte{0x40 | 0};
  expect(d, DecodeError::kOpcode);  // Write without T
  d = good;
  d[4] = std::byte{0x40 | 15};
  expect(d, DecodeError::kOpcode);  // ack outside RD
  d = good;
  d[6] = std::byte{9};
  expect(d, DecodeError::kLength);
  EXPECT_FALSE(decode_segment(std::span(good).first(15), &why));
  EXPECT_EQ(why, DecodeError::kShort);
  std::vector<std::byte> plain(100, std::byte{0x47});  // e.g. an MPEG-TS datagram without the shim
  EXPECT_FALSE(decode_segment(plain, &why));
  EXPECT_EQ(why, DecodeError::kCrc);
}

TEST(DgramWire, RdAckAndDataAreDistinct) {
  SegmentHeader h;
  h.service = Service::kRD;
  h.opcode = Opcode::kSend;
  h.rd.flags = 0;  // a data segment without a sequence number
  auto d = encode(h);
  DecodeError why;
  EXPECT_FALSE(decode_segment(d, &why));
  EXPECT_EQ(why, DecodeError::kReserved);
}

TEST(DgramWire, LargestSegmentFitsOneDatagram) {
  SegmentHeader h;
  h.service = Service::kRD;
  h.opcode = Opcode::kWriteRecord;
  h.has_msn = true;
  EXPECT_EQ(header_size(h), kMaxHeaderSize);
  EXPECT_EQ(kMaxHeaderSize + kMaxSegmentPayload + kMaxTrailerSize, kMaxUdpPayload);
  std::vector<std::byte> payload(kMaxSegmentPayload), out(kMaxUdpPayload);
  SegmentMac mac(MacKey{});
  EXPECT_EQ(encode_segment(h, payload, out, &mac), kMaxUdpPayload);
}

// The A flag and the MAC's place: after the payload, before the CRC, over headers and payload.
TEST(DgramWire, MacLayoutIsPinned) {
  SegmentHeader h;
  h.opcode = Opcode::kSend;
  h.queue = 5;
  MacKey key;
  key.fill(0x42);
  SegmentMac mac(key);
  std::vector<std::byte> out(kMaxHeaderSize + 3 + kMaxTrailerSize);
  out.resize(encode_segment(h, std::vector<std::byte>(3, std::byte{0xEE}), out, &mac));
  ASSERT_EQ(out.size(), 12u + 12 + 3 + 16 + 4);
  EXPECT_EQ(at(out, 3), 0x40 | 0x10 | 0x01);  // L, A, DDP version 1
  EXPECT_EQ(le(out, 6, 2), 3u);               // the payload length leaves the MAC out
  std::array<std::byte, kMacTagSize> tag;
  SegmentMac(key).sign({std::span(out).first(27)}, tag);
  EXPECT_TRUE(std::equal(tag.begin(), tag.end(), out.begin() + 27));
  EXPECT_EQ(le(out, 43, 4), crc32c(std::span(out).first(43)));
  auto seg = decode_segment(out);
  ASSERT_TRUE(seg);
  EXPECT_TRUE(seg->header.has_mac);
  EXPECT_EQ(seg->payload.size(), 3u);
  EXPECT_TRUE(mac.verify(*seg));
}

// A CRC anyone can compute: only the MAC tells a forged segment from the session's.
TEST(DgramWire, AForgedSegmentWithARightCrcFailsItsMac) {
  SegmentHeader h;
  h.opcode = Opcode::kSend;
  MacKey key;
  key.fill(1);
  SegmentMac mac(key);
  auto d = std::vector<std::byte>(kMaxHeaderSize + 8 + kMaxTrailerSize);
  d.resize(encode_segment(h, std::vector<std::byte>(8, std::byte{1}), d, &mac));
  d[24] = std::byte{2};             // a payload byte, changed by someone without the key, CRC fixed up
  const auto resealed = reseal(d);  // (kept: the segment points into it)
  auto seg = decode_segment(resealed);
  ASSERT_TRUE(seg);
  EXPECT_FALSE(mac.verify(*seg));
  MacKey other;
  other.fill(2);
  const auto plain = encode(h, std::vector<std::byte>(8));
  auto unsigned_seg = decode_segment(plain);
  ASSERT_TRUE(unsigned_seg);
  EXPECT_FALSE(mac.verify(*unsigned_seg));  // no MAC at all
  auto forged = std::vector<std::byte>(kMaxHeaderSize + 8 + kMaxTrailerSize);
  SegmentMac wrong(other);
  forged.resize(encode_segment(h, std::vector<std::byte>(8), forged, &wrong));
  EXPECT_FALSE(mac.verify(*decode_segment(forged)));  // signed with another key
}

}  // namespace
}  // namespace slotstream::dgram
