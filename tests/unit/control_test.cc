#include "wire/control.h"

#include <gtest/gtest.h>

namespace slotstream::wire {
namespace {

Hello sample_hello() {
  Hello h;
  h.protocol = "status_byte";
  h.blocks = 32;
  h.block_size = 1 << 20;
  h.transport = WireTransport::kTcp;
  h.host_id = "boot@host";
  h.name = "edge-1";
  h.devices = {0, 7, 65535};
  h.group = 0x1122334455667788ull;
  h.lane = 2;
  h.lanes = 3;
  return h;
}

TEST(Control, HelloRoundTrips) {
  Hello out;
  ASSERT_TRUE(decode(encode(sample_hello()), &out).is_ok());
  EXPECT_EQ(out.protocol, "status_byte");
  EXPECT_EQ(out.blocks, 32u);
  EXPECT_EQ(out.block_size, 1u << 20);
  EXPECT_EQ(out.transport, WireTransport::kTcp);
  EXPECT_EQ(out.name, "edge-1");
  EXPECT_EQ(out.devices, (std::vector<uint16_t>{0, 7, 65535}));
  EXPECT_EQ(out.group, 0x1122334455667788ull);
  EXPECT_EQ(out.lane, 2);
  EXPECT_EQ(out.lanes, 3);
}

TEST(Control, HelloRejectsALaneOutsideItsGroup) {
  Hello h = sample_hello();
  h.lane = 3;  // of 3 lanes: 0..2
  Hello out;
  EXPECT_EQ(decode(encode(h), &out).code(), Code::kProtocolError);
}

TEST(Control, HelloLayoutStartsWithMagicAndVersion) {
  auto b = encode(sample_hello());
  ASSERT_GE(b.size(), 6u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "SLST");
  EXPECT_EQ(b[4], 1);  // version, little-endian
  EXPECT_EQ(b[5], 0);
}

TEST(Control, HelloRejectsBadMagicVersionTruncationAndTrailingBytes) {
  auto b = encode(sample_hello());
  Hello out;

  auto bad = b;
  bad[0] = 'X';
  Status st = decode(bad, &out);
  EXPECT_EQ(st.code(), Code::kProtocolError);
  EXPECT_NE(st.message().find("magic"), std::string::npos);

  bad = b;
  bad[4] = 9;
  st = decode(bad, &out);
  EXPECT_EQ(st.code(), Code::kVersionMismatch);
  EXPECT_NE(st.message().find("version 9"), std::string::npos);

  for (size_t cut = 0; cut < b.size(); ++cut) {
    std::vector<uint8_t> shorter(b.begin(), b.begin() + cut);
    EXPECT_FALSE(decode(shorter, &out).is_ok()) << "accepted a hello cut at " << cut;
  }
  bad = b;
  bad.push_back(0);
  EXPECT_FALSE(decode(bad, &out).is_ok());

  bad = b;
  bad[4 + 2 + 1 + 11 + 8] = 7;  // transport code after magic, version, protocol, blocks, size
  EXPECT_FALSE(decode(bad, &out).is_ok());
}

TEST(Control, FrameHasLengthPrefix) {
  std::vector<uint8_t> body = {1, 2, 3};
  auto f = encode_frame(MsgType::kFin, body);
  ASSERT_EQ(f.size(), 8u);
  EXPECT_EQ(f[0], 4);  // type + body
  EXPECT_EQ(f[4], uint8_t(MsgType::kFin));
}

TEST(Control, OtherMessagesRoundTrip) {
  Accept a{WireTransport::kShm, {1, 2, 3}, {9, 8}};
  Accept a2;
  ASSERT_TRUE(decode(encode(a), &a2).is_ok());
  EXPECT_EQ(a2.worker_address, a.worker_address);
  EXPECT_EQ(a2.setup, a.setup);

  Fin f;
  f.messages = {{0, 10}, {3, 1ull << 40}};
  Fin f2;
  ASSERT_TRUE(decode(encode(f), &f2).is_ok());
  EXPECT_EQ(f2.messages, f.messages);

  FinAck k{true, 77, "all stored"}, k2;
  ASSERT_TRUE(decode(encode(k), &k2).is_ok());
  EXPECT_TRUE(k2.ok);
  EXPECT_EQ(k2.stored, 77u);

  Refuse r{Code::kAuthFailed, "authentication failed"}, r2;
  ASSERT_TRUE(decode(encode(r), &r2).is_ok());
  EXPECT_EQ(r2.code, Code::kAuthFailed);
  EXPECT_EQ(r2.message, "authentication failed");

  std::vector<uint8_t> garbage = {0xff, 0xff, 0xff};
  EXPECT_FALSE(decode(garbage, &a2).is_ok());
  EXPECT_FALSE(decode(garbage, &f2).is_ok());
}

}  // namespace
}  // namespace slotstream::wire
