#include "wire/block_header.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

namespace slotstream::wire {
namespace {

using Bytes = std::array<std::byte, kBlockHeaderSize>;

uint8_t at(const Bytes& b, size_t i) { return std::to_integer<uint8_t>(b[i]); }

// Pins the layout documented in block_header.h: any change here is a wire-format change and
// needs a new kBlockHeaderVersion.
TEST(BlockHeader, LayoutIsPinned) {
  static_assert(kBlockHeaderSize == 16);
  Bytes b{};
  encode_block_header({kFirstFragment | kLastFragment, 0x0201, 0x06050403, 0x0a090807}, b);
  EXPECT_EQ(at(b, 0), 1);     // version
  EXPECT_EQ(at(b, 1), 3);     // flags
  EXPECT_EQ(at(b, 2), 0x01);  // device, little-endian
  EXPECT_EQ(at(b, 3), 0x02);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(b, 4 + i), 3 + i);  // packet LE
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(b, 8 + i), 7 + i);  // payload length LE
  uint32_t w0 = 0x02010301, w1 = 0x06050403, w2 = 0x0a090807, check = ~(w0 ^ w1 ^ w2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(b, 12 + i), uint8_t(check >> (8 * i)));
}

TEST(BlockHeader, RoundTrips) {
  Bytes b{};
  BlockHeader h{kLastFragment, 65535, 0xFFFFFFFF, 4000};
  encode_block_header(h, b);
  auto d = decode_block_header(b, 4080);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, h);
}

TEST(BlockHeader, RejectsWhatItCannotTrust) {
  Bytes good{};
  encode_block_header({kFirstFragment, 1, 2, 100}, good);
  HeaderError why;

  Bytes b = good;
  b[0] = std::byte{2};  // unknown version
  EXPECT_FALSE(decode_block_header(b, 4080, &why));
  EXPECT_EQ(why, HeaderError::kVersion);

  b = good;
  b[5] ^= std::byte{1};  // torn packet number
  EXPECT_FALSE(decode_block_header(b, 4080, &why));
  EXPECT_EQ(why, HeaderError::kCheck);

  EXPECT_FALSE(decode_block_header(good, 99, &why));  // longer than the block's payload
  EXPECT_EQ(why, HeaderError::kLength);

  Bytes zero{};  // an empty block
  EXPECT_FALSE(decode_block_header(zero, 4080));
}

// Pins the packed unit's header (block_header.h, issue 21): a change is a wire-format change.
TEST(PackedHeader, LayoutIsPinned) {
  static_assert(kPackedHeaderSize == 16 && kPackedVersion == 2 && kRecordAlign == 8);
  Bytes b{};
  encode_packed_header({0x04030201, 0x08070600}, b);
  EXPECT_EQ(at(b, 0), 2);  // version
  EXPECT_EQ(at(b, 1), 0);  // flags
  EXPECT_EQ(at(b, 2), 0);  // reserved
  EXPECT_EQ(at(b, 3), 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(b, 4 + i), 1 + i);                // record count LE
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(b, 8 + i), 0 + (i ? 5 + i : 0));  // unit length LE
  uint32_t w0 = 2, w1 = 0x04030201, w2 = 0x08070600, check = ~(w0 ^ w1 ^ w2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(b, 12 + i), uint8_t(check >> (8 * i)));
  EXPECT_EQ(packed_record_size(0), 16u);
  EXPECT_EQ(packed_record_size(1), 24u);
  EXPECT_EQ(packed_record_size(8), 24u);
  EXPECT_EQ(packed_record_size(9), 32u);
}

TEST(PackedHeader, RejectsWhatDoesNotAddUp) {
  Bytes b{};
  HeaderError why;
  encode_packed_header({2, 48}, b);
  EXPECT_TRUE(decode_packed_header(b, 48));
  EXPECT_FALSE(decode_packed_header(b, 40, &why));  // longer than what arrived
  EXPECT_EQ(why, HeaderError::kLength);
  encode_packed_header({1, 48}, b);  // one record never gets a packed header
  EXPECT_FALSE(decode_packed_header(b, 48, &why));
  EXPECT_EQ(why, HeaderError::kCount);
  encode_packed_header({3, 56}, b);  // three records cannot fit in 40 bytes after the header
  EXPECT_FALSE(decode_packed_header(b, 4096, &why));
  EXPECT_EQ(why, HeaderError::kLength);
  encode_packed_header({2, 50}, b);  // not a multiple of 8
  EXPECT_FALSE(decode_packed_header(b, 4096));
  encode_packed_header({2, 48}, b);
  b[9] ^= std::byte{1};
  EXPECT_FALSE(decode_packed_header(b, 4096, &why));
  EXPECT_EQ(why, HeaderError::kCheck);
}

// A unit built the way the sender builds one: packed header, records padded to 8.
std::vector<std::byte> unit(const std::vector<std::pair<BlockHeader, std::string>>& records) {
  std::vector<std::byte> u(kPackedHeaderSize);
  for (const auto& [h, payload] : records) {
    const size_t at = u.size();
    u.resize(at + packed_record_size(payload.size()), std::byte{0xEE});
    encode_block_header(h, std::span(u).subspan(at).first<kBlockHeaderSize>());
    std::memcpy(u.data() + at + kBlockHeaderSize, payload.data(), payload.size());
  }
  encode_packed_header({uint32_t(records.size()), uint32_t(u.size())}, std::span(u).first<kPackedHeaderSize>());
  return u;
}

TEST(UnitReader, ReadsASingleRecordAndEveryRecordOfAPackedUnit) {
  std::vector<std::byte> block(64, std::byte{0x11});  // a block protocol hands out the whole block
  encode_block_header({kFirstFragment | kLastFragment, 9, 4, 5}, std::span(block).first<kBlockHeaderSize>());
  UnitReader single(block);
  UnitReader::Item it;
  ASSERT_TRUE(single.next(&it));
  EXPECT_EQ(it.header.device, 9);
  EXPECT_EQ(it.payload.size(), 5u);
  EXPECT_FALSE(single.next(&it));
  EXPECT_FALSE(single.bad());
  EXPECT_FALSE(single.packed());

  auto u = unit({{{kFirstFragment | kLastFragment, 1, 0, 3}, "abc"},
                 {{kVoid, 2, 0, 8}, "--------"},
                 {{kFirstFragment | kLastFragment, 1, 1, 0}, ""}});
  u.resize(u.size() + 40, std::byte{0x77});  // what lies beyond the unit in its block is not read
  UnitReader packed(u);
  std::vector<uint32_t> devices;
  while (packed.next(&it)) devices.push_back(it.header.device);
  EXPECT_EQ(devices, (std::vector<uint32_t>{1, 2, 1}));
  EXPECT_FALSE(packed.bad());
  EXPECT_TRUE(packed.packed());
  EXPECT_EQ(packed.declared(), 3u);
}

TEST(UnitReader, RefusesARecordThatDoesNotFitAndTheRestAfterIt) {
  auto u = unit({{{kFirstFragment | kLastFragment, 1, 0, 3}, "abc"}, {{kLastFragment, 1, 1, 4}, "defg"}});
  u[kPackedHeaderSize + 24 + 5] ^= std::byte{0x40};  // the second record's packet number torn
  UnitReader r(u);
  UnitReader::Item it;
  ASSERT_TRUE(r.next(&it));
  EXPECT_FALSE(r.next(&it));
  EXPECT_TRUE(r.bad());
  EXPECT_EQ(r.error(), HeaderError::kCheck);

  // A count that says three where the length holds two.
  auto lie = unit({{{kFirstFragment | kLastFragment, 1, 0, 3}, "abc"}, {{kLastFragment, 1, 1, 4}, "defg"}});
  encode_packed_header({3, uint32_t(lie.size())}, std::span(lie).first<kPackedHeaderSize>());
  UnitReader l(lie);
  ASSERT_TRUE(l.next(&it));
  EXPECT_FALSE(l.next(&it));
  EXPECT_TRUE(l.bad());

  // A void record alone is not a unit.
  std::vector<std::byte> block(64);
  encode_block_header({kVoid, 1, 0, 8}, std::span(block).first<kBlockHeaderSize>());
  UnitReader v(block);
  EXPECT_FALSE(v.next(&it));
  EXPECT_TRUE(v.bad());
}

TEST(BlockHeader, PacketDistanceWraps) {
  EXPECT_EQ(packet_distance(5, 5), 0);
  EXPECT_EQ(packet_distance(5, 7), 2);
  EXPECT_EQ(packet_distance(7, 5), -2);
  EXPECT_EQ(packet_distance(0xFFFFFFFE, 1), 3);
  EXPECT_EQ(packet_distance(1, 0xFFFFFFFE), -3);
}

}  // namespace
}  // namespace slotstream::wire
