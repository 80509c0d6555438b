#include "wire/control.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace slotstream::wire {
namespace {

Hello sample_hello() {
  Hello h;
  h.protocol = "status_byte";
  h.blocks = 32;
  h.block_size = 1 << 20;
  h.transport = Transport::kTcp;
  h.rdma_transport = RdmaTransport::kDc;
  h.offers = kOfferRdma;
  h.host_id = "boot@host";
  h.shm_domain = "ipc=4026531839,uid=0";
  h.name = "edge-1";
  h.devices = {0, 7, 65535};
  h.group = 0x1122334455667788ull;
  h.lane = 2;
  h.lanes = 3;
  h.options = "budget=2M";
  for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = uint8_t(i * 7);
  return h;
}

TEST(Control, HelloRoundTrips) {
  Hello out;
  ASSERT_TRUE(decode(encode(sample_hello()), &out).is_ok());
  EXPECT_EQ(out.protocol, "status_byte");
  EXPECT_EQ(out.blocks, 32u);
  EXPECT_EQ(out.block_size, 1u << 20);
  EXPECT_EQ(out.transport, Transport::kTcp);
  EXPECT_EQ(out.rdma_transport, RdmaTransport::kDc);
  EXPECT_EQ(out.offers, kOfferRdma);
  EXPECT_EQ(out.host_id, "boot@host");
  EXPECT_EQ(out.shm_domain, "ipc=4026531839,uid=0");
  EXPECT_EQ(out.name, "edge-1");
  EXPECT_EQ(out.devices, (std::vector<uint16_t>{0, 7, 65535}));
  EXPECT_EQ(out.group, 0x1122334455667788ull);
  EXPECT_EQ(out.lane, 2);
  EXPECT_EQ(out.lanes, 3);
  EXPECT_EQ(out.options, "budget=2M");
  EXPECT_EQ(out.nonce, sample_hello().nonce);
}

TEST(Control, HelloCarriesFlagsAndFirstMessageNumbersBeforeTheNonce) {
  Hello h = sample_hello();
  auto plain = encode(h);
  EXPECT_EQ(plain[plain.size() - 33], 0);  // no flags: nothing between lanes and the nonce
  h.flags = kHelloNumbered | kHelloConfirm;
  h.first = {5, 0, 0x0102030405060708ull};
  auto b = encode(h);
  ASSERT_EQ(b.size(), plain.size() + 3 * 8);
  EXPECT_EQ(b[plain.size() - 33], 3);
  EXPECT_EQ(b[b.size() - 32 - 8], 0x08);  // the last device's number, u64 LE, just before the nonce
  EXPECT_EQ(b[b.size() - 32 - 1], 0x01);
  Hello out;
  ASSERT_TRUE(decode(b, &out).is_ok());
  EXPECT_EQ(out.flags, kHelloNumbered | kHelloConfirm);
  EXPECT_EQ(out.first, h.first);
  EXPECT_EQ(out.nonce, h.nonce);
  // Confirm alone carries no numbers; an unknown flag is refused, not ignored.
  h.flags = kHelloConfirm;
  ASSERT_TRUE(decode(encode(h), &out).is_ok());
  EXPECT_TRUE(out.first.empty());
  h.flags = 4;
  EXPECT_EQ(decode(encode(h), &out).code(), Code::kProtocolError);
}

TEST(Control, StoredIsPinnedAndItsDevicesAscend) {
  Stored s;
  s.devices[2] = {10, 3};
  s.devices[513] = {0, 1};
  auto b = encode(s);
  std::vector<uint8_t> want = {2, 0, 2, 0, 10, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0,
                               0, 1, 2, 0, 0,  0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(b, want);
  Stored out;
  ASSERT_TRUE(decode(b, &out).is_ok());
  EXPECT_EQ(out.devices.at(2).first, 10u);
  EXPECT_EQ(out.devices.at(513).stored, 1u);
  // The same device twice, or out of order: refused.
  auto bad = b;
  std::copy(b.begin() + 2, b.begin() + 20, bad.begin() + 20);
  EXPECT_EQ(decode(bad, &out).code(), Code::kProtocolError);
  bad.pop_back();
  EXPECT_FALSE(decode(bad, &out).is_ok());
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
  EXPECT_EQ(b[4], 8);  // version, little-endian (8: KEEPALIVE)
  EXPECT_EQ(b[5], 0);
  // ... the protocol name, then its options, and the sender's nonce last.
  EXPECT_EQ(b[6], 11);
  EXPECT_EQ(std::string(b.begin() + 7, b.begin() + 18), "status_byte");
  EXPECT_EQ(b[18], 9);
  EXPECT_EQ(b[19], 0);
  EXPECT_EQ(std::string(b.begin() + 20, b.begin() + 29), "budget=2M");
  EXPECT_TRUE(std::equal(b.end() - 32, b.end(), sample_hello().nonce.begin()));
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

  // After magic, version, protocol, options, blocks and size: transport, rdma transport, offers.
  constexpr size_t kTransportAt = 4 + 2 + 1 + 11 + 2 + 9 + 8;
  EXPECT_EQ(b[kTransportAt], 2);
  EXPECT_EQ(b[kTransportAt + 1], 2);  // dc
  EXPECT_EQ(b[kTransportAt + 2], kOfferRdma);
  EXPECT_EQ(b[kTransportAt + 3], 9);  // the host id's length
  for (auto [at, value] : {std::pair{kTransportAt, 4}, {kTransportAt + 1, 4}, {kTransportAt + 2, 4}}) {
    bad = b;
    bad[at] = uint8_t(value);  // an unknown transport, rdma transport, offer bit
    st = decode(bad, &out);
    EXPECT_EQ(st.code(), Code::kProtocolError) << at;
    EXPECT_NE(st.message().find("unknown"), std::string::npos) << st.message();
  }
}

TEST(Control, ARdmaHelloAndAcceptRoundTripWithTheirReason) {
  Hello h = sample_hello();
  h.transport = Transport::kRdma;
  h.rdma_transport.reset();  // whichever the receiver serves
  h.offers = kOfferShm | kOfferRdma;
  Hello out;
  ASSERT_TRUE(decode(encode(h), &out).is_ok());
  EXPECT_EQ(out.transport, Transport::kRdma);
  EXPECT_EQ(out.rdma_transport, std::nullopt);
  EXPECT_EQ(out.offers, kOfferShm | kOfferRdma);

  Accept a;
  a.transport = Transport::kRdma;
  a.rdma_transport = RdmaTransport::kRc;
  a.offers = kOfferRdma;
  a.reason = "both ends have a usable RDMA device";
  a.worker_address = {1, 2};
  const auto body = encode(a);
  // transport, rdma transport, offers, then the reason (str16).
  EXPECT_EQ(body[0], 3);
  EXPECT_EQ(body[1], 1);
  EXPECT_EQ(body[2], kOfferRdma);
  EXPECT_EQ(body[3] | body[4] << 8, int(a.reason.size()));
  Accept back;
  ASSERT_TRUE(decode(body, &back).is_ok());
  EXPECT_EQ(back.transport, Transport::kRdma);
  EXPECT_EQ(back.rdma_transport, RdmaTransport::kRc);
  EXPECT_EQ(back.reason, a.reason);
  // An rdma transport goes with rdma, and only with it.
  auto bad = body;
  bad[1] = 0;
  EXPECT_EQ(decode(bad, &back).code(), Code::kProtocolError);
  bad = body;
  bad[0] = encode_transport(Transport::kTcp);
  EXPECT_EQ(decode(bad, &back).code(), Code::kProtocolError);
}

TEST(Control, TransportCodesArePinnedAndUnknownOnesRefused) {
  // The one conversion between slotstream::Transport and its byte on the wire.
  EXPECT_EQ(encode_transport(Transport::kAuto), 0);
  EXPECT_EQ(encode_transport(Transport::kShm), 1);
  EXPECT_EQ(encode_transport(Transport::kTcp), 2);
  EXPECT_EQ(encode_transport(Transport::kRdma), 3);
  for (Transport t : {Transport::kAuto, Transport::kShm, Transport::kTcp, Transport::kRdma}) {
    EXPECT_EQ(decode_transport(encode_transport(t)), t);
  }
  for (int code = 4; code < 256; ++code) EXPECT_FALSE(decode_transport(uint8_t(code)).has_value()) << code;
  // RDMA transports: 0 unset, rc 1, dc 2, ud 3.
  EXPECT_EQ(encode_rdma_transport(std::nullopt), 0);
  EXPECT_EQ(encode_rdma_transport(RdmaTransport::kRc), 1);
  EXPECT_EQ(encode_rdma_transport(RdmaTransport::kDc), 2);
  EXPECT_EQ(encode_rdma_transport(RdmaTransport::kUd), 3);
  for (int code = 0; code < 256; ++code) {
    std::optional<RdmaTransport> t = RdmaTransport::kUd;
    EXPECT_EQ(decode_rdma_transport(uint8_t(code), &t), code <= 3) << code;
    if (code <= 3) EXPECT_EQ(encode_rdma_transport(t), code);
  }
  // An ACCEPT must name the transport chosen: auto is refused there.
  Accept a;
  a.worker_address = {1};
  auto body = encode(a);
  body[0] = encode_transport(Transport::kAuto);
  Accept out;
  EXPECT_EQ(decode(body, &out).code(), Code::kProtocolError);
}

TEST(Control, FrameHasLengthPrefix) {
  std::vector<uint8_t> body = {1, 2, 3};
  auto f = encode_frame(MsgType::kFin, body);
  ASSERT_EQ(f.size(), 8u);
  EXPECT_EQ(f[0], 4);  // type + body
  EXPECT_EQ(f[4], uint8_t(MsgType::kFin));
}

TEST(Control, OtherMessagesRoundTrip) {
  Accept a;
  a.worker_address = {1, 2, 3};
  a.setup = {9, 8};
  Accept a2;
  ASSERT_TRUE(decode(encode(a), &a2).is_ok());
  EXPECT_EQ(a2.worker_address, a.worker_address);
  EXPECT_EQ(a2.setup, a.setup);
  EXPECT_TRUE(a2.proof.empty());
  a.proof.assign(kMacSize, 0x5a);
  ASSERT_TRUE(decode(encode(a), &a2).is_ok());
  EXPECT_EQ(a2.proof, a.proof);
  // The proof covers everything before it: the signed part is the encoding minus the proof.
  auto signed_bytes = signed_part(a);
  auto whole = encode(a);
  EXPECT_TRUE(std::equal(signed_bytes.begin(), signed_bytes.end(), whole.begin()));
  EXPECT_EQ(whole.size(), signed_bytes.size() + 1 + kMacSize);
  a.proof.assign(5, 1);  // neither empty nor a MAC
  EXPECT_EQ(decode(encode(a), &a2).code(), Code::kProtocolError);

  wire::Setup su{{4, 5}, {6}, std::vector<uint8_t>(kMacSize, 1)}, su2;
  ASSERT_TRUE(decode(encode(su), &su2).is_ok());
  EXPECT_EQ(su2.worker_address, su.worker_address);
  EXPECT_EQ(su2.setup, su.setup);
  EXPECT_EQ(su2.proof, su.proof);
  auto su_bytes = encode(su);
  su_bytes.pop_back();
  EXPECT_FALSE(decode(su_bytes, &su2).is_ok());

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

  Pause pz{513, true}, pz2;
  auto pb = encode(pz);
  EXPECT_EQ(pb, (std::vector<uint8_t>{0x01, 0x02, 0x01}));  // u16 LE device, u8 flag
  ASSERT_TRUE(decode(pb, &pz2).is_ok());
  EXPECT_EQ(pz2.device, 513);
  EXPECT_TRUE(pz2.paused);
  pb[2] = 2;
  EXPECT_FALSE(decode(pb, &pz2).is_ok());

  std::vector<uint8_t> garbage = {0xff, 0xff, 0xff};
  EXPECT_FALSE(decode(garbage, &a2).is_ok());
  EXPECT_FALSE(decode(garbage, &f2).is_ok());
}

}  // namespace
}  // namespace slotstream::wire

namespace slotstream::wire {
namespace {

// Found by fuzz/control_frame_fuzz.cc: a REFUSE whose code was 0 (kOk) made ControlSocket::expect
// return success, and the caller went on with an empty body.
TEST(Control, ARefuseIsAnErrorWhateverCodeThePeerWrote) {
  for (uint16_t code : {uint16_t(0), uint16_t(1), uint16_t(999)}) {
    std::vector<uint8_t> body = {uint8_t(code), uint8_t(code >> 8), 2, 0, 'n', 'o'};
    Refuse r;
    ASSERT_TRUE(decode(body, &r).is_ok());
    EXPECT_EQ(r.code, Code::kRefused) << "code " << code;
    EXPECT_EQ(r.message, "no");
  }
  Refuse busy;
  ASSERT_TRUE(decode(encode(Refuse{Code::kBusy, "later"}), &busy).is_ok());
  EXPECT_EQ(busy.code, Code::kBusy);  // real error codes are kept
}

}  // namespace
}  // namespace slotstream::wire

namespace slotstream::wire {
namespace {

static_assert(kProtocolVersion == 8, "version 8: KEEPALIVE (7: NUMBER/NUMBERED, 6: signed frames)");
static_assert(uint8_t(MsgType::kNumber) == 14 && uint8_t(MsgType::kNumbered) == 15 &&
                  uint8_t(MsgType::kKeepalive) == 16,
              "types on the wire");

// Version 8: a receiver that has sent nothing for kKeepaliveInterval says it is alive. Its frame is
// the type alone; a body is refused (no silent forward compatibility).
TEST(Control, KeepaliveIsAnEmptyFrame) {
  EXPECT_EQ(encode_frame(MsgType::kKeepalive, {}), (std::vector<uint8_t>{1, 0, 0, 0, 16}));
  EXPECT_TRUE(decode_keepalive({}).is_ok());
  const std::vector<uint8_t> body = {0};
  Status st = decode_keepalive(body);
  EXPECT_EQ(st.code(), Code::kProtocolError);
  EXPECT_NE(st.message().find("keepalive"), std::string::npos);
}

// Version 7: a device starts again at a number of the sender's on a connection that stays open (the
// edge's per-device moves, src/platform). The layouts, byte for byte.
TEST(Control, NumberAndNumberedLayouts) {
  const auto nb = encode(Number{513, 0x0102030405060708ull});
  EXPECT_EQ(nb, (std::vector<uint8_t>{0x01, 0x02, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01}));
  Number n;
  ASSERT_TRUE(decode(nb, &n).is_ok());
  EXPECT_EQ(n.device, 513);
  EXPECT_EQ(n.number, 0x0102030405060708ull);
  for (size_t cut = 0; cut < nb.size(); ++cut) {
    EXPECT_FALSE(decode(std::span(nb).first(cut), &n).is_ok()) << "accepted a NUMBER cut at " << cut;
  }
  auto longer = nb;
  longer.push_back(0);
  EXPECT_FALSE(decode(longer, &n).is_ok());

  const auto ab = encode(Numbered{7, 42, false, "no"});
  EXPECT_EQ(ab, (std::vector<uint8_t>{7, 0, 42, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 'n', 'o'}));
  Numbered a;
  ASSERT_TRUE(decode(ab, &a).is_ok());
  EXPECT_EQ(a.device, 7);
  EXPECT_EQ(a.number, 42u);
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.message, "no");
  ASSERT_TRUE(decode(encode(Numbered{7, 42, true, ""}), &a).is_ok());
  EXPECT_TRUE(a.ok);
  auto bad = ab;
  bad[10] = 2;  // the flag is 0 or 1
  EXPECT_FALSE(decode(bad, &a).is_ok());
}
static_assert(kFrameTrailer == 40, "u64 sequence + HMAC-SHA256");

// Issue 19: the receiver must always be told every device's count, so a FIN of the most devices a
// connection may declare fits one frame (signed, too), and a FIN beyond that, or one that counts a
// device twice, is refused rather than silently merged.
TEST(Control, AFinOfEveryDeviceFitsOneSignedFrameAndNoMoreDevicesAreTaken) {
  Fin all;
  for (uint32_t d = 0; d < kMaxDevices; ++d) all.messages[uint16_t(d * 16)] = UINT64_MAX - d;
  const auto body = encode(all);
  EXPECT_LE(1 + body.size() + kFrameTrailer, kMaxFrame);
  Fin back;
  ASSERT_TRUE(decode(body, &back).is_ok());
  EXPECT_EQ(back.messages, all.messages);

  std::vector<uint8_t> too_many = {uint8_t((kMaxDevices + 1) & 0xff), uint8_t((kMaxDevices + 1) >> 8)};
  for (uint32_t d = 0; d <= kMaxDevices; ++d) {
    too_many.insert(too_many.end(), {uint8_t(d), uint8_t(d >> 8), 1, 0, 0, 0, 0, 0, 0, 0});
  }
  EXPECT_EQ(decode(too_many, &back).code(), Code::kProtocolError);

  const std::vector<uint8_t> twice = {2, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  Status st = decode(twice, &back);
  EXPECT_EQ(st.code(), Code::kProtocolError);
  EXPECT_NE(st.message().find("twice"), std::string::npos) << st.message();
}

// The same for STORED (control version 3): 18 bytes a device, so 4,096 devices do not fit one frame
// (an oversize frame the sender refused as garbage); they go as several, each device once.
TEST(Control, AStoredOfEveryDeviceIsSplitIntoFramesThatFitAndCarryEachDeviceOnce) {
  Stored all;
  for (uint32_t d = 0; d < kMaxDevices; ++d) all.devices[uint16_t(d)] = {d * 10ull, d + 1ull};
  const auto bodies = split_stored(all);
  ASSERT_EQ(bodies.size(), 2u);
  Stored back;
  for (const auto& body : bodies) {
    EXPECT_LE(1 + body.size() + kFrameTrailer, kMaxFrame);
    Stored part;
    ASSERT_TRUE(decode(body, &part).is_ok());
    for (const auto& [d, c] : part.devices) EXPECT_TRUE(back.devices.emplace(d, c).second) << "device " << d;
  }
  ASSERT_EQ(back.devices.size(), all.devices.size());
  EXPECT_EQ(back.devices.at(4095).first, 40950u);
  EXPECT_EQ(split_stored(Stored{}).size(), 1u);  // an empty STORED is still sent (and valid)
}

}  // namespace
}  // namespace slotstream::wire
