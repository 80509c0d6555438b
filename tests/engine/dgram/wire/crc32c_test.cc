#include "engine/dgram/wire/crc32c.h"

#include <gtest/gtest.h>

#include <array>
#include <string_view>
#include <vector>

namespace slotstream::dgram {
namespace {

std::vector<std::byte> bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v) out.push_back(std::byte(x));
  return out;
}

std::vector<std::byte> filled(size_t n, auto f) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::byte(f(i));
  return out;
}

// RFC 3720 §B.4 "CRC Examples": the RFC lists the CRC as the bytes on the wire (least significant
// first), so 'aa 36 91 8a' is 0x8a9136aa.
TEST(Crc32c, Rfc3720Vectors) {
  EXPECT_EQ(crc32c(filled(32, [](size_t) { return 0x00; })), 0x8a9136aau);
  EXPECT_EQ(crc32c(filled(32, [](size_t) { return 0xff; })), 0x62a8ab43u);
  EXPECT_EQ(crc32c(filled(32, [](size_t i) { return i; })), 0x46dd794eu);
  EXPECT_EQ(crc32c(filled(32, [](size_t i) { return 31 - i; })), 0x113fdb5cu);
  // An iSCSI SCSI Read (10) command PDU.
  auto pdu = bytes({0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
                    0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  EXPECT_EQ(crc32c(pdu), 0xd9963a56u);
}

TEST(Crc32c, CheckValueAndEmpty) {
  std::string_view s = "123456789";
  EXPECT_EQ(crc32c(std::as_bytes(std::span(s.data(), s.size()))), 0xe3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c({}), 0u);
}

TEST(Crc32c, ExtendEqualsOnePass) {
  auto all = filled(1000, [](size_t i) { return i * 7 + 3; });
  const uint32_t whole = crc32c(all);
  for (size_t cut : {size_t(0), size_t(1), size_t(13), size_t(500), size_t(999), size_t(1000)}) {
    const auto a = std::span(all).first(cut), b = std::span(all).subspan(cut);
    EXPECT_EQ(crc32c_extend(crc32c(a), b), whole) << cut;
  }
}

}  // namespace
}  // namespace slotstream::dgram
