#include "engine/dgram/wire/control.h"

#include <gtest/gtest.h>

namespace slotstream::dgram {
namespace {

Hello hello(std::string protocol, std::string name, uint32_t ring, uint64_t max, uint32_t seg,
            std::vector<uint16_t> devices) {
  Hello h;
  h.protocol = std::move(protocol);
  h.name = std::move(name);
  h.ring = ring;
  h.max_message = max;
  h.segment_size = seg;
  h.devices = std::move(devices);
  return h;
}

void push(std::vector<uint8_t>& v, std::initializer_list<uint8_t> b) { v.insert(v.end(), b); }
void push(std::vector<uint8_t>& v, const std::string& s) { v.insert(v.end(), s.begin(), s.end()); }

TEST(DgramControl, HelloLayoutIsPinned) {
  Hello h = hello("write_record", "cam", 4, 0x0102030405060708, 8192, {1, 0x0203});
  h.flags = kHelloAuth;
  for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = uint8_t(0xA0 + i);
  h.padding = 3;
  std::vector<uint8_t> want = {1, 1, 12};
  push(want, "write_record");
  push(want, {3});
  push(want, "cam");
  push(want, {4, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 0x00, 0x20, 0, 0, 2, 0, 1, 0, 3, 2});
  for (size_t i = 0; i < 32; ++i) want.push_back(uint8_t(0xA0 + i));
  push(want, {3, 0, 0, 0, 0});
  EXPECT_EQ(encode_control(h), want);
}

TEST(DgramControl, AcceptChallengeAuthLayoutsArePinned) {
  Accept a{0x04030201, 512, 0x100000, 1, 2, {}};
  EXPECT_EQ(encode_control(a),
            (std::vector<uint8_t>{2, 1, 2, 3, 4, 0, 2, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0}));
  a.proof.assign(32, 7);
  auto b = encode_control(a);
  ASSERT_EQ(b.size(), 24u + 32);
  EXPECT_EQ(b[23], 32);
  Challenge c;
  c.nonce.fill(9);
  auto cb = encode_control(c);
  ASSERT_EQ(cb.size(), 33u);
  EXPECT_EQ(cb[0], 6);
  EXPECT_EQ(cb[32], 9);
  Auth au;
  au.receiver_nonce.fill(1);
  au.hello = {5, 6};
  au.proof.fill(2);
  auto ab = encode_control(au);
  ASSERT_EQ(ab.size(), 1u + 32 + 2 + 2 + 32);
  EXPECT_EQ(ab[0], 7);
  EXPECT_EQ(ab[33], 2);  // u16 hello length
  EXPECT_EQ(ab[35], 5);
  EXPECT_EQ(ab[37], 2);
}

TEST(DgramControl, FinAndFinAckPartsArePinned) {
  Fin f{3, 1, {{0x0201, 5, 6}}, 2};
  EXPECT_EQ(encode_control(f), (std::vector<uint8_t>{4, 3, 0, 1, 0, 1, 0, 1, 2, 5, 0, 0, 0, 0, 0,
                                                     0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0}));
  FinAck k{3, 1, {{7, DeliveryCounts{1, 2, 3, 4, 5}}}};
  auto b = encode_control(k);
  ASSERT_EQ(b.size(), 7u + 42);
  EXPECT_EQ(b[0], 5);
  EXPECT_EQ(b[7], 7);
  EXPECT_EQ(b[9], 1);
  EXPECT_EQ(b[41], 5);
}

TEST(DgramControl, AFinPartIsPaddedToItsAnswer) {
  for (size_t n : {size_t(1), size_t(17), kFinPartDevices}) {
    Fin f;
    f.total = uint16_t(n);
    f.devices.resize(n);
    f.padding = fin_padding(n);
    FinAck k;
    k.total = uint16_t(n);
    k.devices.resize(n);
    EXPECT_GE(encode_control(f).size(), encode_control(k).size()) << n;
  }
}

TEST(DgramControl, RoundTrips) {
  Hello h = hello("dgram_rd", "edge-a", 2, 1u << 20, 1400, {0, 1, 65535});
  h.padding = 200;
  EXPECT_EQ(decode_hello(encode_control(h)), h);
  Accept a{7, 512, 1u << 20, 1, 3, std::vector<uint8_t>(32, 4)};
  EXPECT_EQ(decode_accept(encode_control(a)), a);
  Refuse r{"already connected"};
  EXPECT_EQ(decode_refuse(encode_control(r)), r);
  Fin f{2, 0, {{0, 10, 1000}, {3, 0, 0}}, fin_padding(2)};
  EXPECT_EQ(decode_fin(encode_control(f)), f);
  FinAck k{1, 0, {{0, DeliveryCounts{7, 1, 1, 1, 900}}}};
  EXPECT_EQ(decode_fin_ack(encode_control(k)), k);
  Challenge c;
  c.nonce.fill(3);
  EXPECT_EQ(decode_challenge(encode_control(c)), c);
  Auth au;
  au.hello = encode_control(h);
  au.proof.fill(8);
  EXPECT_EQ(decode_auth(encode_control(au)), au);
}

TEST(DgramControl, RejectsMalformed) {
  auto b = encode_control(Fin{1, 0, {{0, 10, 1000}}, 0});
  EXPECT_FALSE(decode_fin(std::span(b).first(b.size() - 1)));  // truncated
  b.push_back(0);
  EXPECT_FALSE(decode_fin(b));                        // trailing bytes
  EXPECT_FALSE(decode_hello(encode_control(Fin{})));  // another type
  std::vector<uint8_t> unknown = {9};
  EXPECT_FALSE(control_type(unknown));
  EXPECT_FALSE(control_type({}));
  // A part of more than kFinPartDevices devices, or reaching past the total.
  EXPECT_FALSE(decode_fin(std::vector<uint8_t>{4, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF}));
  EXPECT_FALSE(decode_fin(encode_control(Fin{1, 1, {{0, 1, 1}}, 0})));
  // Padding must be zeros.
  auto p = encode_control(Fin{1, 0, {{0, 1, 1}}, 2});
  p.back() = 1;
  EXPECT_FALSE(decode_fin(p));
  // Unknown HELLO flags, a proof of the wrong length.
  auto hb = encode_control(hello("write_record", "a", 1, 1, 1, {0}));
  hb[1] = 2;
  EXPECT_FALSE(decode_hello(hb));
  auto ab = encode_control(Accept{1, 0, 1, 1, 1, {}});
  ab.back() = 5;
  ab.insert(ab.end(), 5, 0);
  EXPECT_FALSE(decode_accept(ab));
}

// ANNOUNCE (issue 25): a multicast sender's HELLO and first STag in one, answered by no one.
TEST(DgramControl, AnnounceLayoutIsPinned) {
  Announce a;
  a.first_stag = 0x01020304;
  a.hello = hello("write_record", "m", 2, 1000, 1400, {7});
  const std::vector<uint8_t> inner = encode_control(a.hello);
  std::vector<uint8_t> want = {8, 4, 3, 2, 1, uint8_t(inner.size()), 0};
  want.insert(want.end(), inner.begin(), inner.end());
  EXPECT_EQ(encode_control(a), want);
  EXPECT_EQ(control_type(want), ControlType::kAnnounce);
  EXPECT_EQ(decode_announce(want), a);
  a.hello.flags = kHelloAuth;  // no handshake, no token
  EXPECT_FALSE(decode_announce(encode_control(a)));
  want.push_back(0);
  EXPECT_FALSE(decode_announce(want));
}

// TERMINATE (issue 25): RDMAP opcode 7 on queue 2, payload u8 layer | u8 code | str8 reason.
TEST(DgramControl, TerminateLayoutIsPinned) {
  const Terminate t{TerminateLayer::kDdp, TerminateCode::kPlacement, "off"};
  EXPECT_EQ(encode_terminate(t), (std::vector<uint8_t>{1, 2, 3, 'o', 'f', 'f'}));
  EXPECT_EQ(decode_terminate(encode_terminate(t)), t);
  const SegmentHeader h = terminate_header(false, 5);
  EXPECT_EQ(h.opcode, Opcode::kTerminate);
  EXPECT_EQ(h.service, Service::kUD);
  EXPECT_EQ(h.queue, kTerminateQueue);
  EXPECT_EQ(kTerminateQueue, 2u);
  EXPECT_EQ(terminate_header(true, 0).service, Service::kRC);
  // The whole segment: 12 common + 12 untagged + 6 payload + 4 CRC; it decodes as a Terminate.
  std::vector<std::byte> d(64);
  const auto payload = encode_terminate(t);
  d.resize(encode_segment(h, std::as_bytes(std::span(payload)), d));
  EXPECT_EQ(d.size(), 34u);
  EXPECT_EQ(std::to_integer<int>(d[4]), 0x47);  // RV 1, opcode 7
  auto seg = decode_segment(d);
  ASSERT_TRUE(seg);
  EXPECT_EQ(seg->header.opcode, Opcode::kTerminate);
  EXPECT_EQ(seg->header.queue, 2u);
  EXPECT_EQ(describe(t), "placement out of range: off");
  // A long reason is cut to what a str8 holds.
  EXPECT_EQ(decode_terminate(encode_terminate({TerminateLayer::kLlp, TerminateCode::kCrc, std::string(300, 'x')}))
                ->reason.size(),
            255u);
}

TEST(DgramControl, TerminateRejectsUnknownLayersAndCodes) {
  EXPECT_FALSE(decode_terminate(std::vector<uint8_t>{3, 1, 0}));       // layer 3
  EXPECT_FALSE(decode_terminate(std::vector<uint8_t>{0, 0, 0}));       // code 0
  EXPECT_FALSE(decode_terminate(std::vector<uint8_t>{0, 6, 0}));       // code 6
  EXPECT_FALSE(decode_terminate(std::vector<uint8_t>{0, 1, 2, 'a'}));  // short reason
  EXPECT_FALSE(decode_terminate(std::vector<uint8_t>{0, 1, 0, 0}));    // trailing byte
  EXPECT_FALSE(decode_terminate(std::vector<uint8_t>{}));
  EXPECT_TRUE(decode_terminate(std::vector<uint8_t>{2, 5, 0}));
}

}  // namespace
}  // namespace slotstream::dgram
