// The capacity query without UCX: the receiver's answer (host_capacity) from this host's
// /proc/loadavg and /dev/shm, and the asking side (query_capacity) against a fake receiver on a
// loopback control port.
#include "engine/ucx/session/capacity.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <thread>

#include "net/control_socket.h"
#include "slotstream/slotstream.h"

namespace slotstream::session {
namespace {

// The 1-minute load average per CPU in thousandths, as host_capacity computes it.
uint32_t load_milli_now() {
  double load1 = 0;
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%lf", &load1) != 1) load1 = 0;
  std::fclose(f);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<uint32_t>(load1 * 1000 / (cpus > 0 ? cpus : 1));
}

TEST(HostCapacity, PassesTheReceiversNumbersOnAndAddsThisHostsLoadAndSharedMemory) {
  const uint32_t before = load_milli_now();
  const wire::CapacityInfo c = host_capacity(7, 123456789);
  const uint32_t after = load_milli_now();
  EXPECT_EQ(c.senders, 7u);
  EXPECT_EQ(c.backlog_bytes, 123456789u);
  // The kernel refreshes the load average every 5 s: it may change between the reads, not beyond.
  EXPECT_GE(c.load_milli, std::min(before, after));
  EXPECT_LE(c.load_milli, std::max(before, after));
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0) {
    EXPECT_GT(c.shm_free_bytes, 0u);
    EXPECT_LE(c.shm_free_bytes, uint64_t(vfs.f_blocks) * vfs.f_frsize) << "more free than the file system holds";
  } else {
    EXPECT_EQ(c.shm_free_bytes, 0u);
  }
}

// A receiver's control port that answers one connection with `answer`; *asked: the request was a
// capacity request (read it once the FakeReceiver is gone: its thread has been joined).
class FakeReceiver {
 public:
  FakeReceiver(std::function<void(net::ControlSocket&)> answer, bool* asked) {
    EXPECT_TRUE(net::Listener::open("127.0.0.1", 0, &listener_).is_ok());
    if (!listener_) return;
    EXPECT_TRUE(net::parse_host_port(listener_->address(), &host, &port).is_ok());
    thread_ = std::thread([this, answer = std::move(answer), asked] {
      std::unique_ptr<net::ControlSocket> conn;
      if (!listener_->accept(net::Millis(5000), &conn).is_ok() || !conn) return;
      wire::Frame request;
      if (!conn->receive(net::Millis(5000), &request).is_ok()) return;
      *asked = request.type == wire::MsgType::kCapacityRequest && wire::decode_capacity_request(request.body).is_ok();
      answer(*conn);
    });
  }
  ~FakeReceiver() {
    if (thread_.joinable()) thread_.join();
  }

  std::string host;
  uint16_t port = 0;

 private:
  std::unique_ptr<net::Listener> listener_;
  std::thread thread_;
};

TEST(QueryCapacity, AsksTheControlPortAndReadsTheAnswer) {
  wire::CapacityInfo info{3, 1 << 20, 1500, uint64_t(5) << 30};
  Capacity got;
  bool asked = false;
  {
    FakeReceiver rx([&](net::ControlSocket& c) { (void)c.send(wire::MsgType::kCapacity, wire::encode(info)); }, &asked);
    ASSERT_TRUE(query_capacity(rx.host, rx.port, &got).is_ok());
  }
  EXPECT_TRUE(asked) << "the query is a CAPACITY_REQUEST, not a HELLO";
  EXPECT_EQ(got.senders, 3u);
  EXPECT_EQ(got.backlog_bytes, uint64_t(1) << 20);
  EXPECT_DOUBLE_EQ(got.load, 1.5);  // thousandths on the wire
  EXPECT_EQ(got.shm_free_bytes, uint64_t(5) << 30);
}

TEST(QueryCapacity, ARefusalIsTheErrorAndLeavesTheOutputAlone) {
  Capacity got{9, 9, 9.0, 9};
  Status st;
  bool asked = false;
  {
    FakeReceiver rx(
        [](net::ControlSocket& c) {
          (void)c.send(wire::MsgType::kRefuse, wire::encode(wire::Refuse{Code::kRefused, "receiver busy"}));
        },
        &asked);
    st = query_capacity(rx.host, rx.port, &got);
  }
  EXPECT_EQ(st.code(), Code::kRefused);
  EXPECT_NE(st.message().find("receiver busy"), std::string::npos) << st.message();
  EXPECT_EQ(got.senders, 9u);
  EXPECT_EQ(got.shm_free_bytes, 9u);
}

TEST(QueryCapacity, AnAnswerOfAnotherKindIsAProtocolError) {
  Capacity got;
  Status st;
  bool asked = false;
  {
    FakeReceiver rx([](net::ControlSocket& c) { (void)c.send(wire::MsgType::kFinAck, {}); }, &asked);
    st = query_capacity(rx.host, rx.port, &got);
  }
  EXPECT_EQ(st.code(), Code::kProtocolError) << st.to_string();
}

}  // namespace
}  // namespace slotstream::session
