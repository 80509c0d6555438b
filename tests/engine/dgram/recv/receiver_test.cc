// The datagram receiver (src/engine/dgram/recv/receiver.cc) with its threads and sockets, and the engine's own
// senders over loopback UDP, in one process.
#include "engine/dgram/recv/receiver.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/send/sender.h"

namespace slotstream::dgram {
namespace {

// One message from a sender of this name, then its end handshake (FIN, FIN_ACK).
Status send_one(const std::string& address, const std::string& name) {
  DatagramSenderOptions o;
  o.host = "127.0.0.1";
  o.port = uint16_t(std::stoi(address.substr(address.rfind(':') + 1)));
  o.name = name;
  o.devices = {0};
  o.finish_timeout_ns = 10'000'000'000;
  std::unique_ptr<DatagramSender> tx;
  SLOTSTREAM_RETURN_IF_ERROR(DatagramSender::connect(o, &tx));
  SLOTSTREAM_RETURN_IF_ERROR(tx->send(0, std::as_bytes(std::span("x", 1))));
  FinAck report;
  return tx->finish(&report);
}

// Holds whoever waits until it opens.
class Gate {
 public:
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// on_session_end runs on the receiver's callback thread: while it blocks (a stdout nobody reads), the network
// thread goes on serving. Called on the network thread, the first report that blocked left the second sender
// without an answer to its HELLO ("no slotstream datagram receiver answered ... within 5 s").
TEST(DatagramReceiverCallbacks, ABlockedSessionEndDoesNotHoldBackTheNextSender) {
  std::mutex mu;
  std::vector<std::string> reported;
  Gate gate;
  DatagramReceiverOptions o;
  o.host = "127.0.0.1";
  o.on_session_end = [&](const SessionReport& r) {
    gate.wait();
    std::lock_guard lock(mu);
    reported.push_back(r.sender.name);
  };
  std::unique_ptr<DatagramReceiver> rx;
  Status st = DatagramReceiver::start(o, &rx);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  // A check below that fails returns with the gate shut: open it before rx's destructor waits for the callback.
  struct OpenAtExit {
    Gate& gate;
    ~OpenAtExit() { gate.open(); }
  } open_at_exit{gate};
  const std::string address = rx->listen_address();

  Status first = send_one(address, "first");
  ASSERT_TRUE(first.is_ok()) << first.to_string();
  // The first report now waits at the gate (its FIN_ACK went out before it was posted).
  Status second = send_one(address, "second");
  EXPECT_TRUE(second.is_ok()) << second.to_string();
  EXPECT_EQ(rx->sessions_ended(), 0u) << "a session counts as ended once its on_session_end has returned";

  gate.open();
  rx->stop();  // gives the reports still waiting before it returns
  EXPECT_EQ(rx->sessions_ended(), 2u);
  std::lock_guard lock(mu);
  EXPECT_EQ(reported, (std::vector<std::string>{"first", "second"}));
}

}  // namespace
}  // namespace slotstream::dgram
