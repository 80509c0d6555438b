#include "engine/dgram/llp/rd.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

namespace slotstream::dgram {
namespace {

std::vector<std::byte> dg(uint32_t tag) { return {std::byte(tag), std::byte(tag >> 8)}; }
uint32_t tag_of(const std::vector<std::byte>& d) {
  return std::to_integer<uint32_t>(d[0]) | std::to_integer<uint32_t>(d[1]) << 8;
}
constexpr int64_t kMs = 1'000'000;

TEST(RdReceiver, InOrderBufferedDuplicateBeyond) {
  RdReceiver r(4);
  using R = RdReceiver::Result;
  EXPECT_EQ(r.on_segment(0, dg(0)), R::kInOrder);
  EXPECT_EQ(r.on_segment(2, dg(2)), R::kBuffered);
  EXPECT_EQ(r.on_segment(3, dg(3)), R::kBuffered);
  EXPECT_EQ(r.on_segment(2, dg(2)), R::kDuplicate);
  EXPECT_EQ(r.on_segment(0, dg(0)), R::kDuplicate);
  EXPECT_EQ(r.on_segment(6, dg(6)), R::kBeyondWindow);  // 1 + 4 < 6
  RdFields a = r.ack(4);
  EXPECT_EQ(a.ack, 1u);
  EXPECT_EQ(a.sack, 0b11u);  // 2 and 3 held
  EXPECT_EQ(a.flags, kRdAckValid);
  std::vector<std::byte> out;
  EXPECT_FALSE(r.pop(&out));
  EXPECT_EQ(r.on_segment(1, dg(1)), R::kInOrder);
  ASSERT_TRUE(r.pop(&out));
  EXPECT_EQ(tag_of(out), 2u);
  ASSERT_TRUE(r.pop(&out));
  EXPECT_EQ(tag_of(out), 3u);
  EXPECT_FALSE(r.pop(&out));
  EXPECT_EQ(r.ack(4).ack, 4u);
  EXPECT_EQ(r.ack(4).sack, 0u);
}

TEST(RdReceiver, SequenceNumbersWrap) {
  RdReceiver r(8);
  for (uint32_t i = 0; i < 3; ++i) (void)r.on_segment(i, dg(i));
  // Not reachable from 3 in one step, but the arithmetic is modulo 2^32 throughout.
  EXPECT_EQ(seq_diff(0xFFFFFFF0u, 0x10u), 0x20);
  EXPECT_EQ(seq_diff(0x10u, 0xFFFFFFF0u), -0x20);
}

TEST(RdSender, CreditsBoundTheWindow) {
  RdSender::Options o;
  o.initial_credits = 2;
  RdSender s(o);
  EXPECT_TRUE(s.window_open());
  s.sent(dg(0), 0);
  s.sent(dg(1), 0);
  EXPECT_FALSE(s.window_open());
  EXPECT_EQ(s.on_ack(1, 2, 0, 1 * kMs), 1u);  // 0 acknowledged, 2 more credits from 1
  EXPECT_TRUE(s.window_open());
  s.sent(dg(2), 1 * kMs);
  EXPECT_FALSE(s.window_open());
  EXPECT_EQ(s.in_flight(), 2u);
  EXPECT_EQ(s.on_ack(3, 0, 0, 2 * kMs), 2u);
  EXPECT_TRUE(s.all_acked());
  EXPECT_FALSE(s.window_open());  // zero credits
}

TEST(RdSender, RetransmitsOnTimeoutWithBackOff) {
  RdSender::Options o;
  o.rto_initial_ns = 10 * kMs;
  RdSender s(o);
  s.sent(dg(0), 0);
  std::vector<const std::vector<std::byte>*> due;
  s.due(9 * kMs, &due);
  EXPECT_TRUE(due.empty());
  s.due(10 * kMs, &due);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(tag_of(*due[0]), 0u);
  due.clear();
  s.due(25 * kMs, &due);  // backed off: 10 ms << 1 from 10 ms = 30 ms
  EXPECT_TRUE(due.empty());
  s.due(30 * kMs, &due);
  EXPECT_EQ(due.size(), 1u);
  EXPECT_EQ(s.stats().timeouts, 2u);
  EXPECT_FALSE(s.failed(1000 * kMs));
  EXPECT_TRUE(s.failed(o.give_up_ns + 1));
}

TEST(RdSender, FastRetransmitAfterThreeLaterAcks) {
  RdSender s;
  for (uint32_t i = 0; i < 5; ++i) s.sent(dg(i), 0);
  s.on_ack(1, 64, 0, 1 * kMs);      // 0 acknowledged: RTT sample 1 ms
  s.on_ack(1, 64, 0b111, 2 * kMs);  // bits 0..2: 2, 3, 4 arrived; 1 is missing
  std::vector<const std::vector<std::byte>*> due;
  s.due(3 * kMs, &due);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(tag_of(*due[0]), 1u);
  EXPECT_EQ(s.stats().fast_retransmits, 1u);
  due.clear();
  s.due(3 * kMs, &due);  // not again within a round trip
  EXPECT_TRUE(due.empty());
}

TEST(RdSender, TimesOnlyWhatTheAckCanSpeakAbout) {
  RdSender::Options o;
  o.initial_credits = 512;
  o.rto_initial_ns = 10 * kMs;
  RdSender s(o);
  for (uint32_t i = 0; i < 200; ++i) s.sent(dg(i), 0);
  s.on_ack(0, 512, ~0ull, 1 * kMs);  // 0 is missing; 1..64 arrived; nothing known beyond
  std::vector<const std::vector<std::byte>*> due;
  s.due(100 * kMs, &due);
  ASSERT_EQ(due.size(), 1u);  // the hole only, not the 135 datagrams behind the sack window
  EXPECT_EQ(tag_of(*due[0]), 0u);
  due.clear();
  s.on_ack(65, 512, 0, 101 * kMs);  // the hole filled; 65.. come into view, none acknowledged yet
  s.due(102 * kMs, &due);
  EXPECT_EQ(due.size(), 65u);  // long overdue and not acknowledged: missing
}

TEST(RdSender, IgnoresStaleAndImpossibleAcks) {
  RdSender s;
  s.sent(dg(0), 0);
  s.sent(dg(1), 0);
  EXPECT_EQ(s.on_ack(5, 64, 0, 1), 0u);  // acknowledges data never sent
  EXPECT_EQ(s.on_ack(2, 64, 0, 2), 2u);
  EXPECT_EQ(s.on_ack(1, 64, 0, 3), 0u);  // a reordered older ack
  EXPECT_TRUE(s.all_acked());
}

TEST(RdSender, ProbesAClosedWindow) {
  RdSender::Options o;
  o.initial_credits = 1;
  o.rto_initial_ns = 10 * kMs;
  RdSender s(o);
  s.sent(dg(0), 0);
  s.on_ack(1, 0, 0, 1 * kMs);  // acknowledged, but no credits
  EXPECT_FALSE(s.wants_probe(2 * kMs));
  EXPECT_TRUE(s.wants_probe(1 * kMs + s.rto_ns() + 1));
  s.on_ack(1, 4, 0, 20 * kMs);  // the window update
  EXPECT_FALSE(s.wants_probe(100 * kMs));
}

// Both halves over a lossy, reordering channel: everything arrives once, in order.
TEST(Rd, DeliversEverythingInOrderOverALossyChannel) {
  std::mt19937 rng(3);
  RdSender::Options o;
  o.rto_initial_ns = 5 * kMs;
  RdSender s(o);
  RdReceiver r(32);
  std::deque<std::pair<int64_t, std::vector<std::byte>>> wire;  // (arrival time, datagram)
  std::vector<uint32_t> got;
  const uint32_t total = 2000;
  uint32_t next = 0;
  int64_t now = 0;
  auto transmit = [&](const std::vector<std::byte>& d) {
    if (rng() % 100 < 10) return;  // 10% loss
    wire.emplace_back(now + kMs / 10 + int64_t(rng() % 200'000), d);
  };
  while (got.size() < total && now < 60'000 * kMs) {
    now += 50'000;
    while (next < total && s.window_open()) {
      std::vector<std::byte> d = dg(next++);
      d.push_back(std::byte(s.next_seq()));
      transmit(d);
      s.sent(d, now);
    }
    std::sort(wire.begin(), wire.end(), [](auto& a, auto& b) { return a.first < b.first; });
    bool acked = false;
    while (!wire.empty() && wire.front().first <= now) {
      auto d = wire.front().second;
      wire.pop_front();
      // The sequence number is the datagram's tag here (sent in order from 0).
      const uint32_t seq = tag_of(d);
      if (r.on_segment(seq, d) == RdReceiver::Result::kInOrder) {
        got.push_back(seq);
        std::vector<std::byte> more;
        while (r.pop(&more)) got.push_back(tag_of(more));
      }
      acked = true;
    }
    if (acked && rng() % 100 >= 10) {  // acks are lost too
      RdFields a = r.ack(32);
      s.on_ack(a.ack, a.credits, a.sack, now);
    }
    std::vector<const std::vector<std::byte>*> due;
    s.due(now, &due);
    for (auto* d : due) transmit(*d);
  }
  ASSERT_EQ(got.size(), total);
  for (uint32_t i = 0; i < total; ++i) ASSERT_EQ(got[i], i);
  EXPECT_GT(s.stats().retransmits, 0u);
}

}  // namespace
}  // namespace slotstream::dgram
