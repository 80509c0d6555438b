// The library's own answer to `transport rdma` on a host without a usable RDMA device
// (src/sender.cc, src/receiver.cc): a kInvalidArgument naming what is missing and what to do,
// before anything connects or listens — what the CLI turns into exit status 2 and Python into
// slotstream.InvalidArgument. And what Sender::connect knows when it returns (confirm_stored).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/ucx/fabric/transports.h"
#include "slotstream/slotstream.h"

namespace slotstream {
namespace {

bool host_has_rdma() { return fabric::host_rdma({Transport::kRdma, RdmaTransport::kRc}).usable; }

TEST(RdmaWithoutADevice, SenderConnectSaysWhatIsMissingBeforeConnecting) {
  if (host_has_rdma()) GTEST_SKIP() << "this host has an RDMA device";
  SenderOptions o;
  o.host = "127.0.0.1";
  o.port = 1;  // nothing listens: the answer must come before any connection
  o.name = "lib";
  o.devices = {0};
  o.transport = Transport::kRdma;
  std::unique_ptr<Sender> sender;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = Sender::connect(o, &sender);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("transport rdma: no RDMA device", 0), 0u) << st.message();
  EXPECT_NE(st.message().find("use --transport tcp"), std::string::npos) << st.message();
  EXPECT_EQ(sender, nullptr);
  // auto does not offer it and is not refused for it (here: no receiver, so it cannot connect).
  o.transport = Transport::kAuto;
  EXPECT_EQ(Sender::connect(o, &sender).code(), Code::kConnectFailed);
}

TEST(RdmaWithoutADevice, ReceiverStartSaysWhatIsMissing) {
  if (host_has_rdma()) GTEST_SKIP() << "this host has an RDMA device";
  ReceiverOptions o;
  o.host = "127.0.0.1";
  o.transport = Transport::kRdma;
  o.make_sink = [](const SenderInfo&, std::unique_ptr<MessageSink>*) { return Status::ok(); };
  std::unique_ptr<Receiver> rx;
  Status st = Receiver::start(o, &rx);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("transport rdma: no RDMA device", 0), 0u) << st.message();
  EXPECT_EQ(rx, nullptr);
  // auto starts without it.
  o.transport = Transport::kAuto;
  ASSERT_TRUE(Receiver::start(o, &rx).is_ok());
  rx->stop();
}

// A sink numbering from where an earlier receiver's messages stopped (as DirSink does over a
// directory that holds some): device d's next message is stored as 40 + d.
class NumberingSink : public MessageSink {
 public:
  Status begin(uint16_t) override { return Status::ok(); }
  Status append(uint16_t, std::span<const std::byte>) override { return Status::ok(); }
  Status commit(uint16_t) override { return Status::ok(); }
  void abort(uint16_t) override {}
  std::optional<Numbering> numbering(uint16_t device) override { return Numbering{40u + device, 0}; }
};

// With confirm_stored, the receiver's first STORED (where this connection's numbers start) is read
// by the handshake: known when connect() returns, before any message. A platform sender relies on
// it — a receiver that stores some messages and dies before the sender's sending thread read that
// STORED left them unnumbered, and the next receiver stored them again under new numbers.
TEST(ConfirmStored, ConnectReturnsKnowingWhereTheNumbersStart) {
  ReceiverOptions ro;
  ro.host = "127.0.0.1";
  ro.transport = Transport::kTcp;
  ro.make_sink = [](const SenderInfo&, std::unique_ptr<MessageSink>* out) {
    *out = std::make_unique<NumberingSink>();
    return Status::ok();
  };
  std::unique_ptr<Receiver> rx;
  ASSERT_TRUE(Receiver::start(ro, &rx).is_ok());
  SenderOptions so;
  so.host = "127.0.0.1";
  const std::string a = rx->listen_address();
  so.port = uint16_t(std::stoi(a.substr(a.rfind(':') + 1)));
  so.name = "numbered";
  so.transport = Transport::kTcp;
  so.devices = {0, 3};
  so.confirm_stored = true;
  std::unique_ptr<Sender> tx;
  Status st = Sender::connect(so, &tx);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (uint16_t d : so.devices) {
    const Sender::Confirmed c = tx->confirmed(d);
    ASSERT_TRUE(c.first.has_value()) << "device " << d;
    EXPECT_EQ(*c.first, 40u + d);
    EXPECT_EQ(c.stored, 0u);
  }
  ASSERT_TRUE(tx->device(3)->send(std::as_bytes(std::span("x", 1))).is_ok());
  ASSERT_TRUE(tx->finish().is_ok());
  tx.reset();
  rx->stop();
}

// The udp receiver runs on_session_end off its one network thread, on the datagram receiver's callback
// thread (src/engine/dgram/recv/callback_thread.h): a callback that blocks holds back the reports after it,
// not the senders. Called on the network thread, the first blocked callback left the second sender without
// an answer.
struct UdpPair {
  std::unique_ptr<Receiver> rx;
  std::string address;
  Status send(const std::string& name) {
    SenderOptions so;
    so.host = "127.0.0.1";
    so.port = uint16_t(std::stoi(address.substr(address.rfind(':') + 1)));
    so.name = name;
    so.transport = Transport::kUdp;
    so.devices = {0};
    std::unique_ptr<Sender> tx;
    SLOTSTREAM_RETURN_IF_ERROR(Sender::connect(so, &tx));
    SLOTSTREAM_RETURN_IF_ERROR(tx->device(0)->send(std::as_bytes(std::span("x", 1))));
    return tx->finish();
  }
};

ReceiverOptions udp_receiver() {
  ReceiverOptions ro;
  ro.host = "127.0.0.1";
  ro.transport = Transport::kUdp;
  ro.make_sink = [](const SenderInfo&, std::unique_ptr<MessageSink>* out) {
    *out = std::make_unique<NumberingSink>();
    return Status::ok();
  };
  return ro;
}

TEST(UdpReceiverCallbacks, ABlockedSessionEndHoldsBackReportsNotSenders) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<std::string> reported;
  ReceiverOptions ro = udp_receiver();
  ro.on_session_end = [&](const SessionReport& r) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });  // the first report blocks until the second sender is done
    reported.push_back(r.sender.name);
  };
  UdpPair pair;
  ASSERT_TRUE(Receiver::start(ro, &pair.rx).is_ok());
  pair.address = pair.rx->listen_address();
  Status first = pair.send("first");
  ASSERT_TRUE(first.is_ok()) << first.to_string();
  Status second = pair.send("second");
  EXPECT_TRUE(second.is_ok()) << second.to_string();
  EXPECT_EQ(pair.rx->sessions_ended(), 0u) << "a session counts as ended once its report has been given";
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  pair.rx->wait_sessions(2);
  std::lock_guard lock(mu);
  EXPECT_EQ(reported, (std::vector<std::string>{"first", "second"}));
  pair.rx->stop();
}

// Receiver::stop() is any thread's, on_session_end's too: there it cannot wait for the thread it runs on.
TEST(UdpReceiverCallbacks, StopFromOnSessionEnd) {
  UdpPair pair;
  std::atomic<bool> stopped = false;
  ReceiverOptions ro = udp_receiver();
  ro.on_session_end = [&](const SessionReport&) {
    pair.rx->stop();
    stopped = true;
  };
  ASSERT_TRUE(Receiver::start(ro, &pair.rx).is_ok());
  pair.address = pair.rx->listen_address();
  Status st = pair.send("only");
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  pair.rx->wait_sessions(1);  // returns: the receiver stopped
  pair.rx.reset();            // joins the callback thread, which has ended
  EXPECT_TRUE(stopped.load());
}

}  // namespace
}  // namespace slotstream
