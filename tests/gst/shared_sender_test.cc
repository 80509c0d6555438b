// The shared sender: one connection per sender-name, the attach rules, max-wait and interrupt (real UCX, shm).
#include "shared_sender.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "gst_test_support.h"

namespace slotstream::gst {
namespace {

using namespace testing;
using std::chrono::milliseconds;

struct Rx {
  std::shared_ptr<ReceiverHub> hub;
  std::vector<std::shared_ptr<Outlet>> outlets;
  explicit Rx(std::vector<std::pair<std::string, uint16_t>> streams) {
    for (auto& [sender, device] : streams) {
      outlets.push_back(make_outlet(sender, device));
      EXPECT_TRUE(ReceiverHub::attach("127.0.0.1:0", "", outlets.back(), &hub).is_ok());
    }
  }
  ~Rx() {
    for (auto& o : outlets) hub->detach(o);
  }
};

TEST(SharedSender, SpecDifferenceNamesTheProperty) {
  ConnectionSpec a, b;
  EXPECT_EQ(a.difference(b), "");
  b.port = 7;
  EXPECT_EQ(a.difference(b).rfind("to (", 0), 0u);
  b = a;
  b.block_size = 64;
  EXPECT_EQ(a.difference(b).rfind("block-size", 0), 0u);
  b = a;
  b.rdma.transport = RdmaTransport::kDc;
  EXPECT_EQ(a.difference(b), "rdma-transport (unset vs dc)");
  b = a;
  b.rdma.device = "mlx5_0:1";
  EXPECT_EQ(a.difference(b).rfind("rdma-device", 0), 0u);
  b = a;
  b.token = "x";
  EXPECT_EQ(a.difference(b).rfind("token-file", 0), 0u);
}

// Expect: two sinks of one name share one connection (the receiver sees one sender with both devices); a
// third with the same device, or other settings, is refused with the reason.
TEST(SharedSender, SinksOfOneNameShareOneConnection) {
  Rx rx({{"pair", 0}, {"pair", 1}});
  ConnectionSpec spec = spec_for(*rx.hub, "pair");
  std::shared_ptr<SharedSender> a, b, c;
  ASSERT_TRUE(SharedSender::attach(spec, 0, &a).is_ok());
  ASSERT_TRUE(SharedSender::attach(spec, 1, &b).is_ok());
  EXPECT_EQ(a, b);
  Status st = SharedSender::attach(spec, 1, &c);
  EXPECT_NE(st.message().find("device 1 of sender-name 'pair' is already sent"), std::string::npos) << st.message();
  ConnectionSpec other = spec;
  other.blocks = 3;
  st = SharedSender::attach(other, 2, &c);
  EXPECT_NE(st.message().find("different blocks"), std::string::npos) << st.message();

  ASSERT_TRUE(a->send(0, encode_caps("zero"), kNoLimit).is_ok());  // connects, with devices 0 and 1
  ASSERT_TRUE(b->send(1, encode_caps("one"), kNoLimit).is_ok());
  st = SharedSender::attach(spec, 2, &c);
  EXPECT_NE(st.message().find("already connected"), std::string::npos) << st.message();
  EXPECT_TRUE(a->end_device(0, kNoLimit).is_ok());
  EXPECT_TRUE(b->detach(1, kNoLimit).is_ok());  // the last: finishes the connection
  Delivery d;
  for (auto& o : rx.outlets) {
    ASSERT_TRUE(o->pop(&d).is_ok());
    EXPECT_EQ(d.kind, Delivery::Kind::kNote) << "how the stream is received";
    ASSERT_TRUE(o->pop(&d).is_ok());
    EXPECT_EQ(d.kind, Delivery::Kind::kCaps);
    ASSERT_TRUE(o->pop(&d).is_ok());
    EXPECT_EQ(d.kind, Delivery::Kind::kEos) << "a finished sender ends its streams";
  }
  EXPECT_EQ(rx.hub->address().empty(), false);
}

// Expect: a receiver that cannot be reached fails every sink of the name with the same clear error.
TEST(SharedSender, AFailedConnectReachesEverySink) {
  ConnectionSpec spec;
  spec.host = "127.0.0.1";
  spec.port = 1;  // nothing listens there
  spec.name = "nowhere";
  std::shared_ptr<SharedSender> a, b;
  ASSERT_TRUE(SharedSender::attach(spec, 0, &a).is_ok());
  ASSERT_TRUE(SharedSender::attach(spec, 1, &b).is_ok());
  Status first = a->send(0, encode_caps("x"), kNoLimit);
  Status second = b->send(1, encode_caps("x"), kNoLimit);
  EXPECT_EQ(first.code(), Code::kConnectFailed);
  EXPECT_NE(first.message().find("connecting: cannot connect to 127.0.0.1:1"), std::string::npos) << first.message();
  EXPECT_EQ(second.message(), first.message());
}

// Messages larger than the largest packed record (16 KiB) take a block each, as video frames do: with two
// blocks and nothing taking the device, the third send waits. (Small messages of a paused device are first
// copied aside by the receiver, up to its park limit, before the sender waits.)
constexpr uint32_t kFrameBlock = 64 << 10;
constexpr size_t kFrameBytes = 20 << 10;

// Expect: a send that waits longer than max-wait (nothing takes the device) fails with kTimeout naming
// max-wait, within a bounded time.
TEST(SharedSender, MaxWaitEndsABlockedSend) {
  Rx rx({{"", 9}});
  std::shared_ptr<SharedSender> s;
  ASSERT_TRUE(SharedSender::attach(spec_for(*rx.hub, "stuck", kFrameBlock, 2), 0, &s).is_ok());
  const auto begin = std::chrono::steady_clock::now();
  Status st;
  for (int i = 0; i < 10 && st.is_ok(); ++i) st = s->send(0, buffer_message(0, i, kFrameBytes), milliseconds(300));
  const auto waited = std::chrono::steady_clock::now() - begin;
  EXPECT_EQ(st.code(), Code::kTimeout) << st.to_string();
  EXPECT_NE(st.message().find("waited 300 ms (max-wait)"), std::string::npos) << st.message();
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(5000));
  EXPECT_FALSE(s->detach(0, milliseconds(100)).is_ok()) << "the connection failed: finishing says so";
}

// Expect: interrupt() wakes a send that would wait for ever, and says it did.
TEST(SharedSender, InterruptWakesAWaitingSend) {
  Rx rx({{"", 9}});
  std::shared_ptr<SharedSender> s;
  ASSERT_TRUE(SharedSender::attach(spec_for(*rx.hub, "halted", kFrameBlock, 2), 0, &s).is_ok());
  EXPECT_FALSE(s->interrupt(0)) << "nothing waits yet";
  auto result = std::async(std::launch::async, [&] {
    Status st;
    for (int i = 0; i < 10 && st.is_ok(); ++i) st = s->send(0, buffer_message(0, i, kFrameBytes), kNoLimit);
    return st;
  });
  bool interrupted = false;
  for (int i = 0; i < 100 && !interrupted; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    interrupted = s->interrupt(0);
  }
  EXPECT_TRUE(interrupted);
  ASSERT_EQ(result.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), Code::kCancelled);
}

}  // namespace
}  // namespace slotstream::gst
