#include "engine/dgram/recv/handshake.h"

#include <gtest/gtest.h>

#include "engine/dgram/send/sender.h"
#include "engine/hello_rules.h"

namespace slotstream::dgram {
namespace {

Hello good() {
  Hello h;
  h.protocol = "write_record";
  h.name = "edge-a";
  h.ring = 32;
  h.max_message = 921'600;
  h.segment_size = 8192;
  for (uint16_t d = 0; d < 12; ++d) h.devices.push_back(d);
  return h;
}

std::optional<std::string> check(const Hello& h, HelloLimits l = {}) {
  HelloTerms t;
  return check_hello(h, l, &t);
}

TEST(DgramHandshake, AcceptsAGoodHelloAndChargesItsWorstCase) {
  HelloTerms t;
  ASSERT_EQ(check_hello(good(), {}, &t), std::nullopt);
  EXPECT_EQ(t.protocol->name, "write_record");
  // 12 devices x 32 STags x 921,600 B, plus bookkeeping.
  EXPECT_GE(t.reservation, 12ull * 32 * 921'600);
  EXPECT_LT(t.reservation, 12ull * 32 * 921'600 + (1 << 20));
}

// The sender says what its receiver would refuse, in the receiver's words, before it sends a HELLO.
TEST(DgramHandshake, TheSenderChecksItsDevicesByTheSameRules) {
  DatagramSenderOptions o;
  o.devices = {2, 5, 2};
  EXPECT_EQ(DatagramSender::validate(o).message(), "device 2 is listed twice");
  o.devices.clear();
  EXPECT_EQ(DatagramSender::validate(o).message(), "no devices: a sender declares 1..4096 devices");
  o.devices = {2, 5};
  EXPECT_TRUE(DatagramSender::validate(o).is_ok());
}

TEST(DgramHandshake, RefusesEachBound) {
  auto with = [](auto change) {
    Hello h = good();
    change(h);
    return check(h);
  };
  EXPECT_NE(with([](Hello& h) { h.protocol = "status_byte"; }), std::nullopt);
  EXPECT_NE(with([](Hello& h) { h.name = "../x"; }), std::nullopt);
  EXPECT_NE(with([](Hello& h) { h.devices.clear(); }), std::nullopt);
  EXPECT_EQ(with([](Hello& h) { h.devices.push_back(3); }), "device 3 is listed twice");
  EXPECT_NE(with([](Hello& h) { h.ring = 0; }), std::nullopt);
  EXPECT_NE(with([](Hello& h) { h.ring = 257; }), std::nullopt);
  EXPECT_NE(with([](Hello& h) { h.max_message = (64ull << 20) + 1; }), std::nullopt);
  EXPECT_NE(with([](Hello& h) { h.segment_size = 0; }), std::nullopt);
  EXPECT_NE(with([](Hello& h) { h.segment_size = kMaxSegmentPayload + 1; }), std::nullopt);
  HelloLimits tcp;
  tcp.over_tcp = true;
  EXPECT_EQ(check(good(), tcp), "protocol write_record runs over UDP");
}

TEST(DgramHandshake, AuthenticationIsAskedForExactlyWhenTheReceiverHasAToken) {
  HelloLimits token;
  token.token = true;
  EXPECT_NE(check(good(), token), std::nullopt);  // no token on the sender
  Hello h = good();
  h.flags = kHelloAuth;
  EXPECT_EQ(check(h, token), std::nullopt);
  EXPECT_NE(check(h), std::nullopt);  // a sender with a token, a receiver without
}

// The HELLO: 4,096 devices x ring 256. Nothing is allocated for it; what it may come to
// hold is charged, and against a budget it is refused with the numbers.
TEST(DgramHandshake, AHugeHelloIsChargedItsWorstCaseAndRefusedByTheBudget) {
  Hello h = good();
  h.devices.clear();
  for (uint32_t d = 0; d < 4096; ++d) h.devices.push_back(uint16_t(d));
  h.ring = 256;
  h.max_message = 64 << 10;
  HelloTerms t;
  ASSERT_EQ(check_hello(h, {}, &t), std::nullopt);
  EXPECT_GE(t.reservation, 4096ull * 256 * (64 << 10));
  auto why = engine::check_budget(t.reservation, 0, 6ull << 30);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("not enough receiver memory"), std::string::npos);
  EXPECT_NE(why->find("--max-memory"), std::string::npos);
  EXPECT_EQ(engine::check_budget(100, 0, 100), std::nullopt);
  EXPECT_NE(engine::check_budget(100, 1, 100), std::nullopt);
  EXPECT_NE(engine::check_budget(UINT64_MAX, 1, 100), std::nullopt);  // no wrap-around
}

TEST(DgramHandshake, ReservationSaturatesAndCountsRdBuffers) {
  Hello h = good();
  h.max_message = UINT64_MAX;
  EXPECT_EQ(reservation_bytes(h, *find_protocol("write_record"), 512), UINT64_MAX);
  Hello r = good();
  r.protocol = "dgram_rd";
  EXPECT_GT(reservation_bytes(r, *find_protocol("dgram_rd"), 512),
            reservation_bytes(r, *find_protocol("dgram_send"), 512) + 512ull * 8192);
}

TEST(DgramHandshake, ARefusalFitsTheRequest) {
  const std::string reason(300, 'x');
  auto r = refuse_within(reason, 40);
  ASSERT_EQ(r.size(), 40u);
  auto back = decode_refuse(r);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->reason.size(), 38u);
  EXPECT_EQ(back->reason.substr(35), "...");
  EXPECT_EQ(decode_refuse(refuse_within("short", 200))->reason, "short");
  EXPECT_EQ(refuse_within("short", 257).size(), 7u);
  EXPECT_TRUE(refuse_within("x", 1).empty());
  EXPECT_EQ(refuse_within(reason, 1000).size(), 257u);  // str8: 255 characters at most
}

TEST(DgramHandshake, EvictionSparesTheAuthenticatedAndPrefersTheSilentWithoutData) {
  EXPECT_EQ(pick_eviction(std::vector<Standing>{{true, false, 0}, {true, true, 5}}), std::nullopt);
  EXPECT_EQ(pick_eviction(std::vector<Standing>{}), std::nullopt);
  // Data-carrying sessions go only when nothing else may.
  EXPECT_EQ(pick_eviction(std::vector<Standing>{{false, true, 0}, {false, false, 50}, {false, false, 40}}), 2u);
  EXPECT_EQ(pick_eviction(std::vector<Standing>{{false, true, 9}, {true, false, 0}, {false, true, 3}}), 2u);
}

}  // namespace
}  // namespace slotstream::dgram
