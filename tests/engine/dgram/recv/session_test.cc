#include "engine/dgram/recv/session.h"

#include <gtest/gtest.h>

#include <vector>

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;

Session::Config config(const char* protocol, std::vector<uint16_t> devices, uint32_t ring = 4,
                       uint64_t max_message = 1000) {
  Session::Config c;
  c.protocol = find_protocol(protocol);
  c.hello.protocol = protocol;
  c.hello.name = "s";
  c.hello.ring = ring;
  c.hello.max_message = max_message;
  c.hello.segment_size = 100;
  c.hello.devices = std::move(devices);
  c.message_timeout_ns = 200 * kMs;
  c.reliable_timeout_ns = 1000 * kMs;
  return c;
}

// The datagram a control payload travels in.
size_t control_size_of(const FinAck& p) { return kCommonSize + kUntaggedSize + encode_control(p).size() + kCrcSize; }

std::vector<std::byte> bytes(size_t n, int v) { return std::vector<std::byte>(n, std::byte(v)); }

void feed(Session& s, const SegmentHeader& h, const std::vector<std::byte>& payload, int64_t now) {
  std::vector<std::byte> d(kMaxHeaderSize + payload.size() + kMaxTrailerSize);
  d.resize(encode_segment(h, payload, d));
  auto seg = decode_segment(d);
  ASSERT_TRUE(seg);
  s.on_segment(*seg, d, now);
}

// A Write-Record segment of device index `i`'s message `msn` (STag ring slot msn % ring).
SegmentHeader wr(const Session& s, size_t i, uint32_t msn, uint64_t offset, bool last) {
  SegmentHeader h;
  h.opcode = Opcode::kWriteRecord;
  h.has_msn = true;
  h.stag = 1 + uint32_t(i * s.hello().ring + msn % s.hello().ring);
  h.msn = msn;
  h.offset = offset;
  h.last = last;
  return h;
}

SegmentHeader rd_send(uint32_t seq, uint16_t device, uint32_t msn, uint64_t offset, bool last) {
  SegmentHeader h;
  h.service = Service::kRD;
  h.opcode = Opcode::kSend;
  h.rd = RdFields{seq, 0, 0, kRdSeqValid, 0};
  h.queue = device;
  h.msn = msn;
  h.offset = offset;
  h.last = last;
  return h;
}

std::vector<Session::Ready> release(Session& s, int64_t now, uint64_t room = UINT64_MAX) {
  std::vector<Session::Ready> out;
  Session::Room r{room, nullptr};
  s.release(now, r, &out);
  return out;
}

Fin fin_part(const Session& s, size_t first, uint64_t messages) {
  Fin f;
  f.total = uint16_t(s.hello().devices.size());
  f.first = uint16_t(first);
  for (size_t i = first; i < s.hello().devices.size() && i < first + kFinPartDevices; ++i) {
    f.devices.push_back({s.hello().devices[i], messages, messages * 10});
  }
  return f;
}

// The 8 KB HELLO (4,096 devices x ring 256) cost 182 MB at once: now nothing until data.
TEST(DgramSession, AHelloAllocatesNothingPerDeviceOrStag) {
  std::vector<uint16_t> devices;
  for (uint32_t d = 0; d < 4096; ++d) devices.push_back(uint16_t(d));
  Session s(config("write_record", devices, 256, 64 << 10));
  EXPECT_EQ(s.devices_with_state(), 0u);
  EXPECT_EQ(s.stags_touched(), 0u);
  const Accept a = s.accept(7);
  EXPECT_EQ(a.devices, 4096);
  EXPECT_EQ(encode_control(a).size(), 24u);  // the same size for any device count
  feed(s, wr(s, 4095, 0, 0, true), bytes(10, 1), 0);
  EXPECT_EQ(s.devices_with_state(), 1u);
  EXPECT_EQ(s.stags_touched(), 1u);
  auto out = release(s, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device, 4095);
  EXPECT_TRUE(s.carried_data());
}

TEST(DgramSession, MessagesGoOutInOrderAndSegmentsOutsideTheRingsAreUnknown) {
  Session s(config("write_record", {3, 9}));
  feed(s, wr(s, 1, 1, 0, true), bytes(5, 2), 0);
  feed(s, wr(s, 1, 0, 0, false), bytes(5, 1), 0);
  EXPECT_TRUE(release(s, 1).empty());  // message 0 is not complete yet
  feed(s, wr(s, 1, 0, 5, true), bytes(5, 1), 2);
  auto out = release(s, 3);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].device, 9);
  EXPECT_EQ(out[0].msn, 0u);
  EXPECT_EQ(out[1].msn, 1u);
  SegmentHeader h = wr(s, 0, 0, 0, true);
  h.stag = 1 + 2 * 4;  // past the last device's ring
  feed(s, h, bytes(1, 1), 4);
  EXPECT_EQ(s.counters().unknown, 1u);
  EXPECT_EQ(s.device_accounts().at(9).complete, 2u);
}

TEST(DgramSession, ADuplicateWithOtherBytesLosesToTheFirst) {
  Session s(config("write_record", {0}));
  feed(s, wr(s, 0, 0, 0, false), bytes(10, 1), 0);
  feed(s, wr(s, 0, 0, 0, false), bytes(10, 0x66), 0);  // "INJECTED"
  feed(s, wr(s, 0, 0, 10, true), bytes(10, 2), 0);
  auto out = release(s, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].completion.data[0], std::byte{1});
  EXPECT_EQ(s.counters().conflicting, 1u);
}

// rd_write_record (issue 25): Write-Record segments under RD's sequence: one ahead of a hole waits in RD's
// buffer and is placed, at its tagged offset, once the hole is filled (the retransmission came).
TEST(DgramSession, WriteRecordOverRdPlacesAfterTheHoleIsFilled) {
  Session s(config("rd_write_record", {5}));
  EXPECT_TRUE(s.reliable());
  EXPECT_GT(s.accept(1).credits, 0u) << "RD grants credits in its ACCEPT";
  auto rd_wr = [&s](uint32_t seq, uint64_t offset, bool last) {
    SegmentHeader h = wr(s, 0, 0, offset, last);
    h.service = Service::kRD;
    h.rd = RdFields{seq, 0, 0, kRdSeqValid, 0};
    return h;
  };
  feed(s, rd_wr(1, 10, true), bytes(10, 2), 0);  // seq 0 was lost
  EXPECT_EQ(s.stags_touched(), 0u) << "ahead of a hole: buffered by RD, not placed";
  EXPECT_TRUE(release(s, 1).empty());
  feed(s, rd_wr(0, 0, false), bytes(10, 1), 2);  // the retransmission
  auto out = release(s, 3);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].partial);
  EXPECT_EQ(out[0].completion.data.size(), 20u);
  EXPECT_EQ(out[0].completion.data[0], std::byte{1});
  EXPECT_EQ(out[0].completion.data[19], std::byte{2});
  auto ack = s.take_ack();
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->ack, 2u);
  // A Write-Record segment over UD in an RD session is not its service: malformed.
  feed(s, wr(s, 0, 1, 0, true), bytes(1, 1), 4);
  EXPECT_EQ(s.counters().malformed, 1u);
}

// Protocol errors (issue 25): the first segment with a good CRC that the protocol cannot take is named by
// protocol_error(), which the receiver sends as TERMINATE. Loss, duplicates and stale segments are not errors.
TEST(DgramSession, ProtocolErrorsAreNamedForTerminate) {
  {
    Session s(config("write_record", {0}));
    feed(s, wr(s, 0, 0, 0, false), bytes(10, 1), 0);
    feed(s, wr(s, 0, 0, 0, false), bytes(10, 1), 0);  // a duplicate: fine
    EXPECT_FALSE(s.protocol_error());
    feed(s, wr(s, 0, 1, 995, false), bytes(10, 1), 0);  // past the 1000-byte region
    auto t = s.protocol_error();
    ASSERT_TRUE(t);
    EXPECT_EQ(t->code, TerminateCode::kPlacement);
    EXPECT_NE(t->reason.find("offset 995"), std::string::npos) << t->reason;
  }
  {
    Session s(config("write_record", {0}));
    SegmentHeader h = wr(s, 0, 0, 0, true);
    h.stag = 99;
    feed(s, h, bytes(1, 1), 0);
    ASSERT_TRUE(s.protocol_error());
    EXPECT_EQ(s.protocol_error()->reason, "STag 99 is not one of this session's");
  }
  {
    Session s(config("dgram_send", {0}));
    feed(s, wr(s, 0, 0, 0, true), bytes(1, 1), 0);  // Write-Record in a Send/Recv session
    ASSERT_TRUE(s.protocol_error());
    EXPECT_EQ(s.protocol_error()->code, TerminateCode::kProtocol);
    EXPECT_EQ(s.protocol_error()->reason, "opcode 8 is not an operation of protocol dgram_send");
  }
}

TEST(DgramSession, MoreCrcFailuresThanGoodDatagramsAreAnError) {
  Session s(config("write_record", {0}));
  s.counters().datagrams = 2 * Session::kCrcTerminateMin;
  s.counters().crc_errors = Session::kCrcTerminateMin;  // half: tolerated
  EXPECT_FALSE(s.protocol_error());
  ++s.counters().datagrams;
  ++s.counters().crc_errors;
  auto t = s.protocol_error();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->code, TerminateCode::kCrc);
  EXPECT_EQ(t->reason, "65 of 129 datagrams failed their CRC32C: the path corrupts more than it delivers");
  Session few(config("write_record", {0}));
  few.counters().datagrams = few.counters().crc_errors = Session::kCrcTerminateMin - 1;  // too few to judge
  EXPECT_FALSE(few.protocol_error());
}

// dgram_rd partial messages used to be kept for ever (77k one-byte segments: 337 MB held).
TEST(DgramSession, ReliableMessagesExpireAfterSilenceButNotUnderBackPressure) {
  Session s(config("dgram_rd", {0}, 4, 1 << 20));
  feed(s, rd_send(0, 0, 0, 0, false), bytes(1, 1), 0);
  EXPECT_EQ(s.next_deadline(), 1000 * kMs);
  feed(s, rd_send(1, 0, 0, 1, false), bytes(1, 1), 500 * kMs);  // a new byte: the timer starts over
  EXPECT_EQ(s.next_deadline(), 1500 * kMs);
  s.set_backpressure(true, 600 * kMs);
  EXPECT_EQ(s.next_deadline(), INT64_MAX);  // nothing to wait for while we hold the sender back
  EXPECT_TRUE(release(s, 3000 * kMs).empty());
  EXPECT_EQ(s.counters().expired, 0u);
  s.set_backpressure(false, 3000 * kMs);
  EXPECT_TRUE(release(s, 3999 * kMs).empty());
  EXPECT_TRUE(release(s, 4000 * kMs).empty());  // expired and dropped: Send has no partial messages
  EXPECT_EQ(s.counters().expired, 1u);
  EXPECT_EQ(s.device_accounts().at(0).dropped, 1u);
}

TEST(DgramSession, RdAcksGrantNoCreditsUnderBackPressure) {
  Session s(config("dgram_rd", {0}));
  EXPECT_FALSE(s.take_ack());
  feed(s, rd_send(0, 0, 0, 0, true), bytes(1, 1), 0);
  auto a = s.take_ack();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ack, 1u);
  EXPECT_EQ(a->credits, 512u);
  EXPECT_FALSE(s.take_ack());
  s.set_backpressure(true, 0);
  a = s.take_ack();  // a window update
  ASSERT_TRUE(a);
  EXPECT_EQ(a->credits, 0u);
  feed(s, rd_send(5000, 0, 1, 0, true), bytes(1, 1), 0);
  EXPECT_EQ(s.counters().rd_beyond_window, 1u);
}

// A udp sender with 1,600 devices never got its FIN_ACK (one datagram of 67 KB).
TEST(DgramSession, FinAndFinAckTravelInPartsForAnyDeviceCount) {
  std::vector<uint16_t> devices;
  for (uint16_t d = 0; d < 1600; ++d) devices.push_back(d);
  Session s(config("dgram_send", devices));
  for (size_t first = 0; first < devices.size(); first += kFinPartDevices) {
    EXPECT_FALSE(s.fin_complete());
    ASSERT_TRUE(s.on_fin(fin_part(s, first, 0), 0));
  }
  EXPECT_TRUE(s.fin_complete());
  EXPECT_TRUE(s.all_released());
  const auto parts = s.fin_ack_parts();
  ASSERT_EQ(parts.size(), 25u);
  for (const auto& p : parts) {
    EXPECT_LE(control_size_of(p), kMaxUdpPayload);
    EXPECT_LE(encode_control(p).size(), 0xFFFFu);  // one frame over TCP, too
  }
  EXPECT_EQ(parts.back().devices.back().device, 1599);
  EXPECT_EQ(s.devices_with_state(), 0u);  // nothing was sent: nothing to keep
}

TEST(DgramSession, AFinThatDoesNotMatchTheHelloIsRefused) {
  Session s(config("dgram_send", {1, 2, 3}));
  Fin f = fin_part(s, 0, 1);
  f.devices[1].device = 7;
  EXPECT_FALSE(s.on_fin(f, 0));
  f = fin_part(s, 0, 1);
  f.total = 4;
  EXPECT_FALSE(s.on_fin(f, 0));
  f = fin_part(s, 0, uint64_t(1) << 40);  // more messages than a session can number
  EXPECT_FALSE(s.on_fin(f, 0));
  EXPECT_EQ(s.counters().malformed, 3u);
  EXPECT_FALSE(s.fin_complete());
}

// A FIN claiming 2^32 - 1 messages per device is accounted in one step, not four billion.
TEST(DgramSession, AHugeFinCountIsLostInOneRun) {
  Session s(config("write_record", {0}));
  ASSERT_TRUE(s.on_fin(fin_part(s, 0, UINT32_MAX), 0));
  EXPECT_TRUE(release(s, 0).empty());
  EXPECT_TRUE(release(s, 200 * kMs).empty());
  EXPECT_TRUE(s.all_released());
  EXPECT_EQ(s.device_accounts().at(0).lost, UINT32_MAX);
  EXPECT_EQ(s.fin_ack_part(0).devices[0].counts.lost, UINT32_MAX);
}

TEST(DgramSession, UnreliableMessagesBeyondTheStoreRoomAreDroppedAndCounted) {
  Session s(config("dgram_send", {0}));
  SegmentHeader h;
  h.opcode = Opcode::kSend;
  h.queue = 0;
  for (uint32_t m = 0; m < 3; ++m) {
    h.msn = m;
    feed(s, h, bytes(100, 1), 0);
  }
  auto out = release(s, 0, 250);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(s.device_accounts().at(0).dropped, 1u);
}

// recv --hold-block over udp: a held slot keeps its message, and the device's later ones, back.
TEST(DgramSession, AHeldSlotKeepsItsMessageAndTheDevicesLaterOnesBack) {
  Session s(config("write_record", {0, 1}, 2));
  s.hold(0, true);
  s.hold(7, true);  // past the ring: ignored
  EXPECT_EQ(s.held_slots(), 1u);
  for (uint32_t m = 0; m < 3; ++m) feed(s, wr(s, 0, m, 0, true), bytes(5, int(m)), 0);
  feed(s, wr(s, 1, 1, 0, true), bytes(5, 9), 0);  // device 1's message 1 waits behind its message 0
  EXPECT_TRUE(release(s, 1).empty());
  s.hold(0, false);
  auto out = release(s, 2);
  ASSERT_EQ(out.size(), 3u);
  for (uint32_t m = 0; m < 3; ++m) EXPECT_EQ(out[m].msn, m);
  EXPECT_EQ(s.device_accounts().at(0).complete, 3u);
}

}  // namespace
}  // namespace slotstream::dgram
