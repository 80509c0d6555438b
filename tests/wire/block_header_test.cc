#include "wire/block_header.h"

#include <gtest/gtest.h>

#include <array>

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

TEST(BlockHeader, PacketDistanceWraps) {
  EXPECT_EQ(packet_distance(5, 5), 0);
  EXPECT_EQ(packet_distance(5, 7), 2);
  EXPECT_EQ(packet_distance(7, 5), -2);
  EXPECT_EQ(packet_distance(0xFFFFFFFE, 1), 3);
  EXPECT_EQ(packet_distance(1, 0xFFFFFFFE), -3);
}

}  // namespace
}  // namespace slotstream::wire
