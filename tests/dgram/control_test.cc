#include "dgram/control.h"

#include <gtest/gtest.h>

namespace slotstream::dgram {
namespace {

TEST(DgramControl, HelloLayoutIsPinned) {
  Hello h{"write_record", "cam", 4, 0x0102030405060708, 8192, {1, 0x0203}};
  auto b = encode_control(h);
  std::vector<uint8_t> want = {1, 12};
  for (char c : std::string("write_record")) want.push_back(uint8_t(c));
  want.push_back(3);
  for (char c : std::string("cam")) want.push_back(uint8_t(c));
  for (uint8_t x : {4, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 0x00, 0x20, 0, 0, 2, 0, 1, 0, 3, 2}) want.push_back(x);
  EXPECT_EQ(b, want);
}

TEST(DgramControl, RoundTrips) {
  Hello h{"dgram_rd", "edge-a", 2, 1u << 20, 1400, {0, 1, 65535}};
  EXPECT_EQ(decode_hello(encode_control(h)), h);
  Accept a{7, 512, 1u << 20, {{0, 1}, {1, 3}}};
  EXPECT_EQ(decode_accept(encode_control(a)), a);
  Refuse r{"already connected"};
  EXPECT_EQ(decode_refuse(encode_control(r)), r);
  Fin f{{{0, 10, 1000}, {3, 0, 0}}};
  EXPECT_EQ(decode_fin(encode_control(f)), f);
  FinAck k{{{0, DeliveryCounts{7, 1, 1, 1, 900}}}};
  EXPECT_EQ(decode_fin_ack(encode_control(k)), k);
}

TEST(DgramControl, RejectsMalformed) {
  auto b = encode_control(Fin{{{0, 10, 1000}}});
  EXPECT_FALSE(decode_fin(std::span(b).first(b.size() - 1)));  // truncated
  b.push_back(0);
  EXPECT_FALSE(decode_fin(b));                        // trailing bytes
  EXPECT_FALSE(decode_hello(encode_control(Fin{})));  // another type
  std::vector<uint8_t> unknown = {9};
  EXPECT_FALSE(control_type(unknown));
  EXPECT_FALSE(control_type({}));
  std::vector<uint8_t> huge = {4, 0xFF, 0xFF};  // claims 65535 devices
  EXPECT_FALSE(decode_fin(huge));
}

}  // namespace
}  // namespace slotstream::dgram
