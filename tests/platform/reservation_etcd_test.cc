// SenderLease::reserve against a real etcd (Debian's etcd-server, started here on free loopback
// ports): requesters released at the same instant by a latch contend for the same receivers, and
// the transaction that compares the mod revisions of a receiver's reservation prefix is all that
// keeps them from over-committing it.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <map>
#include <thread>

#include "platform/reservation.h"

namespace slotstream::platform {
namespace {

namespace fs = std::filesystem;

uint16_t free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

bool have_etcd() { return std::system("command -v etcd >/dev/null 2>&1") == 0; }

// One etcd member of its own, on free loopback ports, for this test binary's run.
class EtcdServer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_etcd()) {
      if (std::getenv("CI")) FAIL() << "etcd is not installed (scripts/setup.sh installs etcd-server)";
      GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server, as scripts/setup.sh does)";
    }
    dir_ = fs::temp_directory_path() / ("slotstream-etcd-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string client = "http://127.0.0.1:" + std::to_string(free_port());
    const std::string peer = "http://127.0.0.1:" + std::to_string(free_port());
    endpoint_ = client.substr(7);
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string log = (dir_ / "etcd.log").string();
      freopen(log.c_str(), "w", stdout);
      freopen(log.c_str(), "w", stderr);
      execlp("etcd", "etcd", "--name", "t", "--data-dir", (dir_ / "data").c_str(), "--listen-client-urls",
             client.c_str(), "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peer.c_str(),
             "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster", ("t=" + peer).c_str(), nullptr);
      _exit(127);
    }
    ASSERT_TRUE(EtcdClient::create({endpoint_}, &etcd_).is_ok());
    std::vector<KeyValue> kvs;
    int64_t rev = 0;
    for (int i = 0; i < 300 && !etcd_->range_prefix(kPrefix, &kvs, &rev).is_ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(etcd_->range_prefix(kPrefix, &kvs, &rev).is_ok()) << "etcd did not start";
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void add_receiver(const std::string& name, double cpu) {
    ReceiverRecord r;
    r.name = name;
    r.address = "127.0.0.1:1";
    r.capacity.cpu = cpu;
    r.free_receive_memory = 1ull << 30;
    ASSERT_TRUE(etcd_->put(receiver_key(name), encode(r)).is_ok());
  }

  fs::path dir_;
  pid_t pid_ = -1;
  std::string endpoint_;
  std::unique_ptr<EtcdClient> etcd_;
};

TEST_F(EtcdServer, RequestersReleasedTogetherNeverOverCommitAReceiver) {
  add_receiver("a", 3);
  add_receiver("b", 3);
  constexpr int kRequesters = 8;
  std::vector<std::unique_ptr<SenderLease>> leases(kRequesters);
  for (int i = 0; i < kRequesters; ++i) {
    ASSERT_TRUE(SenderLease::start({endpoint_}, "s" + std::to_string(i), 10, nullptr, &leases[i]).is_ok());
  }
  std::latch go(kRequesters);
  std::vector<Status> results(kRequesters);
  std::vector<Placement> placements(kRequesters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequesters; ++i) {
    threads.emplace_back([&, i] {
      Request r;
      r.amount.cpu = 1;
      go.arrive_and_wait();  // all read the same state, then race to commit
      results[i] = leases[i]->reserve(r, &placements[i]);
    });
  }
  for (auto& t : threads) t.join();
  std::map<std::string, int> placed;
  int refused = 0, attempts = 0;
  for (int i = 0; i < kRequesters; ++i) {
    if (results[i].is_ok()) {
      ++placed[placements[i].receiver];
      attempts += placements[i].attempts;
    } else {
      EXPECT_EQ(results[i].code(), Code::kRefused) << results[i].message();
      EXPECT_NE(results[i].message().find("cpu 1.00 short"), std::string::npos) << results[i].message();
      ++refused;
    }
  }
  EXPECT_EQ(placed, (std::map<std::string, int>{{"a", 3}, {"b", 3}}));
  EXPECT_EQ(refused, kRequesters - 6);
  // What etcd holds agrees: three reservations of one CPU on each receiver.
  std::vector<ReceiverRecord> recs;
  std::vector<Reservation> res;
  int64_t rev = 0;
  ASSERT_TRUE(read_platform(*etcd_, &recs, &res, &rev).is_ok());
  std::map<std::string, double> cpu;
  for (const auto& r : res) cpu[r.receiver] += r.amount.cpu;
  EXPECT_EQ(cpu, (std::map<std::string, double>{{"a", 3}, {"b", 3}}));
  std::printf("6 placed in %d transactions (more than 6: requesters collided and read again)\n", attempts);
  // Released with the lease: a requester's reservation goes when its lease is revoked.
  leases.clear();
  ASSERT_TRUE(read_platform(*etcd_, &recs, &res, &rev).is_ok());
  EXPECT_TRUE(res.empty());
}

TEST_F(EtcdServer, MovingReplacesTheOldReservationInTheSameTransaction) {
  add_receiver("a", 1);
  add_receiver("b", 1);
  std::unique_ptr<SenderLease> lease;
  ASSERT_TRUE(SenderLease::start({endpoint_}, "mover", 10, nullptr, &lease).is_ok());
  Request r;
  r.amount.cpu = 1;
  Placement p1, p2;
  ASSERT_TRUE(lease->reserve(r, &p1).is_ok());
  r.exclude = {p1.receiver};  // it lost that one
  ASSERT_TRUE(lease->reserve(r, &p2).is_ok());
  EXPECT_NE(p1.receiver, p2.receiver);
  std::vector<ReceiverRecord> recs;
  std::vector<Reservation> res;
  int64_t rev = 0;
  ASSERT_TRUE(read_platform(*etcd_, &recs, &res, &rev).is_ok());
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].receiver, p2.receiver);
}

}  // namespace
}  // namespace slotstream::platform
